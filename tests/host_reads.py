"""A spy on reads from a device to the host, for tests that count them.

A GPU runs what the host queues, ahead of it; each time the host needs a value computed there
(`.item()`, `if tensor:`, a mask's True entries), it stops and waits. Code meant to run on a GPU
keeps such reads out of its loops: tests/training/test_training.py counts them
with `HostReads`, on the CPU, where the same calls are made.
"""

import torch
from torch.overrides import TorchFunctionMode, resolve_name

# Tensor methods and torch functions that read a tensor's values on the host, or whose result's
# size depends on its values (so that the host must read it before queueing what follows).
# Moves to the CPU are not listed: on the CPU, where these tests run, they move nothing (a CUDA test
# of the training loop would catch them).
HOST_READS = {
    "item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "nonzero",
    "argwhere", "unique", "unique_consecutive", "masked_select", "repeat_interleave", "equal",
    "allclose",
}


class HostReads(TorchFunctionMode):
    """Records the name of every torch call in HOST_READS, and of every indexing with a boolean
    mask (which must count the mask's True entries on the host)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = (resolve_name(func) or getattr(func, "__name__", "")).rsplit(".", 1)[-1]
        indexing = name in ("__getitem__", "__setitem__", "index_put_", "index_put")
        if name in HOST_READS or (indexing and _holds_a_mask(args[1:])):
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def _holds_a_mask(value):
    if isinstance(value, torch.Tensor):
        return value.dtype == torch.bool
    if isinstance(value, (list, tuple)):
        return any(_holds_a_mask(item) for item in value)
    return False
