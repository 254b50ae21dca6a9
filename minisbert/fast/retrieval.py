"""Exact top-k search, fast: the same top-k as the plain loop of minisbert/retrieval.py (score a
block, take its top-k, merge; run on checked inputs by `minisbert.retrieval.chunked_search`), with
less work per block.

Called by `minisbert.search.search` (its default, fast=True), which checks the inputs with
minisbert/search_inputs.py and documents the arguments, score functions and the tie rule. On a
CUDA device `fast_search` hands the search to minisbert/fast/device_search.py: what follows is
built for a CPU, where reading a result to decide what to do next costs nothing, and on a GPU
every such read stalls the device.

A few queries. With few queries (at most FEW_QUERIES) the product does little arithmetic per
corpus row, and the search can go no faster than the corpus can be read from memory: reading it
once is the least any exact search must do. `_search_few` takes the corpus a span at a time, with
one product for the span's (Q, span) scores, then one check, one filter and one merge for the
whole span (as below), so that a call costs a few dozen torch calls per span rather than per
block. What else it reads depends on the score:
- a dot product over embeddings as given is checked without measuring the rows: one more row,
  the detector, is multiplied with the span beside the queries, and its scores are finite only
  if every row is fit to search (`_detector`). One read of the corpus;
- cosine and euclidean need every row's norm (the scores are divided by it, or use its square),
  and torch has no call that multiplies and measures in one pass. Each piece of NORM_PIECE_ROWS
  rows is measured right after its product, while it is still in the cache;
- a prepared corpus (minisbert/search.py) has nothing left to check or measure: one read. From
  SCREENED_FEW_QUERIES queries, its bfloat16 copy, where one is kept, screens each span (below)
  and reads half the bytes; for one query, its int8 copy, where one is kept, screens each span
  and reads a quarter (minisbert/fast/int8_screen.py).
The first span is short, so that the running k-th best is known early: every later span is
filtered against it rather than sorted, or screened. A screened search's spans then grow step by step
(SPAN_GROWTH), so that each meets a k-th best high enough to screen it.

Many queries. The matrix product costs 2·Q·N·d FLOP and is compute-bound when the
query chunk is large (BLAS-3), so the time to beat is the product itself; choosing the k best must
add little. Sorting every block, as the plain path does, or calling `torch.topk` on it, would cost
about a quarter as much as the product that made the block. Instead each query's column of the
block is cut into groups of 64 corpus rows and each group reduced to its maximum (one vectorised
pass that costs about 1% of the product), and only groups whose maximum beats that query's
current k-th best score are looked into. After the first chunks the k-th best is high and almost
every group is skipped: for random data a query gains about k·ln(N / corpus_chunk_size) new
entries over a whole pass. Three details, each measured (bench/retrieval.py, on a 2-core AVX2
CPU):
- blocks are laid out (corpus rows, queries), (Nc, d) @ (d, Qc): MKL computes that product 3 to
  9% faster than (Qc, d) @ (d, Nc), with the same bits at the default block sizes;
- the work between two products (checking a chunk, filtering and merging a block: a dozen small
  operations) runs on one thread (`_one_thread`); spread over two threads, each operation waits
  for both, which on a busy machine made the search up to twice as slow;
- the score blocks are written into one reused buffer, so the allocator does not hand back
  fresh, page-faulting memory for every block.

Screening. Most of the product is spent on scores that cannot enter the top-k. Where the CPU
multiplies bfloat16 natively, a bfloat16 product with a proven bound on its error rules most of them
out, and only the few that may enter are scored in float32: minisbert/fast/screen.py says how. Where
torch's int8 product is exact and measured well quicker than the product it replaces, an int8 product
does the same for cosine and dot (minisbert/fast/int8_screen.py's `Int8Blocks`; `_many_query_blocks`
chooses). The top-k is the same as without screening.

Ties. The running top-k is kept sorted by (score descending, index ascending); a later chunk
only holds higher indices, so a new score must be strictly better than the running k-th to enter,
and merges use a stable sort. Scores rescored one by one after screening may differ from the
float32 block's in the last bits (see the tie note in minisbert/retrieval.py).

Tested identical to the plain path, and against brute force, in tests/test_retrieval.py.
"""

import contextlib

import torch

from .. import cpu
from ..search_inputs import SearchInputs, drop_excluded, quick_norm_terms, norm_terms_are_ordinary, unit_divisors
from .device_search import device_search
from .int8_screen import Int8Blocks, OneQueryScreen, int8_blocks_exact, int8_blocks_pay
from .screen import F32_UNIT, GROUP_SIZE, Bfloat16Blocks, _merge_candidates, _Screen
from .span_product import SpanProduct

# Up to this many queries the corpus is read a span at a time (`_search_few`); past it, blocks of
# queries against chunks of corpus are faster (`_search_many`). Measured on a 2-core Intel Xeon with
# AMX over 200,000 and 1,000,000 x 384 (tried at 16 to 512 queries): over embeddings as given,
# spans won up to 128 queries (by 1.2-1.5 times) and lost from 192; over a prepared corpus with
# its bfloat16 copy, spans won up to 384 queries (by 1.05-1.3 times) and tied at 512.
FEW_QUERIES = 128
FEW_QUERIES_PREPARED = 384
# ... but over embeddings as given, where the search by blocks screens with int8 products, only up to
# this many. Over 200,000 x 384 rows on a 2-core AMD EPYC (Zen 4), spans took 54, 84 and 125 ms at
# 32, 64 and 96 cosine queries, blocks 84, 90 and 104; for dot 77, 90 and 111 against 89, 84 and
# 101 at 48, 64 and 80. Over a prepared corpus the two stayed within 5% of each other from 192 to
# 384 queries (spans 110, 140 and 204 ms at 192, 256 and 384 cosine queries; blocks 111, 136 and
# 197), so FEW_QUERIES_PREPARED stays as measured on the Xeon.
FEW_QUERIES_INT8 = 64
# From this many queries a few-query search over a prepared corpus with a bfloat16 copy screens
# with it. With fewer, the bfloat16 product saves little (a product of 1 or 2 rows with a
# bfloat16 span took 0.7 to 0.9 times as long as with the float32 span): screened, the search
# took 1.0-1.1 times as long at 1 and 2 queries, and 0.55-0.8 times as long from 4 to 32 (same
# machine and sizes).
SCREENED_FEW_QUERIES = 4
# A few-query search over a corpus stored in another dtype than float32 copies it to float32 this
# many bytes at a time.
PIECE_BYTES = 64 * 2**20
# Rows of corpus a few-query search multiplies, checks, filters and merges at once: each span
# costs a few dozen torch calls, so spans are long. The first span is short (see `_search_few`).
# No span is a multiple of 4096 rows long: the (Q, span) scores would then have rows 16 KB apart
# or a power of two more, which the cache maps onto the same few sets, and a product of 4 to 12
# query rows with 2^17 corpus rows took 2 to 2.4 times as long as with 2^17 - 64 (2-core Intel
# Xeon with AMX, MKL 2024.2, d = 384). Spans of 2^19 - 64 rows were up to 7% faster than of
# 2^17 - 64 at 1 query over 200,000 and 1,000,000 rows, and no slower at 16.
SPAN_ROWS = 2**19 - GROUP_SIZE
# ... and a span's (Q', span) float32 scores hold at most this many entries (16 MB): at 32
# queries, spans of 2^18 rows made a screened search 1.4 times as long as spans of 2^17.
SPAN_ENTRIES = 2**22
FIRST_SPAN_ROWS = 4096 - GROUP_SIZE
# A cosine or euclidean search over embeddings as given measures each piece of this many rows just
# after multiplying it. Over 200,000 x 384 rows with 2 factor rows, on a 2-core AMD EPYC (Zen 4):
# the product and the norms took 18.8 ms one after the other over the whole corpus, 13.4 ms piece
# by piece at 4096 rows (13.8 at 2048 and at 8192, 16.5 at 1024, 17.0 at 32768). On a 2-core Intel
# Xeon with AMX, measuring in pieces was no faster (nor slower).
NORM_PIECE_ROWS = 4096
# A screened search's spans grow this many times at each step: a span much longer than all the
# rows before it meets a k-th best too low to screen it, so it fails the screen and is done in
# float32 (spans of full length after the first made screened searches up to 2 times as long at
# 2 to 32 queries; growing 4 times at a time, the screen passed).
SPAN_GROWTH = 4

def fast_search(inputs: SearchInputs, bf16_screen: bool | None,
                int8_screen: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The (Q, k) scores (ranking keys 2 q·c - |c|² for euclidean) and corpus indices, best
    first, as the plain search's loop (minisbert/retrieval.py) returns them. bf16_screen,
    int8_screen: see `minisbert.search.search`."""
    if inputs.device.type == "cuda":
        return device_search(inputs)  # screening is for CPUs: bf16_screen does not apply
    kept = inputs.prepared.screen if inputs.prepared is not None else None
    if bf16_screen is None:
        bf16_screen = inputs.device.type == "cpu" and cpu.native_bfloat16()
    num_queries = inputs.queries.shape[0]
    few = FEW_QUERIES if inputs.prepared is None else FEW_QUERIES_PREPARED
    # Up to FEW_QUERIES_INT8 (and a query chunk) the search reads spans whatever its blocks would be.
    blocks = None
    if num_queries > min(FEW_QUERIES_INT8, few, inputs.query_chunk_size):
        blocks = _many_query_blocks(inputs, bf16_screen, int8_screen)
        if blocks is Int8Blocks and inputs.prepared is None:
            few = FEW_QUERIES_INT8
    if num_queries <= min(few, inputs.query_chunk_size):
        # Few queries read the corpus a span at a time; a screen pays only where its copy is kept,
        # and only from SCREENED_FEW_QUERIES queries.
        screened = bf16_screen and num_queries >= SCREENED_FEW_QUERIES
        return _search_few(inputs, kept if screened else None)
    return _search_many(inputs, blocks)


def _many_query_blocks(inputs: SearchInputs, bf16_screen: bool, int8_screen: bool | None):
    """The approximate blocks a search of many queries screens with: int8 ones where they run
    exactly and `int8_screen` asks for them (None: where they pay, `int8_blocks_pay`), else
    bfloat16 ones if `bf16_screen`; None for no screen."""
    dim = inputs.queries.shape[1]
    if inputs.score != "euclidean" and inputs.device.type == "cpu" and int8_screen is not False:
        if int8_blocks_exact(dim) if int8_screen else int8_blocks_pay(dim, bf16_screen):
            return Int8Blocks
    return Bfloat16Blocks if bf16_screen else None


def _search_few(inputs: SearchInputs, kept_screen: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """fast_search for at most FEW_QUERIES queries: the corpus a span at a time (module docstring)."""
    queries, score, device = inputs.queries, inputs.score, inputs.device
    num_queries, num_docs, dim, k = queries.shape[0], inputs.corpus.shape[0], queries.shape[1], inputs.k
    top_scores = torch.full((num_queries, k), -torch.inf, device=device)  # (Q, k)
    top_indices = torch.full_like(top_scores, -1, dtype=torch.long)  # (Q, k)
    factors = _factors(inputs)  # (Q', d): the queries, then the detector row if any
    # A span's (Q', rows) scores take no more memory than a block of the search by blocks would,
    # (query_chunk_size, corpus_chunk_size). A corpus stored in another dtype than float32 is
    # copied to float32 a piece at a time, so its spans are one piece long.
    block_entries = inputs.corpus_chunk_size * inputs.query_chunk_size
    span = min(SPAN_ROWS, min(SPAN_ENTRIES, block_entries) // max(1, factors.shape[0]))
    if inputs.corpus.dtype != torch.float32 or inputs.corpus.device != device:
        span = min(span, PIECE_BYTES // (4 * dim))
    span = _span_length(span)
    height = -(-min(span, num_docs) // GROUP_SIZE) * GROUP_SIZE
    block_buffer = torch.empty(factors.shape[0] * height, device=device)
    product = SpanProduct(factors, height)  # the quickest way to multiply spans here
    screen = one_query = None
    if kept_screen is not None and num_queries > 0:
        screen = _Screen(queries, Bfloat16Blocks(queries, score, num_queries, height, kept=True))
    kept_int8 = inputs.prepared.int8 if inputs.prepared is not None else None
    if kept_int8 is not None and num_queries == 1:
        one_query = OneQueryScreen(queries, kept_int8, height)
        one_query = one_query if one_query.usable() else None
    growth = SPAN_GROWTH if screen is not None or one_query is not None else None

    # The first span is short: its top-k is found by sorting (`_entry_floor`), which costs far more
    # per score than the group filter that every later span goes through against its k-th best.
    for span_start, span_rows in _spans(num_docs, span, k, growth):
        if one_query is not None:
            rows, _ = inputs.corpus_chunk(span_start, size=span_rows)  # views of the prepared rows
            if one_query.merge(rows, kept_int8.span(span_start, span_start + span_rows), inputs.excluded,
                               span_start, top_scores, top_indices):
                continue
        if screen is not None and torch.isfinite(top_scores[:, -1]).all():
            rows, norm_terms = inputs.corpus_chunk(span_start, size=span_rows)  # views of the prepared rows
            screen.load_chunk(rows, _largest_norm(norm_terms, score, dim), norm_terms,
                              kept_screen[span_start : span_start + span_rows])
            if screen.merge(slice(0, num_queries), inputs.excluded, span_start, top_scores, top_indices):
                continue
        width = -(-span_rows // GROUP_SIZE) * GROUP_SIZE
        block = block_buffer[: factors.shape[0] * width].view(-1, width)  # (Q', W) queries, corpus rows
        _score_span(inputs, span_start, span_rows, product, block[:, :span_rows])
        if num_queries == 0:  # the corpus is still checked, as the plain search checks it
            continue
        with _one_thread(device):
            scores = block[:num_queries]  # (Q, W)
            if span_rows < width:
                scores[:, span_rows:] = -torch.inf
            if inputs.excluded is not None:
                drop_excluded(scores[:, :span_rows], inputs.excluded, 0, span_start)
            _merge_block(scores, span_start, top_scores, top_indices)
    return top_scores, top_indices


def _spans(num_docs: int, span: int, k: int, growth: int | None):
    """(start, rows) of each span of a few-query search: a short first span, then spans of `span`
    rows, or spans growing `growth` times at each step up to `span` rows."""
    start, rows = 0, min(span, _span_length(max(FIRST_SPAN_ROWS, 4 * k + GROUP_SIZE)))
    while start < num_docs:
        yield start, min(rows, num_docs - start)
        start += rows
        rows = span if growth is None else min(span, _span_length(rows * growth))


def _span_length(rows: int) -> int:
    """At most `rows` (at least one group), in whole groups, and not a multiple of 4096 (see
    SPAN_ROWS)."""
    span = max(GROUP_SIZE, rows // GROUP_SIZE * GROUP_SIZE)
    return span - GROUP_SIZE if span % 4096 == 0 else span


def _factors(inputs: SearchInputs) -> torch.Tensor:
    """(Q', d) what a few-query search multiplies each corpus span with: the Q queries, and for a
    dot product over embeddings as given one more row, the detector, which proves the corpus fit
    for the search without measuring it (`_detector`)."""
    if inputs.score == "dot" and inputs.prepared is None:
        return torch.cat([inputs.queries, _detector(inputs)[None]])
    return inputs.queries


def _detector(inputs: SearchInputs) -> torch.Tensor:
    """(d,) the detector row of a dot-product search over embeddings as given: every entry s =
    max(1, 8·√d·|q|), |q| the largest query norm.

    The plain search refuses a corpus row that is not finite, or whose norm |c| could make a score
    pass float32's range (|q| |c| above LARGEST_SCORE, just under 2^127; see
    minisbert/search_inputs.py). Finding |c| takes a second pass over the rows. The detector's
    product with a row, s·Σ c_j, comes with the scores instead, and it is finite only when the
    row passes: a NaN or an inf in the row makes it NaN or inf; and since every step of a float32
    sum, fused or not, overflows when one of its terms s·c_j reaches 2^129 (twice float32's
    largest number), a finite product means every |c_j| < 2^129 / s, so |c| < √d·2^129 / s
    <= 2^126 / |q| and |q| |c| < 2^126. The converse need not hold: a row of very large entries
    can make the product overflow although the row passes, and then its span is checked again
    as the plain search checks it (`_score_span`), which only costs time.
    """
    largest = 0.0 if inputs.largest_query_norm_term is None else inputs.largest_query_norm_term[1]
    scale = max(1.0, 8 * inputs.queries.shape[1] ** 0.5 * largest)
    return torch.full((inputs.queries.shape[1],), scale, device=inputs.device)


def _score_span(inputs: SearchInputs, span_start: int, span_rows: int, product: SpanProduct,
                block: torch.Tensor) -> None:
    """Check the `span_rows` corpus rows from `span_start` and write their (Q', span_rows) scores
    (ranking keys for euclidean) into `block`: one row per query, and for a dot product over
    embeddings as given, the detector's row last (`_detector`).

    One product makes the products q·c (`product`, minisbert/fast/span_product.py, with the factor
    rows of `_factors`), and `_finish_scores` turns them into scores. A prepared corpus needs
    nothing more. Over embeddings as given, a dot product is checked by its detector row; cosine
    and euclidean need the rows' norm terms, and measure each piece of NORM_PIECE_ROWS rows just
    after its product. A cosine divides the products by the row norms, (q·c) / |c|, rather than
    the rows before the product, q·(c / |c|), as the plain search does: the two agree to float32
    rounding, and dividing the (Q, span_rows) products is much less work than dividing the rows.
    A span that fails the quick check (a row that is not finite, so small or so large that its
    squares left float32's range, or a score that could) is done again piece by piece as the
    plain search does it, which raises where the plain search raises.
    """
    score, end = inputs.score, span_start + span_rows
    if inputs.prepared is not None:
        rows, norm_terms = inputs.corpus_chunk(span_start, size=span_rows)  # views of the prepared rows
        _score_span_rows(rows, norm_terms, product, score, block)
        return
    rows = inputs.corpus[span_start:end].to(device=inputs.device, dtype=torch.float32)  # (n, d)
    if score == "dot":
        _score_span_rows(rows, None, product, score, block)
        detected = block[inputs.queries.shape[0]]  # the detector's row, after the queries'
        smallest, largest = (float(value) for value in torch.aminmax(detected))
        ordinary = -torch.inf < smallest and largest < torch.inf  # False for NaN too
    else:
        norm_terms = torch.empty(span_rows, device=inputs.device)  # (n,)
        for start in range(0, span_rows, NORM_PIECE_ROWS):
            piece = slice(start, min(start + NORM_PIECE_ROWS, span_rows))
            product(rows[piece], block[:, piece])
            quick_norm_terms(rows[piece], score, out=norm_terms[piece])  # the piece is in the cache
        ordinary = norm_terms_are_ordinary(norm_terms, score, inputs.largest_query_norm_term)
        if ordinary:
            _finish_scores(block, norm_terms, score)
    if not ordinary:
        piece = inputs.corpus_chunk_size
        for start in range(span_start, end, piece):
            # Checked rows (unit rows for cosine), as the plain search reads them.
            rows, norm_terms = inputs.corpus_chunk(start, size=min(piece, end - start))
            part = block[: inputs.queries.shape[0], start - span_start : start - span_start + rows.shape[0]]
            _score_rows(rows, norm_terms, inputs.queries, score, part.T)


def _score_span_rows(rows: torch.Tensor, norm_terms: torch.Tensor | None, product: SpanProduct, score: str,
                     block: torch.Tensor) -> None:
    """Write the (Q', n) scores of (n, d) rows that need no measuring (a prepared corpus's, unit
    rows for cosine; or embeddings as given for a dot product) against the product's factor rows
    into `block` (ranking keys for euclidean, which needs the (n,) norm terms)."""
    product(rows, block)
    if score == "euclidean":
        _finish_scores(block, norm_terms, score)


def _finish_scores(block: torch.Tensor, norm_terms: torch.Tensor, score: str) -> None:
    """Turn the (Q', n) products q·c in `block` into scores, in place: for cosine divided by the
    rows' norms, for euclidean the ranking keys 2 q·c - |c|² (doubling is exact, so this rounds
    once, as the plain search's `addmm` does); a dot product is already its score."""
    if score == "cosine":
        block /= norm_terms
    elif score == "euclidean":
        block.mul_(2).sub_(norm_terms)


def _score_rows(rows: torch.Tensor, norm_terms: torch.Tensor | None, queries: torch.Tensor, score: str,
                out: torch.Tensor) -> None:
    """Write the (n, Q) scores (ranking keys 2 q·c - |c|² for euclidean, which needs the (n,)
    norm terms) of (n, d) rows as scored against (Q, d) queries into `out`. `out` may be the
    transpose of a (Q, n) block: torch then computes the product in that layout, with the same
    bits."""
    if score == "euclidean":
        torch.addmm(-norm_terms[:, None], rows, queries.T, alpha=2, out=out)
    else:
        torch.mm(rows, queries.T, out=out)


def _search_many(inputs: SearchInputs, blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """fast_search for more than FEW_QUERIES queries: blocks of queries against chunks of corpus,
    screened with `blocks` (`_many_query_blocks`) if not None."""
    queries, score, device = inputs.queries, inputs.score, inputs.device
    num_queries, num_docs, k = queries.shape[0], inputs.corpus.shape[0], inputs.k
    query_chunk_size, corpus_chunk_size = inputs.query_chunk_size, inputs.corpus_chunk_size
    kept_screen = inputs.prepared.screen if inputs.prepared is not None else None

    # Running best per query, kept sorted by (score desc, index asc).
    top_scores = torch.full((num_queries, k), -torch.inf, device=device)  # (Q, k)
    top_indices = torch.full_like(top_scores, -1, dtype=torch.long)  # (Q, k)
    # One reusable buffer for the score blocks, which are laid out (corpus rows, queries): one
    # column per query. Its height is rounded up to whole groups; rows past the chunk hold -inf.
    height = -(-min(corpus_chunk_size, num_docs) // GROUP_SIZE) * GROUP_SIZE
    block_buffer = torch.empty(height * min(query_chunk_size, num_queries), device=device)
    # Cosine scores unit rows, written into one reusable buffer.
    unit_buffer = None
    if score == "cosine" and inputs.prepared is None:
        unit_buffer = torch.empty(min(corpus_chunk_size, num_docs), queries.shape[1], device=device)
    screen = None
    if blocks is Int8Blocks:
        screen = _Screen(queries, Int8Blocks(queries, query_chunk_size, height))
    elif blocks is Bfloat16Blocks:
        screen = _Screen(queries, Bfloat16Blocks(queries, score, query_chunk_size, height, kept_screen is not None))

    # A screened cosine over embeddings as given leaves each chunk undivided until a block fails
    # the screen: the screen makes its own unit rows piece by piece (`_Screen.load_chunk`). Over
    # 200,000 x 384 rows and 1,000 queries on a 2-core AMD EPYC (Zen 4), in three runs taken in
    # turn, the search took 541, 620 and 619 ms dividing every chunk first, 535, 588 and 591 so.
    divide_late = unit_buffer is not None and screen is not None
    for doc_start in range(0, num_docs, corpus_chunk_size):
        with _one_thread(device):
            chunk, norm_terms = inputs.corpus_chunk(doc_start, out=unit_buffer, unit=not divide_late)  # (Nc, d)
        divisors = unit_divisors(norm_terms) if divide_late else None  # (Nc, 1)
        if screen is not None:
            kept = None if kept_screen is None else kept_screen[doc_start : doc_start + chunk.shape[0]]
            screen.load_chunk(chunk, _largest_norm(norm_terms, score, chunk.shape[1]), norm_terms, kept, divisors)
        for query_start in range(0, num_queries, query_chunk_size):
            query_chunk = queries[query_start : query_start + query_chunk_size]  # (Qc, d)
            rows = slice(query_start, query_start + query_chunk.shape[0])
            if screen is not None and screen.merge(
                rows, inputs.excluded, doc_start, top_scores[rows], top_indices[rows]
            ):
                continue
            if divisors is not None:  # the screen failed: the chunk's unit rows, once
                chunk = torch.div(chunk, divisors, out=unit_buffer[: chunk.shape[0]])
                divisors = None
            block = block_buffer[: height * query_chunk.shape[0]].view(height, -1)  # (H, Qc)
            scores = block[: chunk.shape[0]]  # (Nc, Qc), a view into the block
            # (Nc, d) @ (d, Qc) rather than (Qc, d) @ (d, Nc): see the module docstring.
            _score_rows(chunk, norm_terms, query_chunk, score, scores)
            with _one_thread(device):
                if chunk.shape[0] < height:
                    block[chunk.shape[0] :] = -torch.inf
                if inputs.excluded is not None:
                    drop_excluded(scores.T, inputs.excluded, query_start, doc_start)
                _merge_block(block.T, doc_start, top_scores[rows], top_indices[rows])
    return top_scores, top_indices


def _largest_norm(norm_terms: torch.Tensor, score: str, dim: int) -> torch.Tensor:
    """An upper bound on the norms of a chunk's rows as scored, from their (Nc,) norm terms."""
    if score == "cosine":
        # Unit rows (or zero), up to the float32 rounding of the norm and of the division.
        return torch.tensor(1 + 2 * (dim + 2) * F32_UNIT, device=norm_terms.device)
    if score == "euclidean":
        # The norm terms are squared norms; 2^-100 stands in for squares that underflowed to zero.
        return (norm_terms.amax() + 2.0**-100).sqrt()
    return norm_terms.amax()


def _merge_block(
    scores: torch.Tensor, doc_start: int, top_scores: torch.Tensor, top_indices: torch.Tensor
) -> None:
    """Merge one (Qc, H) block of scores (queries, corpus rows; H a multiple of GROUP_SIZE) into
    the running (Qc, k) top-k, in place. The block may be the transpose of an (H, Qc) one.

    A score enters only if it is strictly above its query's current k-th best: an equal score
    cannot, because its corpus index is higher than every index already held. To find those few
    scores without comparing every one, each query's scores are cut into groups of GROUP_SIZE
    corpus rows, each group reduced to its maximum, and only groups whose maximum beats the k-th
    best are opened.
    """
    k = top_scores.shape[1]
    kth = top_scores[:, -1]  # (Qc,)
    groups = scores.unflatten(1, (-1, GROUP_SIZE))  # (Qc, H / G, G)
    # Reduced along the block's rows in memory: across the other direction torch's reduction
    # took 34 times as long on a (1024, 8192) block.
    if scores.stride(1) == 1:
        group_maxima = groups.amax(dim=2)  # (Qc, H / G)
    else:  # the transpose of an (H, Qc) block
        group_maxima = scores.T.unflatten(0, (-1, GROUP_SIZE)).amax(dim=1).T  # (Qc, H / G)
    floor = _entry_floor(scores, group_maxima, kth, k)  # (Qc,) or None
    promising = group_maxima > kth[:, None]  # (Qc, H / G)
    if floor is not None:
        promising &= group_maxima >= floor[:, None]
    rows, group = promising.nonzero(as_tuple=True)  # (P,), (P,) query, group
    if rows.numel() == 0:
        return
    values = groups[rows, group]  # (P, G)
    enters = values > kth[rows, None]  # (P, G)
    if floor is not None:
        enters &= values >= floor[rows, None]
    pair, offset = enters.nonzero(as_tuple=True)  # (M,), (M,)
    # nonzero() lists (query, group) pairs query by query with groups ascending, and offsets
    # ascending within a group, so the candidates are sorted by query, then by corpus index.
    cand_rows = rows[pair]  # (M,)
    cand_cols = group[pair] * GROUP_SIZE + offset  # (M,)
    _merge_candidates(cand_rows, cand_cols + doc_start, values[pair, offset], top_scores, top_indices)


@contextlib.contextmanager
def _one_thread(device: torch.device):
    """Run the torch operations inside on one CPU thread.

    Each operation that torch spreads over several threads ends by waiting for all of them, and
    on a machine busy with other work a thread may wait a whole scheduling period for a core.
    Measured on a 2-core AVX2 CPU at a load of 7: comparing 1000 x 128 numbers took 0.15 ms on one
    thread and 11 ms on two. The work between two matrix products is a dozen such operations
    and little arithmetic, so it runs on one thread; the products keep every thread. The count
    is set back on the way out (torch.set_num_threads sets this thread's count, and the default
    for threads that start using torch meanwhile).
    """
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _entry_floor(
    scores: torch.Tensor, group_maxima: torch.Tensor, kth: torch.Tensor, k: int
) -> torch.Tensor | None:
    """(Qc,) a score below which nothing in this (Qc, H) block can enter, or None if there is no
    such floor.

    Only needed for queries whose running top-k is not full yet (kth = -inf, in the first chunk):
    there every finite score beats kth. The k-th largest of a query's (H / G) group maxima is
    such a floor: k groups reach it, so the block holds at least k scores that high, and its own
    k-th best is no lower. Taken from the maxima rather than the scores, it costs a top-k over
    G = 64 times fewer numbers (over an 8,192 x 1,024 block laid out (corpus rows, queries), the
    top-k of the scores took 62 ms on one thread). Ties at that value all stay candidates, so
    the stable sort still sees every contender. With k groups or fewer there is no such floor
    but the block's own k-th best score, found the slow way.
    """
    not_full = torch.isneginf(kth)
    if scores.shape[1] <= k or not not_full.any():
        return None
    if group_maxima.shape[1] > k:
        floors = group_maxima.topk(k, dim=1).values[:, -1]  # (Qc,)
    else:
        floors = scores.topk(k, dim=1).values[:, -1]  # (Qc,)
    return torch.where(not_full, floors, -torch.inf)
