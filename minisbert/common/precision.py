"""Which precision a model computes in, and on which device: the rules train.py, evaluate.py and
encode() share.

A model's weights and its embeddings are float32 always. Its products may run in a narrower type
under torch's autocast (Micikevicius et al. 2018, "Mixed Precision Training"): bfloat16 or float16,
while LayerNorm, softmax, pooling and normalisation stay in float32 (see SentenceModel.forward).
The scripts spell the choice two ways, `--dtype bfloat16` and `--amp bf16`; both name one of
COMPUTE_DTYPES. Training in float16 also scales its loss (`LossScaler`), which bfloat16 needs not.

Checked in tests/encoding/test_bfloat16.py (what is refused where) and tests/training/test_training.py (the flags).
"""

import torch

from . import cpu

COMPUTE_DTYPES = {"float32": None, "float16": torch.float16, "bfloat16": torch.bfloat16}  # None: no autocast
AMP_SPELLINGS = {"bf16": "bfloat16", "fp16": "float16"}  # train.py / evaluate.py --amp, another spelling of --dtype


def dtype_from_flags(amp: str | None, dtype: str) -> str:
    """The precision asked for by train.py's and evaluate.py's --dtype and --amp, its other spelling
    (bf16 = bfloat16, fp16 = float16); a ValueError when both are given and disagree."""
    if amp is None:
        return dtype
    if dtype not in ("float32", AMP_SPELLINGS[amp]):
        raise ValueError(f"--amp {amp} and --dtype {dtype} disagree: give one of them")
    return AMP_SPELLINGS[amp]


def autocast_dtype(dtype: str, device) -> torch.dtype | None:
    """The autocast dtype for computing in `dtype` on `device` (None: plain float32), or a ValueError
    saying why not. float32 runs anywhere; float16 on GPUs; bfloat16 on GPUs and on CPUs that
    multiply it natively (common/cpu.py): elsewhere torch would emulate it, more slowly than float32."""
    if dtype not in COMPUTE_DTYPES:
        raise ValueError(f"dtype must be one of {list(COMPUTE_DTYPES)}, got {dtype!r}")
    if torch.device(device).type == "cpu":
        if dtype == "float16":
            raise ValueError("dtype float16 is for GPUs; on a CPU compute in float32 (or bfloat16 where the CPU "
                             "has it natively)")
        if dtype == "bfloat16" and not cpu.native_bfloat16():
            raise ValueError("dtype bfloat16 needs a CPU that multiplies bfloat16 natively (flag avx512_bf16 or "
                             "amx_bf16 in /proc/cpuinfo); this one has neither, so torch would emulate it, more "
                             "slowly than float32: use float32 here, or a GPU")
    return COMPUTE_DTYPES[dtype]


def computing_in(dtype: str, device: torch.device):
    """A context in which `device` computes in `dtype`: autocast to it, or nothing for float32."""
    narrow = autocast_dtype(dtype, device)
    return torch.autocast(device.type, dtype=narrow or torch.float32, enabled=narrow is not None)


def default_device() -> torch.device:
    """cuda, then mps, then cpu: the best device this machine has."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


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
