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

Every claim is tested once, by the crossed t over the seeds and the queries (verdicts.py):
each trained model against the start model, and the cosine against the euclidean network of each
architecture, with --seeds N training every model N times.

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
The write-up and figures are made in siamese_vs_triplet_report.py. Checked in tests/experiments/test_experiments.py.
"""

import functools
import random

import numpy as np

from .. import datasets
from ..datasets import what_data
from ..training.fit import TrainingSettings
from ..training.losses import select_loss
from ..training.training_data import SCORED, TRIPLETS, training_examples
from . import figures, runner, verdicts
from .siamese_vs_triplet_report import MAIN_METRIC, PAPER_MARGIN, draw, report
from .pca import fit_pca

NAME = "siamese-vs-triplet"
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
    markdown = report(s, networks(s.margins), study.about(), results, tests, len(results["untrained"]["per_query"][MAIN_METRIC]), documents,
                      study.run(), study.margin_record())
    if figures.available():
        draw(study.output, networks(s.margins), results, tests)
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
    """Every difference the report states, tested on NDCG@10 over seeds and queries (with the
    equivalence test at verdicts.NDCG_MARGIN), each family Holm-adjusted: "against_start" (each network
    against the start model scored with its measure), "measures" (per architecture and margin: the
    cosine network against the euclidean one) and, at the paper's margin, "on_par" (Siamese cosine
    against Triplet euclidean, which the paper finds on par), "preferred" (Siamese cosine against each
    other network) and "poorest" (each other network against Triplet cosine): the paper's conclusions
    (section 6), keyed by the other network."""
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
        for key, network, first in (("preferred", "siamese-cosine", True),
                                    ("poorest", f"triplet-cosine-margin{PAPER_MARGIN:g}", False)):
            others = [name for name, *_ in trained if name != network]
            tests[key] = dict(zip(others, verdicts.family([verdicts.claim(
                *((results[network], results[other]) if first else (results[other], results[network])),
                MAIN_METRIC, verdicts.NDCG_MARGIN) for other in others])))
    return tests
