"""Tests for bench/gpu.py, the parts that need no GPU: without CUDA it says so and measures nothing;
its search parity check agrees when both sides are the CPU (so a False on a GPU means the GPU
differs); its bandwidth arithmetic divides bytes by seconds by the peak, in GB/s."""

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
    assert len(parity) == 13 and all(parity.values()), parity


def test_bandwidth_fraction_is_bytes_per_second_over_the_peak():
    # 6 GB/s of 4; approx: two float64 divisions may land an ulp from 1.5
    assert gpu.bandwidth_fraction(3_000_000_000, 0.5, 4.0) == pytest.approx(1.5)
