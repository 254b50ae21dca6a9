"""What "written safely" means: a failed write leaves the old file and no temporary file; new files
and folders get the permissions the user's umask gives any other new file; bad JSON is reported
with its file, line and column. What minisbert writes (a saved model, checkpoint.pt, log.jsonl, run
files) follows the umask too (022 and 027 tried); a folder that cannot be written (a file in its path,
no write permission) is refused before any work, naming it, and nothing is created."""

import errno
import os
import stat

import pytest
import torch

import minisbert
from minisbert.training import checkpoints
from minisbert import datasets
from minisbert.common.fileio import (atomic_write, check_writable_folder, make_staging_dir, read_json, replace_dir,
                                     write_dir, write_json, write_text)
from minisbert.common.progress import Progress

from ..conftest import FIXTURES


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_write_that_fails_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "model.json"
    write_json(target, {"version": 1})

    def full_disk(tmp):
        tmp.write_text("half of a fi")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, full_disk)
    assert read_json(target) == {"version": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json"]


def test_written_files_and_folders_get_the_umask_permissions(tmp_path, umask_022):
    write_json(tmp_path / "config.json", {})
    staging = make_staging_dir(tmp_path / "model")
    assert mode(tmp_path / "config.json") == 0o644
    assert mode(staging) == 0o755
    os.umask(0o077)
    write_json(tmp_path / "private.json", {})
    assert mode(tmp_path / "private.json") == 0o600


def test_replace_dir_swaps_a_whole_folder(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "old.txt").write_text("old")
    staging = make_staging_dir(target)
    (staging / "new.txt").write_text("new")
    replace_dir(staging, target)
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_bad_json_names_the_file_line_and_column(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "hidden_size": 384,\n  "num_layers": ,\n}\n')
    with pytest.raises(ValueError, match=r"config.json line 3 column 17: not valid JSON"):
        read_json(path)


def test_a_missing_file_is_an_error_unless_a_default_is_given(tmp_path):
    assert read_json(tmp_path / "absent.json", {}) == {}
    with pytest.raises(FileNotFoundError, match="absent.json does not exist"):
        read_json(tmp_path / "absent.json")


def test_the_progress_line_counts_rate_and_time_left_from_where_it_started():
    progress = Progress(total=100, what="step", done=40, show=False)
    progress.start -= 10.0  # as if 10 s had passed
    progress.done = 60  # 20 steps in those 10 s: 2 a second, 40 left
    assert progress.line(progress.start + 10.0, "loss 0.5000") == "step 60/100  2.0/s  loss 0.5000  ETA 0m20s"


@pytest.fixture
def umask():
    """Set the process umask for one test, and put the old one back."""
    previous = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


@pytest.mark.parametrize("mask, file_mode, folder_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_what_minisbert_writes_gets_the_users_permissions(mask, file_mode, folder_mode, umask, tmp_path):
    umask(mask)
    model = minisbert.load(FIXTURES / "tiny_st_dense", device="cpu")
    model.save(tmp_path / "model")
    checkpoints.save_checkpoint(tmp_path / "run" / "checkpoint.pt", {"weights": torch.zeros(3)})
    checkpoints.append_log(tmp_path / "run" / "log.jsonl", {"step": 1})
    checkpoints.append_log(tmp_path / "run" / "log.jsonl", {"step": 2})
    checkpoints.truncate_log(tmp_path / "run" / "log.jsonl", 1)  # rewritten through a temporary file
    datasets.write_trec_run(tmp_path / "run" / "run.trec", {"q1": {"d1": 1.0}})
    written = sorted(tmp_path.rglob("*"))
    assert {p.name for p in written} >= {"model.safetensors", "modules.json", "1_Pooling", "2_Dense",
                                         "checkpoint.pt", "log.jsonl", "run.trec"}
    for path in written:
        assert mode(path) == (folder_mode if path.is_dir() else file_mode), path


def test_a_file_in_the_path_of_a_folder_is_refused_and_nothing_is_created(tmp_path):
    write_text(tmp_path / "notes", "mine")
    with pytest.raises(OSError, match=f"cannot write in {tmp_path / 'notes' / 'a'}: {tmp_path / 'notes'} is a file"):
        check_writable_folder(tmp_path / "notes" / "a")
    with pytest.raises(OSError, match=f"{tmp_path / 'notes'} is a file, not a folder"):
        write_json(tmp_path / "notes" / "results.json", {})
    assert (tmp_path / "notes").read_text() == "mine"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write in any folder, whatever its mode")
def test_a_folder_without_write_permission_is_refused_and_nothing_is_created(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(OSError, match=f"cannot write in {locked / 'run'}: {locked} is not writable by you"):
            check_writable_folder(locked / "run")
        with pytest.raises(OSError, match="is not writable by you"):
            write_json(locked / "results.json", {})
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


def test_a_folder_whose_writing_fails_leaves_the_old_one_and_no_staging_folder(tmp_path):
    target = tmp_path / "model"
    write_dir(target, lambda folder: (folder / "weights.txt").write_text("old"))

    def fails_half_way(folder):
        (folder / "weights.txt").write_text("new")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        write_dir(target, fails_half_way)
    assert (target / "weights.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
