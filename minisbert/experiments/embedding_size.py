"""How small can sentence embeddings be? After Bagge, Topsøe and Rørhauge, "SRoBERTa yields similar
performance on duplicate question retrieval using reduced embedding sizes" (DTU).

    python -m minisbert.experiments embedding-size                # SciFact, D in 8 32 128 384 768
    python -m minisbert.experiments embedding-size --quick        # data/example, D in 4 8 16
    python -m minisbert.experiments embedding-size --dims 16 4 --seeds 3   # your own sizes, 3 seeds each

The paper puts a linear layer after mean pooling that maps the encoder's H dimensions to D, with no
activation (section 3), fine-tunes the whole network with the triplet loss on euclidean distance,
margin 0.05 (eq. 1), and retrieves with euclidean distance (section 3.2). Its Table 1 sets each D
beside the "base" model (the same network trained without the projection) and goes above the
encoder's width (D = 1024 from H = 768): top-1 accuracy 0.953 at D = 1024 against 0.959 for the base
model. On Quora duplicate questions, accuracy falls only slowly as D shrinks while the time to
compare embeddings falls with D (sections 5, 6).

Here: one model per D from the same start model (its normalisation switched off, as the paper's
network has none), trained on the same triplets (the retrieval data's train split, negatives mined
once with the start model; or, given a folder with Quora's quora_duplicate_questions.tsv, the
paper's own setup: runner.quora_data). The projection does not start from a random draw, which
would scramble the pretrained space before training begins: for D <= H it starts as the PCA of the
start model's embeddings of the training texts (y = V (x - mean), V the first D principal
directions), for D > H as the identity padded with zeros, and it trains at a learning rate of its
own (--projection-lr), the encoder at --lr. Rows:

- each D, trained, and its difference from the base model, tested over seeds and queries (Holm over the D);
- the untrained PCA projection at each D (the start model's embeddings projected, nothing trained):
  what the size alone costs before any training;
- the base model: trained the same way, with no projection;
- the start model untrained (cosine, and euclidean as the trained models retrieve), and the Jaccard
  similarity of word sets, the paper's baselines;
- search speed: exact top-10 search (search.search), in queries per second, over the test corpus
  and over a larger corpus of random vectors, which shows how search time grows with D. Speeds are
  measured after all training, every D side by side in alternating rounds (the fastest round
  counts), so that a busy machine slows every D alike.

Writes results.md, results.json and dims.png (quality and speed against D); the write-up is made in
embedding_size_report.py. Checked in tests/experiments/test_experiments.py.
"""

import functools

import numpy as np
import torch

from .. import datasets
from ..training.fit import TrainingSettings
from ..training.losses import select_loss
from ..encoding.pooling import Dense
from ..search.ways import search
from . import figures, runner, verdicts
from .embedding_size_report import GAP_METRIC, MAIN_LABEL, MAIN_METRIC, PAPER_ACCURACY, SPEED_ROUNDS, report
from .pca import fit_pca

NAME = "embedding-size"
# The full preset: every SciFact training triplet (919) for 3 epochs of batch 16 (174 steps; the paper
# trains 10 and saw it converge after about 2), one model per D (8 to twice the width, every fourfold
# step and the width itself) and the base model. The encoder's learning rate 2e-5, SBERT's; the
# projection's 3e-4 (minutes on 2 cores: the README). The quick preset's sizes stay below the
# 22 texts of data/example's training triplets: a PCA of n texts gives at most n directions.
PRESETS = {
    "full": {"data": "scifact", "model": "all-MiniLM-L6-v2", "dims": [8, 32, 128, 384, 768], "examples": None,
             "epochs": 3, "batch_size": 16, "max_seq_length": 128, "lr": 2e-5, "projection_lr": 3e-4,
             "margin": 0.05, "synthetic": 100_000, "seed": 42, "seeds": 1},
    "quick": {"data": "example", "model": "all-MiniLM-L6-v2", "dims": [4, 8, 16], "examples": None, "epochs": 2,
              "batch_size": 4, "max_seq_length": 128, "lr": 2e-5, "projection_lr": 1e-4, "margin": 0.05,
              "synthetic": 5_000, "seed": 42, "seeds": 1},
}


def parse_args(argv=None):
    p = runner.parser(NAME, __doc__, PRESETS)
    p.add_argument("--dims", type=int, nargs="+", default=None, help="embedding sizes D (above the model's width too)")
    p.add_argument("--margin", type=float, default=None, help="triplet margin (default 0.05, as the paper)")
    p.add_argument("--lr", type=float, default=None, help="the encoder's peak learning rate (default 2e-5)")
    p.add_argument("--projection-lr", type=float, default=None, help="the projection's peak learning rate (default 3e-4)")
    runner.training_options(p, "training triplets, drawn with the seed")
    runner.seeds_option(p)
    p.add_argument("--synthetic", type=int, default=None, help="random vectors in the corpus timed beside the test corpus")
    args = runner.parse(p, argv)
    if args.dims is not None and min(args.dims) <= 0:
        p.error(f"--dims must be positive, got {args.dims}")
    return args


def main(argv=None):
    args = parse_args(argv)
    s = runner.settings_from(args, PRESETS, NAME)
    quora = runner.holds_quora(s.data)

    @functools.cache
    def data():
        """(start model, its unnormalised twin, training triplets, test split, the projections each D
        starts from); --report-only never calls it, so that it loads nothing. The data
        is Quora's duplicate questions as in the paper, or a retrieval dataset's train and test splits."""
        start = runner.load_model(s.model, args.device, s.max_seq_length)
        if start.dense is not None:
            raise ValueError(f"{s.model} already ends in a Dense layer (to {start.dimension} dimensions); start from "
                             "a model without one, which this experiment gives a projection to each D")
        if quora:
            triplets, test = runner.quora_data(s.data, s.seed)
        else:
            triplets = runner.mined_triplets(s.data, "train", start, s.seed)[1]
            test = runner.mined_triplets(s.data, "test", start, s.seed)[0]
        triplets = runner.subsample(triplets, s.examples, s.seed)
        print(f"{len(triplets):,} training triplets, {len(test.queries):,} test queries, "
              f"{len(test.corpus):,} documents")
        raw = unnormalised(runner.load_model(s.model, args.device, s.max_seq_length))
        return start, raw, triplets, test, starting_projections(raw, triplets, s.dims)

    if not args.report_only:  # a bad model or data stops here, before the output folder is written
        data()
    study = runner.Study(runner.output_folder(args, NAME), NAME, s, args.report_only, args.device)

    # The baselines, and the start model's own embeddings (no normalisation) projected to each D.
    results = {
        "jaccard": study.entry("jaccard", lambda folder: runner.retrieval_scores("jaccard", data()[3],
                                                                                 exclude_self=quora)),
        "untrained": study.entry("untrained", lambda folder: {
            "dim": data()[0].dimension, **runner.retrieval_scores(data()[0], data()[3], exclude_self=quora)}),
        "untrained-euclidean": study.entry("untrained-euclidean", lambda folder: {
            "dim": data()[1].dimension, **runner.retrieval_scores(data()[1], data()[3], "euclidean",
                                                                  exclude_self=quora)}),
    }
    for dim in s.dims:
        results[f"pca{dim}"] = study.entry(f"pca{dim}", lambda folder, dim=dim: {
            "dim": dim, **projected_scores(data()[1], data()[4][dim], data()[3], quora)})

    # The base model (no projection), then one model per D, each with every seed.
    for dim in [None] + s.dims:
        runs = [study.entry(f"d{dim}-seed{seed}" if dim else f"base-seed{seed}",
                            lambda folder, dim=dim, seed=seed: train_and_evaluate(folder, s, args, dim, seed,
                                                                                  *data()[2:], quora))
                for seed in runner.seed_list(s)]
        results[f"d{dim}" if dim else "base"] = {"dim": dim or results["untrained"]["dim"], **runner.over_seeds(runs),
                                                 "runs": runs}
    speed = study.entry("search-speed", lambda folder: search_speed(study, s))

    # The tests, the report, dims.png.
    tests = claims(s, results)
    documents = (len(results["untrained"]["per_query"][MAIN_METRIC]) if quora else
                 len(datasets.load_beir(datasets.what_data(s.data).folder(), "test").corpus))
    markdown = report(s, study.about(), results, tests, speed, documents, quora, study.run(), study.margin_record())
    if figures.available():
        speeds = {f"{documents:,} test documents": speed["test"], f"{s.synthetic:,} random vectors": speed["synthetic"]}
        drawn = {family: {dim: verdicts.plotted(test) for dim, test in tests[family].items()}
                 for family in ("against_start", "projection_cost", "against_base")}
        figures.dims_figure(study.output / "dims.png", s.dims, results, drawn | {"base_moved": verdicts.plotted(
            tests["base_moved"])}, speeds, MAIN_METRIC, MAIN_LABEL, verdicts.NDCG_MARGIN)
    else:
        markdown += f"\n{figures.MISSING}.\n"
    study.write_results({"settings": vars(s), "models": results, "tests": tests, "search_speed": speed,
                         "paper": {"accuracy@1": {str(key): value for key, value in PAPER_ACCURACY.items()}}}, markdown)


def unnormalised(model):
    """The model with its final normalisation switched off: the paper's network has none."""
    model.normalize_embeddings = False
    return model


def starting_projections(raw, triplets: list, dims: list) -> dict:
    """{D: (weight (D, H), bias (D,))}, the projection to each D starts from: the PCA of the start
    model's embeddings of every training text (y = V (x - mean) = V x - V mean) for D <= H, else the
    identity padded with zeros (the first H coordinates are x itself, the others 0). The texts are
    encoded and the PCA fitted once: the first D directions of the largest D are those of each D."""
    width = raw.dimension
    starts = {dim: (torch.eye(dim, width), torch.zeros(dim)) for dim in dims if dim > width}
    reduced = [dim for dim in dims if dim <= width]
    if not reduced:
        return starts
    texts = sorted({text for t in triplets for text in t.texts})
    if len(texts) < max(reduced):
        raise ValueError(f"a PCA projection to D = {max(reduced)} needs at least {max(reduced)} training texts, "
                         f"got {len(texts)}; choose a smaller D or more --examples")
    pca = fit_pca(raw.encode(texts), k=max(reduced))
    for dim in reduced:
        weight = pca.components[:dim].float()  # (D, H)
        starts[dim] = (weight, -(weight @ pca.mean.float()))
    return starts


def projected_scores(raw, projection: tuple, test, quora: bool) -> dict:
    """The retrieval scores of the start model's embeddings projected with (weight, bias), euclidean."""
    weight, bias = (t.numpy() for t in projection)
    corpus = runner.corpus_embeddings(raw, test)[0] @ weight.T + bias  # (N, D)
    queries = raw.encode(list(test.queries.values())) @ weight.T + bias  # (Q, D)
    return runner.embedding_scores(queries, corpus, test, "euclidean", exclude_self=quora)


def train_and_evaluate(folder, s, args, dim, seed: int, triplets: list, test, starts: dict, quora: bool) -> dict:
    """One model: the start model with a projection to `dim` (None: none, the base model), trained
    with the triplet loss on euclidean distance, evaluated with euclidean distance."""
    model = unnormalised(runner.load_model(s.model, args.device, s.max_seq_length))
    if dim:
        model.dense = Dense(model.dimension, dim, activation="identity").to(model.device)
        weight, bias = starts[dim]
        with torch.no_grad():
            model.dense.linear.weight.copy_(weight)
            model.dense.linear.bias.copy_(bias)
    settings = TrainingSettings(epochs=s.epochs, batch_size=s.batch_size, lr=s.lr, dense_lr=s.projection_lr,
                                margin=s.margin, seed=seed, checkpoint_steps=runner.CHECKPOINT_STEPS)
    training = runner.train(model, triplets, select_loss("triplet", "euclidean"), folder, settings,
                            run_inputs={"model": s.model, "dim": dim, "data": s.data})
    result = runner.retrieval_scores(model, test, "euclidean", exclude_self=quora)
    np.save(folder / "corpus.npy", runner.corpus_embeddings(model, test)[0])  # for the speed rounds
    np.save(folder / "queries.npy", model.encode(list(test.queries.values())))
    return {"dim": dim or model.dimension, **result, "training": training}


def claims(s, results: dict) -> dict:
    """The tests behind the report, NDCG@10 over seeds and queries with the equivalence test at
    verdicts.NDCG_MARGIN, each family Holm-adjusted: each D against the base model ("against_base"),
    against its untrained PCA projection ("against_projection") and against the start model scored
    with euclidean distance ("against_start"), each untrained PCA projection against that start
    model ("projection_cost": what the size alone costs), the base model against that start model
    ("base_moved"), and each D against the base model on the paper's own metric, top-1 accuracy
    ("accuracy_against_base"), and each D against the next smaller one on it ("accuracy_larger",
    keyed "larger:smaller"), and the largest D against the smallest on the gap between the two metrics
    the paper reads (top-1 accuracy less top-5 accuracy, "accuracy_gap_shrinks": positive where the
    two sizes differ less at top 5 than at top 1). A D whose projection is the start model is tested
    against the start once; its "against_projection" entry says so ({"tested_in": "against_start"}), and the projection
    family's Holm counts only the projections tested."""
    def each_dim(name: str, other, metric: str = MAIN_METRIC, margin=verdicts.NDCG_MARGIN) -> dict:
        return dict(zip(map(str, s.dims), verdicts.family(
            [verdicts.claim(results[name.format(dim=dim)], results[other.format(dim=dim)], metric, margin)
             for dim in s.dims])))
    # Where the untrained projection is the start model (every query equal in every seed: the PCA to the
    # encoder's own width only rotates it), "against the projection" is "against the start": tested once.
    start_itself = [dim for dim in s.dims
                    if verdicts.identical(results[f"pca{dim}"], results["untrained-euclidean"], MAIN_METRIC)]
    projected = dict(zip([str(dim) for dim in s.dims if dim not in start_itself], verdicts.family(
        [verdicts.claim(results[f"d{dim}"], results[f"pca{dim}"], MAIN_METRIC, verdicts.NDCG_MARGIN)
         for dim in s.dims if dim not in start_itself])))
    return {
        "projection_cost": each_dim("pca{dim}", "untrained-euclidean"),
        "against_start": each_dim("d{dim}", "untrained-euclidean"),
        "against_base": each_dim("d{dim}", "base"),
        "against_projection": {str(dim): {"tested_in": "against_start"} if dim in start_itself else projected[str(dim)]
                               for dim in s.dims},
        "base_moved": verdicts.family([verdicts.claim(results["base"], results["untrained-euclidean"], MAIN_METRIC,
                                                  verdicts.NDCG_MARGIN)])[0],
        "accuracy_against_base": each_dim("d{dim}", "base", "accuracy@1", None),
        "accuracy_larger": dict(zip([f"{larger}:{smaller}" for smaller, larger in zip(s.dims, s.dims[1:])],
                                    verdicts.family([verdicts.claim(results[f"d{larger}"], results[f"d{smaller}"],
                                                                    "accuracy@1") for smaller, larger in
                                                     zip(s.dims, s.dims[1:])]))),
        **({"accuracy_gap_shrinks": verdicts.family([verdicts.claim(
            *(verdicts.difference_of(results[f"d{dim}"], "accuracy@1", "accuracy@5")
              for dim in (s.dims[-1], s.dims[0])), GAP_METRIC)])[0]} if len(s.dims) > 1 else {}),
    }


def search_speed(study, s) -> dict:
    """Queries per second of exact top-10 euclidean search for each D (its first seed's embeddings),
    over the test corpus and over random vectors: the fastest of SPEED_ROUNDS rounds, each round
    timing every D in turn."""
    rng = np.random.default_rng(s.seed)
    corpora = {}
    for dim in s.dims:
        folder = study.output / "models" / f"d{dim}-seed{s.seed}"
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
