"""What a study says of a difference: each comparison tested (minisbert/significance.py), then the
words for it, which say what the test shows and no more.

A difference is detected when its Holm-adjusted randomization p is below ALPHA; it may be called
equivalent only when the two one-sided tests against NDCG_MARGIN, fixed before the runs, say so;
otherwise it is not detectable, and the sentence gives the interval that says how large it could
be. Used by every study in minisbert/experiments/; checked in tests/test_experiments.py and
tests/test_study_writeups.py.
"""

from .. import significance

ALPHA = 0.05  # a difference whose (randomization test) p is below this is called detected
# The equivalence margin on NDCG@10, fixed before the studies' runs: a difference the equivalence
# test places within ±NDCG_MARGIN may be called equivalent; nothing else may be called unchanged.
NDCG_MARGIN = 0.02
MARGIN_REASON = (
    "0.02 NDCG@10 is the smallest change taken here as one a user would act on: it is what six of SciFact's "
    "300 test queries add by moving from no relevant document in the top 10 to one at rank 1, and a choice "
    "between two models on a few hundred queries rests on hundredths of NDCG@10, not on thousandths. It was "
    "fixed before the runs it is applied to")


def paired_test(a: dict, b: dict, metric: str, margin: float | None = None) -> dict:
    """significance.compare of model a's and model b's per-query values of `metric` (a - b), with
    the equivalence test at `margin` when one is given."""
    return significance.compare(a["per_query"][metric], b["per_query"][metric], margin=margin)


def claim(a: dict, b: dict, metric: str, margin: float | None = None) -> dict:
    """paired_test of a - b, with "seed_differences": each of a's seeds' score minus b's (b's own
    seed where b was trained with as many, else b's score), when a has more than one seed."""
    test = paired_test(a, b, metric, margin)
    seeds = a.get("seeds", [])
    if len(seeds) > 1:
        others = b.get("seeds", [])
        test["seed_differences"] = [seed[metric] - (others[i][metric] if len(others) == len(seeds) else b["scores"][metric])
                                    for i, seed in enumerate(seeds)]
    return test


def family(tests: list) -> list:
    """with_holm, and each equivalence p Holm-adjusted over the family's equivalence tests
    ("p_equivalence_holm")."""
    tests = significance.with_holm(tests)
    tested = [i for i, t in enumerate(tests) if "p_equivalence" in t]
    for i, p in zip(tested, significance.holm([tests[i]["p_equivalence"] for i in tested])):
        tests[i] = {**tests[i], "p_equivalence_holm": p}
    return tests


def p_text(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def seeds_text(test: dict) -> str:
    """"; seeds +0.0301 to +0.0412": the spread of the seeds' own differences, where there are several."""
    seeds = test.get("seed_differences", [])
    return f"; seeds {min(seeds):+.4f} to {max(seeds):+.4f}" if len(seeds) > 1 else ""


def tested(test: dict, label: str, p_key: str = "p_randomization") -> str:
    """"NDCG@10 +0.0310, 95% CI [+0.0120, +0.0500], p = 0.002": a difference, its interval, p and
    (several seeds) the seeds' spread."""
    low, high = test["ci95"]
    return f"{label} {test['difference']:+.4f}, 95% CI [{low:+.4f}, {high:+.4f}], {p_text(test[p_key])}" + seeds_text(test)


def equivalent(test: dict, p_key: str) -> bool:
    """Whether the equivalence test (adjusted as p_key is) puts the difference within its margin."""
    key = "p_equivalence_holm" if p_key == "p_holm" else "p_equivalence"
    return test.get(key, 1.0) < ALPHA


def verdict(test: dict, label: str, first: str, second: str, p_key: str = "p_randomization") -> str:
    """What the test of (first - second) says: "prefers <first or second> (...)" when p < ALPHA;
    "equivalent within ±margin (...)" when the equivalence test says so; else "not detectable; the
    95% interval runs from a to b (...)". The parentheses hold the difference, its interval and p."""
    said = tested(test, f"{label}, {first} - {second}:", p_key)
    if test[p_key] < ALPHA:
        return f"prefers {first if test['difference'] > 0 else second} ({said})"
    if equivalent(test, p_key):
        p = test["p_equivalence_holm" if p_key == "p_holm" else "p_equivalence"]
        return f"equivalent within ±{test['margin']:g} ({said}; equivalence test {p_text(p)})"
    low, high = test["ci95"]
    return (f"not detectable; the 95% interval runs from {low:+.4f} to {high:+.4f} ({label}, {first} - {second}: "
            f"{test['difference']:+.4f}, {p_text(test[p_key])}{seeds_text(test)})")


def difference_cell(test: dict, p_key: str = "p_holm") -> str:
    """A table cell: "+0.0123 [+0.0031, +0.0215], p = 0.008" (and the seeds' spread)."""
    low, high = test["ci95"]
    return f"{test['difference']:+.4f} [{low:+.4f}, {high:+.4f}], {p_text(test[p_key])}" + seeds_text(test)


def largest_error(tests: list) -> str:
    """A sentence on the largest Monte Carlo standard error among the tests' raw randomization p's."""
    error = max((t.get("p_randomization_error", 0.0) for t in tests), default=0.0)
    return (f"The randomization p's come from 10,000 random sign vectors; their Monte Carlo standard error is at "
            f"most {error:.4f} before adjustment." if error else "The randomization p's are exact.")
