"""The screens of the fast CPU search, and what they share.

Most of a matrix product of many queries against a corpus chunk is spent on scores that cannot reach
the top-k. A screen computes the block approximately, cheaper than float32 (here: bfloat16 products,
`Bfloat16Blocks`; fast/int8_blocks.py: int8 products; fast/int8_rows.py: one query against a
prepared corpus's int8 copy), and a proven bound on its error turns each approximate score into an
upper bound on the float32 one. Every screen implements the same two calls:

    load_chunk(chunk)                                 take the next corpus chunk (a `Chunk`)
    candidates(rows, floor, own_floor)                (M,) query rows and (M,) chunk rows whose upper
                                                      bound reaches `floor` (Qc,), or None; and the floor

`Screen` wraps one: it rescores the candidates in float32 and keeps those at or above the floor
(the float32 bound of search_inputs.py's `Bounds` then relates them to the exact scores, which
`settle` computes), and it waits before trying again where screening failed (too many candidates).
The floor comes from the search: nothing below it can reach the top-k, so a screen changes only
speed, never a result. Where the search has kept nothing yet (its first chunk), the floor is -inf;
a screen of many queries then picks, for each query, the best entries of its k best groups, `Screen`
scores them in float32, and the search makes a floor from the lowest (`own_floor`): k rows score at
least that, whatever the screen's error. Tested through every forced way in tests/test_retrieval.py,
and each bound on rows built to round badly in tests/test_screens.py.
"""

from dataclasses import dataclass
from functools import partial

import torch

from .tuning import GROUP_SIZE, RESCORE_PIECE, UNIT_PIECE_ROWS

BF16_UNIT = 2.0**-8  # rounding to bfloat16 moves a value by at most this fraction of itself
F32_UNIT = 2.0**-24
TINY = torch.finfo(torch.float32).tiny


@dataclass
class Chunk:
    """A corpus chunk as the fast search multiplies it."""

    rows: torch.Tensor  # (n, d) float32 rows multiplied with the queries (unit rows for cosine, maybe undivided)
    divisors: torch.Tensor | None  # (n, 1) what undivided cosine rows are divided by, else None
    squared_norms: torch.Tensor | None  # (n,) float32 squared norms, for euclidean's keys
    largest_norm: float  # an upper bound on the norms of the rows as multiplied
    kept: object = None  # a prepared corpus's copy of these rows for the screen, if it keeps one


def screen_rows(rows: torch.Tensor, squared_norms: torch.Tensor | None) -> torch.Tensor:
    """The (N, d') bfloat16 copy of (N, d) rows as scored that `Bfloat16Blocks` multiplies: the rows,
    and for euclidean (given their squared norms) one more column holding them."""
    if squared_norms is None:
        return rows.to(torch.bfloat16)
    return torch.cat([rows, squared_norms[:, None]], dim=1).to(torch.bfloat16)


class Screen:
    """One screen (`Bfloat16Blocks`, `Int8Blocks`, `Int8Rows`) with the float32 rescoring beside it."""

    def __init__(self, queries: torch.Tensor, approximate, euclidean: bool = False):
        """queries (Q, d) float32 as multiplied (unit rows for cosine); `approximate` the screen."""
        self.queries, self.approximate, self.euclidean = queries, approximate, euclidean
        # Per query chunk (keyed by its first row): screens failed in a row, and blocks left to compute
        # in float32 before trying again. Each failure doubles the wait.
        self.failures: dict[int, int] = {}
        self.wait: dict[int, int] = {}

    def load_chunk(self, chunk: Chunk) -> None:
        self.chunk = chunk
        self.approximate.load_chunk(chunk)

    def candidates(self, rows: slice, floor: torch.Tensor, own_floor=None):
        """(M,) query rows (ascending, within `rows`), (M,) chunk rows and (M,) float32 scores of the
        entries whose float32 scores lie above the (Qc,) `floor`, or None where the screen would not
        save work: a floor still -inf (nothing to beat yet), or too many entries surviving it.
        own_floor: (k, f), f making a floor from the (Qc,) lowest float32 score of k rows of the block
        where `floor` is -inf (the module docstring)."""
        unknown = not torch.isfinite(floor).all()
        if unknown and own_floor is None:
            return None
        if self.wait.get(rows.start, 0) > 0:
            self.wait[rows.start] -= 1
            return None
        own = partial(self._own_floor, rows, *own_floor) if unknown else None
        found = self.approximate.candidates(rows, floor, own)
        if found is None and unknown:  # no wait: the next chunk brings a floor
            return None
        if found is None:
            self.failures[rows.start] = self.failures.get(rows.start, 0) + 1
            self.wait[rows.start] = 2 ** self.failures[rows.start] - 1
            return None
        self.failures[rows.start] = 0
        cand_rows, cand_cols, floor = found
        scores = self._rescore(rows, cand_rows, cand_cols)
        keep = scores > floor[cand_rows]
        return cand_rows[keep], cand_cols[keep], scores[keep]

    def _own_floor(self, rows: slice, k: int, floor_of, group_values: torch.Tensor, best_columns) -> torch.Tensor:
        """The floor `floor_of` makes from the lowest float32 score of the rows best_columns(groups)
        (Qc, k) gives for each query's k groups of highest (Qc, G) `group_values`; -inf where the
        block has fewer than k groups, or a picked row lies past the chunk."""
        num_rows, num_docs = group_values.shape[0], self.chunk.rows.shape[0]
        if group_values.shape[1] < k:
            return floor_of(group_values.new_full((num_rows,), -torch.inf))
        columns = best_columns(group_values.topk(k, dim=1).indices)  # (Qc, k)
        query_rows = torch.arange(num_rows, device=columns.device).repeat_interleave(k)
        scores = self._rescore(rows, query_rows, columns.flatten().clamp_max(num_docs - 1)).view(num_rows, k)
        return floor_of(scores.masked_fill(columns >= num_docs, -torch.inf).amin(dim=1))

    def _rescore(self, rows: slice, cand_rows: torch.Tensor, cand_cols: torch.Tensor) -> torch.Tensor:
        """(M,) float32 scores (keys 2 q·c - |c|² for euclidean) of the candidates, a piece at a time."""
        scores = torch.empty(cand_rows.shape[0], device=cand_rows.device)  # (M,)
        query_chunk, chunk = self.queries[rows], self.chunk
        for start in range(0, cand_rows.shape[0], RESCORE_PIECE):
            part = slice(start, start + RESCORE_PIECE)
            query_rows = query_chunk.index_select(0, cand_rows[part])  # (m, d)
            doc_rows = chunk.rows.index_select(0, cand_cols[part])  # (m, d)
            if chunk.divisors is not None:  # the unit rows of an undivided chunk, bit for bit
                doc_rows = torch.div(doc_rows, chunk.divisors.index_select(0, cand_cols[part]))
            if self.euclidean:
                query_rows = 2 * query_rows - doc_rows  # 2 q·c - |c|² = (2q - c)·c
            scores[part] = torch.linalg.vecdot(query_rows, doc_rows)
        return scores


def best_entries(groups: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """(Qc, p) chunk columns of the largest entry of each of the (Qc, p) `picked` groups of an
    approximate (Qc, W / G, G) block."""
    rows = torch.arange(groups.shape[0], device=groups.device)[:, None]  # (Qc, 1)
    return picked * GROUP_SIZE + groups[rows, picked].argmax(dim=2)


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
    # Past these sizes the float32 block is the cheaper way: an opened entry costs about a sixth of a
    # float32 entry, a candidate rescored on its own about fifty (bench/README.md, "Search").
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
    """The approximate blocks of the bfloat16 screen: products of bfloat16 copies of the queries and
    the chunk, and the bound `_error_bounds` on their error. Where the CPU multiplies bfloat16
    natively a block takes about a third of the float32 one's time (bench/README.md, "Search").

    For euclidean the key 2 q·c - |c|² is one dot product of longer vectors, [2q, -1]·[c, |c|²], so it
    is screened the same way.
    """

    def __init__(self, queries: torch.Tensor, score: str, query_chunk_size: int, width: int, kept: bool = False):
        """queries (Q, d) float32 as multiplied; blocks of at most query_chunk_size x width entries;
        `kept`: the corpus keeps its own bfloat16 copy (a prepared corpus)."""
        self.euclidean = score == "euclidean"
        self.query_norms = torch.linalg.vector_norm(queries.double(), dim=1).float() * (1 + 2.0**-20)  # (Q,) bounds
        if self.euclidean:
            queries = torch.cat([2 * queries, -torch.ones_like(queries[:, :1])], dim=1)  # (Q, d + 1)
        self.queries_bf16 = queries.to(torch.bfloat16)  # (Q, d'), d' = d + 1 for euclidean
        rows = min(query_chunk_size, queries.shape[0])
        bf16 = {"dtype": torch.bfloat16, "device": queries.device}
        self.block_buffer = torch.empty(rows * width, **bf16)
        self.chunk_buffer = None if kept else torch.empty(width, queries.shape[1], **bf16)
        self.unit_piece = None  # float32 unit rows of a piece of an undivided chunk (`load_chunk`)
        self.width = width

    def load_chunk(self, chunk: Chunk) -> None:
        """Make (or take the kept) bfloat16 copy of the chunk."""
        self.num_docs, self.dim = chunk.rows.shape
        self.largest_norm = chunk.largest_norm
        if chunk.kept is not None:
            self.chunk_bf16 = chunk.kept
            return
        self.chunk_bf16 = self.chunk_buffer[: self.num_docs]  # (Nc, d')
        if chunk.divisors is not None:  # unit rows made a piece at a time, in the cache
            if self.unit_piece is None:
                self.unit_piece = torch.empty(min(UNIT_PIECE_ROWS, self.width), self.dim, device=chunk.rows.device)
            piece_rows = self.unit_piece.shape[0]
            for start in range(0, self.num_docs, piece_rows):
                rows = slice(start, start + piece_rows)
                piece = chunk.rows[rows]
                self.chunk_bf16[rows] = torch.div(piece, chunk.divisors[rows], out=self.unit_piece[: piece.shape[0]])
            return
        self.chunk_bf16[:, : self.dim] = chunk.rows
        if self.euclidean:
            self.chunk_bf16[:, -1] = chunk.squared_norms

    def candidates(self, rows: slice, kth: torch.Tensor, own_floor=None):
        """(M,) block rows and (M,) chunk columns of the entries whose float32 scores may lie above
        the (Qc,) `kth`, sorted by row and then by column, and `kth` (or own_floor's: `Screen`);
        None if too many survive."""
        num_rows, num_docs = kth.shape[0], self.num_docs
        approximate = self.block_buffer[: num_rows * self.width].view(num_rows, self.width)
        torch.mm(self.queries_bf16[rows], self.chunk_bf16.T, out=approximate[:, :num_docs])
        if num_docs < self.width:
            approximate[:, num_docs:] = -torch.inf
        error = _error_bounds(self.query_norms[rows], self.largest_norm, self.dim, self.euclidean)  # (Qc,)

        # Group maxima without a float pass over the block: the bits of a non-negative bfloat16
        # read as int16 order the same way as its value, and every negative value reads as a
        # negative int16. A group whose largest int16 is negative holds only values <= 0, so
        # it is given the maximum 0, which can only make it look more promising.
        groups = approximate.view(num_rows, -1, GROUP_SIZE)  # (Qc, W / G, G)
        largest_bits = groups.view(torch.int16).amax(dim=2).clamp_min(0)  # (Qc, W / G)
        group_maxima = largest_bits.view(torch.bfloat16).float()  # (Qc, W / G)
        if own_floor is not None:
            kth = own_floor(group_maxima, partial(best_entries, groups))

        def passes(values: torch.Tensor, block_rows, group) -> torch.Tensor:
            # Written as "not <=" so that a NaN (from an overflowing bound) keeps an entry in.
            values = values.float()
            return ~(_upper_bounds(values, error[block_rows, None]) <= kth[block_rows, None])

        found = block_candidates(groups, group_maxima, passes)
        return None if found is None else (*found, kth)


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
    q̃·c̃ (q and c rounded to bfloat16) and s is q·c as `Screen._rescore` computes it in float32,
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
