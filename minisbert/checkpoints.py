"""Checkpoints, the step log and the random state of a training run: written, read back, resumed.

A checkpoint holds everything the next step depends on (model and classifier weights, optimizer
moments, schedule position, the loss scale, every process's torch random state that drives dropout,
and where in which epoch the data stood), so that `fit(..., resume=True)` continues with the very
losses an uninterrupted run would have had. It is written to a temporary file and renamed, so an
interruption or a full disk never leaves a half-written checkpoint in place of the last good one.
The log has one JSON line per optimizer step; a resumed run cuts it back to the checkpoint's step.
Used by fit.py; checked in tests/test_training.py and tests/test_fileio.py.
"""

import io
import json
from pathlib import Path

import torch

from .fileio import atomic_write

CHECKPOINT_KEYS = ("identity", "model", "classifier", "optimizer", "scheduler", "scaler", "rng", "step", "epoch",
                   "next_batch", "best", "training_seconds")


def save_checkpoint(path: Path, state: dict) -> None:
    """Atomically write a checkpoint (tensors and plain Python values only).

    torch.save writes into memory first and Python writes the bytes, so that a full disk is an
    OSError with its reason, not an error from inside torch's zip writer."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
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
    missing = [key for key in CHECKPOINT_KEYS if key not in state] if isinstance(state, dict) else CHECKPOINT_KEYS
    if missing:
        raise ValueError(f"{path} is not a checkpoint written by minisbert's training "
                         + ("(it is damaged, cut short, or holds more than tensors and plain values)" if state is None
                            else f"(it lacks {', '.join(missing)})")
                         + "; it cannot be resumed: start a new run in another --output")
    return state


def append_log(path: Path, entry: dict) -> None:
    """One JSON line per optimizer step, appended as it happens so the log can be watched live."""
    with open(path, "a", encoding="utf-8") as log:
        log.write(json.dumps(entry) + "\n")


def truncate_log(path: Path, last_step: int) -> None:
    """Keep the log lines up to `last_step`: a resumed run writes the later steps again.

    A run killed while appending leaves its last line cut short, without the newline: that line is
    dropped, with a note. Any other line that is not a log entry is an error naming it."""
    path = Path(path)
    if not path.is_file():
        return
    text = path.read_text(encoding="utf-8")
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
