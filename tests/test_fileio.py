"""What "written safely" means: a failed write leaves the old file and no temporary file; new files
and folders get the permissions the user's umask gives any other new file; bad JSON is reported
with its file, line and column."""

import errno
import os
import stat

import pytest

from minisbert.fileio import atomic_write, make_staging_dir, read_json, replace_dir, write_json
from minisbert.progress import Progress


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
