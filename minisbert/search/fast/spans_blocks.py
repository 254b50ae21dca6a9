"""Exact top-k search, fast: the plain loop's answer (minisbert/search/plain.py) with less work.

Every way here keeps each query's top k + KEPT_BEYOND_K rows by float32 scores, dropping on the way
only rows that provably cannot be in the exact top-k (`_threshold`). `finish` proves that nothing
left out could be, and scores the kept rows that can exactly (search/inputs.py's `exact_top_k`, the
rescoring every fast way ends in); a query it cannot prove (ties crowding the kept rows) goes to the
plain loop (minisbert/search/ways.py's `_settled`).

A few queries (`search_spans`) go no faster than the corpus is read: one product per long span
(SPAN_ROWS), by the kernel measured quickest here (search/fast/span_product.py), one filter and one merge.
The first span is short, so that every later one is filtered, or screened (search/fast/screen.py), against
a k-th best. Rows as given are measured right after their product, in the cache; cosine divides the
products by the norms, q·c / |c|, rather than the rows.

Many queries (`search_blocks`): the product is compute-bound, so choosing the k best must add little.
Scores are cut into groups of GROUP_SIZE rows, and only groups whose maximum reaches the query's
floor are opened; blocks are laid out (corpus rows, queries). Where the CPU has a cheaper product,
a screen proposes the candidates (search/fast/screen.py). A block or span met with nothing kept yet gives
its own top K (`_keep_top`).

On a GPU the search is search/fast/device.py's `search_device`.

A score over rows measured here is off by two float32 sums and four roundings at most (`ROUGH`,
proved in minisbert/search/bounds.py); a row too small or large to measure so sends its span to the plain
search's checks, which raise where the plain search raises. Rows of RAW_DIMS entries or more, too long
to measure so, go there before any product (`_measured_here`).
"""

import math
from functools import partial

import torch

from ..bounds import LARGEST_RAW_SCORE, RAW_DIMS, RAW_NORM_SLACK, ROUGH, SMALLEST_COSINE_NORM, Bounds, raw_reach
from ..inputs import SETTLE_PIECE, SearchInputs, exact_top_k, merge_candidates
from .int8_blocks import Int8Blocks
from .int8_rows import Int8RowsScreen, int8_product_runs, int8_rows, int8_screen_pays
from .screen import Chunk, Screen
from .span_product import SpanProduct
from .tuning import (FIRST_SPAN_ROWS, GROUP_SIZE, KEPT_BEYOND_K, NORM_PIECE_ROWS, PIECE_BYTES, SPAN_ENTRIES,
                     SPAN_GROWTH, SPAN_ROWS)


def int8_copy(rows: torch.Tensor, score: str, screen: bool | None):
    """The int8 copy a prepared corpus of (N, d) float32 `rows` keeps (cosine, dot), or None: where
    torch's int8 product runs exactly (on a CPU), and where `screen` is None, where it pays
    (search/fast/int8_rows.py); screen=False: never."""
    dim, device = rows.shape[1], rows.device
    if screen is not False and score != "euclidean" and int8_product_runs(dim, device) and (
            screen or int8_screen_pays(dim)):
        return int8_rows(rows)
    return None


def search_spans(inputs: SearchInputs, screen: bool = False, one_span: bool = False):
    """The (Q, K) running approximate top-K after reading the corpus a span at a time, and the largest row
    norm met; `screen`: with a prepared corpus's int8 copy; `one_span`: the whole (small) corpus in one."""
    queries, device = inputs.queries, inputs.device
    (num_queries, dim), num_docs = queries.shape, inputs.corpus.shape[0]
    top_values, top_indices = _running(inputs)
    span = min(SPAN_ROWS, min(SPAN_ENTRIES, inputs.corpus_chunk_size * inputs.query_chunk_size) // max(1, num_queries))
    if inputs.corpus.dtype != torch.float32 or inputs.corpus.device != device:
        span = min(span, PIECE_BYTES // (4 * dim))  # copied to float32 a piece at a time
    span = num_docs if one_span else _span_length(span)
    height = -(-min(span, num_docs) // GROUP_SIZE) * GROUP_SIZE
    block_buffer = torch.empty(num_queries * height, device=device)
    product = SpanProduct(queries, height)
    rows_screen = Int8RowsScreen(queries, height) if screen else None
    screened = Screen(queries, rows_screen, waits=False) if screen and rows_screen.usable() else None
    first, reach = None if one_span else FIRST_SPAN_ROWS, 0.0
    for start, rows in _spans(num_docs, span, top_values.shape[1], first, SPAN_GROWTH if screened else None):
        if screened is not None:
            chunk = _prepared_chunk(inputs, start, rows, inputs.prepared.int8_copy)
            screened.load_chunk(chunk)
            kth = _threshold(inputs, slice(None), top_values, max(reach, chunk.largest_norm))
            found = screened.candidates(slice(0, num_queries), kth)
            if found is not None:
                reach = max(reach, chunk.largest_norm)
                merge_candidates(found[2], found[:2], start, top_values, top_indices)
                continue
        width = -(-rows // GROUP_SIZE) * GROUP_SIZE
        block = block_buffer[: num_queries * width].view(num_queries, width)  # (Q, W)
        reach = max(reach, _score_span(inputs, start, rows, product, block[:, :rows]))
        if start == 0:  # nothing kept yet: the span's own top K
            _keep_top(block[:, :rows], top_values, top_indices)
            continue
        block[:, rows:] = -math.inf
        kth = _threshold(inputs, slice(None), top_values, reach)
        found = _block_candidates(block, kth)
        merge_candidates(found[2], found[:2], start, top_values, top_indices)
    return top_values, top_indices, reach


def _keep_top(scores: torch.Tensor, top_values: torch.Tensor, top_indices: torch.Tensor) -> None:
    """Write the top K of the (Qc, n) float32 `scores` of the first rows of the corpus (the first span
    or chunk, met with nothing kept yet) into the (Qc, K) running top-K, in place."""
    width = min(top_values.shape[1], scores.shape[1])
    top_values[:, :width], top_indices[:, :width] = scores.topk(width, dim=1)


def _running(inputs: SearchInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q, K) -inf values and -1 indices: the running top-K of the approximate scores that a fast way
    keeps, K = k + KEPT_BEYOND_K (at most N), so that `finish` can prove the exact top-k lies in it."""
    width = min(inputs.k + KEPT_BEYOND_K, inputs.corpus.shape[0])
    values = torch.full((inputs.queries.shape[0], width), -math.inf, device=inputs.device)
    return values, torch.full_like(values, -1, dtype=torch.long)


def _threshold(inputs: SearchInputs, rows: slice, top_values: torch.Tensor, reach: float) -> torch.Tensor:
    """(Qc,) float32: an approximate score a row of the query `rows` must pass to be kept. The K-th
    kept score, and where it is higher, the floor of the k-th (search/bounds.py's `Bounds`, for rows
    of norm at most `reach`): a row below that floor cannot be in the exact top-k, whatever follows."""
    return torch.maximum(top_values[:, -1], _below_floor(inputs, rows, reach, top_values[:, inputs.k - 1]))


def _below_floor(inputs: SearchInputs, rows: slice, reach: float, kth: torch.Tensor) -> torch.Tensor:
    """(Qc,) float32 just below the floor of a k-th best approximate score `kth` (Qc,), for rows of
    norm at most `reach`: rows are kept above it, so that a row at the floor is kept."""
    bounds = Bounds(inputs.score, inputs.query_norms[rows], reach, inputs.queries.shape[1], **ROUGH,
                    unit=inputs.product_unit)
    floor = bounds.floor(bounds.lower(kth))
    return torch.nextafter(floor, floor.new_tensor(-math.inf))


def finish(inputs: SearchInputs, top_values: torch.Tensor, top_indices: torch.Tensor, reach: float):
    """The (Q, k) exact values and indices from a fast way's running approximate top-K, and the (Q,)
    queries it cannot prove them for (for the plain loop). A row can be in the exact top-k only if
    its approximate score reaches the floor of the k-th kept one (`Bounds`, rows of norm at most
    `reach`). A row left out was below such a floor when met (`_threshold`) or below the K-th kept
    score: where that is below the floor, the kept rows scored exactly (`exact_top_k`) hold the
    answer; where not (K rows within 2E of the k-th: ties), the query is unproved."""
    k, num_docs = inputs.k, inputs.corpus.shape[0]
    bounds = Bounds(inputs.score, inputs.query_norms, reach, inputs.queries.shape[1], **ROUGH,
                    unit=inputs.product_unit)
    floor = bounds.floor(bounds.lower(top_values[:, k - 1]))  # (Q,)
    unproved = (top_indices[:, -1] >= 0) & ~(top_values[:, -1] < floor)
    if top_values.shape[1] >= num_docs:  # every row is kept
        unproved[:] = False
    # Only kept rows at or above the floor can be in the exact top-k: the first of each list, best first.
    above = top_values >= floor[:, None]  # (Q, K)
    width = max(k, int(above.sum(dim=1).max()) if above.shape[0] else 0)  # k at least: (Q, k) comes back
    columns = top_indices[:, :width].masked_fill(~above[:, :width], -1)  # (Q, W)
    values, indices = exact_top_k(inputs.queries, inputs.rows_as_scored, columns, inputs.score, k, SETTLE_PIECE,
                                  padded=True)
    return values, indices, unproved


def _spans(num_docs: int, span: int, k: int, first: int | None, growth: int | None):
    """(start, rows) of each span: a short first span (unless `first` is None), then spans of `span`
    rows, or spans growing `growth` times at each step up to `span` rows."""
    start = 0
    rows = span if first is None else min(span, _span_length(max(first, 4 * k + GROUP_SIZE)))
    while start < num_docs:
        yield start, min(rows, num_docs - start)
        start += rows
        rows = span if growth is None else min(span, _span_length(rows * growth))


def _span_length(rows: int) -> int:
    """At most `rows` (at least one group), in whole groups, and not a multiple of 4096 (see SPAN_ROWS)."""
    span = max(GROUP_SIZE, rows // GROUP_SIZE * GROUP_SIZE)
    return span - GROUP_SIZE if span % 4096 == 0 else span


def _prepared_chunk(inputs: SearchInputs, start: int, rows: int, copy=None) -> Chunk:
    """Rows start to start + rows as a `Chunk`: of a prepared corpus, or of one as given read by the plain checks."""
    doc_rows, norms = inputs.corpus_chunk(start, rows)  # (n, d) as scored, (n,) float64
    squared = (norms**2).float() if inputs.score == "euclidean" else None
    return Chunk(doc_rows, None, squared, float(norms.max()), None if copy is None else copy[start : start + rows])


def _measured_here(inputs: SearchInputs) -> bool:
    """Whether the fast way measures the corpus rows itself (`_raw_reach`): rows as given of fewer than
    RAW_DIMS entries. Others are read by the plain search's checks (a prepared corpus's were, once)."""
    return inputs.prepared is None and inputs.queries.shape[1] < RAW_DIMS


def _raw_reach(inputs: SearchInputs, norms: torch.Tensor) -> float | None:
    """For rows as given (`_measured_here`) with (n,) float32 `norms`: an upper bound on their norms as
    multiplied (unit rows for cosine), or None where a row or a score needs the plain search's checks."""
    if norms.numel() == 0:
        return None
    smallest, largest = (float(value) for value in torch.aminmax(norms))
    largest = raw_reach(largest, inputs.queries.shape[1])
    query_norm = float(inputs.query_norms.max()) if inputs.query_norms.numel() else 0.0
    largest_score = {"cosine": 1.0, "dot": query_norm * largest, "euclidean": (query_norm + largest) ** 2}
    if not (largest < math.inf and (inputs.score != "cosine" or smallest >= SMALLEST_COSINE_NORM)  # a NaN fails too
            and largest_score[inputs.score] <= LARGEST_RAW_SCORE):
        return None
    return RAW_NORM_SLACK if inputs.score == "cosine" else largest


def _score_span(inputs: SearchInputs, start: int, rows: int, product: SpanProduct, block: torch.Tensor) -> float:
    """Write the (Q, rows) float32 scores (keys 2 q·c - |c|² for euclidean) of the corpus rows from
    `start` into `block`; return an upper bound on the norms of the rows as multiplied."""
    score = inputs.score
    if _measured_here(inputs):
        doc_rows = inputs.corpus[start : start + rows].to(device=inputs.device, dtype=torch.float32)  # (n, d)
        norms = torch.empty(rows, device=inputs.device)  # (n,)
        for piece_start in range(0, rows, NORM_PIECE_ROWS):
            piece = slice(piece_start, piece_start + NORM_PIECE_ROWS)
            product(doc_rows[piece], block[:, piece])
            torch.linalg.vector_norm(doc_rows[piece], dim=1, out=norms[piece])  # the piece is in the cache
        reach = _raw_reach(inputs, norms)
        if reach is not None:
            if score == "cosine":
                block /= norms
            elif score == "euclidean":
                block.mul_(2).sub_(norms * norms)
            return reach
    chunk = _prepared_chunk(inputs, start, rows)  # prepared, or rows as given read by the plain checks
    product(chunk.rows, block)
    if score == "euclidean":
        block.mul_(2).sub_(chunk.squared_norms)
    return chunk.largest_norm


def _score_rows(chunk: Chunk, queries: torch.Tensor, score: str, out: torch.Tensor) -> None:
    """Write the (n, Q) scores (keys for euclidean) of the chunk's rows against (Q, d) queries into
    `out`, which may be the transpose of a (Q, n) block (torch then computes in that layout)."""
    if score == "euclidean":
        torch.addmm(-chunk.squared_norms[:, None], chunk.rows, queries.T, alpha=2, out=out)
    else:
        torch.mm(chunk.rows, queries.T, out=out)


def search_blocks(inputs: SearchInputs, screen: bool = False):
    """The (Q, K) running approximate top-K after blocks of queries against chunks of corpus, and the
    largest row norm met; `screen`: screen each block with int8 products."""
    queries, score, device = inputs.queries, inputs.score, inputs.device
    (num_queries, dim), num_docs = queries.shape, inputs.corpus.shape[0]
    query_chunk_size, corpus_chunk_size = inputs.query_chunk_size, inputs.corpus_chunk_size
    top_values, top_indices = _running(inputs)
    # One buffer for the score blocks, laid out (corpus rows, queries), its height in whole groups.
    height = -(-min(corpus_chunk_size, num_docs) // GROUP_SIZE) * GROUP_SIZE
    block_buffer = torch.empty(height * min(query_chunk_size, num_queries), device=device)
    unit_rows_made = score == "cosine" and inputs.prepared is None
    unit_buffer = torch.empty(min(corpus_chunk_size, num_docs), dim, device=device) if unit_rows_made else None
    screened = Screen(queries, Int8Blocks(queries, query_chunk_size, height)) if screen else None
    reach = 0.0
    for doc_start in range(0, num_docs, corpus_chunk_size):
        chunk = _block_chunk(inputs, doc_start, min(corpus_chunk_size, num_docs - doc_start), unit_buffer,
                             screened is not None)
        reach = max(reach, chunk.largest_norm)
        if screened is not None:
            screened.load_chunk(chunk)
        for query_start in range(0, num_queries, query_chunk_size):
            rows = slice(query_start, min(query_start + query_chunk_size, num_queries))
            kth = _threshold(inputs, rows, top_values[rows], reach)
            own_floor = (inputs.k, partial(_own_floor, inputs, rows, kth, reach))
            found = None if screened is None else screened.candidates(rows, kth, own_floor)
            if found is None:
                if chunk.divisors is not None:  # the screen failed: the chunk's unit rows, once
                    chunk.rows = torch.div(chunk.rows, chunk.divisors, out=unit_buffer[: chunk.rows.shape[0]])
                    chunk.divisors = None
                if doc_start == 0:  # nothing kept yet: the chunk's own top K, of a (Qc, Nc) block
                    block = block_buffer[: chunk.rows.shape[0] * (rows.stop - rows.start)].view(-1, chunk.rows.shape[0])
                    _score_rows(chunk, queries[rows], score, block.T)
                    _keep_top(block, top_values[rows], top_indices[rows])
                    continue
                chunk_height = -(-chunk.rows.shape[0] // GROUP_SIZE) * GROUP_SIZE  # whole groups, no more
                block = block_buffer[: chunk_height * (rows.stop - rows.start)].view(chunk_height, -1)  # (H, Qc)
                _score_rows(chunk, queries[rows], score, block[: chunk.rows.shape[0]])  # (Nc, d) @ (d, Qc)
                block[chunk.rows.shape[0] :] = -math.inf
                found = _block_candidates(block.T, kth)
            merge_candidates(found[2], found[:2], doc_start, top_values[rows], top_indices[rows])
    return top_values, top_indices, reach


def _block_chunk(inputs: SearchInputs, start: int, rows: int, unit_buffer=None, screened: bool = False) -> Chunk:
    """The corpus chunk of `rows` rows from `start` as a block multiplies it: cosine rows as given
    divided by their float32 norms now (into `unit_buffer`, if given), or, for a screen, left undivided."""
    if _measured_here(inputs):
        raw = inputs.corpus[start : start + rows].to(device=inputs.device, dtype=torch.float32)  # (Nc, d)
        norms = torch.linalg.vector_norm(raw, dim=1)  # (Nc,)
        reach = _raw_reach(inputs, norms)
        if reach is not None:
            divisors = norms[:, None] if inputs.score == "cosine" else None  # (Nc, 1)
            if divisors is not None and not screened:
                raw, divisors = torch.div(raw, divisors, out=None if unit_buffer is None else unit_buffer[:rows]), None
            squared = norms * norms if inputs.score == "euclidean" else None
            return Chunk(raw, divisors, squared, reach, None)
    return _prepared_chunk(inputs, start, rows)


def _block_candidates(scores: torch.Tensor, kth: torch.Tensor):
    """(M,) query rows, (M,) block columns and (M,) scores of the entries of a (Qc, H) float32 block
    (H a multiple of GROUP_SIZE; maybe the transpose of an (H, Qc) one) that lie above `kth` (Qc,)
    (`_threshold`; an equal score loses the tie: a higher index)."""
    groups = scores.unflatten(1, (-1, GROUP_SIZE))  # (Qc, H / G, G)
    # Reduced along memory (across, torch's reduction is many times slower); groups along it gathered whole.
    along = scores.stride(1) == 1
    group_maxima = groups.amax(dim=2) if along else scores.T.unflatten(0, (-1, GROUP_SIZE)).amax(dim=1).T  # (Qc, H / G)
    rows, group = (group_maxima > kth[:, None]).nonzero(as_tuple=True)  # (P,), (P,)
    values = groups.flatten(0, 1).index_select(0, rows * groups.shape[1] + group) if along else groups[rows, group]  # (P, G)
    pair, offset = (values > kth[rows, None]).nonzero(as_tuple=True)  # (M,), (M,)
    # nonzero() lists pairs query by query, groups and offsets ascending: sorted by query, then row.
    return rows[pair], group[pair] * GROUP_SIZE + offset, values[pair, offset]


def _own_floor(inputs: SearchInputs, rows: slice, kth: torch.Tensor, reach: float, lowest: torch.Tensor):
    """(Qc,) float32: `kth` (`_threshold`), and where that is -inf (nothing kept yet), the floor below
    which no row can reach the top k, given the (Qc,) lowest float32 score of k rows of the block
    that a screen picked: the query's k-th best is no lower, as if they were kept."""
    return torch.where(torch.isneginf(kth), _below_floor(inputs, rows, reach, lowest), kth)
