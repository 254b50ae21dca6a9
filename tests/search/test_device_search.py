"""The device way's cost, held (minisbert/search/fast/device.py): a fixed number of kernel launches and one
wait for the host a search, at any query count; and its fallback to the plain loop, rare on random
rows and exact where ties crowd the kept rows. (That its answers are the plain loop's bits on every
kind of corpus is tests/search/test_search_property.py's property: both device ways are among the ways it
forces.)

What is counted. Torch's profiler (ProfilerActivity.CPU) records every aten operator a search calls;
those at the top level (no aten operator above them) are what the search asks of the device, each
one or a few kernels on a GPU. A launch is a top-level operator that computes: views (slice, select,
transpose, unsqueeze, expand, ...), allocations (empty) and conversions that copy nothing (`to` of a
tensor already so) launch nothing and are not counted. A wait is an operator that reads a device
value on the host: `item` (float(t), int(t), `if t:`), `is_nonzero`, `nonzero` (and the boolean
indexing that calls it) and `masked_select`. (`.cpu()` and `.tolist()` wait on a GPU too but are not
seen on a CPU; bench/gpu.py counts a GPU's waits with torch's sync debug mode.) The way runs forced on
a CPU (`way="device"`): the same operators it launches on a GPU, where on a CPU the float16 screen
takes one more (its float16 values widened to float32, since torch's CPU product has no float32
accumulation of float16).
"""

import math

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from minisbert.search.fast import device
from minisbert.search.fast.tuning import DEVICE_BLOCK_ENTRIES
from minisbert.search import WAYS, prepare_corpus, search
from minisbert.search import inputs as search_inputs
from minisbert.search.inputs import check_inputs

VIEWS = {"aten::" + name for name in ("slice", "select", "numpy_T", "t", "transpose", "flatten", "unflatten",
                                        "unsqueeze", "squeeze", "expand", "expand_as", "view", "as_strided",
                                        "alias", "detach", "detach_", "lift_fresh", "empty", "permute", "unbind",
                                        "_unsafe_view", "reshape", "split")}
WAITS = {"aten::" + name for name in ("item", "_local_scalar_dense", "is_nonzero", "nonzero", "masked_select")}
DIM = 384  # all-MiniLM-L6-v2's: the exact scores' fixed-order float64 sum takes ceil(log2 384) = 9 additions
LEVELS = math.ceil(math.log2(DIM))
# Launches a search, besides the LEVELS additions of each fixed-order float64 sum (common/similarity.py's
# `fixed_sum`: the contract's exact scores; rows as given for cosine sum their norms so too, for their
# unit rows). Prepared rows: the product, a top-K, the kept rows sorted, gathered, scored exactly
# (conversions, products, a conversion back) and ranked (a sort, two gathers), the proof (a gap, its
# bound, a comparison) and the wait (`any`). Rows as given add their norms, their checks and, for
# cosine, the exact unit rows; euclidean's proof takes square roots (search/bounds.py's `Bounds`); dot's
# and euclidean's bound on the rows' norms adds what squares flushed to zero may hide (`raw_reach`).
LAUNCHES = {  # (score, form, way): (launches besides the sums, fixed-order sums)
    ("cosine", "prepared", "device"): (19, 1),
    ("dot", "prepared", "device"): (19, 1),
    ("euclidean", "prepared", "device"): (50, 1),
    ("cosine", "prepared", "device, half"): (21, 1),  # on a GPU one fewer (no widening)
    ("cosine", "as given", "device"): (36, 2),
    ("dot", "as given", "device"): (33, 1),
    ("euclidean", "as given", "device"): (62, 1),
}
EXTRA_BLOCK_LAUNCHES = 3  # each block past the first: its product, its top-K, its rows offset
MERGE_LAUNCHES = 4  # the blocks' top-Ks joined (values, rows), one top-K of them, its rows gathered


def launches_and_waits(call) -> tuple[list, list]:
    """The names of the launches and of the waits of `call()` (the module docstring says which)."""
    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        call()
    launches, waits = [], []
    for event in profiled.events():
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if not event.name.startswith("aten::"):
            continue
        if event.name in WAITS and (parent is None or parent.name not in WAITS):
            waits.append(event.name)  # item calls _local_scalar_dense: one wait
        copies = any(child.name.startswith("aten::") for child in event.cpu_children)
        if parent is None and event.name not in VIEWS and (event.name != "aten::to" or copies):
            launches.append(event.name)
    return launches, waits


def forced_run(queries, corpus, score: str, way: str, corpus_chunk_size=None):
    """The way's runner (search/ways.py's WAYS) on checked inputs, as `search` calls it (its device blocks),
    after one search that made what a prepared corpus keeps (its largest norm, its float16 copy)."""
    search(queries, corpus, 10, score=score, way=way)
    blocks = corpus_chunk_size or DEVICE_BLOCK_ENTRIES // min(1024, queries.shape[0])  # as `search` sizes them
    inputs = check_inputs(queries, corpus, 10, score, 1024, blocks, None)
    run = next(runner for name, _, _, runner in WAYS if name == way)
    return lambda: run(inputs)


@pytest.mark.parametrize("num_queries", [1, 16, 1000])
def test_a_device_search_launches_a_fixed_number_of_kernels_and_waits_once(num_queries, one_thread):
    generator = torch.Generator().manual_seed(num_queries)
    corpus = torch.randn(3000, DIM, generator=generator)
    queries = torch.randn(num_queries, DIM, generator=generator)
    for (score, form, way), (fixed, sums) in LAUNCHES.items():
        searched = corpus if form == "as given" else prepare_corpus(corpus, score, screen=False)
        launches, waits = launches_and_waits(forced_run(queries, searched, score, way))
        assert len(launches) == fixed + sums * LEVELS, (score, form, way, sorted(launches))
        assert waits == ["aten::is_nonzero"], (score, form, way, waits)  # `unproved.any()`, read by `if`


def test_each_block_past_the_first_adds_three_launches(one_thread):
    generator = torch.Generator().manual_seed(5)
    corpus, queries = torch.randn(1000, DIM, generator=generator), torch.randn(16, DIM, generator=generator)
    prepared = prepare_corpus(corpus, "cosine", screen=False)
    for way in ("device", "device, half"):
        fixed, sums = LAUNCHES[("cosine", "prepared", way)]
        launches, waits = launches_and_waits(forced_run(queries, prepared, "cosine", way, corpus_chunk_size=300))
        blocks = 4  # 1000 rows in blocks of 300
        assert len(launches) == fixed + sums * LEVELS + (blocks - 1) * EXTRA_BLOCK_LAUNCHES + MERGE_LAUNCHES, launches
        assert len(waits) == 1


def unproved_share(queries, corpus, way: str) -> float:
    inputs = check_inputs(queries, corpus, 10, "cosine", 1024, None, None)
    run = device.search_device_half if way == "device, half" else device.search_device
    return float(run(inputs)[2].float().mean())


def test_the_fallback_is_rare_on_random_rows(one_thread):
    """Random unit rows (20,000 x 64) and 200 queries, half of them corpus rows: every query is proved
    by both screens, so none falls back to the plain loop (the float16 screen's 2E, about 0.002 at
    d = 64, is far below the gap between a query's 10th and 58th best there)."""
    generator = torch.Generator().manual_seed(0)
    corpus = torch.randn(20_000, 64, generator=generator)
    queries = torch.cat([corpus[:100], torch.randn(100, 64, generator=generator)])
    prepared = prepare_corpus(corpus, "cosine", screen=False)
    for way in ("device", "device, half"):
        assert unproved_share(queries, prepared, way) == 0.0, way


def test_ties_crowding_the_kept_rows_fall_back_and_stay_exact(one_thread):
    """80 copies of one row, more than k + 48 kept: the screen cannot prove which of the tied rows
    are the top k, the query falls back to the plain loop, and the answer is its bits (ties by row)."""
    generator = torch.Generator().manual_seed(1)
    corpus = torch.randn(2000, 32, generator=generator)
    corpus[100:180] = corpus[7]
    queries = corpus[[7, 8]]
    prepared = prepare_corpus(corpus, "cosine", screen=False)
    expected = search(queries, prepared, 10, way="plain")
    for way in ("device", "device, half"):
        inputs = check_inputs(queries, prepared, 10, "cosine", 1024, None, None)
        run = device.search_device_half if way == "device, half" else device.search_device
        assert run(inputs)[2].tolist() == [True, False], way
        found = search(queries, prepared, 10, way=way)
        assert torch.equal(found[1], expected[1]) and torch.equal(found[0].view(torch.int32),
                                                                  expected[0].view(torch.int32)), way


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_a_device_search_waits_for_the_host_once(one_thread):
    """On a GPU the waits are counted by torch.cuda's sync debug mode (a warning per synchronising call,
    `.cpu()` and `.tolist()` too): the way's runner, over 1, 16 and 1,000 queries, waits once, for
    every score."""
    generator = torch.Generator().manual_seed(2)
    corpus = torch.randn(3000, DIM, generator=generator).cuda()
    for num_queries in (1, 16, 1000):
        queries = torch.randn(num_queries, DIM, generator=generator).cuda()
        for (score, form, way), _ in LAUNCHES.items():
            searched = corpus if form == "as given" else prepare_corpus(corpus, score, screen=False)
            waits = device.host_waits(forced_run(queries, searched, score, way))
            assert len(waits) == 1, (num_queries, score, form, way, waits)


@pytest.mark.parametrize("way", ["device", "device, half"])
def test_at_k_equal_to_n_the_exact_scoring_is_done_in_pieces(way, monkeypatch):
    """k = N keeps every row of every query. Scored all at once, the exact scores would take
    Q x N x d float64 numbers (96 queries over 70,000 rows of d = 384: 20 GB); the device way
    scores DEVICE_RESCORE_ENTRIES of them at a time. Here that budget is made small (2^16, where the
    whole would be 16 x 2,000 x 384 = 12.3M), each scoring is held to it, and the answer is the plain
    loop's bits."""
    generator = torch.Generator().manual_seed(3)
    corpus, queries = torch.randn(2000, DIM, generator=generator), torch.randn(16, DIM, generator=generator)
    prepared = prepare_corpus(corpus, "cosine", screen=False)
    plain_scores, plain_indices = search(queries, prepared, corpus.shape[0], way="plain")
    monkeypatch.setattr(device, "DEVICE_RESCORE_ENTRIES", 2**16)
    largest = []
    exact_scores = search_inputs.exact_scores  # the rescoring every fast way ends in (`exact_top_k`)
    monkeypatch.setattr(search_inputs, "exact_scores", lambda q, rows, score: largest.append(rows.numel())
                        or exact_scores(q, rows, score))
    scores, indices = search(queries, prepared, corpus.shape[0], way=way)
    assert torch.equal(indices, plain_indices) and torch.equal(scores, plain_scores)
    assert largest and max(largest) <= 2**16, max(largest)


def test_the_float16_screen_is_bounded_for_the_rows_dimension():
    """half_screen_error(d, |c|max) grows with d, the number of products a score adds; a search of 3
    queries over rows of d = 384 is screened with the bound for 384 (the query matrix's two sizes are
    easily swapped, and its 3 would give a bound too small to prove anything by)."""
    from minisbert.search.bounds import half_screen_error

    prepared = prepare_corpus(torch.randn(100, DIM, generator=torch.Generator().manual_seed(4)), "cosine", screen=False)
    inputs = check_inputs(torch.randn(3, DIM), prepared, 5, "cosine", 1024, None, None)
    assert half_screen_error(3, 1.0) < half_screen_error(DIM, 1.0)  # the swap would matter
    assert device._HalfScreen(inputs).error == half_screen_error(DIM, device.largest_norm(prepared))


@pytest.mark.parametrize("score", ["cosine", "dot", "euclidean"])
def test_large_rows_as_given_are_proved_not_sent_to_the_plain_loop(score, one_thread):
    """Rows and queries of norm about 4e12, as given: euclidean scores near -(8e12)² = -6.4e25 and dot
    scores near 1.6e25 lie far inside float32 (3.4e38), so the device way proves every query itself.
    A fallback keeps the plain loop's bits and loses the speed, so only the count can show a check of
    "near float32's limit" that is too strict (a cube for the square would put 5e38 past the limit)."""
    generator = torch.Generator().manual_seed(7)
    corpus = torch.randn(3000, 16, generator=generator) * 1e12
    queries = torch.randn(5, 16, generator=generator) * 1e12
    *_, choice = search(queries, corpus, 5, score=score, way="device", return_way=True)
    assert choice.fell_back == 0
