"""Exact top-k search on a GPU: the same top-k as the plain `minisbert.retrieval.chunked_search` (the
loop of minisbert/retrieval.py), with nothing read back to the host while it loops over the blocks.

Called by `minisbert.fast.retrieval.fast_search` when the search runs on a CUDA device (and by the
tests on a CPU, where it computes the same thing). `minisbert.search.search` checks the inputs
with minisbert/search_inputs.py and documents the arguments, score functions and the tie rule.

Why. The GPU runs the work Python queues for it, in order, while Python goes on queueing. Anything
that reads a GPU value on the host (`if tensor.any()`, `int(tensor)`, `.item()`, `nonzero()`,
indexing with a boolean mask, which must learn how many entries it selects) makes Python wait
until the GPU has run everything queued before it, and the GPU then idles while Python queues the
next kernels. The plain path does that at every chunk (to check it, and to drop excluded pairs),
and the CPU fast path (fast/retrieval.py) at every block: its filters are sized by what they find.
Here every step has a size known in advance, so a whole search is queued in one go:

- Top-k of a block without a sort and without giving up the tie rule. Each entry becomes one
  int64 key, `_keys`: the high 32 bits are the float32 score's bits, turned into an int32 that
  orders as the score does; the low 32 bits are 2^32 - 1 - corpus row. Larger keys are larger
  scores, and of equal scores the lower row, and no two keys are equal, so `torch.topk` on the
  keys picks exactly the entries the plain path's stable sort puts first. The running top-k is
  kept as keys too: merging is a topk over [running, block's best]. `_decode` turns the keys back
  into scores and rows at the end.
- Checks without reading each chunk's outcome: per chunk, the first row whose norm term is not
  finite and the row with the largest norm term are kept on the device (`_CorpusChecks`), read back once, and
  raised in the plain path's order with its messages.
- Row norms without the plain path's second look at rows whose squares overflow or underflow
  (which must find those rows first, reading the device). Norms are summed in float32, as the
  plain path does, and the checks note on the device whether any came out inf, NaN or below
  2^-60. If one did (read with the checks, after the loop), the whole search runs again with
  norms summed in float64, where the square of any float32 value fits (`_row_norm_terms`). A
  row of zeros is such a row too (its norm cannot tell it from one whose squares underflowed):
  a corpus holding one is searched twice.
- Excluded (query id == corpus id) pairs are grouped by block once, before the loop
  (`_ExcludedPairs`); each block sets its own pairs to -inf with index tensors.

Streaming. A corpus on the device is read chunk by chunk as it is stored: a float16 or bfloat16
corpus takes half the memory and is upcast to float32 one chunk at a time. A corpus in CPU memory
is copied over chunk by chunk while the previous chunk is scored (`_CorpusChunks`), in its own
dtype (half the bytes for float16). In the loop, the host waits for the GPU in one place only: a
corpus in ordinary (pageable) CPU memory goes through two pinned buffers, and before refilling one
the host waits for the copy out of it, two chunks earlier, to end. A pinned corpus needs no wait.

Memory on the device, besides the corpus and the (Q, k) results: per block, the (Qc, Nc) float32
scores, their int64 keys and int32 temporaries, about 20 bytes an entry (670 MB at the CUDA
default block of 2^25); per chunk, its float32 copy (and for cosine its unit rows); for a
streamed corpus, two chunks in its own dtype.

Tested identical to the plain path (ties, excluded ids, half-precision corpora, errors) and for
the absence of host reads per chunk in tests/test_device_search.py.
"""

import torch

from ..search_inputs import TINY, SearchInputs, check_scores_fit, not_finite_error
from ..similarity import squared_row_norms

# The low half of a key holds 2^32 - 1 - corpus row, so rows up to 2^32 - 1 fit.
LOW_BITS = 2**32 - 1
MAX_CORPUS_ROWS = 2**32
# float32 -inf as an order-preserving int32 (see _flip_negatives): the smallest score there is.
NEG_INF_ORDERED = -(2**31) + 2**23 - 1
# The key a top-k slot holds before anything fills it; it decodes as padding (-inf, row -1).
EMPTY_KEY = NEG_INF_ORDERED * 2**32


def device_search(inputs: SearchInputs, float64_norms: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The (Q, k) scores (ranking keys 2 q·c - |c|² for euclidean) and corpus indices, best
    first, as `minisbert.retrieval.chunked_search` returns them. Reads the device from the host
    before the loop (to group excluded pairs, if any) and once after it (the checks), never in
    it. Works on any device. Runs again with `float64_norms` if a float32 norm was not to be
    trusted (see `_row_norm_terms`)."""
    queries, score, device = inputs.queries, inputs.score, inputs.device
    num_queries, num_docs, k = queries.shape[0], inputs.corpus.shape[0], inputs.k
    query_chunk_size, corpus_chunk_size = inputs.query_chunk_size, inputs.corpus_chunk_size
    if num_docs > MAX_CORPUS_ROWS:
        raise ValueError(
            f"corpus has {num_docs} rows; the device search numbers rows in 32 bits and takes at "
            f"most {MAX_CORPUS_ROWS}: search it in parts and merge the results with merge_top_k"
        )

    # Running best per query, as keys. Every tensor here is made on the device that uses it.
    top_keys = torch.full((num_queries, k), EMPTY_KEY, dtype=torch.int64, device=device)  # (Q, k)
    columns = torch.arange(min(corpus_chunk_size, num_docs), device=device)  # (Nc,)
    chunks = _CorpusChunks(inputs.corpus, corpus_chunk_size, device)
    checks = _CorpusChecks(inputs, checks_norms=not float64_norms)
    excluded = None if inputs.excluded is None else _ExcludedPairs(inputs)

    for chunk_number, doc_start in enumerate(range(0, num_docs, corpus_chunk_size)):
        chunk = chunks.get(chunk_number).float()  # (Nc, d) float32, upcast on the device
        doc_rows = columns[: chunk.shape[0]] + doc_start  # (Nc,) corpus rows
        norm_terms = _row_norm_terms(chunk, score, float64_norms)  # (Nc,)
        checks.add(norm_terms, doc_rows, doc_start)
        if score == "cosine":
            chunk = chunk / norm_terms.clamp_min(TINY)[:, None]  # (Nc, d) unit rows
        low_bits = LOW_BITS - doc_rows  # (Nc,) the low halves of this chunk's keys
        for query_number, query_start in enumerate(range(0, num_queries, query_chunk_size)):
            rows = slice(query_start, query_start + query_chunk_size)
            query_chunk = queries[rows]  # (Qc, d)
            # The plain path's products, so the scores are the same.
            if score == "euclidean":
                block = torch.addmm(-norm_terms, query_chunk, chunk.T, alpha=2)  # (Qc, Nc) 2 q·c - |c|²
            else:
                block = query_chunk @ chunk.T  # (Qc, Nc)
            if excluded is not None:
                excluded.drop(block, query_number, chunk_number)
            block_best = _keys(block, low_bits).topk(min(k, chunk.shape[0]), dim=1, sorted=False)
            both = torch.cat([top_keys[rows], block_best.values], dim=1)  # (Qc, k + k')
            top_keys[rows] = both.topk(k, dim=1).values  # (Qc, k), sorted: best first
        chunks.scored(chunk_number)

    if checks.raise_if_failed():  # the one read back to the host
        return device_search(inputs, float64_norms=True)
    return _decode(top_keys)


def _flip_negatives(bits: torch.Tensor) -> torch.Tensor:
    """float32 bits read as int32 <-> an int32 that orders as the float does; its own inverse.

    A float32 is a sign bit followed by the magnitude's bits, and read as an int32 the magnitudes
    of positive floats order correctly. Negative floats read as negative int32s, but a larger
    magnitude gives a larger int32; flipping every bit but the sign reverses that. (The sign bit
    is kept, so applying the map twice gives the bits back.) -0.0 maps below +0.0, so scores are
    made +0.0 first (`_keys`). NaN never reaches a result: the search refuses its inputs.
    """
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def _keys(block: torch.Tensor, low_bits: torch.Tensor) -> torch.Tensor:
    """(Qc, Nc) float32 scores and (Nc,) int64 2^32 - 1 - corpus row -> (Qc, Nc) int64 keys that
    order as (score descending, row ascending) does, all different. Changes -0.0 in the block
    to +0.0."""
    ordered = _flip_negatives(block.add_(0.0).view(torch.int32))  # (Qc, Nc); -0.0 + 0.0 = +0.0
    # high * 2^32 + low with 0 <= low < 2^32: the high halves decide, the low ones break ties.
    # One call, computed in int64 (the type both are promoted to): one pass over the block.
    return torch.add(low_bits, ordered, alpha=2**32)  # (Qc, Nc)


def _decode(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q, k) keys -> (Q, k) float32 scores and int64 corpus rows. A -inf score (an excluded
    pair, or a slot never filled) is padding: score -inf, row -1, as the plain path reports it."""
    high = (keys >> 32).to(torch.int32)  # (Q, k), exact: keys >> 32 fits in int32
    scores = _flip_negatives(high).view(torch.float32)  # (Q, k)
    rows = LOW_BITS - (keys & LOW_BITS)  # (Q, k)
    return scores, torch.where(scores == -torch.inf, -1, rows)


def _row_norm_terms(chunk: torch.Tensor, score: str, float64_norms: bool) -> torch.Tensor:
    """(Nc,) norm terms of the (Nc, d) float32 rows, as `minisbert.search_inputs.row_norm_terms`
    defines them: squared norms for euclidean (the same function), else norms, computed without
    any read back to the host.

    The plain path's `row_norms` (minisbert/similarity.py) sums squares in float32, finds the rows
    whose sums overflowed or underflowed (norm inf or below 2^-60), and measures them again:
    finding them reads the device. Here the float32 norms are kept, and `_CorpusChecks` notes
    whether any such row was met; if one was, the search is run again with `float64_norms`.
    Summed in float64, no square of a float32 overflows (3.4e38² = 1.2e77) or underflows (the
    smallest float32, 1.4e-45, squares to 2e-90), so one pass gives every norm, and rounding it to
    float32 gives inf exactly for rows too large for float32 (or holding inf or NaN), as the
    checks expect. That costs a float64 copy of the chunk and, on an H200, 5 times the float32
    pass's time (2.3 against 0.46 ms over 1,000,000 x 384 rows).
    """
    if score == "euclidean":
        return squared_row_norms(chunk)
    if float64_norms:
        return torch.linalg.vector_norm(chunk, dim=1, dtype=torch.float64).float()
    return torch.linalg.vector_norm(chunk, dim=1)


class _CorpusChecks:
    """The corpus checks of `SearchInputs.corpus_chunk`, kept on the device and read once.

    For each chunk: the first row whose norm term is NaN or inf, the row with the largest norm
    term, and the smallest norm term. `raise_if_failed` reads them all back at once and goes
    through the chunks in order, as the plain path would have, so the first failure it raises is
    the one the plain path raises. With `checks_norms` (norms summed in float32), a norm that is
    inf, NaN or below 2^-60 asks for the search again with float64 norms instead.
    """

    def __init__(self, inputs: SearchInputs, checks_norms: bool):
        self.inputs = inputs
        self.num_docs = inputs.corpus.shape[0]
        # Cosine scores lie in [-1, 1]; with no queries nothing is scored.
        self.fit_checked = inputs.score != "cosine" and inputs.queries.shape[0] > 0
        # Squared norms for euclidean are float32 sums in the plain path too: nothing to redo.
        self.checks_norms = checks_norms and inputs.score != "euclidean"
        self.per_chunk = []  # (4,) float64 each: first bad row (num_docs if none), largest norm term, its row, smallest

    def add(self, norm_terms: torch.Tensor, doc_rows: torch.Tensor, doc_start: int) -> None:
        """Note a chunk: its (Nc,) norm terms and (Nc,) corpus rows."""
        first_bad = torch.where(torch.isfinite(norm_terms), self.num_docs, doc_rows).amin()
        largest, column = norm_terms.max(dim=0)  # the first of equal maxima, as argmax gives
        smallest = norm_terms.min()
        # float64 holds every row number below 2^53 and every float32 exactly.
        self.per_chunk.append(
            torch.stack([first_bad.double(), largest.double(), (column + doc_start).double(), smallest.double()])
        )

    def raise_if_failed(self) -> bool:
        """Read the checks back to the host (one transfer) and raise the plain path's error.
        True if the search must run again with float64 norms (nothing was raised then)."""
        read = [torch.stack(self.per_chunk).flatten()]  # (4 C,)
        if self.fit_checked:
            query_term, query_row = self.inputs.query_norm_terms.max(dim=0)
            read.append(torch.stack([query_term.double(), query_row.double()]))  # (2,)
        values = torch.cat(read).tolist()
        per_chunk = [values[start : start + 4] for start in range(0, 4 * len(self.per_chunk), 4)]
        if self.fit_checked:
            query_term, query_row = values[-2:]
        if self.checks_norms and any(
            first_bad < self.num_docs or not smallest >= 2.0**-60 for first_bad, _, _, smallest in per_chunk
        ):
            return True
        for first_bad, largest, largest_row, _ in per_chunk:
            if first_bad < self.num_docs:
                raise not_finite_error("corpus", int(first_bad))
            if self.fit_checked:
                check_scores_fit(
                    self.inputs.score, int(query_row), query_term, int(largest_row), largest
                )
        return False


class _ExcludedPairs:
    """The (P, 2) excluded [query row, corpus row] pairs, grouped by block before the loop.

    The pairs are sorted by the block they fall in, on the device, and the host keeps, per block,
    where its pairs start and end (one read, before the loop). A block then sets its pairs to
    -inf with two index tensors: no boolean mask, whose size would have to be read back.
    """

    def __init__(self, inputs: SearchInputs):
        excluded, device = inputs.excluded, inputs.device
        self.query_chunk_size, self.corpus_chunk_size = inputs.query_chunk_size, inputs.corpus_chunk_size
        self.num_query_chunks = -(-inputs.queries.shape[0] // self.query_chunk_size)
        query_chunk = excluded[:, 0] // self.query_chunk_size  # (P,)
        doc_chunk = excluded[:, 1] // self.corpus_chunk_size  # (P,)
        block, order = (doc_chunk * self.num_query_chunks + query_chunk).sort()  # (P,), (P,)
        self.pairs = excluded[order]  # (P, 2) grouped by block
        blocks, counts = torch.unique_consecutive(block, return_counts=True)  # (B,), (B,)
        self.spans = {}  # block number -> (first pair, last pair + 1)
        end = 0
        for block_number, count in zip(*torch.stack([blocks, counts]).tolist()):
            self.spans[block_number] = (end, end + count)
            end += count
        self.minus_inf = torch.full((), -torch.inf, device=device)

    def drop(self, block: torch.Tensor, query_number: int, chunk_number: int) -> None:
        """Set the excluded entries of this (Qc, Nc) block to -inf, in place."""
        span = self.spans.get(chunk_number * self.num_query_chunks + query_number)
        if span is None:
            return
        pairs = self.pairs[span[0] : span[1]]  # (p, 2)
        query_rows = pairs[:, 0] - query_number * self.query_chunk_size  # (p,)
        doc_rows = pairs[:, 1] - chunk_number * self.corpus_chunk_size  # (p,)
        block.index_put_((query_rows, doc_rows), self.minus_inf)


class _CorpusChunks:
    """The corpus chunk by chunk, on the device, in the corpus's own dtype.

    A corpus already on the device (or a search on a CPU) is sliced. A corpus in CPU memory
    searched on a CUDA device is streamed: chunk i + 1 is copied over on a second CUDA stream
    while chunk i is scored on the current one. Two chunk-sized buffers on the device take turns
    (chunk i goes to buffer i % 2). The order of work is kept by events, on the device, without
    the host waiting:
    - the search waits (`wait_event`) for the copy of its chunk to end;
    - a copy into a buffer waits for the search to be done with the chunk it held before, two
      chunks earlier (`scored`).
    The GPU can copy from CPU memory while it computes only from pinned (page-locked) memory.
    A pinned corpus (`corpus.pin_memory()`) is copied from directly. Any other is staged through
    two pinned buffers, in turns as well: before the host refills one, it waits for the copy out
    of it, made two chunks earlier, to end; that copy waited for the search of the chunk before
    it, so the host never runs more than a few chunks ahead of the GPU. A pinned corpus saves
    that host copy and that wait.
    """

    def __init__(self, corpus: torch.Tensor, chunk_size: int, device: torch.device):
        self.corpus, self.chunk_size, self.device = corpus, chunk_size, device
        self.streamed = corpus.device.type == "cpu" and device.type == "cuda"
        if not self.streamed:
            return
        shape = (min(chunk_size, corpus.shape[0]), corpus.shape[1])
        self.compute_stream = torch.cuda.current_stream(device)
        self.copy_stream = torch.cuda.Stream(device)
        self.on_device = [torch.empty(shape, dtype=corpus.dtype, device=device) for _ in range(2)]
        for buffer in self.on_device:
            # Made on the compute stream, written on the copy stream: when they are freed, the
            # allocator must wait for the copy stream too before handing their memory out again.
            buffer.record_stream(self.copy_stream)
        # The buffers' memory may have been freed by work still queued on the compute stream.
        self.copy_stream.wait_stream(self.compute_stream)
        pinned = corpus.is_pinned() and corpus.is_contiguous()
        self.staging = None
        if not pinned:
            self.staging = [torch.empty(shape, dtype=corpus.dtype, pin_memory=True) for _ in range(2)]
        self.copied = [None, None]  # per buffer: the event that ends its latest copy
        self.used = [None, None]  # per buffer: the event that ends the search of its latest chunk

    def get(self, chunk_number: int) -> torch.Tensor:
        """Chunk `chunk_number`, (Nc, d) on the device in the corpus's dtype. Work queued on the
        current stream after this call sees it."""
        start = chunk_number * self.chunk_size
        rows = self.corpus[start : start + self.chunk_size]  # (Nc, d)
        if not self.streamed:
            return rows.to(self.device)  # the slice itself when the corpus is already there
        turn = chunk_number % 2
        source = rows
        if self.staging is not None:
            if self.copied[turn] is not None:
                self.copied[turn].synchronize()  # the copy out of it, two chunks ago, has ended
            source = self.staging[turn][: rows.shape[0]]
            source.copy_(rows)  # pageable -> pinned, on the CPU
        target = self.on_device[turn][: rows.shape[0]]
        with torch.cuda.stream(self.copy_stream):
            if self.used[turn] is not None:
                self.copy_stream.wait_event(self.used[turn])
            target.copy_(source, non_blocking=True)  # pinned -> device, in the background
            self.copied[turn] = self.copy_stream.record_event()
        self.compute_stream.wait_event(self.copied[turn])
        return target

    def scored(self, chunk_number: int) -> None:
        """Note that all the work reading chunk `chunk_number` has been queued."""
        if self.streamed:
            self.used[chunk_number % 2] = self.compute_stream.record_event()
