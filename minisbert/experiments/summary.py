"""The README's paragraphs on the studies, generated from the committed results.json files, so that
every number in them is its key's and every verdict its test's (tests/test_study_writeups.py checks
that the README holds exactly this text).

    python -m minisbert.experiments summary      # prints the paragraphs for README.md
"""

import argparse
from pathlib import Path

from ..fileio import read_json
from . import records, verdicts

STUDIES = Path(__file__).resolve().parents[2] / "bench" / "studies"


def short(test: dict, first: str, second: str) -> str:
    """"prefers X (+0.0123 [+0.0040, +0.0210], p < 0.001; over seeds [+0.0010, +0.0240], p = 0.020)":
    the per-query verdict (Holm), its difference, 95% interval and p, and the seed level's interval, p
    and verdict where it disagrees."""
    if test.get("identical"):
        return "identical (not tested)"
    said = verdicts.said(verdicts.outcome(test, "p_holm"), first, second, test.get("margin"))
    text = (f"{said} ({test['difference']:+.4f} {verdicts.interval_text(test)}, "
            f"{verdicts.p_text(test['p_holm'], test.get('p_holm_error', 0.0))}")
    if "seed_level" in test:
        over_seeds = verdicts.outcome(test, "p_holm", "over seeds")
        low, high = test["seed_level"]["ci95"]
        text += f"; over seeds [{low:+.4f}, {high:+.4f}], {verdicts.p_text(test['seed_level']['p_holm'])}"
        if over_seeds != verdicts.outcome(test, "p_holm"):
            text += f", {verdicts.said(over_seeds, first, second, test.get('margin'))}"
    return text + ")"


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


def paragraphs(studies: Path = STUDIES) -> str:
    svt = read_json(studies / "siamese-vs-triplet" / "results.json")
    epochs = read_json(studies / "siamese-vs-triplet" / "epochs-3-against-2" / "results.json")
    size = read_json(studies / "embedding-size" / "results.json")
    objectives = read_json(studies / "sbert-objectives" / "results.json")
    selection = read_json(studies / "model-selection" / "results.json")
    models = svt["models"]
    lines = [
        "Every study takes `--quick`, `--data`, `--model`, `--output DIR`, `--device` and `--seeds N`, resumes with "
        "the same `--output`, and writes `results.md`, `results.json` and figures. Every difference is tested two "
        "ways: per query, given the seeds (randomization test, Holm-adjusted; bootstrap 95% interval), and by a t over "
        "the seeds' own differences, which with " + seed_counts(studies) + " detects only large, consistent differences. A p above "
        f"{verdicts.ALPHA:g} is \"not detectable\"; only two one-sided tests at {verdicts.NDCG_MARGIN:g} NDCG@10 may call "
        "two models equivalent, and each results.md gives the bound at which they would. " + margin_sentence(studies)
        + " The "
        "committed runs start from all-MiniLM-L6-v2, already a sentence encoder, where the papers fine-tune raw "
        "DistilBERT or RoBERTa; their machines are in each results.md. This text is `python -m minisbert.experiments "
        "summary`, and `tests/test_study_writeups.py` checks that it and every `results.md` are what the code makes "
        "of the stored results.",
        "",
        "**Siamese vs. Triplet** (Rygaard et al., \"Distance Dilemma\"), cosine against euclidean, NDCG@10: "
        + "; ".join(f"{network}: {short(test, 'cosine', 'euclidean')}" for network, test in svt["tests"]["measures"].items())
        + ". Against the start model: " + "; ".join(f"{name}: {short(test, 'trained', 'start')}"
                                                  for name, test in svt["tests"]["against_start"].items()) + "."
        + (f" The paper's two best networks, which it finds on par: Siamese cosine {models['siamese-cosine']['scores']['ndcg@10']:.4f}, "
           f"Triplet euclidean at margin 5 {models['triplet-euclidean-margin5']['scores']['ndcg@10']:.4f}, "
           f"{short(svt['tests']['on_par'], 'Siamese cosine', 'Triplet euclidean')}." if "on_par" in svt["tests"] else "")
        + " 3 epochs against 2: " + "; ".join(f"{pair.split(':')[0]}: {short(test, '3 epochs', '2 epochs')}"
                                             for pair, test in epochs["tests"].items()) + ". "
        "[results](bench/studies/siamese-vs-triplet/results.md)",
        "",
        "**Embedding size** (Bagge et al., SRoBERTa), NDCG@10, each D against the base model: "
        + "; ".join(f"D = {dim}: {short(test, f'D = {dim}', 'base')}" for dim, test in size["tests"]["against_base"].items())
        + "; against the untrained start model: "
        + "; ".join(f"D = {dim}: {short(test, f'D = {dim}', 'start')}" for dim, test in size["tests"]["against_start"].items())
        + ". The paper's base model beats every projection on top-1 accuracy, which is not NDCG@10. "
        "[results](bench/studies/embedding-size/results.md)",
        "",
        "**SBERT's objectives** (Reimers and Gurevych, section 3), each against the start model, on STS-B (Spearman "
        "of the seeds' ensemble; the mean of the seeds' differences beside it) and on SciFact (NDCG@10): "
        + "; ".join(f"{name}: STS-B {short(tests['spearman'], 'trained', 'start')}, seeds' mean "
                    f"{tests['spearman']['seed_level']['difference']:+.4f}; SciFact {short(tests['ndcg@10'], 'trained', 'start')}"
                    for name, tests in objectives["tests"].items() if name != "mnrl_vs_triplet")
        + ". MNRL against triplet: STS-B " + short(objectives["tests"]["mnrl_vs_triplet"]["spearman"], "MNRL", "triplet")
        + ", SciFact " + short(objectives["tests"]["mnrl_vs_triplet"]["ndcg@10"], "MNRL", "triplet") + ". "
        "[results](bench/studies/sbert-objectives/results.md)",
        "",
        "**Model selection** (Silveri, BEIR; " + selection_seeds(selection) + "), each candidate against the best by "
        f"NDCG@10, {selection['best']}: " + "; ".join(f"{name}: {short(test, name, 'best')}"
                                            for name, test in selection["tests"]["ndcg@10"].items()) + ". "
        "[results](bench/studies/model-selection/results.md)",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None):
    argparse.ArgumentParser(prog="python -m minisbert.experiments summary", description=__doc__).parse_args(argv)
    print(paragraphs(), end="")
