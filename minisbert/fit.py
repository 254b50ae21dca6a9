"""The training loop: shuffled batches -> embeddings -> loss -> backward -> AdamW step, until the budget is spent.

One call of `fit` fine-tunes a SentenceModel with one objective (losses.py) the way Sentence-BERT is
trained (Reimers and Gurevych 2019, "Sentence-BERT", section 3; sentence-transformers' `fit`):
the examples are shuffled every epoch, AdamW skips weight decay on biases and LayerNorm, the
learning rate warms up linearly then decays linearly to 0, and gradients are clipped to norm 1.
train.py and the experiment runner (minisbert/experiments) both train through it.

`fit` is the loop itself, short enough to read as the algorithm. What surrounds it is in named
helpers below it: starting or resuming (`new_state`, `start_or_resume`), one batch's loss
(`batch_loss`) and update (`optimizer_step`), the dev score and best/ (`evaluate_and_keep_best`),
checkpoints (`write_checkpoint`, with the files themselves in checkpoints.py), float16's loss
scaling (`LossScaler`) and Ctrl-C (`StopRequest`). Along the way it writes to its output folder:

    log.jsonl       one JSON line per optimizer step: loss, learning rate, gradient norm, dev scores
    checkpoint.pt   everything the next step depends on (checkpoints.py), every checkpoint_steps
    best/           the trained model that scored best on the dev split, when the caller gives a dev score

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
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import checkpoints, distributed
from .training_data import Example
from .losses import LossSpec, multiple_negatives_ranking_loss
from .model import check_dtype
from .optim import AdamW, LinearWarmupDecay, clip_grad_norm_, weight_decay_groups
from .progress import Progress

LOG, CHECKPOINT = "log.jsonl", "checkpoint.pt"


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
    dense_lr: float | None = None  # peak learning rate of the dense projection (model.dense); None: lr
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

    examples: training_data.Example of the shape `spec` needs; MNRL without hard negatives uses the
    first two texts of each. identity: what else the run depends on (model name, data, ...), stored
    in the checkpoint so that a checkpoint of another run is never resumed. evaluate(model) returns
    the dev scores {metric: value, ...} or None; the first metric is the one maximised for best/.
    Returns {"steps", "training_seconds", "best"}; best is {"step", "metric", "value"} or None.
    training_seconds counts the steps of earlier, interrupted runs too, up to their checkpoint.
    """
    output, examples = Path(output), [Example(e.texts[:spec.n_texts], e.label) for e in examples]
    total_steps = settings.total_steps(len(examples))
    autocast_dtype = check_dtype(settings.dtype, model.device)  # None: float32; the weights stay float32 anyway
    model.train()  # dropout on, as in training; encode() switches it off and back by itself
    state = new_state(model, classifier, spec, settings, len(examples), identity)
    start_or_resume(state, output, resume)
    # The start model's dev score is a yardstick to read, not a candidate for best/ (as in
    # sentence-transformers): best/ is always a trained model.
    if not resume and evaluate is not None and distributed.is_main() and (initial := evaluate(model)) is not None:
        print(f"dev before training: {initial}")
        model.train()
    eval_steps = settings.eval_steps if settings.eval_steps is not None else math.ceil(total_steps / 4)
    stop, state.started = StopRequest(), time.perf_counter()
    progress = Progress(total_steps, "step", done=state.step, show=distributed.is_main())
    try:
        while state.step < total_steps:
            batches = batches_for_epoch(len(examples), settings.batch_size, settings.seed, state.epoch)
            while state.next_batch < len(batches) and state.step < total_steps:
                batch = [examples[i] for i in batches[state.next_batch]]  # the global batch
                local_batch = batch[slice(*distributed.shard_range(len(batch)))]  # this rank's slice
                with torch.autocast(model.device.type, dtype=autocast_dtype or torch.float32,
                                    enabled=autocast_dtype is not None):
                    embeddings = embed_examples(model, local_batch)  # one (B, D) tensor per text column
                    share, loss = batch_loss(spec, embeddings, batch, settings.margin, classifier)
                if not torch.isfinite(loss):
                    raise non_finite_loss(loss, state.step + 1, output / CHECKPOINT)
                state.scaler.scaled(share).backward()
                grad_norm, lr = optimizer_step(state, settings.max_grad_norm)
                state.step, state.next_batch = state.step + 1, state.next_batch + 1

                entry = {"step": state.step, "epoch": state.epoch, "loss": loss.item(), "lr": lr,
                         "grad_norm": grad_norm.item()}
                if eval_steps and state.step % eval_steps == 0 or state.step == total_steps:
                    entry["eval"] = evaluate_and_keep_best(state, evaluate, output)
                if distributed.is_main():
                    checkpoints.append_log(output / LOG, entry)
                progress.update(1, f"loss {entry['loss']:.4f}")
                stop.requested = distributed.any_rank(stop.requested)
                if state.step % settings.checkpoint_steps == 0 or state.step == total_steps or stop.requested:
                    write_checkpoint(state, output / CHECKPOINT)
                if stop.requested:
                    distributed.barrier()  # torchrun stops every rank once one exits: let rank 0 save first
                    raise Interrupted(state.step)
            if state.next_batch >= len(batches):
                state.epoch, state.next_batch = state.epoch + 1, 0
    finally:
        stop.restore()
    progress.close()
    return {"steps": state.step, "training_seconds": round(state.seconds(), 1), "best": state.best}


@dataclass
class TrainingState:
    """Everything the next step depends on, as a checkpoint holds it (checkpoints.py)."""
    model: torch.nn.Module
    classifier: torch.nn.Module | None  # SBERT's softmax W, trained beside the model; None for other losses
    parameters: list  # the model's and the classifier's, in the optimizer's order
    optimizer: AdamW
    scheduler: LinearWarmupDecay
    scaler: "LossScaler"
    identity: dict  # what the weights and the data position mean: a checkpoint of another run is refused
    step: int = 0  # optimizer steps taken
    epoch: int = 0
    next_batch: int = 0  # the batch of the epoch that the next step trains on
    best: dict | None = None  # {"step", "metric", "value"} of the best dev score so far
    seconds_before: float = 0.0  # training time of earlier, interrupted runs, up to their checkpoint
    started: float = field(default_factory=time.perf_counter)  # when this run's steps began

    def seconds(self) -> float:
        return self.seconds_before + time.perf_counter() - self.started


def new_state(model, classifier, spec: LossSpec, settings: TrainingSettings, num_examples: int,
              identity: dict) -> TrainingState:
    """Step 0: AdamW without weight decay on biases and LayerNorm, warmup then linear decay, and
    float16's loss scaler (a no-op in other precisions)."""
    total_steps = settings.total_steps(num_examples)
    smallest_batch = min(settings.batch_size, num_examples % settings.batch_size or settings.batch_size)
    if smallest_batch < distributed.world_size():
        raise ValueError(f"a batch of {smallest_batch} examples cannot be split over {distributed.world_size()} "
                         "processes; choose a batch size (and a number of examples) of at least one per process")
    named = list(model.named_parameters())
    if classifier is not None:
        named += [(f"classifier.{n}", p) for n, p in classifier.named_parameters()]
    optimizer = AdamW(parameter_groups(named, settings), lr=settings.lr)
    scheduler = LinearWarmupDecay(optimizer, int(settings.warmup * total_steps), total_steps)
    identity = {**identity, "encoder": model.encoder.config.to_hf(), "pooling": model.pooling, "loss": spec.name,
                "examples": num_examples, "seed": settings.seed, "batch_size": settings.batch_size,
                "steps": total_steps}
    return TrainingState(model, classifier, [p for _, p in named], optimizer, scheduler,
                         LossScaler(enabled=settings.dtype == "float16"), identity)


def parameter_groups(named: list, settings: TrainingSettings) -> list:
    """AdamW's groups: with and without weight decay (optim.weight_decay_groups), and, when
    settings.dense_lr is set, the dense projection's parameters in groups of their own at that rate."""
    groups = weight_decay_groups(named, settings.weight_decay)
    if settings.dense_lr is None:
        return groups
    split = []
    for group in groups:
        for dense in (False, True):
            kept = [i for i, name in enumerate(group["param_names"]) if name.startswith("dense.") == dense]
            if kept:
                split.append({**group, "params": [group["params"][i] for i in kept],
                              "param_names": [group["param_names"][i] for i in kept],
                              **({"lr": settings.dense_lr} if dense else {})})
    return split


def start_or_resume(state: TrainingState, output: Path, resume: bool) -> None:
    """Load the checkpoint in `output` when resuming, else clear the log a run that stopped before its
    first checkpoint (a NaN loss) may have left; then give every rank rank 0's weights."""
    if resume:
        resume_from(state, output / CHECKPOINT)
        if distributed.is_main():
            checkpoints.truncate_log(output / LOG, state.step)  # steps after the checkpoint run again
            print(f"resuming {output} at step {state.step} (epoch {state.epoch}, batch {state.next_batch})")
    elif distributed.is_main():
        (output / LOG).unlink(missing_ok=True)
    output.mkdir(parents=True, exist_ok=True)
    distributed.broadcast_parameters(state.model)  # every rank starts from rank 0's weights
    if state.classifier is not None:
        distributed.broadcast_parameters(state.classifier)
    if distributed.is_main():
        identity = state.identity
        print(f"{identity['loss']}: {identity['examples']:,} examples, batch {identity['batch_size']}, "
              f"{identity['steps']:,} steps, {distributed.world_size()} process(es), device {state.model.device}, "
              f"output {output}")


def resume_from(state: TrainingState, checkpoint_path: Path) -> None:
    """Put the checkpoint's weights, optimizer, schedule, loss scale, random state and data position
    into `state`, after checking that it was written by this very run."""
    saved = checkpoints.load_checkpoint(checkpoint_path)
    if saved["identity"] != state.identity:
        differences = [k for k in state.identity if saved["identity"].get(k) != state.identity[k]]
        raise TrainingFailed(f"{checkpoint_path} is from another run: it differs in {differences}; resume "
                             "with the settings it was written with, or start a new run in another folder")
    state.model.load_state_dict(saved["model"])
    if state.classifier is not None:
        state.classifier.load_state_dict(saved["classifier"])
    state.optimizer.load_state_dict(saved["optimizer"])
    state.scheduler.load_state_dict(saved["scheduler"])
    state.scaler.load_state_dict(saved["scaler"])
    checkpoints.set_rng_state(rank_rng_state(saved["rng"]))
    state.step, state.epoch, state.next_batch = saved["step"], saved["epoch"], saved["next_batch"]
    state.best, state.seconds_before = saved["best"], saved["training_seconds"]


def write_checkpoint(state: TrainingState, checkpoint_path: Path) -> None:
    """Every rank hands over its random state (dropout draws differ by rank); rank 0 writes them all."""
    rng_states = distributed.gather_objects(checkpoints.rng_state())
    if not distributed.is_main():
        return
    checkpoints.save_checkpoint(checkpoint_path, {
        "identity": state.identity, "model": state.model.state_dict(),
        "classifier": state.classifier.state_dict() if state.classifier is not None else {},
        "optimizer": state.optimizer.state_dict(), "scheduler": state.scheduler.state_dict(),
        "scaler": state.scaler.state_dict(), "rng": rng_states,
        "step": state.step, "epoch": state.epoch, "next_batch": state.next_batch, "best": state.best,
        "training_seconds": state.seconds()})


def rank_rng_state(saved: list) -> dict:
    """This rank's random generator state from a checkpoint's list of every rank's. A checkpoint
    written by another number of processes cannot give each rank its own: every rank then takes
    rank 0's (dropout draws other masks than the interrupted run would have, nothing else differs)."""
    if len(saved) == distributed.world_size():
        return saved[distributed.rank()]
    if distributed.is_main():
        print(f"note: the checkpoint was written by {len(saved)} process(es), this run has "
              f"{distributed.world_size()}: dropout will draw other masks than the interrupted run would have")
    return saved[0]


def evaluate_and_keep_best(state: TrainingState, evaluate, output: Path) -> dict | None:
    """The dev scores (rank 0 only; None without a dev split), saving best/ when the first metric
    is the best so far."""
    scores = evaluate(state.model) if evaluate is not None and distributed.is_main() else None
    if scores is None:
        return None
    name, value = next(iter(scores.items()))
    if state.best is None or value > state.best["value"]:
        state.best = {"step": state.step, "metric": name, "value": value}
        state.model.save(output / "best")
    state.model.train()
    return scores


def batches_for_epoch(num_examples: int, batch_size: int, seed: int, epoch: int) -> list:
    """The epoch's shuffled batches of example indices. Seeded by (seed, epoch) alone, so a resumed
    run rebuilds the same order without saving it."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(num_examples, generator=generator).tolist()
    return [order[start:start + batch_size] for start in range(0, num_examples, batch_size)]


def embed_examples(model, examples: list) -> list:
    """Embed every text of a batch in one forward pass; return one (B, D) tensor per column."""
    columns = len(examples[0].texts)
    texts = [e.texts[c] for c in range(columns) for e in examples]
    embeddings = model(model.tokenize(texts))  # (columns * B, D)
    return list(embeddings.split(len(examples)))


def batch_loss(spec: LossSpec, embeddings: list, batch: list, margin: float, classifier=None) -> tuple:
    """(this rank's share of the global batch's loss, to backpropagate; the global batch's loss, the
    same on every rank). `embeddings` are this rank's slice's. With one process both are the loss."""
    if spec.function is multiple_negatives_ranking_loss:  # every anchor sees every positive of the global batch
        embeddings = [distributed.gather_with_grad(e, len(batch)) for e in embeddings]
        share = compute_loss(spec, embeddings, batch, margin, classifier)
        return share, share.detach()
    local_batch = batch[slice(*distributed.shard_range(len(batch)))]
    share = compute_loss(spec, embeddings, local_batch, margin, classifier) \
        * distributed.local_loss_weight(len(local_batch), len(batch))
    return share, distributed.sum_tensor(share.detach())


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


def optimizer_step(state: TrainingState, max_grad_norm: float) -> tuple:
    """Sum the gradients over ranks, unscale (float16) and clip them, take the AdamW step and move
    the schedule on. Returns (the gradient norm, inf for a step float16 overflow skipped; the
    learning rate this step used)."""
    distributed.sum_gradients(state.parameters)
    grad_norm = torch.full((), float("inf"), device=state.model.device)
    lr = state.scheduler.current_lrs()[0]
    if state.scaler.unscale(state.parameters):
        grad_norm = clip_grad_norm_(state.parameters, max_grad_norm)
        state.optimizer.step()
        state.scheduler.step()
    state.optimizer.zero_grad()
    return grad_norm, lr


def non_finite_loss(loss: torch.Tensor, step: int, checkpoint_path: Path) -> TrainingFailed:
    written = checkpoints.load_checkpoint(checkpoint_path)["step"] if checkpoint_path.exists() else "none written yet"
    return TrainingFailed(f"loss became {loss.item()} at step {step}; stopping. The last good checkpoint is "
                          f"{checkpoint_path} (step {written}); try a lower learning rate, or bfloat16 instead "
                          "of float16")


class LossScaler:
    """Dynamic loss scaling for float16 training (Micikevicius et al. 2018, "Mixed Precision
    Training", section 3.2): small gradients underflow in fp16, so the loss is multiplied by a large
    scale before backward and the gradients divided by it afterwards. A step whose gradients
    overflowed is skipped and the scale halved; after `growth_interval` good steps it doubles.
    Disabled (scale 1, never skips) for float32 and bfloat16, whose exponent range needs no help."""

    def __init__(self, enabled: bool, scale: float = 2.0**16, growth_interval: int = 2000):
        self.enabled = enabled
        self.scale = scale if enabled else 1.0
        self.growth_interval = growth_interval
        self.good_steps = 0

    def scaled(self, loss):
        return loss * self.scale

    @torch.no_grad()
    def unscale(self, parameters) -> bool:
        """Divide gradients by the scale; False (and the scale halved) if any is inf or NaN."""
        if not self.enabled:
            return True
        grads = [p.grad for p in parameters if p.grad is not None]
        for grad in grads:
            grad.div_(self.scale)
        # All gradients' checks are gathered on their device, so the host reads one value, not one per gradient.
        finite = [torch.isfinite(grad).all() for grad in grads]
        if not finite or bool(torch.stack(finite).all()):
            self.good_steps += 1
            if self.good_steps % self.growth_interval == 0:
                self.scale *= 2.0
            return True
        self.scale /= 2.0
        self.good_steps = 0
        return False

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.good_steps = state["scale"], state["good_steps"]


class StopRequest:
    """Turns Ctrl-C (SIGINT) into a flag the loop reads between steps, so a checkpoint is written
    at a step boundary instead of the process dying halfway through an update."""

    def __init__(self):
        self.requested = False
        self.previous = signal.signal(signal.SIGINT, self.handle)

    def handle(self, signum, frame):
        if self.requested:  # a second Ctrl-C: stop at once
            signal.signal(signal.SIGINT, self.previous)
            raise KeyboardInterrupt
        self.requested = True

    def restore(self):
        signal.signal(signal.SIGINT, self.previous)
