"""What the experiments share: their command line, their output folder, and the steps each repeats.

An experiment (one file beside this one) reads top to bottom like train.py: arguments, data, models,
training, evaluation, report. Every model it trains or evaluates is one entry of the study; when an
entry is finished its result is written, atomically, to OUTPUT/models/<name>/result.json, and a
rerun with the same --output reads that file instead of doing the work again. A run killed between
models therefore goes on with the models still missing, and one killed while a model trains goes on
from that model's last checkpoint (training/fit.py).

    OUTPUT/settings.json               the experiment and every setting it runs with
    OUTPUT/run.json                    which machine and code made which models, and the equivalence
                                       margin in force then (records.py)
    OUTPUT/models/<name>/              log.jsonl, checkpoint.pt, final/ (training/fit.py), result.json
    OUTPUT/results.json, results.md    every number (each query's own, run.json's records) and the tables
    OUTPUT/*.png                       the figures (figures.py, when matplotlib is installed)

A model trained with several seeds (--seeds N: seed, seed + 1, ...) is one entry per seed
(<name>-seed<seed>); its row in the tables is the mean over seeds with their spread, and its tests
draw the seeds as well as the queries (verdicts.py). Every
difference a study reports is tested (minisbert/evaluation/significance.py), and a verdict sentence says what
the tests say (verdicts.py): a p above ALPHA says the data cannot tell, and the sentence gives the
interval; only an equivalence test at NDCG_MARGIN may call a difference negligible. When that margin
came into force is what run.json records, and the report says it from there (margin_record).

--report-only rebuilds results.json, results.md and the figures from OUTPUT/settings.json and
OUTPUT/models/*/result.json alone: it loads no model, encodes nothing, trains nothing, and stops
when a model's result is missing (it reads the test data's files for their sizes, and STS-B's for
its gold scores). The settings are the ones settings.json records, whatever the command line says,
and the machine named in the report is the one in OUTPUT/run.json, so a folder trained on a GPU
can be reported on a CPU.

Checked in tests/experiments/test_experiments.py.
"""

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch

import minisbert
from ..training import checkpoints
from .. import datasets
from ..evaluation import metrics
from ..evaluation.benchmark import CACHE_DIR, encode_cached, rank, rank_embeddings, score_run
from ..common.fileio import read_json, write_json, write_text
from ..training.fit import TrainingSettings, fit
from ..common.precision import default_device
from ..datasets import QUORA_FILE
from ..training.training_data import Example, mine_hard_negatives
from . import records

KS = (1, 5, 10)  # the cutoffs Rygaard et al. report
EMBEDDING_CACHE = CACHE_DIR / "embeddings"  # shared with evaluate.py: a corpus is encoded once per model
CHECKPOINT_STEPS = 20  # a model killed while it trains loses at most this many steps
METRIC_COLUMNS = [("Precision", "precision"), ("Accuracy", "accuracy"), ("MRR", "mrr"), ("NDCG", "ndcg")]


# ---------------------------------------------------------------------------------------------
# The command line: a preset (full, or --quick) with the options the user gave on top


def parser(name: str, description: str, presets: dict, several_models: bool = False) -> argparse.ArgumentParser:
    """The options every experiment has; each adds its own (margin, dims, ...) with default None, so
    that the preset's value applies. --model names the start model, or with several_models the models
    to compare. --help lists the presets."""
    epilog = "presets (an option given replaces the preset's value):\n" + "\n".join(
        f"  {preset}: " + ", ".join(f"{key}={value}" for key, value in values.items()) for preset, values in presets.items())
    p = argparse.ArgumentParser(prog=f"python -m minisbert.experiments {name}", description=description,
                                epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the small preset (data/example, a few steps): minutes")
    p.add_argument("--data", default=None, help="a named dataset (scifact) or a folder")
    if several_models:
        p.add_argument("--model", nargs="+", default=None, help="known names, model directories, bm25, jaccard")
    else:
        p.add_argument("--model", default=None, help="the start model: a known name or a model directory")
    p.add_argument("--output", type=Path, default=None, help=f"default: runs/{name} (runs/{name}-quick)")
    p.add_argument("--device", default=None, help="cuda, mps or cpu (default: the best available)")
    p.add_argument("--report-only", action="store_true",
                   help="rebuild results.json, results.md and the figures from --output's settings.json and "
                        "models/*/result.json: no model is loaded, nothing is encoded or trained")
    return p


def training_options(p: argparse.ArgumentParser, examples_help: str) -> None:
    """The options that size the training budget."""
    p.add_argument("--examples", type=int, default=None, help=examples_help)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--max-seq-length", type=int, default=None, help="tokens per text, in training and search")


def seeds_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", type=int, default=None,
                   help="train every model with this many seeds (--seed, --seed + 1, ...): the tables give the "
                        "mean and spread over seeds, the tests use each query's score averaged over them")
    p.add_argument("--seed", type=int, default=None, help="the first seed (default 42)")


def parse(p: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """The parsed options; a count that is not positive or a negative margin stops with a message."""
    args = p.parse_args(argv)
    for name in ("examples", "epochs", "batch_size", "max_seq_length", "synthetic", "seeds"):
        if getattr(args, name, None) is not None and getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if getattr(args, "margin", None) is not None and args.margin < 0:
        p.error(f"--margin cannot be negative, got {args.margin}")
    return args


def settings_from(args: argparse.Namespace, presets: dict, name: str) -> argparse.Namespace:
    """The preset's values (presets["quick"] with --quick, else presets["full"]), each replaced by
    the option of the same name where the user gave one; with --report-only, the settings the run
    in the output folder recorded."""
    if args.report_only:
        path = output_folder(args, name) / "settings.json"
        if not path.is_file():
            raise ValueError(f"--report-only: {path} does not exist; run the experiment into that folder first")
        recorded = read_json(path)
        if recorded.get("experiment") != name:
            raise ValueError(f"--report-only: {path} records a run of {recorded.get('experiment')}, not of {name}")
        return argparse.Namespace(**{key: value for key, value in recorded.items() if key != "experiment"})
    preset = presets["quick" if args.quick else "full"]
    chosen = {key: getattr(args, key) if getattr(args, key, None) is not None else value
              for key, value in preset.items()}
    return argparse.Namespace(**chosen)


def output_folder(args: argparse.Namespace, name: str) -> Path:
    return args.output or Path("runs") / (f"{name}-quick" if args.quick else name)


# ---------------------------------------------------------------------------------------------
# The output folder: one finished result per model


class Study:
    def __init__(self, output: Path, experiment: str, settings: argparse.Namespace, report_only: bool = False,
                 device=None):
        """Open OUTPUT for `experiment`; refuse a folder that holds models of a run with other settings,
        which would otherwise be mixed into this run's table. Only --seeds may differ: each seed's
        models are entries of their own, so a run with more seeds adds the missing ones and one with
        fewer reads back the first. A run that stopped before its first model (bad settings) is replaced.
        report_only: every entry must be there already. device: where this run's models run, named in
        run.json when it makes an entry."""
        self.output, self.report_only, self.settings = Path(output), report_only, settings
        self.device, self.recorded = device or str(default_device()), None
        wanted = json.loads(json.dumps({"experiment": experiment, **vars(settings)}, default=str))
        path = self.output / "settings.json"
        found = read_json(path) if path.is_file() else None
        models = self.output / "models"
        if found is not None and models.is_dir() and any(models.iterdir()):
            differences = sorted(k for k in {**found, **wanted} if found.get(k) != wanted.get(k) and k != "seeds")
            if differences:
                raise ValueError(f"{self.output} holds a run of {found.get('experiment')} with other settings "
                                 f"(they differ in {differences}); run the same command as before to "
                                 "continue it, or choose another --output")
        if found != wanted:
            write_json(path, wanted, digest=True)

    def entry(self, name: str, make) -> dict:
        """The result of model `name`: read back when an earlier run finished it, else make(folder),
        written to models/<name>/result.json once complete."""
        path = self.output / "models" / name / "result.json"
        if path.is_file():
            print(f"{name}: finished in an earlier run, read from {path}")
            result = read_json(path)
            check_per_query(result, path)
            return result
        if self.report_only:
            raise ValueError(f"--report-only: {path} is missing; run the experiment without --report-only to "
                             f"make {name}")
        print(f"--- {name}")
        if not self.recorded:  # a run that only reads results back leaves the records as they are
            self.recorded = records.new_record(self.run(), self.settings, self.device)
        result = make(path.parent)
        write_json(path, result, digest=True)
        self.recorded["models"].append(name)
        write_json(self.output / "run.json", self.recorded, digest=True)
        return result

    def about(self) -> str:
        """The report's line on the machines: what run.json records, or that it records nothing, and which
        machine made which network (records.machines_sentence)."""
        models = self.output / "models"
        entries = sorted(path.name for path in models.iterdir() if path.is_dir()) if models.is_dir() else []
        return records.about_line(self.run()) + " " + records.machines_sentence(self.run(), entries)

    def run(self) -> dict:
        """run.json: the record of the machine and code that made the models ({} where there is none)."""
        path = self.output / "run.json"
        return read_json(path) if path.is_file() else {}

    def margin_record(self) -> str:
        """The report's sentence on when the equivalence margin came into force: margin_record of run.json."""
        return records.margin_record(self.run())

    def write_results(self, results: dict, markdown: str) -> None:
        """results.json (run.json's records too: machine, code and margin) and results.md. A model trained
        with one seed keeps its per-query scores once: the seed's own, so the copy under "runs" is left out."""
        results = {**results, "records": records.history(self.run())}
        for model in results.get("models", {}).values():
            if len(model.get("runs", [])) == 1:
                model["runs"] = [{key: value for key, value in model["runs"][0].items() if key != "per_query"}]
        write_json(self.output / "results.json", results, digest=True)
        write_text(self.output / "results.md", markdown)
        print(f"\n{markdown}\nresults: {self.output / 'results.md'}, {self.output / 'results.json'}")


# ---------------------------------------------------------------------------------------------
# Models, data, training, evaluation


def load_model(name: str, device: str | None, max_seq_length: int | None = None):
    """A model by known name or folder, its inputs cut at max_seq_length tokens when given (or at
    the model's positions, where it has fewer)."""
    model = minisbert.load(name, device=device)
    if max_seq_length:
        model.limit_max_seq_length(max_seq_length)
    return model


def mined_triplets(data: str, split: str, start_model, seed: int) -> tuple:
    """(the split, one triplet per judged (query, relevant document)) of a BEIR folder, the
    negatives mined with the start model (training_data.mine_hard_negatives). The corpus embeddings this
    takes are cached, so evaluating the start model afterwards encodes no document again."""
    folder = datasets.what_data(data).folder()
    retrieval = datasets.load_beir(folder, split)
    triplets = mine_hard_negatives(start_model, retrieval, seed=seed, cache_dir=EMBEDDING_CACHE)
    if not triplets:
        raise ValueError(f"{folder}: qrels/{split}.tsv judges no document of corpus.jsonl relevant to a query "
                         "of queries.jsonl, so there are no triplets to build")
    return retrieval, triplets


def holds_quora(data: str) -> bool:
    """Whether the data folder holds Quora's duplicate-question file."""
    return datasets.what_data(data).kind == datasets.QUORA


def quora_data(data: str, seed: int) -> tuple:
    """(training triplets, test split) from Quora's duplicate-question file, as Bagge et al. use it
    (sections 2, 3.1, 3.2). The duplicate pairs are shuffled with the seed and split 80 / 15 / 5 % into
    train, test and validation (not used here). A training triplet is a question, its duplicate, and
    a question the file judges not to be its duplicate (a random question where it judges none). The
    test split pools the questions of its pairs: each retrieves from the pool, where its duplicate is
    the one relevant question; rank it with exclude_self, so that no question finds itself."""
    rows = datasets.read_quora_duplicates(datasets.what_data(data).folder() / QUORA_FILE)
    texts = {**{r.qid1: r.question1 for r in rows}, **{r.qid2: r.question2 for r in rows}}
    not_duplicates = {}
    for r in rows:
        if not r.is_duplicate:
            not_duplicates.setdefault(r.qid1, []).append(r.qid2)
            not_duplicates.setdefault(r.qid2, []).append(r.qid1)
    pairs = [(r.qid1, r.qid2) for r in rows if r.is_duplicate]
    rng = random.Random(seed)
    rng.shuffle(pairs)
    train, test = pairs[:int(0.8 * len(pairs))], pairs[int(0.8 * len(pairs)):int(0.95 * len(pairs))]
    if not train or not test:
        raise ValueError(f"{datasets.what_data(data).folder() / QUORA_FILE}: {len(pairs)} duplicate pairs are too few to split "
                         "80 / 15 / 5 % into train, test and validation")
    others = sorted(texts)
    triplets = []
    for question, duplicate in train:
        negative = rng.choice(not_duplicates.get(question) or [q for q in others if q not in (question, duplicate)])
        triplets.append(Example((texts[question], texts[duplicate], texts[negative])))
    qrels = {}
    for a, b in test:
        qrels.setdefault(a, {})[b] = 1
        qrels.setdefault(b, {})[a] = 1
    pool = {q: texts[q] for q in qrels}
    return triplets, datasets.RetrievalData(corpus=pool, queries=dict(pool), qrels=qrels)


def subsample(examples: list, count: int | None, seed: int) -> list:
    """`count` examples drawn with `seed` (all of them when count is None or larger)."""
    if count is None or count >= len(examples):
        return examples
    return random.Random(seed).sample(examples, count)


def as_scored_pairs(triplets: list) -> list:
    """Each (query, positive, negative) as two scored pairs, one after the other: (query, positive, 1)
    and (query, negative, 0)."""
    return [Example((t.texts[0], text), label) for t in triplets for text, label in ((t.texts[1], 1.0), (t.texts[2], 0.0))]


def train(model, examples: list, spec, folder: Path, settings: TrainingSettings, run_inputs: dict,
          classifier=None) -> dict:
    """fit() into `folder` (from its checkpoint when a killed run left one), save folder/final, and
    return what the report needs: training seconds, examples, steps and the loss of every step."""
    torch.manual_seed(settings.seed)  # dropout draws the same numbers whichever models ran before
    result = fit(model, examples, spec, folder, settings, run_inputs=run_inputs, classifier=classifier,
                 resume=(folder / "checkpoint.pt").is_file())
    model.save(folder / "final")
    log = checkpoints.read_log(folder / "log.jsonl")
    return {"seconds": result["training_seconds"], "examples": len(examples), "steps": result["steps"],
            "loss": [entry["loss"] for entry in log]}


def retrieval_scores(model, retrieval: datasets.RetrievalData, score: str = "cosine", exclude_self: bool = False,
                     ks=KS, definitions: str = "st") -> dict:
    """{"scores": every metric at ks, "per_query": {metric: {query id: value}}} for `model` (a
    SentenceModel, or "bm25" / "jaccard") ranking the split's corpus with `score` (cosine, dot or
    euclidean); exclude_self drops the document whose id is the query's."""
    run = rank(model, retrieval, max(ks), score=score, cache_dir=EMBEDDING_CACHE, exclude_self=exclude_self)
    return score_run(run, retrieval.qrels, ks, definitions)


def embedding_scores(queries, corpus, retrieval: datasets.RetrievalData, score: str = "cosine",
                     exclude_self: bool = False) -> dict:
    """retrieval_scores for embeddings already computed: queries (Q, D) and corpus (N, D), in the
    order of retrieval.queries and retrieval.corpus."""
    run = rank_embeddings(queries, corpus, retrieval, max(KS), score, exclude_self)
    return score_run(run, retrieval.qrels, KS)


def check_per_query(result: dict, path: Path) -> None:
    """Refuse a result whose per-query values do not average to its scores (a file edited, or one
    written for another run): the tests would otherwise test numbers the table does not show."""
    for metric, values in result.get("per_query", {}).items():
        stated = result.get("scores", {}).get(metric)
        if stated is not None and metrics.average_scores({metric: values})[metric] != stated:
            raise ValueError(f"{path}: the {len(values):,} per-query values of {metric} average to "
                             f"{metrics.average_scores({metric: values})[metric]:.6f}, not to the {stated:.6f} "
                             "it reports; delete the file to evaluate that model again")


# ---------------------------------------------------------------------------------------------
# Seeds and tests


def seed_list(s: argparse.Namespace) -> list:
    return [s.seed + i for i in range(getattr(s, "seeds", 1) or 1)]


def over_seeds(results: list) -> dict:
    """One model trained with several seeds, as one row: each query's score averaged over the seeds
    ("per_query"), their mean ("scores", so the per-query values average to it), the sample standard
    deviation of the seeds' own scores ("spread"; 0 for one seed), and each seed's scores ("seeds")."""
    first = results[0]["per_query"]
    for result in results[1:]:
        if any(set(result["per_query"][m]) != set(first[m]) for m in first):
            raise ValueError("the seeds of one model were evaluated on different queries")
    per_query = {m: {q: float(np.mean([r["per_query"][m][q] for r in results])) for q in first[m]} for m in first}
    spread = {m: float(np.std([r["scores"][m] for r in results], ddof=1)) if len(results) > 1 else 0.0
              for m in first}
    return {"scores": metrics.average_scores(per_query), "spread": spread, "per_query": per_query,
            "seeds": [r["scores"] for r in results]}


def mean_cell(result: dict, metric: str) -> str:
    """"0.6345 ± 0.0021" (mean and spread over seeds), or "0.6345" for one seed or an untrained model."""
    if len(result.get("seeds", [])) > 1:
        return f"{result['scores'][metric]:.4f} ± {result['spread'][metric]:.4f}"
    return f"{result['scores'][metric]:.4f}"


def corpus_embeddings(model, retrieval: datasets.RetrievalData):
    """The corpus embeddings (n, D) and {document text: row}; read from the cache that ranking filled."""
    texts = list(retrieval.corpus.values())
    return encode_cached(model, texts, cache_dir=EMBEDDING_CACHE), {text: row for row, text in enumerate(texts)}


def timed(function, *args, repeats: int = 3) -> float:
    """The fastest of `repeats` calls, in seconds (the others were slowed down by something else)."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        function(*args)
        best = min(best, time.perf_counter() - started)
    return best


# ---------------------------------------------------------------------------------------------
# Tables


def markdown_table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def metric_header(ks=KS) -> list:
    return [f"{title}@{k}" for title, _ in METRIC_COLUMNS for k in ks]


def metric_cells(scores: dict, ks=KS) -> list:
    return [f"{scores[f'{key}@{k}']:.4f}" for _, key in METRIC_COLUMNS for k in ks]


def minutes(seconds: list) -> str:
    """A model's training time: its one seed's, or the range over its seeds (maybe on other machines)."""
    low, high = f"{min(seconds) / 60:.1f}", f"{max(seconds) / 60:.1f}"
    return f"{low} min" if low == high else f"{low} to {high} min"


def deviation_table(rows: list, paper: str = "paper") -> str:
    """The table of what a run does differently from its paper, and why: rows (setting, paper, this
    run, why), less those where this run does what the paper does."""
    return markdown_table(["setting", paper, "this run", "why"], [row for row in rows if row[1] != row[2]])


CLAIM_HEADER = ["the paper's claim", "section", "the paper's figure", "here", "here, it"]
AGREES, DISAGREES, NOT_SHOWN, NOT_COMPARABLE = "agrees", "disagrees", "not shown", "not comparable"
LABELS = (AGREES, DISAGREES, NOT_SHOWN, NOT_COMPARABLE)
LABELS_SAID = ("agrees: the test here finds what the paper claims; disagrees: it finds otherwise; not shown: it can "
               "tell neither way; not comparable: the quantity or the setting differs (the row says which).")


def claims_table(rows: list) -> str:
    """The paper's claims beside this run: rows (claim, section, the paper's figure, this run's figure,
    one of LABELS), each made by the study's own `paper_claims` from results.json, and what each label means."""
    return markdown_table(CLAIM_HEADER, rows) + "\n" + LABELS_SAID + "\n"


def preference_label(outcome: tuple, expected: int) -> str:
    """A claimed preference (expected: the sign of first - second the paper claims) against the test's
    outcome (verdicts.outcome): found, AGREES; the other way or equivalent, DISAGREES; neither, NOT_SHOWN."""
    word, sign = outcome
    if word == "not detectable":
        return NOT_SHOWN
    return AGREES if (word, sign) == ("prefers", expected) else DISAGREES


def disagreements(rows: list) -> list:
    """The claims of a claims table that this run disagrees with."""
    return [row[0] for row in rows if row[4] == DISAGREES]
