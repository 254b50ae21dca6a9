"""Tests for minisbert/fast/device_search.py, the search that runs on CUDA devices.

"Correct" means: the same rows in the same order as the plain `chunked_search` (minisbert/retrieval.py),
ties included, whatever the chunk sizes, with scores equal up to float32 rounding (exactly equal
where every score is exact in float32); the same errors, with the same messages, for the same bad
rows; and no read back to the host per chunk: the number of host reads is the same for a corpus
of one chunk as for one of many.

`device_search` runs on any device, so all of this is checked on the CPU. What only a CUDA device
has (streaming a CPU corpus through pinned memory on a second stream) is checked by the tests at the
end, which are skipped without one.
"""

import dataclasses
import warnings

import pytest
import torch

from minisbert.fast import device_search as device_module
from minisbert.fast import retrieval as fast_retrieval
from minisbert.fast.device_search import device_search
from minisbert.retrieval import chunked_search
from minisbert.search_inputs import check_inputs, default_corpus_chunk_size

from .host_reads import HostReads
from .test_retrieval import AWKWARD_CHUNKINGS, SCORES, brute_force, ids_problem, tied_problem, two_norm_embeddings
from .tolerances import search_scores_apart

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def both_searches(queries, corpus, k, score, query_chunk_size, corpus_chunk_size, ids=None, device=None):
    """(plain, device): each the (scores, indices) `search` would return."""
    ids = ids or {}
    inputs = check_inputs(
        queries, corpus, k, score, query_chunk_size, corpus_chunk_size,
        ids.get("query_ids"), ids.get("corpus_ids"), device,
    )
    return inputs.results(*chunked_search(inputs)), inputs.results(*device_search(inputs))


def assert_same_top_k(plain, device, problem=None, roundings=0):
    """The same rows; and the same scores where every score is exact in float32 (problem None), else,
    for problem = (queries, corpus, score), scores as far apart as two float32 computations of them may
    be (tests/tolerances.py's search_scores_apart): the device search sums the norms for cosine in float64,
    the plain path in float32, and on a GPU every sum is another kernel's. `roundings` as there. On a
    2-core Xeon (AVX-512 and AVX2 kernels) cosines came out 57 times inside the bound or more, dot
    products and distances bit for bit equal."""
    assert torch.equal(device[1].cpu(), plain[1].cpu())
    if problem is None:
        assert torch.equal(device[0].cpu(), plain[0].cpu())
        return
    queries, corpus, score = problem
    plain_scores, device_scores, rows = plain[0].cpu().double(), device[0].cpu().double(), plain[1].cpu()
    padding = rows == -1
    assert torch.equal(device_scores[padding], plain_scores[padding])
    bound = search_scores_apart(queries, corpus, rows, score, plain_scores, roundings)  # (Q, k)
    difference = (device_scores - plain_scores).abs()  # (Q, k)
    assert (difference <= bound)[~padding].all(), f"off by up to {float((difference / bound).max()):.3g} bounds"


# ---- the keys ------------------------------------------------------------------------------


def test_keys_order_by_score_then_lower_row_and_decode_back():
    # Ties, both zeros, infinities, the smallest and largest float32s, on either side of zero.
    values = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1e-45, -1e-45, 3.4e38, -3.4e38, torch.inf, -torch.inf]
    generator = torch.Generator().manual_seed(0)
    scores = torch.tensor(values)[torch.randint(0, len(values), (3, 200), generator=generator)]
    rows = torch.arange(1_000, 1_200)  # (200,) corpus rows of a later chunk
    keys = device_module._keys(scores.clone(), device_module.LOW_BITS - rows)  # (3, 200)
    # The order of the keys is the plain path's: a stable sort by score, larger first.
    expected = scores.argsort(dim=1, descending=True, stable=True)
    assert torch.equal(keys.argsort(dim=1, descending=True), expected)
    assert all(line.unique().numel() == 200 for line in keys)  # no two keys of a query are equal
    # Decoded: the scores (-0.0 read as +0.0) and the rows, with -inf as padding.
    decoded_scores, decoded_rows = device_module._decode(keys)
    assert torch.equal(decoded_scores, scores + 0.0)
    assert torch.equal(decoded_rows, torch.where(scores == -torch.inf, -1, rows.expand(3, -1)))
    assert device_module.NEG_INF_ORDERED == int(
        device_module._flip_negatives(torch.tensor(-torch.inf).view(torch.int32))
    )
    empty_scores, empty_rows = device_module._decode(torch.tensor([device_module.EMPTY_KEY]))
    assert empty_scores.tolist() == [-torch.inf] and empty_rows.tolist() == [-1]


# ---- the same top-k as the plain path ------------------------------------------------------


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize(
    "k, query_chunk_size, corpus_chunk_size",
    AWKWARD_CHUNKINGS + [
        (150, 23, 40),  # k > N: the whole corpus, ranked
        (7, 1024, 32768),  # the CUDA defaults: a single block here
    ],
)
def test_random_data_matches_plain_path(score, k, query_chunk_size, corpus_chunk_size):
    generator = torch.Generator().manual_seed(1)
    queries, corpus = torch.randn(23, 16, generator=generator), torch.randn(101, 16, generator=generator)
    plain, device = both_searches(queries, corpus, k, score, query_chunk_size, corpus_chunk_size)
    assert device[1].shape == (23, min(k, 101))
    assert_same_top_k(plain, device, (queries, corpus, score))


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("k", [1, 4, 20, 200])
@pytest.mark.parametrize("chunk_sizes", [(5, 17), (3, 4), (64, 64), (13, 7)])
def test_ties_go_to_the_lower_row_as_on_the_plain_path(score, k, chunk_sizes):
    queries, corpus = tied_problem(score, torch.Generator().manual_seed(2))
    plain, device = both_searches(queries, corpus, k, score, *chunk_sizes)
    assert_same_top_k(plain, device)
    assert torch.equal(device[1], brute_force(queries, corpus, k, score)[1])


def test_all_equal_scores_return_the_first_rows_in_order():
    plain, device = both_searches(torch.ones(3, 4), torch.ones(50, 4), 10, "dot", 2, 7)
    assert device[1].tolist() == [list(range(10))] * 3
    assert_same_top_k(plain, device)


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("chunk_sizes", [(5, 17), (17, 5), (64, 1000), (9, 13)])
def test_excluded_ids_match_plain_path(score, chunk_sizes):
    queries, corpus, ids = ids_problem(score, torch.Generator().manual_seed(3))
    plain, device = both_searches(queries, corpus, 12, score, *chunk_sizes, ids=ids)
    assert_same_top_k(plain, device)


@pytest.mark.parametrize("score", SCORES)
def test_too_few_rows_left_are_padded_as_on_the_plain_path(score):
    # Query 0's id matches corpus rows 0-2 and 5, so it has 2 rows left for k = 4; ids that
    # match nothing leave query 1 alone.
    generator = torch.Generator().manual_seed(4)
    corpus, queries = torch.randn(6, 4, generator=generator), torch.randn(2, 4, generator=generator)
    ids = {"query_ids": ["a", "z"], "corpus_ids": ["a", "a", "a", "b", "c", "a"]}
    plain, device = both_searches(queries, corpus, 4, score, 1, 4, ids=ids)
    assert device[1][0, 2:].tolist() == [-1, -1]
    padding = torch.inf if score == "euclidean" else -torch.inf
    assert device[0][0, 2:].tolist() == [padding, padding]
    assert_same_top_k(plain, device, (queries, corpus, score))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("score", SCORES)
def test_half_precision_corpus_matches_plain_path(dtype, score):
    generator = torch.Generator().manual_seed(5)
    queries = torch.randn(9, 32, generator=generator)
    corpus = torch.randn(70, 32, generator=generator).to(dtype)
    plain, device = both_searches(queries, corpus, 5, score, 4, 17)
    assert device[0].dtype == torch.float32
    assert_same_top_k(plain, device, (queries, corpus, score))


def test_empty_query_set_gives_empty_results():
    plain, device = both_searches(torch.zeros(0, 4), torch.randn(10, 4), 3, "dot", 4, 3)
    assert device[0].shape == device[1].shape == (0, 3)


# ---- the same errors -----------------------------------------------------------------------


def error_message(search_function, queries, corpus, score, corpus_chunk_size=64):
    inputs = check_inputs(queries, corpus, 3, score, 16, corpus_chunk_size, None, None, None)
    with pytest.raises(ValueError) as error:
        search_function(inputs)
    return str(error.value)


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), -float("inf"), 1e30])
def test_a_bad_row_in_a_later_chunk_is_named_as_on_the_plain_path(score, bad_value):
    # A row of 1e30 is finite, and so is its norm, but not its squared norm: bad for euclidean
    # only. With cosine and dot it is searched like any other.
    queries, corpus = torch.randn(5, 384), torch.randn(300, 384)
    corpus[250, 7:] = bad_value
    if score != "euclidean" and bad_value == 1e30:
        # The plain path measures the row's norm again after dividing it by its largest entry, and
        # multiplies back (similarity.row_norms): two roundings more for cosine.
        plain, device = both_searches(queries, corpus, 3, score, 16, 64)
        assert_same_top_k(plain, device, (queries, corpus, score), roundings=2)
        return
    message = error_message(device_search, queries, corpus, score)
    assert message.startswith("corpus row 250 contains NaN or inf")
    assert message == error_message(chunked_search, queries, corpus, score)


@pytest.mark.parametrize("score", ["dot", "euclidean"])
def test_the_first_failing_chunk_decides_the_error_as_on_the_plain_path(score):
    # Query row 2 and corpus row 70 could score beyond float32 (see test_retrieval.py's
    # test_scores_that_could_overflow_are_refused), and row 200 holds NaN: the plain path stops
    # at row 70's chunk. With a NaN in row 20 too, it stops at the NaN.
    entry = 1e18 if score == "dot" else 5e17
    queries, corpus = torch.randn(4, 384), torch.randn(260, 384)
    queries[2], corpus[70], corpus[200, 5] = entry, -entry, float("nan")
    messages = [error_message(f, queries, corpus, score) for f in (device_search, chunked_search)]
    assert "queries row 2 (norm" in messages[0] and "corpus row 70 (norm" in messages[0]
    assert messages[0] == messages[1]
    corpus[20, 5] = float("nan")
    messages = [error_message(f, queries, corpus, score) for f in (device_search, chunked_search)]
    assert messages[0].startswith("corpus row 20 contains NaN")
    assert messages[0] == messages[1]


@pytest.mark.parametrize("score", ["cosine", "dot"])
@pytest.mark.parametrize("entry, reruns", [(1e30, 1), (1e-30, 1), (0.0, 1), (1.0, 0)])
def test_float64_norms_only_when_a_float32_norm_is_not_to_be_trusted(monkeypatch, score, entry, reruns):
    # Rows of 1e30 square to inf in float32, rows of 1e-30 to 0 (norm below 2^-60), as a row of
    # zeros does: the search then runs again with float64 norms, and finds what the plain path
    # finds. Ordinary rows keep their float32 norms: one run.
    calls = []
    unwatched = device_module.device_search

    def watched(inputs, float64_norms=False):
        calls.append(float64_norms)
        return unwatched(inputs, float64_norms)

    monkeypatch.setattr(device_module, "device_search", watched)
    generator = torch.Generator().manual_seed(13)
    queries, corpus = torch.randn(5, 64, generator=generator), torch.randn(300, 64, generator=generator)
    corpus[250] *= entry
    inputs = check_inputs(queries, corpus, 5, score, 16, 64, None, None, None)
    plain = inputs.results(*chunked_search(inputs))
    device = inputs.results(*device_module.device_search(inputs))  # through the watch
    # As in test_a_bad_row_in_a_later_chunk_is_named_as_on_the_plain_path: the plain path
    # measures such a row twice, two roundings more for cosine.
    assert_same_top_k(plain, device, (queries, corpus, score), roundings=2)
    assert calls == [False] + [True] * reruns


def test_default_corpus_chunks_on_a_gpu_hold_blocks_of_2_to_the_25_scores():
    # Only the device objects are looked at, so this runs without a GPU.
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert default_corpus_chunk_size(1, 384, cpu, 1024, cpu) == 8192
    assert default_corpus_chunk_size(1, 384, cpu, 1024, cuda) == 32768  # streamed
    assert default_corpus_chunk_size(1, 384, cuda, 1024, cuda) == 2**29 // (4 * 384)  # 512 MB of rows
    assert default_corpus_chunk_size(1000, 384, cuda, 1024, cuda) == 2**25 // 1000
    assert default_corpus_chunk_size(5000, 384, cuda, 1024, cuda) == 32768
    assert default_corpus_chunk_size(1, 8192, cuda, 1024, cuda) == 32768  # never below


def test_corpora_beyond_32_bit_row_numbers_are_refused(monkeypatch):
    monkeypatch.setattr(device_module, "MAX_CORPUS_ROWS", 9)
    inputs = check_inputs(torch.randn(2, 4), torch.randn(10, 4), 3, "dot", 8, 4, None, None, None)
    with pytest.raises(ValueError, match="corpus has 10 rows; the device search .* at most 9"):
        device_search(inputs)


# ---- no host reads per chunk ---------------------------------------------------------------

def test_host_read_spy_sees_what_the_plain_path_does():
    # The spy catches the reads the plain path makes at every chunk (checks, excluded pairs).
    queries, corpus, ids = ids_problem("dot", torch.Generator().manual_seed(6))
    inputs = check_inputs(queries, corpus, 5, "dot", 16, 20, ids["query_ids"], ids["corpus_ids"], None)
    with HostReads() as spy:
        chunked_search(inputs)
    assert len(spy.calls) > 11 * 3  # 11 chunks, each with several reads


@pytest.mark.parametrize("score", SCORES)
def test_host_reads_do_not_grow_with_the_number_of_chunks(score):
    queries, corpus, ids = ids_problem(score, torch.Generator().manual_seed(7))
    calls = {}
    for corpus_chunk_size in (1000, 20, 3):  # 1, 11 and 68 chunks
        inputs = check_inputs(
            queries, corpus, 5, score, 16, corpus_chunk_size, ids["query_ids"], ids["corpus_ids"], None
        )
        with HostReads() as spy:
            device_search(inputs)
        calls[corpus_chunk_size] = spy.calls
    # Before the loop, the excluded pairs' grouping (unique_consecutive, tolist); after it, the
    # checks (tolist). Nothing in between.
    assert calls[1000] == calls[20] == calls[3] == ["unique_consecutive", "tolist", "tolist"]


def test_fast_search_hands_cuda_searches_to_the_device_search(monkeypatch):
    inputs = check_inputs(torch.randn(3, 4), torch.randn(10, 4), 2, "dot", 8, 4, None, None, None)
    handed = []
    monkeypatch.setattr(fast_retrieval, "device_search", lambda given: handed.append(given) or "done")
    on_cuda = dataclasses.replace(inputs, device=torch.device("cuda"))
    assert fast_retrieval.fast_search(on_cuda, bf16_screen=True) == "done"
    assert handed == [on_cuda]
    fast_retrieval.fast_search(inputs, bf16_screen=None)  # a CPU search stays on the CPU path
    assert handed == [on_cuda]


# ---- CUDA ------------------------------------------------------------------------------------


def cuda_corpora(corpus):
    """The ways a corpus can reach a CUDA search: streamed from pageable or pinned CPU memory, or
    stored on the GPU in float32, float16 or bfloat16."""
    return {
        "cpu-pageable": corpus,
        "cpu-pinned": corpus.pin_memory(),
        "cpu-pageable-float16": corpus.half(),
        "cuda-float32": corpus.cuda(),
        "cuda-float16": corpus.half().cuda(),
        "cuda-bfloat16": corpus.bfloat16().cuda(),
    }


@needs_cuda
@pytest.mark.parametrize("score", SCORES)
def test_cuda_matches_plain_path_on_the_cpu_for_every_corpus_placement(score):
    # Multiples of 1/8 with 24 dimensions are exact in float16 and bfloat16 too, so every
    # placement scores exactly what the CPU does.
    queries, corpus, ids = ids_problem(score, torch.Generator().manual_seed(8))
    plain, _ = both_searches(queries, corpus, 12, score, 16, 20, ids=ids)
    for name, placed in cuda_corpora(corpus).items():
        _, device = both_searches(queries, placed, 12, score, 16, 20, ids=ids, device="cuda")
        assert device[1].device.type == "cuda", name
        assert_same_top_k(plain, device)


@needs_cuda
@pytest.mark.parametrize("placement", ["cpu-pageable", "cpu-pinned", "cuda-float16"])
def test_cuda_synchronisations_do_not_grow_with_the_number_of_chunks(placement):
    queries, corpus, ids = ids_problem("dot", torch.Generator().manual_seed(9))
    corpus = cuda_corpora(corpus)[placement]
    counts = {}
    # The first call of set_sync_debug_mode in a process warns too (seen on an H200, torch 2.11):
    # made here, uncounted.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.cuda.set_sync_debug_mode("warn")
        torch.cuda.set_sync_debug_mode("default")
    for corpus_chunk_size in (1000, 3):  # 1 and 68 chunks
        inputs = check_inputs(
            queries, corpus, 5, "dot", 16, corpus_chunk_size, ids["query_ids"], ids["corpus_ids"], "cuda"
        )
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                device_search(inputs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts[corpus_chunk_size] = sum("synchroniz" in str(w.message) for w in caught)
    # A few before the loop (grouping the excluded pairs) and one after it (the checks).
    assert counts[1000] == counts[3]


@needs_cuda
def test_streaming_keeps_two_chunks_on_the_gpu_whatever_the_corpus_size():
    # A pageable CPU corpus of 1 MB chunks: if the copies ran ahead of the search, the GPU would
    # fill with chunks waiting to be scored.
    generator = torch.Generator().manual_seed(10)
    queries = torch.randn(512, 64, generator=generator)
    peaks = {}
    for num_chunks in (10, 40):
        corpus = torch.randn(num_chunks * 4096, 64, generator=generator)
        inputs = check_inputs(queries, corpus, 10, "dot", 512, 4096, None, None, "cuda")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        device_search(inputs)
        torch.cuda.synchronize()
        peaks[num_chunks] = torch.cuda.max_memory_allocated()
    assert peaks[40] <= peaks[10] + 512 * 1024  # half a chunk to spare


@needs_cuda
def test_search_on_cuda_from_a_pinned_cpu_corpus_returns_cuda_tensors():
    from minisbert.search import search

    generator = torch.Generator().manual_seed(11)
    queries, corpus = torch.randn(30, 32, generator=generator), torch.randn(5_000, 32, generator=generator)
    scores, indices = search(queries, corpus.pin_memory(), 10, score="dot", device="cuda", corpus_chunk_size=700)
    assert scores.device.type == indices.device.type == "cuda"
    assert torch.equal(indices.cpu(), brute_force(queries, corpus, 10, "dot")[1])
