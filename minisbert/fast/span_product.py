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

Which is quickest depends on the processor, by large factors, so no rule is written down. Over
200,000 x 384 rows on a 2-core AMD EPYC (Zen 4, AVX-512; torch 2.13 with MKL), 2 factor rows took
65 ms as "queries", 9 ms as "rows" and 22 ms as "onednn"; 17 rows took 50, 47 and 22 ms; one row,
28 ms by MKL's matrix-vector kernel. On a 2-core Intel Xeon with AMX, an earlier measurement (before
this choice existed) found the (Q', n) layout the quicker for 2 or 3 rows. The first time a search
meets a number of factor rows (rounded up to a power of two), `way` times each way on a probe of
64 MB of rows (fewer for many factor rows), in turns, keeping each one's best of a few rounds, and
uses the quickest for the rest of the process; that first search takes 0.1-0.2 s longer (Zen 4,
d = 384). The environment variable
MINISBERT_SPAN_PRODUCT=queries, rows or onednn skips the measurement and forces one; unset (or
"auto") measures.

Every way computes each score as a float32 dot product of the same two vectors, summed in the
order its kernel sums: scores agree to float32 rounding (tests/test_retrieval.py checks each way
forced against brute force).
"""

import math
import os
import time

import torch

from .. import cpu

WAYS = ("queries", "rows", "onednn")
WAY_VARIABLE = "MINISBERT_SPAN_PRODUCT"  # one of WAYS forces it; unset or "auto" measures
PROBE_BYTES = 2**26  # the probe's float32 rows: more than a 2-core machine's caches hold ...
PROBE_FLOP = 2**30  # ... unless that would take more than this many FLOP per product (many rows)
PROBE_ROUNDS = 3  # timed rounds per way, after one untimed round
# Entries of the (piece, Q') product of the "rows" and "onednn" ways (256 KB of float32, which a
# core's L2 cache holds), so a piece has PIECE_ENTRIES / Q' corpus rows. On a 2-core AMD EPYC
# (Zen 4): over 200,000 x 384 rows with 16 queries (17 factor rows), oneDNN took 42.7 ms in one
# product per span and 33 ms in pieces of 4096 rows, the product of each in the cache when it is
# copied; with one query (two factor rows), spans of 524,224 rows were multiplied at 31.6 GB/s in
# pieces of 4096 rows and 33.8 GB/s in pieces of 32,768.
PIECE_ENTRIES = 2**16
# The way chosen for each (factor rows rounded up to a power of two, d, threads), for the life of
# the process.
_chosen = {}


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
    MINISBERT_SPAN_PRODUCT, else the quickest as measured."""
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
    key = (rounded, dim, torch.get_num_threads())
    if key not in _chosen:
        _chosen[key] = _quickest(rounded, dim, device)
    return _chosen[key]


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
