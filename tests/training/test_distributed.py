"""Tests for minisbert/training/distributed.py, train.py and evaluate.py over 2 processes (gloo, CPU).

What "correct" means past one process:
- training: with dropout off, the same global batch and seed, 2 processes log the losses (and
  gradient norms) of 1 process, as close as float32 adding in another order allows (the ranks' halves
  of a batch are summed apart, then together), for a Siamese loss and for MNRL, with a last batch that
  does not split evenly; MNRL differs when the embeddings are not gathered across ranks (each rank
  then sees only its own slice's negatives), which shows the gather is what makes it equal;
- only rank 0 writes: one log line per step, one checkpoint, one final/ and best/;
- Ctrl-C reaching one rank stops both after the same step with a checkpoint, and --resume under
  2 processes logs what the uninterrupted 2-process run logs, dropout on (the checkpoint holds
  each rank's random generator state);
- sharded search: every rank searches its contiguous shard of the corpus and rank 0 merges, and
  the top-k ids equal one process's exactly, for cosine, dot and euclidean, a corpus of odd size,
  and exact ties (duplicate rows) that straddle the shard boundary;
- encoding and search: evaluate.py over 2 processes (each encodes its shard of a 13-document
  corpus) writes exactly the ranking and metrics of 1 process, for cosine, dot and euclidean;
- shard_range cuts n rows into contiguous, nearly equal parts that cover them once.

Tests that start 2 processes more than once (each start costs seconds) are marked slow.
The processes are started with torch.multiprocessing and the environment torchrun would set
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so train.main runs as under torchrun;
one test starts train.py with torchrun itself, as the README does.
"""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

import evaluate
import minisbert
import train
from minisbert import datasets
from minisbert.training import checkpoints, distributed
from minisbert.search import search

from ..conftest import REPO
from .test_training import CORPUS, PAIRS, QRELS, QUERIES, TRIPLETS, make_tiny_model, read_log
from ..tolerances import float32_apart, scale, scores_apart, training_roundings

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.slow]  # processes of their own: the slow suite (README, "Tests")


@pytest.fixture(scope="module")
def model_without_dropout(tmp_path_factory) -> Path:
    """test_training's random 2-layer BERT of width 32, with dropout 0 so that slices compute what the batch does."""
    return make_tiny_model(tmp_path_factory, dropout=0.0)


@pytest.fixture(scope="module")
def model_with_dropout(tmp_path_factory) -> Path:
    """The same model with dropout 0.1, for resuming: ranks then draw masks from generators of their own."""
    return make_tiny_model(tmp_path_factory, dropout=0.1)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """pairs.tsv (12 scored pairs), triplets.tsv (6), and a BEIR dev split for best/."""
    folder = tmp_path_factory.mktemp("data")
    datasets.write_pairs_tsv(folder / "pairs.tsv", [datasets.ScoredPair(*pair) for pair in PAIRS])
    datasets.write_triplets_tsv(folder / "triplets.tsv", [datasets.Triplet(*triplet) for triplet in TRIPLETS])
    datasets.write_beir(folder, CORPUS, QUERIES, QRELS, "dev")
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, target, args: tuple) -> None:
    """One rank: the environment torchrun sets, one thread (2 ranks share 2 cores), then target."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        target(*args)
    finally:
        distributed.close()


def run_ranks(target, *args, world: int = 2) -> None:
    mp.start_processes(_worker, args=(world, free_port(), target, args), nprocs=world, start_method="spawn")


def _train(argv: list, gather: bool, ctrl_c_after: int | None, exit_codes: Path) -> None:
    if not gather:  # each rank keeps its own slice: what MNRL would see without the gather
        distributed.gather_with_grad = lambda rows, global_examples: rows
    rank = os.environ.get("RANK", "0")
    if ctrl_c_after is not None and rank == "0":
        append_log = checkpoints.append_log

        def append_log_then_interrupt(path, entry):  # only rank 0 logs, so only rank 0 gets Ctrl-C
            append_log(path, entry)
            if entry["step"] == ctrl_c_after:
                os.kill(os.getpid(), signal.SIGINT)

        checkpoints.append_log = append_log_then_interrupt
    try:
        train.main(argv)
        code = 0
    except SystemExit as stopped:
        code = stopped.code
    (exit_codes / f"rank{rank}").write_text(str(code))


def train_args(model: Path, data: Path, output: Path, *args) -> list:
    return ["--model", str(model), "--device", "cpu", "--seed", "7", "--lr", "1e-2", "--data", str(data),
            "--epochs", "2", "--checkpoint-steps", "100", *args, "--output", str(output)]


def logged_apart(model: Path, values: list) -> float:
    """How far 1 and 2 processes may log `values` (losses or gradient norms) apart (tests/tolerances.py):
    the longest of these runs, 6 steps of batches of up to 5 pairs of 32 tokens, each step adding the
    two ranks' gradients together and dividing by the world (2 roundings); a gradient norm adds its sums
    over a parameter's entries and over the parameters."""
    loaded = minisbert.load(model, device="cpu")
    norm = max(p.numel() for p in loaded.parameters()) + len(list(loaded.parameters()))
    tokens = loaded.max_seq_length
    roundings = training_roundings(loaded.encoder.config, tokens, 5 * 2 * tokens, steps=6, head=loaded.dimension)
    return float32_apart(roundings + 2 * 6 + norm) * scale(np.array(values))


def train_ranks(world: int, argv: list, tmp_path: Path, gather: bool = True, ctrl_c_after: int = None) -> list:
    codes = tmp_path / f"codes-{world}-{len(list(tmp_path.iterdir()))}"
    codes.mkdir()
    if world == 1:
        _train(argv, gather, ctrl_c_after, codes)
    else:
        run_ranks(_train, argv, gather, ctrl_c_after, codes, world=world)
    return sorted(int(path.read_text()) for path in codes.iterdir())


# ---------------------------------------------------------------------------------------------
# Training


# 12 pairs in batches of 5 (5, 5, 2 an epoch: slices of 3 and 2, then 1 and 1); 6 (anchor, positive)
# pairs from triplets.tsv in batches of 4 (4, 2).
@pytest.mark.parametrize("objective", [["--arch", "siamese", "--metric", "cosine", "--batch-size", "5"],
                                       ["--loss", "mnrl", "--batch-size", "4"]], ids=["siamese-cosine", "mnrl"])
def test_two_processes_log_the_losses_of_one(objective, model_without_dropout, data, tmp_path):
    logs = {}
    for world in (1, 2):
        output = tmp_path / f"world{world}"
        assert train_ranks(world, train_args(model_without_dropout, data, output, *objective), tmp_path) == [0] * world
        logs[world] = read_log(output)
        assert (output / "final" / "model.safetensors").is_file() and (output / "best").is_dir()
    assert [e["step"] for e in logs[2]] == [e["step"] for e in logs[1]]  # one line per step: rank 0's only
    for key in ("loss", "grad_norm"):
        one, two = [e[key] for e in logs[1]], [e[key] for e in logs[2]]
        assert two == pytest.approx(one, abs=logged_apart(model_without_dropout, one)), key
    assert logs[1][0]["loss"] != logs[1][-1]["loss"]  # the model did learn, so later steps test the updates


@pytest.mark.slow
def test_mnrl_without_the_gather_would_log_other_losses(model_without_dropout, data, tmp_path):
    argv = train_args(model_without_dropout, data, tmp_path / "one", "--loss", "mnrl", "--batch-size", "4",
                      "--max-steps", "1")
    train_ranks(1, argv, tmp_path)
    argv = train_args(model_without_dropout, data, tmp_path / "two", "--loss", "mnrl", "--batch-size", "4",
                      "--max-steps", "1")
    train_ranks(2, argv, tmp_path, gather=False)
    one, two = read_log(tmp_path / "one")[0]["loss"], read_log(tmp_path / "two")[0]["loss"]
    # fewer in-batch negatives: a lower loss, by 0.66 here, where adding in another order moves it by 2e-4 at most
    assert abs(one - two) > 1e-2


@pytest.mark.slow
def test_ctrl_c_on_one_rank_stops_both_and_resume_logs_the_uninterrupted_losses(model_with_dropout, data,
                                                                                 tmp_path):
    # Dropout on: each rank draws its own masks, so the checkpoint must restore each rank's generator.
    objective = ["--arch", "triplet", "--metric", "euclidean", "--batch-size", "4"]
    expected = tmp_path / "uninterrupted"
    train_ranks(2, train_args(model_with_dropout, data, expected, *objective), tmp_path)
    output = tmp_path / "interrupted"
    argv = train_args(model_with_dropout, data, output, *objective)
    assert train_ranks(2, argv, tmp_path, ctrl_c_after=2) == [130, 130]
    assert checkpoints.load_checkpoint(output / "checkpoint.pt")["step"] == 2
    assert not (output / "final").exists()
    assert train_ranks(2, argv + ["--resume"], tmp_path) == [0, 0]
    assert read_log(output) == read_log(expected)
    assert (output / "final" / "model.safetensors").read_bytes() == \
        (expected / "final" / "model.safetensors").read_bytes()
    assert sorted(p.name for p in output.iterdir()) == ["best", "checkpoint.pt", "final", "log.jsonl", "summary.json"]


@pytest.mark.slow
def test_the_readme_torchrun_command_trains_one_model(model_without_dropout, data, tmp_path):
    """The real launcher, as the README runs it: torchrun starts 2 processes of train.py, which log
    the losses of one process and write one log, one checkpoint and one model."""
    argv = train_args(model_without_dropout, data, tmp_path / "torchrun", "--loss", "mnrl", "--batch-size", "4")
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    finished = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                               "train.py", *argv], cwd=REPO, env=environment, capture_output=True, text=True,
                              timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert train_ranks(1, train_args(model_without_dropout, data, tmp_path / "one", "--loss", "mnrl",
                                     "--batch-size", "4"), tmp_path) == [0]
    two, one = read_log(tmp_path / "torchrun"), read_log(tmp_path / "one")
    assert [e["step"] for e in two] == [e["step"] for e in one]
    losses = [e["loss"] for e in one]
    assert [e["loss"] for e in two] == pytest.approx(losses, abs=logged_apart(model_without_dropout, losses))
    assert sorted(p.name for p in (tmp_path / "torchrun").iterdir()) == \
        ["best", "checkpoint.pt", "final", "log.jsonl", "summary.json"]
    assert "2 process(es)" in finished.stdout


@pytest.mark.slow
def test_a_batch_smaller_than_the_world_is_refused(model_without_dropout, data, tmp_path):
    argv = train_args(model_without_dropout, data, tmp_path / "run", "--loss", "mnrl", "--batch-size", "1")
    with pytest.raises(Exception, match="cannot be split over 2 processes"):
        run_ranks(_train, argv, True, None, tmp_path)


# ---------------------------------------------------------------------------------------------
# Sharded encoding and search


def test_shard_range_covers_every_row_once_in_nearly_equal_parts():
    for n in (0, 1, 7, 10):
        for shards in (1, 2, 3, 4):
            ranges = [distributed.shard_range(n, s, shards) for s in range(shards)]
            assert [r[0] for r in ranges[1:]] == [r[1] for r in ranges[:-1]] and ranges[0][0] == 0
            assert ranges[-1][1] == n
            assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1


SCORES_AND_KS = [(score, k) for score in ("cosine", "dot", "euclidean") for k in (1, 5, 23)]


def _sharded_search(corpus: np.ndarray, queries: np.ndarray, results: Path) -> None:
    """search() on this rank's shard of precomputed embeddings, merged on rank 0 as sharded_search does."""
    start, stop = distributed.shard_range(len(corpus))
    for score, k in SCORES_AND_KS:
        scores, indices = search(queries, corpus[start:stop], k, score=score, corpus_chunk_size=3)
        merged = distributed.gather_top_k(torch.from_numpy(scores), torch.from_numpy(indices + start),
                                          min(k, len(corpus)), largest=score != "euclidean")
        if distributed.is_main():
            np.save(results / f"{score}-{k}.npy", merged[1])


def test_sharded_search_returns_the_top_k_ids_of_one_process(tmp_path):
    generator = np.random.default_rng(0)
    corpus = generator.standard_normal((23, 8)).astype(np.float32)  # odd: shards of 12 and 11 rows
    corpus[[3, 11, 12, 20]] = corpus[5]  # exact ties, on both sides of the shard boundary (row 12)
    queries = np.concatenate([generator.standard_normal((4, 8)), corpus[[5]] * 0.5]).astype(np.float32)
    run_ranks(_sharded_search, corpus, queries, tmp_path)
    for score, k in SCORES_AND_KS:
        _, expected = search(queries, corpus, k, score=score)
        if score == "cosine" and k >= 5:  # the query is row 5 halved: five rows tie at cosine 1
            assert expected[4, :5].tolist() == [3, 5, 11, 12, 20]
        np.testing.assert_array_equal(np.load(tmp_path / f"{score}-{k}.npy"), expected, err_msg=f"{score} k={k}")


def test_merging_shard_lists_puts_equal_scores_in_corpus_order_and_padding_last():
    shard_a = (torch.tensor([[0.75, 0.5]]), torch.tensor([[7, 2]]))
    shard_b = (torch.tensor([[0.5, float("-inf")]]), torch.tensor([[1, -1]]))
    scores, indices = distributed.merge_shard_top_k([shard_a, shard_b], 4)
    assert indices.tolist() == [[7, 1, 2, -1]] and scores[0, :3].tolist() == [0.75, 0.5, 0.5]
    distances, indices = distributed.merge_shard_top_k(
        [(torch.tensor([[0.1, 0.3]]), torch.tensor([[4, 6]])), (torch.tensor([[0.3]]), torch.tensor([[0]]))],
        2, largest=False)
    assert indices.tolist() == [[4, 0]]


def _evaluate(argv: list) -> None:
    evaluate.main(argv)


@pytest.fixture(scope="module")
def odd_corpus(tmp_path_factory) -> Path:
    """The BEIR dev split with a 13th document (its words those of another, reversed): 2 shards of 7 and 6."""
    folder = tmp_path_factory.mktemp("odd")
    corpus = {**CORPUS, "d-reversed": " ".join(reversed(CORPUS["d0"].split()))}
    assert len(corpus) % 2 == 1
    datasets.write_beir(folder, corpus, QUERIES, QRELS, "dev")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("score", ["cosine", "dot", "euclidean"])
def test_evaluate_py_over_two_processes_writes_the_ranking_of_one(score, model_without_dropout, odd_corpus, tmp_path):
    common = ["--model", str(model_without_dropout), "--data", str(odd_corpus), "--split", "dev", "--k", "1", "5",
              "--score", score, "--no-cache", "--device", "cpu"]
    evaluate.main(common + ["--output", str(tmp_path / "one.json")])
    run_ranks(_evaluate, common + ["--output", str(tmp_path / "two.json")])
    assert json.loads((tmp_path / "two.json").read_text()) == json.loads((tmp_path / "one.json").read_text())
    one, two = ([line.split() for line in path.read_text().splitlines()]
                for path in sorted(tmp_path.glob("*.trec")))  # query, Q0, document, rank, score, tag
    assert [line[:4] for line in two] == [line[:4] for line in one]  # the same documents in the same order
    # The embeddings may differ in the last bits: batches of a shard pad differently from the corpus's, so
    # the products have other shapes. Each score is computed from them as tests/tolerances.py counts.
    model = minisbert.load(model_without_dropout, device="cpu")
    scores = np.array([float(line[4]) for line in one])
    apart = scores_apart(model) * scale(scores)
    np.testing.assert_allclose([float(line[4]) for line in two], scores, rtol=0, atol=apart)
