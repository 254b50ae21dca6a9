"""How well a model's similarities follow human judgments: the correlations STS benchmarks report.

Reimers and Gurevych (2019), "Sentence-BERT", section 4.1, evaluate on STS by Spearman's rank
correlation between the cosine similarity of each pair's embeddings and the gold score (Pearson's
is reported beside it). Both are computed in float64 and match scipy.stats.pearsonr and spearmanr
(tests/evaluation/test_metrics.py).
"""

import math
from collections.abc import Sequence

import numpy as np


def pearson(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Pearson correlation:
        sum((x - mean x)(y - mean y)) / sqrt(sum((x - mean x)²) · sum((y - mean y)²)).

    Computed in float64; matches scipy.stats.pearsonr. Each input is first scaled by a power of two
    that brings its largest magnitude into [0.5, 1) (exact, and the correlation does not change), so
    that values near float64's limits neither overflow nor underflow in the sums.
    """
    x, y = _paired_samples(x, y)
    if (x == x[0]).all() or (y == y[0]).all():  # before centering: its rounding can leave a constant nonzero
        raise ValueError("correlation is undefined: one of the inputs is constant")
    x, y = (np.ldexp(v, -np.frexp(np.abs(v).max())[1]) for v in (x, y))
    x, y = x - x.mean(), y - y.mean()
    return float((x @ y) / math.sqrt((x @ x) * (y @ y)))


def spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Spearman rank correlation: the Pearson correlation of the ranks of x and of y, tied values
    sharing the average of the ranks they span (scipy.stats.spearmanr, as the STS evaluations of
    sentence-transformers and MTEB use)."""
    x, y = _paired_samples(x, y)
    return pearson(average_ranks(x), average_ranks(y))


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks; tied values get the mean of the ranks they span:
    [10, 20, 20, 30] -> [1, 2.5, 2.5, 4]."""
    values = np.asarray(values)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    starts_group = np.concatenate([[True], sorted_values[1:] != sorted_values[:-1]])
    group = np.cumsum(starts_group) - 1  # group number of each sorted position
    first = np.flatnonzero(starts_group)  # 0-based start of each group
    last = np.append(first[1:], len(values)) - 1  # 0-based end of each group
    ranks = np.empty(len(values))
    ranks[order] = (first + last)[group] / 2 + 1
    return ranks


def _paired_samples(x, y) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(
            f"need two 1-D sequences of equal length, got shapes {x.shape} and {y.shape}"
        )
    if len(x) < 2:
        raise ValueError(f"need at least 2 pairs to correlate, got {len(x)}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("inputs contain NaN or inf")
    return x, y
