"""The few-query search's product, a span of corpus rows times a few query rows, computed the
quickest way this machine has.

`search_spans` (search/fast/spans_blocks.py) needs the (Q', n) scores of n corpus rows against Q' factor rows,
one per query. Each way computes the (n, Q') product PIECE_ENTRIES / Q' rows at a time and copies it
transposed into the block while in the cache:

    "as given"  torch's own product of the rows as they are (for one row MKL's matrix-vector kernel)
    "rows"      torch's product, one factor row padded with a zero row, so that MKL runs its matrix kernel
    "onednn"    oneDNN's (`torch.ops.mkldnn._linear_pointwise`)

Which is quickest differs between processors by large factors (bench/README.md, "Search"), and
between rows in the cache and rows from memory: a few queries' product reads every row once, so the
first search that meets a number of factor rows (rounded up to a power of two) times each way once
over more rows than the largest cache holds (`probe_rows`) and keeps the quickest as a fact of the
machine (common/machine.py), printed with the others. It is a kernel, not a way of the search: `way=`
is the one knob that forces a way (minisbert/search/ways.py). The exact rescoring makes results
independent of it.
"""

import math
import os

import torch

from ...common import cpu
from ...common.machine import best_times, fact
from .tuning import PIECE_ENTRIES, PROBE_BYTES, PROBE_FLOP

WAYS = ("as given", "rows", "onednn")
REMOVED_VARIABLE = "MINISBERT_SPAN_PRODUCT"  # forced a kernel once; now refused, naming what replaces it


class SpanProduct:
    """Writes the (Q', n) scores of spans of corpus rows against fixed (Q', d) factor rows."""

    def __init__(self, factors: torch.Tensor, span_rows: int, forced: str | None = None):
        """factors (Q', d); spans of at most `span_rows` rows; `forced`: a way, else `way` picks
        (no factor rows: a search of no queries still checks its corpus, and nothing is multiplied)."""
        num_factors, dim = factors.shape
        self.way = forced or (way(num_factors, dim, factors.device) if num_factors > 0 else "rows")
        padded = num_factors == 1 and self.way != "as given"
        self.padded = torch.cat([factors, torch.zeros_like(factors)]) if padded else factors  # (Q'', d)
        self.piece_rows = max(1, PIECE_ENTRIES // max(1, self.padded.shape[0]))
        self.scratch = torch.empty(min(span_rows, self.piece_rows), self.padded.shape[0], device=factors.device)

    def __call__(self, rows: torch.Tensor, block: torch.Tensor) -> None:
        """rows (n, d) float32, contiguous; block (Q', n), rows contiguous: block = factors rows^T."""
        for start in range(0, rows.shape[0], self.piece_rows):
            piece = rows[start : start + self.piece_rows]  # (p, d)
            if self.padded.shape[0] == 1:  # one row, as given: the (p, 1) product is the block's row piece itself
                torch.mm(piece, self.padded.T, out=block[:, start : start + piece.shape[0]].T)
                continue
            if self.way != "onednn":
                scores = torch.mm(piece, self.padded.T, out=self.scratch[: piece.shape[0]])  # (p, Q'')
            else:
                scores = torch.ops.mkldnn._linear_pointwise(piece, self.padded, None, "none", [], "")  # (p, Q'')
            block[:, start : start + piece.shape[0]].copy_(scores[:, : block.shape[0]].T)


def runs(name: str, device: torch.device) -> bool:
    """Whether way `name` can run here: oneDNN only on a CPU with AVX2 in a build that has it."""
    return name != "onednn" or (device.type == "cpu" and torch.backends.mkldnn.is_available()
                                 and "avx2" in cpu.flags())


def refuse_removed_variable() -> None:
    """MINISBERT_SPAN_PRODUCT once forced the kernel: a setting that now does nothing is refused, naming it."""
    if REMOVED_VARIABLE in os.environ:
        raise ValueError(f"{REMOVED_VARIABLE} no longer forces the span product: the kernel is a fact of the "
                         "machine (minisbert/common/machine.py), and search(..., way=NAME) is the one knob that "
                         f"forces a way of the search; unset {REMOVED_VARIABLE}")


def way(factor_rows: int, dim: int, device: torch.device) -> str:
    """The way to multiply `factor_rows` rows of `dim` numbers with spans of rows: the quickest as
    measured once on this machine."""
    refuse_removed_variable()
    if device.type != "cpu":
        return "rows"
    rounded = 2 ** math.ceil(math.log2(max(1, factor_rows)))
    return fact(f"span product of {rounded} rows from memory, d = {dim}", lambda: _quickest(rounded, dim, device),
                choices=[name for name in WAYS if runs(name, device)])


def probe_rows(factor_rows: int, dim: int) -> int:
    """Rows of `dim` float32 numbers a probe reads: four times the largest cache (PROBE_BYTES at least),
    so that they come from memory as a search's do, unless that takes more than PROBE_FLOP a product."""
    probe_bytes = max(PROBE_BYTES, 4 * cpu.last_level_cache_bytes())
    rows = min(probe_bytes // (4 * dim), PROBE_FLOP // (2 * dim * factor_rows))
    return rows // 64 * 64 + 32  # + 32: no power-of-two row count


def _quickest(factor_rows: int, dim: int, device: torch.device) -> str:
    """Time each way that runs here on `probe_rows` rows, in turn; the quickest."""
    # Past one factor row nothing is padded: "as given" and "rows" are one product, timed once.
    candidates = [name for name in WAYS if runs(name, device) and not (name == "as given" and factor_rows > 1)]
    rows_read = probe_rows(factor_rows, dim)
    # Values do not change the time; a constant fills the probe without a random generator.
    rows = torch.full((rows_read, dim), 0.5, device=device)
    factors = torch.full((factor_rows, dim), 0.25, device=device)
    block = torch.empty(factor_rows, rows_read, device=device)
    products = {name: SpanProduct(factors, rows_read, forced=name) for name in candidates}
    best = best_times({name: lambda product=product: product(rows, block) for name, product in products.items()})
    return min(best, key=best.get)
