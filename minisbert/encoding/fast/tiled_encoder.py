"""The encoder of minisbert/encoding/encoder.py, computed fast: same function, same parameters.

`forward(encoder, input_ids, attention_mask)` takes the plain `Encoder` module and runs its forward
pass the fast way, reading the same parameters (so state dicts, checkpoints and optimizers do not
change) and the same dropout modules; it works with autograd, so training uses it too. Where the
time goes, and what is done about it:

- Padding is never computed. Short sentences padded to the batch's longest are typically a third to
  a half padding, so the real tokens of a batch are packed into one (N, H) matrix and every layer
  except attention works on that matrix token by token. Attention alone needs each sentence's tokens
  side by side: texts of one length are gathered from the pack into a (texts, heads, length, head
  size) stack, attended with no mask, and written back into the pack.
- PyTorch's fused kernels replace the written-out formulas: `F.layer_norm`, `F.gelu` and
  `F.scaled_dot_product_attention` compute the same functions in fewer passes over memory.
- Q, K and V come from one (N, H) x (H, 3H) product of the three weight matrices side by side,
  which keeps the cores busier than three narrow products.
- Every matrix product goes through `linear` (encoding/fast/tiled_linear.py), the one place that decides how
  products are computed: without autograd on a CPU, on the quicker of torch's default kernel and
  oneDNN's (measured on this machine), with GELU applied in place or fused into the product, and
  the two widest products written into memory reused from one call to the next (`reusing_memory`).
A text's tokens are computed the same way whatever else is in the batch, by construction: each call
to a kernel that may choose its method by the shape it is given gets a shape that the text alone
decides. Products get whole tiles of rows (encoding/fast/tiled_linear.py; without autograd the pack is padded
here, once, with zero rows to whole tiles). Attention gets a text at its own length: padded to a
longer text's length it would get other bits (the kernel blocks its sums by position). And it gets
it alone or among a fixed number of texts of its length (`attention_calls`), never among as many as
the batch happens to hold: PyTorch's CPU flash attention, for one, decides whether to repack keys
and values for AMX by the number of texts. Sharing a call is done only at lengths where this
machine's kernel was checked to give a text the same bits there as alone (`shares_a_call`; on a
GPU, where nothing is promised bit for bit, texts share calls unchecked). Every other step (the
embeddings' sums, layer norms, residual sums) computes each row alone. So encode() gives a text the
same embedding in any batch on a CPU: tests/encoding/test_batch_invariance.py.

Checked equal to the plain encoder (embeddings to 1e-6, training gradients too) in
tests/encoding/test_encoder_fast.py, and against Hugging Face transformers in tests/encoding/test_encoder.py.
"""

import itertools

import torch
import torch.nn.functional as F

from ..encoder_inputs import additive_attention_mask, position_ids
from ...common import machine
from .tiled_linear import computing_dtype, linear, tile_rows, whole_tiles

GELU_APPROXIMATION = {"gelu": "none", "gelu_new": "tanh"}  # EncoderConfig.activation -> F.gelu's name
# Texts of one length that share an attention call where this machine's kernel gives each of them
# the bits it gives the text alone (`shares_a_call`); the rest go one a call. Sharing a call saved 8%
# of encoding SciFact documents, most of which are cut to the same 256 tokens (bench/README.md, "Encoding").
ATTENTION_TEXTS = 8


def to_grid(packed, token_positions, batch_size, seq_len):
    """(N, H) real tokens -> (B, T, H) with zeros at padding; token_positions: (N,) flat indices
    into the B*T grid, or None when the batch has no padding."""
    if token_positions is None:
        return packed.view(batch_size, seq_len, -1)  # (B, T, H): nothing to place
    grid = packed.new_zeros(batch_size * seq_len, packed.shape[-1])  # (B*T, H)
    return grid.index_copy(0, token_positions, packed).view(batch_size, seq_len, -1)  # (B, T, H)


def from_grid(grid, token_positions):
    """(B, T, ...) -> (N, ...): the real tokens only (all of them when token_positions is None)."""
    flat = grid.flatten(0, 1)  # (B*T, ...)
    return flat if token_positions is None else flat[token_positions]


def layer_norm(x, norm):
    return F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps)


def embed(embeddings, input_ids, token_type_ids, token_positions):
    """The plain `Embeddings` module's output for the real tokens only: (N, H)."""
    ids = from_grid(input_ids, token_positions)  # (N,)
    positions = from_grid(position_ids(input_ids, embeddings.config), token_positions)  # (N,)
    x = F.embedding(ids, embeddings.word_embeddings.weight)  # (N, H)
    x = x + F.embedding(positions, embeddings.position_embeddings.weight)
    if embeddings.token_type_embeddings is not None:
        table = embeddings.token_type_embeddings.weight  # (types, H)
        x = x + (table[0] if token_type_ids is None else F.embedding(from_grid(token_type_ids, token_positions), table))
    return embeddings.dropout(layer_norm(x, embeddings.layer_norm))  # (N, H)


def text_rows(attention_mask) -> list:
    """Where each text's tokens are in the pack, which holds the real tokens of each text in turn:
    (its first row, its length) for each text that has tokens."""
    lengths = attention_mask.sum(dim=1).tolist()  # (B,)
    starts = [0] + list(itertools.accumulate(lengths))[:-1]
    return [(start, length) for start, length in zip(starts, lengths) if length > 0]


def attention_calls(texts, shares_a_call) -> list:
    """The calls attention makes: (length, first rows of the texts in it). Texts of one length go
    ATTENTION_TEXTS to a call where `shares_a_call(length)`, and the texts left over one a call. So a
    text meets one of two calls, (ATTENTION_TEXTS or 1, heads, length, head size), and gets the same
    bits in either (`shares_a_call` says so, checked for this machine), whatever the batch."""
    by_length = {}
    for start, length in texts:
        by_length.setdefault(length, []).append(start)
    calls = []
    for length, starts in by_length.items():
        shared = len(starts) // ATTENTION_TEXTS * ATTENTION_TEXTS if len(starts) >= ATTENTION_TEXTS else 0
        if shared and not shares_a_call(length):
            shared = 0
        calls += [(length, starts[i:i + ATTENTION_TEXTS]) for i in range(0, shared, ATTENTION_TEXTS)]
        calls += [(length, [start]) for start in starts[shared:]]
    return calls


def shares_a_call(length: int, num_heads: int, head_size: int, dtype) -> bool:
    """Whether `F.scaled_dot_product_attention` gives each of ATTENTION_TEXTS texts of `length` tokens in
    one call the bits it gives the text alone, on this machine (a fact kept per machine: common/machine.py),
    checked on inputs laid out as `attention` lays them out, drawn from a generator of their own. A
    kernel may choose its method by the number of texts (PyTorch's CPU flash attention decides whether to
    repack keys and values for AMX by it), so this is not assumed."""
    name = (f"attention keeps a text's bits among {ATTENTION_TEXTS} of its length, {length} tokens, "
            f"{num_heads} heads of {head_size}, {str(dtype).removeprefix('torch.')}")

    def check() -> bool:
        generator = torch.Generator().manual_seed(length)
        qkv = torch.randn(ATTENTION_TEXTS * length, 3 * num_heads * head_size, generator=generator).to(dtype)
        q, k, v = qkv.view(ATTENTION_TEXTS, length, 3, num_heads, head_size).permute(2, 0, 3, 1, 4)
        together = F.scaled_dot_product_attention(q, k, v)  # (G, nh, L, hs)
        for text in range(ATTENTION_TEXTS):
            rows = qkv[text * length:(text + 1) * length]  # (L, 3H): a text alone, as `attention` gives it
            q, k, v = rows.view(1, length, 3, num_heads, head_size).permute(2, 0, 3, 1, 4)
            if not torch.equal(F.scaled_dot_product_attention(q, k, v)[0], together[text]):
                return False
        return True

    return machine.fact(name, check, kind=bool)


def attention(module, x, texts, attention_mask, token_positions, tile):
    """The plain `SelfAttention` module's output for packed tokens: (N, H) -> (N, H).
    texts: `text_rows`'s; the context of rows in none of them (tile padding) is zeros."""
    H, nh, hs = x.shape[-1], module.num_heads, module.head_size
    qkv = linear(x, [module.query, module.key, module.value], keep_as="qkv", tile=tile)  # (N, 3H)
    dropout = module.attention_dropout.p if module.attention_dropout.training else 0.0
    if dropout:  # training: the padded (B, T) grid, so that dropout draws its masks as the plain encoder does
        return padded_attention(module, qkv, attention_mask, token_positions, dropout)
    context = qkv.new_zeros(x.shape[0], H)  # (N, H)
    def shared(length: int) -> bool:
        return qkv.device.type != "cpu" or shares_a_call(length, nh, hs, qkv.dtype)

    for length, starts in attention_calls(texts, shared):
        first, count = starts[0], len(starts)
        if starts == list(range(first, first + count * length, length)):
            rows = slice(first, first + count * length)  # side by side in the pack (encode sorts by length)
            group = qkv[rows]  # (n L, 3H): a view
        else:
            rows = torch.cat([torch.arange(start, start + length) for start in starts])  # (n L,)
            group = qkv[rows]  # (n L, 3H): gathered
        q, k, v = group.view(count, length, 3, nh, hs).permute(2, 0, 3, 1, 4)  # 3 x (n, nh, L, hs): views
        out = F.scaled_dot_product_attention(q, k, v)  # (n, nh, L, hs)
        context[rows] = out.transpose(1, 2).reshape(count * length, H)  # (n L, H)
    return linear(context, [module.output], tile=tile)  # (N, H)


def padded_attention(module, qkv, attention_mask, token_positions, dropout: float):
    """Attention with dropout over the padded grid, its queries, keys and values put back in (B, T)."""
    (B, T), H = attention_mask.shape, qkv.shape[-1] // 3
    tokens = B * T if token_positions is None else token_positions.numel()  # rows past them: tile padding
    grid = to_grid(qkv[:tokens], token_positions, B, T).view(B, T, 3, module.num_heads, module.head_size)
    q, k, v = (grid[:, :, i].transpose(1, 2) for i in range(3))  # 3 x (B, nh, T, hs)
    mask = None if token_positions is None else additive_attention_mask(attention_mask, qkv.dtype)  # (B, 1, 1, T)
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)  # (B, nh, T, hs)
    context = from_grid(context.transpose(1, 2).reshape(B, T, H), token_positions)  # (N, H)
    context = torch.cat([context, context.new_zeros(qkv.shape[0] - tokens, H)])  # (N', H)
    return linear(context, [module.output])  # (N', H)


def feed_forward(module, x, activation: str, tile):
    """The plain `FeedForward` module's output for packed tokens: (N, H) -> (N, H)."""
    h = linear(x, [module.intermediate], gelu=GELU_APPROXIMATION[activation], keep_as="feed-forward", tile=tile)  # (N, I)
    return linear(h, [module.output], tile=tile)  # (N, H)


def products(block, activation: str) -> list:
    """(layers, gelu) of the four products of a block, as `linear` gets them."""
    attention, ffn = block.attention, block.ffn
    return [([attention.query, attention.key, attention.value], None), ([attention.output], None),
            ([ffn.intermediate], GELU_APPROXIMATION[activation]), ([ffn.output], None)]


def forward(encoder, input_ids, attention_mask, token_type_ids=None):
    """The plain `Encoder`'s forward pass: (B, T) ids and mask -> (B, T, H), zeros at padding."""
    B, T = input_ids.shape
    # (N,) positions of the real tokens in the B*T grid; None when there is no padding to skip.
    token_positions = None if bool(attention_mask.all()) else attention_mask.flatten().nonzero().squeeze(1)
    x = embed(encoder.embeddings, input_ids, token_type_ids, token_positions)  # (N, H)
    tokens, tile = x.shape[0], None
    if not torch.is_grad_enabled() and x.device.type == "cpu":
        # Every block's products have the first one's shapes, and the machine's facts are by shape.
        tile = tile_rows(products(encoder.layers[0], encoder.config.activation), computing_dtype(x))
        x = whole_tiles(x, tile)  # (N', H): padded once here, so that no product pads (encoding/fast/tiled_linear.py)
    texts = text_rows(attention_mask)
    for block in encoder.layers:
        h = attention(block.attention, x, texts, attention_mask, token_positions, tile)  # (N', H)
        x = layer_norm(x + block.dropout(h), block.attention_norm)
        h = feed_forward(block.ffn, x, encoder.config.activation, tile)  # (N', H)
        x = layer_norm(x + block.dropout(h), block.output_norm)
    return to_grid(x[:tokens], token_positions, B, T)  # (B, T, H)
