"""Tests for the int8 screen of a one-query search over a prepared corpus (minisbert/fast/int8_screen.py):
its bound holds for every row, it rules out almost every row of ordinary embeddings, and a search
through it finds what the plain search and brute force find, ties and left-out rows included.

tests/test_retrieval.py runs every one-query search over a prepared corpus through the screen too
(its corpora are prepared with screen=True); on its small corpora most spans are too short to screen.
"""

import pytest
import torch

from minisbert.fast import int8_screen
from minisbert.search import load_corpus, prepare_corpus, search

from .test_retrieval import brute_force, two_norm_embeddings

needs_int8 = pytest.mark.skipif(not int8_screen.int8_product_runs(24, torch.device("cpu")),
                                reason="torch's int8 product does not run exactly on this CPU")


def screened_spans(monkeypatch) -> list:
    """Record what each OneQueryScreen.merge returns: True for a span the screen merged."""
    results = []
    merge = int8_screen.OneQueryScreen.merge
    monkeypatch.setattr(int8_screen.OneQueryScreen, "merge",
                        lambda self, *args: results.append(merge(self, *args)) or results[-1])
    return results


def exact_problem(score: str, rows: int, generator: torch.Generator):
    """(N, 24) rows whose every score is exact in float32, many of them tied: for cosine, rows
    of four entries +-1 (unit rows of +-0.5, which int8 holds exactly); for dot, multiples of
    1/8 in [-2, 2] (which it does not). Rows 1000 on repeat earlier ones."""
    if score == "cosine":
        corpus = two_norm_embeddings(rows, 24, generator)
    else:
        corpus = torch.randint(-16, 17, (rows, 24), generator=generator) / 8
    corpus[1000:] = corpus[torch.randint(0, 1000, (rows - 1000,), generator=generator)]
    return corpus


@needs_int8
@pytest.mark.parametrize("score", ["cosine", "dot"])
def test_one_query_through_the_int8_screen_finds_what_the_plain_search_finds(score, monkeypatch):
    # 20,000 rows: a first span of 4,032 rows in float32, then one of 15,968 through the screen.
    # Every score is exact, so the screened search must agree with the plain one bit for bit,
    # ties and the self-matches left out included.
    generator = torch.Generator().manual_seed(3)
    corpus = exact_problem(score, 20000, generator)
    merged = screened_spans(monkeypatch)
    prepared = prepare_corpus(corpus, score=score, screen=True)
    assert prepared.int8 is not None
    for row in (0, 5000, 19999):
        query = corpus[row : row + 1]
        ids = {"query_ids": [f"d{row}"], "corpus_ids": [f"d{i}" for i in range(corpus.shape[0])]}
        for k in (1, 10, 100):
            for kwargs in ({}, ids):
                scores, indices = search(query, prepared, k, **kwargs)
                plain_scores, plain_indices = search(query, corpus, k, score=score, fast=False, **kwargs)
                assert torch.equal(indices, plain_indices) and torch.equal(scores, plain_scores)
    assert any(merged), "no span went through the screen"


@needs_int8
@pytest.mark.parametrize("score", ["cosine", "dot"])
def test_random_embeddings_through_the_int8_screen_match_brute_force(score, monkeypatch, tmp_path):
    generator = torch.Generator().manual_seed(4)
    corpus = torch.randn(30000, 64, generator=generator)
    merged = screened_spans(monkeypatch)
    path = tmp_path / "corpus.safetensors"
    prepare_corpus(corpus, score=score).save(path)
    for prepared in (prepare_corpus(corpus, score=score, screen=True), load_corpus(path, screen=True)):
        assert prepared.int8 is not None
        for _ in range(5):
            query = torch.randn(1, 64, generator=generator)
            _, indices = search(query, prepared, 10)
            assert torch.equal(indices, brute_force(query, corpus, 10, score)[1])
    # Each search's first span finds its first k-th best in float32 (merge returns False there);
    # every later span must pass the screen.
    assert merged.count(False) == 10 and merged.count(True) >= 10, merged


@pytest.mark.parametrize("dim", [24, 384])
def test_int8_bound_holds(dim):
    # Every row's bound must lie above its float32 score as a search computes it (torch.mv, the
    # rescoring) and above its exact score; rows the screen cannot bound get +inf. The rows mix
    # ordinary ones with one large entry among small ones, rows of entries near 2^-30 and 2^50
    # (just inside and outside the range screened), a zero row, and rows int8 holds exactly.
    generator = torch.Generator().manual_seed(dim)
    rows = torch.randn(4000, dim, generator=generator)
    rows[:500] /= rows[:500].norm(dim=1, keepdim=True)
    rows[500:600, 0] = 1000.0
    rows[600:700] *= 2.0**-31
    rows[700:800] *= 2.0**-28
    rows[800:900] *= 2.0**48
    rows[900:1000] *= 2.0**52
    rows[1000] = 0
    rows[1001:1100] = torch.randint(-63, 64, (99, dim), generator=generator) / 8
    kept = int8_screen.int8_rows(rows)
    largest = rows.abs().amax(dim=1)
    outside = (largest < int8_screen.SMALLEST_ENTRY) | (largest > int8_screen.LARGEST_ENTRY)
    assert torch.isposinf(kept.error_norms[outside]).all() and torch.isfinite(kept.error_norms[~outside]).all()
    for query in (torch.randn(1, dim, generator=generator), rows[1001:1002], rows[:1] * 2.0**-20):
        screen = int8_screen.OneQueryScreen(query, kept, rows.shape[0])
        assert screen.usable()
        bounds = screen.upper_bounds(kept).double()
        float32_scores = torch.mv(rows, query[0]).double()
        exact = rows.double() @ query[0].double()
        finite = torch.isfinite(float32_scores)
        assert (~(bounds[finite] < float32_scores[finite])).all()  # NaN bounds keep a row in
        assert (~(bounds < exact)).all()


def test_the_int8_bound_is_close_enough_to_screen():
    # The bound is what makes the screen pay: for random unit rows and d = 384 it is about 3% of
    # |q| |c| (module docstring). If it were 10% or more, a one-query search of random data would
    # score a large part of the corpus on its own.
    generator = torch.Generator().manual_seed(1)
    rows = torch.randn(5000, 384, generator=generator)
    rows /= rows.norm(dim=1, keepdim=True)
    query = torch.randn(1, 384, generator=generator)
    query /= query.norm()
    kept = int8_screen.int8_rows(rows)
    screen = int8_screen.OneQueryScreen(query, kept, rows.shape[0])
    margin = screen.upper_bounds(kept).double() - rows.double() @ query[0].double()
    assert float(margin.max()) < 0.1


def test_queries_outside_the_screened_range_are_not_screened():
    kept = int8_screen.int8_rows(torch.randn(10, 8))
    for scale in (0.0, 2.0**-31, 2.0**51):
        assert not int8_screen.OneQueryScreen(torch.full((1, 8), scale), kept, 10).usable()


def test_an_int8_product_that_saturates_is_not_used(monkeypatch):
    # A kernel that shifts one side to unsigned bytes and adds four products in 16 bits saturates
    # on rows of 63 (4 · 191 · 63 > 32,767), the way the AVX2 kernel does on rows of 127 (module
    # docstring): emulated here, the probe must refuse it.
    def saturating(rows, column, out=None):
        shifted = (rows.long() + 128) * column[:, 0].long()  # (n, d)
        fours = shifted.unflatten(1, (-1, 4)).sum(2).clamp(-32768, 32767)  # (n, d / 4)
        return (fours.sum(1) - 128 * column[:, 0].long().sum()).int()[:, None]

    monkeypatch.setattr(torch, "_int_mm", saturating)
    int8_screen._int8_product_runs.cache_clear()
    try:
        assert not int8_screen.int8_product_runs(24, torch.device("cpu"))
    finally:
        int8_screen._int8_product_runs.cache_clear()


def test_which_corpora_keep_an_int8_copy():
    corpus = torch.randn(100, 24)
    assert prepare_corpus(corpus, screen=False).int8 is None
    assert prepare_corpus(corpus, score="euclidean", screen=True).int8 is None
    assert prepare_corpus(torch.randn(10, 5000), screen=True).int8 is None  # 5000 · 63² >= 2^24
    if int8_screen.int8_product_runs(24, torch.device("cpu")):
        assert prepare_corpus(corpus, score="dot", screen=True).int8 is not None
    # By default, where the int8 product is measured quicker than the float32 one.
    assert (prepare_corpus(corpus).int8 is not None) == int8_screen.int8_screen_pays(24)


@needs_int8
def test_one_query_that_cannot_be_screened_is_searched_in_float32(monkeypatch):
    merged = screened_spans(monkeypatch)
    corpus = torch.randn(20000, 24)
    prepared = prepare_corpus(corpus, score="dot", screen=True)
    query = torch.randn(1, 24) * 2.0**-40
    _, indices = search(query, prepared, 5)
    assert torch.equal(indices, brute_force(query, corpus, 5, "dot")[1])
    assert merged == []
