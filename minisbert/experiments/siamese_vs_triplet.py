"""Siamese vs. Triplet networks for retrieval, after Rygaard, Bramsløw, Jensen and Bagger, "Distance
Dilemma: Siamese vs. Triplet SBERT Networks for Information Retrieval" (DTU).

    python -m minisbert.experiments siamese-vs-triplet            # SciFact (see PRESETS for the budget)
    python -m minisbert.experiments siamese-vs-triplet --quick    # data/example: a minute or two
    python -m minisbert.experiments siamese-vs-triplet --margin 1 --output runs/margin-1

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

The paper trains on MS MARCO: a query, its positive passage and a hard negative, with cross-encoder
scores squashed by a sigmoid as the Siamese labels. A folder with MS MARCO's training files
(training_data.msmarco_examples) and its BEIR layout (corpus.jsonl, queries.jsonl, qrels/test.tsv) is read
that way. Here, by default, the data is SciFact (BEIR): one triplet per judged (query, relevant
abstract) of the train split, its negative drawn from the start model's top 10 abstracts that are not
judged relevant, mined once and shared by all four models; the Siamese networks see each triplet as
two pairs labelled 1 and 0. The baselines share the table: the start model untrained (cosine) and BM25.

Writes to OUTPUT (runner.py describes the folder):
    results.md    the paper's table (Precision, Accuracy, MRR, NDCG at 1, 5, 10) per model, training
                  time, examples and steps, and whether this run agrees with the paper's finding
    results.json  every number above, each step's loss, the PCA coordinates
    loss.png      the training loss of the four models (the paper's Fig. 3)
    pca.png       a PCA fitted on the normalised embeddings of every test triplet (query, relevant
                  document, mined negative), five triplets drawn with a fixed seed, one panel per
                  model (the paper's Fig. 2B)
Checked in tests/test_experiments.py.
"""

import random

import numpy as np

from ..datasets import what_data
from ..fit import TrainingSettings
from ..losses import select_loss
from ..training_data import SCORED, TRIPLETS, training_examples
from . import figures, runner
from .pca import fit_pca

NAME = "siamese-vs-triplet"
# (name, arch, measure): each model retrieves with the measure it was trained with.
MODELS = [("siamese-cosine", "siamese", "cosine"), ("siamese-euclidean", "siamese", "euclidean"),
          ("triplet-euclidean", "triplet", "euclidean"), ("triplet-cosine", "triplet", "cosine")]
LABELS = {"siamese-cosine": "Siamese cosine", "siamese-euclidean": "Siamese euclidean",
          "triplet-euclidean": "Triplet euclidean", "triplet-cosine": "Triplet cosine",
          "untrained": "start model, untrained", "bm25": "BM25"}
# The full preset is sized for about 45 minutes on 2 CPU cores; the paper's own budget (MS MARCO,
# 3 epochs, batch 64) is --data FOLDER --epochs 3 --batch-size 64 --max-seq-length 256 on a GPU.
PRESETS = {
    "full": {"data": "scifact", "model": "all-MiniLM-L6-v2", "examples": 256, "epochs": 1, "batch_size": 16,
             "max_seq_length": 128, "lr": 2e-5, "margin": 5.0, "seed": 42},
    "quick": {"data": "example", "model": "all-MiniLM-L6-v2", "examples": None, "epochs": 2, "batch_size": 4,
              "max_seq_length": 128, "lr": 2e-5, "margin": 5.0, "seed": 42},
}
PCA_TRIPLETS = 5  # drawn from the test triplets with the seed, the same five in every panel


def parse_args(argv=None):
    p = runner.parser(NAME, __doc__, PRESETS)
    p.add_argument("--margin", type=float, default=None, help="triplet margin (default 5, as the paper)")
    runner.training_options(p, "training triplets, drawn with the seed (the Siamese models get two pairs from each)")
    return runner.parse(p, argv)


def main(argv=None):
    args = parse_args(argv)
    s = runner.settings_from(args, PRESETS)
    start = runner.load_model(s.model, args.device, s.max_seq_length)
    study = runner.Study(runner.output_folder(args, NAME), NAME, s)

    # The data: training triplets and pairs from the same queries and negatives; test triplets for the PCA.
    triplets, pairs = training_sets(s, start)
    test, test_triplets = runner.mined_triplets(s.data, "test", start, s.seed)
    drawn = sorted(random.Random(s.seed).sample(range(len(test_triplets)), min(PCA_TRIPLETS, len(test_triplets))))
    print(f"{len(triplets):,} training triplets ({len(pairs):,} pairs), {len(test.queries):,} test queries, "
          f"{len(test.corpus):,} documents")

    # The baselines, then the four models: each trained from the start model and evaluated with its own measure.
    results = {
        "bm25": study.entry("bm25", lambda folder: {"measure": "bm25", "scores": runner.retrieval_scores("bm25", test)}),
        "untrained": study.entry("untrained", lambda folder: {
            "measure": "cosine", "scores": runner.retrieval_scores(start, test, "cosine"),
            "pca": embedding_pca(start, test, test_triplets, drawn)}),
    }
    settings = TrainingSettings(epochs=s.epochs, batch_size=s.batch_size, lr=s.lr, margin=s.margin, seed=s.seed,
                                checkpoint_steps=runner.CHECKPOINT_STEPS)
    for name, arch, measure in MODELS:
        def train_and_evaluate(folder, arch=arch, measure=measure):
            model = runner.load_model(s.model, args.device, s.max_seq_length)
            model.normalize_embeddings = False  # the paper's networks end at mean pooling
            training = runner.train(model, pairs if arch == "siamese" else triplets, select_loss(arch, measure),
                                    folder, settings, identity={"model": s.model, "data": s.data})
            return {"measure": measure, "scores": runner.retrieval_scores(model, test, measure), "training": training,
                    "pca": embedding_pca(model, test, test_triplets, drawn)}
        results[name] = study.entry(name, train_and_evaluate)

    # The report: the table, the finding, the figures.
    order = [name for name, _, _ in MODELS] + ["untrained", "bm25"]
    markdown = report(s, start, results, order, len(test.queries), len(test.corpus))
    if figures.available():
        figures.loss_curves(study.output / "loss.png", {
            arch.capitalize(): {LABELS[n]: results[n]["training"]["loss"] for n, a, _ in MODELS if a == arch}
            for arch in ("siamese", "triplet")})
        figures.pca_panels(study.output / "pca.png", {LABELS[n]: results[n]["pca"] for n in order if "pca" in results[n]})
    else:
        markdown += f"\n{figures.MISSING}.\n"
    study.write_results({"settings": vars(s), "models": results}, markdown)


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


def report(s, start, results: dict, order: list, num_queries: int, num_documents: int) -> str:
    trained = [name for name, _, _ in MODELS]
    first = results[trained[0]]["training"]
    lines = [
        "# Siamese vs. Triplet networks for retrieval",
        "",
        "After Rygaard, Bramsløw, Jensen and Bagger, \"Distance Dilemma: Siamese vs. Triplet SBERT Networks "
        "for Information Retrieval\". Four models trained from the same start model on the same data, each "
        "retrieving with the measure it was trained with.",
        "",
        f"Data: {s.data}, train -> test; {results['triplet-cosine']['training']['examples']:,} training triplets "
        f"(hard negatives mined once with the start model; the Siamese models see each triplet as two pairs "
        f"labelled 1 and 0), {num_queries:,} test queries over {num_documents:,} documents. Start model "
        f"{s.model}, normalisation off for training; at most {s.max_seq_length} tokens per text; {s.epochs} "
        f"epoch(s), batch {s.batch_size}, learning rate {s.lr:g}, triplet margin {s.margin:g}, seed {s.seed}. "
        + runner.about_the_run(s, start.device),
        "",
        runner.markdown_table(["model", "measure"] + runner.metric_header(),
                              [[LABELS[n], results[n]["measure"]] + runner.metric_cells(results[n]["scores"])
                               for n in order]),
        runner.markdown_table(["model", "training time", "examples", "steps", "loss, first step", "loss, last step"],
                              [[LABELS[n], runner.minutes(t["seconds"]), f"{t['examples']:,}", f"{t['steps']:,}",
                                f"{t['loss'][0]:.4f}", f"{t['loss'][-1]:.4f}"]
                               for n in trained for t in [results[n]["training"]]]),
        finding(results),
        "",
        f"Figures: loss.png (training loss per step, {first['steps']:,} steps for a Siamese model), pca.png (PCA of "
        "the normalised test-triplet embeddings, five triplets).",
        "",
    ]
    return "\n".join(lines)


def finding(results: dict) -> str:
    """Whether this run agrees with the paper: Siamese prefers cosine, Triplet prefers euclidean (by NDCG@10)."""
    ndcg = {name: results[name]["scores"]["ndcg@10"] for name, _, _ in MODELS}
    siamese = "cosine" if ndcg["siamese-cosine"] > ndcg["siamese-euclidean"] else "euclidean"
    triplet = "euclidean" if ndcg["triplet-euclidean"] > ndcg["triplet-cosine"] else "cosine"
    verdict = {(True, True): "agrees with the paper on both counts", (False, False): "agrees with neither",
               (True, False): "agrees on the Siamese network only", (False, True): "agrees on the Triplet network only"}
    return (f"**Against the paper's finding** (Siamese prefers cosine, Triplet prefers euclidean): by NDCG@10, the "
            f"Siamese network prefers {siamese} ({ndcg['siamese-cosine']:.4f} cosine vs "
            f"{ndcg['siamese-euclidean']:.4f} euclidean) and the Triplet network prefers {triplet} "
            f"({ndcg['triplet-euclidean']:.4f} euclidean vs {ndcg['triplet-cosine']:.4f} cosine): this run "
            f"{verdict[(siamese == 'cosine', triplet == 'euclidean')]}.")
