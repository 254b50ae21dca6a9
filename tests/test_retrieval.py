"""Tests for minisbert.retrieval.search.

"Correct" means: the same rows, in the same order, as brute force (the full score matrix in
float64 and a stable sort, so equal scores go to the lower corpus index), whatever the chunk sizes,
with scores equal to the brute-force scores up to float32 rounding.
"""

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from minisbert import retrieval
from minisbert.retrieval import search

SCORES = ("cosine", "dot", "euclidean")


def brute_force(queries, corpus, k, score):
    """Reference: every score in float64, then a stable sort (ties -> lower index first)."""
    queries = torch.as_tensor(queries).double()
    corpus = torch.as_tensor(corpus).double()
    if score == "cosine":
        queries = queries / queries.norm(dim=1, keepdim=True)
        corpus = corpus / corpus.norm(dim=1, keepdim=True)
    if score == "euclidean":
        distances = (queries[:, None, :] - corpus[None, :, :]).pow(2).sum(-1).sqrt()  # (Q, N)
        order = distances.argsort(dim=1, stable=True)[:, :k]
        return distances.gather(1, order), order
    scores = queries @ corpus.T  # (Q, N)
    order = scores.argsort(dim=1, descending=True, stable=True)[:, :k]
    return scores.gather(1, order), order


def assert_matches_brute_force(queries, corpus, k, score, **kwargs):
    scores, indices = search(queries, corpus, k, score=score, **kwargs)
    expected_scores, expected_indices = brute_force(queries, corpus, k, score)
    assert torch.equal(indices, expected_indices)
    torch.testing.assert_close(scores.double(), expected_scores, rtol=1e-5, atol=1e-5)


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
    # cosine: (3*1 + 4*0) / 5 = 0.6;  2 / 2 = 1.0;  0 / 1 = 0.0  -> rows 1, 0, 2
    scores, indices = search(queries, corpus, 3, score="cosine")
    assert indices.tolist() == [[1, 0, 2]]
    torch.testing.assert_close(scores, torch.tensor([[1.0, 0.6, 0.0]]))
    # dot: 3, 2, 0 -> rows 0, 1, 2
    scores, indices = search(queries, corpus, 3, score="dot")
    assert indices.tolist() == [[0, 1, 2]]
    torch.testing.assert_close(scores, torch.tensor([[3.0, 2.0, 0.0]]))
    # euclidean: |(1,0)-(3,4)| = sqrt(4+16) = 4.472;  |(1,0)-(2,0)| = 1;  |(1,0)-(0,-1)| = sqrt(2)
    scores, indices = search(queries, corpus, 3, score="euclidean")
    assert indices.tolist() == [[1, 2, 0]]
    torch.testing.assert_close(scores, torch.tensor([[1.0, 2.0**0.5, 20.0**0.5]]))


# ---- agreement with brute force ------------------------------------------------------------


@pytest.mark.parametrize("bf16_screen", [False, True])
@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize(
    "k, query_chunk_size, corpus_chunk_size",
    [
        (7, 5, 17),  # chunk sizes divide neither Q = 23 nor N = 101
        (1, 5, 17),  # k = 1
        (30, 4, 17),  # k larger than a corpus chunk
        (101, 23, 101),  # k = N, one block
        (7, 1, 1),  # one query against one document at a time
        (7, 1024, 8192),  # the CPU defaults: a single block here
    ],
)
def test_random_matches_brute_force(score, k, query_chunk_size, corpus_chunk_size, bf16_screen):
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(23, 16, generator=generator)
    corpus = torch.randn(101, 16, generator=generator)
    assert_matches_brute_force(
        queries, corpus, k, score, query_chunk_size=query_chunk_size,
        corpus_chunk_size=corpus_chunk_size, bf16_screen=bf16_screen,
    )


@pytest.mark.parametrize("score", SCORES)
def test_k_larger_than_corpus_returns_whole_corpus_ranked(score):
    generator = torch.Generator().manual_seed(1)
    queries = torch.randn(6, 8, generator=generator)
    corpus = torch.randn(11, 8, generator=generator)
    scores, indices = search(queries, corpus, 50, score=score, query_chunk_size=5, corpus_chunk_size=4)
    assert scores.shape == indices.shape == (6, 11)
    assert all(sorted(row) == list(range(11)) for row in indices.tolist())
    assert_matches_brute_force(queries, corpus, 50, score, query_chunk_size=5, corpus_chunk_size=4)


@pytest.mark.parametrize("bf16_screen", [False, True])
@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("k", [1, 4, 20, 200])
@pytest.mark.parametrize("chunk_sizes", [(5, 17), (3, 4), (64, 64)])
def test_ties_go_to_lower_index_across_chunks(score, k, chunk_sizes, bf16_screen):
    generator = torch.Generator().manual_seed(2)
    make = two_norm_embeddings if score == "cosine" else integer_embeddings
    distinct = make(7, 8, generator)
    # 60 corpus rows drawn from 7 distinct vectors: every score is shared by many rows, spread
    # over several chunks.
    corpus = distinct[torch.randint(0, 7, (60,), generator=generator)]
    queries = make(13, 8, generator)
    query_chunk_size, corpus_chunk_size = chunk_sizes
    scores, indices = search(
        queries, corpus, k, score=score, bf16_screen=bf16_screen,
        query_chunk_size=query_chunk_size, corpus_chunk_size=corpus_chunk_size,
    )
    expected_scores, expected_indices = brute_force(queries, corpus, k, score)
    assert torch.equal(indices, expected_indices)
    torch.testing.assert_close(scores.double(), expected_scores)


def test_all_equal_scores_return_first_rows_in_order():
    corpus = torch.ones(50, 4)
    scores, indices = search(torch.ones(3, 4), corpus, 10, score="dot", corpus_chunk_size=7)
    assert indices.tolist() == [list(range(10))] * 3
    assert torch.all(scores == 4.0)


@pytest.mark.parametrize("bf16_screen", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("score", SCORES)
def test_half_precision_corpus_scored_in_float32(dtype, score, bf16_screen):
    generator = torch.Generator().manual_seed(3)
    queries = torch.randn(9, 32, generator=generator)
    corpus = torch.randn(70, 32, generator=generator).to(dtype)
    scores, indices = search(
        queries, corpus, 5, score=score, query_chunk_size=4, corpus_chunk_size=17,
        bf16_screen=bf16_screen,
    )
    assert scores.dtype == torch.float32
    # The reference sees the same half-precision values, upcast.
    expected_scores, expected_indices = brute_force(queries, corpus.float(), 5, score)
    assert torch.equal(indices, expected_indices)
    torch.testing.assert_close(scores.double(), expected_scores, rtol=1e-5, atol=1e-5)


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
    np.testing.assert_allclose(torch_scores.numpy(), scores)


def test_empty_query_set_gives_empty_results():
    scores, indices = search(torch.zeros(0, 4), torch.randn(10, 4), 3)
    assert scores.shape == indices.shape == (0, 3)


# ---- screening with a bfloat16 product --------------------------------------------------------


def test_error_bound_holds_and_is_nearly_reached():
    d = 384
    # Worst case. 1 + 2^-8 lies midway between the bfloat16 values 1 and 1 + 2^-7: `down` just
    # below it rounds down by nearly 2^-8, `up` just above it rounds up by as much. In
    # worst_q . worst_c every product's rounding error has the same sign (down*down and
    # up*(-up) both decrease), so the errors add up, while the exact value is nearly 0 and the
    # bfloat16 output's own rounding adds almost nothing.
    down, up = 1 + 2.0**-8 - 2.0**-20, 1 + 2.0**-8 + 2.0**-20
    half = d // 2
    worst_q = torch.tensor([[down] * half + [up] * half])
    worst_c = torch.tensor([[down] * half + [-up] * half])
    generator = torch.Generator().manual_seed(9)
    scales = torch.logspace(-20, 15, 8)[:, None]  # rows of very different norms
    queries = torch.cat([worst_q, torch.randn(8, d, generator=generator) * scales])
    corpus = torch.cat([worst_c, -worst_c, torch.randn(50, d, generator=generator) * 3])
    query_norms = torch.linalg.vector_norm(queries, dim=1)
    largest_norm = torch.linalg.vector_norm(corpus, dim=1).amax()
    # The bfloat16 output's own rounding is added separately, as _upper_bounds does.
    u = retrieval.BF16_UNIT

    approximate = (queries.bfloat16() @ corpus.bfloat16().T).double()  # (Q, N)
    exact = queries.double() @ corpus.double().T  # (Q, N)
    bound = retrieval._error_bounds(query_norms, largest_norm, d, False).double()[:, None]
    assert ((approximate - exact).abs() <= bound + u / (1 - u) * approximate.abs()).all()

    # Euclidean: [2q, -1] . [c, |c|^2] = 2 q.c - |c|^2, the ranking key.
    squared = torch.linalg.vecdot(corpus, corpus)  # (N,)
    long_queries = torch.cat([2 * queries, -torch.ones(len(queries), 1)], dim=1)
    long_corpus = torch.cat([corpus, squared[:, None]], dim=1)
    approximate = (long_queries.bfloat16() @ long_corpus.bfloat16().T).double()  # (Q, N)
    exact = 2 * queries.double() @ corpus.double().T - corpus.double().pow(2).sum(1)  # (Q, N)
    bound = retrieval._error_bounds(query_norms, largest_norm, d, True).double()[:, None]
    assert ((approximate - exact).abs() <= bound + u / (1 - u) * approximate.abs()).all()

    # In the worst case the error is nearly 2u |q| |c|. The bound, with the norms of this pair,
    # (2u + u^2 + 4 gamma)(1 + 2 gamma)^2 (1.01) |q| |c|, holds and is at most 5% above it.
    worst_norm = torch.linalg.vector_norm(worst_q)
    worst_bound = retrieval._error_bounds(worst_norm, worst_norm, d, False)
    worst_approximate = (worst_q.bfloat16() @ worst_c.bfloat16().T).double()
    worst_error = worst_q.double() @ worst_c.double().T - worst_approximate
    assert 0.95 * worst_bound < worst_error <= worst_bound + u / (1 - u) * worst_approximate.abs()


def count_calls(monkeypatch, owner, name):
    """Replace owner.name by a wrapper that counts its calls; return the list of results."""
    results = []
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        results.append(original(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(owner, name, counted)
    return results


@pytest.mark.parametrize("score", SCORES)
def test_screening_skips_most_float32_blocks_and_matches_brute_force(score, monkeypatch):
    generator = torch.Generator().manual_seed(10)
    queries = torch.randn(100, 32, generator=generator)
    queries /= torch.linalg.vector_norm(queries, dim=1, keepdim=True)
    corpus = torch.randn(20_000, 32, generator=generator)
    corpus *= (0.5 + torch.rand(20_000, 1, generator=generator) / 2) / torch.linalg.vector_norm(
        corpus, dim=1, keepdim=True
    )  # norms between 0.5 and 1
    float32_blocks = count_calls(monkeypatch, retrieval, "_merge_block")
    assert_matches_brute_force(queries, corpus, 10, score, corpus_chunk_size=2_000, bf16_screen=True)
    # Of 10 chunks, the first fills each row's top-k in float32; a second can fail to screen
    # (its k-th best is still low) and make the third wait. The other seven are screened.
    assert 1 <= len(float32_blocks) <= 3


def test_crowded_scores_fall_back_to_float32_blocks_and_back_off(monkeypatch):
    # Every score is equal, so nothing can be ruled out.
    screens = count_calls(monkeypatch, retrieval._Screen, "_candidates")
    float32_blocks = count_calls(monkeypatch, retrieval, "_merge_block")
    scores, indices = search(torch.ones(3, 4), torch.ones(800, 4), 5, corpus_chunk_size=100, bf16_screen=True)
    assert indices.tolist() == [[0, 1, 2, 3, 4]] * 3
    # Chunk 0 fills the top-k. Screens are tried on chunks 1, 3 and 7, each failure doubling
    # the wait before the next; every chunk is merged in float32.
    assert screens == [None, None, None]
    assert len(float32_blocks) == 8


@pytest.mark.parametrize("bf16_screen", [False, True])
def test_tiny_rows_have_true_cosines(bf16_screen):
    # Squares of entries near 1e-30 underflow in float32; the norm must not come out as zero.
    generator = torch.Generator().manual_seed(11)
    queries = torch.randn(5, 8, generator=generator)
    corpus = torch.randn(300, 8, generator=generator)
    scaled = corpus * torch.where(torch.arange(300) % 2 == 0, 1e-30, 1.0)[:, None]
    scores, indices = search(queries * 1e-30, scaled, 7, corpus_chunk_size=64, bf16_screen=bf16_screen)
    expected_scores, expected_indices = brute_force(queries, corpus, 7, "cosine")
    assert torch.equal(indices, expected_indices)
    torch.testing.assert_close(scores.double(), expected_scores, rtol=1e-5, atol=1e-5)


# ---- dropping self-matches -----------------------------------------------------------------


@pytest.mark.parametrize("bf16_screen", [False, True])
@pytest.mark.parametrize("score", SCORES)
def test_self_matches_are_dropped_and_replaced(score, bf16_screen):
    generator = torch.Generator().manual_seed(5)
    corpus = torch.randn(40, 8, generator=generator)
    query_rows = [3, 17, 39, 0]
    queries = corpus[query_rows]  # each query is its own best hit
    corpus_ids = [f"doc{i}" for i in range(40)]
    query_ids = [f"doc{i}" for i in query_rows]
    scores, indices = search(
        queries, corpus, 5, score=score, query_ids=query_ids, corpus_ids=corpus_ids,
        query_chunk_size=3, corpus_chunk_size=6, bf16_screen=bf16_screen,
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
        queries, corpus, 3, score="dot", query_ids=["a", "z"], corpus_ids=corpus_ids, corpus_chunk_size=4
    )
    all_scores = queries.double() @ corpus.double().T  # (2, 12)
    all_scores[0, :3] = -torch.inf
    expected = all_scores.argsort(dim=1, descending=True, stable=True)[:, :3]
    assert torch.equal(indices, expected)


def test_too_few_rows_left_are_padded():
    corpus = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    scores, indices = search(corpus, corpus, 2, score="dot", query_ids=["a", "b"], corpus_ids=["a", "b"])
    # Each query may only return the other row; the second slot is padding.
    assert indices.tolist() == [[1, -1], [0, -1]]
    assert scores[:, 1].tolist() == [-float("inf")] * 2
    distances, indices = search(
        corpus, corpus, 2, score="euclidean", query_ids=["a", "b"], corpus_ids=["a", "b"]
    )
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
        ({"queries": torch.randn(4)}, "queries must be 2-D"),
        ({"corpus": torch.ones(10, 4, dtype=torch.long)}, "corpus must be floating point"),
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
        search(queries, torch.randn(30, 4), 2)


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


@pytest.mark.parametrize("bf16_screen", [False, True])
@pytest.mark.parametrize("score", SCORES)
def test_largest_allocation_is_one_block_whatever_the_corpus_size(score, bf16_screen):
    generator = torch.Generator().manual_seed(6)
    queries = torch.randn(64, 16, generator=generator)
    largest = {}
    for num_docs in (2_000, 20_000):
        corpus = torch.randn(num_docs, 16, generator=generator)
        with LargestNewTensor() as recorder:
            search(
                queries, corpus, 5, score=score, query_chunk_size=32, corpus_chunk_size=256,
                bf16_screen=bf16_screen,
            )
        largest[num_docs] = recorder.largest_bytes
    # The biggest thing ever allocated is the float32 score block (32 x 256 x 4 bytes = 32 KiB),
    # for a 2,000-row corpus and a 10 times larger one alike; the full score matrix would be
    # 64 x 20,000 x 4 bytes = 5 MB.
    assert largest == {2_000: 32 * 256 * 4, 20_000: 32 * 256 * 4}


# ---- GPU ---------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("score", SCORES)
def test_cuda_matches_cpu(score):
    generator = torch.Generator().manual_seed(7)
    queries = torch.randn(50, 32, generator=generator)
    corpus = torch.randn(3_000, 32, generator=generator)
    cpu_scores, cpu_indices = search(queries, corpus, 10, score=score, corpus_chunk_size=700)
    gpu_scores, gpu_indices = search(queries, corpus.cuda().half(), 10, score=score, corpus_chunk_size=700)
    expected_scores, expected_indices = brute_force(queries, corpus.half().float(), 10, score)
    assert gpu_indices.device.type == "cuda"
    assert torch.equal(gpu_indices.cpu(), expected_indices)
    torch.testing.assert_close(gpu_scores.cpu().double(), expected_scores, rtol=1e-4, atol=1e-4)
    assert torch.equal(cpu_indices, brute_force(queries, corpus, 10, score)[1])
