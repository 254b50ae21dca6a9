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
about the machine (common/machine.py) that every later process reads back. A race in each process
would let two processes, one of them under load, compute the same embedding on different kernels.
The environment variable MINISBERT_GEMM=torch or =onednn skips the measurement and forces one; unset
(or "auto") uses the kept fact.

A row's bits never depend on the other rows, by construction. oneDNN and MKL choose how to block a
product, and which micro-kernel runs it, by its shape: the same row can get other bits in a product
of 5 rows than in one of 64, and on some CPUs at some multiples of 16 rows too (bench/README.md,
"Batch invariance"). So without autograd on a CPU a kernel never sees the caller's rows: they are cut
into tiles of a fixed number of rows, the last one padded with zero rows (`whole_tiles`; the fast
encoder pads its tokens once, so that its products never copy), contiguous, from an address aligned
to 64 bytes, and the kernel gets them as a stack of whole tiles, up to STACK_ROWS rows a call. What a
tile gets from such a call is the kernel's business, so it is not assumed: the first time a machine
meets a product, a kernel, a dtype and a tile size, it checks, bit for bit, that each tile of every
stack up to STACK_ROWS rows gets what the tile gets alone (`keeps_tiles`). That is a fact about the
machine (common/machine.py), found by comparing bits, not by timing, so every process on the machine
finds the same. A forward pass takes the smallest tile at which all its products keep their tiles'
bits (`tile_rows`); a kernel that keeps them at no size gets one tile a call, each call the same
shape whatever the batch. Either way a text's rows get the same bits in any batch, which is what lets
encode() promise the same vector for the same text; tests/encoding/test_batch_invariance.py forces each
kernel and checks the bits.

Where the choice applies: on a CPU without autograd (oneDNN's ops have no backward pass, so training
uses torch's kernel), in float32, and in bfloat16 under `torch.autocast` (inputs cast to bfloat16,
weights cast once and kept, results in bfloat16, as autocast would give). Elsewhere (autograd, GPUs)
products are `F.linear`, with autocast applying as it does to nn.Linear. What a kernel needs made
from the weights (stacked, cast, reordered) is kept per product and made again when any of its
parameters changes: an optimizer step, `load_state_dict` or `.to()` changes a parameter's version
counter or its storage, and both are checked at each call. (A write through `param.data` changes
neither; minisbert's own code makes none.)

Both kernels sum the same products in different orders, so results agree to float32 rounding:
tests/encoding/test_fast_linear.py runs the encoder with each kernel forced and checks it against the plain
one to 1e-5, checks that training then encoding sees the new weights, and that memory reuse changes
no bit.
"""

import contextlib
import contextvars
import os
import re
import weakref

import torch
import torch.nn.functional as F

from ...common import cpu
from ...common import machine

BACKENDS = ("torch", "onednn")
BACKEND_VARIABLE = "MINISBERT_GEMM"  # "torch" or "onednn" forces that kernel; unset or "auto" measures
PROBE_ROWS = 1024  # rows of the batch the kernels are timed on (an encode batch holds up to 2,048)
# Rows of a tile (see above), the candidates smallest first: a forward pass takes the smallest at which
# every one of its products keeps a tile's bits in a stack (`tile_rows`), else the largest. The kernel
# gets a product's tiles in stacks, so a tile's size only decides the padding a text pays: a query of
# 9 tokens computes a whole tile. 32 is the fallback: on one CPU kind a row got other bits at some
# multiples of 16 rows (bench/README.md, "Batch invariance by construction").
TILE_SIZES = (16, 32)
# The most rows one call gets: an encode batch's tokens (encoding/fast/batching.py's CPU_TOKENS_PER_FORWARD),
# in one call (calls of 512 rows took 18% longer to encode documents: bench/README.md, "Encoding").
# `keeps_tiles` checks every stack of tiles up to it; a product of more rows runs in calls of this many.
STACK_ROWS = 2048
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


def linear(x, layers, gelu: str = None, keep_as: str = None, tile: int = TILE_SIZES[-1]):
    """x through the nn.Linear `layers` side by side: (N, in) -> (N, out_1 + out_2 + ...). One wide
    product keeps the cores busier than several narrow ones.

    gelu: None, or F.gelu's `approximate` ("none" or "tanh") to apply GELU to the product.
    keep_as: the name under which `reusing_memory()` keeps the product's memory (see there).
    tile: the rows of a tile without autograd on a CPU (`tile_rows` chooses it for a forward pass).
    """
    if torch.is_grad_enabled() or x.device.type != "cpu":
        weight, bias = _stacked(layers)
        y = F.linear(x, weight, bias)  # (N, out)
        return y if gelu is None else F.gelu(y, approximate=gelu)
    dtype = computing_dtype(x)
    backend = _backend(layers, gelu, keep_as, dtype)
    weights = _prepare(layers, backend, dtype)
    tiles_a_call = STACK_ROWS // tile if keeps_tiles(backend, layers, gelu, dtype, tile) else 1
    return on_tiles(backend, x.to(dtype), weights, gelu, keep_as, tile, tiles_a_call)  # (N, out)


def computing_dtype(x) -> torch.dtype:
    """The dtype `linear` multiplies x in: autocast's on a CPU where it is on, else x's."""
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype


def tile_rows(products, dtype) -> int:
    """The rows of a tile for a forward pass whose products are `products` ((layers, gelu) pairs): the
    smallest of TILE_SIZES at which each, on its kernel, keeps a tile's bits in a stack; else the
    largest (where a kernel that does not keep them gets one tile a call)."""
    for tile in TILE_SIZES[:-1]:
        if all(keeps_tiles(_backend(layers, gelu, None, dtype), layers, gelu, dtype, tile) for layers, gelu in products):
            return tile
    return TILE_SIZES[-1]


def on_tiles(backend, x, weights, gelu, keep_as, tile, tiles_a_call):
    """`backend`'s product of x (N, in) with `weights`: (N, out). x is cut into tiles of `tile` rows,
    and the kernel gets `tiles_a_call` of them a call (the last call fewer)."""
    rows, x = x.shape[0], whole_tiles(x, tile)  # (N', in)
    out = _kept_memory(keep_as, x.shape[0], weights[1].shape[0], x.dtype)  # (N', out)
    step = tiles_a_call * tile
    if x.shape[0] <= step:  # one call: its result is the product, wherever the kernel wrote it
        return PRODUCTS[backend](x, weights, gelu, out)[:rows]
    for start in range(0, x.shape[0], step):
        piece = out[start:start + step]
        result = PRODUCTS[backend](x[start:start + step], weights, gelu, piece)
        if result.data_ptr() != piece.data_ptr():
            piece.copy_(result)
    return out[:rows]  # (N, out)


def whole_tiles(x, tile: int):
    """x (N, ...) as tiles are cut from it: contiguous, from an address aligned to 64 bytes (the widest
    vector, and a cache line), with zero rows added up to a multiple of `tile` rows. x itself where
    it is so already (the fast encoder pads its tokens once, so that its products never copy)."""
    missing = -x.shape[0] % tile
    if missing == 0 and x.is_contiguous() and x.data_ptr() % 64 == 0:
        return x
    padded = x.new_zeros(x.shape[0] + missing, *x.shape[1:])  # (N', ...): a fresh tensor, aligned
    padded[:x.shape[0]] = x
    return padded


def keeps_tiles(backend, layers, gelu, dtype, tile: int) -> bool:
    """Whether `backend` gives each tile of `tile` rows in a stack the bits it gives the tile alone,
    for this product on this machine (a kept fact, see the module docstring): checked on inputs drawn
    from a generator of its own, for every stack of 1 tile to STACK_ROWS rows, against each tile
    multiplied alone. Stacks are for float32 and native bfloat16, the dtypes whose speed matters."""
    if not (dtype == torch.float32 or (dtype == torch.bfloat16 and cpu.native_bfloat16())):
        return False  # a dtype this CPU only emulates (a network cast by .half(), .double()): a tile a call
    product = f"{layers[0].in_features} x {sum(layer.out_features for layer in layers)}"
    product += f" then GELU ({gelu})" if gelu else ""
    name = f"keeps a tile's bits in a stack, {tile}-row tiles, {backend}, {product}, {str(dtype).removeprefix('torch.')}"

    def check() -> bool:
        weights = _prepare(layers, backend, dtype)
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(STACK_ROWS, layers[0].in_features, generator=generator).to(dtype)
        alone = on_tiles(backend, x, weights, gelu, None, tile, 1)  # (N, out): a tile a call
        return all(torch.equal(on_tiles(backend, x[:rows], weights, gelu, None, tile, STACK_ROWS // tile), alone[:rows])
                   for rows in range(tile, STACK_ROWS + 1, tile))

    return machine.fact(name, check, kind=bool)


def _stacked(layers):
    """The layers' weight matrices one above the other (out, in), and their biases (out,); a layer
    without bias (a Dense layer may have none) adds zeros."""
    if len(layers) == 1 and layers[0].bias is not None:
        return layers[0].weight, layers[0].bias
    biases = [layer.weight.new_zeros(layer.out_features) if layer.bias is None else layer.bias for layer in layers]
    return torch.cat([layer.weight for layer in layers]), torch.cat(biases)


def _torch_product(x, weights, gelu, out):
    """Whole tiles (N, in) through torch's kernel, written into `out` (N, out)."""
    weight, bias = weights
    torch.addmm(bias, x, weight.T, out=out)
    if gelu is not None:  # nothing else reads the product: GELU overwrites it
        torch.ops.aten.gelu_(out, approximate=gelu)
    return out


def _onednn_product(x, weights, gelu, out):
    """Whole tiles (N, in) through oneDNN's kernel, GELU fused: a new (N, out) tensor (the kernel
    writes into no given memory; `out` is left alone)."""
    packed, bias = weights
    if gelu is None:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "gelu", [], gelu)


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
    parameters = [p for layer in layers for p in (layer.weight, layer.bias) if p is not None]
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
    return machine.fact(name, lambda: _quickest(candidates, layers, gelu, keep_as, dtype), choices=candidates)


def kernels_known(products, dtype=torch.float32) -> str:
    """The kernel each (in, out) product of `products` runs on this machine, as far as it is known
    now: forced by MINISBERT_GEMM, the only one that runs here, or the machine's kept fact (`_backend`);
    "measured at first use" before a first encode has measured it."""
    forced = os.environ.get(BACKEND_VARIABLE, "auto")
    candidates = [backend for backend in BACKENDS if runs(backend, dtype)]
    kept, dtype_name = machine.known(), str(dtype).removeprefix("torch.")
    described = []
    for features_in, features_out in products:
        if forced != "auto" or len(candidates) == 1:
            kernel = forced if forced != "auto" else candidates[0]
        else:
            name = re.compile(rf"quicker product kernel, {features_in} x {features_out}( then GELU \(\w+\))?, {dtype_name}")
            kernel = next((value for fact, value in kept.items() if name.fullmatch(fact)), "measured at first use")
        described.append(f"{features_in} x {features_out} {kernel}")
    return ", ".join(described)


def _quickest(candidates, layers, gelu, keep_as, dtype) -> str:
    """Time each kernel on this product at the two sizes users run, in turn: one tile (a short query)
    and PROBE_ROWS rows in one call (a batch). Keep the kernel whose larger slowdown against the
    quicker at each size is the smaller, and forget the other's weights (with timing off,
    common/machine.py: the first candidate, torch's kernel, untimed). One kernel serves both sizes: a
    kernel chosen by the batch's size would give a text other bits in another batch."""
    if not machine.timing():
        return candidates[0]
    # Inputs from a generator of its own: drawing from torch's global one would change the dropout
    # masks a training run draws next, depending on when (in which process) a shape is first met.
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(PROBE_ROWS, layers[0].in_features, dtype=dtype, generator=generator)  # (N, in)
    tile = TILE_SIZES[0]
    calls = {}
    for backend in candidates:
        weights = _prepare(layers, backend, dtype)
        calls[(backend, "tile")] = lambda b=backend, w=weights: on_tiles(b, x[:tile], w, gelu, keep_as, tile, 1)
        calls[(backend, "batch")] = lambda b=backend, w=weights: on_tiles(b, x, w, gelu, keep_as, tile, STACK_ROWS // tile)
    best = machine.best_times(calls)
    slowdown = {backend: max(best[(backend, size)] / min(best[(other, size)] for other in candidates)
                             for size in ("tile", "batch")) for backend in candidates}
    quickest = min(candidates, key=slowdown.get)
    for backend in candidates:
        if backend != quickest:
            _prepared[layers[0]].pop((tuple(map(id, layers)), backend, dtype))
    return quickest
