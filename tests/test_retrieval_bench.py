"""Tests for bench/retrieval.py's floors, the part of its table that is no search: the float32 product
and the exact scores of each query's k best rows, which no way of minisbert's that multiplies in
float32 can leave out, and that with each row's norm taken in the cache (`norms=True`), which no way
over rows as given can leave out. Each answers as the search does, for a few queries (the span
product) and for many (blocks), and for the first rows alone (the warm-up); and the script times
both beside the search, without the peer environment."""

import importlib.util
import re
import subprocess
import sys

import pytest
import torch

from minisbert.search.fast.tuning import FEW_QUERIES
from minisbert.search import search

from .conftest import REPO

pytestmark = pytest.mark.slow  # a benchmark script: the slow suite (README, "Tests")

spec = importlib.util.spec_from_file_location("retrieval_bench", REPO / "bench" / "retrieval.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_the_floor_answers_as_the_search_does_for_few_and_many_queries():
    generator = torch.Generator().manual_seed(0)
    corpus = torch.randn(9000, 24, generator=generator)  # over 8,192 rows: two blocks
    for num_queries in (1, 3, FEW_QUERIES + 1):
        queries = torch.randn(num_queries, 24, generator=generator)
        expected = search(queries, corpus, 7, score="dot")[1]
        for norms in (False, True):
            floor, kernel = bench.floor(queries, corpus, 7, norms=norms)
            assert ("quickest here" in kernel) == (num_queries <= FEW_QUERIES), kernel  # a few: timed and named
            normed = rows_normed(lambda: floor(queries))
            assert normed == (corpus.shape[0] if norms else 0), (num_queries, norms, normed)  # every row, once
            assert torch.equal(floor(queries), expected)
            assert torch.equal(floor(queries[:1]), expected[:1])


def rows_normed(call) -> int:
    """How many rows `call()` takes torch.linalg.vector_norm of (the floor's norms are not returned)."""
    counted, norm = [], torch.linalg.vector_norm

    def counting(rows, *args, **kwargs):
        counted.append(rows.shape[0])
        return norm(rows, *args, **kwargs)
    torch.linalg.vector_norm = counting
    try:
        call()
    finally:
        torch.linalg.vector_norm = norm
    return sum(counted)


def test_the_script_times_the_floor_beside_the_search_without_a_peer():
    result = subprocess.run([sys.executable, "bench/retrieval.py", "--sizes", "300", "--queries", "1", "200",
                             "--repeats", "1", "--methods", "minisbert-dot", "floor", "floor-norms", "plain"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    for label in ("floor: product, exact scores", "floor: product, row norms, exact scores"):
        lines = [line for line in result.stdout.splitlines() if line.startswith(label)]
        assert len(lines) == 2 and all("100.0%" in line for line in lines), result.stdout
    assert "floor / plain:" in result.stdout
    # Each minisbert row names the way its search took and the facts it was chosen by (one search
    # before the timing): one query over 300 rows is one span, 200 queries (past FEW_QUERIES) blocks.
    ways = re.findall(r"way '([^']+)' \(chosen; passed over: .*?\) for (\d+) queries, 300 rows of d = ", result.stdout)
    assert [(way.split(",")[0], int(count)) for way, count in ways] == [("one span", 1), ("blocks", 200)], result.stdout
