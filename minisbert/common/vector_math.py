"""Torch's elementwise float32 functions on a CPU (tanh, erf, exp, log, sqrt, ...), settled before a
process first runs one on more than one thread.

torch builds for x86 with Intel MKL compute these through MKL's vector math library: a call over more
than 2,048 values is cut into pieces, one a thread, and each piece is one call of MKL's function. The
first such call in a process can give one piece other last bits than every later call gives the same
values (seen on one CPU kind: bench/README.md names it and has the counts), as if
MKL chose its code for that piece while it was still choosing; a later call never differs. So one call
of one value, on this thread alone, is made when minisbert is imported (minisbert/__init__.py): the
first call that splits across threads comes after it, and every call gives a value the same bits in
every process.
tests/common/test_vector_math.py checks it in fresh processes.
"""

import torch


def settle() -> None:
    """One value through MKL's vector math, on the calling thread alone (one value is never split
    across threads), so that no later call is a process's first."""
    torch.tanh(torch.ones(1))
