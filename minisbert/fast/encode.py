"""How the fast `encode()` cuts texts into batches: on a CPU, by a token budget.

`SentenceModel.encode` sorts texts longest first and runs them batch by batch. The plain way takes
`batch_size` texts at a time. The fast way, on a CPU, also stops a batch at CPU_TOKENS_PER_FORWARD
tokens (padding included), so that each layer's activations stay in the processor's cache instead
of streaming through main memory. On 2 cores, 4 forward passes of 8 x 256 tokens ran about 20%
faster than one of 32 x 256 on one EPYC, and 7% faster on a Zen 3 EPYC, where budgets of 1,024 and
4,096 tokens were within 5% of 2,048. Every text's embedding is the same either way, since texts in
a batch never interact (tests/test_encoder_fast.py checks both ways give the same embeddings).
Memory is reused from one batch to the next (fast/linear.py's `reusing_memory`).
"""

from . import linear

CPU_TOKENS_PER_FORWARD = 2048


def batching(longest_first: list, id_lists: list, batch_size: int, device) -> tuple:
    """The fast way to run encode()'s batches: (the batches' row lists, a context reusing memory
    between them)."""
    return batches(longest_first, id_lists, batch_size, device), linear.reusing_memory()


def batches(longest_first: list, id_lists: list, batch_size: int, device):
    """Lists of indices into `id_lists`, in the order of `longest_first` (sorted by decreasing
    length): at most batch_size texts each and, on a CPU, at most CPU_TOKENS_PER_FORWARD tokens."""
    start = 0
    while start < len(longest_first):
        longest = len(id_lists[longest_first[start]])  # the batch pads to its first text's length
        rows = batch_size if device.type != "cpu" else max(1, min(batch_size, CPU_TOKENS_PER_FORWARD // longest))
        yield longest_first[start:start + rows]
        start += rows
