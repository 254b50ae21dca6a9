"""What a study says of a difference: each comparison tested twice, then the words for it, which say
what the tests show and no more.

Two inferences, side by side:

per query      significance.compare on the per-query values averaged over the seeds (randomization
               p, bootstrap 95% interval, the equivalence test against the margin): the queries are
               the sample, the trained networks fixed. It is conditional on these seeds: it says
               whether these networks differ on queries like these, not whether training again
               would give the same difference.
over seeds     a paired t over the seeds' own differences (seed i of a against seed i of b, or
               against b's one score): the seeds are the sample, so training variance is in it. With
               3 seeds the t has 2 degrees of freedom, and only a large, consistent difference is
               detected.

A difference is detected when its Holm-adjusted p is below ALPHA; it may be called equivalent only
when the two one-sided tests against NDCG_MARGIN say so; otherwise it is not detectable, and the
sentence gives the interval that says how large it could be. Each equivalence comes with its bound:
the smallest margin at which the two one-sided tests would hold, so a reader can apply their own. A
verdict names the inference each word rests on, and says so where the two disagree.

Two models with the same value on every query in every seed are reported as identical and not
tested; two comparisons of one family with the same numbers (one network under two names) are
counted once by Holm. A p drawn from random sign vectors, and a bootstrap interval's end, carry a
Monte Carlo error; Holm multiplies a p's error by the factor it multiplies the p. Used by every study
in minisbert/experiments/; checked in tests/test_experiments.py and tests/test_study_writeups.py.
"""

import math

import numpy as np

from .. import significance

ALPHA = 0.05  # a difference whose p (Holm-adjusted within its family) is below this is called detected
# The equivalence margin on NDCG@10: a difference the equivalence test places within ±NDCG_MARGIN may be
# called equivalent; nothing else may be called unchanged. When it came into force is what each run's
# run.json records (margin_record), not what this comment says.
NDCG_MARGIN = 0.02
MARGIN_REASON = (
    "0.02 NDCG@10 is the smallest change taken here as one a user would act on: it is what six of SciFact's "
    "300 test queries add by moving from no relevant document in the top 10 to one at rank 1, and a choice "
    "between two models on a few hundred queries rests on hundredths of NDCG@10, not on thousandths")
TRIALS, RESAMPLES = 10_000, 10_000  # random sign vectors and bootstrap draws of a per-query comparison
SPEARMAN_RESAMPLES = 2_000  # significance.spearman_difference's bootstrap draws (each recomputes two Spearmans)
SHOWN_WITHIN = 3  # a Monte Carlo error is printed beside a p or an interval end this many errors from its threshold


def paired_test(a: dict, b: dict, metric: str, margin: float | None = None) -> dict:
    """significance.compare of model a's and model b's per-query values of `metric` (a - b), with
    the equivalence test and its bound at `margin` when one is given, and the Monte Carlo error of
    the interval's ends ("ci95_error")."""
    test = significance.compare(a["per_query"][metric], b["per_query"][metric], trials=TRIALS, resamples=RESAMPLES,
                                margin=margin)
    test["ci95_error"] = interval_error(test["ci95"], RESAMPLES)
    if margin is not None:
        test["bound"] = equivalence_bound([a["per_query"][metric][q] for q in a["per_query"][metric]],
                                          [b["per_query"][metric][q] for q in a["per_query"][metric]])
    return test


def claim(a: dict, b: dict, metric: str, margin: float | None = None) -> dict:
    """a - b on `metric`: {"identical": True} when every query's value is the same in a and b in
    every seed (nothing to test); else paired_test, with "seed_differences" (paired_seeds) and
    "seed_level" (seed_level of them) when a or b has more than one seed."""
    if identical(a, b, metric):
        return {"identical": True, "difference": 0.0}
    test = paired_test(a, b, metric, margin)
    if max(len(a.get("seeds", [])), len(b.get("seeds", []))) > 1:
        ours, theirs = paired_seeds(a, b, metric)
        test["seed_differences"] = [x - y for x, y in zip(ours, theirs)]
        test["seed_level"] = seed_level(ours, theirs, margin)
    return test


def paired_seeds(a: dict, b: dict, metric: str) -> tuple:
    """(a's score in each seed, b's): a's seeds where it has several (else its one score, once for
    each of b's seeds), and beside each b's own seed i where b has as many seeds, else b's score."""
    ours = [seed[metric] for seed in a.get("seeds", [])]
    if len(ours) < 2:
        ours = [a["scores"][metric]] * len(b.get("seeds", []))
    others = b.get("seeds", [])
    theirs = [seed[metric] for seed in others] if len(others) == len(ours) else [b["scores"][metric]] * len(ours)
    return ours, theirs


def identical(a: dict, b: dict, metric: str) -> bool:
    """Whether a and b give every query the same value of `metric`, in every seed (per_query of each
    run where a model keeps its runs, else its own per_query)."""
    def per_seed(model):
        runs = [run["per_query"] for run in model.get("runs", []) if "per_query" in run]
        return [run[metric] for run in runs] or [model["per_query"][metric]]
    first, second = per_seed(a), per_seed(b)
    return len(first) == len(second) and all(x == y for x, y in zip(first, second))


def seed_level(ours: list, theirs: list, margin: float | None = None) -> dict:
    """The paired t over the seeds' differences d_i = ours_i - theirs_i: their mean ("difference"),
    the 95% t interval ("ci95"), the two-sided p ("p"), and with a margin the two one-sided tests'
    p ("p_equivalence") and the equivalence bound ("bound"). The t interval is mean ± h, where h is
    what the two one-sided tests at level 0.025 add to |mean|: they hold at margin m exactly when
    |mean| + h < m."""
    mean = float(np.mean(np.subtract(ours, theirs)))
    half = equivalence_bound(ours, theirs, alpha=0.025) - abs(mean)
    result = {"seeds": len(ours), "difference": mean, "ci95": [mean - half, mean + half],
              "p": significance.paired_t_test(ours, theirs)}
    if margin is not None:
        result |= {"p_equivalence": significance.equivalence_test(ours, theirs, margin),
                   "bound": equivalence_bound(ours, theirs)}
    return result


def equivalence_bound(a, b, alpha: float = ALPHA) -> float:
    """The smallest margin at which the two one-sided tests of a - b (significance.equivalence_test)
    give p below alpha: |mean| + t(1 - alpha) standard errors, the far end of the (1 - 2 alpha)
    interval, found by bisection on the test itself so that it agrees with it to 1e-12."""
    d = np.subtract(a, b, dtype=np.float64)
    low, high = abs(float(d.mean())), abs(float(d.mean())) + float(d.std(ddof=1)) + 1e-12
    while significance.equivalence_test(a, b, high) >= alpha:
        high *= 2
    while high - low > 1e-12:
        middle = (low + high) / 2
        low, high = (low, middle) if significance.equivalence_test(a, b, middle) < alpha else (middle, high)
    return high


def interval_error(ci95: list, resamples: int) -> float:
    """The Monte Carlo standard error of a percentile bootstrap interval's end: sqrt(q (1 - q) / B) /
    f(x_q) for the 2.5% and 97.5% quantiles of B draws, with the density f of a normal whose 95%
    interval is ci95 (Efron and Tibshirani 1993, ch. 19): 0.6815 (high - low) / sqrt(B)."""
    sd = (ci95[1] - ci95[0]) / (2 * 1.959964)
    density = math.exp(-1.959964**2 / 2) / math.sqrt(2 * math.pi) / sd if sd > 0 else math.inf
    return math.sqrt(0.025 * 0.975 / resamples) / density


def family(tests: list) -> list:
    """The tests of one question, each p Holm-adjusted over them: the randomization p ("p_holm", with
    its Monte Carlo error "p_holm_error"), the equivalence p ("p_equivalence_holm"), and the seed
    level's ("p_holm", "p_equivalence_holm" inside "seed_level"). Identical models are not tested and
    not counted; a test with the same numbers as an earlier one (the same differences under two
    names) is counted once and marked "same_as" (that one's index in the list)."""
    counted = [i for i, t in enumerate(tests) if not t.get("identical") and t not in tests[:i]]
    adjusted = [dict(t) for t in tests]

    def adjust(read, write):
        present = [i for i in counted if read(tests[i]) is not None]
        for i, p in zip(present, significance.holm([read(tests[i]) for i in present]) if present else []):
            write(adjusted[i], p)

    adjust(lambda t: t["p_randomization"], lambda t, p: t.update(p_holm=p))
    adjust(lambda t: t.get("p_equivalence"), lambda t, p: t.update(p_equivalence_holm=p))
    adjust(lambda t: t.get("seed_level", {}).get("p"),
           lambda t, p: t.update(seed_level={**t["seed_level"], "p_holm": p}))
    adjust(lambda t: t.get("seed_level", {}).get("p_equivalence"),
           lambda t, p: t.update(seed_level={**t["seed_level"], "p_equivalence_holm": p}))
    for i in counted:
        t = adjusted[i]
        t["p_holm_error"] = (t["p_randomization_error"] * t["p_holm"] / t["p_randomization"]
                             if t["p_holm"] < 1 else 0.0)
    for i, t in enumerate(tests):
        if i not in counted and not t.get("identical"):
            adjusted[i] = {**adjusted[tests.index(t)], "same_as": tests.index(t)}
    return adjusted


# ---------------------------------------------------------------------------------------------
# Words


def p_text(p: float, error: float = 0.0, threshold: float = ALPHA) -> str:
    """"p = 0.034", "p < 0.001", or with its Monte Carlo error where the p lies within SHOWN_WITHIN
    errors of the threshold: "p = 0.048 ± 0.002"."""
    said = "p < 0.001" if p < 0.001 else f"p = {p:.3f}"
    return said + (f" ± {error:.3f}" if error and abs(p - threshold) < SHOWN_WITHIN * error else "")


def end_text(value: float, error: float) -> str:
    """An interval's end, "+0.0123", with its Monte Carlo error where the end lies within SHOWN_WITHIN
    errors of 0 (where a redraw could move it across): "-0.0001 ± 0.0004"."""
    return f"{value:+.4f}" + (f" ± {error:.4f}" if error and abs(value) < SHOWN_WITHIN * error else "")


def interval_text(test: dict) -> str:
    low, high = test["ci95"]
    error = test.get("ci95_error", 0.0)
    return f"[{end_text(low, error)}, {end_text(high, error)}]"


def seeds_text(test: dict) -> str:
    """"; seeds +0.0301 to +0.0412": the spread of the seeds' own differences, where there are several."""
    seeds = test.get("seed_differences", [])
    return f"; seeds {min(seeds):+.4f} to {max(seeds):+.4f}" if len(seeds) > 1 else ""


def _p(test: dict, p_key: str) -> tuple:
    """(p, its Monte Carlo error) of a per-query test, adjusted as p_key says."""
    return test[p_key], test.get(f"{p_key}_error", 0.0)


def tested(test: dict, label: str, p_key: str = "p_randomization") -> str:
    """"NDCG@10 +0.0310, 95% CI [+0.0120, +0.0500], p = 0.002": a difference, its interval, p and
    (several seeds) the seeds' spread."""
    return f"{label} {test['difference']:+.4f}, 95% CI {interval_text(test)}, {p_text(*_p(test, p_key))}" + seeds_text(test)


def outcome(test: dict, p_key: str, level: str = "per query") -> tuple:
    """("prefers", sign), ("equivalent", 0), ("not detectable", 0) or ("identical", 0): what the per-query test, or with
    level "over seeds" the seed-level one, says at ALPHA (Holm-adjusted where p_key is "p_holm")."""
    holm = p_key == "p_holm"
    if test.get("identical"):
        return "identical", 0
    if level == "over seeds":
        test = test["seed_level"]
        p, p_equivalence = test["p_holm" if holm else "p"], test.get("p_equivalence_holm" if holm else "p_equivalence")
    else:
        p, p_equivalence = test[p_key], test.get("p_equivalence_holm" if holm else "p_equivalence")
    if p < ALPHA:
        return "prefers", 1 if test["difference"] > 0 else -1
    if p_equivalence is not None and p_equivalence < ALPHA:
        return "equivalent", 0
    return "not detectable", 0


def equivalent(test: dict, p_key: str) -> bool:
    """Whether the per-query equivalence test (adjusted as p_key is) puts the difference within its margin."""
    return not test.get("identical") and outcome(test, p_key)[0] == "equivalent"


def said(result: tuple, first: str, second: str, margin) -> str:
    word, sign = result
    if word == "prefers":
        return f"prefers {first if sign > 0 else second}"
    return f"equivalent within ±{margin:g}" if word == "equivalent" else word


def verdict(test: dict, label: str, first: str, second: str, p_key: str = "p_randomization") -> str:
    """What the tests of (first - second) say: "prefers <first or second>", "equivalent within ±margin"
    or "not detectable; the 95% interval runs from a to b", with the difference, interval, p (and, where
    nothing is preferred, the equivalence p and bound) in parentheses. With several seeds that is said "per query, given these
    N seeds", then what the t over the seeds says, and where the two inferences disagree, that they do."""
    if test.get("identical"):
        return f"identical: {first} and {second} give every query an equal {label} in every seed (not tested)"
    per_query = outcome(test, p_key)
    words = said(per_query, first, second, test.get("margin"))
    bound = (f"; equivalence test {p_text(test['p_equivalence_holm' if p_key == 'p_holm' else 'p_equivalence'])}"
             + (f", bound ±{test['bound']:.4f}" if "bound" in test else "")
             if "p_equivalence" in test and per_query[0] != "prefers" else "")
    if per_query[0] == "not detectable":
        low, high = test["ci95"]
        error = test.get("ci95_error", 0.0)
        text = (f"not detectable; the 95% interval runs from {end_text(low, error)} to {end_text(high, error)} "
                f"({label}, {first} - {second}: {test['difference']:+.4f}, {p_text(*_p(test, p_key))}"
                f"{seeds_text(test)}{bound})")
    else:
        text = f"{words} ({tested(test, f'{label}, {first} - {second}:', p_key)}{bound})"
    if "seed_level" not in test:
        return text
    seeds = test["seed_level"]
    over_seeds = outcome(test, p_key, "over seeds")
    holm = p_key == "p_holm"
    seed_bound = (f"; equivalence test {p_text(seeds['p_equivalence_holm' if holm else 'p_equivalence'])}, bound "
                  f"±{seeds['bound']:.4f}") if "bound" in seeds and over_seeds[0] != "prefers" else ""
    return (f"per query, given these {seeds['seeds']} seeds, {text}; over the seeds, "
            f"{said(over_seeds, first, second, test.get('margin'))} (t over the {seeds['seeds']} seeds' differences: "
            f"{seeds['difference']:+.4f}, 95% CI [{seeds['ci95'][0]:+.4f}, {seeds['ci95'][1]:+.4f}], "
            f"{p_text(seeds['p_holm' if holm else 'p'])}{seed_bound})"
            + ("; the two inferences disagree" if over_seeds != per_query else ""))


def difference_cell(test: dict, p_key: str = "p_holm") -> str:
    """A table cell: "+0.0123 [+0.0031, +0.0215], p = 0.008" per query (and the seeds' spread), then
    the seed level: "; over seeds [-0.0100, +0.0300], p = 0.210"."""
    if test.get("identical"):
        return "identical, not tested"
    cell = f"{test['difference']:+.4f} {interval_text(test)}, {p_text(*_p(test, p_key))}" + seeds_text(test)
    if "seed_level" in test:
        seeds = test["seed_level"]
        cell += (f"; over seeds [{seeds['ci95'][0]:+.4f}, {seeds['ci95'][1]:+.4f}], "
                 f"{p_text(seeds['p_holm' if p_key == 'p_holm' else 'p'])}")
    return cell


def largest_error(tests: list) -> str:
    """Sentences on the Monte Carlo error of the tests' sampled numbers: the largest standard error of
    a randomization p, before and after Holm, and of a bootstrap interval's end."""
    tests = [t for t in tests if not t.get("identical")]
    raw = max((t.get("p_randomization_error", 0.0) for t in tests), default=0.0)
    adjusted = max((t.get("p_holm_error", 0.0) for t in tests), default=0.0)
    ends = max((t.get("ci95_error", 0.0) for t in tests), default=0.0)
    said = (f"The randomization p's come from {TRIALS:,} random sign vectors; their Monte Carlo standard error is "
            f"at most {raw:.4f} before adjustment and {adjusted:.4f} after, since Holm multiplies a p's error by the "
            "factor it multiplies the p" if raw else "The randomization p's are exact")
    if ends:
        said += (f". A bootstrap interval's end has a Monte Carlo standard error of at most {ends:.4f}; it is printed "
                 f"beside an end within {SHOWN_WITHIN} errors of 0, and beside a p within {SHOWN_WITHIN} errors of "
                 f"{ALPHA:g}")
    return said + ". The t-test p's (over seeds, equivalence) are exact."
