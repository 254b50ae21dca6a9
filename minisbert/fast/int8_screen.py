"""The int8 screens of minisbert/fast/retrieval.py: of a one-query search over a prepared corpus
(`OneQueryScreen`, described here), and of a search of many queries (`Int8Blocks`, described in
the comment above it).

One query over a corpus of float32 rows can go no faster than the rows can be read: 4·d bytes a row.
A prepared corpus (minisbert/search.py) can keep a second, smaller copy of its rows to read
instead, and use it to rule out almost every row, the way the bfloat16 screen of
minisbert/fast/screen.py rules out entries of a block for many queries. For one query bfloat16
does not pay on a CPU (over 1,000,000 x 384 rows, a product of two rows with bfloat16 rows took
70 ms and with float32 rows 46 ms on a 2-core AMD EPYC, Zen 4), but an integer product does:
each row is kept as d int8 numbers and a scale, a quarter of the float32 bytes, and torch's int8
product of 1,000,000 such rows with one query took 17 ms there, where the float32 rows take 26-45
ms to read once.

Quantizing. A row c is kept as c' = round(c / s), integers in [-63, 63], with s = max_i |c_i| / 63,
so that ĉ = s·c' is close to c; the query is quantized the same way when the search starts
(q', s_q, q̂ = s_q·q'). The product q'·c' is a sum of integers, computed exactly (see below), and
s_q·s·(q'·c') is q̂·ĉ. Writing e_c = c - ĉ and e_q = q - q̂,
    q·c - q̂·ĉ = q·e_c + e_q·ĉ,   so   |q·c - q̂·ĉ| <= |q| |e_c| + |e_q| |ĉ|
(Cauchy-Schwarz). For each row the copy keeps |e_c| and |ĉ|, measured when it is made, and the
search measures |q| and |e_q|. That bound is about 3% of |q| |c| for random unit rows with
d = 384, where the bound by the largest entries, max_i |q_i| · sum_i |e_c,i| + ..., is about 8%.
Three roundings are added to it (`_quantize_query`): the float32 multiplications that scale q'·c'
(at most 3·2^-24 of |q̂| |ĉ|), the float32 sum of the exact score it is compared with (γ |q| |c|,
γ = d·2^-24 / (1 - d·2^-24): Higham, Accuracy and Stability of Numerical Algorithms, section
3.1), and the float32 arithmetic of the bound itself (1% of it, far more than it needs).

So every row gets an upper bound on its float32 score, and only rows whose bound beats the
running k-th best are scored in float32 and merged: the rest cannot enter. The top-k is the same
as without the screen; the few rows scored on their own may differ from the float32 block in the
last bits, as after the bfloat16 screen (see the tie note in minisbert/retrieval.py).

Why [-63, 63] and not [-127, 127]. Not every CPU multiplies int8 the same way. Without AVX512-VNNI,
oneDNN (torch's int8 kernel on x86) multiplies unsigned by signed bytes with an instruction that
adds two products into a 16-bit integer, saturating at 32,767: one side, shifted to unsigned
bytes, reaches 255, and 2 · 255 · 127 = 64,770 saturates (products of rows of 127 came out wrong
with ONEDNN_MAX_CPU_ISA=AVX2), while 2 · 255 · 63 = 32,130 does not. Before the copy is used, a
probe of extreme and random integers checks the product against float64 (`int8_product_runs`),
and the sum of d products of at most 63² must stay below 2^24, where its conversion to float32 is
exact: d < 4,227.

A row whose largest entry lies outside [2^-30, 2^50] (zero rows among them) gets the bound +inf: it
is always scored in float32. Rows are kept only for cosine and dot; a euclidean corpus keeps none.
Tested through every one-query search in tests/test_retrieval.py, and the bound itself in
test_int8_bound_holds.
"""

import functools
from dataclasses import dataclass

import torch

from ..search_inputs import drop_excluded
from .screen import GROUP_SIZE, _merge_candidates, _summation_error, block_candidates
from .span_product import SpanProduct, best_times

LEVELS = 63  # int8 copies hold integers in [-LEVELS, LEVELS]: see the module docstring
SMALLEST_ENTRY = 2.0**-30  # rows (and queries) whose largest entry lies outside this range
LARGEST_ENTRY = 2.0**50  # are never screened out (their squares stay in float32's range)
PIECE_ROWS = 8192  # rows quantized at once when a copy is made
# A span whose candidates pass this fraction of its rows is scored in float32 instead. On a 2-core
# AMD EPYC (Zen 4), over spans of 524,224 x 384 rows, scoring a candidate on its own (gathering its
# row) took 70-130 ns with up to 8,000 candidates and 720 ns with 32,000, and the float32 product
# 46 ns a row: at 1/64 of a span the candidates cost at most about a twentieth of that product.
MOST_CANDIDATES = 1 / 64
PROBE_BYTES = 2**26  # float32 rows of the probe that times the int8 product against float32


@dataclass
class Int8Rows:
    """A corpus's int8 copy for the one-query screen (see the module docstring)."""

    values: torch.Tensor  # (N, d) int8 in [-LEVELS, LEVELS]: c' = round(c / s)
    scales: torch.Tensor  # (N,) float32 s, 0 for rows never screened out
    error_norms: torch.Tensor  # (N,) float32 upper bounds on |c - s c'|; +inf: never screened out
    norms: torch.Tensor  # (N,) float32 upper bounds on |s c'|

    def span(self, start: int, end: int) -> "Int8Rows":
        """The copy of rows start to end (views)."""
        return Int8Rows(self.values[start:end], self.scales[start:end], self.error_norms[start:end],
                        self.norms[start:end])


def int8_rows(rows: torch.Tensor) -> Int8Rows:
    """The int8 copy of (N, d) float32 rows, PIECE_ROWS at a time."""
    values = torch.empty(rows.shape, dtype=torch.int8, device=rows.device)
    scales, error_norms, norms = (torch.empty(rows.shape[0], device=rows.device) for _ in range(3))
    for start in range(0, rows.shape[0], PIECE_ROWS):
        part = slice(start, start + PIECE_ROWS)
        values[part], scales[part], error_norms[part], norms[part] = _quantize(rows[part])
    return Int8Rows(values, scales, error_norms, norms)


def _quantize(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(n, d) int8 values, and (n,) scales, error norms and norms of (n, d) float32 rows."""
    largest = rows.abs().amax(dim=1)  # (n,)
    usable = (largest >= SMALLEST_ENTRY) & (largest <= LARGEST_ENTRY)
    scales = torch.where(usable, largest / LEVELS, 0.0)  # (n,)
    divisors = torch.where(usable, scales, 1.0)[:, None]  # (n, 1)
    values = (rows / divisors).round_().clamp_(-LEVELS, LEVELS)  # (n, d), integers
    values[~usable] = 0
    approximations = values * scales[:, None]  # (n, d) ĉ, each entry off by at most 2^-24 of itself
    norms = torch.linalg.vector_norm(approximations, dim=1)  # (n,)
    # |c - ĉ| as computed, plus what the rounding of ĉ may hide (2^-24 |ĉ|, taken twice) and what
    # squares that underflowed may hide (each below 2^-126: sqrt(d) 2^-63 in all, taken twice); the
    # float32 norms are off by less than 2^-10 of themselves for d < 16,000 (γ_d).
    error_norms = torch.linalg.vector_norm(rows - approximations, dim=1) + 2.0**-23 * norms
    error_norms += rows.shape[1] ** 0.5 * 2.0**-62
    error_norms = torch.where(usable, error_norms * (1 + 2.0**-10), torch.inf)
    return values.to(torch.int8), scales, error_norms, norms * (1 + 2.0**-10)


class OneQueryScreen:
    """Screens spans of a prepared corpus for one query with the corpus's int8 copy."""

    def __init__(self, query: torch.Tensor, kept: Int8Rows, span_rows: int):
        """query (1, d) float32; `kept` the corpus's int8 copy; spans of at most `span_rows` rows."""
        self.query = query
        values, scale, self.coefficients = _quantize_query(query[0])
        self.query_values = values[:, None]  # (d, 1) int8
        self.query_scale = scale
        self.products = torch.empty(span_rows, 1, dtype=torch.int32, device=query.device)  # q'·c'
        self.bounds = torch.empty(span_rows, device=query.device)

    def usable(self) -> bool:
        """Whether the query can be screened at all (its largest entry in range)."""
        return self.coefficients is not None

    def merge(self, rows: torch.Tensor, kept: Int8Rows, excluded: torch.Tensor | None, span_start: int,
              top_scores: torch.Tensor, top_indices: torch.Tensor) -> bool:
        """Merge the span of (n, d) float32 `rows` from `span_start`, whose int8 copy is `kept`,
        into the running (1, k) top-k, in place, and return True; or return False, changing
        nothing, if the top-k is not full yet or too many rows pass the screen."""
        kth = float(top_scores[0, -1])
        if kth == -torch.inf:
            return False
        span_rows = rows.shape[0]
        bounds = self.upper_bounds(kept)  # (n,)
        if excluded is not None:
            drop_excluded(bounds[None], excluded, 0, span_start)
        # Written as "not <=" so that a NaN (from an overflowing bound) keeps a row in.
        candidates = (~(bounds <= kth)).nonzero()[:, 0]  # (M,) ascending
        if candidates.numel() > MOST_CANDIDATES * span_rows:
            return False
        exact = torch.mv(rows.index_select(0, candidates), self.query[0])  # (M,) float32 scores
        enters = exact > kth
        _merge_candidates(torch.zeros_like(candidates[enters]), candidates[enters] + span_start, exact[enters],
                          top_scores, top_indices)
        return True

    def upper_bounds(self, kept: Int8Rows) -> torch.Tensor:
        """(n,) upper bounds on the float32 scores of the n rows whose int8 copy is `kept`:
        s_q s (q'·c') + α |e_c| + β |ĉ| (see `_quantize_query`); NaN where one overflowed."""
        span_rows = kept.values.shape[0]
        products = self.products[:span_rows]  # (n, 1) q'·c'
        torch._int_mm(kept.values, self.query_values, out=products)  # exact: see the module docstring
        bounds = torch.mul(products[:, 0], self.query_scale, out=self.bounds[:span_rows])
        bounds.mul_(kept.scales).add_(kept.error_norms, alpha=self.coefficients[0])
        return bounds.add_(kept.norms, alpha=self.coefficients[1])


def _quantize_query(query: torch.Tensor) -> tuple[torch.Tensor, float, tuple[float, float] | None]:
    """(d,) int8 values and the scale of a (d,) float32 query, and the coefficients (α, β) of the
    rows' |e_c| and |ĉ| in the bound on |s_fl - s_q s (q'·c')| (module docstring), where s_fl is
    a row's score as float32 computes it; None if the query cannot be screened."""
    largest = float(query.abs().max())
    if not SMALLEST_ENTRY <= largest <= LARGEST_ENTRY:
        return torch.zeros_like(query, dtype=torch.int8), 0.0, None
    # The scale as float32 holds it, since the search multiplies by it in float32.
    scale = float(torch.tensor(largest / LEVELS, dtype=torch.float32))
    values = (query.double() / scale).round().clamp(-LEVELS, LEVELS)  # (d,)
    query64 = query.double()
    norm = float(torch.linalg.vector_norm(query64))  # |q|, in float64: off by far less than 1%
    error_norm = float(torch.linalg.vector_norm(query64 - values * scale))  # |e_q|
    dim = query.shape[0]
    gamma = dim * 2.0**-24 / (1 - dim * 2.0**-24)
    scaling = 2.0**-20 * (norm + error_norm)  # the scaling's roundings, 3·2^-24 |q̂| |ĉ|, and more
    alpha = (norm + scaling + gamma * norm) * 1.01
    beta = (error_norm + scaling + gamma * norm) * 1.01
    return values.to(torch.int8), scale, (alpha, beta)


def int8_product_runs(dim: int, device: torch.device) -> bool:
    """Whether torch's int8 product runs here for rows of `dim` numbers and gives exact sums on a
    probe of extreme and random integers in [-LEVELS, LEVELS]."""
    if device.type != "cpu" or dim * LEVELS**2 >= 2**24:
        return False
    return _int8_product_runs(dim)


@functools.cache
def _int8_product_runs(dim: int) -> bool:
    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(-LEVELS, LEVELS + 1, (1024, dim), generator=generator, dtype=torch.int8)
    rows[:4] = torch.tensor([LEVELS, -LEVELS, LEVELS, -LEVELS], dtype=torch.int8)[:, None]
    for query in (rows[0], rows[1], rows[5]):
        try:
            products = torch._int_mm(rows, query[:, None].contiguous())
        except RuntimeError:  # not built for this CPU or shape
            return False
        if not torch.equal(products[:, 0].double(), rows.double() @ query.double()):
            return False
    return True


@functools.cache
def int8_screen_pays(dim: int) -> bool:
    """Whether the int8 product of a probe of PROBE_BYTES of float32 rows with one query takes less
    than 3/4 of the time of the float32 one here (best of three each, after one untimed round,
    `span_product.best_times`):
    the screen's other work takes about a tenth of the float32 product's time (2-core AMD EPYC,
    Zen 4), and below that margin the gain would be small."""
    if not int8_product_runs(dim, torch.device("cpu")):
        return False
    probe_rows = PROBE_BYTES // (4 * dim) // 64 * 64 + 32  # + 32: no power-of-two row count
    rows = torch.full((probe_rows, dim), 0.5)
    values = torch.ones((probe_rows, dim), dtype=torch.int8)
    query, query_values = torch.full((1, dim), 0.25), torch.ones((dim, 1), dtype=torch.int8)
    block, products = torch.empty(1, probe_rows), torch.empty(probe_rows, 1, dtype=torch.int32)
    float_product = SpanProduct(query, probe_rows)
    best = best_times({"int8": lambda: torch._int_mm(values, query_values, out=products),
                       "float32": lambda: float_product(rows, block)})
    return best["int8"] < 0.75 * best["float32"]


# The int8 blocks of a search of many queries (`Int8Blocks`).
#
# A search of many queries (fast/retrieval.py's `_search_many`) screens each block with an
# approximate product (screen.py's `_Screen`). Where torch's int8 product is exact for integers in
# [-127, 127] (with AVX512-VNNI it is; without, it saturates: see the module docstring) and quicker
# than the bfloat16 one, it can make the block instead: 1,000 x 8,192 x 384 took 7.2 ms against 15.0
# in bfloat16 and 32 in float32 on a 2-core AMD EPYC (Zen 4). Its bound is wider than bfloat16's,
# so more entries are scored on their own (over 200,000 random unit rows, 1,000 queries and k = 10,
# about 175 a query against 70).
#
# The products must order the entries of a query's row of the block as their scores do, so that a
# group's largest integer bounds the group (screen.py's `block_candidates`). So all the rows of a
# piece of PIECE_ROWS_MANY rows (a whole number of groups) share one scale: s = m / 127, m the
# piece's largest |c_i| (of its unit rows for cosine, made as the search makes them), and
# c' = round(c / s). Each entry is then off by at most s (1/2 + 2^-14) (the float32 division, or a
# multiplication by 1 / s, adds less than 2^-15). Each query has its own scale s_q, q' and
# e_q = q - s_q q' (in float64). Writing q̂ = s_q q' and ĉ = s c',
#     q·c - q̂·ĉ = q̂·(c - ĉ) + e_q·c,   so   |q·c - s_q s (q'·c')| <= s_q s L1(q') (1/2 + 2^-14) + |e_q| R,
# with L1(q') = sum_i |q'_i| and R the chunk's largest row norm. The float32 score that decides
# (`_Screen._rescore`) lies within γ |q| R of q·c (γ as in screen.py's `_summation_error`). So an
# entry can beat the k-th best only if its integer q'·c' is above
#     T = floor((kth - B) / (s_q s)),   B = (s_q s L1(q') (1/2 + 2^-14) + (|e_q| + γ |q|) R) · 1.01,
# computed in float64 (its roundings, below 2^-40 of |T|, are covered by the 1%, since B / (s_q s) is
# at least 63). The comparisons are then between integers. A query or a piece whose largest entry
# lies outside [2^-30, 2^50] (zero among them) is not screened: T is the lowest int32.
MANY_LEVELS = 127
# The int8 product's rows of queries are padded to a multiple of this many rows: the probe of the
# product checks such shapes only (one query row against a transposed corpus, (1, d) @ (d, N), came
# out wrong on one CPU; see OneQueryScreen).
QUERY_ROWS_MULTIPLE = 64
SENTINEL = torch.iinfo(torch.int32).min  # the product of an entry left out or past the chunk
# Rows of a chunk quantized with one scale (a whole number of groups).
PIECE_ROWS_MANY = 1024
# The int8 blocks screen only where their product takes less than this fraction of the time of the
# product they replace (`int8_blocks_pay`): see the measurements there.
RATIO_THAT_PAYS = 0.6


class Int8Blocks:
    """The approximate blocks of the int8 screen of many queries (see the comment above): used by
    screen.py's `_Screen` as `Bfloat16Blocks` is. For cosine and dot; euclidean is not screened so."""

    def __init__(self, queries: torch.Tensor, query_chunk_size: int, width: int):
        """queries (Q, d) float32 as scored; blocks of at most query_chunk_size x width entries."""
        self.euclidean = False
        self.query_values, self.query_scales, self.query_terms, self.usable = _quantize_rows(queries)
        rows = -(-min(query_chunk_size, queries.shape[0]) // QUERY_ROWS_MULTIPLE) * QUERY_ROWS_MULTIPLE
        device = queries.device
        self.padded_queries = torch.zeros(rows, queries.shape[1], dtype=torch.int8, device=device)
        self.block_buffer = torch.empty(rows * width, dtype=torch.int32, device=device)
        self.chunk_buffer = torch.empty(width, queries.shape[1], dtype=torch.int8, device=device)
        self.piece = torch.empty(min(PIECE_ROWS_MANY, width), queries.shape[1], device=device)

    def load_chunk(self, chunk: torch.Tensor, largest_norm: torch.Tensor, squared_norms: torch.Tensor | None,
                   kept: torch.Tensor | None, divisors: torch.Tensor | None) -> None:
        """See screen.py's `_Screen.load_chunk`: the chunk's int8 copy, with one scale for each piece
        of PIECE_ROWS_MANY rows (a bfloat16 copy `kept` by a prepared corpus is not used)."""
        self.num_docs, self.dim = chunk.shape
        self.largest_norm = float(largest_norm)
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

    def candidates(self, rows: slice, excluded: torch.Tensor | None, doc_start: int,
                   kth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """See screen.py's `Bfloat16Blocks.candidates`."""
        num_rows, num_docs = kth.shape[0], self.num_docs
        padded_rows = -(-num_rows // QUERY_ROWS_MULTIPLE) * QUERY_ROWS_MULTIPLE
        width = -(-num_docs // GROUP_SIZE) * GROUP_SIZE  # the chunk's rows in whole groups
        self.padded_queries[:num_rows] = self.query_values[rows]  # rows past them: unused products
        products = self.block_buffer[: padded_rows * width].view(padded_rows, width)
        torch._int_mm(self.padded_queries[:padded_rows], self.chunk_buffer[:width].T, out=products)
        products = products[:num_rows]  # (Qc, W)
        if num_docs < width:
            products[:, num_docs:] = SENTINEL
        if excluded is not None:
            drop_excluded(products[:, :num_docs], excluded, rows.start, doc_start, SENTINEL)
        # Each group lies in one piece (PIECE_ROWS_MANY is a whole number of groups): its threshold.
        piece_thresholds = self._thresholds(rows, kth)  # (Qc, pieces) int32
        groups_per_piece = self.piece.shape[0] // GROUP_SIZE
        groups = products.view(num_rows, -1, GROUP_SIZE)  # (Qc, W / G, G)
        group_maxima = groups.amax(dim=2)  # (Qc, W / G)
        thresholds = piece_thresholds.repeat_interleave(groups_per_piece, dim=1)[:, : group_maxima.shape[1]]

        def passes(values: torch.Tensor, block_rows, group) -> torch.Tensor:
            threshold = thresholds[block_rows, group]
            return values > (threshold if values.dim() == threshold.dim() else threshold[:, None])

        return block_candidates(groups, group_maxima, passes)

    def bounds(self, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """(Qc, pieces) float64 s_q s and B for the query `rows` and each piece of the loaded
        chunk: |s_fl - s_q s (q'·c')| <= B for each of their entries (the comment above
        Int8Blocks; B with its 1%); s_q s is 0 where the query or the piece is not screened."""
        scales = self.query_scales[rows, None] * self.scales  # (Qc, pieces)
        l1_norms, error_norms, norms = self.query_terms[rows, :, None].unbind(dim=1)  # (Qc, 1) each
        gamma = _summation_error(self.dim)
        bounds = scales * l1_norms * (0.5 + 2.0**-14) + (error_norms + gamma * norms) * self.largest_norm
        return scales, bounds * 1.01

    def _thresholds(self, rows: slice, kth: torch.Tensor) -> torch.Tensor:
        """(Qc, pieces) int32 T: an entry of a query row and a piece can beat the query's float32
        k-th best (`kth`, (Qc,)) only if its q'·c' > T (see the comment above Int8Blocks); the
        lowest int32 where the query or the piece is not screened."""
        scales, bounds = self.bounds(rows)
        thresholds = ((kth.double()[:, None] - bounds) / scales).floor_()
        screened = self.usable[rows, None] & (self.scales > 0)
        thresholds = torch.where(screened, thresholds, SENTINEL).clamp_(SENTINEL, -SENTINEL - 1)
        return thresholds.to(torch.int32)


def _quantize_rows(queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The many-query screen's copy of (Q, d) float32 queries: (Q, d) int8 values q' in
    [-MANY_LEVELS, MANY_LEVELS], (Q,) float64 scales s_q (0 for a query not screened), (Q, 3)
    float64 L1(q'), |q - s_q q'| and |q|, and the (Q,) usable mask."""
    rows = queries.double()
    largest = rows.abs().amax(dim=1)  # (Q,)
    usable = (largest >= SMALLEST_ENTRY) & (largest <= LARGEST_ENTRY)
    scales = torch.where(usable, largest / MANY_LEVELS, 0.0)  # (Q,)
    values = (rows / torch.where(usable, scales, 1.0)[:, None]).round_().clamp_(-MANY_LEVELS, MANY_LEVELS)
    values[~usable] = 0
    terms = torch.stack([values.abs().sum(dim=1), torch.linalg.vector_norm(rows - values * scales[:, None], dim=1),
                         torch.linalg.vector_norm(rows, dim=1)], dim=1)  # (Q, 3)
    return values.to(torch.int8), scales, terms, usable


@functools.cache
def int8_blocks_exact(dim: int) -> bool:
    """Whether torch's int8 product gives exact sums here for the blocks of `Int8Blocks` with rows
    of `dim` numbers: a probe of extreme and random integers in [-MANY_LEVELS, MANY_LEVELS], with
    64 and 1,024 query rows against a transposed chunk of 512 rows, checked against float64."""
    if dim * MANY_LEVELS**2 >= 2**31:
        return False
    generator = torch.Generator().manual_seed(0)
    chunk = torch.randint(-MANY_LEVELS, MANY_LEVELS + 1, (512, dim), generator=generator, dtype=torch.int8)
    queries = torch.randint(-MANY_LEVELS, MANY_LEVELS + 1, (1024, dim), generator=generator, dtype=torch.int8)
    for rows in (chunk, queries):  # every sign pairing of the extremes
        rows[:4] = torch.tensor([MANY_LEVELS, -MANY_LEVELS, MANY_LEVELS, -MANY_LEVELS], dtype=torch.int8)[:, None]
        rows[2:4, ::2] *= -1
    for num_rows in (QUERY_ROWS_MULTIPLE, 1024):
        try:
            products = torch._int_mm(queries[:num_rows], chunk.T)
        except RuntimeError:  # not built for this CPU or shape
            return False
        if not torch.equal(products.double(), queries[:num_rows].double() @ chunk.double().T):
            return False
    return True


@functools.cache
def int8_blocks_pay(dim: int, bfloat16: bool) -> bool:
    """Whether `Int8Blocks` should screen the many-query search here: its product exact
    (`int8_blocks_exact`) and, for a block of 512 queries against 2,112 rows (best of three
    after one untimed round, `span_product.best_times`), taking under RATIO_THAT_PAYS of the time
    of the product it replaces: the bfloat16 screen's if the CPU multiplies bfloat16 natively
    (`bfloat16`), else the float32 block's. (On a 2-core AMD EPYC, Zen 4, d = 384, the ratio was
    0.50-0.51 at 256 x 1,088, 512 x 2,112 and 1,024 x 4,160; this size takes about 12 ms to time.)"""
    if not int8_blocks_exact(dim):
        return False
    queries, chunk = torch.ones(512, dim, dtype=torch.int8), torch.ones(2048 + GROUP_SIZE, dim, dtype=torch.int8)
    other = torch.float32 if not bfloat16 else torch.bfloat16
    other_queries, other_chunk = queries.to(other), chunk.to(other)
    products = torch.empty(queries.shape[0], chunk.shape[0], dtype=torch.int32)
    other_products = torch.empty(queries.shape[0], chunk.shape[0], dtype=other)
    best = best_times({"int8": lambda: torch._int_mm(queries, chunk.T, out=products),
                       "other": lambda: torch.mm(other_queries, other_chunk.T, out=other_products)})
    return best["int8"] < RATIO_THAT_PAYS * best["other"]
