"""Siamese vs. Triplet networks for retrieval, after Rygaard, Bramsløw, Jensen and Bagger, "Distance
Dilemma: Siamese vs. Triplet SBERT Networks for Information Retrieval" (DTU).

    python -m minisbert.experiments siamese-vs-triplet            # SciFact (see PRESETS for the budget)
    python -m minisbert.experiments siamese-vs-triplet --quick    # data/example: a minute or two
    python -m minisbert.experiments siamese-vs-triplet --margins 1 --seeds 3 --output runs/margin-1

The paper trains four networks from one start model, on the same data with the same budget, and
evaluates each with the measure it was trained with (section 3.1):

    Siamese, cosine       MSE between y and max(cos(q, v), 0)                     (eq. 1)
    Siamese, euclidean    MSE between 1 - y and ||q - v||                         (eq. 2)
    Triplet, euclidean    max(||q - p|| - ||q - n|| + margin, 0)                  (eq. 3)
    Triplet, cosine       max((1 - cos(q, p)) - (1 - cos(q, n)) + margin, 0)      (eq. 4)

with margin 5 (section 2.3.2). Its networks end at mean pooling, with no normalisation (section 2.2),
so the euclidean losses see distances of any size; the start model's normalisation is switched off
for training for the same reason. The paper's finding (sections 4.1, 5.2): the Siamese network does
best with cosine similarity, the Triplet network with euclidean distance, and Triplet-cosine is
clearly the worst of the four.

Margins: cosine distances lie in [0, 2], so with margin 5 the cosine triplet loss can never reach 0
and every triplet pushes with the same weight whatever the model does. The paper's own discussion
(section 5.1) asks whether the margin should be tuned; here the Triplet networks are trained at each
of --margins (by default 0.2, which cosine distances can reach, 1, SBERT's, and 5, the paper's), so
a margin the loss can reach stands beside the ones it cannot.

The paper trains on MS MARCO: a query, its positive passage and a hard negative, with cross-encoder
scores squashed by a sigmoid as the Siamese labels. A folder with MS MARCO's training files
(training_data.msmarco_examples) and its BEIR layout (corpus.jsonl, queries.jsonl, qrels/test.tsv) is read
that way. Here, by default, the data is SciFact (BEIR): one triplet per judged (query, relevant
abstract) of the train split, its negative drawn from the start model's top 10 abstracts that are not
judged relevant, mined once and shared by all models; the Siamese networks see each triplet as two
pairs labelled 1 and 0. The controls share the table: the start model untrained, scored with cosine
and with euclidean distance (each trained model is tested against the start scored with its own
measure), and BM25.

Every claim is tested query by query (significance.py, through runner.py): each trained model
against the start model, and the cosine against the euclidean network of each architecture, with
--seeds N training every model N times (the tests then use each query's NDCG@10 averaged over seeds).

Writes to OUTPUT (runner.py describes the folder):
    results.md       the paper's table (Precision, Accuracy, MRR, NDCG at 1, 5, 10) per model, each
                     trained model's tested difference from the start model, training time, examples
                     and steps, and the verdicts on the paper's finding
    results.json     every number above, each query's scores, each step's loss, the PCA coordinates
    loss.png         the training loss of every model, first seed (the paper's Fig. 3)
    pca.png          a PCA fitted on the normalised embeddings of every test triplet (query, relevant
                     document, mined negative), five triplets drawn with a fixed seed, one panel per
                     model, first seed (the paper's Fig. 2B)
    differences.png  each trained model's NDCG@10 difference from the start model, with its 95% interval
Checked in tests/test_experiments.py.
"""

import functools
import random

import numpy as np

from .. import datasets
from ..datasets import what_data
from ..fit import TrainingSettings
from ..losses import select_loss
from ..training_data import SCORED, TRIPLETS, training_examples
from . import figures, records, runner, verdicts
from .pca import fit_pca

NAME = "siamese-vs-triplet"
MAIN_METRIC, MAIN_LABEL = "ndcg@10", "NDCG@10"
BASELINE_LABELS = {"untrained": "start model, untrained", "untrained-euclidean": "start model, untrained",
                   "bm25": "BM25"}
# The full preset: every SciFact training triplet (919) for 2 epochs at SBERT's learning rate of 2e-5,
# decaying linearly as fit() does after its warmup, batch 16: 116 steps for a Triplet network, 230 for
# a Siamese one, which sees two pairs per triplet (minutes per seed on 2 cores: the README). The
# paper trains 3 epochs (section 2.4): --epochs 3. The paper's own data (MS MARCO, batch 64) is
# --data FOLDER --batch-size 64 --max-seq-length 256 on a GPU.
PRESETS = {
    "full": {"data": "scifact", "model": "all-MiniLM-L6-v2", "examples": None, "epochs": 2, "batch_size": 16,
             "max_seq_length": 128, "lr": 2e-5, "margins": [0.2, 1.0, 5.0], "seed": 42, "seeds": 1},
    "quick": {"data": "example", "model": "all-MiniLM-L6-v2", "examples": None, "epochs": 2, "batch_size": 4,
              "max_seq_length": 128, "lr": 2e-5, "margins": [1.0, 5.0], "seed": 42, "seeds": 1},
}
PCA_TRIPLETS = 5  # drawn from the test triplets with the seed, the same five in every panel
PAPER_MARGIN = 5.0  # the paper's triplet margin (section 2.3.2)
PAPER_HOURS = {"Siamese": 11, "Triplet": 15}  # the paper's training time for 3 epochs on a V100 (sections 4.2, 6)


def networks(margins: list) -> list:
    """(name, label, arch, measure, margin) of every model trained: the two Siamese networks, then the
    two Triplet networks at each margin. Each retrieves with the measure it was trained with."""
    siamese = [("siamese-cosine", "Siamese cosine", "siamese", "cosine", None),
               ("siamese-euclidean", "Siamese euclidean", "siamese", "euclidean", None)]
    return siamese + [(f"triplet-{measure}-margin{margin:g}", f"Triplet {measure}, margin {margin:g}", "triplet",
                       measure, margin) for margin in margins for measure in ("euclidean", "cosine")]


def parse_args(argv=None):
    p = runner.parser(NAME, __doc__, PRESETS)
    p.add_argument("--margins", "--margin", type=float, nargs="+", default=None,
                   help="triplet margins, one pair of Triplet networks each (default 0.2, 1 and 5)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default 2e-5)")
    runner.training_options(p, "training triplets, drawn with the seed (the Siamese models get two pairs from each)")
    runner.seeds_option(p)
    args = runner.parse(p, argv)
    if args.margins is not None and min(args.margins) < 0:
        p.error(f"--margins cannot be negative, got {args.margins}")
    return args


def main(argv=None):
    args = parse_args(argv)
    s = runner.settings_from(args, PRESETS, NAME)

    @functools.cache
    def data():
        """The start model; training triplets and pairs from the same queries and negatives; the test
        split, its triplets and the ones the PCA draws. --report-only never calls it, so that it
        loads nothing."""
        start = runner.load_model(s.model, args.device, s.max_seq_length)
        triplets, pairs = training_sets(s, start)
        test, test_triplets = runner.mined_triplets(s.data, "test", start, s.seed)
        drawn = sorted(random.Random(s.seed).sample(range(len(test_triplets)), min(PCA_TRIPLETS, len(test_triplets))))
        print(f"{len(triplets):,} training triplets ({len(pairs):,} pairs), {len(test.queries):,} test queries, "
              f"{len(test.corpus):,} documents")
        return start, triplets, pairs, test, test_triplets, drawn

    if not args.report_only:  # a bad model or data stops here, before the output folder is written
        data()
    study = runner.Study(runner.output_folder(args, NAME), NAME, s, args.report_only, args.device)

    def start_scores(folder):
        start, _, _, test, test_triplets, drawn = data()
        return {"measure": "cosine", **runner.retrieval_scores(start, test, "cosine"),
                "pca": embedding_pca(start, test, test_triplets, drawn)}

    # The controls: BM25, and the start model untrained, scored with each measure.
    results = {
        "bm25": study.entry("bm25", lambda folder: {"measure": "bm25", **runner.retrieval_scores("bm25", data()[3])}),
        "untrained": study.entry("untrained", start_scores),
        "untrained-euclidean": study.entry("untrained-euclidean", lambda folder: {
            "measure": "euclidean", **runner.retrieval_scores(
                unnormalised(runner.load_model(s.model, args.device, s.max_seq_length)), data()[3], "euclidean")}),
    }
    # The networks: each trained from the start model with every seed, evaluated with its own measure.
    for name, _, arch, measure, margin in networks(s.margins):
        runs = []
        for seed in runner.seed_list(s):
            def train_and_evaluate(folder, arch=arch, measure=measure, margin=margin, seed=seed):
                _, triplets, pairs, test, test_triplets, drawn = data()
                model = unnormalised(runner.load_model(s.model, args.device, s.max_seq_length))
                settings = TrainingSettings(epochs=s.epochs, batch_size=s.batch_size, lr=s.lr, seed=seed,
                                            margin=1.0 if margin is None else margin,
                                            checkpoint_steps=runner.CHECKPOINT_STEPS)
                training = runner.train(model, pairs if arch == "siamese" else triplets, select_loss(arch, measure),
                                        folder, settings, run_inputs={"model": s.model, "data": s.data})
                return {"measure": measure, **runner.retrieval_scores(model, test, measure), "training": training,
                        "pca": embedding_pca(model, test, test_triplets, drawn)}
            runs.append(study.entry(f"{name}-seed{seed}", train_and_evaluate))
        results[name] = {"measure": measure, **runner.over_seeds(runs), "runs": runs}

    # The tests, the report, the figures.
    tests = claims(s, results)
    documents = len(datasets.load_beir(what_data(s.data).folder(), "test").corpus)
    markdown = report(s, study.about(), results, tests, len(results["untrained"]["per_query"][MAIN_METRIC]), documents,
                      study.run(), study.margin_record())
    if figures.available():
        draw(study.output, s, results, tests)
    else:
        markdown += f"\n{figures.MISSING}.\n"
    study.write_results({"settings": vars(s), "models": results, "tests": tests}, markdown)


def unnormalised(model):
    """The model with its final normalisation switched off: the paper's networks end at mean pooling."""
    model.normalize_embeddings = False
    return model


def training_sets(s, start) -> tuple:
    """(triplets, scored pairs): the pairs are (query, positive) and (query, negative) of each triplet,
    in the same order."""
    if (what_data(s.data).folder() / "collection.tsv").is_file():  # MS MARCO: labels from the cross-encoder
        triplets = training_examples(s.data, TRIPLETS, seed=s.seed)
        pairs = training_examples(s.data, SCORED, seed=s.seed)
    else:
        triplets = runner.mined_triplets(s.data, "train", start, s.seed)[1]
        pairs = runner.as_scored_pairs(triplets)
    kept = runner.subsample(list(range(len(triplets))), s.examples, s.seed)
    return [triplets[i] for i in kept], [pairs[j] for i in kept for j in (2 * i, 2 * i + 1)]


def embedding_pca(model, test, test_triplets: list, drawn: list) -> dict:
    """The first two principal components of the normalised embeddings of every test triplet, and
    the drawn triplets' coordinates in them."""
    corpus, row = runner.corpus_embeddings(model, test)
    queries = model.encode([t.texts[0] for t in test_triplets])  # (N, D)
    positives = corpus[[row[t.texts[1]] for t in test_triplets]]  # (N, D)
    negatives = corpus[[row[t.texts[2]] for t in test_triplets]]  # (N, D)
    queries, positives, negatives = (x / np.linalg.norm(x, axis=1, keepdims=True) for x in (queries, positives, negatives))
    pca = fit_pca(np.concatenate([queries, positives, negatives]), k=2)
    return {"explained": pca.explained_ratio.tolist(),
            **{role: pca.project(x[drawn]).tolist() for role, x in
               (("query", queries), ("positive", positives), ("negative", negatives))}}


def claims(s, results: dict) -> dict:
    """Every difference the report states, tested on NDCG@10 query by query and over seeds (with the
    equivalence test at verdicts.NDCG_MARGIN), each family Holm-adjusted: "against_start" (each network
    against the start model scored with its measure), "measures" (per architecture and margin: the
    cosine network against the euclidean one) and, at the paper's margin, "on_par" (Siamese cosine
    against Triplet euclidean, which the paper finds on par)."""
    trained = networks(s.margins)
    start = {"cosine": results["untrained"], "euclidean": results["untrained-euclidean"]}
    against_start = verdicts.family([verdicts.claim(results[name], start[measure], MAIN_METRIC, verdicts.NDCG_MARGIN)
                                   for name, _, _, measure, _ in trained])
    pairs = [("Siamese network", "siamese-cosine", "siamese-euclidean")] + [
        (f"Triplet network, margin {margin:g}", f"triplet-cosine-margin{margin:g}", f"triplet-euclidean-margin{margin:g}")
        for margin in s.margins]
    measures = verdicts.family([verdicts.claim(results[cos], results[euc], MAIN_METRIC, verdicts.NDCG_MARGIN)
                              for _, cos, euc in pairs])
    tests = {"against_start": {name: test for (name, *_), test in zip(trained, against_start)},
             "measures": {network: {"cosine": cos, "euclidean": euc, **test}
                          for (network, cos, euc), test in zip(pairs, measures)}}
    if PAPER_MARGIN in s.margins:  # the paper's two best networks, which it finds on par (section 4.1)
        tests["on_par"] = verdicts.family([verdicts.claim(results["siamese-cosine"],
                                                          results[f"triplet-euclidean-margin{PAPER_MARGIN:g}"],
                                                          MAIN_METRIC, verdicts.NDCG_MARGIN)])[0]
    return tests


def deviations(s, results: dict, run: dict) -> str:
    """The table of what this run does differently from Rygaard et al., and why; the device, time and
    seeds are the run's own (run.json and each model's training record)."""
    seconds = [r["training"]["seconds"] for name, *_ in networks(s.margins) for r in results[name]["runs"]]
    budget = "the preset's (made for 2 CPU cores), kept on the GPU; --data FOLDER with MS MARCO's files reads the paper's"
    rows = [
        ["training data", "MS MARCO: 125,000 training queries, a positive passage and the hard negatives of "
         "sentence-transformers' msmarco-hard-negatives (section 2.1)",
         f"{s.data}: one triplet per judged (query, relevant document) of the train split", budget],
        ["negatives", "MS MARCO's hard negatives, those within 3 (logits) of the positive's cross-encoder score "
         "dropped", "one of the start model's top 10 documents that is not judged relevant, mined once",
         "SciFact has no mined negatives"],
        ["Siamese labels", "cross-encoder scores through a sigmoid: continuous in (0, 1)",
         "1 for the judged document, 0 for the mined negative",
         "SciFact has no cross-encoder scores; the paper's note that continuous labels help the Siamese networks "
         "(section 5.2.1) cannot be checked here"],
        ["test data", "200 MS MARCO queries over about 8,800,000 passages", f"{s.data} test split",
         "the same as the training data"],
        ["start model", "DistilBERT, not yet a sentence encoder", f"{s.model}, already trained for sentence "
         "similarity", "the one BERT-family checkpoint these machines can fetch (the Hugging Face hub is unreachable "
         "from them); --model distilbert-base-uncased asks the paper's question where it is reachable"],
        ["device and time", "an NVIDIA V100; 3 epochs in about 11 hours (Siamese) and 15 (Triplet), section 4.2",
         f"{records.machines(run)}; {min(seconds) / 60:.1f} to {max(seconds) / 60:.1f} min a network",
         "the machine the models were made on (run.json)"],
        ["batch", "64", str(s.batch_size), "the preset's (made for 2 CPU cores), kept on the GPU; --batch-size 64"],
        ["epochs", "3", str(s.epochs), "the preset's (made for 2 CPU cores); --epochs 3"],
        ["triplet margin", "5 (1 tried for Triplet cosine, section 4.1)", ", ".join(f"{m:g}" for m in s.margins),
         "cosine distances cannot reach 5, and the paper asks whether the margin should be tuned (section 4.2)"],
        ["learning rate", "not stated; decaying linearly, gradients clipped", f"{s.lr:g}, warmup then linear decay, "
         "gradient norm clipped at 1", "SBERT's"],
        ["regularisation", "an L2 penalty on the weights (strength not stated)", "AdamW weight decay 0.01",
         "SBERT's"],
        ["text length", "not stated", f"{s.max_seq_length} tokens", "the preset's"],
        ["NDCG", "the ideal ranking holds 10 relevant passages, as every query is said to have at least 10",
         "the ideal ranking holds the query's judged documents (sentence-transformers' definition)",
         "SciFact judges 1 to 5 documents per query: the paper's ideal would cap every query's NDCG far below 1"],
        ["seeds", "not stated", ", ".join(map(str, runner.seed_list(s))),
         "training variance: the t over the seeds stands beside each per-query test"],
    ]
    return runner.deviation_table(rows)


def same_networks(s, results: dict) -> list:
    """(name, name of the earlier network it equals, the margins' difference or None): networks whose
    NDCG@10 is the same on every query in every seed. For two Triplet networks of one measure that
    differ only in margin, the difference of margins is given where every step's loss differs by
    exactly it: the hinge was never switched off at either margin, so the gradients, and the network,
    are the same."""
    trained = networks(s.margins)
    found = []
    for i, (name, _, arch, measure, margin) in enumerate(trained):
        for other, _, other_arch, other_measure, other_margin in trained[:i]:
            if verdicts.identical(results[name], results[other], MAIN_METRIC):
                shift = None
                if (arch, measure) == (other_arch, other_measure) == ("triplet", measure) and margin != other_margin:
                    gaps = [np.subtract(r["training"]["loss"], q["training"]["loss"])
                            for r, q in zip(results[name]["runs"], results[other]["runs"])]
                    if all(np.allclose(gap, margin - other_margin, atol=1e-4) for gap in gaps):
                        shift = margin - other_margin
                found.append((name, other, shift))
                break
    return found


def report(s, about: str, results: dict, tests: dict, num_queries: int, num_documents: int, run: dict,
           margin_record: str) -> str:
    trained = networks(s.margins)
    seeds = runner.seed_list(s)
    rows = [(label, results[name]) for name, label, *_ in trained] + [
        (f"{BASELINE_LABELS[name]} ({results[name]['measure']})" if name != "bm25" else "BM25", results[name])
        for name in ("untrained", "untrained-euclidean", "bm25")]
    every_test = list(tests["against_start"].values()) + list(tests["measures"].values()) + (
        [tests["on_par"]] if "on_par" in tests else [])
    labels = {name: label for name, label, *_ in trained}
    same = [f"{labels[name]} and {labels[other]} are one network: their NDCG@10 is equal on every query in every "
            "seed" + (f", and every step's loss is {shift:g} higher, the difference of the margins: the cosine "
                      "distances never brought the hinge to 0 at either margin, so both were trained by the same "
                      "gradients" if shift is not None else "") + ". It is tested once (Holm counts it once)."
            for name, other, shift in same_networks(s, results)]
    copies = {name: other for name, other, _ in same_networks(s, results)}
    lines = [
        "# Siamese vs. Triplet networks for retrieval",
        "",
        "After Rygaard, Bramsløw, Jensen and Bagger, \"Distance Dilemma: Siamese vs. Triplet SBERT Networks "
        "for Information Retrieval\". Networks trained from the same start model on the same data, each "
        "retrieving with the measure it was trained with.",
        "",
        f"Data: {s.data}, train -> test; {results[trained[-1][0]]['runs'][0]['training']['examples']:,} training "
        f"triplets (hard negatives mined once with the start model; the Siamese networks see each triplet as two "
        f"pairs labelled 1 and 0), {num_queries:,} test queries over {num_documents:,} documents. Start model "
        f"{s.model}, normalisation off for training; at most {s.max_seq_length} tokens per text; {s.epochs} "
        f"epoch(s), batch {s.batch_size}, learning rate {s.lr:g}, triplet margins {', '.join(f'{m:g}' for m in s.margins)}; "
        f"seeds {', '.join(map(str, seeds))} (every number of a trained network is the mean over its seeds). " + about,
        "",
        runner.markdown_table(["model", "measure"] + runner.metric_header(),
                              [[label, r["measure"]] + runner.metric_cells(r["scores"]) for label, r in rows]),
        f"Each network against the start model scored with the same measure, {MAIN_LABEL} query by query: the "
        f"mean difference, its bootstrap 95% interval (unadjusted) and the randomization test's p, Holm-adjusted "
        f"over the {len(trained) - len(same)} distinct networks: per query, given these seeds"
        + (f"; \"over seeds\" the 95% interval and Holm-adjusted p of a t over the {len(seeds)} seeds' own differences "
           f"({len(seeds) - 1} degrees of freedom: it detects only large, consistent differences); ± is the standard "
           "deviation over the seeds, and \"seeds\" the range of the seeds' own differences" if len(seeds) > 1 else "")
        + ". " + verdicts.largest_error(every_test),
        "",
        *[line for sentence in same for line in (sentence, "")],
        runner.markdown_table(
            ["model", MAIN_LABEL, "difference from the start model", "loss, first step", "loss, last step",
             "training time", "examples", "steps"],
            [[label, runner.mean_cell(results[name], MAIN_METRIC),
              f"one network with {labels[copies[name]]}" if name in copies else
              verdicts.difference_cell(tests["against_start"][name]),
              f"{np.mean([r['training']['loss'][0] for r in results[name]['runs']]):.4f}",
              f"{np.mean([r['training']['loss'][-1] for r in results[name]['runs']]):.4f}",
              runner.minutes(np.mean([r["training"]["seconds"] for r in results[name]["runs"]])),
              f"{results[name]['runs'][0]['training']['examples']:,}", f"{results[name]['runs'][0]['training']['steps']:,}"]
             for name, label, *_ in trained]),
        finding(s, results, tests),
        "",
        "**Equivalence margin**: " + verdicts.MARGIN_REASON + ". A network whose equivalence test (two one-sided "
        f"t-tests, Holm-adjusted) puts its difference within ±{verdicts.NDCG_MARGIN:g} is called equivalent; one whose "
        "tests can tell neither way is called not detectable, with its interval; \"bound\" is the smallest margin at "
        "which the equivalence test would hold. " + margin_record,
        "",
        "## Where this run departs from the paper",
        "",
        deviations(s, results, run),
        against_the_paper(s, results, tests),
        "",
        "Figures: loss.png (training loss per step, first seed; Siamese on a log scale, Triplet on a linear one), "
        "pca.png (PCA of the normalised test-triplet embeddings, five triplets, first seed), differences.png (each "
        "network's NDCG@10 difference from the start model: the bar the unadjusted 95% interval, the dot filled "
        f"where the Holm-adjusted p is below 0.05, each seed's own difference below it, the ±{verdicts.NDCG_MARGIN:g} "
        "margin as a grey band).",
        "",
    ]
    return "\n".join(lines)


def finding(s, results: dict, tests: dict) -> str:
    """The paper's finding (Siamese prefers cosine, Triplet prefers euclidean) against this run's
    tests, and what each network's test against the start model says."""
    lines = [f"**Against the paper's finding** (Siamese prefers cosine, Triplet prefers euclidean), {MAIN_LABEL}, "
             f"p Holm-adjusted over the {len(tests['measures'])} comparisons:", ""]
    for network, test in tests["measures"].items():
        lines.append(f"- {network}: {verdicts.verdict(test, MAIN_LABEL, 'cosine', 'euclidean', p_key='p_holm')}: "
                     f"{agreement(network, test)}.")
    lines += ["", "**Each network against the start model** (Holm-adjusted over the networks):", ""]
    labels = {name: label for name, label, *_ in networks(s.margins)}
    copies = {name: other for name, other, _ in same_networks(s, results)}
    lines += [f"- {labels[name]}: one network with {labels[copies[name]]} (above)." if name in copies else
              f"- {labels[name]}: {verdicts.verdict(test, MAIN_LABEL, 'trained', 'start model', p_key='p_holm')}."
              for name, test in tests["against_start"].items()]
    return "\n".join(lines)


def agreement(network: str, test: dict, level: str = "per query") -> str:
    """How the test of cosine - euclidean (p_holm) stands to the paper's preference for this architecture."""
    expected = 1 if network.startswith("Siamese") else -1
    word, sign = verdicts.outcome(test, "p_holm", level)
    if word == "prefers":
        return "as the paper finds" if sign == expected else "the opposite of the paper"
    over_seeds = "seed_level" in test and level == "per query" and verdicts.outcome(test, "p_holm", "over seeds")
    if over_seeds and over_seeds[0] == "prefers":
        return ("the paper's preference is not reproduced per query, though the t over the seeds "
                + ("finds it" if over_seeds[1] == expected else "finds the opposite"))
    return "the paper's preference is not reproduced here"


def against_the_paper(s, results: dict, tests: dict) -> str:
    """Every place where this run's results and the paper's part, generated from the tests and the
    runs' records, with both numbers where the paper gives them."""
    siamese = tests["measures"]["Siamese network"]
    lines = ["", "**Where the results part from the paper.**", ""]
    if verdicts.outcome(siamese, "p_holm")[0] == "prefers":
        lines.append(
            f"- The paper's Siamese network shows little preference between the measures (cosine slightly better, "
            f"section 5.2.1). Here Siamese euclidean reaches {MAIN_LABEL} "
            f"{results['siamese-euclidean']['scores'][MAIN_METRIC]:.4f} against cosine's "
            f"{results['siamese-cosine']['scores'][MAIN_METRIC]:.4f}: "
            f"{verdicts.verdict(siamese, MAIN_LABEL, 'cosine', 'euclidean', 'p_holm')}. What may explain it (a reading, "
            "not tested here): the paper's labels are continuous and its start model is DistilBERT, whose distances the "
            "euclidean loss (target 1 - y) can bring to scale; here the labels are 1 and 0 and the start model's "
            "unnormalised embeddings lie several units apart, so the first steps shrink the whole space (loss.png).")
    for network, test in tests["measures"].items():
        if network.startswith("Triplet") and agreement(network, test) != "as the paper finds":
            lines.append(f"- The paper finds that the Triplet network strongly prefers euclidean distance (sections 4.1, "
                         f"5.2.2, at margin {PAPER_MARGIN:g}). {network}: "
                         f"{verdicts.verdict(test, MAIN_LABEL, 'cosine', 'euclidean', 'p_holm')}: {agreement(network, test)}.")
    if "on_par" in tests and verdicts.outcome(tests["on_par"], "p_holm")[0] != "equivalent":
        euclidean = f"triplet-euclidean-margin{PAPER_MARGIN:g}"
        lines.append(f"- The paper finds its two best networks, Siamese cosine and Triplet euclidean at margin "
                     f"{PAPER_MARGIN:g}, on par (section 4.1). Here they reach {results['siamese-cosine']['scores'][MAIN_METRIC]:.4f} "
                     f"and {results[euclidean]['scores'][MAIN_METRIC]:.4f}: "
                     f"{verdicts.verdict(tests['on_par'], MAIN_LABEL, 'Siamese cosine', 'Triplet euclidean', 'p_holm')}.")
    minutes = {arch: np.mean([r["training"]["seconds"] for name, _, a, *_ in networks(s.margins) if a == arch.lower()
                              for r in results[name]["runs"]]) / 60 for arch in PAPER_HOURS}
    if minutes["Siamese"] >= minutes["Triplet"]:
        steps = {arch: results[name]["runs"][0]["training"]["steps"] for name, _, a, *_ in networks(s.margins)
                 for arch in PAPER_HOURS if a == arch.lower()}
        lines.append(f"- The paper's Siamese network trains faster: about {PAPER_HOURS['Siamese']} hours for 3 epochs "
                     f"against {PAPER_HOURS['Triplet']} for the Triplet network (sections 4.2, 6). Here a Siamese network "
                     f"takes {minutes['Siamese']:.1f} min against the Triplet's {minutes['Triplet']:.1f} (mean over networks "
                     f"and seeds): it sees each triplet as two pairs, {steps['Siamese']:,} steps against "
                     f"{steps['Triplet']:,}.")
    euclidean = f"triplet-euclidean-margin{PAPER_MARGIN:g}"
    if euclidean in results:
        last = np.mean([r["training"]["loss"][-1] for r in results[euclidean]["runs"]])
        if last > PAPER_MARGIN / 10:
            lines.append(f"- The paper's Triplet euclidean network at margin {PAPER_MARGIN:g} brings its loss very close "
                         f"to zero (section 4.2). Here its last step's loss is {last:.4f} (mean over the seeds).")
    return "\n".join(lines)


def draw(output, s, results: dict, tests: dict) -> None:
    """loss.png and pca.png from each network's first seed, differences.png from the tests."""
    trained = networks(s.margins)
    figures.loss_curves(output / "loss.png", {
        arch.capitalize(): {label: results[name]["runs"][0]["training"]["loss"] for name, label, a, *_ in trained
                            if a == arch} for arch in ("siamese", "triplet")},
        log_scale={"Siamese"})  # MSE on cosines beside MSE on distances: two scales, in every run alike
    panels = {"start model, untrained": results["untrained"]["pca"]}
    panels.update({label: results[name]["runs"][0]["pca"] for name, label, *_ in trained})
    figures.pca_panels(output / "pca.png", panels)
    figures.differences(output / "differences.png", {label: tests["against_start"][name] for name, label, *_ in trained},
                        f"{MAIN_LABEL} difference from the start model (95% CI)", verdicts.NDCG_MARGIN)
