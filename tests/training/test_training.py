"""Tests for train.py, minisbert/training/fit.py, minisbert/training/checkpoints.py and minisbert/training/training_data.py: fine-tuning
end to end, on a tiny random model.

What "correct" means for training:
- every objective (Siamese and triplet, each with cosine and euclidean; SBERT's softmax classifier;
  MNRL) lowers its own loss: ten steps of embed, loss, backward, AdamW on one fixed batch halve it,
  and through train.py the mean loss of the last epoch is less than half that of the first;
- a model trained on the question-answer pairs ranks each question's answer better than before;
- a run stopped by Ctrl-C (a real SIGINT) writes a checkpoint and exits with code 130, and `--resume`
  then logs exactly the entries an uninterrupted run logs (same losses, learning rates, gradient
  norms and dev scores, compared with ==) and saves bit-identical weights: the checkpoint holds the
  weights, the optimizer moments, the schedule, the random state behind dropout and the data position;
- a NaN loss stops the run with a message naming the step and the last good checkpoint, which is left
  as it was; a full disk while writing a checkpoint leaves the previous one byte for byte;
- a kill that cut the last log line short is survived by --resume (the line is dropped, with a
  note); a damaged earlier line, or a checkpoint.pt that is not one of ours (damaged, cut short, another
  program's, a pickle with classes in it), is named and nothing is changed; a real write failure
  (a file size limit set on the process) gives the "could not write the checkpoint" message and
  leaves no temporary file; a folder that holds anything is never reused without --resume;
- bad input stops with a message naming what was wrong before anything is written: an unknown or
  unsupported arch / metric / loss, a number out of range (negative, NaN, inf), a score outside [0, 1], no training
  examples, data of the wrong shape, a cross-encoder pickle that names a function, --dim on a model that
  has a Dense layer, a flag given with --resume that disagrees with the checkpoint (named: --resume
  takes every other setting from it), --resume without a checkpoint, a new run into the folder of another;
- the losses of a few short runs are those recorded before training/fit.py was restructured (a regression pin),
  as close as float32 adding in another order over the run's steps allows (tests/tolerances.py);
- DIR/final and DIR/best are sentence-transformers folders: minisbert.load and evaluate.py read them,
  final holds the trained weights, best is the trained step that scored highest on the dev split (the
  model before training is scored, not kept, as in sentence-transformers), and
  sentence-transformers (when installed) computes the same embeddings, as close as float32 allows.

The model is a 2-layer BERT of width 32 with random weights, dropout 0.1 (so that a resumed run only
matches if the random state is restored), mean pooling and normalisation like all-MiniLM-L6-v2. Its
WordPiece vocabulary is made of the words of the test data, so no word is [UNK] and the encoder can
tell the sentences apart. The data are 18 sentences about bread, bikes, the sky and gardens,
written to tmp_path as pairs.tsv, triplets.tsv and a BEIR folder; SICK (labelled pairs for the
softmax objective) is replaced by a few such pairs.
"""

import errno
import json
import os
import pickle
import re
import resource
import signal
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import evaluate
import minisbert
import train
from minisbert import datasets
from minisbert.training import fit as fitting
from minisbert.training import checkpoints, training_data
from minisbert.common import cpu, precision
from minisbert.encoding.config import EncoderConfig
from minisbert.encoding.encoder import Encoder
from minisbert.evaluation.benchmark import evaluate_dev
from minisbert.encoding.fast import tiled_encoder as fast_encoder
from minisbert.training.losses import SoftmaxClassifier, select_loss
from minisbert.training.optim import AdamW
from minisbert.encoding.model import SentenceModel
from minisbert.encoding.tokenizer import Tokenizer

from ..conftest import FIXTURES, assert_one_clear_line, run_script
from ..host_reads import HostReads
from ..tolerances import embeddings_apart, float32_apart, scale, training_roundings

# (anchor, positive, negative): six questions, each with an answer and an answer to another question.
TRIPLETS = [
    ("how long should bread dough rise", "let the dough rise until it has doubled in size",
     "pump the tyres to the pressure printed on the side"),
    ("why does my bike chain squeak", "a dry chain squeaks , so oil it after every wet ride",
     "knead the dough for ten minutes until it is smooth"),
    ("why is the sky blue", "air scatters blue light much more than red light",
     "water tomato plants at the roots and not on the leaves"),
    ("when should tomato plants be watered", "water tomatoes early in the morning before the sun is high",
     "the moon has phases because we see more or less of its lit half"),
    ("what makes a bread crust crisp", "steam in a hot oven keeps the crust thin and crisp",
     "fix a flat tyre with a patch and some glue"),
    ("why does the moon change shape", "we see a different part of the lit half of the moon each night",
     "keep bread in a cloth bag at room temperature"),
]
# Scored pairs: each question with its answer (0.9) and with the other answer (0.1).
PAIRS = [(a, p, 0.9) for a, p, _ in TRIPLETS] + [(a, n, 0.1) for a, _, n in TRIPLETS]
# Labelled pairs standing in for SICK: answer = ENTAILMENT, other answer = NEUTRAL, the two answers
# = CONTRADICTION; relatedness on SICK's 1..5 scale.
SICK_PAIRS = ([datasets.ScoredPair(a, p, 4.5, "ENTAILMENT") for a, p, _ in TRIPLETS]
              + [datasets.ScoredPair(a, n, 1.5, "NEUTRAL") for a, _, n in TRIPLETS]
              + [datasets.ScoredPair(p, n, 1.0, "CONTRADICTION") for _, p, n in TRIPLETS])
TEXTS = sorted({text for triplet in TRIPLETS for text in triplet})
# The BEIR folder: documents are the answers, queries the questions; four are judged for training
# (train.py mines a negative for each), two for choosing the best model.
CORPUS = {f"d{i}": text for i, text in enumerate(sorted({t for _, p, n in TRIPLETS for t in (p, n)}))}
QUERIES = {f"q{i}": anchor for i, (anchor, _, _) in enumerate(TRIPLETS)}
DOC_ID = {text: doc_id for doc_id, text in CORPUS.items()}
QRELS = {f"q{i}": {DOC_ID[positive]: 1} for i, (_, positive, _) in enumerate(TRIPLETS)}
TRAIN_QUERIES, DEV_QUERIES = ["q0", "q1", "q2", "q3"], ["q4", "q5"]


# ---------------------------------------------------------------------------------------------
# The model, the data and a way to run train.py


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see conftest.py
TINY_WIDTHS = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64}  # 8 per head
TINY_MAX_TOKENS = 32  # its max_seq_length


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory, dropout=0.1)


def make_tiny_model(tmp_path_factory, dropout: float) -> Path:
    """A random 2-layer BERT saved in the sentence-transformers layout, its vocabulary the data's words."""
    words = sorted({word for text in TEXTS for word in re.findall(r"\w+|[^\w\s]", text.lower())})
    vocab_dir = tmp_path_factory.mktemp("vocab")
    (vocab_dir / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
    (vocab_dir / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    config = EncoderConfig(family="bert", vocab_size=5 + len(words), **TINY_WIDTHS, max_position_embeddings=64,
                           type_vocab_size=2, layer_norm_eps=1e-12, activation="gelu", pad_token_id=0,
                           hidden_dropout=dropout, attention_dropout=dropout, positions_after_pad=False)
    torch.manual_seed(0)
    tokenizer = Tokenizer.from_dir(vocab_dir, max_seq_length=TINY_MAX_TOKENS)
    assert "[UNK]" not in tokenizer.rust.encode(" ".join(TEXTS)).tokens
    folder = tmp_path_factory.mktemp("models") / "tiny"
    SentenceModel(Encoder(config), tokenizer, "mean", normalize_embeddings=True, tokenizer_dir=vocab_dir).save(folder)
    return folder


@pytest.fixture(scope="module")
def tsv_data(tmp_path_factory) -> Path:
    """A folder with pairs.tsv and triplets.tsv (no qrels, so no dev evaluation)."""
    folder = tmp_path_factory.mktemp("tsv_data")
    datasets.write_pairs_tsv(folder / "pairs.tsv", [datasets.ScoredPair(*pair) for pair in PAIRS])
    datasets.write_triplets_tsv(folder / "triplets.tsv", [datasets.Triplet(*triplet) for triplet in TRIPLETS])
    return folder


@pytest.fixture(scope="module")
def beir_data(tmp_path_factory) -> Path:
    """A BEIR folder with qrels/train.tsv (triplets are mined from it) and qrels/dev.tsv."""
    folder = tmp_path_factory.mktemp("beir")
    for split, query_ids in (("train", TRAIN_QUERIES), ("dev", DEV_QUERIES)):
        datasets.write_beir(folder, CORPUS, QUERIES, {q: QRELS[q] for q in query_ids}, split)
    return folder


@pytest.fixture
def fake_sick(monkeypatch):
    """--data sick reads SICK_PAIRS, for training (split train) and for the dev score (split dev,
    which is SICK's trial split)."""
    splits = []

    def load_sts(data, split):
        assert data == "sick"
        splits.append(split)
        return list(SICK_PAIRS)

    monkeypatch.setattr(datasets, "load_sts", load_sts)
    return splits


def run_train(output: Path, model: Path, *args) -> list:
    """`python train.py ARGS --output OUTPUT`, in-process, on CPU; returns log.jsonl as a list."""
    train.main(["--model", str(model), "--device", "cpu", "--seed", "7", "--batch-size", "4",
                "--lr", "1e-2", *args, "--output", str(output)])
    return read_log(output)


def read_log(output: Path) -> list:
    return [json.loads(line) for line in (output / "log.jsonl").read_text().splitlines()]


def epoch_means(log: list) -> list:
    epochs = sorted({entry["epoch"] for entry in log})
    return [np.mean([entry["loss"] for entry in log if entry["epoch"] == epoch]) for epoch in epochs]


# ---------------------------------------------------------------------------------------------
# Every objective learns


# One batch of each shape a loss reads (training_data.example_shape), from the six questions above.
FIXED_BATCHES = {
    training_data.SCORED: [training_data.Example((a, b), score) for a, b, score in PAIRS],
    training_data.TRIPLETS: [training_data.Example(triplet) for triplet in TRIPLETS],
    training_data.LABELLED: [training_data.Example((p.sentence1, p.sentence2), datasets.ENTAILMENT_LABELS.index(p.label))
                             for p in SICK_PAIRS],
    training_data.POSITIVE_PAIRS: [training_data.Example((a, p)) for a, p, _ in TRIPLETS],
}


@pytest.mark.parametrize("arch, metric, loss", [
    ("siamese", "cosine", None), ("siamese", "euclidean", None), ("triplet", "cosine", None),
    ("triplet", "euclidean", None), ("siamese", "cosine", "softmax"), ("siamese", "cosine", "mnrl"),
    ("triplet", "cosine", "mnrl"),
])
def test_a_few_steps_on_one_fixed_batch_lower_its_loss(arch, metric, loss, tiny_model):
    """The heart of training/fit.py with nothing around it: embed the batch, compute the loss, backward, AdamW
    step. Ten steps on the same batch must lower that batch's loss, whatever the objective; dropout
    is off, so the loss is a function of the weights alone."""
    spec = select_loss(arch, metric, loss)
    batch = FIXED_BATCHES[training_data.example_shape(spec)]
    model = minisbert.load(tiny_model, device="cpu")
    model.eval()  # no dropout: every loss below is that of the same batch under other weights
    classifier = SoftmaxClassifier(model.dimension, n_labels=3) if spec.label_kind == "class" else None
    parameters = list(model.parameters()) + (list(classifier.parameters()) if classifier is not None else [])
    optimizer = AdamW(parameters, lr=1e-2)
    losses = []
    for _ in range(10):
        embeddings = fitting.embed_examples(model, batch)  # one (B, D) tensor per text column
        batch_loss = spec(embeddings, batch, margin=0.5, classifier=classifier)
        batch_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(batch_loss.item())
    assert losses[-1] < 0.5 * losses[0], f"{spec.name}: {losses}"


def reciprocal_rank_of_answers(model) -> float:
    """Mean over the six questions of 1 / the rank of its answer among all twelve answers."""
    answers = sorted({text for _, positive, negative in TRIPLETS for text in (positive, negative)})
    scores = model.encode([anchor for anchor, _, _ in TRIPLETS]) @ model.encode(answers).T  # (6, 12) cosine
    ranks = [1 + int((row > row[answers.index(positive)]).sum()) for row, (_, positive, _) in zip(scores, TRIPLETS)]
    return float(np.mean([1 / rank for rank in ranks]))


def test_a_model_trained_on_the_pairs_ranks_their_answers_better_than_before(tiny_model, tsv_data, tmp_path):
    """What training is for: after 10 epochs of MNRL on the (question, answer) pairs, each question
    finds its own answer among the twelve better than the random model did (MRR 0.54 before, 1 after)."""
    before = reciprocal_rank_of_answers(minisbert.load(tiny_model, device="cpu"))
    run_train(tmp_path / "run", tiny_model, "--data", str(tsv_data), "--loss", "mnrl", "--epochs", "10")
    after = reciprocal_rank_of_answers(minisbert.load(tmp_path / "run" / "final", device="cpu"))
    assert before < 0.6 and after == 1.0, (before, after)


@pytest.mark.parametrize("name, objective, examples", [
    ("siamese-cosine", ["--arch", "siamese", "--metric", "cosine"], len(PAIRS)),
    ("siamese-euclidean", ["--arch", "siamese", "--metric", "euclidean"], len(PAIRS)),
    ("triplet-cosine", ["--arch", "triplet", "--metric", "cosine", "--margin", "0.5"], len(TRIPLETS)),
    ("triplet-euclidean", ["--arch", "triplet", "--metric", "euclidean"], len(TRIPLETS)),
    ("mnrl", ["--loss", "mnrl"], len(TRIPLETS)),  # (anchor, positive) from triplets.tsv
    ("mnrl-hard-negatives", ["--arch", "triplet", "--loss", "mnrl"], len(TRIPLETS)),
    ("softmax", ["--arch", "siamese", "--loss", "softmax", "--data", "sick"], len(SICK_PAIRS)),
])
def test_each_objective_lowers_its_loss(name, objective, examples, tiny_model, tsv_data, fake_sick, tmp_path):
    output = tmp_path / "run"
    log = run_train(output, tiny_model, "--data", str(tsv_data), *objective, "--epochs", "10")
    steps = 10 * -(-examples // 4)  # 10 epochs of ceil(examples / 4) batches
    assert [entry["step"] for entry in log] == list(range(1, steps + 1))
    assert json.loads((output / "summary.json").read_text())["loss"] == name
    assert set(fake_sick) == ({"train", "dev"} if "sick" in objective else set())
    means = epoch_means(log)
    assert len(means) == 10
    assert means[-1] < 0.5 * means[0], f"{name}: mean loss per epoch {means}"


# ---------------------------------------------------------------------------------------------
# Checkpoints: Ctrl-C and --resume


def beir_args(beir_data) -> list:
    """Triplets mined from the BEIR folder's train split, a Dense layer to 8 dimensions, 7 steps of
    batches of 3 over 4 triplets (2 batches an epoch), a checkpoint every 3 steps, warmup over
    int(0.3 * 7) = 2 steps. The dev score is left to train.py's default, about 4 times a run: every
    ceil(7 / 4) = 2 steps and at the last."""
    return ["--arch", "triplet", "--metric", "cosine", "--margin", "0.5", "--dim", "8", "--data", str(beir_data),
            "--batch-size", "3", "--epochs", "10", "--max-steps", "7", "--checkpoint-steps", "3", "--warmup", "0.3"]


@pytest.fixture(scope="module")
def beir_run(tiny_model, beir_data, tmp_path_factory) -> Path:
    """The output folder of one uninterrupted run with beir_args."""
    output = tmp_path_factory.mktemp("beir_run") / "run"
    run_train(output, tiny_model, *beir_args(beir_data))
    return output


@pytest.fixture
def sigint_handler():
    """A SIGINT handler of the test's own, for train.py to set aside and put back: a Ctrl-C that
    train.py failed to catch then lands here and fails the test instead of stopping pytest."""
    caught = []

    def handler(signum, frame):
        caught.append(signum)

    previous = signal.signal(signal.SIGINT, handler)
    yield handler, caught
    signal.signal(signal.SIGINT, previous)


def press_ctrl_c_after_step(monkeypatch, step: int) -> None:
    """Send this process a real SIGINT, once, right after train.py logs `step`, in the middle of the loop."""
    append_log, pressed = checkpoints.append_log, []

    def append_log_then_interrupt(path, entry):
        append_log(path, entry)
        if entry["step"] == step and not pressed:
            pressed.append(step)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(checkpoints, "append_log", append_log_then_interrupt)


def interrupt_and_resume(output, tiny_model, args, monkeypatch, sigint_handler, step) -> dict:
    """Run train.py with Ctrl-C after `step`, check what it left, resume; return the checkpoint it left."""
    handler, caught = sigint_handler
    press_ctrl_c_after_step(monkeypatch, step)
    with pytest.raises(SystemExit) as stopped:
        run_train(output, tiny_model, *args)
    assert stopped.value.code == 130
    assert caught == [] and signal.getsignal(signal.SIGINT) is handler  # train.py caught it, then put ours back
    assert [entry["step"] for entry in read_log(output)] == list(range(1, step + 1))
    assert not (output / "final").exists()
    checkpoint = checkpoints.load_checkpoint(output / "checkpoint.pt")
    assert checkpoint["step"] == step
    train.main(["--output", str(output), "--resume", "--device", "cpu"])  # every other setting from the checkpoint
    return checkpoint


def test_ctrl_c_then_resume_logs_exactly_what_an_uninterrupted_run_logs(
        beir_run, tiny_model, beir_data, tmp_path, monkeypatch, sigint_handler):
    output = tmp_path / "interrupted"
    # Step 5 is not a checkpoint step (3, 6, 7): the checkpoint there is Ctrl-C's. It falls in the
    # middle of epoch 2 (steps 5 and 6), after its first batch.
    checkpoint = interrupt_and_resume(output, tiny_model, beir_args(beir_data), monkeypatch, sigint_handler, 5)
    assert (checkpoint["epoch"], checkpoint["next_batch"]) == (2, 1)
    expected = read_log(beir_run)
    assert [entry["step"] for entry in expected] == list(range(1, 8))
    assert [entry["step"] for entry in expected if "eval" in entry] == [2, 4, 6, 7]
    assert all(sorted(entry["eval"]) == ["mrr@10", "ndcg@10"] for entry in expected if "eval" in entry)
    assert read_log(output) == expected  # every loss, lr, gradient norm and dev score, exactly
    for folder in ("final", "best"):
        for name in ("model.safetensors", "2_Dense/model.safetensors"):
            assert (output / folder / name).read_bytes() == (beir_run / folder / name).read_bytes()
    summary, expected_summary = (json.loads((out / "summary.json").read_text()) for out in (output, beir_run))
    assert summary["best"] == expected_summary["best"]
    # The training time counts the interrupted run's steps too, up to its checkpoint.
    # (summary.json rounds to 0.1 s; on a fast CPU the five steps take under 0.05 s, so compare rounded.)
    assert checkpoint["training_seconds"] > 0
    assert summary["training_seconds"] >= round(checkpoint["training_seconds"], 1)


def test_ctrl_c_at_the_end_of_an_epoch_then_resume_with_the_softmax_classifier(
        tiny_model, fake_sick, tmp_path, monkeypatch, sigint_handler):
    # 18 labelled pairs in batches of 6: 3 batches an epoch; Ctrl-C after step 3 stops between epochs.
    # The classifier W is trained too, so it must come back from the checkpoint as well.
    args = ["--arch", "siamese", "--loss", "softmax", "--data", "sick", "--batch-size", "6", "--max-steps", "7",
            "--epochs", "3", "--checkpoint-steps", "2", "--eval-steps", "3"]
    expected = run_train(tmp_path / "uninterrupted", tiny_model, *args)
    output = tmp_path / "interrupted"
    checkpoint = interrupt_and_resume(output, tiny_model, args, monkeypatch, sigint_handler, 3)
    assert (checkpoint["epoch"], checkpoint["next_batch"]) == (0, 3)
    assert set(checkpoint["classifier"]) == {"linear.weight", "linear.bias"}
    assert [entry["epoch"] for entry in expected] == [0, 0, 0, 1, 1, 1, 2]
    assert read_log(output) == expected
    assert (output / "final" / "model.safetensors").read_bytes() == \
        (tmp_path / "uninterrupted" / "final" / "model.safetensors").read_bytes()


def test_the_log_has_one_line_per_step_with_the_learning_rate_that_step_used(beir_run):
    # 7 steps, warmup 2, lr 1e-2: the factor is s / 2 while s < 2, then (7 - s) / (7 - 2), s = 0 .. 6.
    factors = [0, 0.5, 1, 4 / 5, 3 / 5, 2 / 5, 1 / 5]
    log = read_log(beir_run)
    assert [entry["lr"] for entry in log] == [1e-2 * f for f in factors]
    assert all(entry["loss"] >= 0 and entry["grad_norm"] >= 0 for entry in log)
    assert [entry["epoch"] for entry in log] == [0, 0, 1, 1, 2, 2, 3]


# ---------------------------------------------------------------------------------------------
# A NaN loss, a full disk


def record_checkpoints(monkeypatch) -> list:
    """The bytes of checkpoint.pt after each time train.py saves it."""
    saved = []
    save_checkpoint = checkpoints.save_checkpoint

    def save_and_record(path, state):
        save_checkpoint(path, state)
        saved.append(Path(path).read_bytes())

    monkeypatch.setattr(checkpoints, "save_checkpoint", save_and_record)
    return saved


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tiny_model, tsv_data, tmp_path, monkeypatch):
    saved = record_checkpoints(monkeypatch)
    compute_loss, calls = fitting.compute_loss, []

    def nan_at_step_5(*args):
        calls.append(None)
        loss = compute_loss(*args)
        return loss * float("nan") if len(calls) == 5 else loss

    monkeypatch.setattr(fitting, "compute_loss", nan_at_step_5)
    args = ["--data", str(tsv_data), "--epochs", "10", "--max-steps", "8", "--checkpoint-steps", "3"]
    output = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:
        run_train(output, tiny_model, *args)
    message = str(stopped.value.code)
    assert "loss became nan at step 5" in message
    assert f"last good checkpoint is {output / 'checkpoint.pt'} (step 3)" in message
    assert len(saved) == 1 and (output / "checkpoint.pt").read_bytes() == saved[0]
    assert checkpoints.load_checkpoint(output / "checkpoint.pt")["step"] == 3
    assert [entry["step"] for entry in read_log(output)] == [1, 2, 3, 4]
    assert not (output / "final").exists()

    # Resumed from step 3, the run logs step 4 again, once, as if it had never stopped.
    monkeypatch.setattr(fitting, "compute_loss", compute_loss)
    assert run_train(output, tiny_model, *args, "--resume") == run_train(tmp_path / "uninterrupted", tiny_model, *args)


def test_the_folder_of_a_run_that_died_before_its_first_checkpoint_is_left_as_it_was(
        tiny_model, tsv_data, tmp_path, monkeypatch):
    compute_loss, calls = fitting.compute_loss, []

    def nan_at_step_3(*args):
        calls.append(None)
        return compute_loss(*args) * (float("nan") if len(calls) == 3 else 1)

    monkeypatch.setattr(fitting, "compute_loss", nan_at_step_3)
    output, args = tmp_path / "run", ["--data", str(tsv_data), "--max-steps", "3"]
    with pytest.raises(SystemExit, match=r"loss became nan at step 3; .* \(step none written yet\)"):
        run_train(output, tiny_model, *args)
    assert [entry["step"] for entry in read_log(output)] == [1, 2]
    monkeypatch.setattr(fitting, "compute_loss", compute_loss)
    before = snapshot(output)
    with pytest.raises(SystemExit, match=f"{re.escape(str(output))} already holds a run \\(log.jsonl\\); pass --resume"):
        run_train(output, tiny_model, *args)
    with pytest.raises(FileNotFoundError, match="the run stopped before writing one"):
        run_train(output, tiny_model, *args, "--resume")
    assert snapshot(output) == before


def test_a_full_disk_while_saving_a_checkpoint_leaves_the_previous_one_intact(
        tiny_model, tsv_data, tmp_path, monkeypatch):
    atomic_write, saved = checkpoints.atomic_write, []

    def disk_full_from_the_second_checkpoint(path, write):
        if path.name != "checkpoint.pt":
            return atomic_write(path, write)
        if not saved:
            atomic_write(path, write)
            saved.append(path.read_bytes())
            return None

        def write_half_then_fail(tmp):
            tmp.write_bytes(saved[0][: len(saved[0]) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        return atomic_write(path, write_half_then_fail)

    monkeypatch.setattr(checkpoints, "atomic_write", disk_full_from_the_second_checkpoint)
    output = tmp_path / "run"
    with pytest.raises(OSError) as failed:
        run_train(output, tiny_model, "--data", str(tsv_data), "--epochs", "10", "--max-steps", "8",
                  "--checkpoint-steps", "3")
    assert str(failed.value) == (f"could not write the checkpoint {output / 'checkpoint.pt'}: No space left on "
                                 "device. The previous checkpoint, if any, is intact.")
    assert (output / "checkpoint.pt").read_bytes() == saved[0]
    assert checkpoints.load_checkpoint(output / "checkpoint.pt")["step"] == 3
    assert sorted(p.name for p in output.iterdir()) == ["checkpoint.pt", "log.jsonl"]  # no half-written file


def checkpointed_run(tiny_model, tsv_data, output) -> list:
    """An 8-step run with checkpoints every 3 steps, as if killed after step 4: the log goes to step
    4, the checkpoint holds step 3. Returns the arguments it was started with."""
    args = ["--data", str(tsv_data), "--epochs", "10", "--max-steps", "8", "--checkpoint-steps", "3"]
    run_train(output, tiny_model, *args)
    state = checkpoints.load_checkpoint(output / "checkpoint.pt")
    assert state["step"] == 8
    log = (output / "log.jsonl").read_text().splitlines(keepends=True)
    return args, log


@pytest.mark.parametrize("cut", [1, 10, -2])  # characters of line 5 (step 5) written before the kill
def test_resume_drops_the_log_line_a_kill_cut_short(cut, tiny_model, tsv_data, tmp_path, monkeypatch, capsys):
    uninterrupted = run_train(tmp_path / "uninterrupted", tiny_model, "--data", str(tsv_data), "--epochs", "10",
                              "--max-steps", "8", "--checkpoint-steps", "3")
    output = tmp_path / "run"
    saved = record_checkpoints(monkeypatch)
    args, log = checkpointed_run(tiny_model, tsv_data, output)
    (output / "checkpoint.pt").write_bytes(saved[0])  # step 3: the kill came during step 5
    (output / "log.jsonl").write_text("".join(log[:4]) + log[4][:cut])
    assert run_train(output, tiny_model, *args, "--resume") == uninterrupted
    assert f"{output / 'log.jsonl'} line 5 was cut short when the run stopped; dropping it" in capsys.readouterr().out


@pytest.mark.parametrize("damage", ["{not json\n", "[1, 2]\n", "\n"])
def test_resume_names_a_damaged_log_line_and_changes_nothing(damage, tiny_model, tsv_data, tmp_path):
    output = tmp_path / "run"
    args, log = checkpointed_run(tiny_model, tsv_data, output)
    (output / "log.jsonl").write_text("".join(log[:1]) + damage + "".join(log[2:]))
    before = snapshot(output)
    with pytest.raises(ValueError, match=f"{re.escape(str(output / 'log.jsonl'))} line 2 is not a log entry"):
        run_train(output, tiny_model, *args, "--resume")
    assert snapshot(output) == before


class NotTensors:
    pass


@pytest.mark.parametrize("make, problem", [
    (lambda path, good: torch.save({"step": 3}, path), "it lacks identity, model"),
    (lambda path, good: torch.save({"step": NotTensors()}, path), "holds more than tensors and plain values"),
    (lambda path, good: path.write_bytes(good[: len(good) // 2]), "cut short"),
    (lambda path, good: path.write_text("step 3\n"), "not a checkpoint written by minisbert's training"),
])
def test_resume_from_a_file_that_is_not_a_minisbert_checkpoint_is_refused(make, problem, tiny_model, tsv_data, tmp_path):
    output = tmp_path / "run"
    args, _ = checkpointed_run(tiny_model, tsv_data, output)
    make(output / "checkpoint.pt", (output / "checkpoint.pt").read_bytes())
    before = snapshot(output)
    finished = run_script("train.py", "--model", tiny_model, *args, "--output", output, "--resume")
    assert_one_clear_line(finished, f"{output / 'checkpoint.pt'} is not a checkpoint written by minisbert", problem,
                          "start a new run in another --output")
    assert "weights_only" not in finished.stderr
    assert snapshot(output) == before


def test_a_full_disk_while_writing_the_checkpoint_gives_the_project_message(tiny_model, tsv_data, tmp_path):
    """A real write failure from the kernel: the process may write no file larger than 20 kB (the
    checkpoint of the tiny model is about 300 kB; the log and the model it reads stay far below)."""

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    output = tmp_path / "run"
    finished = run_script("train.py", "--model", tiny_model, "--data", tsv_data, "--max-steps", "2", "--output", output,
                         preexec_fn=limit_file_size)
    assert_one_clear_line(finished, f"could not write the checkpoint {output / 'checkpoint.pt'}: File too large. "
                                    "The previous checkpoint, if any, is intact.")
    assert sorted(p.name for p in output.iterdir()) == ["log.jsonl"]  # no temporary file left


def test_an_output_that_is_a_file_is_refused(tiny_model, tsv_data, tmp_path):
    (tmp_path / "run").write_text("my notes")
    finished = run_script("train.py", "--model", tiny_model, "--data", tsv_data, "--output", tmp_path / "run")
    assert_one_clear_line(finished, f"cannot write in {tmp_path / 'run'}: {tmp_path / 'run'} is a file, not a folder")
    assert (tmp_path / "run").read_text() == "my notes"


# ---------------------------------------------------------------------------------------------
# Bad input: a clear message, nothing written


@pytest.mark.parametrize("flag, value", [("--arch", "quadruplet"), ("--metric", "manhattan"),
                                         ("--loss", "contrastive")])
def test_an_unknown_arch_metric_or_loss_is_refused(flag, value, tiny_model, tsv_data, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        run_train(tmp_path / "run", tiny_model, "--data", str(tsv_data), flag, value)
    assert stopped.value.code == 2
    assert f"argument {flag}: invalid choice: '{value}'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flag, value, message", [
    ("--batch-size", "0", "--batch-size must be positive, got 0"),
    ("--epochs", "0", "--epochs must be positive, got 0"),
    ("--max-steps", "-1", "--max-steps must be positive, got -1"),
    ("--checkpoint-steps", "0", "--checkpoint-steps must be positive, got 0"),
    ("--dim", "0", "--dim must be positive, got 0"),
    ("--max-seq-length", "1", "--max-seq-length must be at least 2 (room for the special tokens around a text), got 1"),
    ("--margin", "-1", "--margin must be zero or more, got -1.0"),
    ("--margin", "nan", "--margin must be zero or more, got nan"),
    ("--eval-steps", "-2", "--eval-steps must be zero or more (0: only at the end), got -2"),
    ("--lr", "-0.001", "--lr must be positive, got -0.001"),
    ("--lr", "0", "--lr must be positive, got 0.0"),
    ("--lr", "nan", "--lr must be positive, got nan"),
    ("--lr", "inf", "--lr must be positive, got inf"),
    ("--weight-decay", "-1", "--weight-decay must be zero or more, got -1.0"),
    ("--weight-decay", "inf", "--weight-decay must be zero or more, got inf"),
    ("--warmup", "1.5", "--warmup must be a fraction in [0, 1], got 1.5"),
    ("--warmup", "-0.1", "--warmup must be a fraction in [0, 1], got -0.1"),
    ("--max-grad-norm", "0", "--max-grad-norm must be positive, got 0.0"),
    ("--max-grad-norm", "nan", "--max-grad-norm must be positive, got nan"),
    ("--seed", "-1", "--seed must be in [0, 2**32), got -1"),
])
def test_a_number_out_of_range_is_refused_naming_the_flag(flag, value, message, tiny_model, tsv_data, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        run_train(tmp_path / "run", tiny_model, "--data", str(tsv_data), flag, value)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, message", [
    (["--margin", "5"], "--margin is the triplet losses' margin; siamese-cosine takes none"),
    (["--loss", "mnrl", "--margin", "1"], "mnrl takes none, so it would change nothing"),
])
def test_a_flag_the_chosen_loss_would_ignore_is_refused(args, message, tiny_model, tsv_data, tmp_path, capsys):
    # --margin 1 and --margin 50 gave the same losses to the last digit for every loss but the triplet ones.
    with pytest.raises(SystemExit) as stopped:
        run_train(tmp_path / "run", tiny_model, "--data", str(tsv_data), *args)
    assert stopped.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_multiple_negatives_ranking_with_no_other_example_in_a_batch_is_refused(tiny_model, tsv_data, tmp_path):
    # A batch of one has no negative: the loss was 0 and its gradient 0 at every step, and the run said it was done.
    with pytest.raises(ValueError, match="mnrl ranks each anchor's positive against the batch's other examples; a "
                                         "batch of 1 has none"):
        run_train(tmp_path / "run", tiny_model, "--data", str(tsv_data), "--loss", "mnrl", "--batch-size", "1")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, message", [
    (["--arch", "triplet", "--loss", "softmax"], "no loss for arch='triplet' metric='cosine' loss='softmax'"),
    (["--metric", "euclidean", "--loss", "mnrl"], "no loss for arch='siamese' metric='euclidean' loss='mnrl'"),
])
def test_an_unsupported_combination_is_refused(args, message, tiny_model, tsv_data, tmp_path):
    with pytest.raises(ValueError, match=re.escape(message)):
        run_train(tmp_path / "run", tiny_model, "--data", str(tsv_data), *args)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("score", ["1.5", "-0.2", "nan"])
def test_a_score_outside_0_1_is_refused_with_its_line(score, tiny_model, tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "pairs.tsv").write_text("sentence1\tsentence2\tscore\n"
                                      "why is the sky blue\tair scatters blue light\t0.9\n"
                                      f"why is the sky blue\tknead the dough\t{score}\n")
    with pytest.raises(ValueError, match=re.escape(f"pairs.tsv, line 3: score {float(score)} is outside [0, 1]")):
        run_train(tmp_path / "run", tiny_model, "--data", str(folder), "--arch", "siamese")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("layout, args", [
    ("pairs.tsv", ["--arch", "siamese"]),
    ("triplets.tsv", ["--arch", "triplet"]),
    ("triplets.tsv", ["--loss", "mnrl"]),
    ("beir", ["--arch", "triplet"]),
])
def test_no_training_examples_is_refused(layout, args, tiny_model, tmp_path):
    folder = tmp_path / "data"
    if layout == "beir":  # documents and queries, but no judgments in qrels/train.tsv
        datasets.write_beir(folder, CORPUS, QUERIES, {}, "train")
    else:
        folder.mkdir()
        (folder / layout).write_text({"pairs.tsv": "sentence1\tsentence2\tscore\n",
                                      "triplets.tsv": "anchor\tpositive\tnegative\n"}[layout])
    with pytest.raises(SystemExit, match=f"no training examples in {re.escape(str(folder))}"):
        run_train(tmp_path / "run", tiny_model, "--data", str(folder), *args)
    assert not (tmp_path / "run").exists()


def test_data_without_the_shape_the_loss_needs_is_refused(tiny_model, tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    datasets.write_triplets_tsv(folder / "triplets.tsv", [datasets.Triplet(*TRIPLETS[0])])
    with pytest.raises(ValueError, match=f"no scored pairs in {re.escape(str(folder))}: expected pairs.tsv"):
        run_train(tmp_path / "run", tiny_model, "--data", str(folder), "--arch", "siamese")
    with pytest.raises(ValueError, match=f"no labelled pairs in {re.escape(str(folder))}: expected SICK"):
        run_train(tmp_path / "run", tiny_model, "--data", str(folder), "--loss", "softmax")
    assert not (tmp_path / "run").exists()


def test_dim_on_a_model_that_already_has_a_dense_layer_is_refused(tsv_data, tmp_path):
    with pytest.raises(SystemExit, match="already ends in a Dense layer to 16 dimensions"):
        run_train(tmp_path / "run", FIXTURES / "tiny_st_legacy", "--data", str(tsv_data), "--dim", "8")
    assert not (tmp_path / "run").exists()


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_training_runs_the_fast_encoder_unless_told_to_run_the_plain_one(tiny_model, tsv_data, tmp_path, monkeypatch):
    def refuse(*args):
        raise AssertionError("the fast encoder ran")

    monkeypatch.setattr(fast_encoder, "forward", refuse)
    log = run_train(tmp_path / "plain", tiny_model, "--data", str(tsv_data), "--max-steps", "2", "--plain-encoder")
    assert len(log) == 2 and all(np.isfinite(entry["loss"]) for entry in log)
    with pytest.raises(AssertionError, match="the fast encoder ran"):
        run_train(tmp_path / "fast", tiny_model, "--data", str(tsv_data), "--max-steps", "2")


def test_bfloat16_training_computes_in_bfloat16_and_keeps_float32_weights(tiny_model, tsv_data, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setattr(cpu, "native_bfloat16", lambda: False)
    with pytest.raises(ValueError, match="dtype bfloat16 needs a CPU that multiplies bfloat16 natively"):
        run_train(tmp_path / "refused", tiny_model, "--data", str(tsv_data), "--dtype", "bfloat16")
    assert not (tmp_path / "refused").exists()
    monkeypatch.setattr(cpu, "native_bfloat16", lambda: True)  # torch emulates it here: slow, same rounding
    float32 = [entry["loss"] for entry in run_train(tmp_path / "float32", tiny_model, "--data", str(tsv_data),
                                                    "--max-steps", "3")]
    bfloat16 = [entry["loss"] for entry in run_train(tmp_path / "bfloat16", tiny_model, "--data", str(tsv_data),
                                                     "--max-steps", "3", "--dtype", "bfloat16")]
    # Rounded, not different: bfloat16 keeps 8 significant bits, so each product's inputs move by up to 2^-9
    # (0.2%); these losses move by 0.17-0.31% on AMX, AVX2 and SSE kernels, and rtol 0.05 is 16 times that.
    assert float32 != bfloat16 and np.allclose(bfloat16, float32, rtol=0.05)
    state = checkpoints.load_checkpoint(tmp_path / "bfloat16" / "checkpoint.pt")
    assert all(tensor.dtype == torch.float32 for tensor in state["model"].values() if tensor.is_floating_point())
    moments = [t for group in state["optimizer"]["state"].values() for t in group.values() if torch.is_tensor(t)]
    assert moments and all(t.dtype == torch.float32 for t in moments if t.is_floating_point())


@pytest.fixture
def short_run(tiny_model, tsv_data, tmp_path) -> tuple:
    """A finished 2-step run and the arguments it was started with."""
    args = ["--data", str(tsv_data), "--arch", "siamese", "--max-steps", "2"]
    run_train(tmp_path / "run", tiny_model, *args)
    return tmp_path / "run", args


@pytest.mark.parametrize("change, named", [
    (["--model", str(FIXTURES / "tiny_st_legacy")], f"--model {FIXTURES / 'tiny_st_legacy'} (the run's: "),
    (["--dim", "8"], "--dim 8 (the run's: None)"),
    (["--pooling", "max"], "--pooling max (the run's: None)"),
    (["--metric", "euclidean"], "--metric euclidean (the run's: cosine)"),
    (["--batch-size", "3"], "--batch-size 3 (the run's: 4)"),
    (["--max-steps", "3"], "--max-steps 3 (the run's: 2)"),
    (["--seed", "8"], "--seed 8 (the run's: 7)"),
    (["--lr", "0.5"], "--lr 0.5 (the run's: 0.01)"),
])
def test_resume_refuses_a_flag_that_disagrees_with_the_checkpoint_by_name(change, named, short_run, tiny_model,
                                                                           capsys):
    output, args = short_run
    before = snapshot(output)
    with pytest.raises(SystemExit) as stopped:
        run_train(output, tiny_model, *args, *change, "--resume")  # a flag given twice: the last one counts
    assert stopped.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--resume continues the run in {output} with the settings in its checkpoint" in message
    assert named in message and message.count("(the run's:") == 1
    assert snapshot(output) == before


def test_resume_takes_the_flags_it_is_not_given_from_the_checkpoint(short_run, tiny_model, tmp_path, capsys):
    output, args = short_run
    identity = checkpoints.load_checkpoint(output / "checkpoint.pt")["identity"]
    assert identity["arguments"]["lr"] == 1e-2 and identity["arguments"]["max_steps"] == 2
    resumed = train.parse_args(["--output", str(output), "--resume", "--checkpoint-steps", "5"])
    assert {k: v for k, v in vars(resumed).items() if k not in train.FREE_ON_RESUME} == identity["arguments"]
    assert (resumed.checkpoint_steps, resumed.device) == (5, None)  # given anew, or their defaults


def test_a_new_run_into_a_finished_one_and_resume_without_a_checkpoint_are_refused(short_run, tiny_model, tmp_path):
    output, args = short_run
    before = snapshot(output)
    with pytest.raises(SystemExit, match=f"{re.escape(str(output))} already holds a run \\(checkpoint.pt, final, log.jsonl, summary.json\\); pass --resume"):
        run_train(output, tiny_model, *args)
    assert snapshot(output) == before
    with pytest.raises(FileNotFoundError, match=f"no checkpoint at {re.escape(str(tmp_path / 'new'))}"):
        run_train(tmp_path / "new", tiny_model, *args, "--resume")
    assert not (tmp_path / "new").exists()


# ---------------------------------------------------------------------------------------------
# The saved models


def test_final_holds_the_trained_weights_and_evaluate_py_reads_it(beir_run, beir_data, tmp_path):
    model = minisbert.load(beir_run / "final", device="cpu")
    assert (model.pooling, model.dimension, model.normalize_embeddings) == ("mean", 8, True)
    trained = checkpoints.load_checkpoint(beir_run / "checkpoint.pt")  # written at the last step, 7
    assert trained["step"] == 7
    state = model.state_dict()
    assert sorted(state) == sorted(trained["model"])
    assert all(torch.equal(state[name], trained["model"][name]) for name in state)
    evaluate.main(["--model", str(beir_run / "final"), "--data", str(beir_data), "--split", "dev", "--k", "10",
                   "--no-cache", "--output", str(tmp_path / "eval.json")])
    scores = json.loads((tmp_path / "eval.json").read_text())[str(beir_run / "final")]
    assert scores["ndcg@10"] == read_log(beir_run)[-1]["eval"]["ndcg@10"]  # what train.py measured at step 7


def test_best_scores_on_the_dev_split_what_the_run_reported_for_it(beir_run, beir_data):
    best = json.loads((beir_run / "summary.json").read_text())["best"]
    evaluated = {entry["step"]: entry["eval"]["ndcg@10"] for entry in read_log(beir_run) if entry.get("eval")}
    assert best["metric"] == "ndcg@10" and best["step"] in evaluated  # a trained step, never step 0
    assert all(value <= best["value"] for value in evaluated.values())
    assert evaluated[best["step"]] == best["value"]
    assert min(step for step, value in evaluated.items() if value == best["value"]) == best["step"]  # the first
    model = minisbert.load(beir_run / "best", device="cpu")
    assert evaluate_dev(model, str(beir_data))["ndcg@10"] == best["value"]


@pytest.mark.parametrize("folder", ["final", "best"])
def test_sentence_transformers_reads_the_saved_models_the_same_way(folder, beir_run):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    model = minisbert.load(beir_run / folder, device="cpu")
    ours = model.encode(TEXTS)
    theirs = sentence_transformers.SentenceTransformer(str(beir_run / folder), device="cpu").encode(TEXTS)
    assert ours.shape == theirs.shape == (len(TEXTS), 8)
    assert np.abs(ours - theirs).max() <= embeddings_apart(model) * scale(theirs)  # other kernels: tolerances.py


# ---------------------------------------------------------------------------------------------
# The pieces: batches, Ctrl-C, loss scaling


def test_batches_for_epoch_depend_on_seed_and_epoch_only():
    torch.manual_seed(0)
    batches = fitting.batches_for_epoch(10, 4, seed=3, epoch=1)
    torch.manual_seed(1)  # the global random state (dropout's) plays no part ...
    before = torch.get_rng_state()
    assert fitting.batches_for_epoch(10, 4, seed=3, epoch=1) == batches
    assert torch.equal(torch.get_rng_state(), before)  # ... and is not used up
    assert [len(batch) for batch in batches] == [4, 4, 2]
    assert sorted(i for batch in batches for i in batch) == list(range(10))  # each example once
    assert batches != [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # shuffled
    assert fitting.batches_for_epoch(10, 4, seed=3, epoch=2) != batches  # a new order every epoch
    assert fitting.batches_for_epoch(10, 4, seed=4, epoch=1) != batches


def test_stop_request_turns_the_first_ctrl_c_into_a_flag_and_the_second_into_keyboard_interrupt(sigint_handler):
    handler, caught = sigint_handler
    stop = fitting.StopRequest()
    assert not stop.requested
    os.kill(os.getpid(), signal.SIGINT)
    assert stop.requested and caught == []
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is handler  # a third Ctrl-C goes to whoever had it before
    stop.restore()
    assert signal.getsignal(signal.SIGINT) is handler


def gradients(*values) -> list:
    parameters = []
    for value in values:
        parameter = torch.nn.Parameter(torch.zeros(len(value)))
        parameter.grad = torch.tensor(value)
        parameters.append(parameter)
    return parameters


def test_loss_scaler_skips_overflowing_steps_halves_and_grows_the_scale():
    scaler = precision.LossScaler(enabled=True, scale=8.0, growth_interval=2)
    assert scaler.scaled(torch.tensor(0.25)).item() == 2.0  # 0.25 * 8
    parameters = gradients([8.0, -16.0], [4.0])
    assert scaler.unscale(parameters)  # finite: the gradients are divided by 8
    assert [p.grad.tolist() for p in parameters] == [[1.0, -2.0], [0.5]]
    assert (scaler.scale, scaler.good_steps) == (8.0, 1)
    assert scaler.unscale(gradients([8.0]))  # the 2nd good step in a row doubles the scale
    assert (scaler.scale, scaler.good_steps) == (16.0, 2)
    assert not scaler.unscale(gradients([1.0], [float("inf")]))  # overflow: skip the step, halve
    assert (scaler.scale, scaler.good_steps) == (8.0, 0)
    assert not scaler.unscale(gradients([float("nan")]))
    assert (scaler.scale, scaler.good_steps) == (4.0, 0)
    assert scaler.unscale(gradients([1.0]))
    assert (scaler.scale, scaler.good_steps) == (4.0, 1)  # one good step: no growth yet
    restored = precision.LossScaler(enabled=True)
    restored.load_state_dict(scaler.state_dict())
    assert (restored.scale, restored.good_steps) == (4.0, 1)


@pytest.mark.parametrize("overflow", [False, True])
def test_the_loss_scaler_reads_one_value_from_the_device_however_many_gradients(overflow):
    for count in (1, 12):
        parameters = gradients(*[[1.0, 3.0]] * (count - 1), [float("inf") if overflow else 2.0])
        with HostReads() as spy:
            assert precision.LossScaler(enabled=True, scale=8.0).unscale(parameters) is not overflow
        assert spy.calls == ["__bool__"]


def test_a_disabled_loss_scaler_changes_nothing_and_never_skips():
    scaler = precision.LossScaler(enabled=False, scale=8.0)
    assert scaler.scale == 1.0 and scaler.scaled(torch.tensor(0.25)).item() == 0.25
    parameters = gradients([3.0, float("inf")])
    assert scaler.unscale(parameters)
    assert parameters[0].grad.tolist() == [3.0, float("inf")]


def test_a_cross_encoder_pickle_holding_more_than_plain_data_is_refused_by_train_py_in_one_line(
        tiny_model, tmp_path):
    """The scores file of an MS MARCO folder may be a pickle, read with an unpickler that calls
    nothing; one that names a function (here print) is refused with the file's name, no traceback."""
    folder = tmp_path / "msmarco"
    folder.mkdir()
    (folder / "collection.tsv").write_text("p1\tpositive passage\nn1\tfar negative\n")
    (folder / "queries.train.tsv").write_text("1\tfirst query\n")
    (folder / "msmarco-hard-negatives.jsonl").write_text('{"qid": 1, "pos": ["p1"], "neg": {"bm25": ["n1"]}}\n')
    with open(folder / "cross-encoder-ms-marco-MiniLM-L-6-v2-scores.pkl", "wb") as scores:
        pickle.dump({"1": {"p1": print}}, scores)
    finished = run_script("train.py", "--model", tiny_model, "--data", folder, "--arch", "triplet",
                          "--output", tmp_path / "run")
    assert_one_clear_line(finished, "cross-encoder-ms-marco-MiniLM-L-6-v2-scores.pkl: refusing to load builtins.print")


def test_msmarco_examples_use_sigmoid_labels_and_the_cross_encoder_margin(tmp_path):
    """Rygaard et al. ("Distance Dilemma", section 2.1): labels are sigmoid(cross-encoder logit);
    a negative is kept only if it scores at least 3 logits below the positive. Query 1's positive p1 scores 5.0: n1 (1.5, 3.5 below) is
    kept, n2 (3.0, only 2.0 below) is dropped. Query 2 has no negative far enough below: left out."""
    (tmp_path / "collection.tsv").write_text("p1\tpositive passage\nn1\tfar negative\nn2\tclose negative\n"
                                             "p2\tanother positive\n")
    (tmp_path / "queries.train.tsv").write_text("1\tfirst query\n2\tsecond query\n")
    (tmp_path / "msmarco-hard-negatives.jsonl").write_text(
        '{"qid": 1, "pos": ["p1"], "neg": {"bm25": ["n1", "n2"]}}\n'
        '{"qid": 2, "pos": ["p2"], "neg": {"bm25": ["n2"]}}\n')
    (tmp_path / "cross-encoder-ms-marco-MiniLM-L-6-v2-scores.json").write_text(
        json.dumps({"1": {"p1": 5.0, "n1": 1.5, "n2": 3.0}, "2": {"p2": 4.0, "n2": 3.0}}))
    triplets = training_data.training_examples(str(tmp_path), training_data.TRIPLETS)
    assert [e.texts for e in triplets] == [("first query", "positive passage", "far negative")]
    pairs = training_data.training_examples(str(tmp_path), training_data.SCORED)
    assert [e.texts[1] for e in pairs] == ["positive passage", "far negative"]
    # sigmoid(5.0) = 1 / (1 + e^-5) = 0.993307; sigmoid(1.5) = 0.817574. Rounded as written here: the
    # float64 values (0.99330715, 0.81757448) lie 2e-8 and more from a rounding edge, 1e8 ulps.
    assert [round(e.label, 6) for e in pairs] == [0.993307, 0.817574]
    (tmp_path / "queries.train.tsv").unlink()
    with pytest.raises(ValueError, match="queries.train.tsv"):
        training_data.training_examples(str(tmp_path), training_data.TRIPLETS)


def test_the_command_line_refuses_a_nan_learning_rate_in_one_line(tiny_model, tsv_data, tmp_path):
    finished = run_script("train.py", "--model", tiny_model, "--data", tsv_data, "--lr", "nan", "--output", tmp_path / "run")
    assert_one_clear_line(finished, "--lr must be positive, got nan")
    assert not (tmp_path / "run").exists()


def test_mnrl_on_pairs_reads_the_judgments_as_they_are_and_mines_nothing(tiny_model, beir_data, monkeypatch):
    """MNRL without hard negatives reads (query, relevant document) pairs: the mined triplets'
    first two texts, in their order, taken from qrels/train.tsv with no model and no mining."""
    model = minisbert.load(tiny_model)
    triplets = training_data.training_examples(str(beir_data), training_data.TRIPLETS, model=model)
    monkeypatch.setattr(training_data, "mine_hard_negatives", lambda *a, **k: pytest.fail("mined for pairs"))
    pairs = training_data.training_examples(str(beir_data), training_data.POSITIVE_PAIRS)
    assert pairs and [e.texts for e in pairs] == [e.texts[:2] for e in triplets]
    assert all(e.label is None for e in pairs)
    assert training_data.example_shape(select_loss("siamese", "cosine", "mnrl")) == training_data.POSITIVE_PAIRS
    assert training_data.example_shape(select_loss("triplet", "cosine", "mnrl")) == training_data.TRIPLETS


def test_positive_pairs_from_triplets_tsv_are_each_triplets_first_two_texts(tmp_path):
    (tmp_path / "triplets.tsv").write_text("a query\tits answer\ta wrong answer\n")
    pairs = training_data.training_examples(str(tmp_path), training_data.POSITIVE_PAIRS)
    assert [e.texts for e in pairs] == [("a query", "its answer")]



# ---------------------------------------------------------------------------------------------
# A regression pin: the losses of a few short runs, as recorded


# Recorded from commit da776ad (before training/fit.py and training.py were restructured, issue 20) on the
# tiny model above, as a regression pin: they are what the code computed then, not a reference that
# they are right (the tests above and tests/training/test_losses.py say what right is). A change to the loop
# that moves any of them (another order of the examples or of the random draws behind dropout,
# other optimizer arithmetic) fails here: another draw of the dropout masks (the plain encoder's) moves
# each run's losses by 2e-2 to 1.9 of its largest loss.
PINNED_LOSSES = {
    "siamese-cosine": [0.3040706515312195, 0.2940273880958557, 0.25736862421035767,
                       0.17882120609283447, 0.22674861550331116, 0.09791646897792816],
    "triplet-euclidean": [0.9067070484161377, 1.2067525386810303, 0.8333272337913513,
                          0.787920355796814, 0.6296185255050659, 0.6395014524459839],
    "mnrl": [1.0002577304840088, 0.5289995074272156, 0.26140618324279785,
             0.02435501292347908, 0.04479881376028061, 0.7650800347328186],
    "mnrl-hard-negatives": [1.5405848026275635, 4.294837951660156, 1.3657152652740479,
                            0.7994808554649353, 0.4418729543685913, 0.7879898548126221],
    "softmax": [1.0996103286743164, 1.1773173809051514, 1.171839952468872,
                1.164626121520996, 1.0387457609176636, 1.0984987020492554],
    "beir-triplet": [0.4690665304660797, 0.47934412956237793, 0.40018948912620544,
                     0.2733233571052551, 0.3334507644176483, 0.2607764005661011, 0.1272134780883789],
}


# Another CPU's kernels add in another order, step after step (tests/tolerances.py, training_roundings): the
# bound is that of the longest run, 7 steps of batches of up to 12 texts of 32 tokens through the tiny model,
# with a Dense layer (32) and the normalisation (8), 1.2e-4 of a run's largest loss (at least 1). These runs
# on this CPU's AVX-512 and AMX kernels and on its AVX2 and SSE ones (ATEN_CPU_CAPABILITY,
# MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA), on 1 and 2 threads, and the pins differ by at most 4.1e-6 of it.
PINNED_APART = float32_apart(training_roundings(SimpleNamespace(**TINY_WIDTHS, head_size=8), TINY_MAX_TOKENS,
                                                4 * 3 * TINY_MAX_TOKENS, steps=7, head=32 + 8))


def assert_pinned(losses: list, name: str):
    pinned = PINNED_LOSSES[name]
    assert losses == pytest.approx(pinned, abs=PINNED_APART * scale(np.array(pinned)))


@pytest.mark.parametrize("name, objective", [
    ("siamese-cosine", ["--arch", "siamese", "--metric", "cosine"]),
    ("triplet-euclidean", ["--arch", "triplet", "--metric", "euclidean"]),
    ("mnrl", ["--loss", "mnrl"]),
    ("mnrl-hard-negatives", ["--arch", "triplet", "--loss", "mnrl"]),
    ("softmax", ["--arch", "siamese", "--loss", "softmax", "--data", "sick"]),
])
def test_the_losses_of_short_runs_are_those_recorded_before_the_restructuring(
        name, objective, tiny_model, tsv_data, fake_sick, tmp_path):
    log = run_train(tmp_path / "run", tiny_model, "--data", str(tsv_data), *objective, "--max-steps", "6",
                    "--epochs", "10")
    assert_pinned([entry["loss"] for entry in log], name)


def test_the_losses_of_the_mined_beir_run_are_those_recorded_before_the_restructuring(beir_run):
    """Triplets mined with the start model, a Dense layer, dropout, 7 steps over 4 epochs."""
    assert_pinned([entry["loss"] for entry in read_log(beir_run)], "beir-triplet")
