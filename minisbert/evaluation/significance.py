"""Paired significance tests: is model A better than model B on these queries, or is it luck?

Both models are scored on the same queries, so the tests work on the per-query differences
d_i = a_i - b_i and ask whether their mean could be 0 (H0: the two models are equally good):

randomization test  Fisher's sign-flip test (Fisher 1935; recommended for IR by Smucker, Allan &
                    Carterette, CIKM 2007). Under H0 each d_i is as likely to be +|d_i| as -|d_i|.
paired t-test       t = mean(d) / (sd(d) / sqrt(n)) against Student's t with n - 1 degrees of freedom.
bootstrap interval  percentile bootstrap (Efron & Tibshirani 1993, ch. 13) of mean(d).
equivalence test    two one-sided t-tests (Schuirmann 1987) of H0: |mean(d)| >= margin. A small p
                    says the difference lies within ±margin; a large p of the tests above says only
                    that the data cannot tell, never that nothing changed.
Holm, Bonferroni    adjusted p-values when several comparisons are tested at once (Holm 1979).
crossed t           for models trained with several seeds, scored on the same queries: the seeds x
                    queries table's mean, its variance from the two-way analysis of variance (seeds,
                    queries, their interaction), each part at its own degrees of freedom (4 for five
                    seeds), so that one interval carries both the training runs' and the queries'
                    variance and covers with few seeds (crossed_t, spearman_crossed; coverage
                    simulated in the tests). The studies decide by it alone.

`compare` runs them all on one metric's {query id: value} maps; `spearman_difference` does the
same for the Spearman correlation of an STS benchmark, which is not a mean of per-query values.
`with_holm` adjusts a list of tests by Holm's method, for evaluate.py (`compare_with_first`, every
model against the first) and the studies alike.
Their intervals are 95% intervals of one comparison: unadjusted. When a caller adjusts the p's of
a family (holm), an interval that leaves out 0 can still belong to an adjusted p above 0.05.
A randomization p drawn from random sign vectors comes with its Monte Carlo standard error.

Checked against scipy.stats.permutation_test, ttest_rel and bootstrap (tests/evaluation/test_significance.py;
reference numbers written by tests/fixtures/make_significance.py); the crossed t against scipy's t
quantiles and root finder (tests/fixtures/make_crossed_t.py).
"""

import functools
import math
import numbers
from collections.abc import Mapping, Sequence

import numpy as np

from .correlation import average_ranks, spearman

BLOCK = 256  # random sign vectors or resamples drawn at a time: memory is BLOCK x n floats
TOLERANCE = 1e-12  # relative; keeps float error in a re-summed statistic from dropping a tie


def randomization_test(a, b, trials: int = 10_000, seed: int = 0) -> float:
    """Two-sided p of Fisher's paired randomization (sign-flip) test.

    With d = a - b, p = #{signs s : |sum(s * d)| >= |sum(d)|} / #{signs}. When 2**n <= trials all
    2**n sign vectors are enumerated and p is exact; otherwise `trials` random sign vectors are
    drawn (numpy default_rng(seed)) and p = (1 + count) / (1 + trials), which counts the observed
    assignment among them so that p is never 0.
    """
    a, b = _paired(a, b)
    d = a - b
    _check_count("trials", trials)
    n = len(d)
    threshold = abs(d.sum()) - TOLERANCE * np.abs(d).sum()
    if 2**n <= trials:
        signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)  # (2**n, n): all patterns
        return float(np.mean(np.abs(signs @ d) >= threshold))
    rng = np.random.default_rng(seed)
    count = 0
    for start in range(0, trials, BLOCK):
        signs = 2 * rng.integers(0, 2, size=(min(BLOCK, trials - start), n)) - 1  # (block, n)
        count += int(np.sum(np.abs(signs @ d) >= threshold))
    return (1 + count) / (1 + trials)


def paired_t_test(a, b) -> float:
    """Two-sided p of the paired t-test.

    t = mean(d) / (sd(d) / sqrt(n)), sd with ddof=1, and df = n - 1. The two tails of Student's t
    beyond |t| hold P(|T| >= |t|) = I_x(df/2, 1/2) with x = df / (df + t²), I the regularized
    incomplete beta function. All differences 0 gives p = 1; equal nonzero differences give p = 0.
    """
    a, b = _paired(a, b)
    d = a - b
    mean, sd, df = float(d.mean()), float(d.std(ddof=1)), len(d) - 1
    if sd == 0:
        return 1.0 if mean == 0 else 0.0
    t = mean / (sd / math.sqrt(len(d)))
    return _regularized_incomplete_beta(df / (df + t * t), df / 2, 0.5)


def _regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b) = B(x; a, b) / B(a, b), the integral of t^(a-1) (1-t)^(b-1) from 0 to x over
    the same integral from 0 to 1.

    Evaluated as x^a (1-x)^b / (a B(a, b)) divided by a continued fraction (Numerical Recipes,
    3rd ed., §6.4) computed with the modified Lentz method. The fraction converges fast only for
    x < (a + 1) / (a + b + 2); above that, I_x(a, b) = 1 - I_{1-x}(b, a).
    """
    if x == 0 or x == 1:
        return float(x)
    if x > (a + 1) / (a + b + 2):
        return 1 - _regularized_incomplete_beta(1 - x, b, a)
    log_beta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    front = math.exp(a * math.log(x) + b * math.log1p(-x) - log_beta) / a
    return front / _beta_continued_fraction(x, a, b)


def _beta_continued_fraction(x: float, a: float, b: float) -> float:
    """f = 1 + c_1 / (1 + c_2 / (1 + c_3 / ...)), where
    c_2m+1 = -(a+m)(a+b+m) x / ((a+2m)(a+2m+1))  and  c_2m = m(b-m) x / ((a+2m-1)(a+2m)),
    by the modified Lentz method: f_j = f_j-1 C_j D_j with C_j = 1 + c_j / C_j-1 and
    D_j = 1 / (1 + c_j D_j-1), starting from f_0 = C_0 = 1, D_0 = 0; a zero that would be divided
    by is replaced by a tiny number. Stops when C_j D_j is 1 to double precision."""
    tiny = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for j in range(1, 20_000):
        m = j // 2
        if j % 2:
            coefficient = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        else:
            coefficient = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        c = 1 + coefficient / c
        c = c if abs(c) > tiny else tiny
        d = 1 + coefficient * d
        d = 1 / (d if abs(d) > tiny else tiny)
        f *= c * d
        if abs(c * d - 1) < 1e-15:
            return f
    raise RuntimeError(f"incomplete beta continued fraction did not converge for x={x}, a={a}, b={b}")


def randomization_error(p: float, n: int, trials: int = 10_000) -> float:
    """The Monte Carlo standard error of randomization_test's p for n paired values: 0 when all
    2**n sign vectors were enumerated (the p is exact), else sqrt(p (1 - p) / trials), the standard
    error of a proportion estimated from `trials` independent draws."""
    _check_count("trials", trials)
    return 0.0 if 2**n <= trials else math.sqrt(p * (1 - p) / trials)


def equivalence_test(a, b, margin: float) -> float:
    """p of the two one-sided paired t-tests (TOST, Schuirmann 1987) of H0: |mean(d)| >= margin.

    With d = a - b, se = sd(d) / sqrt(n) (ddof=1) and df = n - 1:
        lower test  H0: mean <= -margin,  t_low = (mean + margin) / se,  p_low = P(T >= t_low)
        upper test  H0: mean >= +margin,  t_high = (mean - margin) / se, p_high = P(T <= t_high)
    and p = max(p_low, p_high): both nulls must be rejected to say the difference lies within
    ±margin. p < alpha exactly when the (1 - 2 alpha) t-interval of mean(d) lies inside (-margin,
    margin). One tail of Student's t: P(T >= t) = I_x(df/2, 1/2) / 2 with x = df / (df + t²) for
    t >= 0, and 1 minus that for t < 0. Equal differences (sd 0) give p = 0 inside the margin and
    p = 1 on or outside it.
    """
    a, b = _paired(a, b)
    if not margin > 0:
        raise ValueError(f"the equivalence margin must be positive, got {margin}")
    d = a - b
    mean, sd, df = float(d.mean()), float(d.std(ddof=1)), len(d) - 1
    if sd == 0:
        return 0.0 if abs(mean) < margin else 1.0
    se = sd / math.sqrt(len(d))
    return max(_upper_tail((mean + margin) / se, df), _upper_tail((margin - mean) / se, df))


def _upper_tail(t: float, df: float) -> float:
    """P(T >= t) for Student's t with df degrees of freedom (P(T <= t_high) = P(T >= -t_high))."""
    half = _regularized_incomplete_beta(df / (df + t * t), df / 2, 0.5) / 2
    return half if t >= 0 else 1 - half


def bootstrap_ci(a, b, level: float = 0.95, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(a - b): draw n queries with replacement `resamples`
    times (numpy default_rng(seed)), take mean(d) of each draw, and return the (1 - level) / 2 and
    (1 + level) / 2 quantiles of those means (numpy.quantile, linear interpolation)."""
    a, b = _paired(a, b)
    d = a - b
    _check_count("resamples", resamples)
    if not 0 < level < 1:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")
    rng = np.random.default_rng(seed)
    means = np.concatenate([
        d[rng.integers(0, len(d), size=(min(BLOCK, resamples - start), len(d)))].mean(axis=1)
        for start in range(0, resamples, BLOCK)
    ])
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni step-down adjusted p-values, in the input order.

    Sort the m p-values ascending; the j-th smallest (1-based) is multiplied by m - j + 1, capped
    at 1, and raised to the largest adjusted value before it, so the order never flips.
    [0.01, 0.04, 0.03, 0.2] -> [0.04, 0.09, 0.09, 0.2].
    """
    p = _check_p_values(p_values)
    m = len(p)
    order = np.argsort(p, kind="stable")
    adjusted_sorted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    return adjusted_sorted[np.argsort(order)].tolist()  # argsort(order) undoes the sort


def bonferroni(p_values: Sequence[float]) -> list[float]:
    """Bonferroni adjusted p-values: min(1, m * p) for each of the m p-values."""
    p = _check_p_values(p_values)
    return np.minimum(1.0, len(p) * p).tolist()


def with_holm(tests: list) -> list:
    """The tests (dicts with "p_randomization"), each with "p_holm": its randomization p adjusted by
    Holm's method over the list, the comparisons of one question."""
    return [{**t, "p_holm": p} for t, p in zip(tests, holm([t["p_randomization"] for t in tests]))]


def compare(a: Mapping, b: Mapping, trials: int = 10_000, resamples: int = 10_000, seed: int = 0,
            margin: float | None = None) -> dict:
    """Compare two models on one metric, given as {query id: value} for each model.

    Returns the mean difference a - b, its 95% bootstrap interval ("ci95", unadjusted), the
    two-sided p of the randomization test with its Monte Carlo standard error
    ("p_randomization_error") and the p of the paired t-test, all plain floats; given a margin,
    also the margin and the equivalence test's p ("p_equivalence").
    """
    for name, values in (("a", a), ("b", b)):
        if not isinstance(values, Mapping):  # a list's values would be read as query ids
            raise TypeError(f"{name} must map each query id to its value, got a {type(values).__name__}; for "
                            f"values in one query order pass dict(enumerate({name}))")
    only_a, only_b = [q for q in a if q not in b], [q for q in b if q not in a]
    if only_a or only_b:
        raise ValueError(f"a and b must score the same queries: {len(only_a)} ids only in a "
                         f"{only_a[:5]}, {len(only_b)} only in b {only_b[:5]}")
    values_a, values_b = _paired([a[q] for q in a], [b[q] for q in a])
    p = randomization_test(values_a, values_b, trials, seed)
    result = {
        "difference": float(np.mean(values_a - values_b)),
        "ci95": list(bootstrap_ci(values_a, values_b, 0.95, resamples, seed)),
        "p_randomization": p,
        "p_randomization_error": randomization_error(p, len(values_a), trials),
        "p_t_test": paired_t_test(values_a, values_b),
    }
    if margin is not None:
        result |= {"margin": margin, "p_equivalence": equivalence_test(values_a, values_b, margin)}
    return result


def spearman_difference(x_a, x_b, gold, trials: int = 10_000, resamples: int = 2_000, seed: int = 0) -> dict:
    """Compare two models on an STS benchmark: spearman(x_a, gold) - spearman(x_b, gold).

    x_a and x_b are two models' similarity scores for the same sentence pairs. A correlation is
    not a mean of per-pair values, so there is no per-query t-test ("p_t_test" is None); the
    other numbers resample whole pairs. ci95: percentile bootstrap, both Spearmans recomputed on
    each resample (costlier than a mean, hence 2,000 resamples by default; a resample in which a
    column is constant has no correlation and is left out). p_randomization: each model's scores
    become ranks; each trial swaps the two models' ranks pair by pair with probability 1/2 and
    recomputes each column's Pearson correlation with the gold ranks; p = (1 + #{|diff*| >=
    |diff|}) / (1 + trials), diff computed the same way on the unswapped ranks (equal to the
    Spearman difference when there are no ties).
    """
    x_a, x_b, gold = _paired(x_a, x_b, gold, names=("x_a", "x_b", "gold"))
    _check_count("trials", trials)
    _check_count("resamples", resamples)
    rng = np.random.default_rng(seed)
    differences = []
    for _ in range(resamples):
        pairs = rng.integers(0, len(gold), size=len(gold))
        if min(np.ptp(x_a[pairs]), np.ptp(x_b[pairs]), np.ptp(gold[pairs])) > 0:
            differences.append(spearman(x_a[pairs], gold[pairs]) - spearman(x_b[pairs], gold[pairs]))
    low, high = np.quantile(differences, [0.025, 0.975])
    return {
        "difference": spearman(x_a, gold) - spearman(x_b, gold),
        "ci95": [float(low), float(high)],
        "p_randomization": _rank_swap_test(x_a, x_b, gold, trials, seed),
        "p_t_test": None,
    }


def compare_with_first(results: dict) -> None:
    """Add results[name]["significance"] for every model after the first: {metric: its difference from
    the first model, tested (`compare` on the models' "per_query" values; for STS, where a model's
    result holds "similarities", `spearman_difference`), each with "p_holm" over the compared models}."""
    first, *others = results
    tests = {}  # metric -> [the test of each other model]
    for name in others:
        if "similarities" in results[first]:  # STS: each model's similarity of every pair, and the gold scores
            (ours, gold), (theirs, _) = results[name]["similarities"], results[first]["similarities"]
            tests.setdefault("spearman", []).append(spearman_difference(ours, theirs, gold))
            continue
        for metric, values in results[first]["per_query"].items():
            try:
                test = compare(results[name]["per_query"][metric], values)
            except ValueError as error:
                raise ValueError(f"{name} and {first} were evaluated on different queries: {error}") from None
            tests.setdefault(metric, []).append(test)
    tests = {metric: with_holm(compared) for metric, compared in tests.items()}
    for position, name in enumerate(others):
        results[name]["significance"] = {metric: compared[position] for metric, compared in tests.items()}


def _rank_swap_test(x_a: np.ndarray, x_b: np.ndarray, gold: np.ndarray, trials: int, seed: int) -> float:
    """The p_randomization of spearman_difference (see there)."""
    ranks_a, ranks_b, gold_ranks = average_ranks(x_a), average_ranks(x_b), average_ranks(gold)
    gold_unit = gold_ranks - gold_ranks.mean()
    gold_unit /= np.linalg.norm(gold_unit)
    observed = abs(_correlation(ranks_a[None], gold_unit) - _correlation(ranks_b[None], gold_unit))[0]
    rng = np.random.default_rng(seed)
    count = 0
    for start in range(0, trials, BLOCK):
        swap = rng.integers(0, 2, size=(min(BLOCK, trials - start), len(gold))).astype(bool)  # (block, n)
        columns_a, columns_b = np.where(swap, ranks_b, ranks_a), np.where(swap, ranks_a, ranks_b)
        swapped = _correlation(columns_a, gold_unit) - _correlation(columns_b, gold_unit)  # (block,)
        count += int(np.sum(np.abs(swapped) >= observed - TOLERANCE))
    return (1 + count) / (1 + trials)


def _correlation(columns: np.ndarray, unit_centered: np.ndarray) -> np.ndarray:
    """Pearson correlation of each row of columns (k, n) with a centered unit vector (n,). A
    constant row (possible after a swap when n is tiny) counts as uncorrelated: 0."""
    centered = columns - columns.mean(axis=1, keepdims=True)
    norms = np.linalg.norm(centered, axis=1)
    return np.divide(centered @ unit_centered, norms, out=np.zeros(len(columns)), where=norms > 0)


# ---------------------------------------------------------------------------------------------
# Over seeds and queries: the crossed t the studies decide by


def crossed_t(differences, margin: float | None = None, level: float = 0.95) -> dict:
    """The t inference of the mean of a (seeds S, queries Q) table of paired differences, for a crossed
    model with few seeds: d[s, q] = δ + u_s + w_q + e_sq, seed, query and interaction effects with
    variances σ_u², σ_w², σ_e²: d[s, q] = a[s, q] - b[s, q], model a's network of seed s against model b's
    network of the same seed (or b's one network, for an untrained model) on query q. The same queries
    are scored in every seed (seeds and queries are crossed, not nested), so a query that is hard for a
    is hard for it in every seed: the query effect is shared by the seeds, not averaged over them.

    The mean's variance is σ_u²/S + σ_w²/Q + σ_e²/(S Q), estimated from the two-way analysis of
    variance's mean squares M_S = Q Σ_s (d̄_s. - d̄)² / (S - 1), M_Q = S Σ_q (d̄_.q - d̄)² / (Q - 1) and
    M_E = Σ (d_sq - d̄_s. - d̄_.q + d̄)² / ((S - 1)(Q - 1)), whose expectations are σ_e² + Q σ_u²,
    σ_e² + S σ_w² and σ_e² (a component estimated below 0 is taken as 0): V = Σ c_i M_i. Each mean
    square has its own degrees of freedom (S - 1, Q - 1, (S - 1)(Q - 1)), and with 5 seeds the seeds'
    is 4: a normal quantile covers well below 95% where the seeds dominate, as does a two-level
    bootstrap (seeds, then queries, drawn with replacement: A. B. Owen, "The pigeonhole bootstrap",
    Annals of Applied Statistics 1, 2007), whose variance holds about (S - 1)/S of the seeds' part.
    So each component is scaled by its own Student's t quantile: the one-sided reach at level α is
        r(α) = sqrt(Σ c_i M_i t_{df_i}(1 - α)²)
    (signed as t(1 - α) is), the exact t interval of the dominant component where one dominates and
    wider between. Simulated (20,000 tables each) at 5 and 3 seeds and 300 or 1,379 queries, from
    seeds to queries dominating, its 95% interval held δ 95.0% to 96.4% of the time, where a normal
    interval with the two-level bootstrap's variance held it 77.6% to 95.7% (the tests hold it at 94%
    or more). With S = 1 it is the paired t over the queries.

    Returns "difference", "ci95" (mean ± r((1 - level) / 2)), "p" (two-sided, H0: δ = 0: 2 α where
    r(α) = |mean|), "seeds", "queries", and given a margin "margin" and "p_equivalence" (two one-sided
    tests, Schuirmann 1987, of H0: |δ| >= margin: the α at which r(α) = margin - |mean|, so that it is
    below α exactly when the (1 - 2 α) interval lies inside ±margin). p's to 1e-11 (bisection over t
    quantiles of the incomplete beta): no Monte Carlo error.
    """
    d = _table(differences, "differences")
    mean, parts = crossed_parts(d)
    return {**crossed_inference(mean, parts, margin, level), "seeds": d.shape[0], "queries": d.shape[1]}


def crossed_inference(mean: float, parts: list, margin: float | None = None, level: float = 0.95) -> dict:
    """crossed_t's "difference", "ci95", "p" (and "margin", "p_equivalence") from a mean and the terms
    of its variance, [(c_i M_i, df_i), ...] (crossed_parts, or spearman_crossed's)."""
    result = {"difference": mean}
    if margin is not None and not margin > 0:
        raise ValueError(f"the equivalence margin must be positive, got {margin}")
    if sum(part for part, _ in parts) <= 0:  # every difference the same: nothing varies
        result |= {"ci95": [mean, mean], "p": 1.0 if mean == 0 else 0.0}
        if margin is not None:
            result |= {"margin": margin, "p_equivalence": 0.0 if abs(mean) < margin else 1.0}
        return result
    half = crossed_reach(parts, (1 - level) / 2)
    result |= {"ci95": [mean - half, mean + half], "p": min(1.0, 2 * crossed_level(parts, abs(mean)))}
    if margin is not None:
        result |= {"margin": margin, "p_equivalence": crossed_level(parts, margin - abs(mean))}
    return result


def crossed_level(parts: list, distance: float) -> float:
    """The α at which the one-sided reach r(α) equals `distance` (r falls as α rises), by bisection
    to 1e-11: half the two-sided p of a mean |mean| from 0, or the equivalence p at margin - |mean|."""
    low, high = 0.0, 1.0
    while high - low > 1e-11:
        middle = (low + high) / 2
        low, high = (middle, high) if crossed_reach(parts, middle) > distance else (low, middle)
    return (low + high) / 2


def crossed_parts(d: np.ndarray) -> tuple:
    """(mean, [(c_i M_i, df_i), ...]): the (S, Q) table's mean and the terms of its variance estimate
    V = Σ c_i M_i with each mean square's degrees of freedom (crossed_t)."""
    seeds, queries = d.shape
    if queries < 2:
        raise ValueError(f"the crossed t needs at least 2 queries, got {queries}")
    mean = float(d.mean())
    seed_means, query_means = d.mean(axis=1), d.mean(axis=0)
    query_square = seeds * float(np.sum((query_means - mean) ** 2)) / (queries - 1)
    if seeds == 1:
        return mean, [(query_square / queries, queries - 1)]
    seed_square = queries * float(np.sum((seed_means - mean) ** 2)) / (seeds - 1)
    residual = d - seed_means[:, None] - query_means[None, :] + mean
    error_square = float(np.sum(residual**2)) / ((seeds - 1) * (queries - 1))
    seed_part, query_part = seed_square > error_square, query_square > error_square  # else taken as 0
    cells = seeds * queries
    parts = [(seed_square / cells, seeds - 1)] if seed_part else []
    parts += [(query_square / cells, queries - 1)] if query_part else []
    parts.append(((1 - seed_part - query_part) * error_square / cells, (seeds - 1) * (queries - 1)))
    return mean, parts


def crossed_reach(parts: list, alpha: float) -> float:
    """r(α) = sqrt(Σ c_i M_i t_{df_i}(1 - α)²), signed as t(1 - α) is (crossed_t): how far the one-sided
    level-α test reaches from the mean."""
    quantiles = [t_quantile(1 - alpha, df) if alpha < 0.5 else -t_quantile(alpha, df) if alpha > 0.5 else 0.0
                 for _, df in parts]
    spread = sum(part * q * q for (part, _), q in zip(parts, quantiles))
    return math.copysign(math.sqrt(max(spread, 0.0)), 0.5 - alpha)


@functools.lru_cache(maxsize=4096)  # a pure function, asked again for the same levels and df
def t_quantile(probability: float, df: float) -> float:
    """The `probability` quantile of Student's t with df degrees of freedom, for a probability in
    [0.5, 1): the t >= 0 at which P(T >= t) = 1 - probability. Newton's steps on _upper_tail with the
    t density, kept inside a bracket that each step narrows (a step leaving it bisects instead), to
    1e-12 of t."""
    if not 0.5 <= probability < 1:
        raise ValueError(f"t_quantile takes a probability in [0.5, 1), got {probability}")
    tail = 1 - probability
    low, high = 0.0, 1.0
    while _upper_tail(high, df) > tail:
        low, high = high, 2 * high
    log_density_scale = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    t = (low + high) / 2
    for _ in range(200):
        excess = _upper_tail(t, df) - tail  # > 0: t lies below the quantile
        low, high = (t, high) if excess > 0 else (low, t)
        density = math.exp(log_density_scale - (df + 1) / 2 * math.log1p(t * t / df))
        step = excess / density
        if abs(step) <= 1e-12 * max(1.0, t):  # Newton's step is below t's last digits
            return t + step
        t = t + step if low < t + step < high else (low + high) / 2
        if high - low <= 1e-12 * max(1.0, t):
            return t
    return t


def spearman_crossed(x_a, x_b, gold, margin: float | None = None, resamples: int = 2_000, seed: int = 0) -> dict:
    """crossed_t for the mean over seeds of spearman(x_a[s], gold) - spearman(x_b[s], gold), (S, n) each.

    A correlation is not a mean of per-pair values, so the analysis of variance does not apply; its two
    terms are estimated apart: the seeds' part, the variance of the S seeds' differences over S (df
    S - 1), and the pairs' part, the variance of the mean difference over `resamples` bootstrap draws
    of the n pairs with the seeds held (df n - 1; pairs are shared by the seeds, as queries are). The
    seeds' part holds the interaction as well, which the pairs' part counts again: the variance is
    overstated by that, never understated. The pairs' part is drawn, so it carries a Monte Carlo
    error: "p_error" is half the spread of the p between that part taken one standard error
    (sqrt(2 / (B - 1)) of itself) lower and higher. Draws: numpy's default_rng(seed),
    rng.integers(0, n, size=n) per draw; a draw with a constant column is left out.
    """
    x_a, x_b = _table(x_a, "x_a"), _table(x_b, "x_b")
    gold = np.asarray(gold, dtype=np.float64)
    if x_a.shape != x_b.shape or gold.shape != x_a.shape[1:]:
        raise ValueError(f"x_a and x_b must be (seeds, pairs) of one shape and gold (pairs,), got {x_a.shape}, "
                         f"{x_b.shape} and {gold.shape}")
    _check_count("resamples", resamples)
    seeds, n = x_a.shape
    each = np.array([spearman(a, gold) - spearman(b, gold) for a, b in zip(x_a, x_b)])  # (S,)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(resamples):
        pairs = rng.integers(0, n, size=n)
        if np.ptp(gold[pairs]) == 0 or min(np.ptp(x[s][pairs]) for x in (x_a, x_b) for s in range(seeds)) == 0:
            continue
        draws.append(np.mean([spearman(a[pairs], gold[pairs]) - spearman(b[pairs], gold[pairs])
                              for a, b in zip(x_a, x_b)]))
    pair_part = float(np.var(draws, ddof=1))
    seed_parts = [(float(np.var(each, ddof=1)) / seeds, seeds - 1)] if seeds > 1 else []
    mean = float(each.mean())
    result = crossed_inference(mean, seed_parts + [(pair_part, n - 1)], margin)
    spread = math.sqrt(2 / (len(draws) - 1))
    low, high = (crossed_inference(mean, seed_parts + [(pair_part * (1 + side * spread), n - 1)])["p"]
                 for side in (-1, 1))
    return result | {"p_error": abs(high - low) / 2, "seeds": seeds, "queries": n, "resamples": len(draws)}


def _table(values, name: str) -> np.ndarray:
    """values as a finite (rows >= 1, columns >= 2) float64 array."""
    table = np.asarray(values, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] < 1 or table.shape[1] < 2:
        raise ValueError(f"{name} must be a (seeds, queries) table with at least 2 queries, got shape {table.shape}")
    if not np.isfinite(table).all():
        raise ValueError(f"{name} holds NaN or inf at {tuple(np.argwhere(~np.isfinite(table))[0])}")
    return table


def _paired(*sequences, names: tuple[str, ...] = ("a", "b")) -> list[np.ndarray]:
    """The sequences as float64 arrays, after checking that they are 1-D, of one length >= 2, finite."""
    arrays = [np.asarray(values, dtype=np.float64) for values in sequences]
    shapes = [values.shape for values in arrays]
    if any(len(shape) != 1 for shape in shapes) or len(set(shapes)) > 1:
        raise ValueError(f"{' and '.join(names)} must be 1-D of equal length, got shapes {shapes}")
    if len(arrays[0]) < 2:
        raise ValueError(f"need at least 2 paired values, got {len(arrays[0])}")
    for name, values in zip(names, arrays):
        if not np.isfinite(values).all():
            raise ValueError(f"{name} holds NaN or inf at index {np.flatnonzero(~np.isfinite(values))[0]}")
    return arrays


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:  # 1e4 is a float
        raise ValueError(f"{name} must be an integer of at least 1, got {value!r}")


def _check_p_values(p_values: Sequence[float]) -> np.ndarray:
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or not ((p >= 0) & (p <= 1)).all():
        raise ValueError(f"p-values must be a flat list of numbers in [0, 1], got {p_values}")
    return p
