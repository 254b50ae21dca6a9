"""One property of the search, on hundreds of small cases drawn from a seed: every way of
minisbert/search/ways.py, forced, returns the plain loop's indices and scores bit for bit (or refuses
with the plain loop's message), and the plain loop returns what exact arithmetic says it must.

A case draws a corpus kind (random, or built to tie or to round badly), the dtype of the corpus and
of the queries (each floating dtype a user may pass, torch's or numpy's), a score, a query count
around each threshold of minisbert/search/fast/tuning.py, k (1, a few, around N - KEPT_BEYOND_K, past N),
chunk sizes, ids to leave out or none, the way spans are multiplied, whether the int8 screens give
up where too many rows pass them (as tuned) or never, and the corpus's form (as given, prepared
with an int8 copy, saved and loaded). Spans are shortened (`short_spans`) so that corpora of a few
hundred rows cross many of them.

The reference (`check_exact_answer`) shares no code with minisbert: numpy and Python's math.fsum.
What it can know exactly, and why, is said where it is computed: a score is fixed by exact
arithmetic except where the float64 sums that minisbert/search/plain.py's definition names may round
to either of two float32 numbers; there it allows both, and ranks with the one the plain loop gave.

A failure names its case; `check_case(draw_case(seed), folder)` runs that case alone.
"""

import contextlib
import math
from collections import Counter
from dataclasses import dataclass, field
from unittest import mock

import numpy as np
import pytest
import torch

from minisbert.search import plain
from minisbert.search import ways as search_module
from minisbert.search.fast import int8_blocks, int8_rows, screen, span_product
from minisbert.search.fast import spans_blocks as fast_retrieval
from minisbert.search.fast.tuning import FEW_QUERIES, FEW_QUERIES_INT8, KEPT_BEYOND_K, SCREENED_FEW_QUERIES
from minisbert.search import WAY_NAMES, load_corpus, prepare_corpus, recorded_ways, search

SEED = 1000
CASES = 500

KINDS = ("random", "small integers", "multiples", "near duplicates", "zero rows", "norms across the range",
         "a row near float32's limit", "a row beyond float32", "scores beyond float32")
KIND_ODDS = (3, 3, 3, 3, 3, 3, 1, 1, 1)  # the last three turn on one row: drawn less often
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, np.float16, np.float32, np.float64)
SCORES = ("cosine", "dot", "euclidean")
FORMS = ("as given", "prepared", "saved and loaded")
# No queries (the corpus is still checked); around each threshold: one query and from
# SCREENED_FEW_QUERIES the int8 copy screens spans; up to FEW_QUERIES_INT8 (where the int8 copy's
# product grows from 64 columns to 128) and FEW_QUERIES spans.
QUERY_COUNTS = sorted({0, 1, 2, SCREENED_FEW_QUERIES - 1, SCREENED_FEW_QUERIES, SCREENED_FEW_QUERIES + 1,
                       FEW_QUERIES_INT8 - 1, FEW_QUERIES_INT8, FEW_QUERIES_INT8 + 1,
                       FEW_QUERIES - 1, FEW_QUERIES, FEW_QUERIES + 1, 200})
F32_MAX = float(np.finfo(np.float32).max)
U64 = 2.0**-53  # float64's unit roundoff: a float64 operation is off by at most this share of its result


@pytest.fixture
def short_spans(monkeypatch):
    """Spans of a few groups of rows, so that the few-query ways cross many spans (and their growth)
    on a corpus of a few hundred rows, corpora in other dtypes are copied a few rows at a time, and
    way=None's choice of "one span" stops at 200 rows."""
    monkeypatch.setattr(fast_retrieval, "FIRST_SPAN_ROWS", 64)
    monkeypatch.setattr(fast_retrieval, "SPAN_ROWS", 5 * 64)
    monkeypatch.setattr(fast_retrieval, "PIECE_BYTES", 4 * 24 * 128)
    monkeypatch.setattr(span_product, "PIECE_ENTRIES", 80)
    monkeypatch.setattr(search_module, "SMALL_CORPUS_ROWS", 200)
    monkeypatch.delenv(search_module.WAY_VARIABLE, raising=False)


# ---- drawing a case ------------------------------------------------------------------------


@dataclass
class Case:
    seed: int
    kind: str
    score: str
    corpus_dtype: object
    query_dtype: object
    form: str
    k: int
    query_chunk_size: int
    corpus_chunk_size: int | None
    span_product: str
    screens: str  # "as tuned", or "kept": the int8 screens never give up for too many candidates
    corpus: object = field(repr=False)  # (N, d) torch tensor or numpy array, as the search is given it
    queries: object = field(repr=False)  # (Q, d)
    query_ids: list | None = field(repr=False)
    corpus_ids: list | None = field(repr=False)

    def __str__(self):
        (num_docs, dim), num_queries = self.corpus.shape, self.queries.shape[0]
        return (f"case seed={self.seed}: {self.kind}, corpus {dtype_name(self.corpus_dtype)}, queries "
                f"{dtype_name(self.query_dtype)}, score={self.score}, form={self.form}, k={self.k}, "
                f"{num_queries} queries, N={num_docs}, d={dim}, chunks {self.query_chunk_size} x "
                f"{self.corpus_chunk_size}, ids {'given' if self.query_ids else 'none'}, span product "
                f"{self.span_product}, screens {self.screens}")

    def arguments(self):
        return {"k": self.k, "score": self.score, "query_chunk_size": self.query_chunk_size,
                "corpus_chunk_size": self.corpus_chunk_size, "query_ids": self.query_ids,
                "corpus_ids": self.corpus_ids}


def dtype_name(dtype):
    return str(dtype) if isinstance(dtype, torch.dtype) else f"numpy.{np.dtype(dtype).name}"


def draw_case(seed: int) -> Case:
    """One case, all of it drawn from `seed`."""
    rng = np.random.default_rng(seed)
    kind, score = str(rng.choice(KINDS, p=np.divide(KIND_ODDS, sum(KIND_ODDS)))), str(rng.choice(SCORES))
    corpus_dtype, query_dtype = DTYPES[rng.integers(len(DTYPES))], DTYPES[rng.integers(len(DTYPES))]
    num_docs, dim = int(rng.integers(20, 400)), int(rng.choice([2, 3, 5, 8, 24]))
    num_queries = int(rng.choice(QUERY_COUNTS))
    corpus = draw_rows(kind, rng, num_docs, dim, corpus_dtype, score)
    # Half the queries are corpus rows (exact ties with themselves and their copies), half fresh.
    queries = draw_rows(kind, rng, num_queries, dim, query_dtype, score)
    copies = rng.random(num_queries) < 0.5
    queries[copies] = corpus[rng.integers(0, num_docs, int(copies.sum()))]
    if kind == "a row near float32's limit":
        # A norm (squared, for euclidean) near float32's largest number, and queries small enough that
        # every score fits: accepted, though past what the fast ways take without the plain checks.
        corpus[rng.integers(num_docs)] = (1.1e19 if score == "euclidean" else 0.9 * F32_MAX) / math.sqrt(dim)
        if score != "cosine" and num_queries:
            queries *= 0.4 / max(np.linalg.norm(queries, axis=1).max(), 1e-30)
    if kind == "a row beyond float32":  # an entry finite in float64 but not in float32: refused, the row named
        side = queries if rng.random() < 0.3 and num_queries else corpus
        side[rng.integers(side.shape[0]), rng.integers(dim)] = 1e39
    if kind == "scores beyond float32" and num_queries:
        # Norms whose squares fit float32 but whose product (dot) or sum, squared (euclidean), does not.
        corpus[rng.integers(num_docs)] = 1.5e19 / math.sqrt(dim)
        queries[rng.integers(num_queries)] = -1.5e19 / math.sqrt(dim)
    # Half the time a few (the screens rule rows out), else k = N - KEPT_BEYOND_K (a fast way keeps every
    # row) or beside it, N, or past N (the whole corpus, ranked).
    if rng.random() < 0.5:
        k = int(rng.choice([1, rng.integers(2, 12)]))
    else:
        k = int(rng.choice([num_docs - KEPT_BEYOND_K - 1, num_docs - KEPT_BEYOND_K, num_docs - KEPT_BEYOND_K + 1,
                            num_docs, num_docs + 1]))
    query_ids = corpus_ids = None
    if rng.random() < 0.5:  # some ids repeat: a query may leave out several rows
        corpus_ids = [f"d{row % max(1, num_docs - 5)}" for row in range(num_docs)]
        query_ids = [str(rng.choice(corpus_ids)) if rng.random() < 0.7 else f"q{row}" for row in range(num_queries)]
    ways = [name for name in span_product.WAYS if span_product.runs(name, torch.device("cpu"))]
    return Case(seed, kind, score, corpus_dtype, query_dtype, str(rng.choice(FORMS)), max(1, k),
                int(rng.choice([1024, 64, 50, 20])), rng.choice([None, 37, 64, 100, 300]),
                str(rng.choice(ways)), str(rng.choice(["as tuned", "kept"])), as_dtype(corpus, corpus_dtype),
                as_dtype(queries, query_dtype), query_ids, corpus_ids)


def draw_rows(kind, rng, rows, dim, dtype, score) -> np.ndarray:
    """(rows, dim) float64 values of a kind, before they are cast to the dtype the search is given."""
    if kind in ("small integers", "multiples"):
        values = rng.integers(-3, 4, (rows, dim)).astype(np.float64)  # every dot product exact: many ties
        if kind == "multiples":  # 7 rows over and over, times 1 to 5: equal cosines
            values = values[np.arange(rows) % min(7, rows)] * rng.integers(1, 6, (rows, 1))
        return values
    values = rng.standard_normal((rows, dim))
    if kind == "near duplicates":  # pairs far closer than float32 rounding (float64 ones round to equal rows)
        values[1::2] = values[: rows // 2 * 2 : 2] * (1 + 1e-9 * rng.standard_normal((rows // 2, dim)))
    if kind == "zero rows":
        values[rng.random(rows) < 0.2] = 0.0
    if kind == "norms across the range":  # rows scaled by 10^e, from about the dtype's smallest numbers up
        if dtype in (torch.float16, np.float16):
            smallest, largest = -6, 3
        elif dtype in (torch.float64, np.float64):  # past float32's smallest: rounded to subnormals or 0
            smallest, largest = -60, 18 if score == "cosine" else 15
        else:
            smallest, largest = -40, 15
        values *= 10.0 ** rng.integers(smallest, largest + 1, (rows, 1))
    return values


def as_dtype(values: np.ndarray, dtype):
    with np.errstate(over="ignore"):  # 1e39 becomes inf in float32 and float16, as a user's cast makes it
        return values.astype(dtype) if not isinstance(dtype, torch.dtype) else torch.from_numpy(values).to(dtype)


# ---- the property --------------------------------------------------------------------------


def outcome(call):
    """What a search gives: ("numpy" or "torch", (Q, k) float32 scores, (Q, k) int64 rows), as numpy;
    the message of the ValueError it raises; None where the way cannot run here."""
    try:
        scores, indices = call()
    except ValueError as error:
        return None if "cannot run here" in str(error) else str(error)
    if isinstance(scores, np.ndarray):
        return "numpy", scores, indices
    return "torch", scores.numpy(), indices.numpy()


def same_bits(got, expected) -> bool:
    if isinstance(got, str) or isinstance(expected, str):
        return got == expected
    return (got[1].dtype == expected[1].dtype == np.float32
            and got[2].dtype == expected[2].dtype == np.int64 and np.array_equal(got[2], expected[2])
            and np.array_equal(got[1].view(np.int32), expected[1].view(np.int32)))


def searched_form(case: Case, folder):
    """The corpus in the case's form, or the message of the error preparing it raises."""
    if case.form == "as given":
        return case.corpus
    try:
        prepared = prepare_corpus(case.corpus, case.score, screen=True)
    except ValueError as error:
        return str(error)
    if case.form == "saved and loaded":
        prepared.save(folder / "corpus.safetensors")
        return load_corpus(folder / "corpus.safetensors", screen=True)
    return prepared


def check_case(case: Case, folder, ways_run: Counter | None = None, fell_back: Counter | None = None) -> None:
    """The property on one case (the module docstring); `ways_run` counts the ways that ran, `fell_back`
    the queries each way left to the plain loop."""
    with contextlib.ExitStack() as patches:
        patches.enter_context(mock.patch.object(span_product, "way", lambda *shape: case.span_product))
        if case.screens == "kept":  # these shares decide speed only; then a screen's bound alone decides
            for module, name in ((int8_rows, "MOST_CANDIDATES"), (screen, "MOST_OPENED"), (screen, "MOST_SCREENED")):
                patches.enter_context(mock.patch.object(module, name, 1.0))
        expected = outcome(lambda: search(case.queries, case.corpus, way="plain", **case.arguments()))
        check_exact_answer(case, expected)
        corpus = searched_form(case, folder)
        if isinstance(corpus, str):  # preparing refused the corpus: with the message the reference expects
            refusal = row_refusal(float32_values(case.corpus), "corpus", case.score)
            assert refusal is not None and corpus.startswith(refusal), f"{case}: preparing raised {corpus!r}"
            return
        for way in (None, *WAY_NAMES):
            try:
                with recorded_ways() as choices:
                    got = outcome(lambda: search(case.queries, corpus, way=way, **case.arguments()))
            except Exception as error:
                raise AssertionError(f"{case}, way={way}: raised {error!r}") from error
            if fell_back is not None and choices:
                fell_back[choices[-1].name] += choices[-1].fell_back
            if got is not None:
                # Bit for bit, signed zeros too: every way ends in the same exact rescoring of the same
                # float32 rows (search/inputs.py's `settle`), so only a wrong candidate or order changes a bit.
                assert same_bits(got, expected), f"{case}, way={way}: {difference(got, expected)}"
                # numpy for numpy queries and a numpy or prepared corpus, else torch (search's docstring)
                numpy_out = isinstance(case.queries, np.ndarray) and not isinstance(corpus, torch.Tensor)
                assert isinstance(got, str) or got[0] == ("numpy" if numpy_out else "torch"), f"{case}, way={way}"
                if ways_run is not None:
                    ways_run[way] += 1


def described(result) -> str:
    return f"raised {result!r}" if isinstance(result, str) else f"returned {result[0]} results {result[1].shape}"


def difference(got, expected) -> str:
    """Where two outcomes differ first, in words."""
    if isinstance(got, str) or isinstance(expected, str) or got[1].shape != expected[1].shape:
        return f"{described(got)}, the plain loop {described(expected)}"
    apart = (got[2] != expected[2]) | (got[1].view(np.int32) != expected[1].view(np.int32))
    query, slot = np.argwhere(apart)[0].tolist()
    return (f"query {query}, place {slot}: row {got[2][query, slot]} score {got[1][query, slot]!r}, the plain "
            f"loop's row {expected[2][query, slot]} score {expected[1][query, slot]!r}")


def test_every_way_returns_the_plain_loops_bits_and_the_plain_loop_the_exact_answer(short_spans, one_thread,
                                                                                   tmp_path):
    ways_run, seen, fell_back = Counter(), Counter(), Counter()
    for seed in range(SEED, SEED + CASES):
        case = draw_case(seed)
        # A fallback to the plain loop keeps the bits but loses the speed: a way may leave a query
        # unproved only where ties crowd its kept rows, or a row is past what it measures. Random
        # rows hold neither (continuous values, norms near 1), so there every query must be proved:
        # a screen or a proof that gives up too often fails here though its answers are right.
        check_case(case, tmp_path, ways_run, fell_back if case.kind == "random" else None)
        seen.update([case.kind, dtype_name(case.corpus_dtype), case.score, case.form])
    assert not +fell_back, f"queries of random cases left to the plain loop, by way: {dict(fell_back)}"
    # The draw reached every kind, dtype, score and form, and every way ran often (the int8 ways where
    # this CPU's int8 product is exact).
    assert set(seen) >= {*KINDS, *map(dtype_name, DTYPES), *SCORES, *FORMS}, seen
    cpu = torch.device("cpu")
    runs_here = {"spans, int8": int8_rows.int8_product_runs(8, cpu), "blocks, int8": int8_blocks.int8_blocks_exact(8)}
    assert min(ways_run[way] for way in (None, *WAY_NAMES) if runs_here.get(way, True)) >= CASES // 10, ways_run


# ---- the exact reference -------------------------------------------------------------------


def float32_values(embeddings) -> np.ndarray:
    """The (n, d) embeddings rounded to float32 by numpy (bfloat16, which numpy lacks, widened by torch:
    exactly), held as float64 numbers."""
    if isinstance(embeddings, torch.Tensor):
        embeddings = (embeddings.float() if embeddings.dtype == torch.bfloat16 else embeddings).numpy()
    with np.errstate(over="ignore"):
        return embeddings.astype(np.float32).astype(np.float64)


def fsum_norms(rows: np.ndarray) -> np.ndarray:
    """(n,) float64 norms: each float32 square is exact in float64, fsum rounds their sum once, the root once."""
    return np.array([math.sqrt(math.fsum(x * x for x in row)) for row in rows.tolist()])


def row_refusal(rows: np.ndarray, name: str, score: str) -> str | None:
    """How a search's message must begin where a float32 row is not finite or its norm (squared, for
    euclidean) lies beyond float32, naming the first such row; None where none is."""
    refused = ~(fsum_norms(rows) ** (2 if score == "euclidean" else 1) <= F32_MAX)  # NaN too
    return f"{name} row {int(np.argmax(refused))} contains NaN or inf" if refused.any() else None


def expected_refusal(queries: np.ndarray, corpus: np.ndarray, score: str) -> str | None:
    """What the message of a search of these float32 rows must say, or None if it must not refuse: a row
    refused (`row_refusal`; queries are checked first); for dot and euclidean, a score bound |q| |c| or
    (|q| + |c|)² beyond half of float32's largest number. (No row drawn here lies near these limits,
    where the last bit of a norm would matter.)"""
    refusal = row_refusal(queries, "queries", score) or row_refusal(corpus, "corpus", score)
    if refusal is not None:
        return refusal
    query_norm, doc_norm = fsum_norms(queries).max(initial=0.0), fsum_norms(corpus).max()
    bound = {"cosine": 0.0, "dot": query_norm * doc_norm, "euclidean": (query_norm + doc_norm) ** 2}[score]
    return f"may score beyond float32 with score={score!r}" if bound > F32_MAX / 2 and len(queries) else None


def float32_between(center: np.ndarray, radius: np.ndarray):
    """(lo, hi) float32: every number within `radius` of the float64 `center` rounds to a float32 in
    [lo, hi] (rounding is monotonic), and lo == hi where the arithmetic fixes one float32 number. The
    radius is doubled and widened by 4 units of |center| to cover the float64 rounding of center ± radius
    and the second-order terms of the bounds passed in; 0 stays 0 (an exact center)."""
    spread = np.where(radius > 0, 2 * radius + 4 * U64 * np.abs(center), 0.0)
    with np.errstate(over="ignore"):
        return (center - spread).astype(np.float32), (center + spread).astype(np.float32)


def sum_depth(dim: int) -> int:
    """How many float64 additions minisbert's fixed pairwise order (common/similarity.py's `fixed_sum`: the last
    half of the terms added onto the first, again and again) puts on the path of any one term."""
    return math.ceil(math.log2(dim))


def unit_row_bounds(rows: np.ndarray):
    """(lo, hi) float32 bounds on each entry of the unit rows of (n, d) float32 `rows` (held as float64).
    minisbert divides in float64 by the root of its fixed pairwise float64 sum of the exact squares, then
    rounds to float32: a sum of L = ceil(log2 d) levels of positive terms is off by at most L u of itself
    (Higham, "Accuracy and Stability of Numerical Algorithms", 4.2), so its root by L u / 2 + u and the
    quotient by L u / 2 + 2u (u = 2^-53). Here fsum rounds once, the root once, the quotient once: 2.5u.
    The exact quotient x_i / |x| is irrational in general, so this is as exact as the test can know it."""
    norms = fsum_norms(rows)
    centers = rows / np.where(norms > 0, norms, 1.0)[:, None]  # rows of zeros stay zero
    return float32_between(centers, (sum_depth(rows.shape[1]) / 2 + 4.5) * U64 * np.abs(centers))


def lowest_bits(values: np.ndarray) -> np.ndarray:
    """The value of the lowest set bit of each float32 number (held as float64; inf for 0): the number is
    an integer multiple of it."""
    mantissas, exponents = np.frexp(values)  # values = mantissas 2^exponents, |mantissas| in [0.5, 1)
    integers = np.abs(mantissas * 2.0**24).astype(np.int64)  # a float32 number: an integer (< 2^24) 2^(exponent - 24)
    return np.where(values == 0, np.inf, np.ldexp((integers & -integers).astype(np.float64), exponents - 24))


def score_bounds(queries: np.ndarray, corpus: np.ndarray, score: str):
    """(lo, hi) (Q, N) float32 bounds on every score of float32 rows as scored (unit rows for cosine).

    cosine, dot: the products of two float32 numbers are exact in float64 (24 + 24 significant bits, and
    exponents far inside float64's). Their sum is exact wherever the sum of their magnitudes is below
    2^52 times the lowest bit any of them holds: every partial sum, in any order, is then an integer
    multiple of that bit below 2^53 of it, a float64 number, so no addition rounds and the score is the
    exact real sum rounded once to float32. Elsewhere minisbert's sum lies within L u of the magnitudes
    (L = ceil(log2 d) levels, Higham 4.2) and numpy's own within (d - 1) u.
    euclidean: each difference and square rounds (3u of the term), the positive sum L u more (numpy's
    (d - 1) u), the root halves that and rounds once: a relative bound, for a distance cannot cancel."""
    dim, levels = queries.shape[1], sum_depth(queries.shape[1])
    if score == "euclidean":
        distances = np.sqrt((np.square(queries[:, None, :] - corpus[None, :, :])).sum(axis=-1))  # (Q, N)
        return float32_between(distances, ((levels + dim) / 2 + 5) * U64 * distances)
    terms = queries[:, None, :] * corpus[None, :, :]  # (Q, N, d), exact
    magnitudes = np.abs(terms).sum(axis=-1)  # (Q, N)
    lowest = (lowest_bits(queries)[:, None, :] * lowest_bits(corpus)[None, :, :]).min(axis=-1)  # (Q, N)
    exact = magnitudes < 2.0**52 * lowest
    return float32_between(terms.sum(axis=-1), np.where(exact, 0.0, (dim - 1 + levels) * U64 * magnitudes))


def checked_unit_rows(values: np.ndarray, given, case: Case, name: str) -> np.ndarray:
    """The unit rows of float32 `values`: the reference's where the arithmetic fixes them, else the library's
    (`prepare_corpus`'s rows, the plain loop's), which must lie within the reference's bounds everywhere."""
    lo, hi = unit_row_bounds(values)
    if values.shape[0] == 0:
        return values
    library = prepare_corpus(given, "cosine", screen=False).rows.numpy()
    outside = (library < lo) | (library > hi)
    assert not outside.any(), f"{case}: {name} unit row {np.argwhere(outside)[0].tolist()} is not x / |x| in float32"
    return np.where(lo == hi, lo, library).astype(np.float64)


def ranked(scores: np.ndarray, k: int, score: str, excluded: np.ndarray):
    """The (Q, min(k, N)) top scores and rows of (Q, N) float32 `scores`, best first (smallest distances
    first), ties to the lower row; excluded pairs left out, padding (-1, -inf; +inf distances) after."""
    num_queries, num_docs = scores.shape
    keys = np.where(excluded, np.inf, scores if score == "euclidean" else -scores.astype(np.float64))
    order = np.lexsort((np.broadcast_to(np.arange(num_docs), scores.shape), keys), axis=-1)[:, : min(k, num_docs)]
    rows = np.arange(num_queries)[:, None]
    dropped = excluded[rows, order]
    padding = np.float32(np.inf if score == "euclidean" else -np.inf)
    return np.where(dropped, padding, scores[rows, order]), np.where(dropped, -1, order)


def check_exact_answer(case: Case, expected) -> None:
    """The plain loop's answer (`expected`) is the exact one: its refusal where the reference refuses;
    else every score of every pair where the arithmetic fixes it, and its top k by the contract's order."""
    queries, corpus = float32_values(case.queries), float32_values(case.corpus)
    refusal = expected_refusal(queries, corpus, case.score)
    if refusal is not None or isinstance(expected, str):
        assert isinstance(expected, str) and refusal is not None and refusal in expected, (
            f"{case}: the plain loop {described(expected)}, the reference refuses: {refusal}")
        return
    if case.score == "cosine":
        queries = checked_unit_rows(queries, case.queries, case, "queries")
        corpus = checked_unit_rows(corpus, case.corpus, case, "corpus")
    lo, hi = score_bounds(queries, corpus, case.score)
    # Every pair's score as the plain loop gives it: the whole corpus, ranked, for each query.
    num_queries, num_docs = lo.shape
    every_score, every_row = (np.asarray(t) for t in plain.search(case.queries, case.corpus, num_docs,
                                                                    score=case.score))
    every = np.empty_like(lo)
    every[np.arange(num_queries)[:, None], every_row] = every_score
    assert (np.sort(every_row, axis=1) == np.arange(num_docs)).all(), f"{case}: k = N does not return every row once"
    outside = (every < lo) | (every > hi)
    assert not outside.any(), (f"{case}: the score of (query, row) {np.argwhere(outside)[0].tolist()} is "
                               f"{every[outside][0]!r}, exact arithmetic allows {lo[outside][0]!r} to "
                               f"{hi[outside][0]!r}")
    # Where exact arithmetic leaves two float32 numbers, the plain loop's choice (checked above) ranks.
    scores = np.where(lo == hi, lo, every)
    excluded = np.zeros(lo.shape, dtype=bool)
    if case.query_ids is not None:
        excluded = np.array(case.query_ids, dtype=str)[:, None] == np.array(case.corpus_ids, dtype=str)[None, :]
    reference_scores, reference_rows = ranked(scores, case.k, case.score, excluded)
    # Scores compare by value: a reference's exact 0 has no sign, and a float64 sum's may.
    assert expected[2].shape == reference_rows.shape, f"{case}: {expected[2].shape} results, not {reference_rows.shape}"
    apart = (expected[2] != reference_rows) | (expected[1] != reference_scores)
    if apart.any():
        query, slot = np.argwhere(apart)[0].tolist()
        raise AssertionError(f"{case}: query {query}, place {slot}: the plain loop's row "
                             f"{expected[2][query, slot]} score {expected[1][query, slot]!r}, the exact answer's "
                             f"row {reference_rows[query, slot]} score {reference_scores[query, slot]!r}")
