"""The fast encoder's matrix products, x W^T + b, on the quickest kernel this machine has for them.

Nearly all of an encoder's time goes into four products per block: Q, K and V (H -> 3H, the three
weight matrices side by side), the attention output (H -> H) and the feed-forward's two (H -> I with
GELU, I -> H). On a CPU torch has two kernels for them:

- "torch": its default, `F.linear` / `torch.addmm` (Intel MKL in x86 builds), which reads the weight
  matrix as it is stored;
- "onednn": oneDNN, with the weight matrix reordered once, ahead of time, into the blocked layout its
  kernels read (`torch.ops.mkldnn._reorder_linear_weight`), and multiplied by
  `torch.ops.mkldnn._linear_pointwise`, which also applies GELU to the product as it writes it.

Which is quicker depends on the processor and on the shape, so no rule is written down: the first
time any process on a machine meets a product of some shape, it times both kernels on the real
weights (a few rounds, in turn, keeping each one's best time), and the quicker is kept as a fact
about the machine (fast/machine.py) that every later process reads back. A race in each process
would let two processes, one of them under load, compute the same embedding on different kernels.
The environment variable MINISBERT_GEMM=torch or =onednn skips the measurement and forces one; unset
(or "auto") uses the kept fact.

A row's bits never depend on the other rows, by construction. oneDNN and MKL choose how to block a
product, and which micro-kernel runs it, by its shape: the same row can get other bits in a product
of 5 rows than in one of 64, and on some CPUs at multiples of 16 rows too (bench/README.md, "Batch
invariance" and "Batch invariance by construction"). So without autograd on a CPU `linear` never hands a kernel the caller's rows: it cuts
them into tiles of TILE_ROWS rows, the last one padded with zero rows (`whole_tiles`; the fast encoder
pads its tokens once, so that its products never copy), and calls the kernel once per tile, each tile
contiguous and starting at an address aligned to 64 bytes, writing into that tile's rows of the
result; GELU runs on each tile as it comes out. Every call a kernel sees then has the same shape
whatever the batch, so it chooses the same way for every batch, on any CPU, without anyone measuring
what it does with other shapes. What is left is a row's place in its tile, and a kernel computes
every row of a call alike (each blocks rows only to reuse the weights it has loaded; a row moved
through every place of a tile kept its bits on every kernel tried: bench/README.md). That is what
lets encode() promise the same vector for the same text in any batch; tests/test_batch_invariance.py
watches the calls and checks the bits.

Where the choice applies: on a CPU without autograd (oneDNN's ops have no backward pass, so training
uses torch's kernel), in float32, and in bfloat16 under `torch.autocast` (inputs cast to bfloat16,
weights cast once and kept, results in bfloat16, as autocast would give). Elsewhere (autograd, GPUs)
products are `F.linear`, with autocast applying as it does to nn.Linear. What a kernel needs made
from the weights (stacked, cast, reordered) is kept per product and made again when any of its
parameters changes: an optimizer step, `load_state_dict` or `.to()` changes a parameter's version
counter or its storage, and both are checked at each call. (A write through `param.data` changes
neither; minisbert's own code makes none.)

Both kernels sum the same products in different orders, so results agree to float32 rounding:
tests/test_fast_linear.py runs the encoder with each kernel forced and checks it against the plain
one to 1e-5, checks that training then encoding sees the new weights, and that memory reuse changes
no bit.
"""

import contextlib
import contextvars
import math
import os
import time
import weakref

import torch
import torch.nn.functional as F

from .. import cpu
from . import machine

BACKENDS = ("torch", "onednn")
BACKEND_VARIABLE = "MINISBERT_GEMM"  # "torch" or "onednn" forces that kernel; unset or "auto" measures
PROBE_ROWS = 1024  # tokens in the inputs the kernels are timed on (an encode batch holds up to 2,048)
PROBE_ROUNDS = 3  # timed rounds per kernel, after one untimed round
# Rows each kernel call gets without autograd (see above). A short text pays for the padding (a
# query of 10 tokens computes a whole tile), a long batch for the calls (a product of 2,048 tokens
# makes 2,048 / TILE_ROWS of them, each with a fixed cost). Of 16 to 256 rows, 32 encoded 1,000
# sentences within a tenth of the quickest (64) and a short query in 0.7 of 64's time (bench/README.md,
# "Batch invariance").
TILE_ROWS = 32

# The memory kept by `reusing_memory()`: a dict from (name, dtype) to a flat tensor, or None
# outside it. A context variable, so each thread (and each asyncio task) has its own.
_scratch = contextvars.ContextVar("minisbert_scratch", default=None)
# What each kernel reads, made from the weights of the product whose first nn.Linear is the key:
# {(ids of the layers, backend, dtype): (parameter versions and storages, (weight, bias))}.
_prepared = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def reusing_memory():
    """Within this block, products `linear` is asked to keep (Q, K and V side by side, and the
    feed-forward's activations) are written into memory kept from one call to the next, grown when
    needed and freed on leaving.

    A fresh (2,048 x 1,536) float32 tensor, 12 MB, comes from the operating system page by page:
    encoding 200 SciFact documents took 575,000 page faults and 1.1 s of system time (6% of the
    CPU time) without this, 15,000 and 0.05 s with it. Results are bit for bit the same: the same
    kernels write into an existing tensor.
    """
    token = _scratch.set({})
    try:
        yield
    finally:
        _scratch.reset(token)


def linear(x, layers, gelu: str = None, keep_as: str = None):
    """x through the nn.Linear `layers` side by side: (N, in) -> (N, out_1 + out_2 + ...). One wide
    product keeps the cores busier than several narrow ones.

    gelu: None, or F.gelu's `approximate` ("none" or "tanh") to apply GELU to the product.
    keep_as: the name under which `reusing_memory()` keeps the product's memory (see there).
    """
    if torch.is_grad_enabled() or x.device.type != "cpu":
        weight, bias = _stacked(layers)
        y = F.linear(x, weight, bias)  # (N, out)
        return y if gelu is None else F.gelu(y, approximate=gelu)
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
    backend = _backend(layers, gelu, keep_as, dtype)
    return on_tiles(backend, x.to(dtype), _prepare(layers, backend, dtype), gelu, keep_as)  # (N, out)


def on_tiles(backend, x, weights, gelu, keep_as):
    """`backend`'s product of x (N, in) with `weights`, one tile of TILE_ROWS rows at a time: (N, out)."""
    rows, x = x.shape[0], whole_tiles(x)  # (N', in)
    out = _kept_memory(keep_as, x.shape[0], weights[1].shape[0], x.dtype)  # (N', out)
    for tile in range(0, x.shape[0], TILE_ROWS):
        PRODUCTS[backend](x[tile:tile + TILE_ROWS], weights, gelu, out[tile:tile + TILE_ROWS])
    return out[:rows]  # (N, out)


def whole_tiles(x):
    """x (N, ...) as tiles are cut from it: contiguous, from an address aligned to 64 bytes (the widest
    vector, and a cache line), with zero rows added up to a multiple of TILE_ROWS rows. x itself where
    it is so already (the fast encoder pads its tokens once, so that its products never copy)."""
    missing = -x.shape[0] % TILE_ROWS
    if missing == 0 and x.is_contiguous() and x.data_ptr() % 64 == 0:
        return x
    padded = x.new_zeros(x.shape[0] + missing, *x.shape[1:])  # (N', ...): a fresh tensor, aligned
    padded[:x.shape[0]] = x
    return padded


def _stacked(layers):
    """The layers' weight matrices one above the other (out, in), and their biases (out,)."""
    if len(layers) == 1:
        return layers[0].weight, layers[0].bias
    return torch.cat([layer.weight for layer in layers]), torch.cat([layer.bias for layer in layers])


def _torch_product(x, weights, gelu, out):
    """One tile (TILE_ROWS, in) through torch's kernel into `out` (TILE_ROWS, out)."""
    weight, bias = weights
    torch.addmm(bias, x, weight.T, out=out)
    if gelu is not None:  # nothing else reads the product: GELU overwrites it
        torch.ops.aten.gelu_(out, approximate=gelu)


def _onednn_product(x, weights, gelu, out):
    """One tile (TILE_ROWS, in) through oneDNN's kernel, GELU fused, copied into `out` (TILE_ROWS, out)."""
    packed, bias = weights
    if gelu is None:
        out.copy_(torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], ""))
    else:
        out.copy_(torch.ops.mkldnn._linear_pointwise(x, packed, bias, "gelu", [], gelu))


PRODUCTS = {"torch": _torch_product, "onednn": _onednn_product}


def _kept_memory(keep_as, rows, width, dtype):
    """A (rows, width) tensor: in the memory `reusing_memory()` keeps under `keep_as`, else new."""
    scratch = _scratch.get()
    if keep_as is None or scratch is None:
        return torch.empty(rows, width, dtype=dtype)
    memory = scratch.get((keep_as, dtype))
    if memory is None or memory.numel() < rows * width:
        memory = scratch[(keep_as, dtype)] = torch.empty(rows * width, dtype=dtype)
    return memory[: rows * width].view(rows, width)


def _prepare(layers, backend, dtype):
    """The stacked weight, as `backend` reads it, and bias, both in `dtype`: made once, kept while
    none of the layers' parameters changes (version counter and storage, checked at each call)."""
    parameters = [p for layer in layers for p in (layer.weight, layer.bias)]
    stamp = tuple((p._version, p.data_ptr()) for p in parameters)
    kept = _prepared.setdefault(layers[0], {})
    key = (tuple(map(id, layers)), backend, dtype)
    if key not in kept or kept[key][0] != stamp:
        weight, bias = _stacked(layers)
        weight, bias = weight.detach().to(dtype), bias.detach().to(dtype)
        if backend == "onednn":
            weight = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        kept[key] = (stamp, (weight, bias))
    return kept[key][1]


def runs(backend: str, dtype: torch.dtype) -> bool:
    """Whether `backend` can multiply `dtype` on this CPU. oneDNN's kernels are written for x86:
    float32 from AVX2 on, bfloat16 (by its own error message) from AVX-512 BW/VL/DQ or AVX-NE-CONVERT."""
    if backend == "torch":
        return True
    flags = cpu.flags()
    if not torch.backends.mkldnn.is_available() or "avx2" not in flags:
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and ({"avx512bw", "avx512vl", "avx512dq"} <= flags or "avx_ne_convert" in flags)


def _backend(layers, gelu, keep_as, dtype) -> str:
    """The kernel for this product: forced by MINISBERT_GEMM, else the quicker one as measured."""
    forced = os.environ.get(BACKEND_VARIABLE, "auto")
    if forced not in BACKENDS + ("auto",):
        raise ValueError(f"{BACKEND_VARIABLE}={forced!r}: choose one of {list(BACKENDS)}, or auto (the default)")
    if forced != "auto":
        if not runs(forced, dtype):
            raise ValueError(f"{BACKEND_VARIABLE}={forced}, but that kernel cannot multiply {dtype} on this CPU; "
                             f"unset {BACKEND_VARIABLE} or set it to torch")
        return forced
    candidates = [backend for backend in BACKENDS if runs(backend, dtype)]
    if len(candidates) == 1:
        return candidates[0]
    product = f"{layers[0].in_features} x {sum(layer.out_features for layer in layers)}"
    product += f" then GELU ({gelu})" if gelu else ""
    name = f"quicker product kernel, {product}, {str(dtype).removeprefix('torch.')}"
    return machine.fact(name, lambda: _quickest(candidates, layers, gelu, keep_as, dtype))


def _quickest(candidates, layers, gelu, keep_as, dtype) -> str:
    """Time each kernel on this product, in turn, and return the quicker; forget the other's weights
    (with timing off, fast/machine.py: the first candidate, torch's kernel, untimed). Each is timed
    as `linear` runs it, tile by tile."""
    if not machine.timing():
        return candidates[0]
    best = dict.fromkeys(candidates, math.inf)
    # Inputs from a generator of its own: drawing from torch's global one would change the dropout
    # masks a training run draws next, depending on when (in which process) a shape is first met.
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(PROBE_ROWS, layers[0].in_features, dtype=dtype, generator=generator)  # (N, in)
    for round_number in range(PROBE_ROUNDS + 1):
        for backend in candidates:
            weights = _prepare(layers, backend, dtype)
            start = time.perf_counter()
            on_tiles(backend, x, weights, gelu, keep_as)
            if round_number > 0:  # the first round only warms up
                best[backend] = min(best[backend], time.perf_counter() - start)
    quickest = min(best, key=best.get)
    for backend in candidates:
        if backend != quickest:
            _prepared[layers[0]].pop((tuple(map(id, layers)), backend, dtype))
    return quickest
