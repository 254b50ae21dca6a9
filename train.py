"""Fine-tune a sentence encoder as Sentence-BERT does: a Siamese or Triplet network over one encoder.

    python train.py --arch siamese --metric cosine            # the example data in data/example
    python train.py --arch siamese --metric cosine --data stsb --epochs 1
    python train.py --arch triplet --metric euclidean --margin 1 --data scifact
    python train.py --arch siamese --loss softmax --data sick  # SBERT's classification objective
    python train.py --output runs/x --resume                   # continue an interrupted run

Reads top to bottom: arguments, data, model, optimizer, the loop, saving. The objectives are in
minisbert/losses.py, AdamW and the schedule in minisbert/optim.py, data and checkpoints in
minisbert/training.py. Writes to --output DIR: log.jsonl (one line per step), checkpoint.pt (to resume),
best/ and final/ (models in the sentence-transformers layout), summary.json.
"""

import argparse
import math
import sys
import time
from pathlib import Path

import torch

import minisbert
from minisbert import training
from minisbert.evaluation import evaluate_dev
from minisbert.losses import SoftmaxClassifier, select_loss
from minisbert.optim import AdamW, LinearWarmupDecay, clip_grad_norm_, weight_decay_groups
from minisbert.pooling import Dense
from minisbert.progress import Progress
from minisbert.fileio import write_json


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=["siamese", "triplet"], default="siamese")
    p.add_argument("--metric", choices=["cosine", "euclidean"], default="cosine")
    p.add_argument("--loss", choices=["softmax", "mnrl"], default=None,
                   help="instead of the arch's own loss: SBERT's classification objective or MNRL")
    p.add_argument("--margin", type=float, default=1.0, help="triplet margin (SBERT 1, seed 000 5, seed 004 0.05)")
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
    p.add_argument("--amp", choices=["bf16", "fp16"], default=None, help="mixed precision (CUDA only)")
    p.add_argument("--plain-encoder", action="store_true",
                   help="run the plain encoder (minisbert/encoder.py, the reference) instead of the fast one: "
                        "slower, the same numbers to 1e-6")
    p.add_argument("--eval-steps", type=int, default=None,
                   help="evaluate on the dev split every N steps (default: 4 times per run; 0: only at the end)")
    p.add_argument("--checkpoint-steps", type=int, default=100)
    p.add_argument("--output", type=Path, default=None, help="default: runs/<arch>-<metric>-<time>")
    p.add_argument("--resume", action="store_true", help="continue the run in --output from its checkpoint")
    args = p.parse_args(argv)
    if args.resume and args.output is None:
        p.error("--resume needs --output DIR: the folder of the run to continue")
    for name in ("dim", "epochs", "max_steps", "batch_size", "max_seq_length", "checkpoint_steps"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.margin < 0:
        p.error(f"--margin cannot be negative, got {args.margin}")
    if args.eval_steps is not None and args.eval_steps < 0:
        p.error(f"--eval-steps cannot be negative (0: only at the end), got {args.eval_steps}")
    if args.amp and not (args.device or "").startswith("cuda") and not torch.cuda.is_available():
        p.error("--amp needs a CUDA device")
    return args


def main(argv=None):
    args = parse_args(argv)
    spec = select_loss(args.arch, args.metric, args.loss)
    output = args.output or Path("runs") / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    checkpoint_path = output / "checkpoint.pt"
    if not args.resume and (checkpoint_path.exists() or (output / "final").exists()):
        sys.exit(f"{output} already holds a run; pass --resume to continue it, or choose another --output")
    torch.manual_seed(args.seed)

    # The model: a pretrained encoder with its pooling, plus what this run adds (dense layer, pooling).
    model = minisbert.load(args.model, device=args.device, fast=not args.plain_encoder)
    model.tokenizer.max_seq_length = min(args.max_seq_length, model.encoder.config.max_tokens)
    if args.pooling:
        model.pooling = args.pooling
    if args.dim:
        if model.dense is not None:
            sys.exit(f"{args.model} already ends in a Dense layer to {model.dimension} dimensions and a model "
                     "has at most one; leave out --dim, or start from a model without one")
        model.dense = Dense(model.dimension, args.dim, activation="tanh").to(model.device)
    # The losses see what the model outputs, unit length if it normalises (as in sentence-transformers).
    model.train()

    # The data: examples of the shape the loss needs, and a dev split to choose the best model.
    shape = {"score": training.SCORED, "class": training.LABELLED, None: training.TRIPLETS}[spec.label_kind]
    examples = training.training_examples(args.data, shape, model=model, seed=args.seed)
    # MNRL without hard negatives takes (anchor, positive): the triplet's negative is dropped.
    examples = [training.Example(e.texts[:spec.n_texts], e.label) for e in examples]
    if not examples:
        sys.exit(f"no training examples in {args.data}")
    classifier = None
    if spec.label_kind == "class":
        classifier = SoftmaxClassifier(model.dimension, n_labels=3).to(model.device)
    batches_per_epoch = math.ceil(len(examples) / args.batch_size)
    total_steps = batches_per_epoch * args.epochs
    if args.max_steps is not None:
        total_steps = min(total_steps, args.max_steps)
    eval_steps = args.eval_steps if args.eval_steps is not None else math.ceil(total_steps / 4)

    # The optimizer: AdamW without decay on biases and LayerNorm, warmup then linear decay.
    parameters = list(model.named_parameters())
    if classifier is not None:
        parameters += [(f"classifier.{n}", p) for n, p in classifier.named_parameters()]
    optimizer = AdamW(weight_decay_groups(parameters, args.weight_decay), lr=args.lr)
    scheduler = LinearWarmupDecay(optimizer, int(args.warmup * total_steps), total_steps)
    scaler = training.LossScaler(enabled=args.amp == "fp16")
    # What the checkpoint's weights and data position mean depends on all of these.
    identity = {"model": str(args.model), "encoder": model.encoder.config.to_hf(), "dim": args.dim,
                "pooling": model.pooling, "loss": spec.name, "data": args.data, "examples": len(examples),
                "seed": args.seed, "batch_size": args.batch_size, "steps": total_steps}

    step, epoch, next_batch, best = 0, 0, 0, None
    if args.resume:
        state = training.load_checkpoint(checkpoint_path)
        if state["identity"] != identity:
            differences = [k for k in identity if state["identity"].get(k) != identity[k]]
            sys.exit(f"{checkpoint_path} is from another run: it differs in {differences}; resume with the same "
                     "--model, --data, --arch, --metric, --loss, --dim, --pooling, --seed, --batch-size, "
                     "--epochs and --max-steps")
        model.load_state_dict(state["model"])
        if classifier is not None:
            classifier.load_state_dict(state["classifier"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        training.set_rng_state(state["rng"])
        step, epoch, next_batch, best = state["step"], state["epoch"], state["next_batch"], state["best"]
        training.truncate_log(output / "log.jsonl", step)  # steps after the checkpoint run again
        print(f"resuming {output} at step {step} (epoch {epoch}, batch {next_batch})")
    else:  # a run that stopped before its first checkpoint (a NaN loss) may have left a log
        (output / "log.jsonl").unlink(missing_ok=True)
    output.mkdir(parents=True, exist_ok=True)

    def save_state():
        training.save_checkpoint(checkpoint_path, {
            "identity": identity, "model": model.state_dict(),
            "classifier": classifier.state_dict() if classifier is not None else {},
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(), "rng": training.rng_state(),
            "step": step, "epoch": epoch, "next_batch": next_batch, "best": best})

    def evaluate_and_keep_best():
        nonlocal best
        scores = evaluate_dev(model, args.data)
        if scores is None:
            return None
        name, value = next(iter(scores.items()))
        if best is None or value > best["value"]:
            best = {"step": step, "metric": name, "value": value}
            model.save(output / "best")
        model.train()
        return scores

    print(f"{spec.name}: {len(examples):,} examples, batch {args.batch_size}, {total_steps:,} steps, "
          f"device {model.device}, output {output}")
    if step == 0 and not args.resume:
        initial = evaluate_and_keep_best()
        if initial is not None:
            print(f"dev before training: {initial}")

    stop = training.StopRequest()
    started = time.perf_counter()
    progress = Progress(total_steps, "step", done=step)
    try:
        while step < total_steps:
            batches = training.batches_for_epoch(len(examples), args.batch_size, args.seed, epoch)
            while next_batch < len(batches) and step < total_steps:
                batch = [examples[i] for i in batches[next_batch]]
                with torch.autocast(model.device.type, enabled=args.amp is not None,
                                    dtype=torch.bfloat16 if args.amp == "bf16" else torch.float16):
                    embeddings = training.embed_examples(model, batch)
                    loss = compute_loss(spec, embeddings, batch, args, classifier)
                if not torch.isfinite(loss):
                    sys.exit(f"loss became {loss.item()} at step {step + 1}; stopping. The last good "
                             f"checkpoint is {checkpoint_path} (step {read_step(checkpoint_path)}); "
                             "try a lower --lr, or --amp bf16 instead of fp16")
                scaler.scaled(loss).backward()
                grad_norm, lr = torch.tensor(float("inf")), scheduler.current_lrs()[0]  # lr: this step's
                if scaler.unscale(p for _, p in parameters):  # False: fp16 overflow, skip this update
                    grad_norm = clip_grad_norm_([p for _, p in parameters], args.max_grad_norm)
                    optimizer.step()
                    scheduler.step()
                optimizer.zero_grad()
                step, next_batch = step + 1, next_batch + 1

                entry = {"step": step, "epoch": epoch, "loss": loss.item(), "lr": lr, "grad_norm": grad_norm.item()}
                if eval_steps and step % eval_steps == 0 or step == total_steps:
                    entry["eval"] = evaluate_and_keep_best()
                training.append_log(output / "log.jsonl", entry)
                progress.update(1, f"loss {entry['loss']:.4f}")
                if step % args.checkpoint_steps == 0 or step == total_steps or stop.requested:
                    save_state()
                if stop.requested:
                    print(f"\ninterrupted: checkpoint written at step {step}; "
                          f"continue with: python train.py ... --output {output} --resume")
                    sys.exit(130)
            if next_batch >= len(batches):
                epoch, next_batch = epoch + 1, 0
    finally:
        stop.restore()

    seconds = time.perf_counter() - started
    model.save(output / "final")
    summary = {"steps": step, "training_seconds": round(seconds, 1), "best": best, "loss": spec.name,
               "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    write_json(output / "summary.json", summary)
    print(f"\ndone in {seconds:.0f} s; final model: {output / 'final'}"
          + (f"; best: {output / 'best'} ({best['metric']} {best['value']:.4f} at step {best['step']})" if best else ""))


def compute_loss(spec, embeddings, batch, args, classifier):
    """Call the loss function with what its signature needs (see losses.select_loss)."""
    kwargs = {}
    if spec.name.startswith("triplet"):
        kwargs["margin"] = args.margin
    if classifier is not None:
        kwargs["classifier"] = classifier
    if spec.label_kind is None:
        return spec.function(*embeddings, **kwargs)
    dtype = torch.float32 if spec.label_kind == "score" else torch.long
    labels = torch.tensor([e.label for e in batch], dtype=dtype, device=embeddings[0].device)
    return spec.function(*embeddings, labels, **kwargs)


def read_step(checkpoint_path):
    return training.load_checkpoint(checkpoint_path)["step"] if checkpoint_path.exists() else "none written yet"


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError) as error:  # bad input, a missing file, a full disk: the message says what
        sys.exit(f"error: {error}")
