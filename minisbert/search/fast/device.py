"""Exact top-k search on a GPU, in a few kernel launches and one wait for the host.

On a GPU the host's work between kernels, not the GPU, sets the pace of a search of a few queries
(bench/README.md, "GPUs"), so this way launches a fixed set of kernels whatever the scores are:

    1. screen: each block of up to DEVICE_BLOCK_ENTRIES scores is one product and one top-K, K = k +
       KEPT_BEYOND_K (at most N); blocks' top-K merged by one more top-K;
    2. rescore: the K kept rows of every query scored exactly (common/similarity.py's `exact_scores`, the
       contract), ranked by exact score, ties by lower index; the first k are the answer;
    3. prove: every row left out scored at most the K-th kept screen score. If that is more than 2E
       below the k-th kept one (E: the screen's error bound), no row left out can reach the exact
       top k. A query it cannot prove (ties crowding the K kept rows), or rows as given that the
       screen cannot measure, is returned as unproved: the caller (search/ways.py) runs the plain loop for
       those, after the one wait for the host (`unproved.any()`).

No step depends on a value the host must read (no `nonzero`, no boolean indexing, no `.item()`), so
the launches are the same for every query count and every corpus (tests/search/test_device_search.py counts
them). The screen is the float32 product (`search_device`), or, for a prepared cosine corpus, the
product of its float16 copy with the queries rounded to float16, accumulated in float32
(`search_device_half`: half the bytes read, on tensor cores; its bound, `half_screen_error`, is
proved in search/bounds.py, section 4).
On a CPU both run too, when forced (way="device", "device, half"), so that tests can check them.
"""

import math
import warnings

import torch

from ..bounds import (LARGEST_RAW_SCORE, RAW_DIMS, RAW_NORM_SLACK, ROUGH, SMALLEST_COSINE_NORM, Bounds, half_screen_error,
                      linear_error, raw_reach)
from ..inputs import SearchInputs, exact_top_k
from .tuning import DEVICE_RESCORE_ENTRIES, HALF_KEPT_BEYOND_K, KEPT_BEYOND_K


def search_device(inputs: SearchInputs):
    """(Q, k) exact values and indices, best first, and the (Q,) queries unproved (module docstring),
    screened by float32 products of the rows as scored (prepared) or as given."""
    if inputs.prepared is not None:
        return _search(inputs, _PreparedRows(inputs), KEPT_BEYOND_K)
    return _search(inputs, _RowsAsGiven(inputs), KEPT_BEYOND_K)


def search_device_half(inputs: SearchInputs):
    """`search_device` over a prepared cosine corpus, screened by its float16 copy (`HalfRows`)."""
    return _search(inputs, _HalfScreen(inputs), HALF_KEPT_BEYOND_K)


def half_screen_runs(inputs: SearchInputs) -> bool:
    """A prepared cosine corpus on the device searched (unit rows, every entry within float16's range),
    and on a GPU float16 products summed in float32, as torch is set: cuBLAS may add them in float16
    (`torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction`, on by default), which
    `half_screen_error` does not cover, and a search reads that setting, never changes it."""
    prepared = inputs.prepared
    # On a CPU the float16 values are multiplied as float32 ones: exactly only where torch multiplies
    # float32 in full (`product_unit` 0; bfloat16 inputs would round the float16 values again).
    float32_sums = (not torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
                    if inputs.device.type == "cuda" else inputs.product_unit == 0)
    return (prepared is not None and prepared.score == "cosine" and prepared.rows.device == inputs.device
            and float32_sums)


def _search(inputs: SearchInputs, screen, beyond: int):
    queries, k, num_docs = inputs.queries, inputs.k, inputs.corpus.shape[0]
    kept = min(k + beyond, num_docs)
    found = []
    for first in range(0, queries.shape[0], inputs.query_chunk_size):
        rows = slice(first, first + inputs.query_chunk_size)
        top, columns = _screened(inputs, screen, rows, kept)  # (Qc, K), best first
        # Scored DEVICE_RESCORE_ENTRIES numbers at a time, so that memory stays bounded at any k up to N.
        values, indices = exact_top_k(queries[rows], inputs.rows_as_scored, columns, inputs.score, k,
                                      max(1, DEVICE_RESCORE_ENTRIES // queries.shape[1]))  # (Qc, k)
        # Every row left out scored at most the K-th kept: -inf where every row is kept (left to prove:
        # that rows as given could be measured).
        last = top[:, -1] if kept < num_docs else top.new_full(top.shape[:1], -math.inf)  # (Qc,)
        found.append((values, indices, screen.unproved(rows, top[:, k - 1], last)))
    if not found:  # no queries: rows as given are still checked, as the plain loop checks them (and raises)
        for start in range(0, num_docs if inputs.prepared is None else 0, inputs.corpus_chunk_size):
            inputs.corpus_chunk(start)
        empty = queries.new_empty(0, k)
        return empty, empty.long(), queries.new_empty(0, dtype=torch.bool)
    if len(found) == 1:
        return found[0]
    return tuple(torch.cat(parts) for parts in zip(*found))


def _screened(inputs: SearchInputs, screen, rows: slice, kept: int):
    """(Qc, K) screen scores and corpus rows of each query's K best by the screen, best first."""
    blocks, queries = [], screen.queries(rows)  # (Qc, d) as the screen multiplies them
    most = max(2, inputs.corpus_chunk_size // kept)  # blocks' top-Ks held at once: no more entries than a block
    for start in range(0, inputs.corpus.shape[0], inputs.corpus_chunk_size):
        size = min(inputs.corpus_chunk_size, inputs.corpus.shape[0] - start)
        scores = screen.block(queries, rows, start, size)  # (Qc, n)
        top, columns = scores.topk(min(kept, size), dim=1)
        blocks.append((top, columns + start if start else columns))
        if len(blocks) == most:
            blocks = [_merged(blocks, kept)]
    return blocks[0] if len(blocks) == 1 else _merged(blocks, kept)


def _merged(blocks: list, kept: int):
    """The (Qc, K) best of several blocks' top-Ks: a block's rows left out are below its K-th, so below these."""
    tops, columns = (torch.cat(parts, dim=1) for parts in zip(*blocks))  # (Qc, blocks K)
    top, where = tops.topk(min(kept, tops.shape[1]), dim=1)
    return top, columns.gather(1, where)


class _Screen:
    """What each screen implements: the queries as it multiplies them, a block of screen scores, and
    which queries it cannot prove (`_search`)."""

    def __init__(self, inputs: SearchInputs):
        self.inputs = inputs

    def queries(self, rows: slice) -> torch.Tensor:
        """(Qc, d) the query `rows` as the screen multiplies them."""
        return self.inputs.queries[rows]

    def block(self, queries: torch.Tensor, rows: slice, start: int, size: int) -> torch.Tensor:
        """(Qc, n) float32 screen scores (keys for euclidean) of corpus rows start to start + size."""
        raise NotImplementedError

    def unproved(self, rows: slice, kth: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """(Qc,) bool: queries for which no proof that a row screened at most `last` (the K-th kept
        screen score) is below the exact top k, given k rows screened at least `kth`."""
        raise NotImplementedError


class _PreparedRows(_Screen):
    """The float32 screen of a prepared corpus: rows as scored, their largest norm known."""

    def __init__(self, inputs: SearchInputs):
        super().__init__(inputs)
        self.largest_norm = largest_norm(inputs.prepared)
        self.squared_norms = None
        if inputs.score == "euclidean":
            self.squared_norms = (inputs.prepared.norms**2).float().to(inputs.device)  # (N,)

    def block(self, queries: torch.Tensor, rows: slice, start: int, size: int) -> torch.Tensor:
        doc = self.inputs.corpus[start : start + size].to(self.inputs.device)  # (n, d)
        if self.squared_norms is None:
            return queries @ doc.T  # (Qc, n)
        return torch.addmm(-self.squared_norms[start : start + size], queries, doc.T, alpha=2)

    def unproved(self, rows: slice, kth: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        if self.inputs.score == "euclidean":
            return _unproved_euclidean(self.inputs, rows, kth, last, self.largest_norm)
        slope, offset = linear_error(self.inputs.queries.shape[1], self.largest_norm,
                                     unit=self.inputs.product_unit)
        return _unproved(self.inputs.query_norms[rows], kth, last, slope, offset)


class _RowsAsGiven(_Screen):
    """The float32 screen of rows as given: each block's rows measured by their float32 norms (cosine
    divides the products by them, q·c / |c|), and checked as the plain loop's bound needs them."""

    def __init__(self, inputs: SearchInputs):
        super().__init__(inputs)
        blocks = -(-inputs.corpus.shape[0] // inputs.corpus_chunk_size)
        self.smallest, self.largest = torch.empty(2, blocks, device=inputs.device)  # each block's norms: (B,) each

    def block(self, queries: torch.Tensor, rows: slice, start: int, size: int) -> torch.Tensor:
        inputs = self.inputs
        doc = inputs.corpus[start : start + size].to(inputs.device, torch.float32)  # (n, d)
        norms = torch.linalg.vector_norm(doc, dim=1)  # (n,) float32
        if rows.start == 0:  # the first query chunk keeps each block's smallest and largest norm
            block = start // inputs.corpus_chunk_size
            torch.aminmax(norms, out=(self.smallest[block], self.largest[block]))
        if inputs.score == "cosine":
            return (queries @ doc.T).div_(norms)  # (Qc, n)
        if inputs.score == "dot":
            return queries @ doc.T
        return torch.addmm(-(norms * norms), queries, doc.T, alpha=2)

    def unproved(self, rows: slice, kth: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """Unproved queries (`_unproved`), and every query where a row's float32 norm is not finite,
        below SMALLEST_COSINE_NORM (cosine: zero rows too) or makes a score come near float32's limit,
        or rows have RAW_DIMS entries or more: the plain loop then checks the rows, and raises where it raises."""
        inputs = self.inputs
        dim = inputs.queries.shape[1]
        if dim >= RAW_DIMS:
            return torch.ones(kth.shape, dtype=torch.bool, device=kth.device)
        smallest, largest = self.smallest.min(), self.largest.max()
        if inputs.score == "cosine":  # unit rows made by dividing by float32 norms: norms below RAW_NORM_SLACK
            slope, offset = linear_error(dim, RAW_NORM_SLACK, **ROUGH, unit=inputs.product_unit)
            unproved = _unproved(inputs.query_norms[rows], kth, last, slope, offset)
            return unproved | ~((smallest >= SMALLEST_COSINE_NORM) & (largest < torch.inf))
        reach = raw_reach(largest.double(), dim)  # a 0-d tensor: no wait for the host
        largest_query = inputs.query_norms.max()
        largest_score = largest_query * reach if inputs.score == "dot" else (largest_query + reach) ** 2
        measurable = largest_score <= LARGEST_RAW_SCORE  # False for a NaN norm too
        if inputs.score == "euclidean":
            return _unproved_euclidean(inputs, rows, kth, last, reach, **ROUGH) | ~measurable
        slope, offset = linear_error(dim, 1.0, **ROUGH, unit=inputs.product_unit)
        return _unproved(inputs.query_norms[rows], kth, last, slope * reach, offset) | ~measurable


def _unproved(query_norms: torch.Tensor, kth: torch.Tensor, last: torch.Tensor, slope, offset) -> torch.Tensor:
    """(Qc,) bool: not proved that no row screened at most `last` (the K-th kept screen score) reaches
    the exact top k, given k rows screened at least `kth`, for a screen within E = slope |q| + offset
    of the exact score: that needs kth - last > 2E. (A row screened at most last < kth - 2E scores
    below kth - E, at or below each of those k rows' exact scores.) The gap is computed in float64:
    its rounding, 2^-53 of it, is within the 1% that E carries."""
    gap = kth.double() - last  # (Qc,)
    return gap <= query_norms * (2 * slope) + 2 * offset


def _unproved_euclidean(inputs: SearchInputs, rows: slice, kth: torch.Tensor, last: torch.Tensor, reach,
                        **made) -> torch.Tensor:
    """`_unproved` for euclidean keys, whose bound on a distance is not linear (search/bounds.py's
    `Bounds`, rows of norm at most `reach`; `made`: how the keys were made, as Bounds takes it)."""
    bounds = Bounds(inputs.score, inputs.query_norms[rows], reach, inputs.queries.shape[1], **made,
                    unit=inputs.product_unit)
    return ~(last < bounds.floor(bounds.lower(kth)))


def host_waits(call) -> list:
    """The messages of the waits for a GPU that `call()` makes: torch.cuda's sync debug mode warns at
    each call that synchronises the host with the device (`.item()`, `.cpu()`, `nonzero`, a blocking copy)."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [str(warning.message) for warning in caught if "synchroniz" in str(warning.message)]


def largest_norm(prepared) -> float:
    """A prepared corpus's largest row norm, measured once (one wait for the device) and kept with it."""
    if prepared.largest_norm is None:
        prepared.largest_norm = float(prepared.norms.max())
    return prepared.largest_norm


# ---- the float16 screen of a prepared cosine corpus ---------------------------------------------


class HalfRows:
    """A prepared cosine corpus's float16 copy: its unit rows rounded to float16 (no scaling is
    needed: every entry lies in [-1, 1], far inside float16's 65504; entries below 2^-14 round to
    float16's subnormals, which `half_screen_error` covers). On a CPU, where torch has no float16
    product with float32 accumulation, the float16 values are held widened to float32 (exactly)."""

    def __init__(self, rows: torch.Tensor):
        half = rows.to(torch.float16)  # (N, d)
        self.rows = half if rows.device.type == "cuda" else half.float()

    def rounded(self, queries: torch.Tensor) -> torch.Tensor:
        """(Q, d) float32 queries rounded to float16 (on a CPU widened back to float32, exactly)."""
        return queries.half().to(self.rows.dtype)

    def product(self, queries: torch.Tensor, start: int, size: int) -> torch.Tensor:
        """(Q, n) float32: the `rounded` queries times rows start to start + size, every product
        exact and summed in float32."""
        rows = self.rows[start : start + size]  # (n, d)
        if rows.dtype == torch.float32:  # a CPU: the float16 values, multiplied in float32
            return queries @ rows.T
        return torch.mm(queries, rows.T, out_dtype=torch.float32)  # summed in float32 (`half_screen_runs`)


def half_rows(prepared) -> HalfRows:
    """The prepared corpus's float16 copy, made at its first search here and kept with it."""
    if prepared.half_copy is None:
        prepared.half_copy = HalfRows(prepared.rows)
    return prepared.half_copy


class _HalfScreen(_Screen):
    """The float16 screen of a prepared cosine corpus (`HalfRows`; its bound: `half_screen_error`)."""

    def __init__(self, inputs: SearchInputs):
        super().__init__(inputs)
        self.copy = half_rows(inputs.prepared)
        self.error = half_screen_error(inputs.queries.shape[1], largest_norm(inputs.prepared))

    def queries(self, rows: slice) -> torch.Tensor:
        return self.copy.rounded(self.inputs.queries[rows])

    def block(self, queries: torch.Tensor, rows: slice, start: int, size: int) -> torch.Tensor:
        return self.copy.product(queries, start, size)

    def unproved(self, rows: slice, kth: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        return _unproved(self.inputs.query_norms[rows], kth, last, *self.error)
