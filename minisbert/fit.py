"""The training loop: shuffled batches -> embeddings -> loss -> AdamW step, until the budget is spent.

One call of `fit` fine-tunes a SentenceModel with one objective (losses.py) the way Sentence-BERT is
trained (Reimers and Gurevych 2019, "Sentence-BERT", section 3; sentence-transformers' `fit`):
the examples are shuffled every epoch, AdamW skips weight decay on biases and LayerNorm, the
learning rate warms up linearly then decays linearly to 0, and gradients are clipped to norm 1.
train.py and the experiment runner (minisbert/experiments) both train through it.

Along the way it writes to its output folder:

    log.jsonl       one JSON line per optimizer step: loss, learning rate, gradient norm, dev scores
    checkpoint.pt   everything the next step depends on (see training.py), every checkpoint_steps
    best/           the model that scored best on the dev split, when the caller gives a dev score

Under torchrun (minisbert/distributed.py) the same call trains one model over N processes: each
takes its slice of every global batch, the multiple-negatives ranking loss sees the whole global
batch's embeddings, the gradients are summed over ranks, and rank 0 alone evaluates, logs,
checkpoints and saves best/. With dropout off the losses are those of one process.

Ctrl-C writes a checkpoint at the next step boundary and raises `Interrupted`; a non-finite loss
raises `TrainingFailed` and leaves the last good checkpoint in place. `fit(..., resume=True)` goes on
from the checkpoint and logs exactly what an uninterrupted run logs. Saving the final model and
reporting are the caller's: train.py writes final/ and summary.json.

Checked in tests/test_training.py (through train.py), tests/test_experiments.py and, over 2
processes, tests/test_distributed.py.
"""

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import distributed, training
from .losses import LossSpec, multiple_negatives_ranking_loss
from .model import check_dtype
from .optim import AdamW, LinearWarmupDecay, clip_grad_norm_, weight_decay_groups
from .progress import Progress


@dataclass(frozen=True)
class TrainingSettings:
    epochs: int = 1  # passes over the examples
    max_steps: int | None = None  # stop after this many optimizer steps, if the epochs give more
    batch_size: int = 16
    lr: float = 2e-5  # peak learning rate (SBERT's)
    warmup: float = 0.1  # fraction of the steps spent warming up
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    margin: float = 1.0  # triplet losses only: SBERT used 1
    seed: int = 42  # the order of the examples in each epoch
    dtype: str = "float32"  # compute precision; "bfloat16", "float16" run under autocast (model.check_dtype)
    eval_steps: int | None = None  # dev score every N steps; None: about 4 times a run; 0: at the end only
    checkpoint_steps: int = 100

    def total_steps(self, num_examples: int) -> int:
        steps = math.ceil(num_examples / self.batch_size) * self.epochs
        return steps if self.max_steps is None else min(steps, self.max_steps)


class Interrupted(Exception):
    """Ctrl-C stopped training; checkpoint.pt holds step `step`, from which fit(resume=True) goes on."""

    def __init__(self, step: int):
        super().__init__(f"interrupted: checkpoint written at step {step}")
        self.step = step


class TrainingFailed(Exception):
    """Training cannot go on: a non-finite loss, or a checkpoint that belongs to another run."""


def fit(model, examples: list, spec: LossSpec, output: Path, settings: TrainingSettings, *,
        identity: dict, classifier=None, evaluate=None, resume: bool = False) -> dict:
    """Train `model` (and `classifier`, SBERT's softmax W, when the objective has one) in place.

    examples: training.Example of the shape `spec` needs; MNRL without hard negatives uses the
    first two texts of each. identity: what else the run depends on (model name, data, ...), stored
    in the checkpoint so that a checkpoint of another run is never resumed. evaluate(model) returns
    the dev scores {metric: value, ...} or None; the first metric is the one maximised for best/.
    Returns {"steps", "training_seconds", "best"}; best is {"step", "metric", "value"} or None.
    training_seconds counts the steps of earlier, interrupted runs too, up to their checkpoint.
    """
    output = Path(output)
    checkpoint_path = output / "checkpoint.pt"
    examples = [training.Example(e.texts[:spec.n_texts], e.label) for e in examples]
    total_steps = settings.total_steps(len(examples))
    smallest_batch = min(settings.batch_size, len(examples) % settings.batch_size or settings.batch_size)
    if smallest_batch < distributed.world_size():
        raise ValueError(f"a batch of {smallest_batch} examples cannot be split over {distributed.world_size()} "
                         "processes; choose a batch size (and a number of examples) of at least one per process")
    main = distributed.is_main()
    eval_steps = settings.eval_steps if settings.eval_steps is not None else math.ceil(total_steps / 4)
    model.train()  # dropout on, as in training; encode() switches it off and back by itself

    # The optimizer: AdamW without decay on biases and LayerNorm, warmup then linear decay.
    parameters = list(model.named_parameters())
    if classifier is not None:
        parameters += [(f"classifier.{n}", p) for n, p in classifier.named_parameters()]
    optimizer = AdamW(weight_decay_groups(parameters, settings.weight_decay), lr=settings.lr)
    scheduler = LinearWarmupDecay(optimizer, int(settings.warmup * total_steps), total_steps)
    autocast_dtype = check_dtype(settings.dtype, model.device)  # None: float32; the weights stay float32 anyway
    scaler = training.LossScaler(enabled=settings.dtype == "float16")
    # What the checkpoint's weights and data position mean depends on all of these.
    identity = {**identity, "encoder": model.encoder.config.to_hf(), "pooling": model.pooling, "loss": spec.name,
                "examples": len(examples), "seed": settings.seed, "batch_size": settings.batch_size,
                "steps": total_steps}

    step, epoch, next_batch, best, seconds_before = 0, 0, 0, None, 0.0
    if resume:
        state = training.load_checkpoint(checkpoint_path)
        if state["identity"] != identity:
            differences = [k for k in identity if state["identity"].get(k) != identity[k]]
            raise TrainingFailed(f"{checkpoint_path} is from another run: it differs in {differences}; resume "
                                 "with the settings it was written with, or start a new run in another folder")
        model.load_state_dict(state["model"])
        if classifier is not None:
            classifier.load_state_dict(state["classifier"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        training.set_rng_state(rank_rng_state(state["rng"], main))
        step, epoch, next_batch, best = state["step"], state["epoch"], state["next_batch"], state["best"]
        seconds_before = state.get("training_seconds", 0.0)  # absent from checkpoints of older versions
        if main:
            training.truncate_log(output / "log.jsonl", step)  # steps after the checkpoint run again
            print(f"resuming {output} at step {step} (epoch {epoch}, batch {next_batch})")
    elif main:  # a run that stopped before its first checkpoint (a NaN loss) may have left a log
        (output / "log.jsonl").unlink(missing_ok=True)
    output.mkdir(parents=True, exist_ok=True)
    distributed.broadcast_parameters(model)  # every rank starts from rank 0's weights
    if classifier is not None:
        distributed.broadcast_parameters(classifier)

    def save_state(rng_states: list):
        training.save_checkpoint(checkpoint_path, {
            "identity": identity, "model": model.state_dict(),
            "classifier": classifier.state_dict() if classifier is not None else {},
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(), "rng": rng_states,
            "step": step, "epoch": epoch, "next_batch": next_batch, "best": best,
            "training_seconds": seconds_before + time.perf_counter() - started})

    def evaluate_and_keep_best():
        nonlocal best
        scores = evaluate(model) if evaluate is not None and main else None
        if scores is None:
            return None
        name, value = next(iter(scores.items()))
        if best is None or value > best["value"]:
            best = {"step": step, "metric": name, "value": value}
            model.save(output / "best")
        model.train()
        return scores

    if main:
        print(f"{spec.name}: {len(examples):,} examples, batch {settings.batch_size}, {total_steps:,} steps, "
              f"{distributed.world_size()} process(es), device {model.device}, output {output}")
    if step == 0 and not resume:
        initial = evaluate_and_keep_best()
        if initial is not None:
            print(f"dev before training: {initial}")

    stop = training.StopRequest()
    started = time.perf_counter()
    progress = Progress(total_steps, "step", done=step, show=main)
    try:
        while step < total_steps:
            batches = training.batches_for_epoch(len(examples), settings.batch_size, settings.seed, epoch)
            while next_batch < len(batches) and step < total_steps:
                batch = [examples[i] for i in batches[next_batch]]  # the global batch
                local_batch = batch[slice(*distributed.shard_range(len(batch)))]  # this rank's slice
                with torch.autocast(model.device.type, dtype=autocast_dtype or torch.float32,
                                    enabled=autocast_dtype is not None):
                    embeddings = training.embed_examples(model, local_batch)
                    if spec.function is multiple_negatives_ranking_loss:  # every anchor sees every positive
                        embeddings = [distributed.gather_with_grad(e, len(batch)) for e in embeddings]
                        share = compute_loss(spec, embeddings, batch, settings.margin, classifier)
                        loss = share.detach()  # the same whole-batch loss on every rank
                    else:
                        share = compute_loss(spec, embeddings, local_batch, settings.margin, classifier) \
                            * distributed.local_loss_weight(len(local_batch), len(batch))
                        loss = distributed.sum_tensor(share.detach())
                if not torch.isfinite(loss):
                    raise TrainingFailed(
                        f"loss became {loss.item()} at step {step + 1}; stopping. The last good checkpoint is "
                        f"{checkpoint_path} (step {read_step(checkpoint_path)}); try a lower learning rate, "
                        "or bfloat16 instead of float16")
                scaler.scaled(share).backward()
                distributed.sum_gradients([p for _, p in parameters])
                grad_norm = torch.full((), float("inf"), device=model.device)  # stays inf if skipped
                lr = scheduler.current_lrs()[0]  # this step's
                if scaler.unscale(p for _, p in parameters):  # False: fp16 overflow, skip this update
                    grad_norm = clip_grad_norm_([p for _, p in parameters], settings.max_grad_norm)
                    optimizer.step()
                    scheduler.step()
                optimizer.zero_grad()
                step, next_batch = step + 1, next_batch + 1

                entry = {"step": step, "epoch": epoch, "loss": loss.item(), "lr": lr, "grad_norm": grad_norm.item()}
                if eval_steps and step % eval_steps == 0 or step == total_steps:
                    entry["eval"] = evaluate_and_keep_best()
                if main:
                    training.append_log(output / "log.jsonl", entry)
                progress.update(1, f"loss {entry['loss']:.4f}")
                stop.requested = distributed.any_rank(stop.requested)
                if step % settings.checkpoint_steps == 0 or step == total_steps or stop.requested:
                    rng_states = distributed.gather_objects(training.rng_state())  # every rank's dropout generator
                    if main:
                        save_state(rng_states)
                if stop.requested:
                    distributed.barrier()  # torchrun stops every rank once one exits: let rank 0 save first
                    raise Interrupted(step)
            if next_batch >= len(batches):
                epoch, next_batch = epoch + 1, 0
    finally:
        stop.restore()
    progress.close()
    return {"steps": step, "training_seconds": round(seconds_before + time.perf_counter() - started, 1), "best": best}


def compute_loss(spec: LossSpec, embeddings: list, batch: list, margin: float, classifier=None):
    """Call the loss function with what its signature needs (see losses.select_loss)."""
    kwargs = {}
    if spec.takes_margin:
        kwargs["margin"] = margin
    if classifier is not None:
        kwargs["classifier"] = classifier
    if spec.label_kind is None:
        return spec.function(*embeddings, **kwargs)
    dtype = torch.float32 if spec.label_kind == "score" else torch.long
    labels = torch.tensor([e.label for e in batch], dtype=dtype, device=embeddings[0].device)
    return spec.function(*embeddings, labels, **kwargs)


def rank_rng_state(saved, main: bool) -> dict:
    """This rank's random generator state from a checkpoint's list of every rank's. A checkpoint
    written by another number of processes cannot give each rank its own: every rank then takes
    rank 0's (dropout draws other masks than the interrupted run would have, nothing else differs)."""
    states = saved if isinstance(saved, list) else [saved]  # a dict: written before states were per rank
    if len(states) == distributed.world_size():
        return states[distributed.rank()]
    if main:
        print(f"note: the checkpoint was written by {len(states)} process(es), this run has "
              f"{distributed.world_size()}: dropout will draw other masks than the interrupted run would have")
    return states[0]


def read_step(checkpoint_path: Path):
    return training.load_checkpoint(checkpoint_path)["step"] if checkpoint_path.exists() else "none written yet"
