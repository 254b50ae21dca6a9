"""The fast path that `minisbert.load(..., fast=True)` plugs into a SentenceModel: the fast encoder,
the Dense layer on whole tiles, and encode()'s batches cut to a token budget.

SentenceModel (encoding/model.py) is the plain network and never imports this. It runs whatever fast path it
was given (`FAST_PATH` here) in three places: the encoder's forward pass (encoding/fast/tiled_encoder.py), the Dense
layer after pooling, and the batches encode() runs. Unplugged, it runs the plain encoder on one text
at a time.

Batches: `SentenceModel.encode` sorts texts longest first and runs them batch by batch, at most
`batch_size` texts each. On a CPU the fast way also stops a batch at CPU_TOKENS_PER_FORWARD tokens
(padding included), so that each layer's activations stay in the processor's cache instead of
streaming through main memory (bench/README.md, "Encoding", has the budgets measured). Memory is
reused from one batch to the next (encoding/fast/tiled_linear.py's `reusing_memory`).

What is promised: on a CPU, a text's embedding has the same bits whatever batch it is encoded in:
any batch_size, order, token budget or company of other texts, and one string or a list of them, in
float32 and in bfloat16 where the CPU multiplies it natively. Texts in a batch never interact in the
mathematics, and here, by construction, not in the arithmetic either: a kernel may choose how to
compute by the shape it is given, so none is ever given a shape that the batch decides. Every
product gets its rows as a stack of whole tiles, where this machine's kernel gives each tile of such
a stack the bits it gives the tile alone (checked once per machine, bit for bit), else a tile a call
(encoding/fast/tiled_linear.py); attention gets texts of one length, a fixed number of
them a call for each length (encoding/fast/tiled_encoder.py); the Dense layer's product is one of the products.
Mean pooling sums a text's tokens and then its padding's zeros, which change no bit.
tests/encoding/test_batch_invariance.py watches those calls and checks the bits with every kernel this CPU
runs, and that two processes, one of them on a loaded machine, give the same bits (the products'
kernel is a fact kept per machine, common/machine.py). The fast path's embeddings agree with the plain path's to float32 rounding, not to
the bit: tests/encoding/test_encoder_fast.py.
"""

import torch

from . import tiled_encoder as fast_encoder
from . import tiled_linear

CPU_TOKENS_PER_FORWARD = 2048


class FastPath:
    """What a SentenceModel runs in place of its plain steps when this path is plugged into it."""

    def describe(self, model) -> str:
        """This path on `model`, as print(model) shows it: the kernel each of its products runs here."""
        config, dense = model.encoder.config, model.dense
        hidden, inner = config.hidden_size, config.intermediate_size
        products = [(hidden, 3 * hidden), (hidden, hidden), (hidden, inner), (inner, hidden)]
        if dense is not None:
            products.append((dense.linear.in_features, dense.linear.out_features))
        return f"fast, products on whole tiles by this machine's kernels ({tiled_linear.kernels_known(products)})"

    def encoder(self, encoder, input_ids, attention_mask, token_type_ids=None):
        """The plain `Encoder`'s forward pass, computed fast: (B, T) ids and mask -> (B, T, H)."""
        return fast_encoder.forward(encoder, input_ids, attention_mask, token_type_ids)  # (B, T, H)

    def dense(self, dense, embeddings):
        """The Dense layer on pooled embeddings (B, H) -> (B, D): without autograd on a CPU, its product
        on whole tiles as the encoder's are (encoding/fast/tiled_linear.py), and its activation on those whole tiles,
        so that an element-wise pass never ends a row in its scalar tail whatever B is."""
        if torch.is_grad_enabled() or embeddings.device.type != "cpu":
            return dense(embeddings)  # (B, D)
        tile = tiled_linear.tile_rows([([dense.linear], None)], tiled_linear.computing_dtype(embeddings))
        tiles = tiled_linear.linear(tiled_linear.whole_tiles(embeddings, tile), [dense.linear], tile=tile)  # (B', D)
        return dense.activation(tiles)[: embeddings.shape[0]]  # (B, D)

    def batching(self, longest_first: list, id_lists: list, batch_size: int, device) -> tuple:
        """encode()'s batches: (the batches' row lists, a context reusing memory between them)."""
        return batches(longest_first, id_lists, batch_size, device), tiled_linear.reusing_memory()


FAST_PATH = FastPath()


def batches(longest_first: list, id_lists: list, batch_size: int, device):
    """Lists of indices into `id_lists`, in the order of `longest_first` (sorted by decreasing
    length): at most batch_size texts each and, on a CPU, at most CPU_TOKENS_PER_FORWARD tokens."""
    start = 0
    while start < len(longest_first):
        longest = len(id_lists[longest_first[start]])  # the batch pads to its first text's length
        rows = batch_size if device.type != "cpu" else max(1, min(batch_size, CPU_TOKENS_PER_FORWARD // longest))
        yield longest_first[start:start + rows]
        start += rows
