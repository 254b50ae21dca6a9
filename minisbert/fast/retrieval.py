"""Exact top-k search, fast: the plain loop's answer (minisbert/retrieval.py) with less work.

Every way here does what the plain loop does: approximate scores, the candidates that can still
reach the top-k under a proven bound, and `settle` (search_inputs.py), which scores the candidates
exactly and merges them. Only the first two steps are faster, so no way can change a result.
minisbert/search.py's WAYS says which way a search takes.

A few queries (`search_spans`). The product does little arithmetic per corpus row, so the search
can go no faster than the corpus can be read: one product per long span of rows (SPAN_ROWS), the
quickest kernel for its shape measured once on the machine (fast/span_product.py), then one filter
and one merge for the whole span. The first span is short, so that the k-th best is known early
and every later span is filtered against it, or screened (fast/screen.py). Rows as given are
measured a piece at a time right after their product, while in the cache: cosine divides the
products by the norms, q·c / |c|, rather than the rows before the product.

Many queries (`search_blocks`). The product costs 2·Q·N·d FLOP and is compute-bound, so choosing
the k best must add little. Each query's scores are cut into groups of GROUP_SIZE corpus rows and
each group reduced to its maximum; only groups whose maximum reaches the query's floor are opened.
Blocks are laid out (corpus rows, queries), the work between two products runs on one thread
(`_one_thread`), and the blocks reuse one buffer (bench/README.md, "Search", has each measured).
Where the CPU has a cheaper product, a screen proposes each block's candidates instead.

An approximate score over rows measured here is off by two float32 sums and four roundings at most
(search_inputs.py's `Bounds`: sums=2, roundings=4); a row too small or too large to measure in
float32 (or a score that could leave float32's range) sends its span to the checks of the plain
search, which read it as the plain search does and raise where it raises.
"""

import contextlib
import math
import weakref

import torch

from ..search_inputs import Bounds, SearchInputs, drop_excluded, settle
from ..similarity import unit_rows
from .int8_blocks import Int8Blocks
from .int8_rows import Int8RowsScreen, int8_product_runs, int8_rows, int8_screen_pays
from .screen import Bfloat16Blocks, Chunk, Screen, screen_rows
from .span_product import SpanProduct
from .tuning import (FIRST_SPAN_ROWS, GROUP_SIZE, NORM_PIECE_ROWS, PIECE_BYTES, SPAN_ENTRIES, SPAN_GROWTH,
                     SPAN_ROWS)

ROUGH = {"sums": 2, "roundings": 4}  # the bound of a score made from rows measured in float32 here
_copies = weakref.WeakKeyDictionary()  # prepared corpus -> {"bfloat16": rows, "int8": Int8Rows}


def keep_copies(prepared, bfloat16: bool, int8: bool | None) -> None:
    """Keep the copies a prepared corpus's screens read: a bfloat16 copy if `bfloat16`; an int8 copy
    for one query (cosine, dot) where it runs exactly, and where `int8` is None, where it pays."""
    copies = _copies.setdefault(prepared, {})
    euclidean = prepared.score == "euclidean"
    if bfloat16:
        copies["bfloat16"] = screen_rows(prepared.rows, (prepared.norms**2).float() if euclidean else None)
    dim, device = prepared.rows.shape[1], prepared.rows.device
    if int8 is not False and not euclidean and int8_product_runs(dim, device) and (int8 or int8_screen_pays(dim)):
        copies["int8"] = int8_rows(prepared.rows)


def kept(prepared, name: str):
    """A prepared corpus's copy `name` ("bfloat16" or "int8"), or None."""
    return None if prepared is None else _copies.get(prepared, {}).get(name)


def search_spans(inputs: SearchInputs, screen: str | None = None, one_span: bool = False):
    """The running (Q, k) values and indices after reading the corpus a span at a time (module
    docstring); `screen`: "bfloat16" or "int8" screens a prepared corpus's spans with its copy;
    `one_span`: the whole corpus in one span (a small one)."""
    queries, score, device, k = inputs.queries, inputs.score, inputs.device, inputs.k
    (num_queries, dim), num_docs = queries.shape, inputs.corpus.shape[0]
    top_values = torch.full((num_queries, k), -math.inf, device=device)  # (Q, k)
    top_indices = torch.full_like(top_values, -1, dtype=torch.long)  # (Q, k)
    span = min(SPAN_ROWS, min(SPAN_ENTRIES, inputs.corpus_chunk_size * inputs.query_chunk_size) // max(1, num_queries))
    if inputs.corpus.dtype != torch.float32 or inputs.corpus.device != device:
        span = min(span, PIECE_BYTES // (4 * dim))  # copied to float32 a piece at a time
    span = num_docs if one_span else _span_length(span)
    height = -(-min(span, num_docs) // GROUP_SIZE) * GROUP_SIZE
    block_buffer = torch.empty(num_queries * height, device=device)
    product = SpanProduct(queries, height)
    screened = None
    if screen == "bfloat16":
        screened = Screen(queries, Bfloat16Blocks(queries, score, num_queries, height, kept=True), score == "euclidean")
    elif screen == "int8" and (one_query := Int8RowsScreen(queries, height)).usable():
        screened = Screen(queries, one_query)
    first = None if one_span else FIRST_SPAN_ROWS
    for start, rows in _spans(num_docs, span, k, first, SPAN_GROWTH if screened else None):
        if screened is not None:
            chunk, scored, bounds = _prepared_chunk(inputs, start, rows, kept(inputs.prepared, screen))
            floor = bounds.floor(top_values[:, -1].double())
            screened.load_chunk(chunk)
            found = screened.candidates(slice(0, num_queries), inputs.excluded, start, floor)
            if found is not None:
                settle(queries, scored, found, start, score, top_values, top_indices)
                continue
        width = -(-rows // GROUP_SIZE) * GROUP_SIZE
        block = block_buffer[: num_queries * width].view(num_queries, width)  # (Q, W)
        scored, bounds = _score_span(inputs, start, rows, product, block[:, :rows])
        with _one_thread(device):
            block[:, rows:] = -math.inf
            if inputs.excluded is not None:
                drop_excluded(block[:, :rows], inputs.excluded, 0, start)
            found = _block_candidates(block, top_values, bounds)
            settle(queries, scored, found, start, score, top_values, top_indices)
    return top_values, top_indices


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


def _prepared_chunk(inputs: SearchInputs, start: int, rows: int, copy=None):
    """Rows start to start + rows of a prepared corpus (or of one as given, read by the plain search's
    checks) as a `Chunk`, the function giving candidates' rows as scored, and the chunk's bound."""
    doc_rows, norms = inputs.corpus_chunk(start, rows)  # (n, d) as scored, (n,) float64
    largest = float(norms.max())
    squared = (norms**2).float() if inputs.score == "euclidean" else None
    chunk = Chunk(doc_rows, None, squared, largest, None if copy is None else copy[start : start + rows])
    return chunk, doc_rows.__getitem__, Bounds(inputs.score, inputs.query_norms, largest, doc_rows.shape[1])


def _raw_bound(inputs: SearchInputs, raw: torch.Tensor, norms: torch.Tensor):
    """For (n, d) float32 rows as given and their (n,) float32 `norms`: the function giving candidates'
    rows as scored, and the bound; None where a row or a score needs the plain search's checks."""
    if raw.shape[0] == 0:
        return None
    smallest, largest = (float(value) for value in torch.aminmax(norms))
    largest *= 1 + 2.0**-10  # float32 norms are off by less than 2^-10 of themselves (d < 16,000)
    fits = largest < math.inf and (inputs.score != "cosine" or smallest >= 2.0**-60)
    query_norm = float(inputs.query_norms.max()) if inputs.query_norms.numel() else 0.0
    if inputs.score == "dot":
        fits = fits and query_norm * largest <= torch.finfo(torch.float32).max / 4
    elif inputs.score == "euclidean":
        fits = fits and (query_norm + largest) ** 2 <= torch.finfo(torch.float32).max / 4
    if not fits:  # written so that a NaN fails too
        return None
    scored = (lambda columns: unit_rows(raw[columns])) if inputs.score == "cosine" else raw.__getitem__
    reach = 1 + 2.0**-10 if inputs.score == "cosine" else largest
    return scored, Bounds(inputs.score, inputs.query_norms, reach, raw.shape[1], **ROUGH)


def _score_span(inputs: SearchInputs, start: int, rows: int, product: SpanProduct, block: torch.Tensor):
    """Write the (Q, rows) float32 scores (keys 2 q·c - |c|² for euclidean) of the corpus rows from
    `start` into `block`; return the function giving candidates' rows as scored, and the bound."""
    score = inputs.score
    if inputs.prepared is None:
        doc_rows = inputs.corpus[start : start + rows].to(device=inputs.device, dtype=torch.float32)  # (n, d)
        norms = torch.empty(rows, device=inputs.device)  # (n,)
        for piece_start in range(0, rows, NORM_PIECE_ROWS):
            piece = slice(piece_start, piece_start + NORM_PIECE_ROWS)
            product(doc_rows[piece], block[:, piece])
            torch.linalg.vector_norm(doc_rows[piece], dim=1, out=norms[piece])  # the piece is in the cache
        found = _raw_bound(inputs, doc_rows, norms)
        if found is not None:
            if score == "cosine":
                block /= norms
            elif score == "euclidean":
                block.mul_(2).sub_(norms * norms)
            return found
    chunk, scored, bounds = _prepared_chunk(inputs, start, rows)
    if inputs.prepared is not None:
        product(chunk.rows, block)
        if score == "euclidean":
            block.mul_(2).sub_(chunk.squared_norms)
    else:
        _score_rows(chunk, inputs.queries, score, block.T)
    return scored, bounds


def _score_rows(chunk: Chunk, queries: torch.Tensor, score: str, out: torch.Tensor) -> None:
    """Write the (n, Q) scores (keys for euclidean) of the chunk's rows against (Q, d) queries into
    `out`, which may be the transpose of a (Q, n) block (torch then computes in that layout)."""
    if score == "euclidean":
        torch.addmm(-chunk.squared_norms[:, None], chunk.rows, queries.T, alpha=2, out=out)
    else:
        torch.mm(chunk.rows, queries.T, out=out)


def search_blocks(inputs: SearchInputs, screen: str | None = None):
    """The running (Q, k) values and indices after blocks of queries against chunks of corpus (module
    docstring); `screen`: "bfloat16" or "int8" screens each block with such a product."""
    queries, score, device, k = inputs.queries, inputs.score, inputs.device, inputs.k
    (num_queries, dim), num_docs = queries.shape, inputs.corpus.shape[0]
    query_chunk_size, corpus_chunk_size = inputs.query_chunk_size, inputs.corpus_chunk_size
    top_values = torch.full((num_queries, k), -math.inf, device=device)  # (Q, k)
    top_indices = torch.full_like(top_values, -1, dtype=torch.long)  # (Q, k)
    # One buffer for the score blocks, laid out (corpus rows, queries), its height in whole groups.
    height = -(-min(corpus_chunk_size, num_docs) // GROUP_SIZE) * GROUP_SIZE
    block_buffer = torch.empty(height * min(query_chunk_size, num_queries), device=device)
    unit_buffer = None
    if score == "cosine" and inputs.prepared is None:
        unit_buffer = torch.empty(min(corpus_chunk_size, num_docs), dim, device=device)
    screened = None
    if screen == "int8":
        screened = Screen(queries, Int8Blocks(queries, query_chunk_size, height))
    elif screen == "bfloat16":
        copy = kept(inputs.prepared, "bfloat16") is not None
        screened = Screen(queries, Bfloat16Blocks(queries, score, query_chunk_size, height, copy), score == "euclidean")
    for doc_start in range(0, num_docs, corpus_chunk_size):
        with _one_thread(device):
            chunk, scored, bounds = _block_chunk(inputs, doc_start, unit_buffer, screened is not None)
        if screened is not None:
            screened.load_chunk(chunk)
        for query_start in range(0, num_queries, query_chunk_size):
            rows = slice(query_start, min(query_start + query_chunk_size, num_queries))
            chunk_bounds = bounds.of(rows)
            floor = chunk_bounds.floor(top_values[rows, -1].double())
            found = None if screened is None else screened.candidates(rows, inputs.excluded, doc_start, floor)
            if found is None:
                if chunk.divisors is not None:  # the screen failed: the chunk's unit rows, once
                    chunk.rows = torch.div(chunk.rows, chunk.divisors, out=unit_buffer[: chunk.rows.shape[0]])
                    chunk.divisors = None
                block = block_buffer[: height * (rows.stop - rows.start)].view(height, -1)  # (H, Qc)
                _score_rows(chunk, queries[rows], score, block[: chunk.rows.shape[0]])  # (Nc, d) @ (d, Qc)
                with _one_thread(device):
                    block[chunk.rows.shape[0] :] = -math.inf
                    if inputs.excluded is not None:
                        drop_excluded(block.T, inputs.excluded, query_start, doc_start)
                    found = _block_candidates(block.T, top_values[rows], chunk_bounds)
            settle(queries[rows], scored, found, doc_start, score, top_values[rows], top_indices[rows])
    return top_values, top_indices


def _block_chunk(inputs: SearchInputs, start: int, unit_buffer: torch.Tensor | None, screened: bool):
    """The corpus chunk from `start` as `search_blocks` multiplies it (cosine rows as given divided by
    their float32 norms now, or, for a screen, left undivided with their divisors), the function
    giving candidates' rows as scored, and the chunk's bound."""
    rows = min(inputs.corpus_chunk_size, inputs.corpus.shape[0] - start)
    if inputs.prepared is None:
        raw = inputs.corpus[start : start + rows].to(device=inputs.device, dtype=torch.float32)  # (Nc, d)
        norms = torch.linalg.vector_norm(raw, dim=1)  # (Nc,)
        found = _raw_bound(inputs, raw, norms)
        if found is not None:
            scored, bounds = found
            divisors = norms[:, None] if inputs.score == "cosine" else None  # (Nc, 1)
            if divisors is not None and not screened:
                raw, divisors = torch.div(raw, divisors, out=unit_buffer[:rows]), None
            squared = norms * norms if inputs.score == "euclidean" else None
            largest = 1 + 2.0**-10 if inputs.score == "cosine" else float(norms.max()) * (1 + 2.0**-10)
            return Chunk(raw, divisors, squared, largest, None), scored, bounds
    return _prepared_chunk(inputs, start, rows, kept(inputs.prepared, "bfloat16"))


def _block_candidates(scores: torch.Tensor, top_values: torch.Tensor, bounds: Bounds):
    """(M,) query rows and (M,) block columns of the entries of a (Qc, H) float32 block (H a multiple
    of GROUP_SIZE; maybe the transpose of an (H, Qc) one) that can reach the running (Qc, k) top-k:
    at or above the floor of the k-th best so far, or of what the block's own k best guarantee."""
    k = top_values.shape[1]
    groups = scores.unflatten(1, (-1, GROUP_SIZE))  # (Qc, H / G, G)
    # Reduced along the block's rows in memory (across, torch's reduction is many times slower).
    if scores.stride(1) == 1:
        group_maxima = groups.amax(dim=2)  # (Qc, H / G)
    else:
        group_maxima = scores.T.unflatten(0, (-1, GROUP_SIZE)).amax(dim=1).T  # (Qc, H / G)
    kth = top_values[:, -1].double()  # (Qc,)
    if torch.isneginf(kth).any() and scores.shape[1] >= k:
        # The k-th largest group maximum: k groups, so k entries, reach it.
        source = group_maxima if group_maxima.shape[1] >= k else scores
        kth = torch.maximum(kth, bounds.lower(source.topk(k, dim=1).values[:, -1]))
    floor = bounds.floor(kth)[:, None]  # (Qc, 1)
    promising = (group_maxima >= floor) & (group_maxima > -math.inf)  # (Qc, H / G)
    rows, group = promising.nonzero(as_tuple=True)  # (P,), (P,)
    values = groups[rows, group]  # (P, G)
    pair, offset = ((values >= floor[rows]) & (values > -math.inf)).nonzero(as_tuple=True)  # (M,), (M,)
    # nonzero() lists pairs query by query, groups and offsets ascending: sorted by query, then row.
    return rows[pair], group[pair] * GROUP_SIZE + offset


@contextlib.contextmanager
def _one_thread(device: torch.device):
    """Run the torch operations inside on one CPU thread: each operation spread over several threads
    ends by waiting for all of them, which on a busy machine can take a scheduling period, and the
    work between two products is a dozen small operations (bench/README.md, "Search")."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
