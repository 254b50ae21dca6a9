"""Which kernels give a row the same bits whatever else is in the product: why encoding/fast/tiled_linear.py gives
every kernel whole tiles, and checks on each machine that a stack of them keeps each tile's bits.

    python bench/batch_invariance.py              # 1 and 2 threads, float32 and (where native) bfloat16

For each of the encoder's four products (all-MiniLM-L6-v2's shapes), each kernel (torch's default,
`F.linear`; oneDNN's `_linear_pointwise`), each precision and thread count, it multiplies the first
n rows of a (2,048, in) matrix (--rows), for n = 1 .. 64 and every 7th and 16th count on to 2,048, and
prints the row counts whose rows differ, in any bit, from the same rows of the 2,048-row product, and which
of them are multiples of --tile-rows (default encoding/fast/tiled_linear.py's largest tile), and at how many places of
a tile of that many rows a row gets other bits than at the first place. For attention it compares each of
32 texts attended alone (at its own length) with the same text among 7 others of its length, and
padded to 256 tokens (masked). For GELU it counts the elements whose bits change when they are the
last few of a pass (torch's one-at-a-time loop after its vectors) rather than inside one. Weights and
inputs are random: which kernel a shape meets does not depend on the values.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from minisbert.common import cpu  # noqa: E402
from minisbert.encoding.fast.tiled_linear import TILE_SIZES  # noqa: E402

PRODUCTS = {"Q,K,V 384->1152": (384, 1152), "attention output 384->384": (384, 384),
            "feed-forward in 384->1536": (384, 1536), "feed-forward out 1536->384": (1536, 384)}
HEADS, HEAD_SIZE = 12, 32


def kernels(dtype):
    def torch_kernel(x, weight, bias):
        return F.linear(x, weight, bias)

    def onednn_kernel(x, weight, bias, packed={}):  # noqa: B006: the reordered weight, kept per weight
        key = (weight.data_ptr(), weight.dtype)
        if key not in packed:
            packed[key] = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        return torch.ops.mkldnn._linear_pointwise(x, packed[key], bias, "none", [], "")

    found = {"torch": torch_kernel}
    if torch.backends.mkldnn.is_available() and "avx2" in cpu.flags():
        found["onednn"] = onednn_kernel
    return found


def differing_row_counts(kernel, x, weight, bias, counts) -> list:
    """The row counts n for which kernel(x[:n]) differs from the first n rows of kernel(x)."""
    full = kernel(x, weight, bias)
    return [n for n in counts if not torch.equal(kernel(x[:n], weight, bias), full[:n])]


def differing_places(kernel, x, weight, bias, tile_rows: int) -> int:
    """Of the places 1 .. tile_rows - 1 of a tile, at how many a row gets other bits than at place 0
    (the tile's other rows the same each time)."""
    results = []
    for place in range(tile_rows):
        tile = x[:tile_rows].clone()  # (tile_rows, in)
        tile[place] = x[-1]
        results.append(kernel(tile, weight, bias)[place])
    return sum(not torch.equal(result, results[0]) for result in results[1:])


def summary(counts: list) -> str:
    if not counts:
        return "none"
    return f"{len(counts)}: {counts[:12]}{' ...' if len(counts) > 12 else ''} (largest {max(counts)})"


def attention_checks(dtype, generator) -> dict:
    """How many of 32 texts (lengths 1 to 250) get other bits among 7 others of their length, or
    padded among texts up to 256 tokens, than attended alone."""
    lengths = torch.randint(1, 251, (32,), generator=generator).tolist()
    grouped = padded = 0
    for length in lengths:
        qkv = torch.randn(8, HEADS, 3, length, HEAD_SIZE, generator=generator).to(dtype)
        q, k, v = qkv.unbind(2)  # (8, nh, L, hs) each
        alone = F.scaled_dot_product_attention(q[:1], k[:1], v[:1])  # (1, nh, L, hs)
        grouped += not torch.equal(F.scaled_dot_product_attention(q, k, v)[:1], alone)
        grid = torch.zeros(2, HEADS, 3, 256, HEAD_SIZE, dtype=dtype)
        grid[0, :, :, :length] = qkv[0]
        mask = torch.zeros(2, 1, 1, 256, dtype=dtype)
        mask[0, ..., length:] = torch.finfo(dtype).min
        out = F.scaled_dot_product_attention(*grid.unbind(2), attn_mask=mask)  # (2, nh, 256, hs)
        padded += not torch.equal(out[:1, :, :length], alone)
    return {"own length, among 7 others of it": grouped, "padded to 256 and masked": padded}


def elementwise_checks(dtype, generator) -> dict:
    """Of 512 elements, how many get other bits from F.gelu alone than among 4,096."""
    x = (3 * torch.randn(4096, generator=generator)).to(dtype)
    changed = {}
    for approximate in ("none", "tanh"):
        together = F.gelu(x, approximate=approximate)
        alone = torch.cat([F.gelu(x[i:i + 1].clone(), approximate=approximate) for i in range(512)])
        changed[f"GELU ({approximate})"] = int((alone != together[:512]).sum())
    return changed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tile-rows", type=int, default=TILE_SIZES[-1], help="the tile whose multiples and places are checked")
    parser.add_argument("--rows", type=int, default=2048, help="the rows of the largest product")
    args = parser.parse_args()
    dtypes = [torch.float32] + ([torch.bfloat16] if cpu.native_bfloat16() else [])
    row_counts = sorted(set(range(1, 65)) | set(range(64, args.rows + 1, 7)) | set(range(64, args.rows + 1, 16)))
    print(f"torch {torch.__version__}; flags {' '.join(sorted(cpu.flags() & {'avx2', 'avx512f', 'avx512_bf16', 'amx_bf16'}))}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for dtype in dtypes:
            generator = torch.Generator().manual_seed(0)
            for name, kernel in kernels(dtype).items():
                for product, (fan_in, fan_out) in PRODUCTS.items():
                    weight = (torch.randn(fan_out, fan_in, generator=generator) / fan_in**0.5).to(dtype)
                    bias = torch.randn(fan_out, generator=generator).to(dtype)
                    x = torch.randn(args.rows, fan_in, generator=generator).to(dtype)
                    every = differing_row_counts(kernel, x, weight, bias, row_counts)
                    tiled = [n for n in every if n % args.tile_rows == 0]
                    places = differing_places(kernel, x, weight, bias, args.tile_rows)
                    print(f"{threads} threads, {str(dtype)[6:]:8} {name:6} {product:27} rows that differ at "
                          f"n rows: {summary(every)}; at multiples of {args.tile_rows}: {summary(tiled)}; "
                          f"places in a tile that change a row: {places} of {args.tile_rows - 1}")
            print(f"{threads} threads, {str(dtype)[6:]:8} attention: texts whose bits change "
                  f"(of 32): {attention_checks(dtype, generator)}")
            print(f"{threads} threads, {str(dtype)[6:]:8} element-wise: elements whose bits change alone "
                  f"(of 512): {elementwise_checks(dtype, generator)}")


if __name__ == "__main__":
    main()
