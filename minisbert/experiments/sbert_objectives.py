"""Sentence-BERT's training objectives side by side, after Reimers and Gurevych, "Sentence-BERT:
Sentence Embeddings using Siamese BERT-Networks" (2019), section 3.

    python -m minisbert.experiments sbert-objectives             # STS-B, SICK, SciFact (see PRESETS)
    python -m minisbert.experiments sbert-objectives --quick     # a few steps each, data/example for retrieval

Three models from the same start model, each trained with one objective on the data it was made for:

    classification   softmax(W [u; v; |u - v|]) with cross-entropy, on SICK's entailment labels
                     (train split: entailment, neutral, contradiction); W is thrown away afterwards
    regression       MSE between the cosine of u and v (clamped at 0, see losses.py) and the gold
                     score, on STS-B's train pairs (scores divided by 5)
    MNRL             multiple-negatives ranking (Henderson et al. 2017) on (query, relevant document,
                     hard negative) triplets of the retrieval data's train split, the negatives mined
                     once with the start model

and every model, the untrained start model too, is scored on both kinds of task: STS-B test (Spearman
correlation of cosine similarity with the gold scores, SBERT section 4.1) and the retrieval data's
test split (NDCG@10, cosine). The table shows what each objective buys, and what it costs on the
task it was not trained for.

Writes to OUTPUT (runner.py describes the folder): results.md (the table), results.json.
Checked in tests/test_experiments.py.
"""

from .. import datasets
from ..evaluation import sts_correlations
from ..fit import TrainingSettings
from ..losses import SoftmaxClassifier, select_loss
from ..training_data import Example
from . import runner

NAME = "sbert-objectives"
# name -> (label, the loss's (arch, metric, loss), training data)
OBJECTIVES = {
    "classification": ("classification (softmax)", ("siamese", "cosine", "softmax"), "SICK train, entailment labels"),
    "regression": ("regression (cosine MSE)", ("siamese", "cosine", None), "STS-B train, scores / 5"),
    "mnrl": ("MNRL, hard negatives", ("triplet", "cosine", "mnrl"), "retrieval train split, mined triplets"),
}
# examples: at most this many training examples per objective, drawn with the seed.
PRESETS = {
    "full": {"data": "scifact", "stsb": "stsb", "sick": "sick", "model": "all-MiniLM-L6-v2", "examples": 1024,
             "epochs": 1, "batch_size": 16, "max_seq_length": 128, "lr": 2e-5, "seed": 42},
    "quick": {"data": "example", "stsb": "stsb", "sick": "sick", "model": "all-MiniLM-L6-v2", "examples": 64,
              "epochs": 1, "batch_size": 16, "max_seq_length": 128, "lr": 2e-5, "seed": 42},
}


def parse_args(argv=None):
    p = runner.parser(NAME, __doc__, PRESETS)
    p.add_argument("--stsb", default=None, help="STS-B: the name stsb, or a folder with sts-{train,test}.csv")
    p.add_argument("--sick", default=None, help="SICK: the name sick, or a folder with SICK_train.txt ...")
    runner.training_options(p, "training examples per objective, drawn with the seed")
    return runner.parse(p, argv)


def main(argv=None):
    args = parse_args(argv)
    s = runner.settings_from(args, PRESETS)
    start = runner.load_model(s.model, args.device, s.max_seq_length)
    study = runner.Study(runner.output_folder(args, NAME), NAME, s)

    # The data: each objective's training examples, and the two test sets every model is scored on.
    sick = [Example((p.sentence1, p.sentence2), datasets.ENTAILMENT_LABELS.index(p.label))
            for p in datasets.load_sick("train", folder=named_or_folder(s.sick, "sick"))]
    stsb = [Example((p.sentence1, p.sentence2), datasets.to_unit_score("stsb", p.score))
            for p in datasets.load_stsb("train", folder=named_or_folder(s.stsb, "stsb"))]
    triplets = runner.mined_triplets(s.data, "train", start, s.seed)[1]
    examples = {name: runner.subsample(data, s.examples, s.seed)
                for name, data in (("classification", sick), ("regression", stsb), ("mnrl", triplets))}
    sts_test = datasets.load_stsb("test", folder=named_or_folder(s.stsb, "stsb"))
    retrieval_test = datasets.load_beir(datasets.what_data(s.data).folder(), "test")

    def scores(model) -> dict:
        return {"spearman": sts_correlations(model, sts_test)["spearman"],
                "ndcg@10": runner.retrieval_scores(model, retrieval_test)["ndcg@10"]}

    # The models: the start model untrained, then one per objective.
    results = {"untrained": study.entry("untrained", lambda folder: {"scores": scores(start)})}
    settings = TrainingSettings(epochs=s.epochs, batch_size=s.batch_size, lr=s.lr, seed=s.seed,
                                checkpoint_steps=runner.CHECKPOINT_STEPS)
    for name, (_, loss, _) in OBJECTIVES.items():
        def train_and_evaluate(folder, name=name, loss=loss):
            model = runner.load_model(s.model, args.device, s.max_seq_length)
            classifier = None
            if name == "classification":
                classifier = SoftmaxClassifier(model.dimension, len(datasets.ENTAILMENT_LABELS)).to(model.device)
            training = runner.train(model, examples[name], select_loss(*loss), folder, settings,
                                    identity={"model": s.model, "data": s.data}, classifier=classifier)
            return {"scores": scores(model), "training": training}
        results[name] = study.entry(name, train_and_evaluate)

    # The report.
    header = ["model", "trained on", "STS-B test Spearman", f"{s.data} test NDCG@10", "training time", "examples", "steps"]
    rows = [["start model, untrained", "-", f"{results['untrained']['scores']['spearman']:.4f}",
             f"{results['untrained']['scores']['ndcg@10']:.4f}", "-", "-", "-"]]
    for name, (label, _, data) in OBJECTIVES.items():
        result, training = results[name], results[name]["training"]
        rows.append([label, data, f"{result['scores']['spearman']:.4f}", f"{result['scores']['ndcg@10']:.4f}",
                     runner.minutes(training["seconds"]), f"{training['examples']:,}", f"{training['steps']:,}"])
    markdown = "\n".join([
        "# Sentence-BERT's objectives",
        "",
        "After Reimers and Gurevych, \"Sentence-BERT\" (2019), section 3: the classification, regression and "
        "multiple-negatives ranking objectives, each from the same start model, each scored on STS and retrieval.",
        "",
        f"Start model {s.model}; at most {s.examples:,} training examples per objective, {s.epochs} epoch(s), batch "
        f"{s.batch_size}, learning rate {s.lr:g}, at most {s.max_seq_length} tokens per text, seed {s.seed}; STS-B "
        f"test: {len(sts_test):,} pairs; {s.data} test: {len(retrieval_test.queries):,} queries over "
        f"{len(retrieval_test.corpus):,} documents. " + runner.about_the_run(s, start.device),
        "",
        runner.markdown_table(header, rows),
    ])
    study.write_results({"settings": vars(s), "models": results}, markdown)


def named_or_folder(value: str, name: str):
    """None (find the named dataset the usual way) when `value` is the dataset's name, else the folder."""
    return None if value == name else value
