"""Tests for minisbert.evaluation.significance.

What "correct" means here: the exact sign-flip p equals scipy's exact permutation_test p; the
random versions land within Monte Carlo error of scipy's (100,000 resamples); the paired t-test p
equals scipy's ttest_rel to 1e-9 relative, down to p ~ 1e-46; bootstrap intervals agree with
scipy's percentile bootstrap; the equivalence test's p equals the larger of scipy's two one-sided
ttest_rel p's; a sampled p's stated Monte Carlo error is the spread its seeds show; the two-level
bootstrap draws what its docstring says (replayed without minisbert), with the enumerated mean and
variance of a table small enough to enumerate and the closed-form variance of a larger one, and its
interval ends' stated Monte Carlo error is the spread redrawing shows. Reference numbers:
tests/fixtures/make_significance.py and make_two_level.py. Holm,
Bonferroni, the t-test with 1 and 2 degrees of freedom and the edge cases are worked by hand.
"""

import json
import math

import numpy as np
import pytest

from minisbert.evaluation.significance import (bonferroni, bootstrap_ci, bootstrap_equivalence_p, bootstrap_p, compare,
                                               equivalence_test, holm, paired_t_test, quantile_error,
                                               randomization_error, randomization_test, spearman_difference, two_level,
                                               two_level_draws, two_level_spearman_draws)

from ..conftest import FIXTURES

FIXTURE = FIXTURES / "significance_reference.json"
CASES = json.loads(FIXTURE.read_text())["cases"]
EXACT = [case for case in CASES if case["permutation_resamples"] == "exact"]
RANDOM = [case for case in CASES if case["permutation_resamples"] != "exact"]


def names(cases):
    return [case["name"] for case in cases]


# ---- against scipy --------------------------------------------------------------------------


@pytest.mark.parametrize("case", EXACT, ids=names(EXACT))
def test_exact_randomization_p_equals_scipy(case):
    # 2**n <= trials: every sign vector is enumerated. The cases hold zero differences, tied
    # |differences| and differences of 1e-10, so ">=" and its float tolerance both matter: with
    # ">" the n = 8 case gives 0.1875, without the tolerance the n = 12 case gives 0.3125, not
    # 0.3359 (ties in twentieths that rounding breaks).
    assert 2 ** len(case["a"]) <= 10_000
    # A count over 2**n, exact in float64 here and in scipy: 1e-12 only lets the two sums of counts round apart.
    assert randomization_test(case["a"], case["b"]) == pytest.approx(case["p_permutation"], abs=1e-12)


@pytest.mark.parametrize("case", RANDOM, ids=names(RANDOM))
def test_random_randomization_p_within_monte_carlo_error(case):
    trials = 20_000
    p = randomization_test(case["a"], case["b"], trials=trials, seed=1)
    reference = case["p_permutation"]
    # 4 standard errors of ours (scipy's 100,000 draws add a little), plus a floor for p near 0
    assert abs(p - reference) <= 4 * math.sqrt(reference * (1 - reference) / trials) + 1e-3
    assert randomization_test(case["a"], case["b"], trials=trials, seed=1) == p  # same seed, same p


@pytest.mark.parametrize("case", CASES, ids=names(CASES))
def test_paired_t_test_equals_scipy(case):
    # The t tail is a continued fraction stopped at 1e-15 times exp of a sum up to 105 in size (p ~ 1e-46),
    # so about 1e-14 relative, as scipy's is (measured 6e-14): 1e-9 holds on any CPU, and a t-test with
    # another df or a one-sided p misses by 1e-2 and more.
    assert paired_t_test(case["a"], case["b"]) == pytest.approx(case["p_t_test"], rel=1e-9)


def test_strong_shift_t_test_p_is_tiny_and_still_exact():
    case = next(case for case in CASES if case["name"] == "normal_n50_strong_shift")
    assert case["p_t_test"] < 1e-40
    assert paired_t_test(case["a"], case["b"]) == pytest.approx(case["p_t_test"], rel=1e-9)  # as above


@pytest.mark.parametrize("case", CASES, ids=names(CASES))
def test_bootstrap_interval_agrees_with_scipy(case):
    low, high = bootstrap_ci(case["a"], case["b"])
    width = case["bootstrap_high"] - case["bootstrap_low"]
    # 10,000 resamples against scipy's 100,000: each bound within a tenth of the interval's width
    assert abs(low - case["bootstrap_low"]) <= 0.1 * width
    assert abs(high - case["bootstrap_high"]) <= 0.1 * width
    assert low <= np.mean(np.subtract(case["a"], case["b"])) <= high


@pytest.mark.parametrize("case", CASES, ids=names(CASES))
def test_equivalence_p_equals_scipys_two_one_sided_tests(case):
    p = equivalence_test(case["a"], case["b"], case["equivalence_margin"])
    assert p == pytest.approx(case["p_equivalence"], rel=1e-9)  # the t-test's accuracy, as above


# ---- by hand --------------------------------------------------------------------------------


def test_sign_flip_p_exact_by_hand():
    # d = [1, 2, 3]: of the 8 sign vectors, |sum| >= 6 only for +++ and ---: p = 2/8.
    assert randomization_test([1, 2, 3], [0, 0, 0]) == 0.25
    # d = [1, 1, 0]: the zero's sign changes nothing; |sum| >= 2 for ++0 and --0 (each twice): 4/8.
    assert randomization_test([1, 1, 0], [0, 0, 0]) == 0.5


def test_sign_flip_separates_a_shift_from_noise():
    rng = np.random.default_rng(7)
    b = rng.uniform(0, 1, size=200)
    shifted = b + rng.normal(0.05, 0.1, size=200)
    assert randomization_test(shifted, b) < 0.01
    # differences ±0.05, ±0.1, ... in equal measure: mean 0, the observed sum is as small as any
    symmetric = b + np.tile([0.05, -0.05, 0.1, -0.1], 50)
    assert randomization_test(symmetric, b) > 0.9


def test_randomization_p_counts_the_observed_assignment():
    # 2**40 > trials: random signs, p = (1 + count) / (1 + trials), never 0
    a = np.arange(40) + 1.0
    p = randomization_test(a, np.zeros(40), trials=999, seed=3)
    assert p == 1 / 1000  # every difference positive: no random sign vector reaches the sum
    assert p * 1000 == round(p * 1000)


def test_randomization_on_5000_queries_is_reproducible_and_seeded():
    rng = np.random.default_rng(0)
    a, b = rng.uniform(size=5000), rng.uniform(size=5000)
    p = randomization_test(a, b, seed=11)  # 10,000 trials in blocks: memory stays ~ block x 5,000
    assert p == randomization_test(a, b, seed=11)
    assert p != randomization_test(a, b, seed=12)


def test_t_test_with_one_and_two_degrees_of_freedom():
    # n = 2, d = [1, 3]: mean 2, sd sqrt(2), t = 2 / (sqrt(2) / sqrt(2)) = 2.
    # With 1 df Student's t is Cauchy: P(|T| >= t) = 1 - (2 / pi) atan(t). The continued fraction against
    # a closed form of a few float64 operations: about 1e-15 relative apart (measured 2e-16).
    assert paired_t_test([1, 3], [0, 0]) == pytest.approx(1 - 2 / math.pi * math.atan(2), rel=1e-12)
    # n = 3, d = [1, 2, 3]: mean 2, sd 1, t = 2 * sqrt(3). With 2 df: P(|T| >= t) = 1 - t / sqrt(2 + t²).
    t = 2 * math.sqrt(3)
    assert paired_t_test([1, 2, 3], [0, 0, 0]) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-12)


def test_t_test_edge_cases():
    assert paired_t_test([0.5, 0.7, 0.2], [0.5, 0.7, 0.2]) == 1.0  # all differences 0
    assert paired_t_test([1.5, 2.5, 3.5], [1.0, 2.0, 3.0]) == 0.0  # all differences 0.5: sd 0
    with pytest.raises(ValueError, match="at least 2"):
        paired_t_test([1.0], [0.0])


def test_equivalence_p_is_alpha_where_the_90_percent_interval_touches_the_margin():
    # d = [1, 2, 3]: mean 2, se = 1 / sqrt(3), 2 df. With 2 df, P(T >= t) = (1 - t / sqrt(2 + t²)) / 2,
    # which is 0.05 at t = sqrt(1.62 / 0.19). At margin 2 + t se the upper test has p = 0.05 and the
    # lower one (t = (2 + margin) / se) far less, so the TOST p is 0.05: the 90% interval's top end
    # lies exactly on the margin.
    margin = 2 + math.sqrt(1.62 / 0.19) / math.sqrt(3)  # closed forms, as in the t-test by hand above
    assert equivalence_test([1, 2, 3], [0, 0, 0], margin) == pytest.approx(0.05, rel=1e-12)
    assert equivalence_test([0, 0, 0], [1, 2, 3], margin) == pytest.approx(0.05, rel=1e-12)  # symmetric
    assert equivalence_test([1, 2, 3], [0, 0, 0], 2 * margin) < 0.05 < equivalence_test([1, 2, 3], [0, 0, 0], 3)


def test_equivalence_p_of_a_mean_outside_the_margin_is_its_far_tail():
    # d = [1, 2, 3] (mean 2, se 1 / sqrt(3), 2 df) and margin 1: t_high = (1 - 2) / se = -sqrt(3) < 0, and
    # p = P(T >= -sqrt(3)) = (1 + sqrt(3) / sqrt(2 + 3)) / 2 = 0.887 (2 df, as above, for t of either sign).
    expected = (1 + math.sqrt(3) / math.sqrt(5)) / 2
    assert equivalence_test([1, 2, 3], [0, 0, 0], 1) == pytest.approx(expected, rel=1e-12)
    assert equivalence_test([0, 0, 0], [1, 2, 3], 1) == pytest.approx(expected, rel=1e-12)  # symmetric


def test_equivalence_edge_cases():
    assert equivalence_test([1.5, 2.5], [1.0, 2.0], 0.6) == 0.0  # every difference 0.5, inside ±0.6
    assert equivalence_test([1.5, 2.5], [1.0, 2.0], 0.5) == 1.0  # on the margin is not inside it
    with pytest.raises(ValueError, match="margin must be positive, got 0"):
        equivalence_test([1, 2], [0, 0], 0)


def test_randomization_error_is_zero_when_exact_and_the_seeds_spread_when_sampled():
    assert randomization_error(0.3125, n=8) == 0.0  # 2**8 sign vectors enumerated: p is exact
    # the same float64 expression: pytest.approx's default (relative 1e-6) only allows it to round apart
    assert randomization_error(0.25, n=300, trials=10_000) == pytest.approx(math.sqrt(0.25 * 0.75 / 10_000))
    rng = np.random.default_rng(8)
    b = rng.uniform(size=300)
    a = b + rng.normal(0.01, 0.1, size=300)  # a p near 0.1
    ps = [randomization_test(a, b, trials=2_000, seed=seed) for seed in range(40)]
    stated = randomization_error(float(np.mean(ps)), n=300, trials=2_000)
    # 40 seeds estimate the spread to about 11% (1 / sqrt(2 * 39)): 0.6 and 1.5 lie 4 such errors out
    assert 0.6 * stated < np.std(ps, ddof=1) < 1.5 * stated


def test_identical_models_give_p_1():
    a = np.random.default_rng(5).uniform(size=30)
    assert randomization_test(a, a) == 1.0
    assert paired_t_test(a, a) == 1.0
    assert bootstrap_ci(a, a) == (0.0, 0.0)


def test_holm_by_hand():
    # sorted: 0.01, 0.03, 0.04, 0.2, times 4, 3, 2, 1: 0.04, 0.09, 0.08, 0.2; the running maximum
    # lifts 0.08 to 0.09. Returned in the input order. Products of float64 values: an ulp from the decimal
    # literals, which pytest.approx's default (relative 1e-6) allows.
    assert holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert holm([0.5, 0.6]) == [1.0, 1.0]  # 2 * 0.5 and 1 * 0.6, raised to 1.0, capped at 1
    assert holm([]) == []


def test_bonferroni_by_hand():  # approx: the products round, as in Holm's
    assert bonferroni([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.16, 0.12, 0.8])
    assert bonferroni([0.3, 0.001]) == pytest.approx([0.6, 0.002])
    assert bonferroni([0.7, 0.9]) == [1.0, 1.0]  # capped at 1


# ---- compare and spearman_difference --------------------------------------------------------


def test_compare_pairs_queries_by_id_and_returns_plain_floats():
    rng = np.random.default_rng(2)
    query_ids = [f"q{i}" for i in range(40)]
    values_a, values_b = rng.uniform(size=40), rng.uniform(size=40)
    a = dict(zip(query_ids, values_a.tolist()))
    b = dict(reversed(list(zip(query_ids, values_b.tolist()))))  # same ids, another order
    result = compare(a, b, seed=9, margin=0.1)
    p = randomization_test(values_a, values_b, seed=9)
    assert result == {
        "difference": pytest.approx(np.mean(values_a - values_b)),  # float64 means of 40 in two orders: ulps
        "ci95": list(bootstrap_ci(values_a, values_b, seed=9)),
        "p_randomization": p,
        "p_randomization_error": randomization_error(p, 40),
        "p_t_test": paired_t_test(values_a, values_b),
        "margin": 0.1,
        "p_equivalence": equivalence_test(values_a, values_b, 0.1),
    }
    assert all(type(value) is float for value in [result["difference"], *result["ci95"], result["p_randomization"],
                                                  result["p_randomization_error"], result["p_t_test"],
                                                  result["p_equivalence"]])
    assert "p_equivalence" not in compare(a, b, seed=9)  # no margin, no equivalence test
    # Without a seed or counts, compare's numbers are those of the tests it names, each with its defaults
    # (seed 0, 10,000 trials and resamples): one call and the separate calls a reader makes agree.
    plain = compare(a, b)
    assert plain["p_randomization"] == randomization_test(values_a, values_b)
    assert plain["ci95"] == list(bootstrap_ci(values_a, values_b))


def test_compare_refuses_different_query_sets():
    a = {"q1": 0.5, "q2": 0.7, "q3": 0.1}
    b = {"q1": 0.4, "q2": 0.6, "q9": 0.3}
    with pytest.raises(ValueError, match=r"1 ids only in a \['q3'\], 1 only in b \['q9'\]"):
        compare(a, b)


def test_inputs_are_checked():
    with pytest.raises(ValueError, match=r"a and b must be 1-D of equal length, got shapes \[\(3,\), \(2,\)\]"):
        randomization_test([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="b holds NaN or inf at index 1"):
        bootstrap_ci([1, 2, 3], [1, float("nan"), 3])
    for level in (95, 1, 0, -0.5):  # an interval of level 1 or 0 has no percentile bounds to report
        with pytest.raises(ValueError, match=f"level must lie strictly between 0 and 1, got {level}"):
            bootstrap_ci([1, 2, 3], [0, 0, 0], level=level)
    with pytest.raises(ValueError, match="x_a and x_b and gold must be 1-D"):
        spearman_difference([1, 2, 3], [1, 2, 3], [1, 2])


def test_spearman_difference_of_identical_models_is_zero_with_p_1():
    rng = np.random.default_rng(4)
    gold = rng.uniform(0, 5, size=50)
    scores = gold + rng.normal(0, 1, size=50)
    result = spearman_difference(scores, scores, gold, trials=2_000, resamples=500)
    assert result["difference"] == 0.0
    assert result["p_randomization"] == 1.0  # swapping equal ranks changes nothing
    assert result["ci95"] == [0.0, 0.0]
    assert result["p_t_test"] is None  # a correlation is not a mean of per-pair values


def test_spearman_difference_finds_a_real_gap():
    rng = np.random.default_rng(6)
    gold = rng.uniform(0, 5, size=200)
    noisy = gold + rng.normal(0, 2, size=200)
    result = spearman_difference(gold, noisy, gold, trials=2_000, resamples=500)
    assert result["difference"] > 0.2  # 1 - spearman(noisy, gold)
    assert result["p_randomization"] < 0.01
    assert 0 < result["ci95"][0] < result["difference"] < result["ci95"][1]


def test_spearman_difference_survives_two_pairs():
    # Spearmans 1 and -1. Half the resamples draw one pair twice (no correlation: left out), the
    # rest draw both pairs: the interval is [2, 2]. Swapping one pair's ranks leaves both columns
    # constant (correlation 0, diff* 0); swapping none or both gives |diff*| = 2: p about 1/2.
    result = spearman_difference([1, 2], [2, 1], [1, 2], trials=1_000, resamples=200)
    # correlations of two pairs are ±1 up to an ulp of their square roots: pytest.approx's default allows that
    assert result["difference"] == pytest.approx(2.0)
    assert result["ci95"] == pytest.approx([2.0, 2.0])
    assert 0.4 < result["p_randomization"] < 0.6


def test_spearman_difference_draws_what_its_docstring_says_by_default():
    # 10,000 rank swaps and 2,000 resamples (a Spearman is costlier than a mean), from seed 0: the numbers
    # evaluate.py --significance reports for STS
    rng = np.random.default_rng(7)
    gold = rng.uniform(0, 5, size=12)
    x_a, x_b = gold + rng.normal(0, 1, size=12), gold + rng.normal(0, 2, size=12)
    assert spearman_difference(x_a, x_b, gold) == spearman_difference(x_a, x_b, gold, trials=10_000,
                                                                      resamples=2_000, seed=0)


def test_spearman_difference_interval_is_the_percentiles_of_the_resampled_differences():
    # The docstring's procedure written out again: n pairs drawn with replacement from default_rng(seed), a
    # draw with a constant column left out, both Spearmans (average ranks of ties, here by counting) on
    # each draw, then the 2.5% and 97.5% points (numpy.quantile's linear interpolation).
    def spearman_by_counting(x, y):
        def ranks(v):
            return (v[:, None] > v).sum(1) + ((v[:, None] == v).sum(1) + 1) / 2
        return np.corrcoef(ranks(x), ranks(y))[0, 1]

    rng = np.random.default_rng(8)
    gold = rng.uniform(0, 5, size=30)
    x_a, x_b = gold + rng.normal(0, 1, size=30), gold + rng.normal(0, 2, size=30)
    draws = np.random.default_rng(3)
    differences = []
    for _ in range(300):
        pairs = draws.integers(0, 30, size=30)
        if min(np.ptp(x_a[pairs]), np.ptp(x_b[pairs]), np.ptp(gold[pairs])) > 0:
            differences.append(spearman_by_counting(x_a[pairs], gold[pairs]) -
                               spearman_by_counting(x_b[pairs], gold[pairs]))
    result = spearman_difference(x_a, x_b, gold, trials=10, resamples=300, seed=3)
    # float64 correlations of 30 ranks of order 30, summed in other orders: a few ulps of 1
    assert result["ci95"] == pytest.approx(np.quantile(differences, [0.025, 0.975]).tolist(), abs=1e-12)


# ---- the two-level bootstrap (seeds, then queries) -------------------------------------------
# Reference numbers: tests/fixtures/make_two_level.py (numpy, fractions and scipy; no minisbert).

TWO_LEVEL = json.loads((FIXTURES / "two_level_reference.json").read_text())


def test_two_level_draws_are_the_ones_its_docstring_describes():
    # Replayed by the fixture script from the docstring's words (seeded generator, block order), so the
    # quantiles and p's agree to rounding: a draw is a mean of 1,500 values of size ~0.2, whose
    # float64 sums in another order differ by ~1e-16 each; 1e-12 is far above that and far below any
    # draw-to-draw gap that a changed draw order would leave.
    for name in ("crossed", "one_seed"):
        case = TWO_LEVEL[name]
        draws = two_level_draws(case["table"], case["resamples"], seed=case["seed"])
        assert np.quantile(draws, [0.025, 0.975]) == pytest.approx(case["quantiles"], abs=1e-12)
        assert bootstrap_p(draws) == case["p"]
        if "p_equivalence" in case:
            assert bootstrap_equivalence_p(draws, case["margin"]) == case["p_equivalence"]


def test_two_level_states_the_monte_carlo_errors_the_reference_computes():
    # The same draws as above (their equality to the reference is that test's), so each error is the
    # same few subtractions and one square root of the same numbers: 1e-12 covers only the rounding of
    # ranks' values already equal to 1e-12.
    for name in ("crossed", "one_seed"):
        case = TWO_LEVEL[name]
        draws = two_level_draws(case["table"], case["resamples"], seed=case["seed"])
        result = two_level(draws, 0.0, case.get("margin"))
        assert result["ci95_error"] == pytest.approx(case["ci_error"], abs=1e-12), name
        assert result["p_error"] == pytest.approx(case["p_error"], rel=1e-12), name
        if "margin" in case:
            assert result["p_equivalence_error"] == pytest.approx(case["p_equivalence_error"], rel=1e-12), name


def test_two_level_draws_have_the_enumerated_mean_and_variance():
    # The exact bootstrap distribution of a 2 x 3 table (all 108 draws, summed in fractions). With B
    # draws the sample mean has standard error sqrt(Var / B) and the sample variance a relative one of
    # sqrt((kurtosis - 1) / B) <= sqrt(2 / B) here (a mean of six cells is close to normal, kurtosis
    # below 3): 5 standard errors each, so a correct sampler fails about once in 10^6 runs.
    case, resamples = TWO_LEVEL["exact"], 200_000
    draws = two_level_draws(case["table"], resamples, seed=11)
    assert abs(draws.mean() - case["mean"]) < 5 * math.sqrt(case["variance"] / resamples)
    assert abs(draws.var() / case["variance"] - 1) < 5 * math.sqrt(2 / resamples)


def test_two_level_variance_is_the_closed_form_that_carries_both_sources():
    # Var* = (V + (Q - 1) V_row + (S - 1) V_col) / (S Q), computed by the fixture script; the draws'
    # variance lies within 5 relative standard errors sqrt((kurtosis - 1) / B) of it (kurtosis from
    # the script's own draws).
    case = TWO_LEVEL["crossed"]
    draws = two_level_draws(case["table"], case["resamples"], seed=case["seed"])
    assert abs(draws.var() / case["variance"] - 1) < 5 * math.sqrt((case["kurtosis"] - 1) / case["resamples"])
    # Drawing the queries once per draw (not once per seed) keeps the query part whole: the per-query
    # bootstrap of the seeds' average, which holds the seeds fixed, is narrower, and so is the spread
    # of the seed means alone, which holds the queries fixed.
    table = np.asarray(case["table"])
    per_query = bootstrap_ci(table.mean(axis=0), np.zeros(table.shape[1]), 0.95, 10_000, seed=0)
    assert per_query[1] - per_query[0] < np.subtract(*np.quantile(draws, [0.975, 0.025]))


def test_two_level_spearman_draws_replay_scipy():
    # The fixture's draws recompute scipy.stats.spearmanr (average ranks for ties) on the documented draws;
    # a Spearman of 40 ranks is exact to ~1e-15, so 1e-12 leaves room for summation order only.
    case = TWO_LEVEL["spearman"]
    draws = two_level_spearman_draws(case["x_a"], case["x_b"], case["gold"], case["resamples"], seed=case["seed"])
    assert draws == pytest.approx(case["draws"], abs=1e-12)


def test_bootstrap_p_and_equivalence_p_by_hand():
    draws = np.array([-0.03, -0.01, 0.0, 0.01, 0.02, 0.025, 0.04, 0.05])
    assert bootstrap_p(draws) == 2 * 3 / 8  # three draws at or below 0, six at or above
    assert bootstrap_equivalence_p(draws, 0.02) == 4 / 8  # 0.02, 0.025, 0.04, 0.05 at or beyond +0.02
    assert bootstrap_equivalence_p(draws, 0.05) == 1 / 8
    assert bootstrap_p(np.full(4, 0.1)) == 0.0 and bootstrap_p(np.zeros(4)) == 1.0
    with pytest.raises(ValueError, match="margin must be positive"):
        bootstrap_equivalence_p(draws, 0)


def test_quantile_error_is_the_spread_that_redrawing_shows():
    # 40 independent runs of B = 2,000 draws: the standard deviation of their 2.5 % quantile against
    # the mean stated error. The spread of 40 runs is itself uncertain by about 1 / sqrt(2 * 39) = 11 %
    # and each stated error by the order statistics it reads; a ratio outside [0.6, 1.6] would be a
    # wrong argument (a factor of 2 or sqrt(B)), not noise.
    table = np.random.default_rng(4).normal(0.01, 0.1, size=(5, 60))
    runs = [two_level_draws(table, 2_000, seed=seed) for seed in range(40)]
    spread = np.std([np.quantile(draws, 0.025) for draws in runs], ddof=1)
    stated = np.mean([quantile_error(draws, 0.025) for draws in runs])
    assert 0.6 < stated / spread < 1.6


def test_two_level_refuses_bad_tables():
    with pytest.raises(ValueError, match=r"\(seeds, queries\) table"):
        two_level_draws([1.0, 2.0])
    with pytest.raises(ValueError, match="NaN or inf"):
        two_level_draws([[0.1, float("nan")]])
    result = two_level(np.array([0.01, 0.02, 0.03, -0.01]), 0.0125, margin=0.02)
    assert set(result) >= {"difference", "ci95", "ci95_error", "p", "p_error", "p_equivalence", "margin"}
