"""What the screens of the fast CPU search share.

Most of a product is spent on scores that cannot reach the top-k. A screen computes the block more
cheaply, in int8 (search/fast/int8_blocks.py: many queries; search/fast/int8_rows.py: a few against a prepared
corpus's copy), and a proven bound on its error makes each approximate score an upper bound on the
float32 one. Every screen implements:

    load_chunk(chunk)                      take the next corpus chunk (a `Chunk`)
    candidates(rows, floor, own_floor)     (M,) query rows and (M,) chunk rows whose upper bound
                                           reaches `floor` (Qc,), and the floor; or None

`Screen` wraps one: it rescores the candidates in float32, keeps those above the floor, and after a
failure (too many candidates) waits before trying again, where the chunks are alike (the blocks of
many queries); spans that grow (a few queries) try it at every span, each larger than the last and
met with a k-th best no lower, so a wait would skip the most rows just when the screen is likeliest
to pass. A screen changes only speed. Where nothing is kept yet the floor is -inf: a screen of many
queries then picks each query's best entries of its k best groups, `Screen` scores them, and the
lowest makes a floor (`own_floor`).
"""

from dataclasses import dataclass
from functools import partial

import torch

from .tuning import GROUP_SIZE, MOST_OPENED, MOST_SCREENED, RESCORE_PIECE


@dataclass
class Chunk:
    """A corpus chunk as the fast search multiplies it."""

    rows: torch.Tensor  # (n, d) float32 rows multiplied with the queries (unit rows for cosine, maybe undivided)
    divisors: torch.Tensor | None  # (n, 1) what undivided cosine rows are divided by, else None
    squared_norms: torch.Tensor | None  # (n,) float32 squared norms, for euclidean's keys
    largest_norm: float  # an upper bound on the norms of the rows as multiplied
    kept: object = None  # a prepared corpus's int8 copy of these rows, if it keeps one


class Screen:
    """One screen (`Int8Blocks`, `Int8RowsScreen`) with the float32 rescoring beside it (cosine, dot)."""

    def __init__(self, queries: torch.Tensor, approximate, waits: bool = True):
        """queries (Q, d) float32 as multiplied (unit rows for cosine); `approximate` the screen;
        `waits`: after a failure, skip chunks (doubling) before trying again."""
        self.queries, self.approximate, self.waits = queries, approximate, waits
        # Per query chunk (keyed by its first row): failures in a row, and blocks to wait (doubling).
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
            if self.waits:
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
        """(M,) float32 scores of the candidates, a piece at a time."""
        scores = torch.empty(cand_rows.shape[0], device=cand_rows.device)  # (M,)
        query_chunk, chunk = self.queries[rows], self.chunk
        for start in range(0, cand_rows.shape[0], RESCORE_PIECE):
            part = slice(start, start + RESCORE_PIECE)
            query_rows = query_chunk.index_select(0, cand_rows[part])  # (m, d)
            doc_rows = chunk.rows.index_select(0, cand_cols[part])  # (m, d)
            if chunk.divisors is not None:  # the unit rows of an undivided chunk, bit for bit
                doc_rows = torch.div(doc_rows, chunk.divisors.index_select(0, cand_cols[part]))
            scores[part] = torch.linalg.vecdot(query_rows, doc_rows)
        return scores


def best_entries(groups: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """(Qc, p) chunk columns of the largest entry of each of the (Qc, p) `picked` groups of an
    approximate (Qc, W / G, G) block."""
    rows = torch.arange(groups.shape[0], device=groups.device)[:, None]  # (Qc, 1)
    opened = groups.flatten(0, 1).index_select(0, (rows * groups.shape[1] + picked).flatten())  # (Qc p, G)
    return picked * GROUP_SIZE + opened.view(*picked.shape, groups.shape[2]).argmax(dim=2)


def block_candidates(groups: torch.Tensor, group_maxima: torch.Tensor,
                     passes) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(M,) block rows and (M,) chunk columns of the entries of an approximate (Qc, W / G, G)
    block, cut into groups, that may beat their row's k-th best, sorted by row and then by
    column; None if too many survive. `group_maxima` (Qc, W / G) holds each group's largest
    entry (or more), and passes(values, block_rows, group) says which entries of `values` may beat
    their row's k-th best: of the (Qc, W / G) maxima (block_rows and group slices), or of the
    (P, G) groups opened (block_rows and group (P,) indices)."""
    num_rows, num_groups = group_maxima.shape
    promising = passes(group_maxima, slice(None), slice(None))  # (Qc, W / G)
    block_rows, group = promising.nonzero(as_tuple=True)  # (P,), (P,)
    block_entries = num_rows * num_groups * GROUP_SIZE
    if block_rows.numel() * GROUP_SIZE > MOST_OPENED * block_entries:
        return None
    survives = passes(groups.flatten(0, 1).index_select(0, block_rows * num_groups + group), block_rows, group)  # (P, G)
    pair, offset = survives.nonzero(as_tuple=True)  # (M,), (M,)
    if pair.numel() > MOST_SCREENED * block_entries:
        return None
    # nonzero() lists pairs by row, groups and offsets ascending: the candidates come by row, then column.
    return block_rows[pair], group[pair] * GROUP_SIZE + offset
