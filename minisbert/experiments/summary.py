"""The README's paragraphs on the studies, generated from the committed results.json files, so that
every number in them is its key's and every verdict its test's (tests/experiments/test_study_writeups.py checks
that the README holds exactly this text).

    python -m minisbert.experiments summary      # prints the paragraphs for README.md
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


def against_the_paper(rows: list) -> str:
    """" Against the paper: it disagrees that ...; it agrees that ...": the claims table's verdicts, named."""
    said = [f"disagrees that {'; that '.join(runner.disagreements(rows))}" if runner.disagreements(rows) else "",
            "agrees that " + "; that ".join(row[0] for row in rows if row[4] == runner.AGREES)
            if any(row[4] == runner.AGREES for row in rows) else ""]
    if not any(said):
        return " No claim of the paper can be set beside this run (its results.md's table says why)."
    return " Against the paper's claims (its results.md's table), this run " + ", and ".join(x for x in said if x) + "."


def paragraphs(studies: Path = STUDIES) -> str:
    svt = read_json(studies / "siamese-vs-triplet" / "results.json")
    epochs = read_json(studies / "siamese-vs-triplet" / "epochs-3-against-2" / "results.json")
    size = read_json(studies / "embedding-size" / "results.json")
    objectives = read_json(studies / "sbert-objectives" / "results.json")
    selection = read_json(studies / "model-selection" / "results.json")
    models = svt["models"]
    lines = [
        "Every study takes `--quick`, `--data`, `--model`, `--output DIR`, `--device` and `--seeds N`, resumes with "
        "the same `--output`, and writes `results.md`, `results.json` and figures. Every difference is tested once, "
        "by a two-level bootstrap that draws the seeds (" + seed_counts(studies) + ") and then the queries, so that its "
        "interval carries the training runs' variance and the queries' (minisbert/evaluation/significance.py); its p's are "
        f"Holm-adjusted within each family. A p above {verdicts.ALPHA:g} is \"not detectable\"; only its equivalence "
        f"test at {verdicts.NDCG_MARGIN:g} NDCG@10 may call two models equivalent, and \"bound\" is the smallest margin "
        "at which that adjusted test would hold. Figures per query or per seed are printed beside it as conditional, "
        "deciding nothing. " + margin_sentence(studies)
        + " The "
        "committed runs start from all-MiniLM-L6-v2, already a sentence encoder, where the papers fine-tune raw "
        "DistilBERT or RoBERTa; their machines are in each results.md. This text is `python -m minisbert.experiments "
        "summary`, and `tests/experiments/test_study_writeups.py` checks that it and every `results.md` are what the code makes "
        "of the stored results.",
        "",
        "**Siamese vs. Triplet** (Rygaard et al., \"Distance Dilemma\"), cosine against euclidean, NDCG@10: "
        + "; ".join(f"{network}: {verdicts.brief(test, 'cosine', 'euclidean')}" for network, test in svt["tests"]["measures"].items())
        + ". Against the start model: " + "; ".join(f"{name}: {verdicts.brief(test, 'trained', 'start')}"
                                                  for name, test in svt["tests"]["against_start"].items()) + "."
        + (f" The paper's two best networks, which it finds on par: Siamese cosine {models['siamese-cosine']['scores']['ndcg@10']:.4f}, "
           f"Triplet euclidean at margin 5 {models['triplet-euclidean-margin5']['scores']['ndcg@10']:.4f}, "
           f"{verdicts.brief(svt['tests']['on_par'], 'Siamese cosine', 'Triplet euclidean')}." if "on_par" in svt["tests"] else "")
        + against_the_paper(siamese_vs_triplet_report.paper_claims(
            siamese_vs_triplet.networks(svt["settings"]["margins"]), models, svt["tests"],
            read_json(studies / "siamese-vs-triplet" / "run.json")))
        + " 3 epochs against 2: " + "; ".join(f"{pair.split(':')[0]}: {verdicts.brief(test, '3 epochs', '2 epochs')}"
                                             for pair, test in epochs["tests"].items()) + ". "
        "[results](bench/studies/siamese-vs-triplet/results.md)",
        "",
        "**Embedding size** (Bagge et al., SRoBERTa), NDCG@10, each D against the base model: "
        + "; ".join(f"D = {dim}: {verdicts.brief(test, f'D = {dim}', 'base')}" for dim, test in size["tests"]["against_base"].items())
        + "; against the untrained start model: "
        + "; ".join(f"D = {dim}: {verdicts.brief(test, f'D = {dim}', 'start')}" for dim, test in size["tests"]["against_start"].items())
        + "." + against_the_paper(embedding_size_report.paper_claims(
            argparse.Namespace(**size["settings"]), size["models"], size["tests"], size["search_speed"]))
        + " [results](bench/studies/embedding-size/results.md)",
        "",
        "**SBERT's objectives** (Reimers and Gurevych, section 3), each against the start model, on STS-B (Spearman "
        "difference, the mean over the seeds) and on SciFact (NDCG@10): "
        + "; ".join(f"{name}: STS-B {verdicts.brief(tests['spearman'], 'trained', 'start')}; SciFact "
                    f"{verdicts.brief(tests['ndcg@10'], 'trained', 'start')}"
                    for name, tests in objectives["tests"].items() if name != "mnrl_vs_triplet")
        + ". MNRL against triplet: STS-B " + verdicts.brief(objectives["tests"]["mnrl_vs_triplet"]["spearman"], "MNRL", "triplet")
        + ", SciFact " + verdicts.brief(objectives["tests"]["mnrl_vs_triplet"]["ndcg@10"], "MNRL", "triplet") + "."
        + against_the_paper(sbert_objectives.paper_claims()) + " "
        "[results](bench/studies/sbert-objectives/results.md)",
        "",
        "**Model selection** (Silveri, BEIR; " + selection_seeds(selection) + "), each candidate against the best by "
        f"NDCG@10, {selection['best']}: " + "; ".join(f"{name}: {verdicts.brief(test, name, 'best')}"
                                            for name, test in selection["tests"]["ndcg@10"].items()) + "."
        + against_the_paper(model_selection.paper_claims(selection["best"]))
        + " [results](bench/studies/model-selection/results.md)",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None):
    argparse.ArgumentParser(prog="python -m minisbert.experiments summary", description=__doc__).parse_args(argv)
    print(paragraphs(), end="")
