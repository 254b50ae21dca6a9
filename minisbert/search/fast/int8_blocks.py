"""The int8 screen of a search of many queries (`Int8Blocks`; a screen as search/fast/screen.py describes),
where torch's int8 product is exact for integers in [-127, 127] (with AVX512-VNNI it is; without,
oneDNN saturates: search/fast/int8_rows.py) and quicker than the float32 product it replaces.

A group's largest integer must bound the group (`block_candidates`), so the rows of a piece of
INT8_PIECE_ROWS rows (whole groups) share one scale s = m / 127, m the piece's largest |c_i| (of its
unit rows for cosine), and c' = round(c / s). Each query has its own scale s_q and q'. The float32
score that decides (`Screen._rescore`) lies within B of s_q s (q'·c') (`int8_blocks_bound`, proved
in minisbert/search/bounds.py, section 3), so an entry can beat the k-th best only if its integer
q'·c' is above T = floor((kth - B) / (s_q s)), computed in float64. A query or a piece whose largest
entry lies outside [2^-30, 2^50] (zero among them) is not screened: T is the lowest int32.
"""

from functools import partial

import torch

from .int8_rows import LARGEST_ENTRY, SMALLEST_ENTRY, exact_product, probe_integers, quantize_queries
from ...common.machine import fact, time_ratio
from ..bounds import int8_blocks_bound
from .screen import GROUP_SIZE, Chunk, best_entries, block_candidates
from .tuning import INT8_BLOCKS_RATIO, INT8_PIECE_ROWS

MANY_LEVELS = 127
# Query rows are padded to a multiple of this many: the probe checks such shapes only ((1, d) @ (d, N)
# came out wrong on one CPU).
QUERY_ROWS_MULTIPLE = 64
SENTINEL = torch.iinfo(torch.int32).min  # the product of an entry past the chunk


class Int8Blocks:
    """The approximate blocks of the int8 screen of many queries (module docstring). For cosine and
    dot; euclidean is not screened so."""

    def __init__(self, queries: torch.Tensor, query_chunk_size: int, width: int):
        """queries (Q, d) float32 as scored; blocks of at most query_chunk_size x width entries."""
        self.query_values, self.query_scales, *terms = quantize_queries(queries, MANY_LEVELS)
        self.query_terms, self.usable = torch.stack(terms, dim=1), self.query_scales > 0  # (Q, 3): L1(q'), |e_q|, |q|
        rows = -(-min(query_chunk_size, queries.shape[0]) // QUERY_ROWS_MULTIPLE) * QUERY_ROWS_MULTIPLE
        device = queries.device
        self.padded_queries = torch.zeros(rows, queries.shape[1], dtype=torch.int8, device=device)
        self.block_buffer = torch.empty(rows * width, dtype=torch.int32, device=device)
        self.chunk_buffer = torch.empty(width, queries.shape[1], dtype=torch.int8, device=device)
        self.piece = torch.empty(min(INT8_PIECE_ROWS, width), queries.shape[1], device=device)

    def load_chunk(self, chunk: Chunk) -> None:
        """The chunk's int8 copy, with one scale for each piece of INT8_PIECE_ROWS rows."""
        divisors, chunk, self.largest_norm = chunk.divisors, chunk.rows, chunk.largest_norm
        self.num_docs, self.dim = chunk.shape
        piece_rows = self.piece.shape[0]
        scales = []  # float64 s of each piece; 0 for a piece not screened
        for start in range(0, self.num_docs, piece_rows):
            rows = slice(start, min(start + piece_rows, self.num_docs))
            piece = chunk[rows]
            if divisors is not None:  # unit rows, with the bits the search gives them
                piece = torch.div(piece, divisors[rows], out=self.piece[: rows.stop - start])
            smallest, largest = (float(value) for value in torch.aminmax(piece))
            largest = max(-smallest, largest)
            if not SMALLEST_ENTRY <= largest <= LARGEST_ENTRY:  # zeros, or too small or large to scale
                self.chunk_buffer[rows] = 0
                scales.append(0.0)
                continue
            scale = float(torch.tensor(largest / MANY_LEVELS, dtype=torch.float32))
            steps = torch.div(piece, scale, out=self.piece[: rows.stop - start])  # (in place if unit rows)
            self.chunk_buffer[rows] = steps.round_().clamp_(-MANY_LEVELS, MANY_LEVELS)
            scales.append(scale)
        self.scales = torch.tensor(scales, dtype=torch.float64, device=chunk.device)  # (pieces,)

    def candidates(self, rows: slice, kth: torch.Tensor, own_floor=None):
        """(M,) block rows and (M,) chunk columns of the entries whose float32 scores may lie above
        the (Qc,) `kth`, sorted by row and then by column, and `kth` (or own_floor's: search/fast/screen.py's
        `Screen`); None if too many survive."""
        num_rows, num_docs = kth.shape[0], self.num_docs
        padded_rows = -(-num_rows // QUERY_ROWS_MULTIPLE) * QUERY_ROWS_MULTIPLE
        width = -(-num_docs // GROUP_SIZE) * GROUP_SIZE  # the chunk's rows in whole groups
        self.padded_queries[:num_rows] = self.query_values[rows]  # rows past them: unused products
        products = self.block_buffer[: padded_rows * width].view(padded_rows, width)
        torch._int_mm(self.padded_queries[:padded_rows], self.chunk_buffer[:width].T, out=products)
        products = products[:num_rows]  # (Qc, W)
        if num_docs < width:
            products[:, num_docs:] = SENTINEL
        groups = products.view(num_rows, -1, GROUP_SIZE)  # (Qc, W / G, G)
        group_maxima = groups.amax(dim=2)  # (Qc, W / G)
        # Each group lies in one piece (INT8_PIECE_ROWS is a whole number of groups).
        groups_per_piece = self.piece.shape[0] // GROUP_SIZE
        if own_floor is not None:  # groups compared by s_q s (q'·c'), their pieces' scales told apart
            scales = self.bounds(rows)[0].repeat_interleave(groups_per_piece, dim=1)[:, : group_maxima.shape[1]]
            kth = own_floor(scales * group_maxima, partial(best_entries, groups))
        piece_thresholds = self._thresholds(rows, kth)  # (Qc, pieces) int32
        thresholds = piece_thresholds.repeat_interleave(groups_per_piece, dim=1)[:, : group_maxima.shape[1]]

        def passes(values: torch.Tensor, block_rows, group) -> torch.Tensor:
            threshold = thresholds[block_rows, group]
            return values > (threshold if values.dim() == threshold.dim() else threshold[:, None])

        found = block_candidates(groups, group_maxima, passes)
        return None if found is None else (*found, kth)

    def bounds(self, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """(Qc, pieces) float64 s_q s and B for the query `rows` and each piece of the loaded
        chunk: |s_fl - s_q s (q'·c')| <= B for each of their entries (module docstring); s_q s is 0
        where the query or the piece is not screened."""
        scales = self.query_scales[rows, None] * self.scales  # (Qc, pieces)
        l1_norms, error_norms, norms = self.query_terms[rows, :, None].unbind(dim=1)  # (Qc, 1) each
        return scales, int8_blocks_bound(self.dim, scales, l1_norms, error_norms, norms, self.largest_norm)

    def _thresholds(self, rows: slice, kth: torch.Tensor) -> torch.Tensor:
        """(Qc, pieces) int32 T: an entry of a query row and a piece can beat the query's float32
        k-th best (`kth`, (Qc,)) only if its q'·c' > T (module docstring); the
        lowest int32 where the query or the piece is not screened."""
        scales, bounds = self.bounds(rows)
        thresholds = ((kth.double()[:, None] - bounds) / scales).floor_()
        screened = self.usable[rows, None] & (self.scales > 0)
        thresholds = torch.where(screened, thresholds, SENTINEL).clamp_(SENTINEL, -SENTINEL - 1)
        return thresholds.to(torch.int32)


def int8_blocks_exact(dim: int) -> bool:
    """Whether torch's int8 product gives exact sums here for the blocks of `Int8Blocks` with rows of
    `dim` numbers (measured once per machine): a probe of extreme and random integers in
    [-MANY_LEVELS, MANY_LEVELS], 64 and 1,024 query rows against a transposed chunk of 512 rows."""
    if dim * MANY_LEVELS**2 >= 2**31:
        return False
    return fact(f"int8 blocks exact, d = {dim}", lambda: _int8_blocks_exact(dim), kind=bool)


def _int8_blocks_exact(dim: int) -> bool:
    chunk, queries = probe_integers(512, dim, MANY_LEVELS), probe_integers(1024, dim, MANY_LEVELS)
    return all(exact_product(queries[:rows], chunk.T) for rows in (QUERY_ROWS_MULTIPLE, 1024))


def int8_blocks_pay(dim: int) -> bool:
    """Whether `Int8Blocks` should screen the many-query search here (measured once per machine): its
    product exact and, for a block of 512 queries against 2,112 rows, taking under INT8_BLOCKS_RATIO
    of the time of the float32 product it replaces."""
    if not int8_blocks_exact(dim):
        return False
    return fact(f"int8 blocks pay against float32, d = {dim}", lambda: _int8_blocks_ratio(dim) < INT8_BLOCKS_RATIO, kind=bool)


def _int8_blocks_ratio(dim: int) -> float:
    queries, chunk = torch.ones(512, dim, dtype=torch.int8), torch.ones(2048 + GROUP_SIZE, dim, dtype=torch.int8)
    float_queries, float_chunk = queries.float(), chunk.float()
    products = torch.empty(queries.shape[0], chunk.shape[0], dtype=torch.int32)
    float_products = torch.empty(queries.shape[0], chunk.shape[0])
    return time_ratio(lambda: torch._int_mm(queries, chunk.T, out=products),
                      lambda: torch.mm(float_queries, float_chunk.T, out=float_products))
