"""What a study says of a difference: one inference per comparison, then the words for it, which say
what the test shows and no more.

The inference: significance.crossed_t on the seeds x queries table of differences (seed i against
seed i, the same queries in every seed), a t inference for a crossed model whose variance has a
seeds' part, a queries' part and their interaction, each taken at its own degrees of freedom, so
that with five seeds its interval still covers (simulated: 95.0% to 96.4% for a nominal 95%; the
two-level bootstrap it replaces holds about 4/5 of the seeds' part, and a normal interval of its
variance covered 86% where the seeds dominate). For a Spearman difference, significance.spearman_crossed. From it come the 95% interval,
the p of "no difference" and the p of "a difference of at least NDCG_MARGIN" (two one-sided tests),
each p Holm-adjusted within its family; the interval is not adjusted, and says so where it is printed.
A difference is detected when its adjusted p is below ALPHA; it may be called equivalent only when the
adjusted equivalence p is below ALPHA; otherwise it is not detectable, and the sentence gives the
interval that says how large it could be. Each equivalence test comes with its bound: the smallest
margin at which the same adjusted test would hold (the family's other p's as they are), so the
verdict reads "equivalent" exactly when the bound lies below the margin.

Two figures stand beside it, labelled "conditional: decides nothing": the per-query test
(significance.compare on the per-query values averaged over the seeds: the networks held fixed) and a
t over the seeds' own differences (the queries held fixed). Each leaves out one source of variance,
so neither decides a verdict.

Two models with the same value on every query in every seed are reported as identical and not
tested; two comparisons of one family with the same numbers (one network under two names) are
counted once by Holm. The crossed t is exact arithmetic; a p or interval end drawn at random (the
Spearman pairs' part, the conditional figures) carries a Monte Carlo error, which Holm multiplies by
the factor it multiplies the p. Used by every study in minisbert/experiments/; checked in
tests/experiments/test_experiments.py and tests/experiments/test_study_writeups.py.
"""

import math

import numpy as np

from ..evaluation import significance

ALPHA = 0.05  # a difference whose p (Holm-adjusted within its family) is below this is called detected
# The equivalence margin on NDCG@10: a difference the equivalence test places within ±NDCG_MARGIN may be
# called equivalent; nothing else may be called unchanged. When it came into force is what each run's
# run.json records (margin_record), not what this comment says.
NDCG_MARGIN = 0.02
MARGIN_REASON = (
    "0.02 NDCG@10 is the smallest change taken here as one a user would act on: it is what six of SciFact's "
    "300 test queries add by moving from no relevant document in the top 10 to one at rank 1, and a choice "
    "between two models on a few hundred queries rests on hundredths of NDCG@10, not on thousandths")
TRIALS, RESAMPLES = 10_000, 10_000  # random sign vectors and bootstrap draws of a comparison
SPEARMAN_RESAMPLES = 2_000  # bootstrap draws of a Spearman difference (each recomputes two Spearmans per seed)
SHOWN_WITHIN = 3  # a Monte Carlo error is printed beside a p or an interval end this many errors from its threshold
CONDITIONAL = "conditional: decides nothing"  # the label of every figure that leaves out seeds or queries


def paired_test(a: dict, b: dict, metric: str, margin: float | None = None) -> dict:
    """significance.compare of model a's and model b's per-query values of `metric` (a - b), with
    the equivalence test at `margin` when one is given, and the Monte Carlo error of the interval's
    ends ("ci95_error"): the per-query figures, conditional on the seeds."""
    test = significance.compare(a["per_query"][metric], b["per_query"][metric], trials=TRIALS, resamples=RESAMPLES,
                                margin=margin)
    test["ci95_error"] = interval_error(test["ci95"], RESAMPLES)
    return test


def claim(a: dict, b: dict, metric: str, margin: float | None = None) -> dict:
    """a - b on `metric`: {"identical": True} when every query's value is the same in a and b in
    every seed (nothing to test); else the inference, "two_level" (two_level_test, with its draws under
    "draws" until family() has used them), beside the conditional figures: paired_test's, and with
    "seed_differences" and "seed_level" (paired_seeds, seed_level) when a or b has more than one seed."""
    if identical(a, b, metric):
        return {"identical": True, "difference": 0.0}
    test = paired_test(a, b, metric, margin)
    test["two_level"] = two_level_test(a, b, metric, margin)
    if max(len(a.get("seeds", [])), len(b.get("seeds", []))) > 1:
        ours, theirs = paired_seeds(a, b, metric)
        test["seed_differences"] = [x - y for x, y in zip(ours, theirs)]
        test["seed_level"] = seed_level(ours, theirs, margin)
    return test


def difference_of(model: dict, first: str, second: str) -> dict:
    """The model with one metric, f"{first} - {second}": each query's value of `first` less its value of
    `second`, in every run and seed (the means too), so that `claim` tests whether the gap between two
    models differs between the two metrics: a difference of differences, one inference."""
    name = f"{first} - {second}"

    def gap(per_query: dict) -> dict:
        return {query: value - per_query[second][query] for query, value in per_query[first].items()}

    runs = [{"per_query": {name: gap(run["per_query"])}} for run in model.get("runs", []) if "per_query" in run]
    return {"per_query": {name: gap(model["per_query"])},
            "scores": {name: model["scores"][first] - model["scores"][second]},
            "seeds": [{name: seed[first] - seed[second]} for seed in model.get("seeds", [])], "runs": runs}


def per_seed(model: dict, metric: str) -> list:
    """The model's {query id: value} of `metric` in each seed: each run's, where the runs keep them, else
    its own per_query (one network, or a model trained with one seed)."""
    runs = [run["per_query"][metric] for run in model.get("runs", []) if "per_query" in run]
    return runs or [model["per_query"][metric]]


def seed_table(a: list, b: list) -> np.ndarray:
    """(seeds, queries) differences of two models' per-seed {query id: value} lists: seed i of a against
    seed i of b (the same seed, so its data order is shared), or against b's one network (or a's one
    against each of b's seeds); the queries in a's order."""
    if len(a) != len(b) and 1 not in (len(a), len(b)):
        raise ValueError(f"cannot pair {len(a)} seeds with {len(b)}: give both models the same seeds")
    queries = list(a[0])
    for run in a + b:
        if set(run) != set(queries):
            raise ValueError(f"the two models were evaluated on different queries ({len(run)} against {len(queries)})")
    rows = max(len(a), len(b))
    ours = [a[i if len(a) > 1 else 0] for i in range(rows)]
    theirs = [b[i if len(b) > 1 else 0] for i in range(rows)]
    return np.array([[x[q] - y[q] for q in queries] for x, y in zip(ours, theirs)])  # (S, Q)


def two_level_test(a: dict, b: dict, metric: str, margin: float | None = None) -> dict:
    """The one inference of a - b over seeds and queries: significance.crossed_t of the seeds x queries
    table (seed_table), exact ("p_error" and "ci95_error" 0), with "equivalence_p", the equivalence p
    at any margin (kept for family's bound, and removed there)."""
    d = seed_table(per_seed(a, metric), per_seed(b, metric))
    mean, parts = significance.crossed_parts(d)  # crossed_t's own two steps, its terms kept for the bound
    result = {**significance.crossed_inference(mean, parts, margin), "seeds": d.shape[0], "queries": d.shape[1],
              "p_error": 0.0, "ci95_error": 0.0}
    if margin is not None:
        result["p_equivalence_error"] = 0.0
    return result | {"equivalence_p": lambda m: significance.crossed_inference(mean, parts, m)["p_equivalence"]}


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
    first, second = per_seed(a, metric), per_seed(b, metric)
    return len(first) == len(second) and all(x == y for x, y in zip(first, second))


def seed_level(ours: list, theirs: list, margin: float | None = None) -> dict:
    """The paired t over the seeds' differences d_i = ours_i - theirs_i: their mean ("difference"),
    the 95% t interval ("ci95"), the two-sided p ("p"), and with a margin the two one-sided tests'
    p ("p_equivalence"). The t interval is mean ± h, where h is what the two one-sided tests at level
    0.025 add to |mean|: they hold at margin m exactly when |mean| + h < m."""
    mean = float(np.mean(np.subtract(ours, theirs)))
    half = t_bound(ours, theirs, alpha=0.025) - abs(mean)
    result = {"seeds": len(ours), "difference": mean, "ci95": [mean - half, mean + half],
              "p": significance.paired_t_test(ours, theirs)}
    if margin is not None:
        result["p_equivalence"] = significance.equivalence_test(ours, theirs, margin)
    return result


def t_bound(a, b, alpha: float = ALPHA) -> float:
    """The smallest margin at which the two one-sided t-tests of a - b (significance.equivalence_test)
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


def adjusted_bound(equivalence_p, difference: float, others: list) -> float:
    """The smallest margin at which the Holm-adjusted equivalence test holds, the family's other
    equivalence p's (`others`) as they are: equivalence_p(m), the test's p at margin m, falls as m
    grows, so the adjusted test holds above one margin and at none below it; found by bisection to
    1e-10, from |difference| (where it cannot hold) up."""
    def holds(margin):
        return significance.holm([equivalence_p(margin)] + others)[0] < ALPHA
    low = abs(difference)
    high = low + max(low, 1e-3)
    while not holds(high):
        low, high = high, 2 * high
    while high - low > 1e-10:
        middle = (low + high) / 2
        low, high = (low, middle) if holds(middle) else (middle, high)
    return high


def family(tests: list) -> list:
    """The tests of one question, each p Holm-adjusted over them: the inference's ("p_holm" and
    "p_equivalence_holm" inside "two_level", with their Monte Carlo errors, and "bound", adjusted_bound),
    and the conditional figures' (the randomization p "p_holm" with "p_holm_error", the per-query
    equivalence p "p_equivalence_holm", and the seed level's "p_holm" and "p_equivalence_holm").
    Identical models are not tested and not counted; a test with the same numbers as an earlier one
    (the same differences under two names) is counted once and marked "same_as" (that one's index)."""
    def key(t):  # a test's numbers, without its equivalence function (which == compares by identity)
        return {k: v for k, v in t.items() if k != "two_level"} | (
            {"two_level": {k: v for k, v in t["two_level"].items() if k != "equivalence_p"}} if "two_level" in t else {})
    keys = [key(t) for t in tests]
    counted = [i for i, t in enumerate(tests) if not t.get("identical") and keys[i] not in keys[:i]]
    adjusted = [dict(t) for t in tests]

    def adjust(read, write):
        present = [i for i in counted if read(tests[i]) is not None]
        for i, p in zip(present, significance.holm([read(tests[i]) for i in present]) if present else []):
            write(adjusted[i], p)

    def inside(name, p_key):
        return lambda t, p: t.update({name: {**t[name], p_key: p}})

    adjust(lambda t: t["two_level"]["p"], inside("two_level", "p_holm"))
    adjust(lambda t: t["two_level"].get("p_equivalence"), inside("two_level", "p_equivalence_holm"))
    adjust(lambda t: t["p_randomization"], lambda t, p: t.update(p_holm=p))
    adjust(lambda t: t.get("p_equivalence"), lambda t, p: t.update(p_equivalence_holm=p))
    adjust(lambda t: t.get("seed_level", {}).get("p"), inside("seed_level", "p_holm"))
    adjust(lambda t: t.get("seed_level", {}).get("p_equivalence"), inside("seed_level", "p_equivalence_holm"))
    equivalence = [i for i in counted if "p_equivalence" in tests[i]["two_level"]]
    for i in counted:
        t, inference = adjusted[i], adjusted[i]["two_level"]
        t["p_holm_error"] = scaled_error(t["p_randomization_error"], t["p_randomization"], t["p_holm"])
        inference["p_holm_error"] = scaled_error(inference["p_error"], inference["p"], inference["p_holm"])
        if i in equivalence:
            inference["p_equivalence_holm_error"] = scaled_error(
                inference["p_equivalence_error"], inference["p_equivalence"], inference["p_equivalence_holm"])
            inference["bound"] = adjusted_bound(tests[i]["two_level"]["equivalence_p"], inference["difference"],
                                                [tests[j]["two_level"]["p_equivalence"] for j in equivalence if j != i])
    for t in adjusted:
        if "two_level" in t:
            t["two_level"] = {k: v for k, v in t["two_level"].items() if k != "equivalence_p"}
    for i, t in enumerate(tests):
        if i not in counted and not t.get("identical"):
            adjusted[i] = {**adjusted[keys.index(keys[i])], "same_as": keys.index(keys[i])}
    return adjusted


def scaled_error(error: float, p: float, adjusted: float) -> float:
    """A p's Monte Carlo error after Holm: multiplied by the factor Holm multiplied the p (0 where capped at 1)."""
    return error * adjusted / p if adjusted < 1 and p > 0 else 0.0


# ---------------------------------------------------------------------------------------------
# Words


def p_text(p: float, error: float = 0.0, threshold: float = ALPHA) -> str:
    """"p = 0.034", "p < 0.001", or with its Monte Carlo error where the p lies within SHOWN_WITHIN
    errors of the threshold: "p = 0.048 (Monte Carlo error 0.002)". In the documents ± is kept for one
    thing, the standard deviation over the seeds."""
    said = "p < 0.001" if p < 0.001 else f"p = {p:.3f}"
    return said + (f" (Monte Carlo error {error:.3f})" if error and abs(p - threshold) < SHOWN_WITHIN * error else "")


def end_text(value: float, error: float) -> str:
    """An interval's end, "+0.0123", with its Monte Carlo error where the end lies within SHOWN_WITHIN
    errors of 0 (where a redraw could move it across): "-0.0001 (Monte Carlo error 0.0004)"."""
    return f"{value:+.4f}" + (f" (Monte Carlo error {error:.4f})" if error and abs(value) < SHOWN_WITHIN * error else "")


def interval_text(test: dict) -> str:
    low, high = test["ci95"]
    error = test.get("ci95_error", 0.0)
    return f"[{end_text(low, error)}, {end_text(high, error)}]"


def _p(test: dict, p_key: str) -> tuple:
    """(p, its Monte Carlo error) of the inference (test["two_level"]), Holm-adjusted where p_key is
    "p_holm" ("p_equivalence_holm" likewise for the equivalence p)."""
    holm = p_key == "p_holm"
    inference = test["two_level"]
    return inference["p_holm" if holm else "p"], inference.get("p_holm_error" if holm else "p_error", 0.0)


def _p_equivalence(test: dict, p_key: str) -> tuple:
    holm = p_key == "p_holm"
    inference = test["two_level"]
    return (inference["p_equivalence_holm" if holm else "p_equivalence"],
            inference.get("p_equivalence_holm_error" if holm else "p_equivalence_error", 0.0))


def outcome(test: dict, p_key: str = "p_holm") -> tuple:
    """("prefers", sign), ("equivalent", 0), ("not detectable", 0) or ("identical", 0): what the
    inference (test["two_level"]) says at ALPHA, Holm-adjusted where p_key is "p_holm"."""
    if test.get("identical"):
        return "identical", 0
    inference = test["two_level"]
    if _p(test, p_key)[0] < ALPHA:
        return "prefers", 1 if inference["difference"] > 0 else -1
    if "p_equivalence" in inference and _p_equivalence(test, p_key)[0] < ALPHA:
        return "equivalent", 0
    return "not detectable", 0


def equivalent(test: dict, p_key: str) -> bool:
    """Whether the (adjusted as p_key is) equivalence test puts the difference within its margin."""
    return not test.get("identical") and outcome(test, p_key)[0] == "equivalent"


def said(result: tuple, first: str, second: str, margin) -> str:
    word, sign = result
    if word == "prefers":
        return f"prefers {first if sign > 0 else second}"
    return f"equivalent (margin {margin:g})" if word == "equivalent" else word


def figures_text(test: dict, p_key: str = "p_holm") -> str:
    """"+0.0123 [+0.0031, +0.0215], p = 0.008; equivalence p = 0.300, bound 0.0262": the inference's
    difference, 95% interval, p and (with a margin) equivalence p and bound."""
    inference = test["two_level"]
    text = f"{inference['difference']:+.4f} {interval_text(inference)}, {p_text(*_p(test, p_key))}"
    if "p_equivalence" in inference:
        text += f"; equivalence {p_text(*_p_equivalence(test, p_key))}"
        if "bound" in inference:
            text += f", bound {inference['bound']:.4f}"
    return text


def conditional_text(test: dict, p_key: str = "p_holm") -> str:
    """"conditional: decides nothing: per query, given the seeds, p = 0.002; t over the 5 seeds, p = 0.210;
    seeds +0.0010 to +0.0300": the figures that leave out one source of variance, labelled as such."""
    holm = p_key == "p_holm"
    parts = [f"per query, given the seeds, {p_text(test['p_holm' if holm else 'p_randomization'])}"]
    if "seed_level" in test:
        seeds = test["seed_level"]
        parts.append(f"t over the {seeds['seeds']} seeds, {p_text(seeds['p_holm' if holm else 'p'])}")
    if len(test.get("seed_differences", [])) > 1:
        parts.append(f"seeds {min(test['seed_differences']):+.4f} to {max(test['seed_differences']):+.4f}")
    return f"{CONDITIONAL}: " + "; ".join(parts)


def verdict(test: dict, label: str, first: str, second: str, p_key: str = "p_holm") -> str:
    """What the inference of (first - second) says: "prefers <first or second>", "equivalent within
    ±margin" or "not detectable; the unadjusted 95% interval runs from a to b", with the difference, its interval
    over seeds and queries, p (and with a margin the equivalence p and bound) in parentheses, then the
    conditional figures, labelled as deciding nothing."""
    if test.get("identical"):
        return f"identical: {first} and {second} give every query an equal {label} in every seed (not tested)"
    result = outcome(test, p_key)
    inference = test["two_level"]
    numbers = f"{label}, {first} - {second}: {figures_text(test, p_key)}; {conditional_text(test, p_key)}"
    if result[0] == "not detectable":
        low, high = inference["ci95"]
        error = inference.get("ci95_error", 0.0)
        adjusted = " after Holm's adjustment" if p_key == "p_holm" else ""
        return (f"not detectable{adjusted}; the unadjusted 95% interval runs from {end_text(low, error)} to "
                f"{end_text(high, error)} ({numbers})")
    return f"{said(result, first, second, inference.get('margin'))} ({numbers})"


def difference_cell(test: dict, p_key: str = "p_holm") -> str:
    """A table cell: "+0.0123 [+0.0031, +0.0215], p = 0.008": the inference's difference, 95% interval
    over seeds and queries, and p (Holm-adjusted where p_key is "p_holm")."""
    if test.get("identical"):
        return "identical, not tested"
    inference = test["two_level"]
    return f"{inference['difference']:+.4f} {interval_text(inference)}, {p_text(*_p(test, p_key))}"


def method_text(tests: list) -> str:
    """The sentences that say how every difference is tested, with the largest Monte Carlo errors of
    the tests' sampled numbers."""
    tests = [t for t in tests if not t.get("identical")]
    inferences = [t["two_level"] for t in tests]
    ends = max((t.get("ci95_error", 0.0) for t in inferences), default=0.0)
    p_error = max((t.get("p_holm_error", t.get("p_error", 0.0)) for t in inferences), default=0.0)
    draws = sorted({t["resamples"] for t in inferences if "resamples" in t})
    return (
        "Each difference is tested once, over the seeds and the queries together (minisbert/evaluation/significance.py, "
        "crossed_t): the seeds x queries table of differences (the same queries in every seed, both models) has a "
        "seeds' part, a queries' part and their interaction in its variance, each taken at its own degrees of freedom "
        "(4 for five seeds), so that the interval covers with the seeds there are. From it come the 95% interval "
        "(unadjusted), the p of a zero difference and, with a margin, the equivalence p (two one-sided tests; "
        f"equivalent when the 90% interval lies inside the margin either side of 0), each p Holm-adjusted within its "
        "family; \"bound\" is "
        f"the smallest margin at which the same adjusted equivalence test would hold. A p below {ALPHA:g} decides; "
        "nothing else does. Its numbers are exact; a Spearman difference's pairs' part is drawn (" + (
            " or ".join(f"{count:,}" for count in draws) if draws else "no") + " draws), and the largest Monte Carlo "
        f"error of an adjusted p is {p_error:.4f}, printed beside a p within {SHOWN_WITHIN} errors of its threshold "
        f"(of an interval's end, {ends:.4f}). Beside it, labelled \"" + CONDITIONAL + "\", stand the per-query "
        "randomization test (the networks held fixed) and a t over the seeds' own differences (the queries held "
        "fixed): each leaves out one source of variance."
    )


def plotted(test: dict) -> dict:
    """What figures.differences draws of a test: the inference's difference, 95% interval and adjusted p,
    and the seeds' own differences (their dots, conditional); an identical pair as it is."""
    if test.get("identical"):
        return test
    return {**test["two_level"], "seed_differences": test.get("seed_differences", [])}


def brief(test: dict, first: str, second: str) -> str:
    """"prefers X (+0.0123 [+0.0040, +0.0210], p < 0.001; equivalence p = 0.300, bound 0.0262)": the
    verdict of the one inference (Holm-adjusted) and figures_text; "identical (not tested)" for identical models."""
    if test.get("identical"):
        return "identical (not tested)"
    return f"{said(outcome(test, 'p_holm'), first, second, test['two_level'].get('margin'))} ({figures_text(test)})"
