"""The encoder of minisbert/encoder.py, computed fast: same function, same parameters.

`forward(encoder, input_ids, attention_mask)` takes the plain `Encoder` module and runs its forward
pass the fast way, reading the same parameters (so state dicts, checkpoints and optimizers do not
change) and the same dropout modules; it works with autograd, so training uses it too. Where the
time goes, and what is done about it:

- Padding is never computed. Short sentences padded to the batch's longest are typically a third to
  a half padding, so the real tokens of a batch are packed into one (N, H) matrix and every layer
  except attention works on that matrix token by token. Attention alone needs each sentence's tokens
  side by side: it puts its queries, keys and values back into the padded (B, T) grid, and its
  output back into the pack.
- PyTorch's fused kernels replace the written-out formulas: `F.layer_norm`, `F.gelu` and
  `F.scaled_dot_product_attention` compute the same functions in fewer passes over memory.
- Q, K and V come from one (N, H) x (H, 3H) product of the three weight matrices side by side,
  which keeps the cores busier than three narrow products.
- Without autograd on a CPU, `reusing_memory()` keeps the two widest products in memory reused from
  one call to the next, and GELU overwrites its input instead of allocating its output.

Every matrix product goes through `linear`, the one place to change how products are computed.
Checked equal to the plain encoder (embeddings to 1e-6, training gradients too) in
tests/test_encoder_fast.py, and against Hugging Face transformers in tests/test_encoder.py.
"""

import contextlib
import contextvars

import torch
import torch.nn.functional as F

from ..encoder_inputs import additive_attention_mask, position_ids

GELU_APPROXIMATION = {"gelu": "none", "gelu_new": "tanh"}  # EncoderConfig.activation -> F.gelu's name

# The memory kept by `reusing_memory()`: a dict from (name, dtype) to a flat tensor, or None
# outside it. A context variable, so each thread (and each asyncio task) has its own.
_scratch = contextvars.ContextVar("minisbert_scratch", default=None)


@contextlib.contextmanager
def reusing_memory():
    """Within this block, products `linear` is asked to keep (Q, K and V side by side, and the
    feed-forward's activations) are written, when there is no autograd and the tensors are on a
    CPU, into memory kept from one call to the next, grown when needed and freed on leaving.

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


def linear(x, weight, bias, keep_as: str = None):
    """x W^T + b for (N, in) x -> (N, out). With `keep_as`, written into the memory
    `reusing_memory()` keeps under that name when it applies (see there)."""
    scratch = _scratch.get()
    if (keep_as is None or scratch is None or x.device.type != "cpu" or torch.is_grad_enabled()
            or torch.is_autocast_enabled("cpu")):
        return F.linear(x, weight, bias)  # (N, out)
    rows, width = x.shape[0], weight.shape[0]
    memory = scratch.get((keep_as, x.dtype))
    if memory is None or memory.numel() < rows * width:
        memory = scratch[(keep_as, x.dtype)] = torch.empty(rows * width, dtype=x.dtype)
    return torch.addmm(bias, x, weight.T, out=memory[: rows * width].view(rows, width))  # (N, out)


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


def attention(module, x, additive_mask, token_positions):
    """The plain `SelfAttention` module's output for packed tokens: (N, H) -> (N, H)."""
    B, T, H = additive_mask.shape[0], additive_mask.shape[-1], x.shape[-1]
    nh, hs = module.num_heads, module.head_size
    weight = torch.cat([module.query.weight, module.key.weight, module.value.weight])  # (3H, H)
    bias = torch.cat([module.query.bias, module.key.bias, module.value.bias])  # (3H,)
    q, k, v = linear(x, weight, bias, keep_as="qkv").split(H, dim=-1)  # 3 x (N, H)

    def heads(projected):  # (N, H) -> (B, nh, T, hs) on the padded grid
        return to_grid(projected, token_positions, B, T).view(B, T, nh, hs).transpose(1, 2)

    dropout = module.attention_dropout.p if module.attention_dropout.training else 0.0
    # Without padding the mask is all zeros; leaving it out spares the kernel adding it.
    mask = None if token_positions is None else additive_mask
    context = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=mask,
                                             dropout_p=dropout)  # (B, nh, T, hs)
    context = from_grid(context.transpose(1, 2).reshape(B, T, H), token_positions)  # (N, H)
    return linear(context, module.output.weight, module.output.bias)  # (N, H)


def feed_forward(module, x, activation: str):
    """The plain `FeedForward` module's output for packed tokens: (N, H) -> (N, H)."""
    h = linear(x, module.intermediate.weight, module.intermediate.bias, keep_as="feed-forward")  # (N, I)
    if torch.is_grad_enabled():
        h = F.gelu(h, approximate=GELU_APPROXIMATION[activation])
    else:  # nothing needs the product any more: overwrite it
        h = torch.ops.aten.gelu_(h, approximate=GELU_APPROXIMATION[activation])
    return linear(h, module.output.weight, module.output.bias)  # (N, H)


def forward(encoder, input_ids, attention_mask, token_type_ids=None):
    """The plain `Encoder`'s forward pass: (B, T) ids and mask -> (B, T, H), zeros at padding."""
    B, T = input_ids.shape
    # (N,) positions of the real tokens in the B*T grid; None when there is no padding to skip.
    token_positions = None if bool(attention_mask.all()) else attention_mask.flatten().nonzero().squeeze(1)
    x = embed(encoder.embeddings, input_ids, token_type_ids, token_positions)  # (N, H)
    additive_mask = additive_attention_mask(attention_mask, x.dtype)  # (B, 1, 1, T)
    for block in encoder.layers:
        h = attention(block.attention, x, additive_mask, token_positions)  # (N, H)
        x = layer_norm(x + block.dropout(h), block.attention_norm)
        h = feed_forward(block.ffn, x, encoder.config.activation)  # (N, H)
        x = layer_norm(x + block.dropout(h), block.output_norm)
    return to_grid(x, token_positions, B, T)  # (B, T, H)
