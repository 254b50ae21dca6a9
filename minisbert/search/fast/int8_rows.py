"""The int8 screen of a few queries over a prepared corpus (a screen as search/fast/screen.py describes).

A few queries go no faster than the corpus is read. A prepared corpus (minisbert/search/ways.py) can keep
its rows as d int8 numbers and a scale, a quarter of the bytes, to rule out most rows with.

Quantizing. A row c is kept as c' = round(c / s), integers in [-63, 63], with s = max_i |c_i| / 63,
so that ĉ = s·c' is close to c; each query is quantized the same way (q', s_q, q̂ = s_q·q'). The
integer sum q'·c' is exact (see below), and s_q·s·(q'·c') is q̂·ĉ, within |q| |c - ĉ| + |q - q̂| |ĉ|
of q·c (for random unit rows, d = 384, about 3% of |q| |c|): the copy keeps each row's |c - ĉ| and
|ĉ| (`int8_copy_terms`), the screen the coefficients of the bound (`int8_rows_coefficients`), both
proved in minisbert/search/bounds.py, section 2. Only rows whose upper bound reaches the search's
floor are candidates.

Why [-63, 63]. Without AVX512-VNNI, oneDNN (torch's x86 int8 kernel) adds two unsigned-by-signed
byte products into a 16-bit integer, saturating at 32,767: 2·255·127 saturates, 2·255·63 = 32,130
does not. A probe of extreme and random integers checks the product against float64 once per
machine (`int8_product_runs`); d products of at most 63² sum below 2^24 (exact in float32) for d < 4,227.

A row whose largest entry lies outside [2^-30, 2^50] (zero rows among them) gets the bound +inf: it
is always scored in float32. Only cosine and dot corpora keep a copy.
"""

from dataclasses import dataclass

import torch

from ...common.machine import fact, time_ratio
from ..bounds import int8_copy_terms, int8_rows_coefficients
from .screen import Chunk
from . import span_product
from .span_product import SpanProduct
from .tuning import INT8_COPY_PIECE_ROWS, INT8_ROWS_RATIO, MOST_CANDIDATES

LEVELS = 63  # int8 copies hold integers in [-LEVELS, LEVELS]: see the module docstring
SMALLEST_ENTRY = 2.0**-30  # rows (and queries) whose largest entry lies outside this range
LARGEST_ENTRY = 2.0**50  # are never screened out (their squares stay in float32's range)


@dataclass
class Int8Rows:
    """A corpus's int8 copy for the few-query screen (see the module docstring)."""

    values: torch.Tensor  # (N, d) int8 in [-LEVELS, LEVELS]: c' = round(c / s)
    scales: torch.Tensor  # (N,) float32 s, 0 for rows never screened out
    terms: torch.Tensor  # (N, 2) float32 upper bounds on |c - s c'| (+inf: never screened out) and on |s c'|

    def __getitem__(self, rows: slice) -> "Int8Rows":
        """The copy of these rows (views)."""
        return Int8Rows(self.values[rows], self.scales[rows], self.terms[rows])


def int8_rows(rows: torch.Tensor) -> Int8Rows:
    """The int8 copy of (N, d) float32 rows, INT8_COPY_PIECE_ROWS at a time."""
    values = torch.empty(rows.shape, dtype=torch.int8, device=rows.device)
    scales, terms = torch.empty(rows.shape[0], device=rows.device), torch.empty(rows.shape[0], 2, device=rows.device)
    for start in range(0, rows.shape[0], INT8_COPY_PIECE_ROWS):
        part = slice(start, start + INT8_COPY_PIECE_ROWS)
        values[part], scales[part], terms[part, 0], terms[part, 1] = _quantize(rows[part])
    return Int8Rows(values, scales, terms)


def _quantize(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(n, d) int8 values, and (n,) scales, error norms and norms of (n, d) float32 rows."""
    largest = rows.abs().amax(dim=1)  # (n,)
    usable = (largest >= SMALLEST_ENTRY) & (largest <= LARGEST_ENTRY)
    scales = torch.where(usable, largest / LEVELS, 0.0)  # (n,)
    divisors = torch.where(usable, scales, 1.0)[:, None]  # (n, 1)
    values = (rows / divisors).round_().clamp_(-LEVELS, LEVELS)  # (n, d), integers
    values[~usable] = 0
    approximations = values * scales[:, None]  # (n, d) ĉ, each entry off by at most 2^-24 of itself
    error_norms, norms = int8_copy_terms(rows, approximations)  # (n,) each
    error_norms = torch.where(usable, error_norms, torch.inf)
    return values.to(torch.int8), scales, error_norms, norms


class Int8RowsScreen:
    """Screens spans of a prepared corpus for a few queries with the corpus's int8 copy (`Chunk.kept`)."""

    def __init__(self, queries: torch.Tensor, span_rows: int):
        """queries (Q, d) float32; spans of at most `span_rows` rows."""
        values, scales, _, error_norms, norms = quantize_queries(queries, LEVELS)
        # α and β, the coefficients of a row's |e_c| and |ĉ| in the bound (search/bounds.py, section 2)
        coefficients = int8_rows_coefficients(queries.shape[1], norms, error_norms)
        self.coefficients = coefficients.float() if (scales > 0).all() else None  # (2, Q) α, β
        width = query_columns(queries.shape[0])  # columns of the product, zeros past Q
        self.query_values = torch.zeros(queries.shape[1], width, dtype=torch.int8, device=queries.device)  # (d, Q')
        self.query_values[:, : queries.shape[0]] = values.T
        self.query_scales = scales.float()  # (Q,)
        self.products = torch.empty(span_rows, width, dtype=torch.int32, device=queries.device)  # q'·c'
        self.bounds = torch.empty(span_rows, queries.shape[0], device=queries.device)

    def usable(self) -> bool:
        """Whether the queries can be screened at all (each one's largest entry in range)."""
        return self.coefficients is not None

    def load_chunk(self, chunk: Chunk) -> None:
        self.kept = chunk.kept

    def candidates(self, rows: slice, kth: torch.Tensor, own_floor=None):
        """(M,) query rows (ascending) and (M,) span rows whose float32 scores may lie above `kth`
        (Q,), and `kth`; None if too many (the search passes no own_floor: its first span is scored in
        float32)."""
        bounds = self.upper_bounds(self.kept)  # (n, Q)
        # Written as "not <=" so that a NaN (from an overflowing bound) keeps a row in.
        query_rows, candidates = (~(bounds <= kth)).T.nonzero(as_tuple=True)  # (M,), (M,) by query, then row
        if candidates.numel() > MOST_CANDIDATES * bounds.numel():
            return None
        return query_rows, candidates, kth

    def upper_bounds(self, kept: Int8Rows) -> torch.Tensor:
        """(n, Q) upper bounds on the float32 scores of the n rows whose int8 copy is `kept` with the
        queries: s_q s (q'·c') + α |e_c| + β |ĉ| (see `__init__`); NaN where one overflowed."""
        span_rows, num_queries = kept.values.shape[0], self.bounds.shape[1]
        products = self.products[:span_rows]  # (n, Q') q'·c'
        torch._int_mm(kept.values, self.query_values, out=products)  # exact: see the module docstring
        bounds = torch.mul(products[:, :num_queries], self.query_scales, out=self.bounds[:span_rows])
        return bounds.mul_(kept.scales[:, None]).addmm_(kept.terms, self.coefficients)


def query_columns(num_queries: int) -> int:
    """Columns of the int8 product for `num_queries` queries: the next power of two (probed shapes)."""
    return 1 << max(0, num_queries - 1).bit_length()


def quantize_queries(queries: torch.Tensor, levels: int):
    """(Q, d) int8 values q' in [-levels, levels] of (Q, d) float32 queries, and (Q,) float64 each: the
    scale s_q (a float32 number, as the search multiplies by it in float32; 0 where the query is not
    screened, its largest entry outside [SMALLEST_ENTRY, LARGEST_ENTRY]), L1(q'), |q - s_q q'| and |q|."""
    rows = queries.double()
    largest = rows.abs().amax(dim=1)  # (Q,)
    usable = (largest >= SMALLEST_ENTRY) & (largest <= LARGEST_ENTRY)
    scales = torch.where(usable, (largest / levels).float().double(), 0.0)  # (Q,)
    values = (rows / torch.where(usable, scales, 1.0)[:, None]).round_().clamp_(-levels, levels)  # (Q, d)
    values[~usable] = 0
    errors = torch.linalg.vector_norm(rows - values * scales[:, None], dim=1)
    return values.to(torch.int8), scales, values.abs().sum(dim=1), errors, torch.linalg.vector_norm(rows, dim=1)


def int8_product_runs(dim: int, device: torch.device, num_queries: int = 1) -> bool:
    """Whether torch's int8 product runs here for rows of `dim` numbers and `num_queries` queries
    (`query_columns` of them) and gives exact sums on a probe of extreme and random integers in
    [-LEVELS, LEVELS] (measured once per machine)."""
    if device.type != "cpu" or dim * LEVELS**2 >= 2**24:
        return False
    columns = query_columns(num_queries)
    return fact(f"int8 product of {columns} query columns exact, d = {dim}", lambda: _int8_product_runs(dim, columns), kind=bool)


def _int8_product_runs(dim: int, columns: int = 1) -> bool:
    rows = probe_integers(1024, dim, LEVELS)  # query columns: extremes of either sign, then random ones
    return all(exact_product(rows, rows[first : first + columns].T.contiguous()) for first in (0, 1, 5))


def probe_integers(num_rows: int, dim: int, levels: int) -> torch.Tensor:
    """(num_rows, dim) int8: rows of ±levels (every sign pairing), then random integers in [-levels, levels]."""
    rows = torch.randint(-levels, levels + 1, (num_rows, dim), generator=torch.Generator().manual_seed(num_rows),
                         dtype=torch.int8)
    rows[:4] = torch.tensor([levels, -levels, levels, -levels], dtype=torch.int8)[:, None]
    rows[2:4, ::2] *= -1
    return rows


def exact_product(left: torch.Tensor, right: torch.Tensor) -> bool:
    """Whether torch's int8 product of (m, d) `left` and (d, n) `right` runs and is exact."""
    try:
        products = torch._int_mm(left, right)
    except RuntimeError:  # not built for this CPU or shape
        return False
    return torch.equal(products.double(), left.double() @ right.double())


def int8_screen_pays(dim: int) -> bool:
    """Whether one query's int8 product over rows read from memory (`probe_rows`) takes under
    INT8_ROWS_RATIO of float32's."""
    if not int8_product_runs(dim, torch.device("cpu")):
        return False
    return fact(f"int8 rows pay for one query from memory, d = {dim}", lambda: _int8_time_ratio(dim) < INT8_ROWS_RATIO, kind=bool)


def _int8_time_ratio(dim: int) -> float:
    probe_rows = span_product.probe_rows(1, dim)  # rows from memory, as a search reads them
    rows = torch.full((probe_rows, dim), 0.5)
    values = torch.ones((probe_rows, dim), dtype=torch.int8)
    query, query_values = torch.full((1, dim), 0.25), torch.ones((dim, 1), dtype=torch.int8)
    block, products = torch.empty(1, probe_rows), torch.empty(probe_rows, 1, dtype=torch.int32)
    float_product = SpanProduct(query, probe_rows)
    return time_ratio(lambda: torch._int_mm(values, query_values, out=products), lambda: float_product(rows, block))
