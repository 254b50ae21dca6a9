"""Two finished runs of a study set side by side: each model of one tested against a model of the other,
over seeds and queries, from their results.json alone (nothing is loaded, encoded or trained).

    python -m minisbert.experiments compare-runs bench/studies/siamese-vs-triplet/epochs-3 \\
        bench/studies/siamese-vs-triplet --output runs/epochs-3-against-2
    python -m minisbert.experiments compare-runs bench/studies/siamese-vs-triplet/epochs-3 \\
        bench/studies/embedding-size --pairs triplet-euclidean-margin0.2:base --output runs/margins

A claim that sets two runs against each other ("3 epochs improve on 2", "margin 0.2 beats 0.05")
needs its own test: the two runs' tables side by side say nothing about the difference between them.
Every trained model the two results.json files both hold (the untrained controls are the same in
both runs), or each FIRST:SECOND of --pairs, is tested as
first - second on --metric: the mean difference, its 95% interval and p from the crossed t over seeds
and queries (verdicts.py), the p Holm-adjusted over the pairs, with the equivalence test at
verdicts.NDCG_MARGIN when the metric is NDCG@10; seed i of one is paired with seed i of the other.
Both runs must have scored the same queries.

Writes OUTPUT/results.json (both runs' settings, each pair's scores and test) and OUTPUT/results.md
(a table and a verdict per pair).
Checked in tests/experiments/test_experiments.py.
"""

import argparse
from pathlib import Path

from ..common.fileio import read_json, write_json, write_text
from . import records, runner, verdicts

NAME = "compare-runs"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog=f"python -m minisbert.experiments {NAME}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("first", type=Path, help="an experiment's output folder (holding results.json)")
    p.add_argument("second", type=Path, help="another one; every difference is first - second")
    p.add_argument("--pairs", nargs="+", default=None, metavar="FIRST:SECOND",
                   help="model names to compare (default: every trained model both runs hold)")
    p.add_argument("--names", nargs=2, default=["first", "second"], metavar=("FIRST", "SECOND"),
                   help="what to call the two runs in the report (default: first second)")
    p.add_argument("--metric", default="ndcg@10", help="a per-query metric both runs hold (default ndcg@10)")
    p.add_argument("--output", type=Path, required=True, help="where results.json and results.md go")
    args = p.parse_args(argv)
    if args.pairs and any(pair.count(":") != 1 for pair in args.pairs):
        p.error(f"--pairs takes FIRST:SECOND model names, got {args.pairs}")
    return args


def main(argv=None):
    args = parse_args(argv)
    first, second = (read_results(folder) for folder in (args.first, args.second))
    pairs = ([tuple(pair.split(":")) for pair in args.pairs] if args.pairs else
             [(name, name) for name, model in first["models"].items() if "runs" in model and name in second["models"]])
    for name, run, folder in [(a, first, args.first) for a, _ in pairs] + [(b, second, args.second) for _, b in pairs]:
        if args.metric not in run["models"].get(name, {}).get("per_query", {}):
            raise ValueError(f"{folder / 'results.json'} holds no per-query {args.metric} for a model named {name!r}; "
                             f"its models: {', '.join(run['models'])}")
    if not pairs:
        raise ValueError(f"{args.first} and {args.second} hold no trained model of the same name; "
                         "name them with --pairs")
    margin = verdicts.NDCG_MARGIN if args.metric == "ndcg@10" else None
    tests = verdicts.family([verdicts.claim(first["models"][a], second["models"][b], args.metric, margin)
                           for a, b in pairs])
    results = {"first": str(args.first), "second": str(args.second), "names": args.names, "metric": args.metric,
               "settings": {"first": first["settings"], "second": second["settings"]},
               "scores": {f"{a}:{b}": {"first": first["models"][a]["scores"][args.metric],
                                       "second": second["models"][b]["scores"][args.metric],
                                       "spread": [first["models"][a].get("spread", {}).get(args.metric, 0.0),
                                                  second["models"][b].get("spread", {}).get(args.metric, 0.0)]}
                          for a, b in pairs},
               "tests": {f"{a}:{b}": test for (a, b), test in zip(pairs, tests)}}
    args.output.mkdir(parents=True, exist_ok=True)
    write_json(args.output / "results.json", results, digest=True)
    markdown = report(args, first, second, pairs, tests)
    write_text(args.output / "results.md", markdown)
    print(f"\n{markdown}\nresults: {args.output / 'results.md'}, {args.output / 'results.json'}")


def read_results(folder: Path) -> dict:
    path = folder / "results.json"
    if not path.is_file():
        raise ValueError(f"{path} does not exist: give an experiment's output folder")
    return read_json(path)


def report(args, first: dict, second: dict, pairs: list, tests: list) -> str:
    label = args.metric.upper()
    rows = [[f"{a}" if a == b else f"{a} against {b}", runner.mean_cell(first["models"][a], args.metric),
             runner.mean_cell(second["models"][b], args.metric), verdicts.difference_cell(test)]
            for (a, b), test in zip(pairs, tests)]
    one, other = args.names
    settings = [f"- {one}: `{args.first}`: " + ", ".join(f"{k} {v}" for k, v in first["settings"].items()),
                f"- {other}: `{args.second}`: " + ", ".join(f"{k} {v}" for k, v in second["settings"].items())]
    return "\n".join([
        "# Two runs side by side",
        "",
        *settings,
        "",
        f"Each model of {one} against its pair in {other}, {label}: the mean difference ({one} - {other}), its 95% "
        f"interval and p, Holm-adjusted over the distinct pairs (two pairs with identical differences counted once). "
        + verdicts.method_text(tests),
        "",
        machine_pairs(args, pairs),
        "",
        *[f"- {name}: {records.about_line(run_record(folder))}" for name, folder in zip(args.names, (args.first, args.second))],
        "",
        runner.markdown_table(["model", f"{label}, {one}", f"{label}, {other}", "difference"], rows),
        *[f"- {a if a == b else f'{a} against {b}'}: {verdicts.verdict(test, label, one, other, 'p_holm')}."
          for (a, b), test in zip(pairs, tests)],
        "",
        *([f"**Equivalence margin**: {verdicts.MARGIN_REASON}; \"bound\" is the smallest margin at which the "
           "same adjusted equivalence test would hold.", "",
           *[f"- {name}: {records.margin_record(run_record(folder))}"
             for name, folder in zip(args.names, (args.first, args.second))], ""] if args.metric == "ndcg@10" else []),
    ])


def run_record(folder) -> dict:
    """The run's run.json (its machines, notes and margin), or {} where it has none."""
    path = Path(folder) / "run.json"
    return read_json(path) if path.is_file() else {}


def machine_pairs(args, pairs: list) -> str:
    """Which machines the paired networks came from (each run's run.json, records.made_on): seed i of one
    run's model against seed i of the other's, counted by (machine, machine); where they differ, the
    difference between the runs is also one between machines, and this says so."""
    made = []
    for folder in (args.first, args.second):
        models = Path(folder) / "models"
        entries = sorted(path.name for path in models.iterdir() if path.is_dir()) if models.is_dir() else []
        made.append(records.made_on(run_record(folder), entries))
    counts = {}
    for a, b in pairs:
        ours, theirs = (sorted((e for e in found if e.startswith(f"{name}-seed")),
                               key=lambda e: int(e.rsplit("-seed", 1)[1])) for found, name in zip(made, (a, b)))
        for x, y in zip(ours, theirs):
            key = (made[0][x], made[1][y])
            counts[key] = counts.get(key, 0) + 1
    if not counts:
        return "Machines: the runs record no seeds to pair."
    one, other = args.names
    text = "Machines (each run's run.json), seed i against seed i: " + "; ".join(
        f"{count} pair{'s' if count > 1 else ''} of a network made on {x} ({one}) against one made on {y} ({other})"
        for (x, y), count in counts.items()) + "."
    if any(x != y for x, y in counts):
        text += (" Where the two machines differ, a difference between the runs is also one between machines; the "
                 "runs cannot tell the two apart.")
    return text
