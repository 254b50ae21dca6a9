"""The README's section on the studies, generated from the committed results.json files: a few short
sentences on how every comparison is tested, then a table, one row per comparison (or, for a family
of checks against a baseline, one row for the family), so that every number in it is its key's and
every verdict its test's (tests/experiments/test_study_writeups.py checks that the README holds
exactly this text).

    python -m minisbert.experiments summary      # prints the section for README.md
"""

import argparse
from pathlib import Path

from ..common.fileio import read_json
from . import (embedding_size_report, model_selection, records, runner, sbert_objectives, siamese_vs_triplet,
               siamese_vs_triplet_report, verdicts)

STUDIES = Path(__file__).resolve().parents[2] / "bench" / "studies"


def margin_sentence(studies: Path) -> str:
    """Which committed runs predate the margin's record (their run.json records no margin), wholly or
    in part (a run continued later: some of its records have one)."""
    runs = sorted(studies.rglob("run.json"))
    before = []  # (run, whether all its models predate the record)
    for path in runs:
        made = records.history(read_json(path))
        lacking = [record for record in made if "margin" not in record]
        if lacking:
            before.append((str(path.parent.relative_to(studies)), len(lacking) == len(made)))
    if len(before) == len(runs) and all(whole for _, whole in before):
        return ("Every committed run predates the margin's record in run.json: its equivalence tests were computed "
                "afterwards, from stored scores.")
    named = [name + ("" if whole else " (in part)") for name, whole in before]
    return f"These committed runs predate the margin's record in run.json: {', '.join(named) or 'none'}."


def seed_counts(studies: Path) -> str:
    """"3 seeds" where every committed run trained with seeds has 3, else "3 seeds (5 in sbert-objectives)"."""
    settings = {str(path.parent.relative_to(studies)): read_json(path) for path in sorted(studies.rglob("settings.json"))}
    counts = {name: found["seeds"] for name, found in settings.items() if found.get("seeds")}  # trained with seeds
    usual = max(set(counts.values()), key=list(counts.values()).count)
    others = [f"{count} in {name}" for name, count in counts.items() if count != usual]
    return f"{usual} seeds" + (f" ({', '.join(others)})" if others else "")


def selection_seeds(selection: dict) -> str:
    """How many networks stand behind model-selection's rows: the seeds of the candidates it trained, or one each."""
    trained = [name for name, model in selection["models"].items() if len(model.get("runs", [])) > 1]
    if not trained:
        return "one network per model"
    return f"{' and '.join(trained)} with {len(selection['models'][trained[0]]['runs'])} seeds each"


FOLDERS = {"Siamese vs. Triplet": "siamese-vs-triplet", "Embedding size": "embedding-size",
           "SBERT's objectives": "sbert-objectives", "Model selection": "model-selection"}
HEADER = ["study", "comparison (NDCG@10 unless named)", "verdict", "difference [95% interval, unadjusted]",
          "p (Holm-adjusted)", "write-up"]


def comparison_row(test: dict, first: str, second: str) -> list:
    """The verdict, difference with its interval, and adjusted p of one comparison (first - second)."""
    if test.get("identical"):
        return ["identical networks (not tested)", "", ""]
    inference = test["two_level"]
    verdict = verdicts.said(verdicts.outcome(test, "p_holm"), first, second, inference.get("margin"))
    difference = f"{inference['difference']:+.4f} {verdicts.interval_text(inference)}"
    return [verdict, difference, verdicts.p_text(*verdicts._p(test, "p_holm")).removeprefix("p ").removeprefix("= ")]


def family_row(tests: dict, first: str, second: str) -> list:
    """One row for a family of checks against a baseline: how many comparisons say what, naming the
    detected ones (one network under two names, "a = b", once), and the range of the differences (each
    interval is in the write-up)."""
    said, names = {}, list(tests)
    for name, test in tests.items():
        if "same_as" in test:  # one network under two names (verdicts.family counts it once): said once
            continue
        twins = [other for other in names if tests[other].get("same_as") == names.index(name)]
        cell = comparison_row(test, first, second)[0]
        said.setdefault(cell, []).append(" = ".join([name, *twins]))
    plural = {word: word.replace("prefers ", "prefer ") if len(names) > 1 else word for word, names in said.items()}
    verdict = "; ".join(f"{len(names)} {plural[word]}" + ("" if word == "not detectable" else f" ({', '.join(names)})")
                        for word, names in sorted(said.items(), key=lambda item: -len(item[1])))
    differences = [test["two_level"]["difference"] for test in tests.values() if not test.get("identical")]
    return [verdict, f"{min(differences):+.4f} to {max(differences):+.4f} (each interval in the write-up)", ""]


def claims_row(rows: list) -> list:
    """The paper's claims set beside the run: how many it agrees and disagrees with (each claim, its
    test and the reason for "not comparable" are in the write-up's table)."""
    labels = [row[4] for row in rows]
    if not rows or labels.count(runner.NOT_COMPARABLE) == len(rows):
        return ["none can be set beside this run (the write-up's table says why)", "", ""]
    said = [f"{label} ({labels.count(label)}): " + "; ".join(row[0] for row in rows if row[4] == label)
            for label in runner.LABELS if labels.count(label)]
    return [". ".join(said), "", ""]


def section(studies: Path = STUDIES) -> str:
    svt = read_json(studies / "siamese-vs-triplet" / "results.json")
    epochs = read_json(studies / "siamese-vs-triplet" / "epochs-3-against-2" / "results.json")
    size = read_json(studies / "embedding-size" / "results.json")
    objectives = read_json(studies / "sbert-objectives" / "results.json")
    selection = read_json(studies / "model-selection" / "results.json")
    models = svt["models"]
    rows = []  # [study, comparison, verdict, difference, p, write-up]
    study = "Siamese vs. Triplet"  # Rygaard et al., "Distance Dilemma"
    for network, test in svt["tests"]["measures"].items():
        rows.append([study, f"{network}: cosine - euclidean", *comparison_row(test, "cosine", "euclidean")])
    if "on_par" in svt["tests"]:
        rows.append([study, f"the paper's two best, on par in it: Siamese cosine ({models['siamese-cosine']['scores']['ndcg@10']:.4f})"
                     f" - Triplet euclidean, margin 5 ({models['triplet-euclidean-margin5']['scores']['ndcg@10']:.4f})",
                     *comparison_row(svt["tests"]["on_par"], "Siamese cosine", "Triplet euclidean")])
    rows.append([study, f"each network - the start model ({len(svt['tests']['against_start'])})",
                 *family_row(svt["tests"]["against_start"], "trained", "start")])
    rows.append([study, f"3 epochs - 2, each network ({len(epochs['tests'])})",
                 *family_row({pair.split(":")[0]: test for pair, test in epochs["tests"].items()}, "3 epochs", "2 epochs")])
    paper = read_json(studies / "siamese-vs-triplet" / "epochs-3" / "results.json")  # the paper's 3 epochs decide
    rows.append([study, "the paper's claims (at its 3 epochs: the epochs-3 run)", *claims_row(
        siamese_vs_triplet_report.paper_claims(siamese_vs_triplet.networks(paper["settings"]["margins"]),
                                               paper["models"], paper["tests"],
                                               read_json(studies / "siamese-vs-triplet" / "epochs-3" / "run.json"),
                                               paper["settings"]["epochs"]))])
    study = "Embedding size"  # Bagge et al., SRoBERTa
    for dim, test in size["tests"]["against_base"].items():
        rows.append([study, f"D = {dim} - the base model", *comparison_row(test, f"D = {dim}", "base")])
    rows.append([study, f"each D - the untrained start model ({len(size['tests']['against_start'])})",
                 *family_row({f"D = {dim}": test for dim, test in size["tests"]["against_start"].items()}, "trained", "start")])
    rows.append([study, "the paper's claims", *claims_row(embedding_size_report.paper_claims(
        argparse.Namespace(**size["settings"]), size["models"], size["tests"], size["search_speed"]))])
    study = "SBERT's objectives"  # Reimers and Gurevych, section 3
    for name, tests in objectives["tests"].items():
        first, second = ("MNRL", "triplet") if name == "mnrl_vs_triplet" else ("trained", "start")
        what = "MNRL - triplet" if name == "mnrl_vs_triplet" else f"{name} - the start model"
        rows.append([study, f"{what}, STS-B Spearman (mean over the seeds)", *comparison_row(tests["spearman"], first, second)])
        rows.append([study, f"{what}, SciFact", *comparison_row(tests["ndcg@10"], first, second)])
    rows.append([study, "the paper's claims", *claims_row(sbert_objectives.paper_claims())])
    study = "Model selection"  # Silveri, BEIR
    for name, test in model_selection.tested(selection["tests"], "ndcg@10").items():
        rows.append([study, f"{name} - the best, {selection['best']}", *comparison_row(test, name, "best")])
    rows.append([study, "the paper's claims", *claims_row(model_selection.paper_claims(selection["best"]))])
    shown, last = [], None
    for row in rows:  # a study's name and write-up once, on its first row
        first = row[0] != last
        shown.append([f"**{row[0]}**" if first else "", *row[1:],
                      f"[results](bench/studies/{FOLDERS[row[0]]}/results.md)" if first else ""])
        last = row[0]
    intro = (
        "Every study takes `--quick`, `--data`, `--model`, `--output DIR`, `--device` and `--seeds N`, resumes with the "
        "same `--output`, and writes `results.md`, `results.json` and figures.\n\n"
        "Each comparison is tested once, by a t over the seeds (" + seed_counts(studies) + ") and the queries together, "
        "each part of its variance at its own degrees of freedom, so that its 95% interval covers with five seeds "
        "(minisbert/evaluation/significance.py, crossed_t). Its p is Holm-adjusted within its family; its interval "
        f"is not. A p above {verdicts.ALPHA:g} is \"not detectable\". Only an equivalence test at {verdicts.NDCG_MARGIN:g} "
        "NDCG@10 may call two models equivalent. Two names joined by \"=\" are one network, tested once (the write-up "
        "says why). The paper's claims, labelled: " + runner.LABELS_SAID + " " + margin_sentence(studies) + " The committed runs start from "
        "all-MiniLM-L6-v2, already a sentence encoder; the papers fine-tune raw DistilBERT or RoBERTa. Each write-up "
        "names its machines, the per-seed and per-query figures, and the equivalence tests. The studies: Siamese vs. "
        "Triplet (Rygaard et al., \"Distance Dilemma\"); embedding size (Bagge et al., SRoBERTa); SBERT's objectives "
        "(Reimers and Gurevych, section 3); model selection (Silveri, BEIR; " + selection_seeds(selection) + ").\n\n"
        "This section is `python -m minisbert.experiments summary`; `tests/experiments/test_study_writeups.py` checks that "
        "it and every `results.md` are what the code makes of the stored results.\n\n")
    table = ["| " + " | ".join(HEADER) + " |", "|---|---|---|---|---:|---|"]
    table += ["| " + " | ".join(row) + " |" for row in shown]
    return intro + "\n".join(table) + "\n"


def main(argv=None):
    argparse.ArgumentParser(prog="python -m minisbert.experiments summary", description=__doc__).parse_args(argv)
    print(section(), end="")
