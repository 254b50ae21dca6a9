"""Choosing a model for your data: several models on one retrieval dataset, one table, the best marked.
After Silveri, "Choosing the Right SBERT Model for Your Data with BEIR" (2024).

    python -m minisbert.experiments model-selection --data scifact \\
        --model all-MiniLM-L6-v2 msmarco-MiniLM-L6-cos-v5 runs/x bm25 jaccard
    python -m minisbert.experiments model-selection --data questions.csv --model all-MiniLM-L6-v2 bm25
    python -m minisbert.experiments model-selection --quick      # data/example: the default models
    python -m minisbert.experiments model-selection --data scifact --model all-MiniLM-L6-v2 bm25 jaccard \\
        --train mnrl triplet --seeds 5 --max-seq-length 128     # two candidates trained here, 5 seeds each

The walk-through evaluates candidate models on the user's own data, in the BEIR layout (corpus,
queries, qrels), with BEIR's EvaluateRetrieval, which computes NDCG, MAP, Recall and Precision with
trec_eval at k = 1, 3, 5, 10 and 100, and reads them side by side. --data takes a dataset name, a
BEIR folder, or such a CSV of question,answer rows: each question becomes a query whose answer is its
one relevant document (datasets/qa_csv.py). Here each model ranks the test split's corpus with
--score (cosine by default; euclidean for models trained for it) and is scored with those four
metrics, with trec_eval's definitions (evaluation/metrics.py, definitions="trec") at --k (1 3 5 10 100 by
default; --definitions st gives sentence-transformers' instead). The best model in each column is in
bold, and every other candidate is tested against the best one (by NDCG@10) on every metric: the
difference, its 95% interval and p from the crossed t over the seeds and the queries (verdicts.py),
the p Holm-adjusted over the candidates. A candidate the test cannot tell from the best is not shown to be as good: the
interval says how much worse it may be, and only an equivalence test at a margin (verdicts.NDCG_MARGIN,
on NDCG@10) can say that it is within that margin of the best.

A model is a known name (fetched on first use), a model directory, the output folder of train.py
(its final/ model is used) or of an experiment's model (models/<name>/), or a lexical baseline: bm25,
jaccard. Every name is checked before the first model is evaluated. --train adds candidates that the
study trains itself, so that its table can be rerun from the repository: each named objective
(TRAINABLE: SBERT's triplet objective, euclidean with margin 1, or multiple-negatives ranking) trains
--start on the data's train split, one triplet per judged (query, relevant document) with a negative
mined once with --start, as sbert-objectives.py trains them, once per seed (--seeds); such a row is
the mean over its seeds, and its tests draw its seeds as well as the queries.

Writes results.md (the tables) and results.json (each query's scores included). Checked in
tests/experiments/test_experiments.py.
"""

import functools
import re
from pathlib import Path

from .. import datasets
from ..evaluation.benchmark import CACHE_DIR, LEXICAL
from ..training.fit import TrainingSettings
from ..common.hub import resolve
from ..training.losses import select_loss
from . import runner, verdicts

NAME = "model-selection"
# The training settings are sbert-objectives.py's (batch 16, one epoch, SBERT's learning rate).
PRESETS = {
    "full": {"data": "scifact", "model": ["all-MiniLM-L6-v2", "bm25", "jaccard"], "score": "cosine",
             "max_seq_length": None, "k": [1, 3, 5, 10, 100], "definitions": "trec", "train": [],
             "start": "all-MiniLM-L6-v2", "examples": 1024, "epochs": 1, "batch_size": 16, "lr": 2e-5, "seed": 42,
             "seeds": 1},
    "quick": {"data": "example", "model": ["all-MiniLM-L6-v2", "bm25", "jaccard"], "score": "cosine",
              "max_seq_length": None, "k": [1, 3, 5, 10, 100], "definitions": "trec", "train": [],
              "start": "all-MiniLM-L6-v2", "examples": 64, "epochs": 1, "batch_size": 4, "lr": 2e-5, "seed": 42,
              "seeds": 1},
}
# --train: name -> (the row's name, the loss's (arch, metric, loss)), as sbert-objectives.py names them.
TRAINABLE = {"triplet": ("triplet (trained here)", ("triplet", "euclidean", None)),
             "mnrl": ("MNRL (trained here)", ("triplet", "cosine", "mnrl"))}
COLUMNS = [("NDCG", "ndcg"), ("MAP", "map"), ("Recall", "recall"), ("Precision", "precision")]
BEST_BY = "ndcg@10"


def parse_args(argv=None):
    p = runner.parser(NAME, __doc__, PRESETS, several_models=True)
    p.add_argument("--score", choices=["cosine", "dot", "euclidean"], default=None,
                   help="how the sentence encoders compare embeddings (default cosine)")
    p.add_argument("--max-seq-length", type=int, default=None, help="tokens per text (default: each model's own)")
    p.add_argument("--k", type=int, nargs="+", default=None, help="cutoffs (default 1 3 5 10 100, as BEIR)")
    p.add_argument("--definitions", choices=["trec", "st"], default=None,
                   help="metric definitions: trec (trec_eval, as BEIR; the default) or st (sentence-transformers)")
    p.add_argument("--train", nargs="+", choices=list(TRAINABLE), default=None,
                   help="candidates the study trains itself from --start on the data's train split")
    p.add_argument("--start", default=None, help="the model --train starts from (default all-MiniLM-L6-v2)")
    p.add_argument("--lr", type=float, default=None, help="--train's peak learning rate (default 2e-5)")
    p.add_argument("--examples", type=int, default=None, help="--train's triplets at most, drawn with the seed")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    runner.seeds_option(p)
    args = runner.parse(p, argv)
    if args.k is not None and (min(args.k) <= 0 or 10 not in args.k):
        p.error(f"--k must be positive and include 10 (the best model is chosen by NDCG@10), got {args.k}")
    return args


def main(argv=None):
    args = parse_args(argv)
    s = runner.settings_from(args, PRESETS, NAME)
    # Every model is found (and fetched) before the first is evaluated: a typo fails in seconds.
    models = {name: name if name in LEXICAL or args.report_only else model_directory(name) for name in s.model}
    folder = datasets.what_data(s.data).retrieval_folder(CACHE_DIR / "qa-csv")  # a CSV: converted once
    test = datasets.load_beir(folder, "test")
    study = runner.Study(runner.output_folder(args, NAME), NAME, s, args.report_only, args.device)
    print(f"{s.data} (test): {len(test.queries):,} queries, {len(test.corpus):,} documents")

    def evaluate(source):
        model = source if source in LEXICAL else runner.load_model(source, args.device, s.max_seq_length)
        return runner.retrieval_scores(model, test, s.score, ks=s.k, definitions=s.definitions)

    results = {name: study.entry(entry_name(name), lambda folder, source=source: evaluate(source))
               for name, source in models.items()}
    results |= trained_candidates(s, args, study, test)

    # The best model by NDCG@10, and every other one tested against it on every metric.
    keys = [f"{key}@{k}" for _, key in COLUMNS for k in s.k]
    best_model = max(results, key=lambda name: results[name]["scores"][BEST_BY])
    tests = claims(results, best_model, keys)
    study.write_results({"settings": vars(s), "models": results, "best": best_model, "tests": tests},
                        report(s, study.about(), results, tests, best_model, keys, test, study.margin_record()))


def claims(results: dict, best_model: str, keys: list) -> dict:
    """{metric: {candidate: its test against the best}} for every metric of `keys`, each family Holm-adjusted
    over the candidates. A metric equal to one tested already on every query of every model (NDCG@1 and
    Precision@1 where relevance is binary) is that result again: tested once, under the first
    ({"tested_in": it})."""
    others = [name for name in results if name != best_model]
    tests = {}
    for key in keys if others else []:
        same = next((earlier for earlier in tests if all(verdicts.per_seed(results[name], key) ==
                                                         verdicts.per_seed(results[name], earlier) for name in results)),
                    None)
        tests[key] = {name: {"tested_in": same} for name in others} if same else dict(zip(others, verdicts.family([
            verdicts.claim(results[name], results[best_model], key, verdicts.NDCG_MARGIN if key == BEST_BY else None)
            for name in others])))
    return tests


def trained_candidates(s, args, study: runner.Study, test) -> dict:
    """--train's candidates (module docstring), each one row: its seeds' runs and their mean."""
    @functools.cache
    def triplets():
        start = runner.load_model(s.start, args.device, s.max_seq_length)
        return runner.subsample(runner.mined_triplets(s.data, "train", start, s.seed)[1], s.examples, s.seed)

    def train_and_evaluate(folder, loss, seed):
        model = runner.load_model(s.start, args.device, s.max_seq_length)
        settings = TrainingSettings(epochs=s.epochs, batch_size=s.batch_size, lr=s.lr, seed=seed, margin=1.0,
                                    checkpoint_steps=runner.CHECKPOINT_STEPS)
        training = runner.train(model, triplets(), select_loss(*loss), folder, settings,
                                run_inputs={"model": s.start, "data": s.data})
        scores = runner.retrieval_scores(model, test, s.score, ks=s.k, definitions=s.definitions)
        return {**scores, "training": training}

    results = {}
    for name in getattr(s, "train", None) or []:  # a run recorded before --train existed has none
        label, loss = TRAINABLE[name]
        runs = [study.entry(f"train-{name}-seed{seed}", lambda folder, loss=loss, seed=seed:
                            train_and_evaluate(folder, loss, seed)) for seed in runner.seed_list(s)]
        results[label] = {**runner.over_seeds(runs), "runs": runs}
    return results


def trained_sentence(s, results: dict) -> str:
    """What the report says of the candidates' training: of --train's, how and with which seeds; else
    that each model is one network."""
    trained = [TRAINABLE[name][0] for name in getattr(s, "train", None) or []]
    if not trained:
        return ("Each model is one trained network (one seed): its tests draw only the queries, conditional on that "
                "network, and say nothing of how another training run would do.")
    run = results[trained[0]]["runs"][0]["training"]
    return (f"{' and '.join(trained)} are trained by this run from {s.start} on the {s.data} train split "
            f"({run['examples']:,} triplets, each negative mined once with the start model; {s.epochs} epoch(s), "
            f"batch {s.batch_size}, learning rate {s.lr:g}, {run['steps']:,} steps"
            + ("; the triplet objective is SBERT's, euclidean with margin 1" if "triplet" in s.train else "")
            + f"), seeds {', '.join(map(str, runner.seed_list(s)))}: each such row "
            "is the mean over its seeds, and a test against the best where either is trained here draws the seeds "
            "as well as the queries. The other models are used as given, one network each.")


def paper_claims(best_model: str) -> list:
    """Silveri's claims beside this run (runner.claims_table's rows): the walk-through gives a method, not
    figures for this data, so nothing can be set beside it."""
    return [["a candidate is chosen by evaluating it on one's own data (BEIR)", "the walk-through",
             "no figures for this data", f"the best by NDCG@10 is {best_model}; the tests above say which candidates "
             "the data cannot tell from it", runner.NOT_COMPARABLE]]


def report(s, about: str, results: dict, tests: dict, best_model: str, keys: list, test, margin_record: str) -> str:
    header = ["model"] + [f"{title}@{k}" for title, _ in COLUMNS for k in s.k]
    best = {key: max(result["scores"][key] for result in results.values()) for key in keys}
    rows = [[name] + [bold_if(result["scores"][key], best[key]) for key in keys] for name, result in results.items()]
    tested_keys = [f"{key}@10" for _, key in COLUMNS]
    sentences = [f"- {name} against {best_model}: {verdicts.verdict(tested(tests, BEST_BY)[name], 'NDCG@10', name, best_model, 'p_holm')}."
                for name in results if name != best_model]
    return "\n".join([
        "# Model selection",
        "",
        "After Silveri, \"Choosing the Right SBERT Model for Your Data with BEIR\": candidate models on one "
        "dataset, side by side. The best model in each column is in bold.",
        "",
        f"Data: {s.data}, test split: {len(test.queries):,} queries over {len(test.corpus):,} documents. Sentence "
        f"encoders compare embeddings by {s.score}"
        + (f", at most {s.max_seq_length} tokens per text" if s.max_seq_length else "")
        + f". Metrics: {'trec_eval' if s.definitions == 'trec' else 'sentence-transformers'} definitions "
        f"(minisbert/evaluation/metrics.py). " + about + " " + trained_sentence(s, results),
        "",
        runner.markdown_table(header, rows),
        f"Best by NDCG@10: **{best_model}**. Each other candidate against it (difference, 95% interval and p, "
        "Holm-adjusted over the candidates; every metric@k is in results.json; equivalence within "
        f"{verdicts.NDCG_MARGIN:g} on NDCG@10 only). "
        + verdicts.method_text([t for family in tests.values() for t in family.values() if "tested_in" not in t])
        + same_metrics(tests),
        "",
        *sentences,
        "",
        runner.markdown_table(["model"] + [f"{title}@10 difference from {best_model}" for title, _ in COLUMNS],
                              [[name] + [verdicts.difference_cell(tested(tests, key)[name]) for key in tested_keys]
                               for name in results if name != best_model]) if tests else "",
        f"**Equivalence margin** (NDCG@10): {verdicts.MARGIN_REASON}; \"bound\" is the smallest margin at which the "
        f"same adjusted equivalence test would hold. {margin_record}",
        "",
        "**The walk-through's claims**, each beside what this run finds:",
        "",
        runner.claims_table(paper_claims(best_model)),
        "## Where this run departs from the walk-through",
        "",
        deviations(s),
    ])


def tested(tests: dict, key: str) -> dict:
    """{candidate: test} of metric `key`: its own family, or the one it was tested in ({"tested_in": ...})."""
    family = tests[key]
    first = next(iter(family.values()), {})
    return tests[first["tested_in"]] if "tested_in" in first else family


def same_metrics(tests: dict) -> str:
    """" Precision@1 equals NDCG@1 on every query of every model here: tested once, as NDCG@1.", or ""."""
    pairs = {key: next(iter(family.values()))["tested_in"] for key, family in tests.items()
             if "tested_in" in next(iter(family.values()), {})}
    return "".join(f" {key} equals {earlier} on every query of every model here: tested once, as {earlier}."
                   for key, earlier in pairs.items())


def deviations(s) -> str:
    """The table of what this run does differently from Silveri's walk-through, and why."""
    trained = [TRAINABLE[name][0] for name in getattr(s, "train", None) or []]
    rows = [
        ["data", "NVIDIA documentation question-answer pairs (a Kaggle CSV), each answer the relevant document of "
         "its question", str(s.data), "a public BEIR dataset that the other studies use too; --data questions.csv "
         "reads such a CSV"],
        ["negatives", "random answers added as negative samples, kept below a similarity threshold",
         "none added: every query ranks the whole corpus", "the corpus already holds every unjudged document"],
        ["models", "thenlper/gte-large, BAAI/bge-large-en-v1.5, intfloat/e5-large-v2", ", ".join(s.model + trained),
         "models of the size the other studies train, on 2 CPU cores"],
        *([["training", "none: published models, compared as they are", f"{' and '.join(trained)}, "
            f"seeds {', '.join(map(str, runner.seed_list(s)))}", "so that the table can be rerun from the repository, "
            "with the training seeds' variance in its tests"]] if trained else []),
        ["score", "cos_sim", str(s.score), "the walk-through's"],
        ["metrics", "BEIR's EvaluateRetrieval (trec_eval): NDCG, MAP, Recall, Precision at 1, 3, 5, 10, 100",
         f"the same with {s.definitions} definitions at {', '.join(map(str, s.k))}", "the walk-through's"],
        ["tests", "none: the columns are read side by side", "each candidate against the best, over seeds and queries",
         "a lead on a few hundred queries can be luck"],
    ]
    return runner.markdown_table(["setting", "walk-through", "this run", "why"], rows)


def model_directory(name: str) -> Path:
    """The folder of a known model (fetched on first use) or a model directory; for a train.py output
    folder or an experiment's model folder, the final/ model inside it."""
    folder = Path(name)
    if folder.is_dir() and not (folder / "config.json").is_file() and (folder / "final").is_dir():
        return folder / "final"
    return resolve(name)


def entry_name(model: str) -> str:
    """A model name made safe as a folder name under models/."""
    return re.sub(r"[^\w.-]+", "_", model).strip("_.")


def bold_if(value: float, best: float) -> str:
    return f"**{value:.4f}**" if value == best else f"{value:.4f}"
