"""The few-query search's product, a span of corpus rows times a few query rows, computed the
quickest way this machine has.

`_search_few` (fast/retrieval.py) needs, for a span of n corpus rows (n, d) and Q' factor rows
(Q', d), the (Q', n) scores, laid out one row per query: that is what its filter and merge read.
torch gives three ways to get them:

- "queries": `torch.mm(rows, factors.T, out=block.T)`; torch's kernel (Intel MKL in x86 builds)
  writes the (Q', n) block itself;
- "rows": the same product as an (n, Q') matrix, one row per corpus row, by torch's kernel, then
  copied transposed into the block;
- "onednn": that (n, Q') product by oneDNN (`torch.ops.mkldnn._linear_pointwise`), copied likewise.

With one factor row, "rows" and "onednn" multiply two, the second zero: MKL then runs its
matrix-product kernel rather than its matrix-vector one. Those two work a piece of corpus rows at
a time, PIECE_ENTRIES / Q' rows, so that the (piece, Q') product is copied while it is still in
the cache; the copy reads and writes Q' numbers per corpus row, against the d it reads to make
them.

Which is quickest depends on the processor, by large factors (bench/README.md, "Search"), so no
rule is written down: the first search on a machine that meets a number of factor rows (rounded up
to a power of two) times each way on a probe of PROBE_BYTES of rows, in turns, keeping each one's
best of a few rounds, and keeps the quickest as a fact of the machine (minisbert/fast/machine.py),
which every later process reads back. The environment variable MINISBERT_SPAN_PRODUCT=queries,
rows or onednn forces one.

Every way sums each score in its own order, so the scores agree to float32 rounding; the search
rescores every candidate exactly (minisbert/retrieval.py), so results never depend on the way.
"""

import math
import os
import time

import torch

from .. import cpu
from .machine import fact
from .tuning import PIECE_ENTRIES, PROBE_BYTES, PROBE_FLOP, PROBE_ROUNDS

WAYS = ("queries", "rows", "onednn")
WAY_VARIABLE = "MINISBERT_SPAN_PRODUCT"  # one of WAYS forces it; unset or "auto": the machine's fact


class SpanProduct:
    """Writes the (Q', n) scores of spans of corpus rows against fixed (Q', d) factor rows."""

    def __init__(self, factors: torch.Tensor, span_rows: int, forced: str | None = None):
        """factors (Q', d); spans of at most `span_rows` rows; `forced`: a way, else `way` picks."""
        self.factors = factors  # (Q', d)
        # With no factor rows (a search of no queries still checks its corpus) nothing is multiplied.
        self.way = forced or "queries"
        if forced is None and factors.shape[0] > 0:
            self.way = way(factors.shape[0], factors.shape[1], factors.device)
        self.padded = factors
        self.scratch = None
        self.piece_rows = 0
        if self.way != "queries":
            if factors.shape[0] == 1:  # two rows, so that MKL runs its matrix-product kernel
                self.padded = torch.cat([factors, torch.zeros_like(factors)])  # (2, d)
            self.piece_rows = max(1, PIECE_ENTRIES // self.padded.shape[0])
            if self.way == "rows":
                self.scratch = torch.empty(min(span_rows, self.piece_rows), self.padded.shape[0], device=factors.device)

    def __call__(self, rows: torch.Tensor, block: torch.Tensor) -> None:
        """rows (n, d) float32, contiguous; block (Q', n), rows contiguous: block = factors rows^T."""
        if self.way == "queries":
            torch.mm(rows, self.factors.T, out=block.T)
            return
        for start in range(0, rows.shape[0], self.piece_rows):
            piece = rows[start : start + self.piece_rows]  # (p, d)
            if self.way == "rows":
                scores = self.scratch[: piece.shape[0]]  # (p, Q'')
                torch.mm(piece, self.padded.T, out=scores)
            else:
                scores = torch.ops.mkldnn._linear_pointwise(piece, self.padded, None, "none", [], "")  # (p, Q'')
            block[:, start : start + piece.shape[0]].copy_(scores[:, : block.shape[0]].T)


def runs(name: str, device: torch.device) -> bool:
    """Whether way `name` can run here: oneDNN only on a CPU with AVX2 in a build that has it."""
    if name != "onednn":
        return True
    return device.type == "cpu" and torch.backends.mkldnn.is_available() and "avx2" in cpu.flags()


def way(factor_rows: int, dim: int, device: torch.device) -> str:
    """The way to multiply `factor_rows` rows of `dim` numbers with spans of rows: forced by
    MINISBERT_SPAN_PRODUCT, else the quickest as measured once on this machine."""
    forced = os.environ.get(WAY_VARIABLE, "auto")
    if forced not in WAYS + ("auto",):
        raise ValueError(f"{WAY_VARIABLE}={forced!r}: choose one of {list(WAYS)}, or auto (the default)")
    if forced != "auto":
        if not runs(forced, device):
            raise ValueError(
                f"{WAY_VARIABLE}={forced}, but oneDNN does not run here; unset it or choose queries or rows"
            )
        return forced
    if device.type != "cpu":
        return "queries"
    rounded = 2 ** math.ceil(math.log2(max(1, factor_rows)))
    return fact(f"span product, {rounded} x {dim}", lambda: _quickest(rounded, dim, device))


def _quickest(factor_rows: int, dim: int, device: torch.device) -> str:
    """Time each way that runs here on a probe of PROBE_BYTES of rows, in turn; the quickest."""
    candidates = [name for name in WAYS if runs(name, device)]
    # Values do not change the time; a constant fills the probe without a random generator.
    probe_rows = min(PROBE_BYTES // (4 * dim), PROBE_FLOP // (2 * dim * factor_rows))
    probe_rows = probe_rows // 64 * 64 + 32  # + 32: no power-of-two row count
    rows = torch.full((probe_rows, dim), 0.5, device=device)
    factors = torch.full((factor_rows, dim), 0.25, device=device)
    block = torch.empty(factor_rows, probe_rows, device=device)
    products = {name: SpanProduct(factors, probe_rows, forced=name) for name in candidates}
    best = best_times({name: lambda product=product: product(rows, block) for name, product in products.items()})
    return min(best, key=best.get)


def best_times(calls: dict) -> dict:
    """Each of `calls` (name -> function of no arguments) timed in turns, PROBE_ROUNDS rounds after
    one untimed round that only warms up: name -> its best time in seconds."""
    best = dict.fromkeys(calls, math.inf)
    for round_number in range(PROBE_ROUNDS + 1):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if round_number > 0:
                best[name] = min(best[name], time.perf_counter() - start)
    return best
