"""What "correct" means for the optimizer: one AdamW step worked by hand; 1,000 steps of the
hand-written AdamW + warmup/decay schedule + clipping that end bit-identical to torch.optim.AdamW +
LambdaLR + torch.nn.utils.clip_grad_norm_ (the same float32 operations in the same order); and a run
checkpointed at step 500 and resumed in fresh objects that ends bit-identical to an uninterrupted run."""

import io
import math

import pytest
import torch
from torch import nn

from minisbert.training.optim import AdamW, LinearWarmupDecay, clip_grad_norm_, lr_factor, weight_decay_groups

from ..tolerances import float32_apart

LR = 1e-2
WEIGHT_DECAY = 0.1
WARMUP_STEPS = 100
TOTAL_STEPS = 1000
MAX_GRAD_NORM = 1.0


class TinyMLP(nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.hidden = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        return self.out(torch.tanh(self.norm(self.hidden(x))))


def batch(step: int):
    """The same batch for a given step in every run, so runs can be compared step by step."""
    generator = torch.Generator().manual_seed(10_000 + step)
    inputs = torch.randn(32, 8, generator=generator)
    # a large target scale makes early gradients big enough for clipping to kick in
    targets = 3 * torch.randn(32, 4, generator=generator)
    return inputs, targets


def train(model, optimizer, scheduler, clip, steps):
    for step in steps:
        inputs, targets = batch(step)
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        clip(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()


def ours(model):
    optimizer = AdamW(weight_decay_groups(model.named_parameters(), WEIGHT_DECAY), lr=LR)
    return optimizer, LinearWarmupDecay(optimizer, WARMUP_STEPS, TOTAL_STEPS)


def reference_factor(step):
    # written independently of lr_factor: up from 0 over the warmup, then down to 0 at the end
    if step < WARMUP_STEPS:
        return step / WARMUP_STEPS
    return max(0.0, (TOTAL_STEPS - step) / (TOTAL_STEPS - WARMUP_STEPS))


def max_abs_diff(model_a, model_b):
    return max((a - b).abs().max().item() for a, b in zip(model_a.parameters(), model_b.parameters()))


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see conftest.py


# --- pieces by hand ---------------------------------------------------------------------------


def test_one_adamw_step_by_hand():
    param = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    param.grad = torch.tensor([0.5], dtype=torch.float64)
    AdamW([param], lr=0.1, weight_decay=0.1).step()
    # decay:   1 - 0.1·0.1·1 = 0.99
    # moments: m = 0.1·0.5 = 0.05,  v = 0.001·0.25 = 0.00025
    # bias-corrected: m̂ = 0.05/0.1 = 0.5,  v̂ = 0.00025/0.001 = 0.25,  √v̂ = 0.5
    # update:  0.99 - 0.1·0.5/(0.5 + 1e-8) = 0.99 - 0.09999999800 = 0.89000000200
    # float64, both sides a few operations: a few ulps (1.1e-16 each near 0.89) apart at most
    assert param.item() == pytest.approx(0.99 - 0.1 * 0.5 / (0.5 + 1e-8), abs=1e-15)


def test_lr_factor_warmup_then_linear_decay():
    assert lr_factor(0, 10, 110) == 0.0  # the first update has learning rate 0
    assert lr_factor(5, 10, 110) == 0.5  # 5 / 10
    assert lr_factor(10, 10, 110) == 1.0  # peak: (110 - 10) / (110 - 10)
    assert lr_factor(60, 10, 110) == 0.5  # (110 - 60) / 100
    assert lr_factor(110, 10, 110) == 0.0
    assert lr_factor(150, 10, 110) == 0.0  # past the end it stays at 0, never negative
    assert lr_factor(0, 0, 4) == 1.0  # no warmup: start at the peak, (4 - 0) / 4


def test_schedule_takes_every_length_from_no_warmup_to_all_warmup_and_refuses_the_rest():
    optimizer = AdamW([torch.zeros(1, requires_grad=True)], lr=LR)
    # 0 <= warmup_steps <= total_steps and total_steps >= 1: no warmup starts at the full rate, all warmup
    # climbs to it at the end
    assert LinearWarmupDecay(optimizer, warmup_steps=0, total_steps=10).current_lrs() == [LR]
    assert LinearWarmupDecay(optimizer, warmup_steps=10, total_steps=10).current_lrs() == [0.0]
    for warmup_steps, total_steps in [(20, 10), (-1, 10), (0, 0)]:
        with pytest.raises(ValueError, match=f"warmup_steps={warmup_steps}, total_steps={total_steps}"):
            LinearWarmupDecay(optimizer, warmup_steps=warmup_steps, total_steps=total_steps)


def test_weight_decay_groups_leave_out_biases_and_norms():
    groups = weight_decay_groups(TinyMLP(seed=0).named_parameters(), WEIGHT_DECAY)
    assert [(group["param_names"], group["weight_decay"]) for group in groups] == [
        (["hidden.weight", "out.weight"], WEIGHT_DECAY),
        (["hidden.bias", "norm.weight", "norm.bias", "out.bias"], 0.0),
    ]
    # each rule alone: a 2-D parameter named like a norm or a bias, and a 1-D one named like neither
    square = torch.ones(2, 2, requires_grad=True)
    vector = torch.ones(2, requires_grad=True)
    for name, param in [("encoder.LayerNorm.weight", square), ("head.bias", square), ("1.weight", vector)]:
        [group] = weight_decay_groups([(name, param)], WEIGHT_DECAY)
        assert group["weight_decay"] == 0.0, name


def test_clip_grad_norm_by_hand_and_against_torch():
    a = torch.zeros(1, requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    a.grad, b.grad = torch.tensor([3.0]), torch.tensor([4.0])
    total = clip_grad_norm_([a, b], max_norm=1.0)
    # global norm sqrt(3² + 4²) = 5; scale 1 / (5 + 1e-6): (3, 4) -> (0.6, 0.8), each 2e-7 less. In float32
    # three roundings (5 + 1e-6, the division, the product) of values below 1 lie between (tolerances.py).
    assert total.item() == 5.0
    assert (a.grad.item(), b.grad.item()) == pytest.approx((3 / (5 + 1e-6), 4 / (5 + 1e-6)), abs=float32_apart(3))

    generator = torch.Generator().manual_seed(0)
    # random gradients of norm about 5: the first clips, the second does not; gradients of norm about 5e-6,
    # where torch's 1e-6 added to the norm changes the scale by a fifth, clipped to 1e-7
    for max_norm, size in ((0.5, 1.0), (1e3, 1.0), (1e-7, 1e-6)):
        ours_params = [torch.zeros(shape, requires_grad=True) for shape in ((5, 3), (3,), (7,))]
        torch_params = [torch.zeros_like(p, requires_grad=True) for p in ours_params]
        for mine, theirs in zip(ours_params, torch_params):
            mine.grad = size * torch.randn(mine.shape, generator=generator)
            theirs.grad = mine.grad.clone()
        ours_total = clip_grad_norm_(ours_params, max_norm)
        torch_total = torch.nn.utils.clip_grad_norm_(torch_params, max_norm)
        # On a CPU torch takes each gradient's norm (its foreach norm is a vector_norm per tensor there), the
        # norm of those, then multiplies: so do we, and the results agree to the bit
        assert torch.equal(ours_total, torch_total)
        assert all(torch.equal(mine.grad, theirs.grad) for mine, theirs in zip(ours_params, torch_params))
        # The clipped gradients' norm, summed over all 25 entries at once: float32 roundings of the two
        # sums of squares, the scale and the multiply (tolerances.py), and the 1e-6 the clip adds to the norm.
        clipped_total = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in ours_params]))
        assert clipped_total.item() == pytest.approx(min(max_norm, ours_total.item()),
                                                     rel=float32_apart(25 + 5) + 1e-6 / ours_total.item())


def test_clipping_gradients_that_do_not_exist_returns_0_as_torch_does():
    # parameters without a gradient are left out; with none left the norm is 0 (torch returns tensor(0.))
    no_gradient = [torch.zeros(2, requires_grad=True)]
    assert clip_grad_norm_(no_gradient, 1.0) == torch.nn.utils.clip_grad_norm_(no_gradient, 1.0) == 0
    assert clip_grad_norm_([], 1.0) == 0


@pytest.mark.parametrize("max_norm", [0.0, -1.0, float("nan")])
def test_clipping_to_a_norm_that_is_not_positive_is_refused(max_norm):
    # torch would scale every gradient to 0 (or NaN): never what a training run means
    param = torch.zeros(2, requires_grad=True)
    param.grad = torch.ones(2)
    with pytest.raises(ValueError, match=f"max_norm must be > 0, got {max_norm}"):
        clip_grad_norm_([param], max_norm)


# --- 1,000 steps against torch ----------------------------------------------------------------


@pytest.fixture(scope="module")
def uninterrupted_run(one_thread):
    model = TinyMLP(seed=0)
    optimizer, scheduler = ours(model)
    train(model, optimizer, scheduler, clip_grad_norm_, range(TOTAL_STEPS))
    return model, optimizer


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`")
def test_schedule_matches_lambdalr_at_every_step():
    optimizer, scheduler = ours(TinyMLP(seed=0))
    torch_optimizer = torch.optim.AdamW(weight_decay_groups(TinyMLP(seed=0).named_parameters(), WEIGHT_DECAY), lr=LR)
    torch_scheduler = torch.optim.lr_scheduler.LambdaLR(torch_optimizer, reference_factor)
    for step in range(TOTAL_STEPS + 10):
        assert scheduler.current_lrs() == torch_scheduler.get_last_lr(), f"learning rates differ at step {step}"
        scheduler.step()
        torch_scheduler.step()
    assert scheduler.current_lrs() == [0.0, 0.0]


def test_matches_torch_adamw_lambdalr_and_clipping_for_1000_steps(uninterrupted_run):
    model, _ = uninterrupted_run
    reference = TinyMLP(seed=0)
    # foreach=False pins torch to its single-tensor AdamW, the path it also takes by default on CPU
    torch_optimizer = torch.optim.AdamW(
        weight_decay_groups(reference.named_parameters(), WEIGHT_DECAY), lr=LR, foreach=False
    )
    torch_scheduler = torch.optim.lr_scheduler.LambdaLR(torch_optimizer, reference_factor)
    train(reference, torch_optimizer, torch_scheduler, torch.nn.utils.clip_grad_norm_, range(TOTAL_STEPS))

    # Exactly 0: the same float32 operations in the same order (AdamW.step follows torch's single-tensor
    # AdamW). No tolerance would mean more: 1,000 steps carry one ulp on every starting weight to 8e-7.
    assert max_abs_diff(model, reference) == 0
    # the run really moved the parameters, so agreement is not trivially about untouched values
    assert max_abs_diff(model, TinyMLP(seed=0)) > 0.1


def test_the_defaults_are_torch_adamws():
    # lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 1e-2: ten steps from the same start and gradients
    # agree to the bit (float64, so that a default off in its third digit shows in every step)
    generator = torch.Generator().manual_seed(3)
    mine = torch.randn(6, generator=generator, dtype=torch.float64, requires_grad=True)
    theirs = mine.detach().clone().requires_grad_()
    ours_optimizer, torch_optimizer = AdamW([mine]), torch.optim.AdamW([theirs], foreach=False)
    for _ in range(10):
        mine.grad = torch.randn(6, generator=generator, dtype=torch.float64)
        theirs.grad = mine.grad.clone()
        ours_optimizer.step()
        torch_optimizer.step()
    assert torch.equal(mine, theirs)


def test_weight_decay_changes_the_result():
    # guards the comparison above: a model trained without decay ends elsewhere
    model = TinyMLP(seed=0)
    optimizer = AdamW(weight_decay_groups(model.named_parameters(), 0.0), lr=LR)
    train(model, optimizer, LinearWarmupDecay(optimizer, WARMUP_STEPS, TOTAL_STEPS), clip_grad_norm_, range(100))
    decayed = TinyMLP(seed=0)
    optimizer = AdamW(weight_decay_groups(decayed.named_parameters(), WEIGHT_DECAY), lr=LR)
    train(decayed, optimizer, LinearWarmupDecay(optimizer, WARMUP_STEPS, TOTAL_STEPS), clip_grad_norm_, range(100))
    assert max_abs_diff(model, decayed) > 1e-4  # by 1.9e-2 here: decay's effect, not a rounding's


# --- checkpoint and resume --------------------------------------------------------------------


def test_resume_from_step_500_is_identical_to_uninterrupted(uninterrupted_run):
    model = TinyMLP(seed=0)
    optimizer, scheduler = ours(model)
    train(model, optimizer, scheduler, clip_grad_norm_, range(500))
    buffer = io.BytesIO()
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
        buffer,
    )
    buffer.seek(0)
    checkpoint = torch.load(buffer)

    # fresh objects, different initial weights: everything must come from the checkpoint
    resumed = TinyMLP(seed=123)
    resumed.load_state_dict(checkpoint["model"])
    resumed_optimizer = AdamW(weight_decay_groups(resumed.named_parameters(), WEIGHT_DECAY), lr=LR)
    resumed_optimizer.load_state_dict(checkpoint["optimizer"])
    # built after the optimizer took the saved (scheduled) lr, so the base lr must come from the checkpoint
    resumed_scheduler = LinearWarmupDecay(resumed_optimizer, WARMUP_STEPS, TOTAL_STEPS)
    resumed_scheduler.load_state_dict(checkpoint["scheduler"])
    assert resumed_scheduler.current_lrs() == [LR * (TOTAL_STEPS - 500) / (TOTAL_STEPS - WARMUP_STEPS)] * 2
    train(resumed, resumed_optimizer, resumed_scheduler, clip_grad_norm_, range(500, TOTAL_STEPS))

    full_model, full_optimizer = uninterrupted_run
    for (name, a), b in zip(resumed.named_parameters(), full_model.parameters()):
        assert torch.equal(a, b), f"{name} differs after resuming"
    for a, b in zip(resumed.parameters(), full_model.parameters()):
        state_a, state_b = resumed_optimizer.state[a], full_optimizer.state[b]
        assert state_a["step"] == state_b["step"] == TOTAL_STEPS
        assert torch.equal(state_a["exp_avg"], state_b["exp_avg"])
        assert torch.equal(state_a["exp_avg_sq"], state_b["exp_avg_sq"])


def test_state_dict_is_a_snapshot_and_rejects_a_different_model():
    model = TinyMLP(seed=0)
    optimizer, scheduler = ours(model)
    train(model, optimizer, scheduler, clip_grad_norm_, range(3))
    saved = optimizer.state_dict()
    moments = ("exp_avg", "exp_avg_sq")
    before = [saved["state"][0][key].clone() for key in moments]
    train(model, optimizer, scheduler, clip_grad_norm_, range(3, 6))
    assert all(torch.equal(saved["state"][0][key], value) for key, value in zip(moments, before))
    # and loading copies it: an optimizer resumed from it and trained on leaves it as it was, so that one
    # checkpoint can be resumed from twice
    resumed = TinyMLP(seed=0)
    resumed_optimizer = AdamW(weight_decay_groups(resumed.named_parameters(), WEIGHT_DECAY), lr=LR)
    resumed_optimizer.load_state_dict(saved)
    resumed_scheduler = LinearWarmupDecay(resumed_optimizer, WARMUP_STEPS, TOTAL_STEPS)
    train(resumed, resumed_optimizer, resumed_scheduler, clip_grad_norm_, range(3, 6))
    assert all(torch.equal(saved["state"][0][key], value) for key, value in zip(moments, before))

    other = nn.Linear(8, 4)
    other_optimizer = AdamW(weight_decay_groups(other.named_parameters(), WEIGHT_DECAY), lr=LR)
    with pytest.raises(ValueError, match="parameter group 0: saved 2 parameters, this one has 1"):
        other_optimizer.load_state_dict(saved)
    renamed = [(f"encoder.{name}", param) for name, param in TinyMLP(seed=0).named_parameters()]
    with pytest.raises(ValueError, match="saved parameter 'hidden.weight' where this one has 'encoder.hidden.weight'"):
        AdamW(weight_decay_groups(renamed, WEIGHT_DECAY), lr=LR).load_state_dict(saved)


def test_first_update_with_warmup_is_a_no_op():
    # lr factor 0 at step 0 means the first update is a no-op (decay included): the warmup really
    # starts from 0, as in BERT and sentence-transformers
    model = TinyMLP(seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer, scheduler = ours(model)
    train(model, optimizer, scheduler, clip_grad_norm_, [0])
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    train(model, optimizer, scheduler, clip_grad_norm_, [1])
    assert not all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    # float64: the schedule multiplies 1e-2 by 2 / 100, this divides 2e-2 by 100, which may round an ulp apart
    assert math.isclose(scheduler.current_lrs()[0], LR * 2 / WARMUP_STEPS)
