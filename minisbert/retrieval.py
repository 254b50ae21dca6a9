"""Exact top-k search: for each query embedding, the k corpus embeddings that score best.

Scoring Q queries against N documents of dimension d is one matrix product, (Q, d) @ (d, N), and
the answer is the k best columns of each row. Materialising the whole (Q, N) score matrix needs
4·Q·N bytes (8 GB for 1,000 queries over 2M documents), so `search` walks the corpus in chunks and
the queries in chunks, scores one (query_chunk, corpus_chunk) block at a time, and merges each
block into a running top-k kept on the device. Extra memory is a float32 score block (and a
bfloat16 one when screening, below) plus copies of one corpus chunk, whatever N is; the corpus is
read once.

Score functions (`score=`):
    cosine     q·c / (|q| |c|)                    larger is better
    dot        q·c                                larger is better
    euclidean  |q - c| = sqrt(|q|² - 2 q·c + |c|²)  smaller is better; returned as the distance

Why it is fast on a CPU. The matrix product costs 2·Q·N·d FLOP and is compute-bound when the
query chunk is large (BLAS-3), so the time to beat is the product itself; choosing the k best must
add little. Calling `torch.topk` on every block would cost about a quarter as much as the product
that made the block. Instead each block row is cut into groups of 64 columns and each group
reduced to its maximum (one vectorised pass that costs about 1% of the product), and only groups
whose maximum beats that query's current k-th best score are looked into. After the first chunks
the k-th best is high and almost every group is skipped: for random data a query gains about
k·ln(N / corpus_chunk_size) new entries over a whole pass.

Screening. Most of the product is spent on scores that cannot enter the top-k. Where the CPU
multiplies bfloat16 natively (AVX512-BF16 or AMX), a bfloat16 product runs about three times as
fast as a float32 one, and it is accurate enough to rule those scores out: a proven bound on its
error (`_error_bounds`, about 2·2^-8 |q| |c|) turns each approximate score into an upper bound on
the exact one. Once a query's top-k is full, only the entries whose upper bound beats its k-th
best are scored in float32, one dot product each, and only those can enter. The top-k is the
same as without screening. Where the scores are too crowded for the bound to
rule out enough, the block is computed in float32 instead (see `_Screen`).

Ties. Equal scores are ordered by corpus index, lower first, on every device and for every chunk
size. The running top-k is kept sorted by (score descending, index ascending); a later chunk
only holds higher indices, so a new score must be strictly better than the running k-th to enter,
and merges use a stable sort. For euclidean the tie rule applies to the ranking key
2 q·c - |c|² (as computed, in float32), from which the distance is derived. Scores computed in
two different ways (in a float32 block, or one by one after screening) may differ in the last
float32 bits, so two rows whose exact scores are that close may come out in either order.

Checked against brute force (the full score matrix, computed in float64, and a stable sort) in
tests/test_retrieval.py, and for speed against sentence-transformers `util.semantic_search` and
FAISS `IndexFlatIP` in bench/retrieval.py.
"""

from collections.abc import Hashable, Sequence

import numpy as np
import torch

SCORE_FUNCTIONS = ("cosine", "dot", "euclidean")

# Measured on a 2-core AVX-512 CPU. Each block costs one matrix product plus a few dozen small
# tensor operations, several of which start worker threads. Narrow blocks make the product a
# little faster on an idle machine (1000 x 384 by 384 x 2048: 93 GFLOP/s a core, x 8192: 89),
# but on a machine busy with other work every thread start can wait for a free core, and then
# fewer, wider blocks win by far (with 2 threads under load: x 2048: 49 GFLOP/s, x 8192: 76).
# (1024, 8192) float32 blocks, 32 MB, balance the two.
DEFAULT_QUERY_CHUNK_SIZE = 1024
DEFAULT_CORPUS_CHUNK_SIZE = 8192
# On a GPU each block costs a few kernel launches and one host synchronisation, so fewer, wider
# blocks are better; this value was chosen by that argument, not measured.
DEFAULT_CUDA_CORPUS_CHUNK_SIZE = 32768
# Columns per group in the first, coarse filter of each block (see _merge_block).
GROUP_SIZE = 64
# Candidates scored at once after screening (see _Screen): 1024 x 384 float32 rows take 1.5 MB.
RESCORE_PIECE = 1024
# Cosine divides by max(|v|, TINY): a zero vector scores 0 instead of NaN.
TINY = torch.finfo(torch.float32).tiny
# Unit roundoffs: rounding to bfloat16 (8 significant bits) or float32 (24) moves a value by at
# most this fraction of itself.
BF16_UNIT = 2.0**-8
F32_UNIT = 2.0**-24


def search(
    queries: torch.Tensor | np.ndarray,
    corpus: torch.Tensor | np.ndarray,
    k: int,
    score: str = "cosine",
    query_chunk_size: int = DEFAULT_QUERY_CHUNK_SIZE,
    corpus_chunk_size: int | None = None,
    query_ids: Sequence[Hashable] | None = None,
    corpus_ids: Sequence[Hashable] | None = None,
    device: str | torch.device | None = None,
    bf16_screen: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[np.ndarray, np.ndarray]:
    """Exact top-k corpus rows for each query row.

    Args:
        queries: (Q, d) float embeddings (torch tensor or numpy array).
        corpus: (N, d) float embeddings. May be float16/bfloat16 (e.g. to halve memory); each
            chunk is upcast to float32 before scoring, so scores are float32 whatever the input.
        k: number of results per query. If k > N the whole corpus is returned, ranked.
        score: "cosine", "dot" or "euclidean" (see the module docstring).
        query_chunk_size, corpus_chunk_size: block shape. Only speed and memory depend on them,
            never the results. corpus_chunk_size defaults to 8192 on CPU, 32768 on CUDA.
        query_ids, corpus_ids: optional ids (any hashable values), one per query and one per
            corpus row. When given, a corpus row whose id equals the query's id is never returned
            for that query (BEIR drops such self-matches), and the next best row takes its place.
        device: where to compute. Defaults to the corpus tensor's device (CPU for numpy). The
            corpus may live elsewhere (e.g. in CPU memory): it is moved chunk by chunk.
        bf16_screen: screen each block with a bfloat16 matrix product and score only the
            candidates it cannot rule out in float32 (see "Screening" above). The results are
            the same either way; only the speed differs. None (the default) screens on a CPU
            with native bfloat16 dot products (AVX512-BF16 or AMX), where the product runs about
            three times as fast as in float32.

    Returns:
        (scores, indices), each (Q, min(k, N)), best first: float32 scores (distances for
        euclidean, smallest first) and int64 corpus row indices. Ties go to the lower corpus
        index. numpy arrays if both inputs are numpy arrays, else torch tensors on `device`.
        Where fewer than min(k, N) rows remain for a query (only possible with ids), the row is
        padded with index -1 and score -inf (+inf distance for euclidean).

    Raises:
        ValueError: unknown score, k < 1, bad chunk sizes, inputs that are not 2-D floating
            point, an empty corpus, mismatched dimensions, NaN or inf in an embedding, or ids
            whose count does not match the embeddings.
    """
    return_numpy = isinstance(queries, np.ndarray) and isinstance(corpus, np.ndarray)
    queries = _as_embedding_matrix(queries, "queries")
    corpus = _as_embedding_matrix(corpus, "corpus")
    _check_arguments(queries, corpus, k, score, query_chunk_size, corpus_chunk_size)
    device = torch.device(device) if device is not None else corpus.device
    if corpus_chunk_size is None:
        corpus_chunk_size = (
            DEFAULT_CUDA_CORPUS_CHUNK_SIZE if device.type == "cuda" else DEFAULT_CORPUS_CHUNK_SIZE
        )

    num_queries, num_docs = queries.shape[0], corpus.shape[0]
    k = min(k, num_docs)
    queries = queries.to(device=device, dtype=torch.float32)  # (Q, d)
    if not torch.isfinite(queries).all():
        row = int(torch.isfinite(queries).all(dim=1).logical_not().nonzero()[0])
        raise ValueError(f"queries row {row} contains NaN or inf; embed it again or drop it")
    if score == "cosine":
        queries = queries / _row_norms(queries)[:, None].clamp_min(TINY)

    excluded = _excluded_pairs(query_ids, corpus_ids, num_queries, num_docs, device)

    # Running best per query, kept sorted by (score desc, index asc). For euclidean the "score"
    # here is the ranking key 2 q·c - |c|², larger is better, turned into a distance at the end.
    top_scores = torch.full((num_queries, k), -torch.inf, device=device)  # (Q, k)
    top_indices = torch.full((num_queries, k), -1, dtype=torch.long, device=device)  # (Q, k)
    # One reusable buffer for the score blocks, so the allocator does not hand back fresh,
    # page-faulting memory for every block. Its width is rounded up to whole groups; columns
    # past the chunk hold -inf.
    width = -(-min(corpus_chunk_size, num_docs) // GROUP_SIZE) * GROUP_SIZE
    block_buffer = torch.empty(min(query_chunk_size, num_queries) * width, device=device)
    # Cosine scores unit rows, written into one reusable buffer.
    if score == "cosine":
        unit_buffer = torch.empty(min(corpus_chunk_size, num_docs), corpus.shape[1], device=device)
    if bf16_screen is None:
        bf16_screen = device.type == "cpu" and _cpu_has_native_bf16()
    screen = _Screen(queries, score, query_chunk_size, width) if bf16_screen else None

    for doc_start in range(0, num_docs, corpus_chunk_size):
        chunk = corpus[doc_start : doc_start + corpus_chunk_size]
        chunk = chunk.to(device=device, dtype=torch.float32)  # (Nc, d)
        # Each score function needs one number per row anyway; it is NaN or inf exactly when the
        # row holds a NaN or an inf (or values near the float32 limit), which checks the input.
        squared_norms = None
        if score == "cosine":
            norms = _row_norms(chunk)  # (Nc,)
            _check_finite_rows(norms, doc_start)
            unit_rows = unit_buffer[: chunk.shape[0]]
            chunk = torch.div(chunk, norms.clamp_min(TINY)[:, None], out=unit_rows)
            # Unit rows (or zero), up to the float32 rounding of the norm and of the division.
            largest_norm = torch.tensor(1 + 2 * (chunk.shape[1] + 2) * F32_UNIT)
        elif score == "euclidean":
            squared_norms = _squared_row_norms(chunk)  # (Nc,)
            _check_finite_rows(squared_norms, doc_start)
            # 2^-100 stands in for squares that underflowed to zero.
            largest_norm = (squared_norms.amax() + 2.0**-100).sqrt()
        else:
            norms = _row_norms(chunk)  # (Nc,)
            _check_finite_rows(norms, doc_start)
            largest_norm = norms.amax()
        if screen is not None:
            screen.load_chunk(chunk, largest_norm, squared_norms)
        for query_start in range(0, num_queries, query_chunk_size):
            query_chunk = queries[query_start : query_start + query_chunk_size]  # (Qc, d)
            rows = slice(query_start, query_start + query_chunk.shape[0])
            if screen is not None and screen.merge(
                rows, excluded, doc_start, top_scores[rows], top_indices[rows]
            ):
                continue
            block = block_buffer[: query_chunk.shape[0] * width].view(-1, width)  # (Qc, W)
            scores = block[:, : chunk.shape[0]]  # (Qc, Nc), a view into the block
            if score == "euclidean":
                torch.addmm(-squared_norms[None, :], query_chunk, chunk.T, alpha=2, out=scores)
            else:
                torch.mm(query_chunk, chunk.T, out=scores)
            if chunk.shape[0] < width:
                block[:, chunk.shape[0] :] = -torch.inf
            if excluded is not None:
                _drop_excluded(scores, excluded, query_start, doc_start)
            _merge_block(block, doc_start, top_scores[rows], top_indices[rows])

    if score == "euclidean":
        squared = _squared_row_norms(queries)[:, None] - top_scores  # (Q, k)
        top_scores = squared.clamp_min(0).sqrt()
    if return_numpy:
        return top_scores.cpu().numpy(), top_indices.cpu().numpy()
    return top_scores, top_indices


def _merge_block(
    block: torch.Tensor, doc_start: int, top_scores: torch.Tensor, top_indices: torch.Tensor
) -> None:
    """Merge one (Qc, W) score block, W a multiple of GROUP_SIZE, into the running (Qc, k) top-k,
    in place.

    A score enters only if it is strictly above its row's current k-th best: an equal score
    cannot, because its corpus index is higher than every index already held. To find those few
    scores without comparing every one, each row is cut into groups of GROUP_SIZE columns, each
    group reduced to its maximum, and only groups whose maximum beats the k-th best are opened.
    """
    k = top_scores.shape[1]
    kth = top_scores[:, -1]  # (Qc,)
    floor = _entry_floor(block, kth, k)  # (Qc,) or None
    groups = block.view(block.shape[0], -1, GROUP_SIZE)  # (Qc, W / G, G)
    group_maxima = groups.amax(dim=2)  # (Qc, W / G)
    promising = group_maxima > kth[:, None]  # (Qc, W / G)
    if floor is not None:
        promising &= group_maxima >= floor[:, None]
    rows, group = promising.nonzero(as_tuple=True)  # (P,), (P,)
    if rows.numel() == 0:
        return
    values = groups[rows, group]  # (P, G)
    enters = values > kth[rows, None]  # (P, G)
    if floor is not None:
        enters &= values >= floor[rows, None]
    pair, offset = enters.nonzero(as_tuple=True)  # (M,), (M,)
    # nonzero() lists (row, group) pairs row by row with groups ascending, and offsets ascending
    # within a group, so the candidates are sorted by row, then by corpus index.
    cand_rows = rows[pair]  # (M,)
    cand_cols = group[pair] * GROUP_SIZE + offset  # (M,)
    _merge_candidates(cand_rows, cand_cols + doc_start, values[pair, offset], top_scores, top_indices)


def _merge_candidates(
    cand_rows: torch.Tensor,
    cand_indices: torch.Tensor,
    cand_values: torch.Tensor,
    top_scores: torch.Tensor,
    top_indices: torch.Tensor,
) -> None:
    """Merge (M,) candidates, sorted by row and then by corpus index, all with higher corpus
    indices than any already held, into the running (Qc, k) top-k, in place."""
    if cand_rows.numel() == 0:
        return
    k = top_scores.shape[1]
    # Lay the candidates out as a padded (A, width) matrix, one line per row that gains any.
    active, line, per_line = torch.unique_consecutive(
        cand_rows, return_inverse=True, return_counts=True
    )  # (A,), (M,), (A,)
    slot = torch.arange(line.numel(), device=line.device) - (per_line.cumsum(0) - per_line)[line]
    width = int(per_line.max())
    new_scores = torch.full((active.numel(), width), -torch.inf, device=line.device)
    new_scores[line, slot] = cand_values
    new_indices = torch.full_like(new_scores, -1, dtype=torch.long)
    new_indices[line, slot] = cand_indices

    # Running entries come first and hold lower indices, new ones follow in index order, so a
    # stable descending sort orders equal scores by ascending index.
    scores = torch.cat([top_scores[active], new_scores], dim=1)  # (A, k + width)
    indices = torch.cat([top_indices[active], new_indices], dim=1)  # (A, k + width)
    scores, order = scores.sort(dim=1, descending=True, stable=True)
    top_scores[active] = scores[:, :k]
    top_indices[active] = indices.gather(1, order[:, :k])


class _Screen:
    """Screening with a bfloat16 matrix product: find the few entries of a block that can enter
    the running top-k without computing the block in float32.

    The block is computed from bfloat16 copies of the queries and the chunk. `_error_bounds`
    bounds how far each approximate score can lie from the float32 score, which turns it into an
    upper bound on that score. Only the entries whose upper bound beats their row's k-th best are
    scored in float32, one dot product each, and merged. An entry left out provably scores at
    most the k-th best, so the top-k is the same as with the float32 block.

    For euclidean the ranking key 2 q·c - |c|² is one dot product of longer vectors,
    [2q, -1]·[c, |c|²], so it is screened the same way.
    """

    def __init__(self, queries: torch.Tensor, score: str, query_chunk_size: int, width: int):
        self.queries = queries  # (Q, d), float32, unit rows for cosine
        self.euclidean = score == "euclidean"
        self.query_norms = _row_norms(queries)  # (Q,)
        if self.euclidean:
            queries = torch.cat([2 * queries, -torch.ones_like(queries[:, :1])], dim=1)  # (Q, d + 1)
        self.queries_bf16 = queries.to(torch.bfloat16)  # (Q, d'), d' = d + 1 for euclidean
        rows = min(query_chunk_size, queries.shape[0])
        bf16 = {"dtype": torch.bfloat16, "device": queries.device}
        self.block_buffer = torch.empty(rows * width, **bf16)
        self.chunk_buffer = torch.empty(width, queries.shape[1], **bf16)
        self.width = width
        # Per query chunk (keyed by its first row): screens failed in a row, and blocks left to
        # compute in float32 before trying again. Each failure doubles the wait, so scores too
        # crowded to screen cost few wasted bfloat16 products.
        self.failures: dict[int, int] = {}
        self.wait: dict[int, int] = {}

    def load_chunk(
        self, chunk: torch.Tensor, largest_norm: torch.Tensor, squared_norms: torch.Tensor | None
    ) -> None:
        """Take the next (Nc, d) float32 corpus chunk, as scored (unit rows for cosine), an upper
        bound on its row norms, and (for euclidean) its (Nc,) float32 squared row norms."""
        self.chunk = chunk
        self.chunk_bf16 = self.chunk_buffer[: chunk.shape[0]]  # (Nc, d')
        self.chunk_bf16[:, : chunk.shape[1]] = chunk
        self.largest_norm = largest_norm
        if self.euclidean:
            self.chunk_bf16[:, -1] = squared_norms

    def merge(
        self,
        rows: slice,
        excluded: torch.Tensor | None,
        doc_start: int,
        top_scores: torch.Tensor,
        top_indices: torch.Tensor,
    ) -> bool:
        """Merge the block of query `rows` against the loaded chunk into the running (Qc, k)
        top-k, in place, and return True; or return False, changing nothing, when the screen
        would not save work: some row's top-k is not full yet (it has no k-th best to beat), or
        too many entries survive it.
        """
        kth = top_scores[:, -1]  # (Qc,)
        if not torch.isfinite(kth).all():
            return False
        if self.wait.get(rows.start, 0) > 0:
            self.wait[rows.start] -= 1
            return False
        candidates = self._candidates(rows, excluded, doc_start, kth)
        if candidates is None:
            self.failures[rows.start] = self.failures.get(rows.start, 0) + 1
            self.wait[rows.start] = 2 ** self.failures[rows.start] - 1
            return False
        self.failures[rows.start] = 0
        cand_rows, cand_cols = candidates
        exact = self._rescore(rows, cand_rows, cand_cols)  # (M,)
        enters = exact > kth[cand_rows]
        _merge_candidates(
            cand_rows[enters], cand_cols[enters] + doc_start, exact[enters], top_scores, top_indices
        )
        return True

    def _candidates(
        self, rows: slice, excluded: torch.Tensor | None, doc_start: int, kth: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(M,) block rows and (M,) chunk columns of the entries that may beat the (Qc,) k-th
        best scores, sorted by row and then by column; None if too many survive."""
        num_rows, num_docs = kth.shape[0], self.chunk.shape[0]
        approximate = self.block_buffer[: num_rows * self.width].view(num_rows, self.width)
        torch.mm(self.queries_bf16[rows], self.chunk_bf16.T, out=approximate[:, :num_docs])
        if num_docs < self.width:
            approximate[:, num_docs:] = -torch.inf
        if excluded is not None:
            _drop_excluded(approximate[:, :num_docs], excluded, rows.start, doc_start)
        error = _error_bounds(
            self.query_norms[rows], self.largest_norm, self.chunk.shape[1], self.euclidean
        )  # (Qc,)

        # Group maxima without a float pass over the block: the bits of a non-negative bfloat16
        # read as int16 order the same way as its value, and every negative value reads as a
        # negative int16. A group whose largest int16 is negative holds only values <= 0, so
        # it is given the maximum 0, which can only make it look more promising.
        groups = approximate.view(num_rows, -1, GROUP_SIZE)  # (Qc, W / G, G)
        largest_bits = groups.view(torch.int16).amax(dim=2).clamp_min(0)  # (Qc, W / G)
        group_maxima = largest_bits.view(torch.bfloat16).float()  # (Qc, W / G)
        # Written as "not <=" so that a NaN (from an overflowing bound) keeps an entry in.
        promising = ~(_upper_bounds(group_maxima, error[:, None]) <= kth[:, None])  # (Qc, W / G)
        block_rows, group = promising.nonzero(as_tuple=True)  # (P,), (P,)
        # Past these sizes the float32 block is the cheaper way. Measured on a 2-core CPU: each
        # entry of a float32 block costs about 6 ns (2·384 FLOP), each opened entry about 1 ns,
        # and each candidate scored on its own about 0.3 µs, mostly gathering its two rows.
        block_entries = num_rows * self.width
        if block_rows.numel() * GROUP_SIZE * 4 > block_entries:
            return None
        values = groups[block_rows, group].float()  # (P, G)
        survives = ~(_upper_bounds(values, error[block_rows, None]) <= kth[block_rows, None])
        pair, offset = survives.nonzero(as_tuple=True)  # (M,), (M,)
        if pair.numel() * 128 > block_entries:
            return None
        # nonzero() lists (row, group) pairs row by row with groups ascending, and offsets
        # ascending within a group, so the candidates come sorted by row, then by column.
        return block_rows[pair], group[pair] * GROUP_SIZE + offset

    def _rescore(self, rows: slice, cand_rows: torch.Tensor, cand_cols: torch.Tensor) -> torch.Tensor:
        """(M,) float32 scores (ranking keys for euclidean) of the candidates, a piece at a time
        to keep the gathered rows small and in cache."""
        exact = torch.empty(cand_rows.shape[0], device=cand_rows.device)  # (M,)
        query_chunk = self.queries[rows]  # (Qc, d)
        for start in range(0, cand_rows.shape[0], RESCORE_PIECE):
            part = slice(start, start + RESCORE_PIECE)
            query_rows = query_chunk.index_select(0, cand_rows[part])  # (m, d)
            doc_rows = self.chunk.index_select(0, cand_cols[part])  # (m, d)
            if self.euclidean:
                query_rows = 2 * query_rows - doc_rows  # 2 q·c - |c|² = (2q - c)·c
            exact[part] = torch.linalg.vecdot(query_rows, doc_rows)
        return exact


def _upper_bounds(approximate: torch.Tensor, error: torch.Tensor) -> torch.Tensor:
    """Upper bounds on the exact scores of entries whose bfloat16 scores are `approximate`,
    given `error` from _error_bounds."""
    # The bfloat16 block rounds its float32 sums once more, so a sum lies within
    # u / (1 - u) |approximate| of the value returned. Written with sign() so that -inf stays
    # -inf.
    output_rounding = BF16_UNIT / (1 - BF16_UNIT) * 1.01
    return approximate * (1 + output_rounding * approximate.sign()) + error


def _summation_error(dim: int) -> float:
    """γ = d·v / (1 - d·v): a float32 sum of d terms is off by at most γ times the sum of their
    absolute values (v = F32_UNIT; Higham, Accuracy and Stability of Numerical Algorithms,
    section 3.1)."""
    return dim * F32_UNIT / (1 - dim * F32_UNIT)


def _error_bounds(
    query_norms: torch.Tensor, largest_norm: torch.Tensor, dim: int, euclidean: bool
) -> torch.Tensor:
    """(Qc,) bounds on |s̃ - s| for every row c of a chunk, where s̃ is the float32 sum of
    q̃·c̃ (q and c rounded to bfloat16) and s is q·c as `_Screen._rescore` computes it in float32,
    for d-long queries with norms `query_norms` and rows with norms at most `largest_norm`. For
    euclidean, q and c stand for [2q, -1] and [c, |c|²] (d + 1 long), the norms for |q| and |c|.

    Rounding an entry to bfloat16 changes it by at most u = BF16_UNIT of itself, so each product
    q_i c_i changes by at most (2u + u²)|q_i c_i|. The float32 sum of the rounded products is
    off by at most γ (1 + u)² sum |q_i c_i| (see _summation_error), and s is off from the true
    q·c by at most γ sum |q_i c_i| (for euclidean, where s is (2q - c)·c, rounding 2q - c adds
    at most as much again). For euclidean the float32 |c|² entry is also off, by at most γ |c|²:
        |s̃ - s| <= (2u + u² + 4γ(1 + u)²) sum_i |q_i c_i|,
    where sum_i |q_i c_i| <= |q| |c| (Cauchy-Schwarz), or 2 |q| |c| + |c|² for euclidean.
    Entries below bfloat16's normal range (2^-126) may be read as zero by the hardware; each
    such product moves by at most 2^-126 (|q_i| + |c_i|), which adds at most
    2^-126 (sqrt(d) (|q| + |c|) + d) (with 2|q| + 1 and |c| + |c|² for euclidean). The norms
    were themselves computed in float32, off by at most 2γ each, which (1 + 2γ)² covers, and
    the whole bound is raised by 1% to cover the float32 rounding of this arithmetic.
    """
    if euclidean:
        dim += 1
        sum_bound = 2 * query_norms * largest_norm + largest_norm**2
        norm_sum = 2 * query_norms + 1 + largest_norm + largest_norm**2
    else:
        sum_bound = query_norms * largest_norm
        norm_sum = query_norms + largest_norm
    u, gamma = BF16_UNIT, _summation_error(dim)
    relative = 2 * u + u * u + 4 * gamma * (1 + u) ** 2
    tiny = TINY * (dim**0.5 * norm_sum + dim)
    return (relative * sum_bound * (1 + 2 * gamma) ** 2 + tiny) * 1.01


def _cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX); read from Linux's
    /proc/cpuinfo, so False elsewhere."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return "avx512_bf16" in flags or "amx_bf16" in flags
    except OSError:
        pass
    return False


def _entry_floor(block: torch.Tensor, kth: torch.Tensor, k: int) -> torch.Tensor | None:
    """(Qc,) lowest score that may enter from this block, or None if there is no floor.

    Only needed for rows whose running top-k is not full yet (kth = -inf, in the first chunk):
    there every finite score beats kth, so the block's own k-th best bounds the candidates.
    Ties at that value all stay candidates, so the stable sort still sees every contender.
    """
    not_full = torch.isneginf(kth)
    if block.shape[1] <= k or not not_full.any():
        return None
    if not_full.all():  # the usual case: the first chunk; spares a copy of the block
        return block.topk(k, dim=1).values[:, -1]
    floor = torch.full_like(kth, -torch.inf)
    floor[not_full] = block[not_full].topk(k, dim=1).values[:, -1]
    return floor


def _excluded_pairs(
    query_ids: Sequence[Hashable] | None,
    corpus_ids: Sequence[Hashable] | None,
    num_queries: int,
    num_docs: int,
    device: torch.device,
) -> torch.Tensor | None:
    """(P, 2) [query row, corpus row] pairs whose ids are equal, or None without ids."""
    if query_ids is None and corpus_ids is None:
        return None
    if query_ids is None or corpus_ids is None:
        raise ValueError("pass both query_ids and corpus_ids, or neither")
    if len(query_ids) != num_queries or len(corpus_ids) != num_docs:
        raise ValueError(
            f"got {len(query_ids)} query_ids for {num_queries} queries and {len(corpus_ids)} "
            f"corpus_ids for {num_docs} corpus rows; pass one id per row"
        )
    rows_of_query_id: dict[Hashable, list[int]] = {}
    for row, query_id in enumerate(query_ids):
        rows_of_query_id.setdefault(query_id, []).append(row)
    pairs = [
        (query_row, doc_row)
        for doc_row, doc_id in enumerate(corpus_ids)
        for query_row in rows_of_query_id.get(doc_id, ())
    ]
    return torch.tensor(pairs, dtype=torch.long, device=device).reshape(-1, 2)


def _drop_excluded(
    block: torch.Tensor, excluded: torch.Tensor, query_start: int, doc_start: int
) -> None:
    """Set the excluded (query, corpus) entries that fall in this block to -inf, in place."""
    query_rows = excluded[:, 0] - query_start
    doc_rows = excluded[:, 1] - doc_start
    inside = (query_rows >= 0) & (query_rows < block.shape[0])
    inside &= (doc_rows >= 0) & (doc_rows < block.shape[1])
    block[query_rows[inside], doc_rows[inside]] = -torch.inf


def _check_finite_rows(row_values: torch.Tensor, doc_start: int) -> None:
    finite = torch.isfinite(row_values)  # (Nc,)
    if not finite.all():
        row = doc_start + int(finite.logical_not().nonzero()[0])
        raise ValueError(
            f"corpus row {row} contains NaN or inf (or values too large for float32); embed it "
            f"again or drop it"
        )


def _row_norms(matrix: torch.Tensor) -> torch.Tensor:
    """(n,) Euclidean norms of the rows. Squares below float32's range underflow to zero, so a
    row whose norm comes out below 2^-60 is measured again after dividing by its largest entry
    (otherwise a row of entries near 1e-30 would have norm 0)."""
    norms = torch.linalg.vector_norm(matrix, dim=1)  # (n,)
    small = (norms < 2.0**-60).nonzero()[:, 0]  # (s,)
    if small.numel():
        rows = matrix[small]  # (s, d)
        scale = rows.abs().amax(dim=1, keepdim=True).clamp_min(TINY)  # (s, 1)
        norms[small] = scale[:, 0] * torch.linalg.vector_norm(rows / scale, dim=1)
    return norms


def _squared_row_norms(matrix: torch.Tensor) -> torch.Tensor:
    # Summing squares directly (not squaring a norm) keeps |c|² exact for integer-valued rows, so
    # rows at equal distance get exactly equal ranking keys.
    return torch.linalg.vecdot(matrix, matrix)


def _as_embedding_matrix(embeddings: torch.Tensor | np.ndarray, name: str) -> torch.Tensor:
    if isinstance(embeddings, np.ndarray):
        embeddings = torch.from_numpy(embeddings)
    if not isinstance(embeddings, torch.Tensor):
        raise ValueError(
            f"{name} must be a torch tensor or numpy array, got {type(embeddings).__name__}"
        )
    if embeddings.ndim != 2:
        raise ValueError(
            f"{name} must be 2-D (rows, dim), got shape {tuple(embeddings.shape)}; "
            f"for a single vector pass v[None, :]"
        )
    if not embeddings.is_floating_point():
        raise ValueError(f"{name} must be floating point, got {embeddings.dtype}")
    return embeddings


def _check_arguments(
    queries: torch.Tensor,
    corpus: torch.Tensor,
    k: int,
    score: str,
    query_chunk_size: int,
    corpus_chunk_size: int | None,
) -> None:
    if score not in SCORE_FUNCTIONS:
        raise ValueError(f"unknown score {score!r}; choose one of {', '.join(SCORE_FUNCTIONS)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    chunk_sizes = {"query_chunk_size": query_chunk_size, "corpus_chunk_size": corpus_chunk_size}
    for name, size in chunk_sizes.items():
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"{name} must be a positive integer, got {size!r}")
    if corpus.shape[0] == 0:
        raise ValueError("corpus is empty: there is nothing to search")
    if queries.shape[1] != corpus.shape[1]:
        raise ValueError(
            f"queries have dimension {queries.shape[1]} but corpus has dimension "
            f"{corpus.shape[1]}; embed both with the same model"
        )
    if corpus.shape[1] == 0:
        raise ValueError("embeddings have dimension 0")
