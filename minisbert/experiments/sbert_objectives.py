"""Sentence-BERT's training objectives side by side, after Reimers and Gurevych, "Sentence-BERT:
Sentence Embeddings using Siamese BERT-Networks" (2019), section 3.

    python -m minisbert.experiments sbert-objectives             # STS-B, SICK, SciFact (see PRESETS)
    python -m minisbert.experiments sbert-objectives --quick     # a few steps each, data/example for retrieval

Models from the same start model, each trained with one objective on the data it was made for:

    classification   softmax(W [u; v; |u - v|]) with cross-entropy, on SICK's entailment labels
                     (train split: entailment, neutral, contradiction); W is thrown away afterwards
    regression       MSE between the cosine of u and v (clamped at 0, see training/losses.py) and the gold
                     score, on STS-B's train pairs (scores divided by 5)
    triplet          max(||a - p|| - ||a - n|| + 1, 0), SBERT's triplet objective (section 3, euclidean
                     distance, margin 1), on (query, relevant document, hard negative) triplets of the
                     retrieval data's train split, the negatives mined once with the start model
    MNRL             multiple-negatives ranking (Henderson et al. 2017) on the same triplets: beyond
                     SBERT's paper, which has no such objective; it is here as what retrieval
                     training uses today

and every model, the untrained start model too, is scored on both kinds of task: STS-B test (Spearman
correlation of cosine similarity with the gold scores, SBERT section 4.1) and the retrieval data's
test split (NDCG@10, cosine). The table shows what each objective buys, and what it costs on the
task it was not trained for. Each objective comes with its own data, as in the paper, so objective
and training data are confounded: a row says what this objective on this data does, not what the
objective alone does (only triplet and MNRL share their data).

Every difference from the start model is tested once, over the seeds and the STS-B pairs or the
queries together (significance.spearman_crossed for the mean over seeds of each seed's Spearman
difference, significance.crossed_t for NDCG@10; verdicts.py), the p Holm-adjusted over the objectives; --seeds N trains each objective N times.

Writes to OUTPUT (runner.py describes the folder): results.md (the table), results.json.
Checked in tests/experiments/test_experiments.py.
"""

import functools

import numpy as np
import torch

from .. import datasets
from ..evaluation import significance
from ..evaluation.benchmark import sts_similarities
from ..training.fit import TrainingSettings
from ..training.losses import SoftmaxClassifier, select_loss
from ..evaluation.correlation import spearman
from ..training.training_data import Example
from . import records, runner, verdicts

NAME = "sbert-objectives"
# name -> (label, the loss's (arch, metric, loss), training data)
OBJECTIVES = {
    "classification": ("classification (softmax)", ("siamese", "cosine", "softmax"), "SICK train, entailment labels"),
    "regression": ("regression (cosine MSE)", ("siamese", "cosine", None), "STS-B train, scores / 5"),
    "triplet": ("triplet (euclidean, margin 1)", ("triplet", "euclidean", None), "retrieval train split, mined triplets"),
    "mnrl": ("MNRL, hard negatives (beyond SBERT's paper)", ("triplet", "cosine", "mnrl"),
             "retrieval train split, mined triplets"),
}
# examples: at most this many training examples per objective, drawn with the seed. The full preset
# takes about 30 minutes on 2 CPU cores.
PRESETS = {
    "full": {"data": "scifact", "stsb": "stsb", "sick": "sick", "model": "all-MiniLM-L6-v2", "examples": 1024,
             "epochs": 1, "batch_size": 16, "max_seq_length": 128, "lr": 2e-5, "seed": 42, "seeds": 1},
    "quick": {"data": "example", "stsb": "stsb", "sick": "sick", "model": "all-MiniLM-L6-v2", "examples": 64,
              "epochs": 1, "batch_size": 16, "max_seq_length": 128, "lr": 2e-5, "seed": 42, "seeds": 1},
}


def parse_args(argv=None):
    p = runner.parser(NAME, __doc__, PRESETS)
    p.add_argument("--stsb", default=None, help="STS-B: the name stsb, or a folder with sts-{train,test}.csv")
    p.add_argument("--sick", default=None, help="SICK: the name sick, or a folder with SICK_train.txt ...")
    runner.training_options(p, "training examples per objective, drawn with the seed")
    runner.seeds_option(p)
    return runner.parse(p, argv)


def main(argv=None):
    args = parse_args(argv)
    s = runner.settings_from(args, PRESETS, NAME)
    # The two test sets every model is scored on (read, not encoded: --report-only needs their sizes and gold).
    sts_test = datasets.load_stsb("test", folder=named_or_folder(s.stsb, "stsb"))
    retrieval_test = datasets.load_beir(datasets.what_data(s.data).folder(), "test")

    @functools.cache
    def data():
        """(start model, each objective's training examples); --report-only never calls it."""
        start = runner.load_model(s.model, args.device, s.max_seq_length)
        sick = [Example((p.sentence1, p.sentence2), datasets.ENTAILMENT_LABELS.index(p.label))
                for p in datasets.load_sick("train", folder=named_or_folder(s.sick, "sick"))]
        stsb = [Example((p.sentence1, p.sentence2), datasets.to_unit_score("stsb", p.score))
                for p in datasets.load_stsb("train", folder=named_or_folder(s.stsb, "stsb"))]
        triplets = runner.mined_triplets(s.data, "train", start, s.seed)[1]
        return start, {name: runner.subsample(data, s.examples, s.seed) for name, data in
                       (("classification", sick), ("regression", stsb), ("triplet", triplets), ("mnrl", triplets))}

    if not args.report_only:  # a bad model or data stops here, before the output folder is written
        data()
    study = runner.Study(runner.output_folder(args, NAME), NAME, s, args.report_only, args.device)

    def scores(model) -> dict:
        cosine, gold = sts_similarities(model, sts_test)
        retrieval = runner.retrieval_scores(model, retrieval_test)
        return {"scores": {"spearman": spearman(cosine, gold), "ndcg@10": retrieval["scores"]["ndcg@10"]},
                "per_query": {"ndcg@10": retrieval["per_query"]["ndcg@10"]}, "sts_cosine": cosine.tolist()}

    # The models: the start model untrained, then one per objective and seed.
    results = {"untrained": study.entry("untrained", lambda folder: scores(data()[0]))}
    for name, (_, loss, _) in OBJECTIVES.items():
        def train_and_evaluate(folder, name=name, loss=loss, seed=None):
            model = runner.load_model(s.model, args.device, s.max_seq_length)
            classifier = None
            if name == "classification":
                torch.manual_seed(seed)  # its initial weights, whatever drew from torch's generator before
                classifier = SoftmaxClassifier(model.dimension, len(datasets.ENTAILMENT_LABELS)).to(model.device)
            settings = TrainingSettings(epochs=s.epochs, batch_size=s.batch_size, lr=s.lr, seed=seed, margin=1.0,
                                        checkpoint_steps=runner.CHECKPOINT_STEPS)
            training = runner.train(model, data()[1][name], select_loss(*loss), folder, settings,
                                    run_inputs={"model": s.model, "data": s.data}, classifier=classifier)
            return {**scores(model), "training": training}
        runs = [study.entry(f"{name}-seed{seed}", lambda folder, train_and_evaluate=train_and_evaluate, seed=seed:
                            train_and_evaluate(folder, seed=seed)) for seed in runner.seed_list(s)]
        results[name] = {**over_seeds(runs), "runs": runs}

    # The tests and the report.
    gold = np.array([p.score for p in sts_test], dtype=np.float64)
    tests = claims(results, gold)
    study.write_results({"settings": vars(s), "models": results, "tests": tests},
                        report(s, study.about(), results, tests, len(sts_test), retrieval_test, study.run(),
                               study.margin_record()))


def over_seeds(runs: list) -> dict:
    """runner.over_seeds, with the STS cosines averaged over the seeds too (the Spearman the tests use
    is that of the averaged cosines; the row's Spearman is the mean of the seeds' own)."""
    merged = runner.over_seeds(runs)
    spearmans = [r["scores"]["spearman"] for r in runs]
    merged["scores"]["spearman"] = float(np.mean(spearmans))
    merged["spread"]["spearman"] = float(np.std(spearmans, ddof=1)) if len(runs) > 1 else 0.0
    merged["sts_cosine"] = np.mean([r["sts_cosine"] for r in runs], axis=0).tolist()
    return merged


def claims(results: dict, gold: np.ndarray) -> dict:
    """Each objective against the start model: Spearman on STS-B test and NDCG@10 on the retrieval
    test split (with the equivalence test at verdicts.NDCG_MARGIN), each family Holm-adjusted over the
    objectives; and "mnrl_vs_triplet": the two objectives that share their data, against each other."""
    start = results["untrained"]
    spearmans = verdicts.family([spearman_claim(results[name], start, gold) for name in OBJECTIVES])
    ndcgs = verdicts.family([verdicts.claim(results[name], start, "ndcg@10", verdicts.NDCG_MARGIN) for name in OBJECTIVES])
    tests = {name: {"spearman": sp, "ndcg@10": nd} for name, sp, nd in zip(OBJECTIVES, spearmans, ndcgs)}
    mnrl, triplet = results["mnrl"], results["triplet"]
    tests["mnrl_vs_triplet"] = dict(zip(("spearman", "ndcg@10"), verdicts.family([
        spearman_claim(mnrl, triplet, gold), verdicts.claim(mnrl, triplet, "ndcg@10", verdicts.NDCG_MARGIN)])))
    return tests


def spearman_claim(a: dict, b: dict, gold: np.ndarray) -> dict:
    """The Spearman difference a - b on STS-B. The inference ("two_level"): the mean over the seeds of
    each seed's own Spearman difference (seed i against seed i, or against b's one network), with
    significance.spearman_crossed (the seeds' part, and the pairs' part from SPEARMAN_RESAMPLES draws). Beside it,
    conditional: significance.spearman_difference of the cosines averaged over the seeds (an ensemble of
    the seeds: the networks held fixed), and the seeds' own differences with the t over them."""
    test = significance.spearman_difference(a["sts_cosine"], b["sts_cosine"], gold,
                                            trials=verdicts.TRIALS, resamples=verdicts.SPEARMAN_RESAMPLES)
    test["p_randomization_error"] = significance.randomization_error(test["p_randomization"], len(gold), verdicts.TRIALS)
    test["ci95_error"] = verdicts.interval_error(test["ci95"], verdicts.SPEARMAN_RESAMPLES)
    ours, theirs = (np.array([r["sts_cosine"] for r in m.get("runs", []) if "sts_cosine" in r] or [m["sts_cosine"]])
                    for m in (a, b))  # (seeds, pairs) each
    if len(ours) != len(theirs) and 1 not in (len(ours), len(theirs)):
        raise ValueError(f"cannot pair {len(ours)} seeds with {len(theirs)}: give both models the same seeds")
    rows = max(len(ours), len(theirs))
    ours, theirs = (np.repeat(x, rows, axis=0) if len(x) == 1 else x for x in (ours, theirs))
    test["two_level"] = {**significance.spearman_crossed(ours, theirs, gold, resamples=verdicts.SPEARMAN_RESAMPLES),
                         "ci95_error": 0.0}
    if len(a.get("seeds", [])) > 1:
        ours, theirs = verdicts.paired_seeds(a, b, "spearman")
        test["seed_differences"] = [x - y for x, y in zip(ours, theirs)]
        test["seed_level"] = verdicts.seed_level(ours, theirs)
    return test


def deviations(s, results: dict, run: dict) -> str:
    """The table of what this run does differently from Reimers and Gurevych, and why; the device and
    time are the committed run's own (run.json and each model's training record)."""
    seconds = {f"{name}-seed{seed}": r["training"]["seconds"] for name in OBJECTIVES
               for seed, r in zip(runner.seed_list(s), results[name]["runs"])}
    rows = [
        ["start model", "BERT-base or RoBERTa-base, not yet a sentence encoder", f"{s.model}, already trained for "
         "sentence similarity", "the one BERT-family checkpoint these machines can fetch (the Hugging Face hub is "
         "unreachable from them); so the numbers here are not the paper's and are not set beside them"],
        ["classification data", "SNLI and MultiNLI, about 1 million pairs (section 4)", f"SICK train, at most "
         f"{s.examples:,} pairs", f"{records.preset_why(run)}; SICK has the same three entailment labels"],
        ["regression data", "STS-B train", f"STS-B train, at most {s.examples:,} pairs", "the preset's budget"],
        ["triplet data", "Wikipedia sections triplets (Dor et al.), section 4.4", f"{s.data}: mined (query, relevant "
         f"document, negative) triplets, at most {s.examples:,}", "a retrieval task to score the triplet objective on"],
        ["regression loss", "MSE on the cosine", "MSE on the cosine clamped at 0 (training/losses.py, as Rygaard et al.'s "
         "eq. 1)", "one Siamese cosine loss serves both studies; with STS-B scores in [0, 1] the clamp acts only "
         "where a cosine is negative"],
        ["triplet network's measure", "trained on euclidean distance (section 3); STS scored by cosine",
         "trained on euclidean distance, and scored by cosine on STS-B and on the retrieval split like every row",
         "one measure for every row; the triplet network's euclidean ranking is not measured here"],
        ["MNRL", "not in the paper", "on the triplets, the mined negative beside the in-batch ones",
         "what retrieval training uses today"],
        ["epochs", "1", str(s.epochs), "--epochs"],
        ["batch", "16", str(s.batch_size), "--batch-size"],
        ["learning rate", "2e-05, warmup over 10% of the steps", f"{s.lr:g}, warmup over 10% of the steps", "--lr"],
        ["metric", "STS: Spearman of cosine with the gold scores", "the same, and NDCG@10 on a retrieval test split",
         "what each objective costs on the task it was not trained for"],
        ["device and time", "not stated", records.minutes(run, seconds), records.time_why(run)],
        ["seeds", "not stated", ", ".join(map(str, runner.seed_list(s))), "training variance: every test draws the seeds "
         "as well as the pairs or queries"],
    ]
    return runner.deviation_table(rows)


def report(s, about: str, results: dict, tests: dict, sts_pairs: int, retrieval_test, run: dict,
           margin_record: str) -> str:
    seeds = runner.seed_list(s)
    header = ["model", "trained on", "STS-B test Spearman", "difference from the start model",
              f"{s.data} test NDCG@10", "difference from the start model", "training time", "examples", "steps"]
    rows = [["start model, untrained", "-", f"{results['untrained']['scores']['spearman']:.4f}", "-",
             f"{results['untrained']['scores']['ndcg@10']:.4f}", "-", "-", "-", "-"]]
    for name, (label, _, data) in OBJECTIVES.items():
        result, training = results[name], results[name]["runs"][0]["training"]
        rows.append([label, data, runner.mean_cell(result, "spearman"), verdicts.difference_cell(tests[name]["spearman"]),
                     runner.mean_cell(result, "ndcg@10"), verdicts.difference_cell(tests[name]["ndcg@10"]),
                     runner.minutes([r["training"]["seconds"] for r in result["runs"]]),
                     f"{training['examples']:,}", f"{training['steps']:,}"])
    ensemble = "Spearman (mean of the seeds' differences)" if len(seeds) > 1 else "Spearman"
    findings = [f"- {label}: on STS-B, {verdicts.verdict(tests[name]['spearman'], ensemble, 'trained', 'start', 'p_holm')}; "
                f"on {s.data}, {verdicts.verdict(tests[name]['ndcg@10'], 'NDCG@10', 'trained', 'start', 'p_holm')}."
                for name, (label, _, _) in OBJECTIVES.items()]
    pair = tests["mnrl_vs_triplet"]
    every_test = [t for name in OBJECTIVES for t in tests[name].values()] + list(pair.values())
    return "\n".join([
        "# Sentence-BERT's objectives",
        "",
        "After Reimers and Gurevych, \"Sentence-BERT\" (2019), section 3: the classification, regression and "
        "triplet objectives, and the multiple-negatives ranking loss beyond the paper, each from the same start "
        "model, each scored on STS and retrieval. Each objective trains on its own data, so objective and data are "
        "confounded (triplet and MNRL share theirs).",
        "",
        f"Start model {s.model}; at most {s.examples:,} training examples per objective, {s.epochs} epoch(s), batch "
        f"{s.batch_size}, learning rate {s.lr:g}, at most {s.max_seq_length} tokens per text, seeds "
        f"{', '.join(map(str, seeds))}; STS-B test: {sts_pairs:,} pairs; {s.data} test: "
        f"{len(retrieval_test.queries):,} queries over {len(retrieval_test.corpus):,} documents. " + about,
        "",
        "Differences from the start model, Holm-adjusted over the objectives: on STS-B the mean over the seeds of "
        "each seed's own Spearman difference (a Spearman is recomputed on every draw of pairs), on "
        f"{s.data} NDCG@10" + ("; ± is the standard deviation over the seeds" if len(seeds) > 1 else "")
        + f". {verdicts.method_text(every_test)} On STS-B the conditional per-pair figure is the randomization test "
        "of the seeds' ensemble (each pair's cosine averaged over the seeds).",
        "",
        runner.markdown_table(header, rows),
        "Tested against the start model (p Holm-adjusted):",
        "",
        *findings,
        "",
        "**MNRL against the triplet objective**, on the same triplets (Holm-adjusted over the two measures): on "
        f"STS-B, {verdicts.verdict(pair['spearman'], ensemble, 'MNRL', 'triplet', 'p_holm')}; on {s.data}, "
        f"{verdicts.verdict(pair['ndcg@10'], 'NDCG@10', 'MNRL', 'triplet', 'p_holm')}.",
        "",
        "**Equivalence margin** (NDCG@10 only; Spearman has no per-query equivalence test here): "
        + verdicts.MARGIN_REASON + ". " + margin_record,
        "",
        "**The paper's claims**, each beside what this run finds:",
        "",
        runner.claims_table(paper_claims()),
        "## Where this run departs from the paper",
        "",
        deviations(s, results, run),
        "The paper's numbers are not set beside these (another start model, other data), so no result here is said "
        "to agree or disagree with them.",
        "",
    ])


def paper_claims() -> list:
    """Reimers and Gurevych's claims beside this run (runner.claims_table's rows): none can be set beside a
    run that starts from a sentence encoder already and trains each objective on other data."""
    return [["each objective trained from BERT on its own data (NLI, STS-B, Wikipedia sections) gives the STS "
             "and evaluation figures of the paper's tables", "4", "Tables 1 to 4", "another start model "
             "(a sentence encoder already) and other data for three of the four objectives",
             runner.NOT_COMPARABLE]]


def named_or_folder(value: str, name: str):
    """None (find the named dataset the usual way) when `value` is the dataset's name, else the folder."""
    return None if value == name else value
