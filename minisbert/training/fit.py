"""The training loop: shuffled batches -> embeddings -> loss -> backward -> AdamW step, until the budget is spent.

One call of `fit` fine-tunes a SentenceModel with one objective (training/losses.py) the way Sentence-BERT is
trained (Reimers and Gurevych 2019, "Sentence-BERT", section 3; sentence-transformers' `fit`):
the examples are shuffled every epoch, AdamW skips weight decay on biases and LayerNorm, the
learning rate warms up linearly then decays linearly to 0, and gradients are clipped to norm 1.
train.py and the experiment runner (minisbert/experiments) both train through it.

`fit` is the loop itself, short enough to read as the algorithm: each step is `embed`,
`compute_loss`, `backward` and `step`, which keep the processes' slices of the batch, the
precision and float16's loss scaling (common/precision.py's `LossScaler`) inside them, and then one call,
`AroundSteps.after_step`, for the log, the dev score and best/ (`evaluate_and_keep_best`), the
checkpoint (`write_checkpoint`, the files themselves in training/checkpoints.py) and Ctrl-C
(`StopRequest`). Starting or resuming is `new_state` and `start_or_resume`. Along the way it
writes to its output folder:

    log.jsonl       one JSON line per optimizer step: loss, learning rate, gradient norm, dev scores
    checkpoint.pt   everything the next step depends on (training/checkpoints.py), every checkpoint_steps
    best/           the trained model that scored best on the dev split, when the caller gives a dev score

Under torchrun (minisbert/training/distributed.py) the same call trains one model over N processes: each
takes its slice of every global batch, the multiple-negatives ranking loss sees the whole global
batch's embeddings, the gradients are summed over ranks, and rank 0 alone evaluates, logs,
checkpoints and saves best/. With dropout off the losses are those of one process.

Ctrl-C writes a checkpoint at the next step boundary and raises `Interrupted`; a non-finite loss
raises `TrainingFailed` and leaves the last good checkpoint in place. `fit(..., resume=True)` goes on
from the checkpoint and logs exactly what an uninterrupted run logs. Saving the final model and
reporting are the caller's: train.py writes final/ and summary.json.

Checked in tests/training/test_training.py (through train.py), tests/experiments/test_experiments.py and, over 2
processes, tests/training/test_distributed.py.
"""

import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import checkpoints, distributed
from .training_data import Example
from .losses import LossSpec
from .optim import AdamW, LinearWarmupDecay, clip_grad_norm_, weight_decay_groups
from ..common.precision import LossScaler, autocast_dtype, computing_in
from ..encoding.weights import config_to_hf
from ..common.progress import Progress

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
    dtype: str = "float32"  # compute precision; "bfloat16", "float16" run under autocast (common/precision.py)
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
        run_inputs: dict, classifier=None, evaluate=None, resume: bool = False) -> dict:
    """Train `model` (and `classifier`, SBERT's softmax W, when the objective has one) in place.

    examples: training_data.Example of the shape `spec` needs; MNRL without hard negatives uses the
    first two texts of each. run_inputs: what else the run depends on (model name, data, ...), stored
    in the checkpoint so that a checkpoint of another run is never resumed. evaluate(model) returns
    the dev scores {metric: value, ...} or None; the first metric is the one maximised for best/.
    Returns {"steps", "training_seconds", "best"}; best is {"step", "metric", "value"} or None.
    training_seconds counts the steps of earlier, interrupted runs too, up to their checkpoint.
    """
    output, examples = Path(output), [Example(e.texts[:spec.n_texts], e.label) for e in examples]
    autocast_dtype(settings.dtype, model.device)  # a precision this device cannot use is refused before step 1
    model.train()  # dropout on, as in training; encode() switches it off and back by itself
    state = new_state(model, classifier, spec, settings, len(examples), run_inputs)
    start_or_resume(state, output, resume)
    # The start model's dev score is a yardstick to read, not a candidate for best/ (as in
    # sentence-transformers): best/ is always a trained model.
    if not resume and evaluate is not None and distributed.is_main() and (initial := evaluate(model)) is not None:
        print(f"dev before training: {initial}")
        model.train()
    around = AroundSteps(state, output, evaluate)
    try:
        while state.step < state.total_steps:
            batches = batches_for_epoch(len(examples), settings.batch_size, settings.seed, state.epoch)
            while state.next_batch < len(batches) and state.step < state.total_steps:
                batch = [examples[i] for i in batches[state.next_batch]]  # the global batch
                embedded = embed(state, batch)
                loss = compute_loss(state, embedded)
                batch_loss = backward(state, loss, output)
                grad_norm, lr = step(state)
                around.after_step(batch_loss, grad_norm, lr)
            if state.next_batch >= len(batches):
                state.epoch, state.next_batch = state.epoch + 1, 0
    finally:
        around.stop.restore()
    around.progress.close()
    return {"steps": state.step, "training_seconds": round(state.seconds(), 1), "best": state.best}


@dataclass
class TrainingState:
    """Everything the next step depends on, as a checkpoint holds it (training/checkpoints.py)."""
    model: torch.nn.Module
    classifier: torch.nn.Module | None  # SBERT's softmax W, trained beside the model; None for other losses
    parameters: list  # the model's and the classifier's, in the optimizer's order
    optimizer: AdamW
    scheduler: LinearWarmupDecay
    scaler: LossScaler
    spec: LossSpec  # the objective
    settings: TrainingSettings
    total_steps: int
    run_inputs: dict  # what the weights and the data position mean: a checkpoint of another run is refused
    step: int = 0  # optimizer steps taken
    epoch: int = 0
    next_batch: int = 0  # the batch of the epoch that the next step trains on
    best: dict | None = None  # {"step", "metric", "value"} of the best dev score so far
    seconds_before: float = 0.0  # training time of earlier, interrupted runs, up to their checkpoint
    started: float = field(default_factory=time.perf_counter)  # when this run's steps began

    def seconds(self) -> float:
        return self.seconds_before + time.perf_counter() - self.started


def new_state(model, classifier, spec: LossSpec, settings: TrainingSettings, num_examples: int,
              run_inputs: dict) -> TrainingState:
    """Step 0: AdamW without weight decay on biases and LayerNorm, warmup then linear decay, and
    float16's loss scaler (a no-op in other precisions)."""
    total_steps = settings.total_steps(num_examples)
    smallest_batch = min(settings.batch_size, num_examples % settings.batch_size or settings.batch_size)
    if smallest_batch < distributed.world_size():
        raise ValueError(f"a batch of {smallest_batch} examples cannot be split over {distributed.world_size()} "
                         "processes; choose a batch size (and a number of examples) of at least one per process")
    if spec.whole_batch and spec.n_texts == 2 and settings.batch_size < 2:  # no other example: no negative
        raise ValueError(f"{spec.name} ranks each anchor's positive against the batch's other examples; a batch of "
                         f"{settings.batch_size} has none, so the loss is 0 at every step: use a batch of 2 or more")
    named = list(model.named_parameters())
    if classifier is not None:
        named += [(f"classifier.{n}", p) for n, p in classifier.named_parameters()]
    optimizer = AdamW(parameter_groups(named, settings), lr=settings.lr)
    scheduler = LinearWarmupDecay(optimizer, int(settings.warmup * total_steps), total_steps)
    run_inputs = {**run_inputs, "encoder": config_to_hf(model.encoder.config), "pooling": model.pooling,
                  "loss": spec.name, "examples": num_examples, "seed": settings.seed, "batch_size": settings.batch_size,
                  "steps": total_steps}
    return TrainingState(model, classifier, [p for _, p in named], optimizer, scheduler,
                         LossScaler(enabled=settings.dtype == "float16"), spec, settings, total_steps, run_inputs)


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
        inputs = state.run_inputs
        print(f"{inputs['loss']}: {inputs['examples']:,} examples, batch {inputs['batch_size']}, "
              f"{inputs['steps']:,} steps, {distributed.world_size()} process(es), device {state.model.device}, "
              f"output {output}")


def resume_from(state: TrainingState, checkpoint_path: Path) -> None:
    """Put the checkpoint's weights, optimizer, schedule, loss scale, random state and data position
    into `state`, after checking that it was written by this very run."""
    saved = checkpoints.load_checkpoint(checkpoint_path)
    if saved["identity"] != state.run_inputs:  # the checkpoint's name for the run's inputs
        differences = [k for k in state.run_inputs if saved["identity"].get(k) != state.run_inputs[k]]
        raise TrainingFailed(f"{checkpoint_path} is from another run: it differs in {differences}; resume "
                             "with the settings it was written with, or start a new run in another folder")
    try:
        state.model.load_state_dict(saved["model"])
        if state.classifier is not None:
            state.classifier.load_state_dict(saved["classifier"])
        state.optimizer.load_state_dict(saved["optimizer"])
        state.scheduler.load_state_dict(saved["scheduler"])
        state.scaler.load_state_dict(saved["scaler"])
        checkpoints.set_rng_state(rank_rng_state(saved["rng"]))
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as error:
        raise TrainingFailed(f"{checkpoint_path} does not fit this run's model and optimizer ({error}); it was "
                             "edited or damaged: start a new run in another folder") from None
    state.step, state.epoch, state.next_batch = saved["step"], saved["epoch"], saved["next_batch"]
    state.best, state.seconds_before = saved["best"], saved["training_seconds"]


def write_checkpoint(state: TrainingState, checkpoint_path: Path) -> None:
    """Every rank hands over its random state (dropout draws differ by rank); rank 0 writes them all."""
    rng_states = distributed.gather_objects(checkpoints.rng_state())
    if not distributed.is_main():
        return
    checkpoints.save_checkpoint(checkpoint_path, {
        "identity": state.run_inputs, "model": state.model.state_dict(),
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


@dataclass
class Embedded:
    """A batch's embeddings as this rank's loss reads them."""
    columns: list  # one (B, D) tensor per text column
    examples: list  # the examples they embed: this rank's slice of the batch, or all of it (spec.whole_batch)
    weight: float  # this rank's part of the batch's loss: its slice's share of the batch, or 1 for the whole


def embed(state: TrainingState, batch: list) -> Embedded:
    """This rank's slice of the global batch, embedded in the run's precision. A loss that ranks each
    anchor against the whole batch (spec.whole_batch) gets every rank's embeddings, gradients flowing
    back to this rank's own (distributed.gather_with_grad)."""
    local_batch = batch[slice(*distributed.shard_range(len(batch)))]
    with computing_in(state.settings.dtype, state.model.device):
        columns = embed_examples(state.model, local_batch)  # one (B, D) tensor per text column
    if state.spec.whole_batch:
        return Embedded([distributed.gather_with_grad(c, len(batch)) for c in columns], batch, 1.0)
    return Embedded(columns, local_batch, distributed.local_loss_weight(len(local_batch), len(batch)))


def compute_loss(state: TrainingState, embedded: Embedded) -> torch.Tensor:
    """This rank's part of the batch's loss: the objective (losses.LossSpec) on its embeddings, in the
    run's precision, times its weight. With one process it is the batch's loss."""
    with computing_in(state.settings.dtype, state.model.device):
        return state.spec(embedded.columns, embedded.examples, margin=state.settings.margin,
                          classifier=state.classifier) * embedded.weight


def backward(state: TrainingState, loss: torch.Tensor, output: Path) -> torch.Tensor:
    """Backpropagate this rank's part of the loss (float16: scaled, LossScaler); return the batch's
    loss, summed over ranks (the same on every rank). A loss that is not finite stops the run."""
    batch_loss = loss.detach() if state.spec.whole_batch else distributed.sum_tensor(loss.detach())
    if not torch.isfinite(batch_loss):
        raise non_finite_loss(batch_loss, state.step + 1, output / CHECKPOINT)
    state.scaler.scaled(loss).backward()
    return batch_loss


def step(state: TrainingState) -> tuple:
    """Sum the gradients over ranks, unscale (float16) and clip them, take the AdamW step and move
    the schedule on. Returns (the gradient norm, inf for a step float16 overflow skipped; the
    learning rate this step used)."""
    distributed.sum_gradients(state.parameters)
    grad_norm = torch.full((), float("inf"), device=state.model.device)
    lr = state.scheduler.current_lrs()[0]
    if state.scaler.unscale(state.parameters):
        grad_norm = clip_grad_norm_(state.parameters, state.settings.max_grad_norm)
        state.optimizer.step()
        state.scheduler.step()
    state.optimizer.zero_grad()
    state.step, state.next_batch = state.step + 1, state.next_batch + 1
    return grad_norm, lr


class AroundSteps:
    """What happens between optimizer steps: the log line, the dev score and best/, the checkpoint,
    the progress line, and Ctrl-C (StopRequest), which ends the run at a step boundary."""

    def __init__(self, state: TrainingState, output: Path, evaluate):
        self.state, self.output, self.evaluate = state, output, evaluate
        eval_steps = state.settings.eval_steps
        self.eval_steps = eval_steps if eval_steps is not None else math.ceil(state.total_steps / 4)
        self.stop, state.started = StopRequest(), time.perf_counter()
        self.progress = Progress(state.total_steps, "step", done=state.step, show=distributed.is_main())

    def after_step(self, batch_loss: torch.Tensor, grad_norm: torch.Tensor, lr: float) -> None:
        state, output = self.state, self.output
        entry = {"step": state.step, "epoch": state.epoch, "loss": batch_loss.item(), "lr": lr,
                 "grad_norm": grad_norm.item()}
        if self.eval_steps and state.step % self.eval_steps == 0 or state.step == state.total_steps:
            entry["eval"] = evaluate_and_keep_best(state, self.evaluate, output)
        if distributed.is_main():
            checkpoints.append_log(output / LOG, entry)
        self.progress.update(1, f"loss {entry['loss']:.4f}")
        self.stop.requested = distributed.any_rank(self.stop.requested)
        if (state.step % state.settings.checkpoint_steps == 0 or state.step == state.total_steps
                or self.stop.requested):
            write_checkpoint(state, output / CHECKPOINT)
        if self.stop.requested:
            distributed.barrier()  # torchrun stops every rank once one exits: let rank 0 save first
            raise Interrupted(state.step)


def non_finite_loss(loss: torch.Tensor, step: int, checkpoint_path: Path) -> TrainingFailed:
    written = checkpoints.load_checkpoint(checkpoint_path)["step"] if checkpoint_path.exists() else "none written yet"
    return TrainingFailed(f"loss became {loss.item()} at step {step}; stopping. The last good checkpoint is "
                          f"{checkpoint_path} (step {written}); try a lower learning rate, or bfloat16 instead "
                          "of float16")


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
