"""The screen of the fast CPU search (minisbert/fast/retrieval.py) with its bfloat16 blocks, and the
merge it shares.

Most of a matrix product of many queries against a corpus chunk is spent on scores that cannot enter
the top-k. Where the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX), a bfloat16 product runs
about three times as fast as a float32 one, and it is accurate enough to rule those scores out: a
proven bound on its error (`_error_bounds`, about 2·2^-8 |q| |c|) turns each approximate score into an
upper bound on the exact one. Once a query's top-k is full, only the entries whose upper bound beats
its k-th best are scored in float32, one dot product each, and only those can enter. The top-k is
the same as without screening. Where the scores are too crowded for the bound to rule out enough,
the block is computed in float32 instead (see `_Screen`). Where torch's int8 product is exact and
quicker still, the approximate blocks are int8 products instead (minisbert/fast/int8_screen.py's
`Int8Blocks`); the rest of the screen is the same.

Tested through every search in tests/test_retrieval.py (the bound itself in
test_error_bound_holds_and_is_nearly_reached).
"""

import torch

from ..search_inputs import TINY, drop_excluded
from ..similarity import row_norms

# Columns per group in the first, coarse filter of each block (fast/retrieval.py's _merge_block, and
# the screen's group maxima).
GROUP_SIZE = 64
# Candidates scored at once after screening (see _Screen): 1024 x 384 float32 rows take 1.5 MB.
RESCORE_PIECE = 1024
# Rows of an undivided cosine chunk made unit rows at once for the bfloat16 copy (`_Screen.load_chunk`):
# 1.5 MB of float32 for d = 384, which stays in the cache until it is copied.
UNIT_PIECE_ROWS = 1024
# Unit roundoffs: rounding to bfloat16 (8 significant bits) or float32 (24) moves a value by at
# most this fraction of itself.
BF16_UNIT = 2.0**-8
F32_UNIT = 2.0**-24


def screen_rows(rows: torch.Tensor, norm_terms: torch.Tensor, score: str) -> torch.Tensor:
    """The (N, d') bfloat16 copy of (N, d) rows as scored that the screen multiplies (see _Screen):
    the rows themselves, and for euclidean their (N,) squared norms as one more column."""
    if score != "euclidean":
        return rows.to(torch.bfloat16)
    return torch.cat([rows, norm_terms[:, None]], dim=1).to(torch.bfloat16)


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
    """Screening with an approximate matrix product: find the few entries of a block that can
    enter the running top-k without computing the block in float32.

    The block is computed approximately, here from bfloat16 copies of the queries and the chunk
    (`Bfloat16Blocks`), or from int8 copies (minisbert/fast/int8_screen.py's `Int8Blocks`). A
    proven bound on how far each approximate score can lie from the float32 score turns it into
    an upper bound on that score. Only the entries whose upper bound beats their row's k-th best
    are scored in float32, one dot product each, and merged. An entry left out provably scores at
    most the k-th best, so the top-k is the same as with the float32 block.
    """

    def __init__(self, queries: torch.Tensor, blocks: "Bfloat16Blocks"):
        """queries (Q, d) float32 as scored (unit rows for cosine); `blocks` makes the approximate
        blocks and their candidates (`Bfloat16Blocks`, or int8_screen.py's `Int8Blocks`)."""
        self.queries = queries
        self.euclidean = blocks.euclidean
        self.blocks = blocks
        # Per query chunk (keyed by its first row): screens failed in a row, and blocks left to
        # compute in float32 before trying again. Each failure doubles the wait, so scores too
        # crowded to screen cost few wasted approximate products.
        self.failures: dict[int, int] = {}
        self.wait: dict[int, int] = {}

    def load_chunk(
        self,
        chunk: torch.Tensor,
        largest_norm: torch.Tensor,
        squared_norms: torch.Tensor | None,
        kept: torch.Tensor | None = None,
        divisors: torch.Tensor | None = None,
    ) -> None:
        """Take the next (Nc, d) float32 corpus chunk, as scored (unit rows for cosine), an upper
        bound on its row norms, (for euclidean) its (Nc,) float32 squared row norms, and its
        (Nc, d') bfloat16 copy if one is kept (`screen_rows`).

        For cosine the chunk may come undivided, with the (Nc, 1) `divisors` that make its unit
        rows (`search_inputs.unit_divisors`): the approximate copy is then made from unit rows
        UNIT_PIECE_ROWS at a time, in the cache, and the rows rescored are divided one by one,
        with the same bits; the search divides the whole chunk only where the screen fails."""
        self.chunk = chunk
        self.divisors = divisors
        self.blocks.load_chunk(chunk, largest_norm, squared_norms, kept, divisors)

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
        candidates = self.blocks.candidates(rows, excluded, doc_start, kth)
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

    def _rescore(self, rows: slice, cand_rows: torch.Tensor, cand_cols: torch.Tensor) -> torch.Tensor:
        """(M,) float32 scores (ranking keys for euclidean) of the candidates, a piece at a time
        to keep the gathered rows small and in cache."""
        exact = torch.empty(cand_rows.shape[0], device=cand_rows.device)  # (M,)
        query_chunk = self.queries[rows]  # (Qc, d)
        for start in range(0, cand_rows.shape[0], RESCORE_PIECE):
            part = slice(start, start + RESCORE_PIECE)
            query_rows = query_chunk.index_select(0, cand_rows[part])  # (m, d)
            doc_rows = self.chunk.index_select(0, cand_cols[part])  # (m, d)
            if self.divisors is not None:  # the unit rows of an undivided chunk, bit for bit
                doc_rows = torch.div(doc_rows, self.divisors.index_select(0, cand_cols[part]))
            if self.euclidean:
                query_rows = 2 * query_rows - doc_rows  # 2 q·c - |c|² = (2q - c)·c
            exact[part] = torch.linalg.vecdot(query_rows, doc_rows)
        return exact


def block_candidates(
    groups: torch.Tensor, group_maxima: torch.Tensor, passes
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(M,) block rows and (M,) chunk columns of the entries of an approximate (Qc, W / G, G)
    block, cut into groups, that may beat their row's k-th best, sorted by row and then by
    column; None if too many survive. `group_maxima` (Qc, W / G) holds each group's largest
    entry (or more), and passes(values, block_rows, group) says which entries of `values` may beat
    their row's k-th best: of the (Qc, W / G) maxima (block_rows and group slices), or of the
    (P, G) groups opened (block_rows and group (P,) indices)."""
    num_rows, num_groups = group_maxima.shape
    promising = passes(group_maxima, slice(None), slice(None))  # (Qc, W / G)
    block_rows, group = promising.nonzero(as_tuple=True)  # (P,), (P,)
    # Past these sizes the float32 block is the cheaper way. Measured on a 2-core CPU: each
    # entry of a float32 block costs about 6 ns (2·384 FLOP), each opened entry about 1 ns,
    # and each candidate scored on its own about 0.3 µs, mostly gathering its two rows. (With
    # the wider int8 bound, the second chunk of 1,000 random queries over 200,000 unit rows had
    # 26% of its groups promising but few enough candidates: refused at a quarter of the groups,
    # as at first, it and the chunk after it were done in float32, and the search took 1.1 times
    # as long, on a 2-core AMD EPYC, Zen 4.)
    block_entries = num_rows * num_groups * GROUP_SIZE
    if block_rows.numel() * GROUP_SIZE * 2 > block_entries:
        return None
    survives = passes(groups[block_rows, group], block_rows, group)  # (P, G)
    pair, offset = survives.nonzero(as_tuple=True)  # (M,), (M,)
    if pair.numel() * 128 > block_entries:
        return None
    # nonzero() lists (row, group) pairs row by row with groups ascending, and offsets
    # ascending within a group, so the candidates come sorted by row, then by column.
    return block_rows[pair], group[pair] * GROUP_SIZE + offset


class Bfloat16Blocks:
    """The approximate blocks of the bfloat16 screen (`_Screen`): products of bfloat16 copies of
    the queries and the chunk, and the bound `_error_bounds` on their error.

    For euclidean the ranking key 2 q·c - |c|² is one dot product of longer vectors,
    [2q, -1]·[c, |c|²], so it is screened the same way.
    """

    def __init__(self, queries: torch.Tensor, score: str, query_chunk_size: int, width: int, kept: bool = False):
        """queries (Q, d) float32 as scored; blocks of at most query_chunk_size x width entries;
        `kept`: the corpus keeps its own bfloat16 copy (a prepared corpus)."""
        self.euclidean = score == "euclidean"
        self.query_norms = row_norms(queries)  # (Q,)
        if self.euclidean:
            queries = torch.cat([2 * queries, -torch.ones_like(queries[:, :1])], dim=1)  # (Q, d + 1)
        self.queries_bf16 = queries.to(torch.bfloat16)  # (Q, d'), d' = d + 1 for euclidean
        rows = min(query_chunk_size, queries.shape[0])
        bf16 = {"dtype": torch.bfloat16, "device": queries.device}
        self.block_buffer = torch.empty(rows * width, **bf16)
        # A prepared corpus keeps its own bfloat16 copy (`kept`); otherwise each chunk is copied here.
        self.chunk_buffer = None if kept else torch.empty(width, queries.shape[1], **bf16)
        self.unit_piece = None  # float32 unit rows of a piece of an undivided chunk (`load_chunk`)
        self.width = width

    def load_chunk(self, chunk: torch.Tensor, largest_norm: torch.Tensor, squared_norms: torch.Tensor | None,
                   kept: torch.Tensor | None, divisors: torch.Tensor | None) -> None:
        """See `_Screen.load_chunk`: make (or take the kept) bfloat16 copy of the chunk."""
        self.num_docs, self.dim = chunk.shape
        self.largest_norm = largest_norm
        if kept is not None:
            self.chunk_bf16 = kept
            return
        self.chunk_bf16 = self.chunk_buffer[: chunk.shape[0]]  # (Nc, d')
        if divisors is not None:
            if self.unit_piece is None:
                self.unit_piece = torch.empty(min(UNIT_PIECE_ROWS, self.width), chunk.shape[1], device=chunk.device)
            piece_rows = self.unit_piece.shape[0]
            for start in range(0, chunk.shape[0], piece_rows):
                rows = slice(start, start + piece_rows)
                unit = torch.div(chunk[rows], divisors[rows], out=self.unit_piece[: chunk[rows].shape[0]])
                self.chunk_bf16[rows] = unit
            return
        self.chunk_bf16[:, : chunk.shape[1]] = chunk
        if self.euclidean:
            self.chunk_bf16[:, -1] = squared_norms

    def candidates(
        self, rows: slice, excluded: torch.Tensor | None, doc_start: int, kth: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(M,) block rows and (M,) chunk columns of the entries that may beat the (Qc,) k-th
        best scores, sorted by row and then by column; None if too many survive."""
        num_rows, num_docs = kth.shape[0], self.num_docs
        approximate = self.block_buffer[: num_rows * self.width].view(num_rows, self.width)
        torch.mm(self.queries_bf16[rows], self.chunk_bf16.T, out=approximate[:, :num_docs])
        if num_docs < self.width:
            approximate[:, num_docs:] = -torch.inf
        if excluded is not None:
            drop_excluded(approximate[:, :num_docs], excluded, rows.start, doc_start)
        error = _error_bounds(self.query_norms[rows], self.largest_norm, self.dim, self.euclidean)  # (Qc,)

        # Group maxima without a float pass over the block: the bits of a non-negative bfloat16
        # read as int16 order the same way as its value, and every negative value reads as a
        # negative int16. A group whose largest int16 is negative holds only values <= 0, so
        # it is given the maximum 0, which can only make it look more promising.
        groups = approximate.view(num_rows, -1, GROUP_SIZE)  # (Qc, W / G, G)
        largest_bits = groups.view(torch.int16).amax(dim=2).clamp_min(0)  # (Qc, W / G)
        group_maxima = largest_bits.view(torch.bfloat16).float()  # (Qc, W / G)

        def passes(values: torch.Tensor, block_rows, group) -> torch.Tensor:
            # Written as "not <=" so that a NaN (from an overflowing bound) keeps an entry in.
            values = values.float()
            return ~(_upper_bounds(values, error[block_rows, None]) <= kth[block_rows, None])

        return block_candidates(groups, group_maxima, passes)


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
