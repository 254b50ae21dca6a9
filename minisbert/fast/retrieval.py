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
once is the least any exact search must do. `_search_few` takes the corpus a span at a time: one
product for the span's scores, one pass for its rows' norms (which the checks and cosine need),
then one check, one filter and one merge for the whole span (below), so that a call costs a few
dozen torch calls per span rather than per block. Measuring the rows is a second read of them:
torch has no call that multiplies and measures in one pass, and reading a piece a second time
while it was still in the cache measured no faster (bench/retrieval.py, 2-core Intel Xeon), so a
call over embeddings as given costs about two reads of the corpus. Over a prepared corpus
(minisbert/search.py) nothing is left to check or measure, and a span is one product: about one
read. With a bfloat16 copy kept, the screen (below) reads half the bytes.

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
out, and only the few that may enter are scored in float32: minisbert/fast/screen.py says how. The
top-k is the same as without screening.

Ties. The running top-k is kept sorted by (score descending, index ascending); a later chunk
only holds higher indices, so a new score must be strictly better than the running k-th to enter,
and merges use a stable sort. Scores rescored one by one after screening may differ from the
float32 block's in the last bits (see the tie note in minisbert/retrieval.py).

Tested identical to the plain path, and against brute force, in tests/test_retrieval.py.
"""

import contextlib

import torch

from .. import cpu
from ..search_inputs import SearchInputs, drop_excluded, quick_sizes, sizes_are_ordinary
from .device_search import device_search
from .screen import F32_UNIT, GROUP_SIZE, _merge_candidates, _Screen

# Up to this many queries the corpus is read once, piece by piece (`_search_few`); past it, blocks
# of queries against chunks of corpus are faster (`_search_many`). Measured on a 2-core Intel Xeon
# with AMX (bench/retrieval.py; tried at 8 to 128 queries over 200,000 x 384): over embeddings as
# given, reading them once won up to 64 queries and lost at 128; over a prepared corpus, whose
# chunks need no preparing, blocks of queries won from 64 and tied at 32.
FEW_QUERIES = 64
FEW_QUERIES_PREPARED = 32
# The corpus piece a few-query search multiplies and measures in one call each: large, so that the
# calls are few, and bounded, since a float16 or bfloat16 corpus is copied to float32 a piece at
# a time.
PIECE_BYTES = 64 * 2**20
# Rows of corpus whose scores a few-query search checks, filters and merges at once: each span
# costs a few dozen torch calls, so spans are long.
SPAN_ROWS = 2**17

def fast_search(inputs: SearchInputs, bf16_screen: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The (Q, k) scores (ranking keys 2 q·c - |c|² for euclidean) and corpus indices, best
    first, as the plain search's loop (minisbert/retrieval.py) returns them. bf16_screen: see
    `minisbert.search.search`."""
    if inputs.device.type == "cuda":
        return device_search(inputs)  # screening is for CPUs: bf16_screen does not apply
    kept = inputs.prepared.screen if inputs.prepared is not None else None
    if bf16_screen is None:
        bf16_screen = inputs.device.type == "cpu" and cpu.native_bfloat16()
    few = FEW_QUERIES if inputs.prepared is None else FEW_QUERIES_PREPARED
    if inputs.queries.shape[0] <= min(few, inputs.query_chunk_size):
        # Few queries read the corpus a span at a time; a screen pays only where its copy is kept.
        return _search_few(inputs, kept if bf16_screen else None)
    return _search_many(inputs, bf16_screen)


def _search_few(inputs: SearchInputs, kept_screen: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """fast_search for at most FEW_QUERIES queries: the corpus a span at a time (module docstring)."""
    queries, score, device = inputs.queries, inputs.score, inputs.device
    num_queries, num_docs, dim, k = queries.shape[0], inputs.corpus.shape[0], queries.shape[1], inputs.k
    top_scores = torch.full((num_queries, k), -torch.inf, device=device)  # (Q, k)
    top_indices = torch.full_like(top_scores, -1, dtype=torch.long)  # (Q, k)
    # A span's (rows, Q) scores take no more memory than a block of the search by blocks would,
    # (corpus_chunk_size, query_chunk_size), and it is made of whole pieces.
    block_entries = inputs.corpus_chunk_size * inputs.query_chunk_size
    span_limit = max(1, min(SPAN_ROWS, block_entries // max(num_queries, 1)))
    piece = min(max(GROUP_SIZE, PIECE_BYTES // (4 * dim) // GROUP_SIZE * GROUP_SIZE), span_limit)
    span = span_limit // piece * piece
    height = -(-min(span, num_docs) // GROUP_SIZE) * GROUP_SIZE
    block_buffer = torch.empty(height, num_queries, device=device)  # (H, Q) corpus rows, queries
    unit_buffer = None
    if score == "cosine" and inputs.prepared is None:
        unit_buffer = torch.empty(min(piece, num_docs), dim, device=device)
    size_buffer = torch.empty(height, device=device)
    screen = None
    if kept_screen is not None and num_queries > 0:
        screen = _Screen(queries, score, num_queries, height, kept=True)

    for span_start in range(0, num_docs, span):
        span_rows = min(span, num_docs - span_start)
        if screen is not None and torch.isfinite(top_scores[:, -1]).all():
            rows, sizes = inputs.corpus_chunk(span_start, size=span_rows)  # views of the prepared rows
            screen.load_chunk(rows, _largest_norm(sizes, score, dim), sizes,
                              kept_screen[span_start : span_start + span_rows])
            if screen.merge(slice(0, num_queries), inputs.excluded, span_start, top_scores, top_indices):
                continue
        block = block_buffer[: -(-span_rows // GROUP_SIZE) * GROUP_SIZE]  # (H', Q)
        if inputs.prepared is not None:  # nothing to check or normalise: one product per span
            _score_rows(*inputs.corpus_chunk(span_start, size=span_rows), queries, score, block[:span_rows])
        else:
            _score_span(inputs, span_start, span_rows, piece, size_buffer, unit_buffer, block)
        if num_queries == 0:  # the corpus is still checked, as the plain search checks it
            continue
        with _one_thread(device):
            if span_rows < block.shape[0]:
                block[span_rows:] = -torch.inf
            if inputs.excluded is not None:
                drop_excluded(block[:span_rows].T, inputs.excluded, 0, span_start)
            _merge_block(block, span_start, top_scores, top_indices)
    return top_scores, top_indices


def _score_span(inputs: SearchInputs, span_start: int, span_rows: int, piece: int, size_buffer: torch.Tensor,
                unit_buffer: torch.Tensor | None, block: torch.Tensor) -> None:
    """Check the `span_rows` corpus rows from `span_start` and write their (span_rows, Q) scores
    (ranking keys for euclidean) into `block`.

    Each piece is measured (the sizes the checks need) and multiplied, and the sizes of the whole
    span are checked at once. A cosine divides the products by the row norms, (q·c) / |c|, rather
    than the rows before the product, q·(c / |c|), as the plain search does: the two agree to
    float32 rounding, and dividing the (span_rows, Q) products is much less work than dividing the
    rows. A span that fails the quick check (a row that is not finite, so small or so large that
    its squares left float32's range, or a score that could) is done again piece by piece as the
    plain search does it, which raises where the plain search raises.
    """
    queries, score, sizes = inputs.queries, inputs.score, size_buffer[:span_rows]
    for start in range(span_start, span_start + span_rows, piece):
        rows = inputs.corpus[start : start + piece].to(device=inputs.device, dtype=torch.float32)  # (n, d)
        part = slice(start - span_start, start - span_start + rows.shape[0])
        quick_sizes(rows, score, out=sizes[part])  # (n,)
        _score_rows(rows, sizes[part], queries, score, block[part])
    if not sizes_are_ordinary(sizes, score, inputs.largest_query_size):
        for start in range(span_start, span_start + span_rows, piece):
            rows, sizes = inputs.corpus_chunk(start, out=unit_buffer, size=piece)  # checked, unit rows for cosine
            _score_rows(rows, sizes, queries, score, block[start - span_start : start - span_start + rows.shape[0]])
    elif score == "cosine":
        block[:span_rows] /= sizes[:, None]


def _score_rows(rows: torch.Tensor, sizes: torch.Tensor, queries: torch.Tensor, score: str, out: torch.Tensor) -> None:
    """Write the (n, Q) scores (ranking keys 2 q·c - |c|² for euclidean) of (n, d) rows as scored,
    with their (n,) sizes, against (Q, d) queries into `out`."""
    if score == "euclidean":
        torch.addmm(-sizes[:, None], rows, queries.T, alpha=2, out=out)
    else:
        torch.mm(rows, queries.T, out=out)


def _search_many(inputs: SearchInputs, bf16_screen: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """fast_search for more than FEW_QUERIES queries: blocks of queries against chunks of corpus."""
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
    screen = _Screen(queries, score, query_chunk_size, height, kept_screen is not None) if bf16_screen else None

    for doc_start in range(0, num_docs, corpus_chunk_size):
        with _one_thread(device):
            chunk, sizes = inputs.corpus_chunk(doc_start, out=unit_buffer)  # (Nc, d), (Nc,)
        if screen is not None:
            kept = None if kept_screen is None else kept_screen[doc_start : doc_start + chunk.shape[0]]
            screen.load_chunk(chunk, _largest_norm(sizes, score, chunk.shape[1]), sizes, kept)
        for query_start in range(0, num_queries, query_chunk_size):
            query_chunk = queries[query_start : query_start + query_chunk_size]  # (Qc, d)
            rows = slice(query_start, query_start + query_chunk.shape[0])
            if screen is not None and screen.merge(
                rows, inputs.excluded, doc_start, top_scores[rows], top_indices[rows]
            ):
                continue
            block = block_buffer[: height * query_chunk.shape[0]].view(height, -1)  # (H, Qc)
            scores = block[: chunk.shape[0]]  # (Nc, Qc), a view into the block
            # (Nc, d) @ (d, Qc) rather than (Qc, d) @ (d, Nc): see the module docstring.
            _score_rows(chunk, sizes, query_chunk, score, scores)
            with _one_thread(device):
                if chunk.shape[0] < height:
                    block[chunk.shape[0] :] = -torch.inf
                if inputs.excluded is not None:
                    drop_excluded(scores.T, inputs.excluded, query_start, doc_start)
                _merge_block(block, doc_start, top_scores[rows], top_indices[rows])
    return top_scores, top_indices


def _largest_norm(sizes: torch.Tensor, score: str, dim: int) -> torch.Tensor:
    """An upper bound on the norms of a chunk's rows as scored, from their (Nc,) sizes."""
    if score == "cosine":
        # Unit rows (or zero), up to the float32 rounding of the norm and of the division.
        return torch.tensor(1 + 2 * (dim + 2) * F32_UNIT, device=sizes.device)
    if score == "euclidean":
        # The sizes are squared norms; 2^-100 stands in for squares that underflowed to zero.
        return (sizes.amax() + 2.0**-100).sqrt()
    return sizes.amax()


def _merge_block(
    block: torch.Tensor, doc_start: int, top_scores: torch.Tensor, top_indices: torch.Tensor
) -> None:
    """Merge one (H, Qc) score block (corpus rows, queries; H a multiple of GROUP_SIZE) into the
    running (Qc, k) top-k, in place.

    A score enters only if it is strictly above its query's current k-th best: an equal score
    cannot, because its corpus index is higher than every index already held. To find those few
    scores without comparing every one, each column is cut into groups of GROUP_SIZE corpus rows,
    each group reduced to its maximum, and only groups whose maximum beats the k-th best are
    opened.
    """
    k = top_scores.shape[1]
    kth = top_scores[:, -1]  # (Qc,)
    floor = _entry_floor(block, kth, k)  # (Qc,) or None
    groups = block.view(-1, GROUP_SIZE, block.shape[1])  # (H / G, G, Qc)
    group_maxima = groups.amax(dim=1)  # (H / G, Qc)
    promising = group_maxima > kth  # (H / G, Qc)
    if floor is not None:
        promising &= group_maxima >= floor
    rows, group = promising.T.nonzero(as_tuple=True)  # (P,), (P,) query, group
    if rows.numel() == 0:
        return
    values = groups[group, :, rows]  # (P, G)
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


def _entry_floor(block: torch.Tensor, kth: torch.Tensor, k: int) -> torch.Tensor | None:
    """(Qc,) lowest score that may enter from this (H, Qc) block, or None if there is no floor.

    Only needed for queries whose running top-k is not full yet (kth = -inf, in the first chunk):
    there every finite score beats kth, so the block's own k-th best bounds the candidates.
    Ties at that value all stay candidates, so the stable sort still sees every contender.
    """
    not_full = torch.isneginf(kth)
    if block.shape[0] <= k or not not_full.any():
        return None
    if not_full.all():  # the usual case: the first chunk; spares a copy of the block
        return block.topk(k, dim=0).values[-1]
    floor = torch.full_like(kth, -torch.inf)
    floor[not_full] = block[:, not_full].topk(k, dim=0).values[-1]
    return floor
