"""How small can sentence embeddings be? After Bagge, Topsøe and Rørhauge, "SRoBERTa yields similar
performance on duplicate question retrieval using reduced embedding sizes" (DTU).

    python -m minisbert.experiments embedding-size                # SciFact, D in 384 256 128 64 32 16
    python -m minisbert.experiments embedding-size --quick        # data/example, D in 64 16
    python -m minisbert.experiments embedding-size --dims 256 64 16 --margin 0.05

The paper puts a linear layer after mean pooling that maps the encoder's H dimensions to D, with no
activation (section 3), fine-tunes the whole network with the triplet loss on euclidean distance,
margin 0.05 (eq. 1), and retrieves with euclidean distance (section 3.2). On Quora duplicate
questions, accuracy falls only slowly as D shrinks while the time to compare embeddings falls with D
(sections 5, 6). Here: one model per D from the same start model (its normalisation switched off, as
the paper's network has none), trained on the same triplets (the retrieval data's train split,
negatives mined once with the start model; or, given a folder with Quora's
quora_duplicate_questions.tsv, the paper's own setup: runner.quora_data), and evaluated on the test
split:

- accuracy and NDCG at 1, 5 and 10, retrieving with euclidean distance;
- search speed: exact top-10 search (search.search), in queries per second, over the test corpus
  and over a larger corpus of random vectors, which shows how search time grows with D. Speeds are
  measured after all training, every D side by side in alternating rounds (the fastest round
  counts), so that a busy machine slows every D alike.

Baselines, as the paper's: the start model untrained (cosine, its own H dimensions) and the Jaccard
similarity of word sets. Writes results.md, results.json and dims.png (quality and speed against D).
Checked in tests/test_experiments.py.
"""

import numpy as np
import torch

from ..fit import TrainingSettings
from ..losses import select_loss
from ..pooling import Dense
from ..search import search
from . import figures, runner

NAME = "embedding-size"
PRESETS = {
    "full": {"data": "scifact", "model": "all-MiniLM-L6-v2", "dims": [384, 256, 128, 64, 32, 16], "examples": 256,
             "epochs": 1, "batch_size": 16, "max_seq_length": 128, "lr": 2e-5, "margin": 0.05,
             "synthetic": 100_000, "seed": 42},
    "quick": {"data": "example", "model": "all-MiniLM-L6-v2", "dims": [64, 16], "examples": None, "epochs": 2,
              "batch_size": 4, "max_seq_length": 128, "lr": 2e-5, "margin": 0.05, "synthetic": 5_000, "seed": 42},
}
SPEED_ROUNDS = 3
QUALITY = {"accuracy@1": "Accuracy@1", "accuracy@5": "Accuracy@5", "accuracy@10": "Accuracy@10",
           "ndcg@1": "NDCG@1", "ndcg@5": "NDCG@5", "ndcg@10": "NDCG@10"}
FIGURE_QUALITY = ["accuracy@1", "accuracy@10", "ndcg@10"]  # the lines of dims.png


def parse_args(argv=None):
    p = runner.parser(NAME, __doc__, PRESETS)
    p.add_argument("--dims", type=int, nargs="+", default=None, help="embedding sizes D, each at most the model's")
    p.add_argument("--margin", type=float, default=None, help="triplet margin (default 0.05, as the paper)")
    runner.training_options(p, "training triplets, drawn with the seed")
    p.add_argument("--synthetic", type=int, default=None, help="random vectors in the corpus timed beside the test corpus")
    args = runner.parse(p, argv)
    if args.dims is not None and min(args.dims) <= 0:
        p.error(f"--dims must be positive, got {args.dims}")
    return args


def main(argv=None):
    args = parse_args(argv)
    s = runner.settings_from(args, PRESETS)
    start = runner.load_model(s.model, args.device, s.max_seq_length)
    if start.dense is not None:
        raise ValueError(f"{s.model} already ends in a Dense layer (to {start.dimension} dimensions); start from a "
                         "model without one, which this experiment gives a projection to each D")
    if max(s.dims) > start.dimension:
        raise ValueError(f"--dims {max(s.dims)} is larger than the {start.dimension} dimensions of {s.model}: "
                         f"the projection reduces the size, so choose D <= {start.dimension}")
    study = runner.Study(runner.output_folder(args, NAME), NAME, s)

    # The data: training triplets and the test split, from Quora's duplicate questions as in the paper,
    # or from a retrieval dataset's train and test splits.
    quora = runner.holds_quora(s.data)
    if quora:
        triplets, test = runner.quora_data(s.data, s.seed)
    else:
        triplets = runner.mined_triplets(s.data, "train", start, s.seed)[1]
        test = runner.mined_triplets(s.data, "test", start, s.seed)[0]
    triplets = runner.subsample(triplets, s.examples, s.seed)
    print(f"{len(triplets):,} training triplets, {len(test.queries):,} test queries, {len(test.corpus):,} documents")

    # The baselines, then one model per D.
    results = {
        "jaccard": study.entry("jaccard", lambda folder: {"scores": runner.retrieval_scores("jaccard", test, exclude_self=quora)}),
        "untrained": study.entry("untrained", lambda folder: {"dim": start.dimension,
                                                                "scores": runner.retrieval_scores(start, test, exclude_self=quora)}),
    }
    settings = TrainingSettings(epochs=s.epochs, batch_size=s.batch_size, lr=s.lr, margin=s.margin, seed=s.seed,
                                checkpoint_steps=runner.CHECKPOINT_STEPS)
    for dim in s.dims:
        def train_and_evaluate(folder, dim=dim):
            model = runner.load_model(s.model, args.device, s.max_seq_length)
            model.normalize_embeddings = False  # the paper's network ends at the linear layer
            torch.manual_seed(s.seed)  # the projection starts from the same draw, whichever D ran before
            model.dense = Dense(model.dimension, dim, activation="identity").to(model.device)
            training = runner.train(model, triplets, select_loss("triplet", "euclidean"), folder, settings,
                                    identity={"model": s.model, "dim": dim, "data": s.data})
            scores = runner.retrieval_scores(model, test, "euclidean", exclude_self=quora)
            np.save(folder / "corpus.npy", runner.corpus_embeddings(model, test)[0])  # for the speed rounds
            np.save(folder / "queries.npy", model.encode(list(test.queries.values())))
            return {"dim": dim, "scores": scores, "training": training}
        results[f"d{dim}"] = study.entry(f"d{dim}", train_and_evaluate)
    speed = study.entry("search-speed", lambda folder: search_speed(study, s))

    # The report: the table and dims.png.
    names = [f"d{dim}" for dim in s.dims]
    rows = [[f"D = {results[n]['dim']}", "euclidean"] + [f"{results[n]['scores'][m]:.4f}" for m in QUALITY]
            + [f"{speed['test'][i]:,.0f}", f"{speed['synthetic'][i]:,.0f}", runner.minutes(results[n]["training"]["seconds"]),
               f"{results[n]['training']['steps']:,}"] for i, n in enumerate(names)]
    rows.append([f"start model, untrained (D = {start.dimension})", "cosine"]
                + [f"{results['untrained']['scores'][m]:.4f}" for m in QUALITY] + ["-"] * 4)
    rows.append(["Jaccard (words)", "jaccard"] + [f"{results['jaccard']['scores'][m]:.4f}" for m in QUALITY] + ["-"] * 4)
    markdown = "\n".join([
        "# Embedding size",
        "",
        "After Bagge, Topsøe and Rørhauge, \"SRoBERTa yields similar performance on duplicate question retrieval "
        "using reduced embedding sizes\": a linear projection to D dimensions after pooling, trained with the "
        "triplet loss on euclidean distance.",
        "",
        f"Data: {s.data}, train -> test; {len(triplets):,} training triplets ("
        + ("duplicate pairs split 80/15/5 %, negatives the questions the file judges not duplicates; each test question "
           "retrieves its duplicate from the pooled test questions, itself excluded" if quora else
           "negatives mined once with the start model")
        + f"), {len(test.queries):,} test queries over {len(test.corpus):,} documents. Start model {s.model}, "
        f"normalisation off for training; at most {s.max_seq_length} tokens per text; {s.epochs} epoch(s), batch "
        f"{s.batch_size}, learning rate {s.lr:g}, margin {s.margin:g}, seed {s.seed}. Search speed: exact top-10, "
        f"{len(test.queries):,} queries, over the test corpus and over {s.synthetic:,} random vectors, the fastest of "
        f"{SPEED_ROUNDS} alternating rounds. " + runner.about_the_run(s, start.device),
        "",
        runner.markdown_table(["model", "measure"] + [QUALITY[m] for m in QUALITY]
                              + ["queries/s, test corpus", f"queries/s, {s.synthetic:,} random", "training time", "steps"],
                              rows),
    ])
    if figures.available():
        figures.dims_figure(study.output / "dims.png", s.dims,
                            {QUALITY[m]: [results[n]["scores"][m] for n in names] for m in FIGURE_QUALITY},
                            {"test corpus": speed["test"], f"{s.synthetic:,} random vectors": speed["synthetic"]},
                            {QUALITY[m]: results["untrained"]["scores"][m] for m in FIGURE_QUALITY})
    else:
        markdown += f"\n{figures.MISSING}.\n"
    study.write_results({"settings": vars(s), "models": results, "search_speed": speed}, markdown)


def search_speed(study, s) -> dict:
    """Queries per second of exact top-10 euclidean search for each D, over the test corpus and over
    random vectors: the fastest of SPEED_ROUNDS rounds, each round timing every D in turn."""
    rng = np.random.default_rng(s.seed)
    corpora = {}
    for dim in s.dims:
        folder = study.output / "models" / f"d{dim}"
        queries = np.load(folder / "queries.npy")  # (Q, D)
        corpora[dim] = {"test": (queries, np.load(folder / "corpus.npy")),
                        "synthetic": (rng.standard_normal(queries.shape, dtype=np.float32),
                                      rng.standard_normal((s.synthetic, dim), dtype=np.float32))}
    fastest = {dim: {corpus: float("inf") for corpus in ("test", "synthetic")} for dim in s.dims}
    for _ in range(SPEED_ROUNDS):
        for dim in s.dims:
            for corpus, (queries, documents) in corpora[dim].items():
                seconds = runner.timed(search, queries, documents, 10, "euclidean", repeats=1)
                fastest[dim][corpus] = min(fastest[dim][corpus], seconds)
    return {corpus: [len(corpora[dim][corpus][0]) / fastest[dim][corpus] for dim in s.dims]
            for corpus in ("test", "synthetic")}
