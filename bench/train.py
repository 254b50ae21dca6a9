"""Training speed: Siamese cosine pairs per second on STS-B, minisbert beside sentence-transformers.

    python bench/train.py --peer-python /path/to/peer-env/bin/python    # 480 STS-B pairs = 30 steps of 16
    MINISBERT_PEER_PYTHON=/path/to/peer-env/bin/python python bench/train.py --pairs 160 --repeats 2

Each run is one epoch over the first --pairs STS-B train pairs (gold score / 5), batch 16, texts
truncated at max_seq_length 128 on both sides, float32 on the CPU. A step is: tokenize both texts of
every pair, one forward pass over the 2B texts, the cosine loss, backward, clip the gradient norm at 1,
an AdamW step (lr 2e-5, weight decay 0.01 except biases and LayerNorm) and a schedule step (10% of
the steps linear warmup, then linear decay). Loading the model and reading the data are not timed;
nothing is evaluated or saved on either side.

minisbert: train.py's own step, called piece by piece as train.py calls it (fit.embed_examples,
the siamese-cosine loss, clip_grad_norm_, AdamW, LinearWarmupDecay, train.py's batch order), minus
its logging, evaluation and checkpoints; the forward pass runs the fast encoder, as train.py's does
(--plain: the plain one). Timed from building the optimizer to the last step.

sentence-transformers (never a dependency of minisbert) runs in a child process of the peer
environment's Python, named by --peer-python or $MINISBERT_PEER_PYTHON (bench/peer.py): its documented legacy
`model.fit(train_objectives=[(DataLoader(InputExamples, shuffle=True), CosineSimilarityLoss(model))])`,
the whole call timed. Since v3 `fit` converts the data and runs a SentenceTransformerTrainer, which
needs the `datasets` and `accelerate` packages; where they are missing, `old_fit` (the v2 training
loop, same step, no Trainer) is timed instead and the output says so. CosineSimilarityLoss is
MSE(cos(u, v), y) where ours clamps the cosine at 0 first (minisbert/training/losses.py): the same compute.
Both sides shuffle with their own seed, so their batches (and padding) differ slightly.

Runs alternate (minisbert, peer, minisbert again, ...) so that noise from other processes shows up
as a spread between the minisbert runs; each run starts from freshly loaded pretrained weights.
Printed first: the CPU and its flags.
"""

import argparse
import contextlib
import importlib.util
import io
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import minisbert  # noqa: E402
from bench.peer import add_peer_python_option, check_peer_python, cpu_summary, run_peer  # noqa: E402
from minisbert.training import fit  # noqa: E402
from minisbert.training.training_data import Example  # noqa: E402
from minisbert.datasets import read_stsb, to_unit_score  # noqa: E402
from minisbert.common.hub import resolve  # noqa: E402
from minisbert.training.losses import select_loss  # noqa: E402
from minisbert.training.optim import AdamW, LinearWarmupDecay, clip_grad_norm_, weight_decay_groups  # noqa: E402

# train.py's defaults, given to both sides.
LR, WEIGHT_DECAY, WARMUP, MAX_GRAD_NORM, SEED = 2e-5, 0.01, 0.1, 1.0, 42


def stsb_examples(folder: Path, limit: int) -> list:
    """The first `limit` STS-B train pairs as train.py builds them: scores scaled to [0, 1]."""
    pairs = read_stsb(folder, "train")[:limit]
    return [Example((p.sentence1, p.sentence2), to_unit_score("stsb", p.score)) for p in pairs]


def train_minisbert(model_dir: Path, examples: list, args) -> tuple:
    """One epoch of train.py's step over `examples`; returns (wall seconds, CPU seconds)."""
    model = minisbert.load(model_dir, device="cpu", fast=not args.plain)
    model.max_seq_length = args.max_seq_length
    model.train()
    loss_function = select_loss("siamese", "cosine").function
    torch.manual_seed(SEED)

    start, cpu_start = time.perf_counter(), time.process_time()
    parameters = list(model.named_parameters())
    optimizer = AdamW(weight_decay_groups(parameters, WEIGHT_DECAY), lr=LR)
    steps = math.ceil(len(examples) / args.batch_size)
    scheduler = LinearWarmupDecay(optimizer, int(WARMUP * steps), steps)
    for indices in fit.batches_for_epoch(len(examples), args.batch_size, SEED, epoch=0):
        batch = [examples[i] for i in indices]
        u, v = fit.embed_examples(model, batch)  # (B, D) each, from one forward pass
        labels = torch.tensor([e.label for e in batch], dtype=torch.float32)  # (B,)
        loss = loss_function(u, v, labels)
        loss.backward()
        clip_grad_norm_([p for _, p in parameters], MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        loss.item()  # train.py logs it every step
    return time.perf_counter() - start, time.process_time() - cpu_start


def peer_method() -> str | None:
    """Run in the peer environment: 'fit', 'old_fit' (fit's Trainer needs datasets and accelerate),
    or None when sentence-transformers is not there."""
    if importlib.util.find_spec("sentence_transformers") is None:
        return None
    trainer_needs = ("datasets", "accelerate")
    return "fit" if all(importlib.util.find_spec(name) for name in trainer_needs) else "old_fit"


def train_peer(model_dir: Path, examples: list, args, method: str) -> tuple:
    """One epoch of sentence-transformers' fit (or old_fit) over `examples`; returns (wall seconds,
    CPU seconds, what the Trainer printed: its own train_runtime, which leaves out fit's setup)."""
    from sentence_transformers import InputExample, SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import CosineSimilarityLoss
    from torch.utils.data import DataLoader

    model = SentenceTransformer(str(model_dir), device="cpu")
    model.max_seq_length = args.max_seq_length
    torch.manual_seed(SEED)
    loader = DataLoader([InputExample(texts=list(e.texts), label=e.label) for e in examples],
                        batch_size=args.batch_size, shuffle=True)
    loss = CosineSimilarityLoss(model)
    steps = math.ceil(len(examples) / args.batch_size)
    fit = model.fit if method == "fit" else model.old_fit
    printed = io.StringIO()
    # fit's Trainer wants an output folder (default: ./checkpoints/model); give it a throwaway one.
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch), contextlib.redirect_stdout(printed):
        start, cpu_start = time.perf_counter(), time.process_time()
        fit(train_objectives=[(loader, loss)], epochs=1, steps_per_epoch=steps,
            warmup_steps=int(WARMUP * steps), optimizer_params={"lr": LR}, weight_decay=WEIGHT_DECAY,
            max_grad_norm=MAX_GRAD_NORM, show_progress_bar=False)  # no evaluator, no output_path: no saving
        return time.perf_counter() - start, time.process_time() - cpu_start, printed.getvalue().strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="all-MiniLM-L6-v2", help="a known name or a model directory")
    parser.add_argument("--data", type=Path,
                        default=Path(os.environ.get("MINISBERT_DATA_MIRROR",
                                                    Path(__file__).resolve().parents[2] / "shared" / "data")) / "stsb")
    parser.add_argument("--pairs", type=int, default=480, help="train on the first N STS-B train pairs")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1,
                        help="minisbert/peer rounds; one more minisbert run closes the sequence")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for both sides (default: torch's own choice); on a machine "
                             "shared with other jobs, 1 thread gives steadier figures")
    parser.add_argument("--plain", action="store_true",
                        help="train minisbert through its plain encoder instead of the fast one")
    add_peer_python_option(parser)
    parser.add_argument("--peer", choices=["method", "run"], help=argparse.SUPPRESS)  # the peer's side
    args = parser.parse_args()
    if args.peer is not None:
        return serve_peer(args)
    check_peer_python(parser, args.peer_python)
    if args.pairs < args.batch_size:
        parser.error(f"--pairs {args.pairs} is less than one batch of {args.batch_size}")
    if not args.data.is_dir():
        parser.error(f"no STS-B folder at {args.data}: pass --data FOLDER, or set MINISBERT_DATA_MIRROR to "
                     "the folder that holds stsb/")
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    examples = stsb_examples(args.data, args.pairs)
    model_dir = resolve(args.model)
    steps = math.ceil(len(examples) / args.batch_size)
    print(f"{len(examples):,} STS-B train pairs = {steps} steps of {args.batch_size}, max_seq_length "
          f"{args.max_seq_length}, fp32, cpu, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
    print(f"CPU: {cpu_summary()}")

    method = None
    if args.peer_python is None:
        print("no peer environment (--peer-python or $MINISBERT_PEER_PYTHON): minisbert alone, no ratio")
    else:
        method = run_peer(args.peer_python, __file__, ["--peer", "method"])["method"]
        if method is None:
            print(f"sentence-transformers is not installed in {args.peer_python}: minisbert alone, no ratio")
        elif method == "old_fit":
            print("note: fit() needs `datasets` and `accelerate` for its Trainer; timing old_fit (the v2 loop)")
    peer_name = f"sentence-transformers {method}" if method else ""
    width = max(len(peer_name), len("minisbert (again)"))
    ours, peer = [], []

    def report(label, rates, seconds, cpu_seconds, extra=""):
        rates.append(len(examples) / seconds)
        # CPU seconds per step count work done, whatever else the machine runs (with more than one
        # thread they also count time spent waiting at synchronisation points).
        print(f"{label:<{width}}  {rates[-1]:7.1f} pairs/s  {1000 * seconds / steps:7.1f} ms/step  "
              f"{1000 * cpu_seconds / steps:7.1f} CPU ms/step  load {os.getloadavg()[0]:.2f}{extra}", flush=True)

    report("minisbert", ours, *train_minisbert(model_dir, examples, args))
    peer_arguments = ["--peer", "run", "--model", str(model_dir), "--data", str(args.data), "--pairs", str(args.pairs),
                      "--batch-size", str(args.batch_size), "--max-seq-length", str(args.max_seq_length)]
    if args.threads is not None:
        peer_arguments += ["--threads", str(args.threads)]
    for _ in range(args.repeats if method else 0):
        seconds, cpu_seconds, printed = run_peer(args.peer_python, __file__, peer_arguments)["result"]
        runtime = re.search(r"'train_runtime': '?([0-9.]+)", printed)
        report(peer_name, peer, seconds, cpu_seconds,
               f"  (Trainer's own train_runtime {runtime[1]} s of {seconds:.1f})" if runtime else "")
        report("minisbert (again)", ours, *train_minisbert(model_dir, examples, args))
    if peer:
        mean_ours, mean_peer = sum(ours) / len(ours), sum(peer) / len(peer)
        print(f"ratio minisbert / {peer_name}: {mean_ours / mean_peer:.2f}x (means of {len(ours)} and "
              f"{len(peer)} runs; best over best {max(ours) / max(peer):.2f}x); target >= 1.2x")


def serve_peer(args):
    """The peer's side, run by the peer environment's Python: print a JSON line with the method
    sentence-transformers offers, or with the result of one run of it."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.peer == "method":
        print(json.dumps({"method": peer_method()}))
    else:
        examples = stsb_examples(args.data, args.pairs)
        print(json.dumps({"result": train_peer(Path(args.model), examples, args, peer_method())}))


if __name__ == "__main__":
    main()
