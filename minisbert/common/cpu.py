"""What this processor can do: its instruction-set flags, and whether it multiplies bfloat16 natively.

bfloat16 halves the memory a matrix product reads and, on a CPU with bfloat16 dot-product
instructions (AVX512-BF16's `vdpbf16ps`, or Intel AMX tiles), doubles or better the products' speed.
On a CPU without them torch still computes in bfloat16, by converting to float32 and back in
software, which is slower than float32 itself; so minisbert offers bfloat16 on a CPU only where the
flags say the hardware has it. Flags are read from Linux's /proc/cpuinfo; elsewhere none are known
and bfloat16 is offered on GPUs only.

The size of its largest cache tells a timing probe how many rows it must read to measure a product
whose rows come from memory, as a search's do (`last_level_cache_bytes`, from Linux's sysfs).

Used by encode(), evaluate.py and train.py (common/precision.py: `autocast_dtype`), by the fast products
(encoding/fast/tiled_linear.py) and by the benchmarks' machine description; tests/encoding/test_bfloat16.py checks what is
refused where.
"""

import functools
from pathlib import Path


@functools.cache
def flags() -> frozenset:
    """The instruction-set flags of the first processor in /proc/cpuinfo (empty if unreadable)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX-BF16)."""
    return bool({"avx512_bf16", "amx_bf16"} & flags())


@functools.cache
def last_level_cache_bytes() -> int:
    """The size of the first processor's largest cache in bytes, from /sys/devices/system/cpu (0 if unreadable)."""
    largest = 0
    for size_file in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = size_file.read_text().strip()
        except OSError:
            continue
        multiple = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            largest = max(largest, int(digits) * multiple)
    return largest
