"""Facts about this machine that the fast paths choose by, measured once per machine and kept.

Some choices can only be made by measuring: which of two product kernels is quicker for a shape,
whether an int8 product is exact on this CPU. Measured anew in every process, such a choice would
depend on what else the machine was doing at that moment, and two processes could compute the same
thing two ways. So each fact is measured the first time any process needs it, written to one small
JSON file, and read back by every later process on the same machine:

    $MINISBERT_MACHINE_FILE, else <cache>/machine-<key>.json

where <cache> is minisbert's cache folder (.cache/ in a clone, ~/.cache/minisbert/cache otherwise)
and <key> names the processor (model name and flags), the thread count and the torch version, so a
file never travels to a machine it does not describe. `known()` returns every fact kept so far and
`report()` the lines that print those this process chose by (`python bench/encode.py`,
bench/retrieval.py and `evaluate.py --verbose` print them). A fact is measured again only if its file
is deleted.

A choice can always be forced without measuring: each fast path names its own variable or argument
(MINISBERT_GEMM for the encoder's products, MINISBERT_SEARCH_WAY for the search). And timing can be
turned off altogether: with MINISBERT_PROBES=off a choice made by timing takes its first candidate
(torch's kernels, no int8 screen) without timing anything. The test suite runs so (tests/conftest.py),
so that its time and its results never depend on how loaded the machine was when a probe ran; the
tests of each probe turn timing back on and measure once.
"""

import fcntl
import hashlib
import json
import math
import os
import platform
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from . import cpu
from .fileio import atomic_write, checked_record, home_folder, with_digest

MACHINE_FILE_VARIABLE = "MINISBERT_MACHINE_FILE"
PROBES_VARIABLE = "MINISBERT_PROBES"  # "off": nothing is timed; every timed choice takes its first candidate
PROBE_ROUNDS = 3  # timed rounds per contender, after one untimed round


def describe() -> str:
    """The processor, thread count and torch version a machine file describes."""
    model = _cpu_model()
    return f"{model}; flags {' '.join(sorted(cpu.flags()))}; {torch.get_num_threads()} threads; torch {torch.__version__}"


def machine_file() -> Path:
    """Where this machine's facts are kept (see the module docstring)."""
    if os.environ.get(MACHINE_FILE_VARIABLE):
        return Path(os.environ[MACHINE_FILE_VARIABLE])
    key = hashlib.sha256(describe().encode()).hexdigest()[:16]
    return home_folder(".cache") / f"machine-{key}.json"


_kept: dict | None = None  # this process's copy of the file
_asked: set[str] = set()  # the facts this process has asked for


def known() -> dict:
    """Every fact kept for this machine so far, name -> value (and "machine": what it describes). A
    file that is not a JSON object describing this machine is set aside, with a warning naming it:
    its facts are measured again."""
    global _kept
    if _kept is None:
        path = machine_file()
        try:
            _kept = checked_record(json.loads(path.read_text()), str(path))  # edited or damaged: set aside
        except FileNotFoundError:
            _kept = {}
        except (OSError, ValueError) as error:
            warnings.warn(f"the machine facts file {path} cannot be read ({error}); its facts are measured again")
            _kept = {}
        if not isinstance(_kept, dict):
            warnings.warn(f"the machine facts file {path} holds no JSON object; its facts are measured again")
            _kept = {}
        if _kept.get("machine") != describe():
            _kept = {"machine": describe()}
    return dict(_kept)


def fact(name: str, measure: Callable[[], object], choices=None, kind=None):
    """The kept value of fact `name`, measuring it with `measure()` (JSON-able) if none is kept yet.
    A kept value that is not one of `choices`, or not of type `kind` (a file written by another
    version, or edited), is measured again, with a warning naming the file.
    The first value written wins: the file is read again and written under a lock, so a process that
    measured at the same time as another takes the other's value, and every process on the machine
    uses the same one. (The measuring runs outside the lock: it may need other facts.)"""
    global _kept
    _asked.add(name)

    def usable(value) -> bool:
        return (choices is None or value in choices) and (kind is None or isinstance(value, kind))

    if _kept is not None and name in _kept and usable(_kept[name]):  # asked for at every product: no copy
        return _kept[name]
    kept = known()
    if name in kept:
        if usable(kept[name]):
            return kept[name]
        warnings.warn(f"the machine facts file {machine_file()} holds {kept[name]!r} for {name!r}, which this "
                      "version cannot use; it is measured again")
    value = json.loads(json.dumps(measure()))
    path = machine_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_name(path.name + ".lock"), "a")
    except OSError:  # a read-only cache: the fact is kept for this process only
        _kept[name] = value
        return value
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _kept = None
        facts = known()
        if name not in facts or not usable(facts[name]):
            facts[name] = value
            atomic_write(path, lambda tmp: tmp.write_text(json.dumps(with_digest(facts), indent=1, sort_keys=True)))
            _kept = facts
    return _kept[name]


def timing() -> bool:
    """Whether probes time anything (MINISBERT_PROBES is not "off")."""
    setting = os.environ.get(PROBES_VARIABLE, "on")
    if setting not in ("on", "off"):
        raise ValueError(f"{PROBES_VARIABLE}={setting!r}: choose on (the default) or off")
    return setting == "on"


def best_times(calls: dict) -> dict:
    """Each of `calls` (name -> function of no arguments) timed in turns, PROBE_ROUNDS rounds after
    one untimed round that only warms up: name -> its best time in seconds. With timing off, nothing
    runs and every time is 0: the first of `calls` is the quickest."""
    if not timing():
        return dict.fromkeys(calls, 0.0)
    best = dict.fromkeys(calls, math.inf)
    for round_number in range(PROBE_ROUNDS + 1):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if round_number > 0:
                best[name] = min(best[name], time.perf_counter() - start)
    return best


def time_ratio(call, other) -> float:
    """How long `call` takes as a share of `other`'s time, each timed as `best_times` times them
    (1 with timing off: `call` then never pays for itself)."""
    if not timing():
        return 1.0
    best = best_times({"call": call, "other": other})
    return best["call"] / best["other"]


def report() -> str:
    """The machine and each fact this process chose by, one a line; the file's other facts (asked for by other
    runs, or named by an older minisbert) are counted, not printed."""
    facts = known()
    lines = [f"machine: {facts.pop('machine')}", f"facts this process chose by, kept in {machine_file()}:"]
    lines += [f"  {name}: {value}" for name, value in sorted(facts.items()) if name in _asked]
    others = len(facts.keys() - _asked)
    return "\n".join(lines + ([f"  ({others} more kept, not asked for by this process)"] if others else []))


def forget() -> None:
    """Drop this process's copy of the facts (tests that point MINISBERT_MACHINE_FILE elsewhere)."""
    global _kept
    _kept = None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
