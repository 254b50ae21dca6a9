"""Fine-tune a sentence encoder as Sentence-BERT does: a Siamese or Triplet network over one encoder.

    python train.py --arch siamese --metric cosine            # the example data in data/example
    python train.py --arch siamese --metric cosine --data stsb --epochs 1
    python train.py --arch triplet --metric euclidean --margin 1 --data scifact
    python train.py --arch siamese --loss softmax --data sick  # SBERT's classification objective
    python train.py --output runs/x --resume                   # continue an interrupted run, its settings
    torchrun --nproc_per_node 8 train.py --loss mnrl --amp bf16 ...  # one model trained by 8 processes (GPUs)

Reads top to bottom: arguments, model, data, the loop, saving. The loop is minisbert/training/fit.py (the
experiment runner, `python -m minisbert.experiments`, trains through it too), the objectives are in
minisbert/training/losses.py, AdamW and the schedule in minisbert/training/optim.py, the examples in
minisbert/training/training_data.py, checkpoints in minisbert/training/checkpoints.py. Writes to --output DIR: log.jsonl
(one line per step), checkpoint.pt (to resume), best/ and final/ (models in the sentence-transformers
layout), summary.json. Under torchrun each
process trains on its slice of every batch (minisbert/training/distributed.py) and rank 0 alone writes them.
"""

import argparse
import math
import sys
import time
from pathlib import Path

import torch

import minisbert
from minisbert.training import checkpoints, distributed
from minisbert.evaluation.benchmark import evaluate_dev
from minisbert.common.flags import given_flags
from minisbert.common.fileio import check_writable_folder, write_json
from minisbert.training.fit import CHECKPOINT, Interrupted, TrainingFailed, TrainingSettings, fit
from minisbert.training.losses import SoftmaxClassifier, select_loss
from minisbert.common.precision import AMP_SPELLINGS, autocast_dtype, dtype_from_flags
from minisbert.encoding.pooling import Dense
from minisbert.training.training_data import example_shape, training_examples


# Every numeric flag, what a usable value satisfies, and how to say it. A value outside these would not
# fail loudly: a negative --lr trains by gradient ascent, a negative --weight-decay grows the weights.
FLAG_RANGES = [
    ("--lr", lambda v: v > 0, "positive"),
    ("--weight-decay", lambda v: v >= 0, "zero or more"),
    ("--warmup", lambda v: 0 <= v <= 1, "a fraction in [0, 1]"),
    ("--max-grad-norm", lambda v: v > 0, "positive"),
    ("--margin", lambda v: v >= 0, "zero or more"),
    ("--dim", lambda v: v > 0, "positive"),
    ("--epochs", lambda v: v > 0, "positive"),
    ("--max-steps", lambda v: v > 0, "positive"),
    ("--batch-size", lambda v: v > 0, "positive"),
    ("--max-seq-length", lambda v: v >= 2, "at least 2 (room for the special tokens around a text)"),
    ("--checkpoint-steps", lambda v: v > 0, "positive"),
    ("--eval-steps", lambda v: v >= 0, "zero or more (0: only at the end)"),
    ("--seed", lambda v: 0 <= v < 2**32, "in [0, 2**32)"),
]
# What a resumed run may be given anew: where it runs and how often it saves change none of its numbers.
# Every other flag is the run's own, stored in its checkpoint.
FREE_ON_RESUME = ("device", "checkpoint_steps", "output", "resume")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=["siamese", "triplet"], default="siamese")
    p.add_argument("--metric", choices=["cosine", "euclidean"], default="cosine")
    p.add_argument("--loss", choices=["softmax", "mnrl"], default=None,
                   help="instead of the arch's own loss: SBERT's classification objective or MNRL")
    p.add_argument("--margin", type=float, default=1.0, help="triplet margin (SBERT 1; Rygaard et al. 5; Bagge et al. 0.05)")
    p.add_argument("--dim", type=int, default=None, help="add a dense projection to DIM dimensions")
    p.add_argument("--pooling", choices=["mean", "max", "cls"], default=None, help="default: the model's own")
    p.add_argument("--model", default="all-MiniLM-L6-v2", help="a known name or a model directory")
    p.add_argument("--data", default="example", help="example, stsb, sick, scifact, or a folder")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--warmup", type=float, default=0.1, help="fraction of the steps spent warming up")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--device", default=None, help="cuda, mps or cpu (default: the best available)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="compute precision: bfloat16 (on a GPU, or a CPU with native bfloat16) and float16 (GPU) "
                        "run under autocast, the weights and optimizer state staying float32")
    p.add_argument("--amp", choices=sorted(AMP_SPELLINGS), default=None,
                   help="mixed precision, as --dtype: bf16 = bfloat16, fp16 = float16")
    p.add_argument("--plain-encoder", action="store_true",
                   help="run the plain encoder (minisbert/encoding/encoder.py, the reference) instead of the fast one: "
                        "slower, the same numbers to 1e-6")
    p.add_argument("--eval-steps", type=int, default=None,
                   help="evaluate on the dev split every N steps (default: 4 times per run; 0: only at the end)")
    p.add_argument("--checkpoint-steps", type=int, default=100)
    p.add_argument("--output", type=Path, default=None,
                   help="default: runs/<loss>-<date>-<time>, e.g. runs/siamese-cosine-20261125-134501")
    p.add_argument("--resume", action="store_true", help="continue the run in --output from its checkpoint")
    args = p.parse_args(argv)
    if args.resume:
        if args.output is None:
            p.error("--resume needs --output DIR: the folder of the run to continue")
        args = settings_of_the_run(p, argv, args)
    try:
        args.dtype = dtype_from_flags(args.amp, args.dtype)
    except ValueError as disagreement:
        p.error(str(disagreement))
    for flag, valid, requirement in FLAG_RANGES:
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if value is not None and not (math.isfinite(value) and valid(value)):
            p.error(f"{flag} must be {requirement}, got {value}")
    try:
        spec = select_loss(args.arch, args.metric, args.loss)
    except ValueError:  # main names an arch, metric and loss that do not go together
        return args
    if "margin" in given_flags(p, argv) and not spec.takes_margin:
        p.error(f"--margin is the triplet losses' margin; {spec.name} takes none, so it would change nothing: "
                "leave it out")
    return args


def settings_of_the_run(p, argv, args) -> argparse.Namespace:
    """--resume: the settings the run in --output was started with, read from its checkpoint, with
    the FREE_ON_RESUME flags given now. Any other flag given again must say what the checkpoint says."""
    saved = checkpoints.load_checkpoint(args.output / CHECKPOINT)["identity"]["arguments"]
    given = given_flags(p, argv)
    differ = [f"--{name.replace('_', '-')} {given[name]} (the run's: {saved[name]})"
              for name in given if name not in FREE_ON_RESUME and given[name] != saved[name]]
    if differ:
        p.error(f"--resume continues the run in {args.output} with the settings in its checkpoint, and these "
                f"flags say otherwise: {', '.join(differ)}; leave them out, or start a new run in another --output")
    return argparse.Namespace(**{**saved, **{name: getattr(args, name) for name in FREE_ON_RESUME}})


def main(argv=None):
    args = parse_args(argv)
    spec = select_loss(args.arch, args.metric, args.loss)
    output = args.output or Path("runs") / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    distributed.init_from_env()  # a world of one without torchrun
    args.device = distributed.device_for_rank(args.device)
    check_output(output, args.resume)
    torch.manual_seed(args.seed)

    # The model: a pretrained encoder with its pooling, plus what this run adds (dense layer, pooling).
    model = minisbert.load(args.model, device=args.device, fast=not args.plain_encoder)
    model.limit_max_seq_length(args.max_seq_length)  # at most the model's positions
    autocast_dtype(args.dtype, model.device)  # a precision this device cannot use is refused before the data is read
    if args.pooling:
        model.pooling = args.pooling
    if args.dim:
        if model.dense is not None:
            sys.exit(f"{args.model} already ends in a Dense layer to {model.dimension} dimensions and a model "
                     "has at most one; leave out --dim, or start from a model without one")
        model.dense = Dense(model.dimension, args.dim, activation="tanh").to(model.device)
    # The losses see what the model outputs, unit length if it normalises (as in sentence-transformers).

    # The data: examples of the shape the loss needs (MNRL without hard negatives reads pairs), and a
    # dev split, when the data has one, to choose the best model.
    examples = training_examples(args.data, example_shape(spec), model=model, seed=args.seed)
    if not examples:
        sys.exit(f"no training examples in {args.data}")
    classifier = None
    if spec.label_kind == "class":
        classifier = SoftmaxClassifier(model.dimension, n_labels=3).to(model.device)

    # The loop (minisbert/training/fit.py): AdamW, warmup and decay, checkpoints, the log, the best model.
    settings = TrainingSettings(
        epochs=args.epochs, max_steps=args.max_steps, batch_size=args.batch_size, lr=args.lr, warmup=args.warmup,
        weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm, margin=args.margin, seed=args.seed,
        dtype=args.dtype, eval_steps=args.eval_steps, checkpoint_steps=args.checkpoint_steps)
    try:
        result = fit(model, examples, spec, output, settings, classifier=classifier, resume=args.resume,
                     run_inputs={"model": str(args.model), "dim": args.dim, "data": args.data,
                               "arguments": {k: v for k, v in vars(args).items() if k not in FREE_ON_RESUME}},
                     evaluate=lambda trained: evaluate_dev(trained, args.data))
    except Interrupted as stop:
        if distributed.is_main():
            print(f"\n{stop}; continue with: python train.py --output {output} --resume")
        sys.exit(130)
    except TrainingFailed as failure:
        sys.exit(str(failure))

    # Saving: the final model and a summary of the run, once.
    if not distributed.is_main():
        return
    model.save(output / "final")
    summary = {**result, "loss": spec.name,
               "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    write_json(output / "summary.json", summary, digest=True)
    best = result["best"]
    print(f"done in {result['training_seconds']:.0f} s; final model: {output / 'final'}"
          + (f"; best: {output / 'best'} ({best['metric']} {best['value']:.4f} at step {best['step']})" if best else ""))


def check_output(output: Path, resume: bool) -> None:
    """A folder to write into, before the work rather than after it, that holds no other run unless
    resuming it: what is there is never overwritten."""
    check_writable_folder(output)
    # Every rank looks before any rank writes (rank 0 creates the folder's files only later).
    held = sorted(path.name for path in output.iterdir()) if output.is_dir() else []
    distributed.barrier()
    if not resume and held:
        sys.exit(f"{output} already holds a run ({', '.join(held[:5])}{', ...' if len(held) > 5 else ''}); "
                 "pass --resume to continue it, or choose another --output")


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError) as error:  # bad input, a missing file, a full disk: the message says what
        sys.exit(f"error: {error}")
    finally:
        distributed.close()
