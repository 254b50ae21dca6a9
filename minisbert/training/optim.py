"""AdamW, the linear warmup/decay learning-rate schedule and gradient-norm clipping, written out.

AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", Algorithm 2; the moments
are Adam's, Kingma & Ba 2015). For a parameter θ with gradient g at step t = 1, 2, ...:

    θ ← θ − lr·λ·θ                        decoupled weight decay: shrink θ, not part of g
    m ← β1·m + (1 − β1)·g                 first moment (running mean of g)
    v ← β2·v + (1 − β2)·g²                second moment (running mean of g²)
    m̂ = m / (1 − β1^t)   v̂ = v / (1 − β2^t)   bias correction: m and v start at 0
    θ ← θ − lr · m̂ / (√v̂ + ε)

The tensor operations are done in the same order as torch.optim.AdamW's single-tensor path (the one
it uses for CPU tensors), so that the two agree to the last bit; tests/training/test_optim.py checks 1,000
steps against torch.optim.AdamW + torch.optim.lr_scheduler.LambdaLR, and clipping against
torch.nn.utils.clip_grad_norm_.

Schedule: linear warmup from 0 to the base learning rate over `warmup_steps`, then linear decay to
0 at `total_steps` (BERT's schedule; sentence-transformers' "WarmupLinear" default).

Which parameters get weight decay: see `weight_decay_groups`.
"""

from typing import Iterable

import torch
from torch import Tensor


def weight_decay_groups(named_parameters: Iterable[tuple[str, Tensor]], weight_decay: float) -> list[dict]:
    """Split parameters into a group with weight decay and a group without, for AdamW.

    Rule: a parameter gets NO decay if it is 1-D, or its name ends in "bias", or its name contains
    "norm" (any case, e.g. "LayerNorm", "sa_layer_norm"). Everything else (weight matrices and
    embedding tables) is decayed. Decay pulls a weight toward 0, which limits the size of a learned
    map; a bias or a LayerNorm gain is an offset or a scale whose natural value is not 0, so pulling
    it there only distorts the layer (BERT's original no_decay list was ["bias", "LayerNorm.weight"]).
    The 1-D rule catches those whatever they are called; the name rules document the intent.

    named_parameters: e.g. model.named_parameters(); parameters with requires_grad=False are left
    out. Returns up to two groups, each {"params", "param_names", "weight_decay"}, in model order;
    an empty group is omitted. The same list works for torch.optim.AdamW.
    """
    decay: dict[str, list] = {"params": [], "param_names": [], "weight_decay": weight_decay}
    no_decay: dict[str, list] = {"params": [], "param_names": [], "weight_decay": 0.0}
    for name, param in named_parameters:
        if not param.requires_grad:
            continue
        skips_decay = param.dim() < 2 or name.endswith("bias") or "norm" in name.lower()
        group = no_decay if skips_decay else decay
        group["params"].append(param)
        group["param_names"].append(name)
    return [group for group in (decay, no_decay) if group["params"]]


class AdamW:
    """AdamW with per-group hyperparameters (lr, betas, eps, weight_decay).

    params: an iterable of tensors (one group), or a list of group dicts such as
    `weight_decay_groups(...)` returns; keys a group leaves out take the defaults given here (the
    same defaults as torch.optim.AdamW). A parameter whose .grad is None is skipped at that step
    and gets no state, as in torch.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ):
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        params = list(params)
        if not params:
            raise ValueError("AdamW got no parameters; pass model.parameters() or weight_decay_groups(...)")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups = [{**defaults, **group, "params": list(group["params"])} for group in groups]
        # Per-parameter state, created at the parameter's first update: {"step", "exp_avg", "exp_avg_sq"}.
        self.state: dict[Tensor, dict] = {}

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                if param not in self.state:
                    self.state[param] = {
                        "step": 0,
                        "exp_avg": torch.zeros_like(param),
                        "exp_avg_sq": torch.zeros_like(param),
                    }
                state = self.state[param]
                state["step"] += 1
                exp_avg, exp_avg_sq, step = state["exp_avg"], state["exp_avg_sq"], state["step"]

                param.mul_(1 - lr * weight_decay)
                # lerp computes m + (1 - β1)(g - m) = β1·m + (1 - β1)·g; torch uses it, so we do too
                # (a mul-then-add rounds differently in the last bit).
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)

                bias_correction1 = 1 - beta1**step
                bias_correction2 = 1 - beta2**step
                # lr·m̂/(√v̂ + ε) rearranged so that only m, v are tensors and the corrections are scalars.
                denom = exp_avg_sq.sqrt().div_(bias_correction2**0.5).add_(eps)  # in place: one temporary
                param.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)

    def zero_grad(self) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                param.grad = None

    def state_dict(self) -> dict:
        """A snapshot (tensors are copied) that `load_state_dict` restores exactly. Parameters are
        referred to by their position across groups, so it can be loaded into a fresh model."""
        state = {}
        param_groups = []
        position = 0
        for group in self.param_groups:
            positions = []
            for param in group["params"]:
                if param in self.state:
                    saved = self.state[param]
                    state[position] = {
                        "step": saved["step"],
                        "exp_avg": saved["exp_avg"].clone(),
                        "exp_avg_sq": saved["exp_avg_sq"].clone(),
                    }
                positions.append(position)
                position += 1
            param_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": positions})
        return {"state": state, "param_groups": param_groups}

    def load_state_dict(self, state_dict: dict) -> None:
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"saved optimizer has {len(saved_groups)} parameter groups, this one has {len(self.param_groups)}; "
                f"build the optimizer the same way as the run that saved it"
            )
        params_by_position = {}
        for index, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"parameter group {index}: saved {len(saved['params'])} parameters, this one has "
                    f"{len(group['params'])}; the model or the grouping differs from the saved run"
                )
            if "param_names" in saved and "param_names" in group and saved["param_names"] != group["param_names"]:
                saved_name, name = next(
                    (a, b) for a, b in zip(saved["param_names"], group["param_names"]) if a != b
                )
                raise ValueError(f"parameter group {index}: saved parameter {saved_name!r} where this one has {name!r}")
            params_by_position.update(zip(saved["params"], group["params"]))

        self.state = {}
        for position, saved in state_dict["state"].items():
            param = params_by_position[position]
            if saved["exp_avg"].shape != param.shape:
                raise ValueError(
                    f"saved optimizer state for parameter {position} has shape {tuple(saved['exp_avg'].shape)}, "
                    f"the parameter has shape {tuple(param.shape)}"
                )
            self.state[param] = {
                "step": saved["step"],
                "exp_avg": saved["exp_avg"].to(device=param.device, dtype=param.dtype, copy=True),
                "exp_avg_sq": saved["exp_avg_sq"].to(device=param.device, dtype=param.dtype, copy=True),
            }
        for saved, group in zip(saved_groups, self.param_groups):
            for key in ("lr", "eps", "weight_decay"):
                group[key] = saved[key]
            group["betas"] = tuple(saved["betas"])


def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Multiplier of the base learning rate for the update with index `step` (0, 1, 2, ...).

    Warmup: step / warmup_steps, rising from 0 (the very first update has learning rate 0).
    Decay: (total_steps - step) / (total_steps - warmup_steps), reaching 0 at total_steps and
    staying there. Same formula as Hugging Face's get_linear_schedule_with_warmup.
    """
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


class LinearWarmupDecay:
    """Sets each group's lr to base_lr · lr_factor(steps_done, ...). Call step() after each
    optimizer.step(). base_lr is each group's lr when the scheduler is created."""

    def __init__(self, optimizer: AdamW, warmup_steps: int, total_steps: int):
        if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
            raise ValueError(
                f"need 0 <= warmup_steps <= total_steps and total_steps >= 1, "
                f"got warmup_steps={warmup_steps}, total_steps={total_steps}"
            )
        self.optimizer = optimizer
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        self.steps_done = 0
        self._set_lrs()

    def step(self) -> None:
        self.steps_done += 1
        self._set_lrs()

    def current_lrs(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def _set_lrs(self) -> None:
        factor = lr_factor(self.steps_done, self.warmup_steps, self.total_steps)
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base_lr * factor

    def state_dict(self) -> dict:
        return {
            "steps_done": self.steps_done,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "base_lrs": list(self.base_lrs),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        if len(state_dict["base_lrs"]) != len(self.optimizer.param_groups):
            raise ValueError(
                f"saved schedule has {len(state_dict['base_lrs'])} learning rates, the optimizer has "
                f"{len(self.optimizer.param_groups)} parameter groups"
            )
        self.steps_done = state_dict["steps_done"]
        self.warmup_steps = state_dict["warmup_steps"]
        self.total_steps = state_dict["total_steps"]
        self.base_lrs = list(state_dict["base_lrs"])
        self._set_lrs()


@torch.no_grad()
def clip_grad_norm_(parameters: Iterable[Tensor], max_norm: float) -> Tensor:
    """Scale all gradients together so that their global L2 norm is at most max_norm; in place.

    total = sqrt(sum over parameters of ||g_p||²), computed as the norm of the per-parameter norms.
    Every gradient is multiplied by min(1, max_norm / (total + 1e-6)): the direction of the full
    gradient is kept, only its length is capped. The 1e-6 and the unconditional multiply follow
    torch.nn.utils.clip_grad_norm_. Returns the norm before clipping (worth logging: spikes show
    instability). Parameters without a gradient are ignored.
    """
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    parameters = list(parameters)
    grads = [param.grad for param in parameters if param.grad is not None]
    if not grads:  # on the parameters' device, as the norm of real gradients would be
        return torch.zeros((), device=parameters[0].device if parameters else None)
    per_param_norms = torch.stack([torch.linalg.vector_norm(grad) for grad in grads])  # (P,)
    total_norm = torch.linalg.vector_norm(per_param_norms)
    scale = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
    for grad in grads:
        grad.mul_(scale)
    return total_norm
