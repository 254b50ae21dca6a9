"""Tests for minisbert.search.search, its plain loop (minisbert/search/plain.py), its faster ways
(minisbert/search/fast/spans_blocks.py, chosen by minisbert/search/ways.py's WAYS), the inputs they share
(minisbert/search/inputs.py), and a prepared corpus saved and loaded.

"Correct" means: the same rows, in the same order, as brute force (the full score matrix in float64
and a stable sort, so equal scores go to the lower corpus index), whatever the chunk sizes, with
scores within float32 rounding of brute force's. Each check here runs once, on the way the search
chooses (or the plain loop, where that is what it checks): that every way, forced, returns the plain
loop's results bit for bit is one property, tested on hundreds of drawn cases in
tests/search/test_search_property.py. Memory is the one thing that test cannot see, so the memory bound
here is checked way by way.
"""

import dataclasses
import math
import re
import subprocess
import sys
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from minisbert.search import plain
from minisbert.search import ways as search_module
from minisbert.search.fast import device, int8_blocks, screen, span_product
from minisbert.common import machine
from minisbert.search.fast import spans_blocks as fast_retrieval
from minisbert.search import WAY_NAMES, load_corpus, prepare_corpus
from minisbert.search.inputs import SETTLE_PIECE, as_embedding_matrix, merge_top_k

from ..conftest import REPO
from ..tolerances import search_scores_apart

SCORES = ("cosine", "dot", "euclidean")


def search(*args, **kwargs):
    """minisbert.search.search; a test of a forced way that cannot run on its inputs here (the int8 blocks for
    euclidean, or where torch's int8 product is not exact) is skipped, naming why."""
    try:
        return search_module.search(*args, **kwargs)
    except ValueError as error:
        if "cannot run here" in str(error):
            pytest.skip(f"{kwargs.get('way')}: {error}")
        raise


def search_if_it_runs(*args, **kwargs):
    """minisbert.search.search, or None where the forced way cannot run on these inputs here (for a
    test that tries every way in turn)."""
    try:
        return search_module.search(*args, **kwargs)
    except ValueError as error:
        if "cannot run here" in str(error):
            return None
        raise


def exact_scores(queries, corpus, score):
    """(Q, N) every score in float64: distances for euclidean."""
    queries = torch.as_tensor(queries).double()
    corpus = torch.as_tensor(corpus).double()
    if score == "cosine":
        queries = queries / queries.norm(dim=1, keepdim=True)
        corpus = corpus / corpus.norm(dim=1, keepdim=True)
    if score == "euclidean":
        return (queries[:, None, :] - corpus[None, :, :]).pow(2).sum(-1).sqrt()  # (Q, N)
    return queries @ corpus.T  # (Q, N)


def brute_force(queries, corpus, k, score):
    """Reference: every score in float64, then a stable sort (ties -> lower index first)."""
    scores = exact_scores(queries, corpus, score)  # (Q, N)
    order = scores.argsort(dim=1, descending=score != "euclidean", stable=True)[:, :k]
    return scores.gather(1, order), order


def assert_within_rounding(scores, expected_scores, queries, corpus, indices, score, roundings=0):
    """Each float32 score lies within float32 rounding of brute force's exact one: the bound of
    tests/tolerances.py's search_scores_apart, entry by entry (relative to the magnitudes of the terms
    that made that score, since a score that cancels to near 0 keeps the rounding of those terms). It
    holds whatever order a CPU's or GPU's kernels add in. Measured on a 2-core Xeon, with its AVX-512 and
    AMX kernels and again with AVX2 ones (ATEN_CPU_CAPABILITY=avx2, MKL_ENABLE_INSTRUCTIONS=AVX2), every
    difference stays 16.8 times inside it or more (the closest: dot over 24 dimensions)."""
    difference = (torch.as_tensor(scores).double() - expected_scores).abs()  # (Q, k)
    bound = search_scores_apart(queries, corpus, indices, score, expected_scores, roundings)  # (Q, k)
    assert (difference <= bound).all(), f"{score}: off by up to {float((difference / bound).max()):.3g} bounds"


def assert_matches_brute_force(queries, corpus, k, score, **kwargs):
    scores, indices = search(queries, corpus, k, score=score, **kwargs)
    expected_scores, _ = brute_force(queries, corpus, k, score)
    assert_within_rounding(scores, expected_scores, queries, corpus, indices, score)
    # Two rows whose exact scores lie within float32 rounding of each other may round to one float32
    # score on one CPU's kernels and to two on another's (measured: with SSE kernels, two distances
    # 1.2e-8 apart came out equal, and the tie rule put the lower row first), so their order is not
    # fixed by the arithmetic. Every returned row must be a different row whose own exact score is
    # within that rounding of brute force's at its place; where no such near-tie exists, that
    # leaves brute force's row only.
    assert all(len(set(row)) == len(row) for row in indices.tolist())
    own_exact = exact_scores(queries, corpus, score).gather(1, indices)  # (Q, k)
    assert_within_rounding(own_exact, expected_scores, queries, corpus, indices, score)


# A square root rounds once: IEEE 754 rounds it correctly, to within u = 2^-24 = 6.0e-8 of the root
# (float64's root is off by 1.1e-16), so a distance whose squared distance is exact in float32 is off by
# at most that much of itself. SQRT_RTOL is 17 times u; measured up to 5.9e-8.
SQRT_RTOL = 1e-6


def assert_exact_scores(scores, expected_scores, score):
    """For problems whose every score (every squared distance, for euclidean) is exact in float32: the
    scores are brute force's, but for the one rounding of a distance's square root."""
    torch.testing.assert_close(scores.double(), expected_scores, rtol=SQRT_RTOL if score == "euclidean" else 0,
                               atol=0)


def integer_embeddings(rows, dim, generator):
    """Small integers: every dot product and squared distance is exact in float32, so the
    float32 search and the float64 reference see exactly the same ties."""
    return torch.randint(-2, 3, (rows, dim), generator=generator).float()


def two_norm_embeddings(rows, dim, generator):
    """Four entries of +-1, the rest 0: |v| = 2 exactly, so normalised entries are +-0.5 and
    cosine scores are exact multiples of 0.25 in float32 (many exact ties)."""
    vectors = torch.zeros(rows, dim)
    for row in range(rows):
        positions = torch.randperm(dim, generator=generator)[:4]
        signs = torch.randint(0, 2, (4,), generator=generator).float() * 2 - 1
        vectors[row, positions] = signs
    return vectors


# ---- worked examples -----------------------------------------------------------------------


def test_worked_example_each_score():
    queries = torch.tensor([[1.0, 0.0]])
    corpus = torch.tensor([[3.0, 4.0], [2.0, 0.0], [0.0, -1.0]])
    # Exact: the norms (5, 2, 1) and the sums are exact in float32, and a division and a square root
    # round once, correctly (IEEE 754), to the float32 nearest 3/5, sqrt(2) and sqrt(20).
    # cosine: (3*1 + 4*0) / 5 = 0.6;  2 / 2 = 1.0;  0 / 1 = 0.0  -> rows 1, 0, 2
    scores, indices = search(queries, corpus, 3, score="cosine")
    assert indices.tolist() == [[1, 0, 2]]
    torch.testing.assert_close(scores, torch.tensor([[1.0, 0.6, 0.0]]), rtol=0, atol=0)
    # dot: 3, 2, 0 -> rows 0, 1, 2
    scores, indices = search(queries, corpus, 3, score="dot")
    assert indices.tolist() == [[0, 1, 2]]
    torch.testing.assert_close(scores, torch.tensor([[3.0, 2.0, 0.0]]), rtol=0, atol=0)
    # euclidean: |(1,0)-(3,4)| = sqrt(4+16) = 4.472;  |(1,0)-(2,0)| = 1;  |(1,0)-(0,-1)| = sqrt(2)
    scores, indices = search(queries, corpus, 3, score="euclidean")
    assert indices.tolist() == [[1, 2, 0]]
    torch.testing.assert_close(scores, torch.tensor([[1.0, 2.0**0.5, 20.0**0.5]]), rtol=0, atol=0)


# ---- agreement with brute force ------------------------------------------------------------


# (k, query_chunk_size, corpus_chunk_size) for the random tests' 23 queries over 101 rows.
AWKWARD_CHUNKINGS = [
    (7, 5, 17),  # chunk sizes divide neither Q = 23 nor N = 101
    (1, 5, 17),  # k = 1
    (30, 4, 17),  # k larger than a corpus chunk
    (7, 1, 1),  # one query against one document at a time
]


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize(
    "k, query_chunk_size, corpus_chunk_size",
    AWKWARD_CHUNKINGS + [
        (101, 23, 101),  # k = N, one block
        (7, 1024, 8192),  # the CPU defaults: a single block here
    ],
)
def test_random_matches_brute_force(score, k, query_chunk_size, corpus_chunk_size):
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(23, 16, generator=generator)
    corpus = torch.randn(101, 16, generator=generator)
    assert_matches_brute_force(
        queries, corpus, k, score, query_chunk_size=query_chunk_size,
        corpus_chunk_size=corpus_chunk_size,
    )


@pytest.mark.parametrize("score", SCORES)
def test_k_larger_than_corpus_returns_whole_corpus_ranked(score):
    generator = torch.Generator().manual_seed(1)
    queries = torch.randn(6, 8, generator=generator)
    corpus = torch.randn(11, 8, generator=generator)
    chunks = {"query_chunk_size": 5, "corpus_chunk_size": 4}
    scores, indices = search(queries, corpus, 50, score=score, **chunks)
    assert scores.shape == indices.shape == (6, 11)
    assert all(sorted(row) == list(range(11)) for row in indices.tolist())
    assert_matches_brute_force(queries, corpus, 50, score, **chunks)


def tied_problem(score, generator, num_docs=60):
    """Corpus rows drawn from 7 distinct vectors: every score is shared by many rows, spread over
    several chunks, and is exact in float32 (see integer_embeddings, two_norm_embeddings)."""
    make = two_norm_embeddings if score == "cosine" else integer_embeddings
    distinct = make(7, 8, generator)
    corpus = distinct[torch.randint(0, 7, (num_docs,), generator=generator)]
    return make(13, 8, generator), corpus


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("k", [1, 4, 20, 200])
@pytest.mark.parametrize("chunk_sizes", [(5, 17), (3, 4), (64, 64)])
def test_ties_go_to_lower_index_across_chunks(score, k, chunk_sizes):
    queries, corpus = tied_problem(score, torch.Generator().manual_seed(2))
    query_chunk_size, corpus_chunk_size = chunk_sizes
    scores, indices = search(
        queries, corpus, k, score=score, query_chunk_size=query_chunk_size,
        corpus_chunk_size=corpus_chunk_size,
    )
    expected_scores, expected_indices = brute_force(queries, corpus, k, score)
    assert torch.equal(indices, expected_indices)
    assert_exact_scores(scores, expected_scores, score)


def test_all_equal_scores_return_first_rows_in_order():
    corpus = torch.ones(50, 4)
    scores, indices = search(torch.ones(3, 4), corpus, 10, score="dot", corpus_chunk_size=7)
    assert indices.tolist() == [list(range(10))] * 3
    assert torch.all(scores == 4.0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("score", SCORES)
def test_half_precision_corpus_scored_in_float32(dtype, score):
    generator = torch.Generator().manual_seed(3)
    queries = torch.randn(9, 32, generator=generator)
    corpus = torch.randn(70, 32, generator=generator).to(dtype)
    scores, indices = search(
        queries, corpus, 5, score=score, query_chunk_size=4, corpus_chunk_size=17,
    )
    assert scores.dtype == torch.float32
    # The reference sees the same half-precision values, upcast.
    expected_scores, expected_indices = brute_force(queries, corpus.float(), 5, score)
    assert torch.equal(indices, expected_indices)
    assert_within_rounding(scores, expected_scores, queries, corpus, indices, score)


def test_numpy_in_numpy_out_torch_otherwise():
    generator = np.random.default_rng(4)
    queries = generator.standard_normal((5, 8)).astype(np.float32)
    corpus = generator.standard_normal((20, 8)).astype(np.float32)
    scores, indices = search(queries, corpus, 3)
    assert isinstance(scores, np.ndarray) and isinstance(indices, np.ndarray)
    assert scores.dtype == np.float32 and indices.dtype == np.int64
    torch_scores, torch_indices = search(torch.from_numpy(queries), corpus, 3)
    assert isinstance(torch_scores, torch.Tensor)
    np.testing.assert_array_equal(torch_indices.numpy(), indices)
    np.testing.assert_array_equal(torch_scores.numpy(), scores)  # the same rows through the same kernels


@pytest.mark.parametrize("score", SCORES)
def test_embeddings_that_require_grad_are_searched_as_their_values(score):
    # A model's outputs taken outside torch.no_grad() require grad. The search is not differentiable
    # (its scores are computed again in float64 and its indices are picked), so it searches their
    # values: the same bits as detached inputs, and no graph in what comes back or in a prepared corpus.
    generator = torch.Generator().manual_seed(5)
    queries = torch.randn(6, 16, generator=generator).requires_grad_()
    corpus = torch.randn(90, 16, generator=generator).requires_grad_()
    scores, indices = search(queries, corpus, 4, score=score, query_chunk_size=4, corpus_chunk_size=32)
    expected = search(queries.detach(), corpus.detach(), 4, score=score, query_chunk_size=4, corpus_chunk_size=32)
    assert torch.equal(scores, expected[0]) and torch.equal(indices, expected[1])
    assert not scores.requires_grad
    prepared = prepare_corpus(corpus, score)
    assert not prepared.rows.requires_grad and not prepared.norms.requires_grad
    assert not search(queries, prepared, 4)[0].requires_grad


def test_empty_query_set_gives_empty_results():
    scores, indices = search(torch.zeros(0, 4), torch.randn(10, 4), 3)
    assert scores.shape == indices.shape == (0, 3)


# ---- self-matches across chunks, and choosing a way ---------------------------------------


SELF_ROWS = [0, 7, 151, 160, 170, 200, 202]  # corpus rows that are also ids_problem's last 7 queries


def ids_problem(score, generator):
    """203 corpus rows, 47 queries, 7 of them corpus rows whose self-match is excluded; rows
    150 on repeat earlier ones (ties). Every score is exact in float32 (see tied_problem)."""
    if score == "cosine":
        corpus, queries = two_norm_embeddings(203, 24, generator), two_norm_embeddings(40, 24, generator)
    else:
        corpus = torch.randint(-16, 17, (203, 24), generator=generator) / 8
        queries = torch.randint(-16, 17, (40, 24), generator=generator) / 8
    corpus[150:] = corpus[torch.randint(0, 150, (53,), generator=generator)]
    queries = torch.cat([queries, corpus[SELF_ROWS]])
    ids = {
        "query_ids": [f"q{i}" for i in range(40)] + [f"d{i}" for i in SELF_ROWS],
        "corpus_ids": [f"d{i}" for i in range(203)],
    }
    return queries, corpus, ids


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("chunk_sizes", [(5, 17), (17, 5), (64, 1000)])
def test_the_plain_loop_leaves_out_self_matches_across_chunks(score, chunk_sizes):
    # 203 rows and 47 queries, so neither chunk size divides N or Q. Rows 150 on repeat earlier
    # rows (ties within and across chunks), and 7 queries are corpus rows whose self-match is
    # dropped. The entries are multiples of 1/8 (cosine: see two_norm_embeddings), so every score
    # is exact in float32 whatever the order of the sums: the rows are brute force's exactly.
    queries, corpus, ids = ids_problem(score, torch.Generator().manual_seed(12))
    query_chunk_size, corpus_chunk_size = chunk_sizes
    chunks = {"query_chunk_size": query_chunk_size, "corpus_chunk_size": corpus_chunk_size}
    _, plain_indices = search(queries, corpus, 12, score=score, **chunks, **ids, way="plain")
    assert torch.equal(plain_indices, brute_force_without_self(queries, corpus, 12, score, SELF_ROWS))


def brute_force_without_self(queries, corpus, k, score, self_rows):
    """brute_force's indices, dropping query 40 + i's own row self_rows[i]."""
    _, order = brute_force(queries, corpus, corpus.shape[0], score)
    expected = []
    for query, row in enumerate(order.tolist()):
        own = self_rows[query - 40] if query >= 40 else None
        expected.append([i for i in row if i != own][:k])
    return torch.tensor(expected)


def test_off_a_cpu_the_device_way_is_chosen():
    # choose_way reads the device's type alone, so the choice is checked here without a GPU.
    inputs = search_module.check_inputs(torch.randn(3, 8), torch.randn(50, 8), 2, None, 1024, None, None)
    assert search_module.choose_way(inputs) != "device"
    for kind in ("cuda", "mps"):
        assert search_module.choose_way(replace(inputs, device=torch.device(kind))) == "device"


def test_a_corpus_chunk_size_given_bounds_the_device_way_s_blocks_even_at_the_default(monkeypatch):
    # Left out, the device way scores blocks of up to DEVICE_BLOCK_ENTRIES scores (here one block of
    # all 20,000 rows); given, even equal to the default 8,192, it is the caller's bound on memory.
    sizes, block = [], device._RowsAsGiven.block
    monkeypatch.setattr(device._RowsAsGiven, "block",
                        lambda screen, queries, rows, start, size: sizes.append(size) or block(screen, queries, rows,
                                                                                           start, size))
    queries, corpus = torch.randn(3, 8), torch.randn(20_000, 8)
    expected = search_module.search(queries, corpus, 5, way="plain")
    for given, blocks in ((None, [20_000]), (search_module.DEFAULT_CORPUS_CHUNK_SIZE, [8192, 8192, 3616])):
        sizes.clear()
        values, indices = search_module.search(queries, corpus, 5, way="device", corpus_chunk_size=given)
        assert sizes == blocks
        assert torch.equal(values, expected[0]) and torch.equal(indices, expected[1])


def test_an_unknown_way_is_named_and_a_way_that_cannot_run_is_refused():
    with pytest.raises(ValueError, match="unknown search way 'fastest'; choose one of"):
        search_module.search(torch.randn(3, 4), torch.randn(10, 4), 2, way="fastest")
    with pytest.raises(ValueError, match="the search way 'spans, int8' cannot run here"):
        search_module.search(torch.randn(1, 4), torch.randn(10, 4), 2, way="spans, int8")  # no prepared copy


def test_each_search_says_the_way_it_took_and_what_it_was_chosen_by():
    # One record per search, on the "minisbert.search" logger: the way, forced or chosen, the ways
    # of WAYS passed over before it and why, and the facts about the inputs the table read. The
    # search's checked inputs are never changed after the checks: ids that ask for more results
    # make a new SearchInputs.
    queries, corpus = torch.randn(3, 8), torch.randn(500, 8, dtype=torch.float64)
    ids = {"query_ids": ["d1", "q", "q"], "corpus_ids": [f"d{row}" for row in range(500)]}
    with search_module.recorded_ways() as choices:
        search_module.search(queries, corpus, 5, score="dot", **ids)
        search_module.search(queries, prepare_corpus(corpus, screen=False), 5, way="plain")
    chosen, forced = choices
    checked = search_module.check_inputs(queries, corpus, 5, "dot", 1024, None, None)
    assert chosen.name == search_module.choose_way(checked) and not chosen.forced
    assert [name for name, _ in chosen.passed_over] == list(WAY_NAMES[: WAY_NAMES.index(chosen.name)])
    assert {why for _, why in chosen.passed_over} <= {"not taken", "cannot run"}
    assert chosen.facts == "3 queries, 500 rows of d = 8, dot, rows as given (float64), on cpu"
    assert str(chosen).startswith(f"way {chosen.name!r} (chosen; passed over: plain (not taken), ")
    assert str(chosen).endswith(f") for {chosen.facts}")
    assert str(forced) == "way 'plain' (forced) for 3 queries, 500 rows of d = 8, cosine, a prepared corpus, on cpu"
    with pytest.raises(dataclasses.FrozenInstanceError):
        checked.k = 10


def test_a_search_returns_the_way_it_took_as_a_value_and_a_prepared_corpus_shows_its_copies():
    # return_way=True gives the WayChoice the logger records (the way, forced or chosen, and how many
    # queries fell back), beside the very scores and rows of the same call without it; a prepared
    # corpus's repr says what it holds and which screening copies it keeps, never its numbers.
    generator = torch.Generator().manual_seed(11)
    queries, corpus = torch.randn(5, 16, generator=generator), torch.randn(3000, 16, generator=generator)
    for target, way in ((corpus, None), (corpus, "blocks"), (prepare_corpus(corpus, screen=True), None),
                        (prepare_corpus(corpus, "dot", screen=False), "plain")):
        with search_module.recorded_ways() as logged:
            scores, rows = search_module.search(queries, target, 7, way=way)
            *answer, choice = search_module.search(queries, target, 7, way=way, return_way=True)
        assert torch.equal(answer[0], scores) and torch.equal(answer[1], rows)
        assert choice == logged[1] and choice.forced == (way is not None) and choice.fell_back == 0
        checked = search_module.check_inputs(queries, target, 7, None, 1024, None, None)
        assert choice.name == (way or search_module.choose_way(checked))
    # A prepared corpus is one object: compared by identity (its tensors have no single truth value) and
    # usable as a key, as a user keeps corpora by what they prepared.
    first, again = prepare_corpus(corpus, screen=False), prepare_corpus(corpus, screen=False)
    assert first == first and first != again and {first: "a", again: "b"}[first] == "a"
    for prepared in (prepare_corpus(corpus, screen=True), prepare_corpus(corpus, "euclidean", screen=False)):
        shown = repr(prepared)
        assert shown.startswith(f"PreparedCorpus(3,000 rows of d = 16, score={prepared.score!r}, on cpu, ")
        assert shown.endswith("screening copies: int8)" if prepared.int8_copy is not None else "screening copies: none)")


def test_a_removed_argument_is_named_with_what_replaces_it():
    with pytest.raises(ValueError, match=r"search\(\) no longer takes fast=: way='plain' runs the plain loop"):
        search_module.search(torch.randn(3, 4), torch.randn(10, 4), 2, fast=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'chunk_size'"):
        search_module.search(torch.randn(3, 4), torch.randn(10, 4), 2, chunk_size=5)


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_every_way_leaves_torchs_precision_as_set_and_widens_its_bound_instead(monkeypatch, precision):
    """TF32 or bfloat16 products (torch.set_float32_matmul_precision "high" or "medium": GPUs, and
    oneDNN on CPUs that have them) round each input first. The search never changes the setting, not
    even for the length of a call: it reads it (`product_unit`), widens the bound that decides which
    rows are rescored (search/bounds.py, E_p), says so in the facts it logs, and every way returns the
    bits it returns at "highest"."""
    seen = []

    def recorded(run):
        def wrapper(inputs):
            seen.append((torch.get_float32_matmul_precision(), inputs.product_unit))
            return run(inputs)
        return wrapper

    generator = torch.Generator().manual_seed(3)
    queries, corpus = torch.randn(5, 16, generator=generator), torch.randn(300, 16, generator=generator)
    expected = {way: search_module.search(queries, corpus, 4, way=way) for way in ("plain", "device", None)}
    monkeypatch.setattr(search_module, "WAYS", tuple((name, can, taken, recorded(run))
                                                     for name, can, taken, run in search_module.WAYS))
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        for way, (scores, indices) in expected.items():
            with search_module.recorded_ways() as choices:
                got_scores, got_indices = search_module.search(queries, corpus, 4, way=way)
            assert torch.equal(got_indices, indices) and torch.equal(got_scores, scores), way
            assert "products of inputs rounded by 2^" in str(choices[-1]), choices[-1]
            assert torch.get_float32_matmul_precision() == precision
    finally:
        torch.set_float32_matmul_precision(before)
    unit = {"high": 2.0**-11, "medium": 2.0**-8}[precision]
    assert seen == [(precision, unit)] * 3


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_the_plain_search_called_alone_reads_torchs_precision_too(monkeypatch, precision):
    """minisbert/search/plain.py's `search`, which a reader may call without minisbert.search, leaves the
    setting as it is too, also when a corpus chunk is refused, and widens its bound instead (every
    block's candidates are taken within E + E_p of the k-th best)."""
    seen = []
    bounds = plain.Bounds

    def recorded(*args, **kwargs):
        seen.append((torch.get_float32_matmul_precision(), kwargs.get("unit")))
        return bounds(*args, **kwargs)

    monkeypatch.setattr(plain, "Bounds", recorded)
    generator = torch.Generator().manual_seed(3)
    queries, corpus = torch.randn(5, 16, generator=generator), torch.randn(300, 16, generator=generator)
    expected = plain.search(queries, corpus, 4, corpus_chunk_size=100)
    seen.clear()
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        scores, indices = plain.search(queries, corpus, 4, corpus_chunk_size=100)
        assert torch.equal(scores, expected[0]) and torch.equal(indices, expected[1])
        assert torch.get_float32_matmul_precision() == precision
        corpus[250, 3] = float("nan")  # the third chunk is refused while the loop runs
        with pytest.raises(ValueError, match="corpus row 250 contains NaN"):
            plain.search(queries, corpus, 4, corpus_chunk_size=100)
        assert torch.get_float32_matmul_precision() == precision
    finally:
        torch.set_float32_matmul_precision(before)
    assert seen == [(precision, {"high": 2.0**-11, "medium": 2.0**-8}[precision])] * 5


# ---- the plain search of minisbert/search/plain.py, read alone ---------------------------------


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("k, query_chunk_size, corpus_chunk_size", AWKWARD_CHUNKINGS)
def test_the_plain_search_matches_brute_force_and_the_library_search(score, k, query_chunk_size,
                                                                     corpus_chunk_size):
    generator = torch.Generator().manual_seed(0)
    queries, corpus = torch.randn(23, 16, generator=generator), torch.randn(101, 16, generator=generator)
    chunks = {"query_chunk_size": query_chunk_size, "corpus_chunk_size": corpus_chunk_size}
    scores, indices = plain.search(queries, corpus, k, score=score, **chunks)
    expected_scores, expected_indices = brute_force(queries, corpus, k, score)
    assert torch.equal(indices, expected_indices)
    assert_within_rounding(scores, expected_scores, queries, corpus, indices, score)
    # On embeddings of ordinary size it is the library's plain path, bit for bit: the same loop.
    library_scores, library_indices = search(queries, corpus, k, score=score, way="plain", **chunks)
    assert torch.equal(scores, library_scores) and torch.equal(indices, library_indices)


def test_the_plain_loop_bounds_each_block_for_the_rows_dimension(monkeypatch):
    """Every block's Bounds is made for d, the terms a score adds, whatever the block's row count (the
    block's two sizes are easily swapped). Checked where it is made: an answer cannot show it, as the
    bound of section 1 holds with room to spare on what kernels do (rows of d = 384 built to cancel,
    with float32 errors of about 0.01, still lay inside the bound for d = 2, about 0.14)."""
    made = []

    class Recorded(plain.Bounds):
        def __init__(self, score, query_norms, largest_norm, dim, **options):
            made.append(dim)
            super().__init__(score, query_norms, largest_norm, dim, **options)

    monkeypatch.setattr(plain, "Bounds", Recorded)
    for score in ("cosine", "dot", "euclidean"):
        plain.search(torch.randn(3, 24), torch.randn(50, 24), 5, score=score, corpus_chunk_size=7)  # blocks of 7 and 1
    assert len(made) == 3 * 8 and set(made) == {24}


@pytest.mark.parametrize("score", SCORES)
def test_the_plain_search_gives_ties_to_the_lower_index_across_chunks(score):
    queries, corpus = tied_problem(score, torch.Generator().manual_seed(5))
    _, indices = plain.search(queries, corpus, 9, score=score, query_chunk_size=5, corpus_chunk_size=17)
    assert torch.equal(indices, brute_force(queries, corpus, 9, score)[1])


def test_the_plain_search_returns_numpy_for_numpy():
    corpus = np.array([[3.0, 4.0], [2.0, 0.0], [0.0, -1.0]], dtype=np.float32)
    scores, indices = plain.search(corpus[1:2], corpus, 3, score="dot")
    assert isinstance(scores, np.ndarray) and indices.tolist() == [[0, 1, 2]]
    assert scores.tolist() == [[6.0, 4.0, 0.0]]


@pytest.mark.parametrize(
    "queries, corpus, message",
    [
        (torch.randn(4), torch.randn(10, 4), "queries must be a 2-D"),
        (torch.randn(3, 4), torch.ones(10, 4, dtype=torch.long), "corpus must be a 2-D .* floating-point matrix, got shape .10, 4. torch.int64"),
        (torch.randn(3, 4), torch.randn(10, 5), "queries have dimension 4 but corpus has dimension 5"),
        (torch.randn(3, 4), torch.zeros(0, 4), "corpus is empty"),
        (torch.tensor([[1.0, float("nan"), 0.0, 0.0]]), torch.randn(10, 4), "queries row 0 contains NaN or inf"),
        (torch.randn(3, 4), torch.randn(10, 4).index_fill_(0, torch.tensor([7]), float("inf")),
         "corpus row 7 contains NaN or inf"),
    ],
)
def test_the_plain_search_names_what_is_wrong(queries, corpus, message):
    with pytest.raises(ValueError, match=message):
        plain.search(queries, corpus, 2, corpus_chunk_size=5)  # row 7 is in the second chunk


def test_the_plain_search_reads_alone():
    """search/plain.py and the checks it reads (search/inputs.py) import nothing from fast/, and fast/
    never imports the plain loop it speeds up."""
    show = "import importlib, sys; importlib.import_module(sys.argv[1]); print(*sorted(sys.modules))"
    for module in ("minisbert.search.plain", "minisbert.search.inputs", "minisbert.search.fast.spans_blocks",
                   "minisbert.search.fast.device"):
        loaded = subprocess.run([sys.executable, "-c", show, module], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.split()
        if "fast" in module.split("."):
            assert "minisbert.search.plain" not in loaded
        else:
            assert not [name for name in loaded if name.startswith("minisbert") and "fast" in name.split(".")], module


# ---- merging top-k lists -------------------------------------------------------------------


def test_merge_top_k_orders_by_score_then_index():
    # Query 0: the two lists share the score 0.5 and neither holds only lower indices.
    # Query 1: padding (-1, -inf) goes after every real entry.
    scores = torch.tensor([[0.75, 0.5, 0.125], [0.625, -torch.inf, -torch.inf]])
    indices = torch.tensor([[4, 8, 2], [3, -1, -1]])
    other_scores = torch.tensor([[0.5, 0.5], [0.25, -torch.inf]])
    other_indices = torch.tensor([[6, 9], [11, -1]])
    merged_scores, merged_indices = merge_top_k(scores, indices, other_scores, other_indices, 4)
    assert merged_indices.tolist() == [[4, 6, 8, 9], [3, 11, -1, -1]]
    assert merged_scores.tolist() == [[0.75, 0.5, 0.5, 0.5], [0.625, 0.25, -torch.inf, -torch.inf]]
    # Distances: smaller is better, padding is +inf.
    distances = torch.tensor([[1.0, 2.0, torch.inf]])
    other_distances = torch.tensor([[2.0, 0.5]])
    merged, merged_indices = merge_top_k(
        distances, torch.tensor([[7, 5, -1]]), other_distances, torch.tensor([[3, 9]]), 5, largest=False
    )
    assert merged_indices.tolist() == [[9, 7, 3, 5, -1]]
    assert merged.tolist() == [[0.5, 1.0, 2.0, 2.0, torch.inf]]


@pytest.mark.parametrize("score", SCORES)
def test_merging_shard_results_equals_searching_the_whole_corpus(score):
    # Search three shards of the corpus on their own, make their indices global and merge them,
    # in an order that puts higher indices first: the result is the search of the whole corpus.
    queries, corpus = tied_problem(score, torch.Generator().manual_seed(13), num_docs=90)
    k = 15
    expected = search(queries, corpus, k, score=score)
    shards = [(60, 90), (0, 25), (25, 60)]
    merged_scores, merged_indices = None, None
    for start, end in shards:
        shard_scores, shard_indices = search(queries, corpus[start:end], k, score=score)
        shard_indices = shard_indices + start
        if merged_scores is None:
            merged_scores, merged_indices = shard_scores, shard_indices
        else:
            merged_scores, merged_indices = merge_top_k(
                merged_scores, merged_indices, shard_scores, shard_indices, k,
                largest=score != "euclidean",
            )
    assert torch.equal(merged_indices, expected[1])
    # tied_problem's scores are exact in float32, and each distance the same rounded root: the same bits.
    assert torch.equal(merged_scores, expected[0])


# ---- screening many queries (int8 blocks) ---------------------------------------------------------


def count_calls(monkeypatch, owner, name):
    """Replace owner.name by a wrapper that counts its calls; return the list of results."""
    results = []
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        results.append(original(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(owner, name, counted)
    return results


@pytest.mark.parametrize("score", ["cosine", "dot"])
def test_screening_skips_most_float32_blocks_and_matches_brute_force(score, monkeypatch):
    generator = torch.Generator().manual_seed(10)
    queries = torch.randn(100, 128, generator=generator)
    queries /= torch.linalg.vector_norm(queries, dim=1, keepdim=True)
    corpus = torch.randn(40_960, 128, generator=generator)
    corpus *= (0.5 + torch.rand(40_960, 1, generator=generator) / 2) / torch.linalg.vector_norm(
        corpus, dim=1, keepdim=True
    )  # norms between 0.5 and 1
    float32_blocks = count_calls(monkeypatch, fast_retrieval, "_block_candidates")
    screens = count_calls(monkeypatch, screen.Screen, "candidates")  # one call a chunk
    assert_matches_brute_force(queries, corpus, 10, score, corpus_chunk_size=4_096, way="blocks, int8")
    # Of 10 chunks (of 4,096 rows: 64 groups, so that a query's 10 best give a floor that the int8
    # bound can screen against at d = 128), the first is screened against a floor made from its own
    # block (the best entries of each query's 10 best groups, scored in float32); a second can fail
    # to screen (its k-th best is still low) and make the third wait. The others are screened.
    assert screens[0] is not None
    assert len(float32_blocks) <= 2


def test_crowded_scores_fall_back_to_float32_blocks_and_back_off(monkeypatch):
    # Every score is equal, so nothing can be ruled out.
    screens = count_calls(monkeypatch, int8_blocks.Int8Blocks, "candidates")
    float32_blocks = count_calls(monkeypatch, fast_retrieval, "_block_candidates")
    num_queries = 129
    scores, indices = search(torch.ones(num_queries, 4), torch.ones(800, 4), 5, corpus_chunk_size=100,
                             way="blocks, int8")
    assert indices.tolist() == [[0, 1, 2, 3, 4]] * num_queries
    # Screens are tried on chunk 0 (against a floor made from its own block; failing there costs no
    # wait), then on chunks 1, 3 and 7, each failure doubling the wait before the next. Every chunk
    # is scored in float32: chunk 0 gives its own top k (nothing is kept yet), the others are filtered.
    assert screens == [None, None, None, None]
    assert len(float32_blocks) == 7


def test_fast_path_leaves_the_thread_count_as_it_was():
    # The fast path filters each block on one thread and sets the count back, also when a
    # corpus row in a later chunk is refused midway.
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        corpus = torch.randn(300, 8)
        for way in ("spans", "blocks"):
            search(torch.randn(5, 8), corpus, 3, corpus_chunk_size=64, way=way)
            assert torch.get_num_threads() == 2
        corpus[250, 0] = float("nan")
        for way in ("spans", "blocks"):
            with pytest.raises(ValueError, match="corpus row 250"):
                search(torch.randn(5, 8), corpus, 3, corpus_chunk_size=64, way=way)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


# ---- rows at the edges of float32 ----------------------------------------------------------


def test_tiny_rows_have_true_cosines():
    # Squares of entries near 1e-30 underflow in float32; the norm must not come out as zero.
    generator = torch.Generator().manual_seed(11)
    queries = torch.randn(5, 8, generator=generator)
    corpus = torch.randn(300, 8, generator=generator)
    scaled = corpus * torch.where(torch.arange(300) % 2 == 0, 1e-30, 1.0)[:, None]
    scores, indices = search(queries * 1e-30, scaled, 7, corpus_chunk_size=64)
    expected_scores, expected_indices = brute_force(queries, corpus, 7, "cosine")
    assert torch.equal(indices, expected_indices)
    # Two roundings more than brute force's rows see: each row's scaling by 1e-30, and its unit row
    # (similarity.unit_rows, whose float64 norms neither underflow nor overflow).
    assert_within_rounding(scores, expected_scores, queries, corpus, indices, "cosine", roundings=2)


def test_rows_whose_squares_are_flushed_to_zero_have_true_cosines_in_every_way():
    # After torch.set_flush_denormal(True) x86 kernels flush results below 2^-126 to zero, squares
    # among them: a row (2^-59, 2^-64, ..., 2^-64) of d = 384 has a float32 norm of 2^-59 where its
    # norm is 1.17 times that, so its float32 cosine 0.8 comes out 0.94. Another row at cosine 0.9
    # is the true top 1: a way that trusted the float32 norm would screen it out below the first.
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormal numbers to zero")
    try:
        dim = 384
        tiny = torch.full((dim,), 2.0**-64, dtype=torch.float64)
        tiny[0] = 2.0**-59
        unit = tiny / tiny.norm()
        across = torch.zeros(dim, dtype=torch.float64)
        across[1] = 1.0
        across -= (across @ unit) * unit
        query = 0.8 * unit + 0.6 * across / across.norm()  # unit: cos(query, tiny) = 0.8
        other = torch.zeros(dim, dtype=torch.float64)
        other[2] = 1.0
        other -= (other @ query) * query
        best = 3.0 * (0.9 * query + math.sqrt(1 - 0.81) * other / other.norm())  # cos(query, best) = 0.9
        corpus = torch.stack([tiny, best]).float()
        if float(torch.linalg.vector_norm(corpus, dim=1)[0]) != 2.0**-59:  # as the ways measure a span's rows
            pytest.skip("torch's norm kernel here does not flush these squares: nothing to show")
        for way in WAY_NAMES:
            answer = search_if_it_runs(query.float()[None], corpus, 1, way=way)
            if answer is None:
                continue
            scores, indices = answer
            assert indices.tolist() == [[1]], way
            assert abs(float(scores[0, 0]) - 0.9) < 1e-6, way  # float32's rounding of the cosines
    finally:
        torch.set_flush_denormal(False)


@pytest.mark.parametrize("score", SCORES)
def test_rows_too_long_to_measure_in_float32_are_multiplied_once_and_answered_as_the_plain_loop(score, monkeypatch):
    # Past RAW_DIMS entries a float32 norm is no longer within the 2^-10 the bounds allow (search/bounds.py),
    # so such rows as given go to the plain search's checks: before any product, not after a float32 one
    # that is then thrown away (a span's rows were multiplied twice).
    from minisbert.search.bounds import RAW_DIMS
    generator = torch.Generator().manual_seed(15)
    corpus, queries = torch.randn(150, RAW_DIMS, generator=generator), torch.randn(2, RAW_DIMS, generator=generator)
    expected = search_module.search(queries, corpus, 5, score=score, way="plain")
    multiplied = []
    product = span_product.SpanProduct.__call__
    monkeypatch.setattr(span_product.SpanProduct, "__call__",
                        lambda self, rows, block: (multiplied.append(rows.shape[0]), product(self, rows, block)))
    for way in ("one span", "spans"):
        multiplied.clear()
        answer = search_module.search(queries, corpus, 5, score=score, way=way)
        assert all(torch.equal(a, b) for a, b in zip(answer, expected)), way
        assert sum(multiplied) == corpus.shape[0], (way, multiplied)


def test_huge_rows_have_true_cosines():
    # Squares of entries near 1e30 overflow in float32 (the norm of such a 384-long row would come
    # out as inf, and every cosine as 0); the rows are finite, so their cosines are well defined.
    generator = torch.Generator().manual_seed(14)
    queries = torch.randn(6, 384, generator=generator)
    corpus = torch.randn(200, 384, generator=generator)
    huge_queries = queries * torch.tensor([1e30, 1.0, 1e30, 1e-30, 1e30, 1.0])[:, None]
    huge_corpus = corpus * torch.where(torch.arange(200) % 3 == 0, 1e30, 1.0)[:, None]
    scores, indices = search(huge_queries, huge_corpus, 9, corpus_chunk_size=64)
    expected_scores, expected_indices = brute_force(queries, corpus, 9, "cosine")
    assert torch.equal(indices, expected_indices)
    # Two roundings more, as in test_tiny_rows_have_true_cosines.
    assert_within_rounding(scores, expected_scores, queries, corpus, indices, "cosine", roundings=2)


def test_huge_query_rows_with_dot_scores_in_range_are_exact():
    # Entries of 1e30 in 384 dims: finite, with a norm (2e31) that fits float32; against rows of
    # norm about 20 every dot product fits too, so the ranking is the true one.
    generator = torch.Generator().manual_seed(15)
    queries = torch.randn(4, 384, generator=generator) * torch.tensor([1e30, 1.0, 1e30, 1.0])[:, None]
    corpus = torch.randn(150, 384, generator=generator)
    scores, indices = search(queries, corpus, 6, score="dot", corpus_chunk_size=40)
    expected_scores, expected_indices = brute_force(queries, corpus, 6, "dot")
    assert torch.equal(indices, expected_indices)
    # Relative to sum |q_i c_i| (about 2.4e32 for the rows of 1e30): the bound scales with the rows, as
    # float32's rounding does.
    assert_within_rounding(scores, expected_scores, queries, corpus, indices, "dot")


def test_a_row_at_float32s_largest_norm_is_searched_not_refused():
    # The check refuses a norm beyond float32's largest, not the largest itself: (max, 0, ..., 0) has
    # that norm exactly (max² is exact in float64), and its unit row is (1, 0, ..., 0) exactly, so the
    # cosine search gives the bits it gives with that unit row in its place.
    generator = torch.Generator().manual_seed(5)
    queries, corpus = torch.randn(3, 8, generator=generator), torch.randn(50, 8, generator=generator)
    largest, unit = corpus.clone(), corpus.clone()
    largest[7], unit[7] = 0.0, 0.0
    largest[7, 0], unit[7, 0] = torch.finfo(torch.float32).max, 1.0
    for way in (None, "plain"):
        got, expected = search(queries, largest, 5, way=way), search(queries, unit, 5, way=way)
        assert torch.equal(got[1], expected[1]) and torch.equal(got[0], expected[0]), way


@pytest.mark.parametrize("huge", ["queries", "corpus"])
def test_squared_norm_overflow_is_refused_for_euclidean(huge):
    # The distance needs |q|² and |c|²: with entries of 1e30 (or 1e19: 384 squares of 1e38) they
    # overflow, for a query row as for a corpus row.
    for value in (1e30, 1e19):
        queries, corpus = torch.randn(5, 384), torch.randn(50, 384)
        row = 3 if huge == "queries" else 41
        {"queries": queries, "corpus": corpus}[huge][row] = value
        with pytest.raises(ValueError, match=f"{huge} row {row} contains NaN or inf, or values too large"):
            search(queries, corpus, 4, score="euclidean", corpus_chunk_size=16)


@pytest.mark.parametrize(
    "score, entry, norm",
    [
        # 384 entries of 1e18: the norm, 1.96e19, fits float32; q·c = -384e36 does not.
        ("dot", 1e18, "1.96e+19"),
        # 384 entries of 5e17: |q|² = 9.6e37 fits; |q - c|² = 384 (1e18)² does not.
        ("euclidean", 5e17, "9.8e+18"),
    ],
)
def test_scores_that_could_overflow_are_refused(score, entry, norm):
    queries, corpus = torch.randn(4, 384), torch.randn(60, 384)
    queries[2] = entry
    corpus[33] = -entry
    message = f"queries row 2 (norm {norm}) and corpus row 33 (norm {norm}) may score beyond float32"
    with pytest.raises(ValueError, match=re.escape(message)):
        search(queries, corpus, 4, score=score, corpus_chunk_size=16)
    # The same rows with cosine are fine: cosines lie in [-1, 1].
    scores, indices = search(queries, corpus, 4, score="cosine", corpus_chunk_size=16)
    assert indices[2, -1] != 33 and torch.isfinite(scores).all()


@pytest.mark.parametrize("num_queries", [1, 16])
def test_dot_over_embeddings_as_given_refuses_and_accepts_what_the_plain_search_does(num_queries,
                                                                                   small_spans):
    # The fast ways measure rows as given in float32, and a span or chunk whose rows or scores could
    # leave float32's range is read by the plain search's checks instead. Two rows in the third span:
    generator = torch.Generator().manual_seed(num_queries)
    queries, corpus = torch.randn(num_queries, 4, generator=generator), torch.randn(600, 4, generator=generator)
    # Row 450 is orthogonal to every query, so each of its scores is 0, but its norm times the
    # largest query's (1e20 x 1.7e19) is beyond what the plain search accepts.
    queries[:, 3], queries[0, :3] = 0.0, 1e19
    corpus[450] = torch.tensor([0.0, 0.0, 0.0, 1e20])
    with pytest.raises(ValueError, match="queries row 0 .* and corpus row 450 .* may score beyond float32"):
        search(queries, corpus, 5, score="dot")
    # Row 451's entries of 2^126 make a float32 norm of 2^127, near float32's limit, but with queries of
    # norm below 1/2 no score can pass float32's range: the plain search accepts it, and so does the
    # way chosen here, with the same answer (tests/search/test_search_property.py: every way, on such rows).
    # Entries are multiples of 1/4 and small integers (and 2^126), so that every score is exact in
    # float32 and both see the same ties.
    queries = torch.randint(-1, 2, (num_queries, 4), generator=generator).float() / 4
    queries[:, 3] = 0.0
    corpus = torch.randint(-2, 3, (600, 4), generator=generator).float()
    corpus[451] = 2.0**126
    scores, indices = search(queries, corpus, 5, score="dot")
    plain_scores, plain_indices = search(queries, corpus, 5, score="dot", way="plain")
    assert torch.equal(indices, plain_indices) and torch.equal(scores, plain_scores)


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_embeddings_are_named(score, bad_value):
    corpus = torch.randn(30, 4)
    corpus[22, 1] = bad_value
    with pytest.raises(ValueError, match="corpus row 22 contains NaN or inf"):
        search(torch.randn(3, 4), corpus, 2, score=score, corpus_chunk_size=8)
    queries = torch.randn(3, 4)
    queries[2, 0] = bad_value
    with pytest.raises(ValueError, match="queries row 2 contains NaN or inf"):
        search(queries, torch.randn(30, 4), 2, score=score)
    # A bad entry among huge ones (whose norm is measured again after scaling) is found too.
    # Euclidean refuses squares beyond float32, so its huge entries are smaller.
    queries = torch.full((3, 4), 1e15 if score == "euclidean" else 1e30)
    queries[1, 3] = bad_value
    with pytest.raises(ValueError, match="queries row 1 contains NaN or inf"):
        search(queries, torch.randn(30, 4), 2, score=score)


# ---- dropping self-matches -----------------------------------------------------------------


@pytest.mark.parametrize("score", SCORES)
def test_self_matches_are_dropped_and_replaced(score):
    generator = torch.Generator().manual_seed(5)
    corpus = torch.randn(40, 8, generator=generator)
    query_rows = [3, 17, 39, 0]
    queries = corpus[query_rows]  # each query is its own best hit
    corpus_ids = [f"doc{i}" for i in range(40)]
    query_ids = [f"doc{i}" for i in query_rows]
    scores, indices = search(
        queries, corpus, 5, score=score, query_ids=query_ids, corpus_ids=corpus_ids,
        query_chunk_size=3, corpus_chunk_size=6,
    )
    # Reference: brute force over 6 results, then remove the query's own row.
    _, expected = brute_force(queries, corpus, 6, score)
    for row, query_row in enumerate(query_rows):
        assert expected[row, 0] == query_row  # the self-match was the top hit ...
        kept = [i for i in expected[row].tolist() if i != query_row]
        assert indices[row].tolist() == kept[:5]  # ... and the next five move up
    assert torch.isfinite(scores).all()


def test_rows_filling_up_at_different_chunks():
    # Query 0's id matches corpus rows 0-2, so after the first chunk (rows 0-3) its top-3 holds
    # one row while query 1's is full: the next chunk merges full and unfilled rows together.
    generator = torch.Generator().manual_seed(8)
    corpus = torch.randn(12, 4, generator=generator)
    queries = torch.randn(2, 4, generator=generator)
    corpus_ids = ["a", "a", "a"] + [f"d{i}" for i in range(3, 12)]
    scores, indices = search(
        queries, corpus, 3, score="dot", query_ids=["a", "z"], corpus_ids=corpus_ids,
        corpus_chunk_size=4,
    )
    all_scores = queries.double() @ corpus.double().T  # (2, 12)
    all_scores[0, :3] = -torch.inf
    expected = all_scores.argsort(dim=1, descending=True, stable=True)[:, :3]
    assert torch.equal(indices, expected)


def test_too_few_rows_left_are_padded():
    corpus = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    ids = {"query_ids": ["a", "b"], "corpus_ids": ["a", "b"]}
    scores, indices = search(corpus, corpus, 2, score="dot", **ids)
    # Each query may only return the other row; the second slot is padding.
    assert indices.tolist() == [[1, -1], [0, -1]]
    assert scores[:, 1].tolist() == [-float("inf")] * 2
    distances, indices = search(corpus, corpus, 2, score="euclidean", **ids)
    assert indices.tolist() == [[1, -1], [0, -1]]
    assert distances[:, 1].tolist() == [float("inf")] * 2


# ---- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"corpus": torch.zeros(0, 4)}, "corpus is empty"),
        ({"k": 0}, "k must be a positive integer"),
        ({"k": -3}, "k must be a positive integer"),
        ({"k": 2.0}, "k must be a positive integer"),
        ({"corpus": torch.randn(10, 5)}, "queries have dimension 4 but corpus has dimension 5"),
        ({"score": "manhattan"}, "unknown score 'manhattan'"),
        ({"queries": torch.randn(4)}, "queries must be a 2-D"),
        ({"corpus": torch.ones(10, 4, dtype=torch.long)}, "corpus must be a 2-D .* floating-point matrix, got shape .10, 4. torch.int64"),
        ({"corpus": [[1.0, 2.0]]}, "corpus must be a torch tensor or numpy array"),
        ({"query_chunk_size": 0}, "query_chunk_size must be a positive integer"),
        ({"corpus_chunk_size": -1}, "corpus_chunk_size must be a positive integer"),
        ({"query_ids": ["a", "b", "c"]}, "pass both query_ids and corpus_ids"),
        ({"query_ids": ["a"], "corpus_ids": list("abcdefghij")}, "got 1 query_ids for 3 queries"),
    ],
)
def test_bad_input_raises_clear_error(kwargs, message):
    arguments = {"queries": torch.randn(3, 4), "corpus": torch.randn(10, 4), "k": 2} | kwargs
    with pytest.raises(ValueError, match=message):
        search(**arguments)


def test_numpy_integers_are_taken_as_sizes():
    # As k is: a size computed with numpy (np.int64(n) // 4) is a size, and the answer is the same.
    generator = torch.Generator().manual_seed(0)
    queries, corpus = torch.randn(5, 4, generator=generator), torch.randn(30, 4, generator=generator)
    expected = search(queries, corpus, 3, query_chunk_size=2, corpus_chunk_size=7)
    found = search(queries, corpus, np.int64(3), query_chunk_size=np.int64(2), corpus_chunk_size=np.int32(7))
    assert all(torch.equal(a, b) for a, b in zip(found, expected))


# ---- memory ------------------------------------------------------------------------------


class LargestNewTensor(TorchFunctionMode):
    """Records the largest storage that any torch call returns and that none of its inputs owned.

    Views (corpus slices, reshaped buffers) and results written into `out=` share an input's
    storage and are not counted, so what is left are the real allocations.
    """

    def __init__(self):
        super().__init__()
        self.largest_bytes = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        input_storages = {t.untyped_storage().data_ptr() for t in _tensors([args, kwargs])}
        for tensor in _tensors(result):
            if tensor.untyped_storage().data_ptr() not in input_storages:
                self.largest_bytes = max(self.largest_bytes, tensor.untyped_storage().nbytes())
        return result


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


# Every way but "one span", the way of small corpora (its block is the whole (Q, N) score matrix), and
# "spans, int8" and "device, half", which screen a prepared corpus's int8 or float16 copy.
@pytest.mark.parametrize("way", [name for name in WAY_NAMES if name not in ("one span", "spans, int8", "device, half")])
@pytest.mark.parametrize("score", SCORES)
def test_largest_allocation_is_one_block_whatever_the_corpus_size(score, way):
    generator = torch.Generator().manual_seed(6)
    queries = torch.randn(64, 16, generator=generator)
    # Facts about the machine (the span product's way) are measured on a probe the first time: before.
    search(queries, torch.randn(500, 16), 5, score=score, query_chunk_size=32, corpus_chunk_size=256, way=way)
    largest = {}
    for num_docs in (2_000, 20_000):
        corpus = torch.randn(num_docs, 16, generator=generator)
        with LargestNewTensor() as recorder:
            search(queries, corpus, 5, score=score, query_chunk_size=32, corpus_chunk_size=256, way=way)
        largest[num_docs] = recorder.largest_bytes
    # The biggest thing ever allocated does not grow with the corpus: a block's float64 or int64
    # entries (32 x 256 x 8 bytes = 64 KiB), or the candidates scored exactly at once (SETTLE_PIECE
    # pairs of 16 float64 numbers: 512 KiB). The full score matrix would be 64 x 20,000 x 4 = 5 MB.
    assert max(largest.values()) <= max(32 * 256 * 8, SETTLE_PIECE * 16 * 8)


@pytest.mark.parametrize("way", WAY_NAMES)
@pytest.mark.parametrize("score", SCORES)
def test_at_k_equal_to_n_every_way_allocates_no_more_than_its_answer_and_a_piece(score, way, monkeypatch):
    """k = N keeps every row of every query, so every kept row is scored exactly. Gathered at once, its
    row beside each query would take Q x N x d float64 numbers (8 x 1,000 x 64 x 8 bytes = 4 MB here,
    20 GB for 96 queries over 70,000 rows of d = 384); the CPU ways score SETTLE_PIECE pairs at a time,
    the device ways DEVICE_RESCORE_ENTRIES numbers (made that many here: on a GPU it is 256 MB). So
    the largest allocation is twice the answer (a merge sets the kept rows beside the new ones: 2 x Q
    x N int64 numbers, 128 KB; a block of the whole (Q, N) is smaller), a chunk of rows in float64 for
    their norms (a corpus chunk, here all 1,000 rows: 512 KB, whatever k is) or one piece of the exact
    scoring (1,024 x 64 float64 numbers, 512 KB), and the answer is the plain loop's."""
    monkeypatch.setattr(device, "DEVICE_RESCORE_ENTRIES", SETTLE_PIECE * 64)
    generator = torch.Generator().manual_seed(8)
    num_queries, num_docs, dim = 8, 1_000, 64
    queries, rows = torch.randn(num_queries, dim, generator=generator), torch.randn(num_docs, dim, generator=generator)
    # The int8 and float16 screens need a prepared corpus with its copies; the rest search rows as given.
    corpus = prepare_corpus(rows, score, screen=True) if way in ("spans, int8", "device, half") else rows
    search(queries, corpus, 1, score=score, way=way)  # a fact measured on a first search is not counted
    with LargestNewTensor() as recorder:
        found = search(queries, corpus, num_docs, score=score, way=way)
    expected = search_module.search(queries, corpus, num_docs, score=score, way="plain")
    assert all(torch.equal(a, b) for a, b in zip(found, expected))
    assert recorder.largest_bytes <= max(2 * num_queries * num_docs * 8, num_docs * dim * 8, SETTLE_PIECE * dim * 8), (
        way, score, recorder.largest_bytes)


# ---- GPU ---------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("score", SCORES)
def test_cuda_matches_cpu(score):
    generator = torch.Generator().manual_seed(7)
    queries = torch.randn(50, 32, generator=generator)
    corpus = torch.randn(3_000, 32, generator=generator)
    cpu_scores, cpu_indices = search(queries, corpus, 10, score=score, corpus_chunk_size=700)
    gpu_scores, gpu_indices = search(
        queries, corpus.cuda().half(), 10, score=score, corpus_chunk_size=700,
    )
    expected_scores, expected_indices = brute_force(queries, corpus.half().float(), 10, score)
    assert gpu_indices.device.type == "cuda"
    assert torch.equal(gpu_indices.cpu(), expected_indices)
    # The GPU sums in float32 too (conftest.py turns TF32 off; fused multiply-adds round less, not more),
    # so the same bound holds. Not measured: the machine these tolerances were measured on has no GPU.
    assert_within_rounding(gpu_scores.cpu(), expected_scores, queries, corpus.half().float(), expected_indices,
                           score)
    assert torch.equal(cpu_indices, brute_force(queries, corpus, 10, score)[1])


# ---- every number of queries, and a corpus prepared once ------------------------------------


def prepared(corpus, score):
    return prepare_corpus(corpus, score=score, screen=True)


def prepared_saved_and_loaded(corpus, score, folder):
    path = folder / "corpus.safetensors"
    prepare_corpus(corpus, score=score).save(path)
    return load_corpus(path, screen=True)


@pytest.fixture
def small_spans(monkeypatch):
    """Spans and pieces of a few rows, so that the few-query search crosses many of both on a
    test's small corpus (at the real sizes a span holds up to 524,224 rows): a first span of one
    group, then spans of three, reached by growing when the search screens; the span product's
    pieces are of 40 rows for one query padded to two factor rows (80 as given), 5 for 16 queries, and a way measured
    meanwhile is timed on a probe as small (64 KB), in pieces as small."""
    monkeypatch.setattr(fast_retrieval, "FIRST_SPAN_ROWS", 64)
    monkeypatch.setattr(span_product, "PIECE_ENTRIES", 80)
    monkeypatch.setattr(span_product, "PROBE_BYTES", 2**16)
    monkeypatch.setattr(span_product.cpu, "last_level_cache_bytes", lambda: 0)  # no cache to read past
    monkeypatch.setattr(fast_retrieval, "SPAN_ROWS", 3 * 64)
    monkeypatch.setattr(fast_retrieval, "PIECE_BYTES", 64 * 4 * 24)


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("num_queries", [1, 2, 5, 16, 1000])
@pytest.mark.parametrize("corpus_form", ["embeddings", "prepared", "saved and loaded"])
def test_every_number_of_queries_matches_brute_force(score, num_queries, corpus_form, small_spans, tmp_path):
    # ids_problem: repeated rows (ties within and across spans and pieces), self-matches left out,
    # entries whose every score is exact in float32: the way chosen for each number of queries and
    # form must return brute force's rows and the plain loop's bits.
    # k = 250 is above the 203 rows, 12 below them.
    queries, corpus, ids = ids_problem(score, torch.Generator().manual_seed(13))
    rows = torch.arange(num_queries) % queries.shape[0]
    queries, ids["query_ids"] = queries[rows], [ids["query_ids"][i] for i in rows.tolist()]
    self_rows = [SELF_ROWS[i - 40] if i >= 40 else None for i in rows.tolist()]
    search_corpus = {"embeddings": lambda: corpus, "prepared": lambda: prepared(corpus, score),
                     "saved and loaded": lambda: prepared_saved_and_loaded(corpus, score, tmp_path)}[corpus_form]()
    expected_scores, expected = brute_force(queries, corpus, corpus.shape[0], score)
    for k in (12, 250):
        scores, indices = search(queries, search_corpus, k, score=score, **ids)
        plain_scores, plain_indices = search(queries, corpus, k, score=score, **ids, way="plain")
        assert torch.equal(indices, plain_indices) and torch.equal(scores, plain_scores)
        for query, own in enumerate(self_rows):
            kept = [column for column, row in enumerate(expected[query].tolist()) if row != own][:k]
            assert indices[query, : len(kept)].tolist() == expected[query, kept].tolist()
            assert (indices[query, len(kept):] == -1).all()  # a self-match left out leaves padding
            # Exact scores (see ids_problem), but for a distance's square root: assert_exact_scores.
            assert_exact_scores(scores[query, : len(kept)], expected_scores[query, kept], score)


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("num_queries", [1, 2, 5, 16, 1000])
def test_random_embeddings_at_every_number_of_queries(score, num_queries, small_spans):
    assert_random_embeddings_match_brute_force(num_queries, score)


def assert_random_embeddings_match_brute_force(num_queries, score):
    """Ordinary embeddings: the fast path and a prepared corpus rank as brute force does, with
    scores equal to float32 rounding (see assert_matches_brute_force)."""
    generator = torch.Generator().manual_seed(num_queries)
    queries, corpus = torch.randn(num_queries, 24, generator=generator), torch.randn(1000, 24, generator=generator)
    assert_matches_brute_force(queries, corpus, 10, score)
    scores, indices = search(queries, prepared(corpus, score), 10, score=score)
    expected_scores, expected_indices = brute_force(queries, corpus, 10, score)
    assert torch.equal(indices, expected_indices)
    assert_within_rounding(scores, expected_scores, queries, corpus, indices, score)


@pytest.mark.parametrize("way", span_product.WAYS)
@pytest.mark.parametrize("score", ["cosine", "dot"])
@pytest.mark.parametrize("num_queries", [1, 2, 16])
def test_every_way_of_multiplying_spans_finds_what_brute_force_finds(way, score, num_queries, small_spans,
                                                                      monkeypatch):
    # Each way forced (minisbert/search/fast/span_product.py), over embeddings as given and a prepared
    # corpus: exact scores (ids_problem) must come out exactly, random ones to float32 rounding.
    if not span_product.runs(way, torch.device("cpu")):
        pytest.skip(f"{way} does not run on this CPU")
    monkeypatch.setattr(span_product, "way", lambda *shape: way)  # as if the machine's fact said so
    queries, corpus, ids = ids_problem(score, torch.Generator().manual_seed(14))
    queries, ids["query_ids"] = queries[:num_queries], ids["query_ids"][:num_queries]
    for search_corpus in (corpus, prepared(corpus, score)):
        scores, indices = search(queries, search_corpus, 12, score=score, **ids)
        plain_scores, plain_indices = search(queries, corpus, 12, score=score, **ids, way="plain")
        assert torch.equal(indices, plain_indices) and torch.equal(scores, plain_scores)
    assert_random_embeddings_match_brute_force(num_queries, score)


def test_the_way_of_multiplying_spans_is_measured_once_per_machine(monkeypatch, timed_probes):
    monkeypatch.setattr(span_product, "PROBE_BYTES", 2**20)  # a small probe: only the count matters here
    monkeypatch.setattr(span_product.cpu, "last_level_cache_bytes", lambda: 0)
    measured = []
    quickest = span_product._quickest
    monkeypatch.setattr(span_product, "_quickest", lambda *shape: measured.append(shape) or quickest(*shape))
    corpus = torch.randn(500, 24)
    for num_queries in (3, 4, 3, 5):  # rounded up to 4, 4, 4, 8
        search(torch.randn(num_queries, 24), corpus, 5, score="dot", way="spans")
    machine.forget()  # as a new process would: the file is read back, nothing measured again
    search(torch.randn(3, 24), corpus, 5, score="dot", way="spans")
    assert measured == [(4, 24, torch.device("cpu")), (8, 24, torch.device("cpu"))]
    kept = machine.known()
    assert {kept["span product of 4 rows from memory, d = 24"],
            kept["span product of 8 rows from memory, d = 24"]} <= set(span_product.WAYS)
    machine.forget()


def test_the_removed_variable_that_forced_the_span_product_is_named(monkeypatch):
    monkeypatch.setenv(span_product.REMOVED_VARIABLE, "onednn")
    with pytest.raises(ValueError, match="MINISBERT_SPAN_PRODUCT no longer forces the span product: .* way=NAME"):
        search(torch.randn(2, 8), torch.randn(50, 8), 3, way="spans")


def test_a_prepared_corpus_keeps_its_score_and_refuses_another():
    corpus = prepare_corpus(torch.randn(50, 8), score="dot", screen=False)
    scores, _ = search(torch.randn(2, 8), corpus, 3)  # dot, as prepared
    assert scores.shape == (2, 3)
    with pytest.raises(ValueError, match="prepared for score='dot', not 'cosine'"):
        search(torch.randn(2, 8), corpus, 3, score="cosine")


def test_preparing_refuses_what_search_refuses():
    corpus = torch.randn(300, 8)
    corpus[250, 3] = float("inf")
    with pytest.raises(ValueError, match="corpus row 250 contains NaN or inf"):
        prepare_corpus(corpus)


def test_a_prepared_corpus_checks_the_score_bound_against_each_query():
    corpus = prepare_corpus(torch.full((10, 4), 1e18), score="dot", screen=False)
    with pytest.raises(ValueError, match="may score beyond float32"):
        search(torch.full((1, 4), 1e20), corpus, 3)


def test_a_file_that_is_not_a_prepared_corpus_is_named(tmp_path):
    path = tmp_path / "corpus.safetensors"
    path.write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="corpus.safetensors: not a prepared corpus file"):
        load_corpus(path)
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path}: not a prepared corpus file (a folder)") + "$"):
        load_corpus(tmp_path)  # the folder holding it, given by mistake


def test_a_prepared_corpus_file_of_the_first_format_still_loads(tmp_path):
    # Format 1 stored the norm terms under the name "sizes".
    from safetensors.torch import save_file

    corpus = prepare_corpus(torch.randn(40, 8), score="euclidean", screen=False)
    path = tmp_path / "corpus.safetensors"
    save_file({"rows": corpus.rows, "sizes": corpus.norms.float() ** 2}, str(path),
              metadata={"format": "minisbert prepared corpus 1", "score": "euclidean"})
    loaded = load_corpus(path, screen=False)
    assert torch.equal(loaded.rows, corpus.rows) and torch.equal(loaded.norms, corpus.norms)
    queries = torch.randn(3, 8)
    assert all(torch.equal(a, b) for a, b in zip(search(queries, loaded, 5), search(queries, corpus, 5)))


def test_the_readmes_first_example_runs_and_prints_what_it_says(tmp_path, monkeypatch, minilm, capsys):
    # The README's "In a few lines" code, as written: load, encode, search, evaluate.
    readme = (REPO / "README.md").read_text()
    section = readme.split("## In a few lines", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    exec(code, {})
    printed = code.rsplit("# ", 1)[1].strip()  # what its last line's comment says it prints
    assert capsys.readouterr().out.strip() == printed


def test_the_readmes_search_example_runs(tmp_path, monkeypatch, minilm):
    # The README's "Searching your own corpus" code, as written, with `documents` defined.
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Searching your own corpus", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    names = {"documents": ["Cells divide by mitosis.", "The stock market fell.", "Meiosis makes gametes."]}
    exec(code, names)
    assert names["rows"].tolist()[0][:1] == [0] and names["scores"].shape == (1, 3)


@pytest.mark.parametrize("num_queries", [1, 16, 1000])
def test_util_semantic_search_is_the_fast_search_written_out(num_queries, small_spans):
    from minisbert.porting import util

    generator = torch.Generator().manual_seed(3)
    queries, corpus = torch.randn(num_queries, 24, generator=generator), torch.randn(500, 24, generator=generator)
    for score_function, score in ((util.cos_sim, "cosine"), (util.dot_score, "dot")):
        hits = util.semantic_search(queries, corpus, top_k=7, score_function=score_function)
        scores, indices = search(queries, corpus, 7, score=score)
        assert [[hit["corpus_id"] for hit in row] for row in hits] == indices.tolist()
        assert [[hit["score"] for hit in row] for row in hits] == scores.tolist()
        # Plain Python numbers, as sentence-transformers' hits hold (f"{score:.3f}", json.dumps).
        assert all(type(hit["corpus_id"]) is int and type(hit["score"]) is float for row in hits for hit in row)


ID_FORMS = {"list": list, "tuple": tuple, "numpy array": np.array, "tensor": torch.tensor,
            "list of 0-d tensors": lambda ids: [torch.tensor(i) for i in ids],
            "list of numpy integers": lambda ids: [np.int64(i) for i in ids]}


@pytest.mark.parametrize("form", ID_FORMS)
def test_ids_in_any_sequence_leave_out_the_same_rows(form):
    """A tensor's elements compare by identity, not value: left as they are, no row would ever be left out."""
    corpus = torch.randn(30, 8, generator=torch.Generator().manual_seed(3))
    queries = corpus[[2, 7, 7, 11]]
    as_list = search_module.search(queries, corpus, 4, query_ids=[2, 7, 7, 11], corpus_ids=list(range(30)))
    given = search_module.search(queries, corpus, 4, query_ids=ID_FORMS[form]([2, 7, 7, 11]),
                                 corpus_ids=ID_FORMS[form](list(range(30))))
    assert all(torch.equal(a, b) for a, b in zip(as_list, given))
    assert not (given[1] == torch.tensor([[2], [7], [7], [11]])).any()  # each query's own row is left out


@pytest.mark.parametrize("ids, message", [([[0, 1]] * 30, r"corpus_ids\[0\] is a list"),
                                          (torch.zeros(30, 2), r"corpus_ids must hold one id per row")])
def test_ids_that_are_no_ids_are_refused_naming_them(ids, message):
    corpus = torch.randn(30, 8)
    with pytest.raises(ValueError, match=message):
        search_module.search(corpus[:2], corpus, 3, query_ids=[0, 1], corpus_ids=ids)


def test_numpy_inputs_of_any_byte_order_and_strides_are_searched_as_their_values():
    generator = np.random.default_rng(5)
    corpus, queries = generator.standard_normal((40, 8)).astype(np.float32), generator.standard_normal((3, 8))
    expected = search_module.search(queries.astype(np.float32), corpus, 5)
    for form in (corpus.astype(">f4"), corpus[::-1][::-1], np.flip(np.flip(corpus, 0), 0)):
        assert all(np.array_equal(a, b) for a, b in zip(search_module.search(queries.astype(">f8"), form, 5), expected))
    flipped = search_module.search(queries, corpus[::-1], 5)[1]  # rows numbered as given: reversed
    assert np.array_equal(39 - flipped, expected[1])


def test_a_numpy_corpus_torch_can_read_is_searched_in_place_not_copied(tmp_path):
    # A corpus of a million rows copied is gigabytes more: arrays torch reads as they are (any
    # non-negative strides, a broadcast row among them, a read-only memory map) are taken in place;
    # only reversed strides and another byte order, which torch cannot read, are copied.
    generator = np.random.default_rng(6)
    corpus = generator.standard_normal((40, 8)).astype(np.float32)
    np.save(tmp_path / "corpus.npy", corpus)
    mapped = np.load(tmp_path / "corpus.npy", mmap_mode="r")
    for form in (corpus, corpus[::2], corpus[:, ::2], np.broadcast_to(corpus[0], (1_000_000, 8)), mapped):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # torch's warning that a read-only array may not be written: it is not
            taken = as_embedding_matrix(form, "corpus")
        assert np.shares_memory(taken.numpy(), form) and np.array_equal(taken.numpy(), form)
    for form in (corpus[::-1], corpus.astype(">f4")):
        taken = as_embedding_matrix(form, "corpus")
        assert not np.shares_memory(taken.numpy(), form) and np.array_equal(taken.numpy(), form)
    # Every way only reads it: over the read-only map (a write there would fault) as over the array, which stays as it was.
    given = corpus.copy()
    for way in WAY_NAMES:
        for score in SCORES:
            answers = [search_if_it_runs(corpus[:3], rows, 5, score=score, way=way) for rows in (mapped, corpus)]
            if answers[0] is None:
                continue
            expected = search_module.search(given[:3], given, 5, score=score, way="plain")
            assert all(np.array_equal(a, b) for answer in answers for a, b in zip(answer, expected)), (way, score)
            assert np.array_equal(corpus, given), (way, score)


def test_a_meta_tensor_is_refused_naming_it():
    with pytest.raises(ValueError, match="corpus is on the meta device"):
        search_module.search(torch.randn(2, 8), torch.empty(10, 8, device="meta"), 3)


def test_the_search_way_variable_is_named_in_its_errors(monkeypatch):
    corpus = torch.randn(30, 8)
    monkeypatch.setenv(search_module.WAY_VARIABLE, "fastest")
    with pytest.raises(ValueError, match=r"'fastest' \(from MINISBERT_SEARCH_WAY\).*unset MINISBERT_SEARCH_WAY"):
        search_module.search(corpus[:2], corpus, 3)
    monkeypatch.setenv(search_module.WAY_VARIABLE, "device, half")
    with pytest.raises(ValueError, match=r"'device, half' \(from MINISBERT_SEARCH_WAY\) cannot run here.*unset"):
        search_module.search(corpus[:2], corpus, 3)


@pytest.mark.parametrize("queries, way", [(5, None), (300, None), (5, "plain")])
def test_the_removed_span_product_variable_is_refused_on_every_path(queries, way, monkeypatch):
    monkeypatch.setenv(span_product.REMOVED_VARIABLE, "onednn")
    corpus = torch.randn(50, 8)
    with pytest.raises(ValueError, match="MINISBERT_SPAN_PRODUCT no longer forces"):
        search_module.search(torch.randn(queries, 8), corpus, 3, way=way)


def test_an_old_corpus_file_with_a_row_not_of_norm_1_is_refused_naming_the_row(tmp_path):
    """A prepared corpus of an older format carries no digest, so its rows are checked one by one: a
    cosine corpus whose row 2 has norm 2 (and every other row norm 1) is refused naming row 2."""
    from safetensors.torch import save_file

    rows = torch.nn.functional.normalize(torch.randn(5, 8, generator=torch.Generator().manual_seed(2)), dim=1)
    rows[2] *= 2
    path = tmp_path / "old.safetensors"
    save_file({"rows": rows}, str(path), metadata={"format": search_module.OLD_FORMATS[0], "score": "cosine"})
    with pytest.raises(ValueError, match=r"old.safetensors: row 2 has norm 1.99999\d*, not 1"):  # 2 in float32
        search_module.load_corpus(path)


@pytest.mark.parametrize("damage, message", [
    ("row 3 NaN", r"old.safetensors: corpus row 3 contains NaN"),
    ("norm 3 moved", r"old.safetensors: its 'norms' \(torch.float64\) do not match its rows' float64 norms"),
    ("norms in float32", r"old.safetensors: its 'norms' \(torch.float32\) do not match its rows' float64 norms"),
])
def test_an_old_corpus_file_damaged_is_refused_naming_what_is_wrong(tmp_path, damage, message):
    """Format 3 wrote the rows and their float64 norms without a digest, so load_corpus checks each:
    a row that is not finite is named by its number; norms that are not the rows' own (one moved by
    one float64 step, or the right values kept in float32) are refused, whatever their dtype."""
    from safetensors.torch import save_file

    corpus = prepare_corpus(torch.randn(6, 8, generator=torch.Generator().manual_seed(3)), "dot", screen=False)
    rows, norms = corpus.rows.clone(), corpus.norms.clone()
    if damage == "row 3 NaN":
        rows[3, 5] = math.nan
    elif damage == "norm 3 moved":
        norms[3] = torch.nextafter(norms[3], torch.tensor(math.inf, dtype=torch.float64))
    else:
        norms = norms.float()
    path = tmp_path / "old.safetensors"
    old_format = {"format": search_module.OLD_FORMATS[-1], "score": "dot"}
    save_file({"rows": rows, "norms": norms}, str(path), metadata=old_format)
    with pytest.raises(ValueError, match=message):
        search_module.load_corpus(path)
    save_file({"rows": corpus.rows, "norms": corpus.norms}, str(path), metadata=old_format)  # undamaged, it loads
    assert torch.equal(search_module.load_corpus(path).norms, corpus.norms)


def test_a_corpus_file_of_one_row_loads_and_one_of_none_is_refused(tmp_path):
    # The smallest corpus a search takes is one row: saved, it loads and is searched as before; a file
    # whose rows are (0, d) is refused naming what a prepared corpus needs.
    from safetensors.torch import save_file

    one = prepare_corpus(torch.randn(1, 8, generator=torch.Generator().manual_seed(6)), "dot", screen=False)
    one.save(tmp_path / "one.safetensors")
    loaded = load_corpus(tmp_path / "one.safetensors", screen=False)
    queries = torch.randn(2, 8)
    assert all(torch.equal(a, b) for a, b in zip(search(queries, loaded, 1), search(queries, one, 1)))
    empty = {"rows": torch.empty(0, 8), "norms": torch.empty(0, dtype=torch.float64)}
    old_format = {"format": search_module.OLD_FORMATS[-1], "score": "dot"}
    save_file(empty, str(tmp_path / "none.safetensors"), metadata=old_format)
    with pytest.raises(ValueError, match=r"none.safetensors: a prepared corpus needs 'rows', a non-empty"):
        load_corpus(tmp_path / "none.safetensors")
