"""Writing files so that nothing a user had is lost, and reading JSON with errors that say where.

Every file minisbert writes (weights, configs, checkpoints, logs, run files, cached embeddings) goes
through `atomic_write`: the bytes go to a temporary file in the same folder, which is renamed over
the real name only once it is complete. A crash, a kill or a full disk therefore leaves either the
old file or the new one under the real name, never half of one, and the temporary file is removed.

Temporary files are created private (mode 0600) by the operating system; before the rename they
are given the mode any other new file of the user gets (0666 less the umask), so a saved model can
be read by a teammate or by a container running as another user.

Files read back are checked to be the ones written: a safetensors file minisbert writes carries, in
its own metadata, the SHA-256 of its tensors (`tensors_digest`), which the reader recomputes, so a
flipped bit, a cut or an edit is refused naming the file rather than computed with. A record minisbert
writes as JSON (a run's summary, a study's run.json and results.json, each line of a training log,
the machine facts) carries the SHA-256 of its own content under the same key (`with_digest`), which
`read_json` checks wherever it finds one (files of other tools, and older records, have none).

Checked in tests/common/test_fileio.py.
"""

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save as safetensors_bytes


def home_folder(name: str) -> Path:
    """Where minisbert keeps `name` (weights, data, .cache) by default: the folder of that name in the
    clone the package runs from (a checkout, or `pip install -e .` of one), else, for a copy installed
    by `pip install .`, which has no clone around it, ~/.cache/minisbert/NAME (XDG_CACHE_HOME honoured)."""
    clone = Path(__file__).resolve().parents[2]  # minisbert/common/fileio.py -> the clone
    if (clone / "train.py").is_file():
        return clone / name
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minisbert" / name.lstrip(".")


def current_umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it; put it straight back
    os.umask(mask)
    return mask


def check_writable_folder(folder: Path) -> None:
    """Refuse, before any work is done, a folder that cannot be written: one whose path runs into a
    file, or whose nearest existing part this process may not write in. Creates nothing."""
    folder = Path(folder).absolute()
    existing = next(part for part in (folder, *folder.parents) if part.exists())
    if not existing.is_dir():
        raise OSError(f"cannot write in {folder}: {existing} is a file, not a folder; choose another folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OSError(f"cannot write in {folder}: {existing} is not writable by you; choose another folder "
                      "or change its permissions")


def atomic_write(path: Path, write) -> None:
    """Call write(temporary_path) in path's folder, then rename it over path.

    An OSError while writing (a full disk, a folder that is not writable) is raised naming `path`,
    with the temporary file removed and the old file at `path`, if any, untouched.
    """
    path = Path(path)
    check_writable_folder(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except OSError as error:  # say which file: the temporary name in the error means nothing to the user
        Path(tmp).unlink(missing_ok=True)
        raise OSError(error.errno, error.strerror or str(error), str(path)) from error
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


DIGEST_KEY = "minisbert sha256"  # the metadata entry of a safetensors file that holds `tensors_digest`


def tensors_digest(tensors: dict) -> str:
    """SHA-256 of named tensors: each name, dtype and shape, then its bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous().cpu()
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    return digest.hexdigest()


def write_safetensors(path: Path, tensors: dict, metadata: dict) -> None:
    """Write `tensors` to a safetensors file, atomically, with `metadata` and the tensors' SHA-256
    (DIGEST_KEY) in its header, and the header's keys in sorted order: safetensors writes its metadata
    in a hash map's order, which changes from one process to the next, and the same tensors should
    give the same bytes."""
    data = safetensors_bytes(tensors, {**metadata, DIGEST_KEY: tensors_digest(tensors)})
    length = int.from_bytes(data[:8], "little")
    header = json.dumps(json.loads(data[8:8 + length]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # the tensors' bytes start 8-byte aligned, as safetensors keeps them
    atomic_write(Path(path), lambda tmp: tmp.write_bytes(len(header).to_bytes(8, "little") + header + data[8 + length:]))


def check_digest(path: Path, metadata: dict, tensors: dict) -> None:
    """Refuse tensors read from `path` whose digest is not the one its metadata holds (files written
    before digests were kept, or by other tools, have none: nothing to check)."""
    kept = (metadata or {}).get(DIGEST_KEY)
    if kept is not None and kept != tensors_digest(tensors):
        raise ValueError(f"{path}: its tensors are not the ones written (their SHA-256 differs from the one saved "
                         "in its metadata): the file was damaged or edited after it was saved")


def json_digest(value) -> str:
    """SHA-256 of a JSON value as written canonically (keys sorted, no spaces)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def with_digest(record: dict) -> dict:
    """`record` as JSON will read it back (tuples as lists, keys as strings), with DIGEST_KEY: its SHA-256."""
    record = json.loads(json.dumps(record))
    return {**record, DIGEST_KEY: json_digest(record)}


def checked_record(value, where: str):
    """`value` read from JSON, without its digest: a dict holding DIGEST_KEY must hash to it, else it
    is refused naming `where` (the file, or the file and line)."""
    if not (isinstance(value, dict) and DIGEST_KEY in value):
        return value
    value = dict(value)
    if value.pop(DIGEST_KEY) != json_digest(value):
        raise ValueError(f"{where}: its content is not the one written (its SHA-256 differs from the one it "
                         "carries): it was damaged or edited after it was written; restore it or write it again")
    return value


def file_label(text: str) -> str:
    """`text` made safe to use in a file name."""
    return re.sub(r"[^\w.-]+", "_", text).strip("_")


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path: Path, obj, digest: bool = False) -> None:
    """`obj` as JSON, atomically; digest: a record minisbert reads back, written `with_digest`."""
    write_text(path, json.dumps(with_digest(obj) if digest else obj, indent=2) + "\n")


def read_json(path: Path, default=None):
    """The JSON value in `path`; `default` if the file does not exist and a default is given.

    A file that is not valid JSON, or a record whose digest does not match its content
    (`checked_record`), raises ValueError naming the file (and line and column).
    """
    path = Path(path)
    if not path.is_file():
        if default is not None:
            return default
        raise FileNotFoundError(f"{path} does not exist")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start}); "
                         "replace it with a valid JSON file") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} line {error.lineno} column {error.colno}: not valid JSON "
                         f"({error.msg}); repair or replace the file") from None
    return checked_record(value, str(path))


def make_staging_dir(target: Path) -> Path:
    """A fresh, empty folder beside `target` to write a whole directory into before
    `replace_dir` moves it in place; mode 0777 less the umask, like any new folder."""
    target = Path(target)
    check_writable_folder(target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    os.chmod(staging, 0o777 & ~current_umask())
    return staging


def replace_dir(new: Path, target: Path) -> None:
    """Move folder `new` to `target`; an existing `target` is set aside first and removed only
    after `new` is in its place."""
    new, target = Path(new), Path(target)
    if target.exists():
        old = target.with_name(f".{target.name}.old-{time.time_ns()}")
        target.rename(old)
        new.rename(target)
        shutil.rmtree(old)
    else:
        new.rename(target)


def write_dir(target: Path, fill) -> None:
    """Call fill(folder) on a fresh staging folder beside `target`, then move it in place of
    `target` (`replace_dir`); if fill raises, the staging folder is removed and `target` is as it was."""
    staging = make_staging_dir(target)
    try:
        fill(staging)
        replace_dir(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
