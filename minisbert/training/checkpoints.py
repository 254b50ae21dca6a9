"""Checkpoints, the step log and the random state of a training run: written, read back, resumed.

A checkpoint holds everything the next step depends on (model and classifier weights, optimizer
moments, schedule position, the loss scale, every process's torch random state that drives dropout,
and where in which epoch the data stood), so that `fit(..., resume=True)` continues with the very
losses an uninterrupted run would have had. It is written to a temporary file and renamed, so an
interruption or a full disk never leaves a half-written checkpoint in place of the last good one. It
carries the SHA-256 of its values, and its values are checked when read back (`load_checkpoint`): a
damaged, edited or diverged checkpoint is refused, naming the file and what is wrong, so that a
resumed run never writes outputs from it over a finished run's.
The log has one JSON line per optimizer step; a resumed run cuts it back to the checkpoint's step.
Used by training/fit.py; checked in tests/training/test_training.py and tests/common/test_fileio.py.
"""

import hashlib
import io
import json
from pathlib import Path

import torch

from ..common.fileio import atomic_write, checked_record, with_digest

DIGEST = "sha256"  # the checkpoint's own entry holding `state_digest` of the rest
CHECKPOINT_KEYS = ("identity", "model", "classifier", "optimizer", "scheduler", "scaler", "rng", "step", "epoch",
                   "next_batch", "best", "training_seconds")


def save_checkpoint(path: Path, state: dict) -> None:
    """Atomically write a checkpoint (tensors and plain Python values only).

    torch.save writes into memory first and Python writes the bytes, so that a full disk is an
    OSError with its reason, not an error from inside torch's zip writer."""
    buffer = io.BytesIO()
    torch.save({**state, DIGEST: state_digest(state)}, buffer)
    try:
        atomic_write(Path(path), lambda tmp: tmp.write_bytes(buffer.getbuffer()))
    except OSError as error:
        raise OSError(f"could not write the checkpoint {path}: {error.strerror or error}. "
                      "The previous checkpoint, if any, is intact.") from error


def load_checkpoint(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path} to resume from: the run stopped before writing one, or "
                                f"never started; start again in another --output, or delete {path.parent} first")
    try:
        state = torch.load(path, weights_only=True)  # plain data only: nothing in it can run code
    except Exception:  # bytes that are not a checkpoint fail anywhere in the unpickler (IndexError, EOFError, ...)
        state = None  # and torch's message would suggest weights_only=False, i.e. running code from the file
    if isinstance(state, dict) and DIGEST in state:  # written since checkpoints carry one: the values as written?
        kept = state.pop(DIGEST)
        if kept != state_digest(state):
            raise ValueError(f"{path} is not the checkpoint that was written (its SHA-256 differs from the one "
                             "saved in it): the file was damaged or edited; it cannot be resumed: start a new run "
                             "in another --output, or delete the checkpoint")
    missing = [key for key in CHECKPOINT_KEYS if key not in state] if isinstance(state, dict) else CHECKPOINT_KEYS
    if missing:
        raise ValueError(f"{path} is not a checkpoint written by minisbert's training "
                         + ("(it is damaged, cut short, or holds more than tensors and plain values)" if state is None
                            else f"(it lacks {', '.join(missing)})")
                         + "; it cannot be resumed: start a new run in another --output")
    problem = state_problem(state)
    if problem:
        raise ValueError(f"{path} cannot be resumed: {problem}. A run resumed from it would write its outputs "
                         "over this run's; start a new run in another --output, or delete the checkpoint")
    return state


def state_digest(value) -> str:
    """SHA-256 of a checkpoint's values: every tensor's dtype, shape and bytes, every other value's type
    and repr, dicts in their order (torch.save keeps it), lists and tuples in theirs. torch.load checks
    no checksum of the bytes it reads, so a flipped bit in a tensor would otherwise resume unseen."""
    digest = hashlib.sha256()
    _digest_into(digest, value)
    return digest.hexdigest()


def _digest_into(digest, value) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().contiguous().cpu()
        digest.update(f"tensor {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    elif isinstance(value, dict):
        digest.update(f"dict {len(value)}\n".encode())
        for key, inner in value.items():
            digest.update(f"{key!r}\n".encode())
            _digest_into(digest, inner)
    elif isinstance(value, (list, tuple)):
        digest.update(f"{type(value).__name__} {len(value)}\n".encode())
        for inner in value:
            _digest_into(digest, inner)
    else:
        digest.update(f"{type(value).__name__} {value!r}\n".encode())


def state_problem(state: dict) -> str | None:
    """What is wrong with a checkpoint's values, or None: counts that are not non-negative integers,
    a time that is not a non-negative number, parts that are not of their kind, and weights or
    optimizer moments that are not finite (a diverged or damaged run: resuming it would replace good
    outputs with broken ones)."""
    for key in ("step", "epoch", "next_batch"):
        if not isinstance(state[key], int) or isinstance(state[key], bool) or state[key] < 0:
            return f"its {key!r} is {state[key]!r}, not a count"
    seconds = state["training_seconds"]
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 <= seconds < float("inf"):
        return f"its 'training_seconds' is {seconds!r}, not a time"
    for key, kind in (("identity", dict), ("model", dict), ("classifier", dict), ("optimizer", dict),
                      ("scheduler", dict), ("scaler", dict), ("rng", list)):
        if not isinstance(state[key], kind):
            return f"its {key!r} is a {type(state[key]).__name__}, not a {kind.__name__}"
    if state["best"] is not None and not (isinstance(state["best"], dict) and {"step", "metric", "value"} <= state["best"].keys()):
        return f"its 'best' is {state['best']!r}, not a dev score"
    for key in ("model", "classifier", "optimizer"):
        where = _first_not_finite(state[key], key)
        if where:
            return f"{where} holds values that are not finite (the run diverged, or the file was damaged)"
    return None


def _first_not_finite(value, name: str) -> str | None:
    """The name of the first floating-point tensor within `value` (dicts and lists) that is not finite."""
    if isinstance(value, torch.Tensor):
        return name if value.is_floating_point() and not bool(torch.isfinite(value).all()) else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, inner in items:
        where = _first_not_finite(inner, f"{name}[{key!r}]")
        if where:
            return where
    return None


def append_log(path: Path, entry: dict) -> None:
    """One JSON line per optimizer step, appended as it happens so the log can be watched live."""
    with open(path, "a", encoding="utf-8") as log:
        log.write(json.dumps(with_digest(entry)) + "\n")  # each line checked when read back (`read_log`)


def _log_text(path: Path) -> str:
    """A training log's text; one that is not UTF-8 is refused naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start}): not a training log; "
                         "repair or delete it") from None


def read_log(path: Path) -> list[dict]:
    """The entries of a training log, each line checked against the digest it carries (`checked_record`);
    a line that is not one is refused naming the file and the line."""
    lines = _log_text(Path(path)).splitlines()
    entries = []
    for number, line in enumerate(lines, start=1):
        try:
            entries.append(checked_record(json.loads(line), f"{path} line {number}"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} line {number} is not a log entry ({error.msg})") from None
    return entries


def truncate_log(path: Path, last_step: int) -> None:
    """Keep the log lines up to `last_step`: a resumed run writes the later steps again.

    A run killed while appending leaves its last line cut short, without the newline: that line is
    dropped, with a note. Any other line that is not a log entry is an error naming it."""
    path = Path(path)
    if not path.is_file():
        return
    text = _log_text(path)
    lines = text.splitlines()
    kept = []
    for number, line in enumerate(lines, start=1):
        try:
            entry = json.loads(line)
            step = entry["step"]
        except (json.JSONDecodeError, TypeError, KeyError):
            if number == len(lines) and not text.endswith("\n"):
                print(f"{path} line {number} was cut short when the run stopped; dropping it (that step runs again)")
                break
            raise ValueError(f"{path} line {number} is not a log entry (a JSON object with a step): {line[:60]!r}; "
                             "repair or delete that line, then resume again") from None
        checked_record(entry, f"{path} line {number}")
        if step <= last_step:
            kept.append(line)
    atomic_write(path, lambda tmp: tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8"))


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
