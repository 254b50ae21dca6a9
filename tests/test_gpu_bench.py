"""Tests for bench/gpu.py, the parts that need no GPU: without CUDA it says so and measures nothing;
its search parity check agrees when both sides are the CPU (so a False on a GPU means the GPU
differs); its search table times every method at every query count and divides the one-liner's time
by each; its bandwidth arithmetic divides bytes by seconds by the peak, in GB/s."""

import importlib.util

import pytest
import torch

from .conftest import REPO

pytestmark = pytest.mark.slow  # a benchmark script: the slow suite (README, "Tests")

spec = importlib.util.spec_from_file_location("gpu_bench", REPO / "bench" / "gpu.py")
gpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu)


def test_without_cuda_it_says_so_and_measures_nothing(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main([]) == 0
    assert "no CUDA device here" in capsys.readouterr().out


def test_search_parity_holds_cpu_against_cpu():
    parity = gpu.search_parity("cpu", rows=3001, dim=16, queries=8)
    # 5 corpora x 3 scores, less dot and euclidean on "scales", and each cosine one prepared too
    assert len(parity) == 18 and all(parity.values()), parity


def test_the_search_table_times_every_method_and_divides_the_one_liners_time_by_each():
    table = gpu.search_table("cpu", rows=2000, dim=16, query_counts=(1, 3), rounds=1)
    assert len(table) == 5 * 2 and all(ms > 0 for ms in table.values()), table
    ratios = gpu.speedups(table)
    assert len(ratios) == 4 * 2
    for (method, count), ratio in ratios.items():
        assert ratio == table["torch.topk(q @ C.T)", count] / table[method, count]


def test_the_model_is_here_only_where_its_folder_is(tmp_path):
    assert gpu.model_here(str(tmp_path)) and not gpu.model_here(str(tmp_path / "no such model"))


def test_bandwidth_fraction_is_bytes_per_second_over_the_peak():
    # 6 GB/s of 4; approx: two float64 divisions may land an ulp from 1.5
    assert gpu.bandwidth_fraction(3_000_000_000, 0.5, 4.0) == pytest.approx(1.5)
