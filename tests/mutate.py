"""Mutation testing: plant one small bug at a time in a room of minisbert and see whether its quick tests
catch it. "The tests are strong" then means a number, and every bug they miss has a name.

Usage:
    python tests/mutate.py --limit 20 --report tests/MUTANTS.md
    python tests/mutate.py --room losses --limit 2

A room is a few source files and the quick tests that check them (ROOMS, below). A mutant is the room's
source with one change, made on the syntax tree (`ast`) and written back into the text at that spot, so
that everything else stays byte for byte as it was:

    arithmetic     a + b <-> a - b,  a * b <-> a / b  (also +=, -=, *=, /=)
    comparison     < <-> <=,  > <-> >=,  == <-> !=
    logic          and <-> or
    number         0 <-> 1, any other int c -> c + 1, a float 0.0 -> 1.0, any other float c -> 1.01 c
    boolean        True <-> False
    unary minus    -x -> x

Never mutated, because a change there cannot change what the code computes: strings (docstrings,
messages), anything inside a `raise` statement or a `warnings.warn(...)` call (what is raised is its
message; whether it is raised is decided by the code around it, which is mutated), f-strings, type
annotations and `__repr__` methods. The report counts the places left out for these reasons.

Each mutant is written into a copy of the repository in a temporary folder (one copy per job; the
working tree is never touched, so other people's edits and test runs are unaffected), and the room's
tests run there: `python -m pytest -x -q -p no:cacheprovider -m "not slow" TESTS`. Outcomes:

    caught    a test failed, or the tests could not even be collected (the mutant broke an import)
    timeout   the tests ran past the time limit (counted as caught: a hang is noticed; listed apart);
              with --jobs above 1 a timeout is run again alone, as neighbours can slow a survivor past it
    survived  every test passed: the mutant is equivalent (no input can tell it from the original: say
              why) or it shows a missing check (add a test of the behaviour it breaks)

Before its mutants each room's tests run once unmutated in the copy: a room whose tests already fail
is reported and skipped, as its score would mean nothing. The mutation score is that of the quick
suite: tests marked slow are deselected.

--limit N picks N mutants per room at random from all of them, the same ones for the same --seed (and
a smaller N picks a subset of a larger one's), so that two runs can be compared. The markdown report
(--report) lists each room's rate, the overall rate, every survivor with a column saying why it
survives (a reason that starts "Equivalent" leaves the survivor out of a second rate, the share
caught of the mutants a test could catch), and the test that caught each caught mutant. Each room's
results are kept in a JSON file beside it, so that a room run again alone replaces its own results
and keeps the others' (a room whose tests take minutes, as the search's, is run alone with a smaller
--limit: `--room search --limit 6`). What was written by hand in the report (a survivor's
explanation, a last section headed "## Notes") is kept when it is written again.
"""

import argparse
import ast
import io
import json
import os
import platform
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tokenize
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from queue import Queue

REPO = Path(__file__).resolve().parent.parent

# room -> (its source files, the quick tests that check it): the room's own tests and those that check it
# against reference tensors or another library. The tests run in this order and stop at the first failure
# (-x), so the quickest strong ones come first. A test file that does not exist (yet) is left out and said so.
ROOMS = {
    # each piece against its formula and gradcheck; the whole encoder against transformers' tensors
    "encoder": (("minisbert/encoding/encoder.py", "minisbert/encoding/encoder_inputs.py"),
                ("tests/encoding/test_encoder_math.py", "tests/encoding/test_encoder.py")),
    # Dense by its definition; pooling by hand; embeddings against sentence-transformers' (with a Dense layer)
    "pooling": (("minisbert/encoding/pooling.py",),
                ("tests/encoding/test_pooling.py", "tests/encoding/test_encoder_math.py", "tests/encoding/test_encoder.py",
                 "tests/encoding/test_model.py::test_sentence_transformers_directory")),
    "losses": (("minisbert/training/losses.py",), ("tests/training/test_losses.py",)),
    "optim": (("minisbert/training/optim.py",), ("tests/training/test_optim.py",)),  # against torch.optim.AdamW, step by step
    # the losses' cosines and distances and the normalisation are common/similarity.py's; util against sentence-transformers
    "similarity": (("minisbert/common/similarity.py",),
                   ("tests/common/test_similarity.py", "tests/training/test_losses.py", "tests/encoding/test_encoder_math.py",
                    "tests/porting/test_st_calls.py")),
    # against pytrec_eval's and sentence-transformers' numbers
    "metrics": (("minisbert/evaluation/metrics.py", "minisbert/evaluation/correlation.py"), ("tests/evaluation/test_metrics.py",)),
    "significance": (("minisbert/evaluation/significance.py",), ("tests/evaluation/test_significance.py",)),  # scipy's numbers
    "tokenizer": (("minisbert/encoding/tokenizer.py",), ("tests/encoding/test_tokenizer.py",)),  # Hugging Face's ids
    # the fast encoder: its products and attention against the plain encoder, a text's bits in any batch,
    # the calls each kernel gets, the machine's checks of its kernels
    "fast encoder": (("minisbert/encoding/fast/tiled_encoder.py", "minisbert/encoding/fast/tiled_linear.py",
                      "minisbert/encoding/fast/batching.py"),
                     ("tests/encoding/test_encoder_fast.py", "tests/encoding/test_fast_linear.py", "tests/encoding/test_batch_invariance.py")),
    # the plain loop against its definition and brute force; every fast way against the plain loop; the
    # bounds against exact sums; the device way's proof and counts
    "search": (("minisbert/search/plain.py", "minisbert/search/inputs.py", "minisbert/search/bounds.py"),
               ("tests/search/test_one_answer.py", "tests/search/test_search_property.py", "tests/search/test_retrieval.py",
                "tests/search/test_screens.py", "tests/search/test_search_bounds.py", "tests/search/test_device_search.py")),
    # the search's entry and its fast ways: every way against the plain loop (bits, and no query left to
    # the plain loop on random rows), the screens, the span product's kernels, the device way's counts
    "fast search": (("minisbert/search/ways.py", "minisbert/search/fast/spans_blocks.py",
                     "minisbert/search/fast/screen.py", "minisbert/search/fast/span_product.py",
                     "minisbert/search/fast/device.py", "minisbert/search/fast/int8_rows.py",
                     "minisbert/search/fast/int8_blocks.py"),
                    ("tests/search/test_device_search.py", "tests/search/test_screens.py", "tests/search/test_search_property.py",
                     "tests/search/test_retrieval.py")),
}

SWAPPED_OPERATORS = {ast.Add: "-", ast.Sub: "+", ast.Mult: "/", ast.Div: "*"}
SWAPPED_COMPARISONS = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">", ast.Eq: "!=", ast.NotEq: "=="}
SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/",
           ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
COPY_LEAVES_OUT = (".git", ".venv", "__pycache__", ".pytest_cache", "*.pyc", "runs", ".cache")
NOT_CHANGED = "(to fill: equivalent, and why; or the missing check, and the test added)"
NOTES = "## Notes"  # a report's section from this heading on is written by hand, and kept


@dataclass(frozen=True)
class Mutant:
    path: str  # the file, relative to the repository root
    line: int
    column: int  # of the change, counted from 1 in characters
    change: str  # what was changed into what, e.g. "< -> <="
    code: str  # the original line, stripped
    source: str  # the whole mutated file

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"


@dataclass
class Outcome:
    mutant: Mutant
    result: str  # "caught", "timeout" or "survived"
    caught_by: str  # the first failing test, or ""
    seconds: float


# ---- making mutants ---------------------------------------------------------------------------


def mutants_of(path: str, text: str) -> tuple[list[Mutant], int]:
    """Every mutant of one file's text, in the order of the file, and how many places were left out
    (inside messages, annotations and __repr__). Each mutant parses, and differs from the original."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    left_out = nodes_left_out(tree)
    original = ast.dump(tree)
    found, seen, skipped = [], set(), 0
    for node in ast.walk(tree):
        if id(node) in left_out:  # counted, not made: the positions of code inside an f-string are not its own
            skipped += is_mutable(node)
            continue
        for edits, change in changes_at(node, lines, tokens):
            source = apply(lines, edits)
            try:
                changed = ast.dump(ast.parse(source)) != original
            except SyntaxError:
                continue
            if changed and source not in seen:
                seen.add(source)
                line, column = edits[0][:2]
                found.append(Mutant(path, line, column + 1, change, lines[line - 1].strip(), source))
    found.sort(key=lambda mutant: (mutant.line, mutant.column))
    return found, skipped


def nodes_left_out(tree: ast.AST) -> set[int]:
    """ids of the nodes never mutated: raise statements, warnings.warn calls, f-strings, annotations and
    __repr__ methods, with everything inside them."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Raise, ast.JoinedStr)):
            roots.append(node)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("warnings.warn", "warn"):
            roots.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name == "__repr__":
                roots.append(node)
            elif node.returns is not None:
                roots.append(node.returns)
        elif isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(inner) for root in roots for inner in ast.walk(root)}


def is_mutable(node: ast.AST) -> bool:
    """Whether `changes_at` has a mutation for this node (the count of places left out)."""
    return (isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in SWAPPED_OPERATORS
            or isinstance(node, ast.Compare) and any(type(op) in SWAPPED_COMPARISONS for op in node.ops)
            or isinstance(node, ast.BoolOp)
            or isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
            or isinstance(node, ast.Constant) and type(node.value) in (bool, int, float))


def changes_at(node: ast.AST, lines: list[str], tokens: list) -> list[tuple[list, str]]:
    """The mutations of one node: [(edits, change)], each edit (line, start column, end column, new text)
    in characters of that line."""
    if isinstance(node, ast.BinOp) and type(node.op) in SWAPPED_OPERATORS:
        return [operator_swap(node.left, node.right, SYMBOLS[type(node.op)], SWAPPED_OPERATORS[type(node.op)],
                              lines, tokens)]
    if isinstance(node, ast.AugAssign) and type(node.op) in SWAPPED_OPERATORS:
        old, new = SYMBOLS[type(node.op)] + "=", SWAPPED_OPERATORS[type(node.op)] + "="
        return [operator_swap(node.target, node.value, old, new, lines, tokens)]
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        return [operator_swap(left, right, SYMBOLS[type(op)], SWAPPED_COMPARISONS[type(op)], lines, tokens)
                for op, left, right in zip(node.ops, operands, operands[1:]) if type(op) in SWAPPED_COMPARISONS]
    if isinstance(node, ast.BoolOp):
        old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        edits = [operator_swap(left, right, old, new, lines, tokens)[0][0]
                 for left, right in zip(node.values, node.values[1:])]
        return [(edits, f"{old} -> {new}")]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        line, column = node.lineno, character_column(lines, node.lineno, node.col_offset)
        operand = ast.unparse(node.operand)
        operand = operand if len(operand) <= 12 and not isinstance(node.operand, ast.BinOp) else "x"
        return [([(line, column, column + 1, "")], f"-{operand} -> {operand}")]
    if isinstance(node, ast.Constant) and type(node.value) in (bool, int, float):
        new = changed_number(node.value)
        line = node.lineno
        start = character_column(lines, line, node.col_offset)
        end = character_column(lines, node.end_lineno, node.end_col_offset)
        old = lines[line - 1][start:end]
        return [([(line, start, end, new)], f"{old} -> {new}")]
    return []


def changed_number(value) -> str:
    if isinstance(value, bool):
        return str(not value)
    if isinstance(value, int):
        return str({0: 1, 1: 0}.get(value, value + 1))
    return repr(1.0 if value == 0 else value * 1.01)


def operator_swap(left: ast.AST, right: ast.AST, old: str, new: str, lines: list[str], tokens: list):
    """The edit that turns the operator token `old` between two operands into `new`."""
    start = (left.end_lineno, character_column(lines, left.end_lineno, left.end_col_offset))
    end = (right.lineno, character_column(lines, right.lineno, right.col_offset))
    for token in tokens:
        if start <= token.start and token.end <= end and token.string == old:
            (line, column), (_, end_column) = token.start, token.end
            return [(line, column, end_column, new)], f"{old} -> {new}"
    raise ValueError(f"no {old!r} between line {start[0]} and line {end[0]}")


def character_column(lines: list[str], line: int, utf8_offset: int) -> int:
    """ast counts columns in UTF-8 bytes, tokenize and str slicing in characters."""
    return len(lines[line - 1].encode("utf-8")[:utf8_offset].decode("utf-8"))


def apply(lines: list[str], edits: list) -> str:
    changed = list(lines)
    for line, start, end, new in sorted(edits, reverse=True):  # right to left: earlier columns stay valid
        text = changed[line - 1]
        changed[line - 1] = text[:start] + new + text[end:]
    return "".join(changed)


def room_mutants(room: str, limit: int | None, seed: int) -> tuple[list[Mutant], int, int]:
    """(the room's mutants, sampled to `limit` with `seed`; how many there are in all; places left out)."""
    everything, skipped = [], 0
    for path in ROOMS[room][0]:
        found, left_out = mutants_of(path, (REPO / path).read_text(encoding="utf-8"))
        everything += found
        skipped += left_out
    order = list(range(len(everything)))
    random.Random(f"{seed}:{room}").shuffle(order)  # the first N of one order: a smaller --limit draws a subset
    chosen = [everything[index] for index in sorted(order[:limit])]
    return chosen, len(everything), skipped


# ---- running them -----------------------------------------------------------------------------


def copy_repository() -> Path:
    """A copy of the working tree in a temporary folder, without the virtualenv, git and caches."""
    folder = Path(tempfile.mkdtemp(prefix="minisbert-mutants-"))
    shutil.copytree(REPO, folder / "repo", ignore=shutil.ignore_patterns(*COPY_LEAVES_OUT), symlinks=True)
    return folder / "repo"


def run_tests(copy: Path, tests: list[str], timeout: float) -> tuple[str, str, float]:
    """(outcome, the first failing test, seconds) of the tests in `copy`; a run past `timeout` is killed
    with every process it started."""
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow", *tests]
    # No .pyc files: a mutant often has the size of the original and can be written in the same second,
    # and Python would then take the cached bytecode of the last version for the current one.
    environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(copy)}
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=copy, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return "timeout", "", time.monotonic() - started
    seconds = time.monotonic() - started
    if process.returncode == 0:
        return "survived", "", seconds
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    if process.returncode in (1, 2):  # tests failed; collection failed
        return "caught", failed.group(1) if failed else f"pytest exit {process.returncode}", seconds
    raise RuntimeError(f"pytest exited with {process.returncode} in {copy}:\n{output[-3000:]}")


def run_mutant(mutant: Mutant, copies: Queue, tests: list[str], timeout: float) -> Outcome:
    copy = copies.get()
    target = copy / mutant.path
    original = target.read_text(encoding="utf-8")
    try:
        target.write_text(mutant.source, encoding="utf-8")
        result, caught_by, seconds = run_tests(copy, tests, timeout)
    finally:
        target.write_text(original, encoding="utf-8")
        copies.put(copy)
    return Outcome(mutant, result, caught_by, seconds)


@dataclass
class RoomResult:
    room: str
    tests: list[str]
    total: int  # mutants of the room in all
    left_out: int  # places not mutated (messages, annotations, __repr__)
    outcomes: list[Outcome]
    seconds: float  # the room's run, its unmutated tests included
    broken: str = ""  # why the room was not run: its tests fail unmutated


def run_room(room: str, args, copies: list[Path]) -> RoomResult:
    tests = [test for test in ROOMS[room][1] if (REPO / test.split("::")[0]).is_file()]
    for missing in set(ROOMS[room][1]) - set(tests):
        print(f"[{room}] {missing} does not exist: left out", flush=True)
    mutants, total, left_out = room_mutants(room, args.limit, args.seed)
    started = time.monotonic()
    result, caught_by, baseline = run_tests(copies[0], tests, args.timeout or 3600)
    if result != "survived":
        print(f"[{room}] the tests fail without a mutant ({caught_by or result}): room skipped", flush=True)
        return RoomResult(room, tests, total, left_out, [], baseline,
                          f"the tests fail without a mutant: {caught_by or result}")
    timeout = args.timeout or max(60.0, 4 * baseline)
    print(f"[{room}] {len(mutants)} of {total} mutants; tests take {baseline:.0f} s unmutated, "
          f"a mutant gets {timeout:.0f} s", flush=True)
    queue: Queue = Queue()
    for copy in copies:
        queue.put(copy)
    outcomes = []
    with ThreadPoolExecutor(len(copies)) as pool:
        futures = [pool.submit(run_mutant, mutant, queue, tests, timeout) for mutant in mutants]
        for number, future in enumerate(futures, 1):
            outcome = future.result()
            outcomes.append(outcome)
            m = outcome.mutant
            print(f"[{room} {number}/{len(mutants)}] {outcome.result:8} {m.where}  {m.change}  "
                  f"{outcome.caught_by}  ({outcome.seconds:.1f} s)", flush=True)
    if len(copies) > 1:  # a timeout beside other jobs may be a survivor they slowed: run it again alone
        for number, outcome in enumerate(outcomes):
            if outcome.result == "timeout":
                outcomes[number] = again = run_mutant(outcome.mutant, queue, tests, timeout)
                print(f"[{room} again, alone] {again.result:8} {again.mutant.where}  {again.mutant.change}  "
                      f"{again.caught_by}  ({again.seconds:.1f} s)", flush=True)
    return RoomResult(room, tests, total, left_out, outcomes, time.monotonic() - started)


# ---- the report -------------------------------------------------------------------------------
# Each room's results are kept in a JSON file beside the report (MUTANTS.json beside MUTANTS.md), and the
# report is written from all of them: a room run again alone (after a test is added; the slow search room
# with a smaller --limit) replaces its own results and leaves the other rooms' as they were.


def rate(caught: int, run: int) -> str:
    return f"{100 * caught / run:.0f}%" if run else "-"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def survivor_key(where: str, change: str, code: str) -> tuple:
    """What identifies a survivor from one report to the next, whatever line it has moved to."""
    path, _, column = where.rsplit(":", 2)
    return path, column, change.strip(), code.strip()


def written_explanations(report: Path) -> dict:
    """{survivor_key: why} from the survivors' table of an earlier report, where someone filled it in."""
    if not report.is_file():
        return {}
    explanations = {}
    for line in report.read_text(encoding="utf-8").splitlines():
        cells = [part.strip().replace("\\|", "|") for part in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 5 and re.fullmatch(r"\S+:\d+:\d+", cells[1]) and cells[4] != NOT_CHANGED:
            explanations[survivor_key(cells[1], cells[2].strip("`"), cells[3].strip("`"))] = cells[4]
    return explanations


def shown_equivalent(why: str) -> bool:
    """Whether a survivor's written reason says it is equivalent (it starts "Equivalent")."""
    return why.strip().lower().startswith("equivalent")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def room_record(result: RoomResult, command: str, started: datetime) -> dict:
    """A room's results as kept in the JSON file."""
    return {"command": command, "date": f"{started:%Y-%m-%d}", "machine": f"{cpu_name()} ({os.cpu_count()} cores)",
            "minutes": round(result.seconds / 60, 1), "tests": result.tests, "total": result.total,
            "left_out": result.left_out, "broken": result.broken,
            "outcomes": [{"where": o.mutant.where, "change": o.mutant.change, "code": o.mutant.code,
                          "result": o.result, "caught_by": o.caught_by} for o in result.outcomes]}


def write_report(path: Path, results: list[RoomResult], command: str, started: datetime) -> None:
    """Keep these rooms' results in the JSON file beside `path`, then write the markdown report of every
    room the file holds."""
    store = path.with_suffix(".json")
    rooms = json.loads(store.read_text(encoding="utf-8")) if store.is_file() else {}
    rooms.update({result.room: room_record(result, command, started) for result in results})
    rooms = {room: rooms[room] for room in [*ROOMS, *sorted(set(rooms) - set(ROOMS))] if room in rooms}
    store.write_text(json.dumps(rooms, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    earlier = path.read_text(encoding="utf-8") if path.is_file() else ""
    notes = earlier[earlier.index(f"\n{NOTES}") :] if f"\n{NOTES}" in earlier else ""
    path.write_text(markdown(rooms, written_explanations(path)) + notes, encoding="utf-8")


def run_of(record: dict) -> tuple:
    """The run that produced a room's record: (command, date, machine)."""
    return record["command"], record["date"], record["machine"]


def markdown(rooms: dict, explanations: dict) -> str:
    runs = list(dict.fromkeys(run_of(r) for r in rooms.values()))
    out = ["# Mutation testing: how many planted bugs the quick tests catch", "",
           "tests/mutate.py says what a mutant is, what is never mutated and how each runs. The rooms were run by:", ""]
    for number, (command, date, machine) in enumerate(runs, 1):
        names = [room for room, r in rooms.items() if run_of(r) == (command, date, machine)]
        minutes = sum(rooms[room]["minutes"] for room in names)
        out.append(f"{number}. `{command}` on {date}, {machine}, {minutes:.0f} minutes: {', '.join(names)}")
    out += ["", "| room | tests | mutants run (of all) | caught | of which timeouts | survived | caught rate | "
                "survivors shown equivalent | caught of the rest | run |", "|---|---|---|---|---|---|---|---|---|---|"]
    all_run = all_caught = all_timeouts = all_equivalent = 0
    for room, r in rooms.items():
        run_number = runs.index(run_of(r)) + 1
        if r["broken"]:
            out.append(f"| {room} | {', '.join(r['tests'])} | not run: {r['broken']} | | | | | | | {run_number} |")
            continue
        counts = {kind: sum(o["result"] == kind for o in r["outcomes"]) for kind in ("caught", "timeout", "survived")}
        caught, run = counts["caught"] + counts["timeout"], len(r["outcomes"])
        # A survivor whose written reason starts "Equivalent" was read and shown to be one (no input tells
        # it apart): no test can catch it, so the rate of the rest is the share of catchable bugs caught.
        equivalent = sum(o["result"] == "survived" and shown_equivalent(explanations.get(survivor_key(
            o["where"], o["change"], o["code"]), "")) for o in r["outcomes"])
        all_run, all_caught, all_timeouts = all_run + run, all_caught + caught, all_timeouts + counts["timeout"]
        all_equivalent += equivalent
        out.append(f"| {room} | {', '.join(r['tests'])} | {run} ({r['total']}) | {caught} | {counts['timeout']} | "
                   f"{counts['survived']} | {rate(caught, run)} | {equivalent} | {rate(caught, run - equivalent)} | "
                   f"{run_number} |")
    out.append(f"| **all** | | {all_run} | {all_caught} | {all_timeouts} | {all_run - all_caught} | "
               f"**{rate(all_caught, all_run)}** | {all_equivalent} | **{rate(all_caught, all_run - all_equivalent)}** | |")
    left_out = sum(r["left_out"] for r in rooms.values())
    out += ["", f"Places left out as unable to matter (inside raise, warnings.warn, f-strings, annotations, "
                f"__repr__): {left_out}.", "", "## Survivors", "",
            "Each is either equivalent (no input can tell it from the original) or shows a missing check.", "",
            "| room | where | change | code | why it survives |", "|---|---|---|---|---|"]
    for room, r in rooms.items():
        for o in r["outcomes"]:
            if o["result"] == "survived":
                why = explanations.get(survivor_key(o["where"], o["change"], o["code"]), NOT_CHANGED)
                out.append(f"| {room} | {o['where']} | `{cell(o['change'])}` | `{cell(o['code'])}` | {cell(why)} |")
    timeouts = [(room, o) for room, r in rooms.items() for o in r["outcomes"] if o["result"] == "timeout"]
    if timeouts:
        out += ["", "## Timeouts (counted as caught)", "", "| room | where | change | code |", "|---|---|---|---|"]
        out += [f"| {room} | {o['where']} | `{cell(o['change'])}` | `{cell(o['code'])}` |" for room, o in timeouts]
    out += ["", "## What caught each mutant", ""]
    for room, r in rooms.items():
        caught = [o for o in r["outcomes"] if o["result"] == "caught"]
        if caught:
            out += [f"<details><summary>{room}: {len(caught)} caught</summary>", "",
                    "| where | change | caught by |", "|---|---|---|"]
            out += [f"| {o['where']} | `{cell(o['change'])}` | {o['caught_by']} |" for o in caught]
            out += ["", "</details>", ""]
    return "\n".join(out).rstrip() + "\n"


# ---- the script -------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--room", action="append", choices=list(ROOMS),
                        help="a room to mutate (repeatable); default: every room, in ROOMS' order")
    parser.add_argument("--limit", type=int, default=None, help="mutants per room, drawn with --seed (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="which mutants --limit draws")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in a copy of its own")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds a mutant's tests may take (default: 4 times the unmutated run, at least 60)")
    parser.add_argument("--report", type=Path, default=None, help="write the markdown report here")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1 or args.jobs < 1:
        parser.error("--limit and --jobs must be at least 1")
    rooms = args.room or list(ROOMS)
    command = "python tests/mutate.py " + shlex.join(argv if argv is not None else sys.argv[1:])

    started, clock = datetime.now(), time.monotonic()
    copies = [copy_repository() for _ in range(args.jobs)]
    try:
        results = [run_room(room, args, copies) for room in rooms]
    finally:
        for copy in copies:
            shutil.rmtree(copy.parent, ignore_errors=True)
    seconds = time.monotonic() - clock

    print()
    for result in results:
        caught = sum(o.result != "survived" for o in result.outcomes)
        timeouts = sum(o.result == "timeout" for o in result.outcomes)
        state = result.broken or f"{caught}/{len(result.outcomes)} caught ({timeouts} by timeout)"
        print(f"{result.room:13} {state}")
    run = sum(len(result.outcomes) for result in results)
    caught = sum(o.result != "survived" for result in results for o in result.outcomes)
    print(f"{'all':13} {caught}/{run} caught, {rate(caught, run)}, in {seconds / 60:.1f} minutes")
    if args.report:
        write_report(args.report, results, command, started)
        print(f"report: {args.report} (results kept in {args.report.with_suffix('.json')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
