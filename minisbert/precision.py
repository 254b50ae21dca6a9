"""Which precision a model computes in, and on which device: the rules train.py, evaluate.py and
encode() share.

A model's weights and its embeddings are float32 always. Its products may run in a narrower type
under torch's autocast (Micikevicius et al. 2018, "Mixed Precision Training"): bfloat16 or float16,
while LayerNorm, softmax, pooling and normalisation stay in float32 (see SentenceModel.forward).
The scripts spell the choice two ways, `--dtype bfloat16` and `--amp bf16`; both name one of
COMPUTE_DTYPES.

Checked in tests/test_bfloat16.py (what is refused where) and tests/test_training.py (the flags).
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
    multiply it natively (cpu.py): elsewhere torch would emulate it, more slowly than float32."""
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
