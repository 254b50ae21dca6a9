"""The text tables evaluate.py prints: each model's metrics at every k, and each model's difference
from the first, tested query by query (significance.compare_with_first). Checked through
evaluate.py in tests/evaluation/test_evaluate.py.
"""

METRIC_ROWS = [("Precision", "precision"), ("Accuracy", "accuracy"), ("Recall", "recall"),
               ("MRR", "mrr"), ("NDCG", "ndcg"), ("MAP", "map")]


def print_significance(results: dict) -> None:
    """Each compared model's difference from the first, metric by metric, * where p_holm < 0.05."""
    first, *others = results
    sts = "similarities" in results[first]
    print(f"\nDifferences from {first}, paired over the same {'sentence pairs' if sts else 'queries'}: mean "
          "difference, bootstrap 95% interval, p of the randomization test" + ("" if sts else " and of the paired t-test")
          + (f", Holm-adjusted randomization p over the {len(others)} comparisons" if len(others) > 1 else "")
          + "; * marks p < 0.05" + (" after adjustment" if len(others) > 1 else ""))
    for name in others:
        print(f"\n{name} - {first}")
        print(f"{'':14s}{'difference':>11s}{'95% CI':>22s}{'p rand':>9s}{'p t':>9s}"
              + (f"{'p Holm':>9s}" if len(others) > 1 else ""))
        order = [key for _, key in METRIC_ROWS]  # the metric tables' order: metric, then k
        for metric, test in sorted(results[name]["significance"].items(),
                                   key=lambda item: (order.index(item[0].split("@")[0]) if "@" in item[0] else -1,
                                                     int(item[0].split("@")[1]) if "@" in item[0] else 0)):
            p_t = "-" if test["p_t_test"] is None else f"{test['p_t_test']:.4f}"
            low, high = test["ci95"]
            print(f"{metric:14s}{test['difference']:+11.4f}{f'[{low:+.4f}, {high:+.4f}]':>22s}"
                  f"{test['p_randomization']:9.4f}{p_t:>9s}"
                  + (f"{test['p_holm']:9.4f}" if len(others) > 1 else "")
                  + ("  *" if test["p_holm"] < 0.05 else ""))


def print_table(name: str, scores: dict, ks: list):
    """A model's {metric@k: value}, one row per metric, one column per k."""
    print(f"\n{name}")
    print(f"{'':10s}" + "".join(f"{'@' + str(k):>9s}" for k in ks))
    for title, key in METRIC_ROWS:
        print(f"{title:10s}" + "".join(f"{scores[f'{key}@{k}']:9.4f}" for k in ks))
