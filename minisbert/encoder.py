"""The transformer encoder of BERT, DistilBERT and RoBERTa, written out by hand.

Devlin et al. (2019), "BERT", section 3, on Vaswani et al. (2017), "Attention Is All You Need",
section 3. One token sequence goes in; one vector per token comes out:

    x = LayerNorm(word[id] + position[pos] + token_type[type])        embeddings
    for each block:                                                    post-LN blocks
        x = LayerNorm(x + Attention(x))
        x = LayerNorm(x + W2 GELU(W1 x + b1) + b2)

    Attention(x) = concat_h softmax(Q_h K_h^T / sqrt(d_head) + mask) V_h   then W_O

The three families share this arithmetic; they differ in names of weights (weights.py), in how positions
are numbered (RoBERTa) and in whether a token-type table exists (DistilBERT has none), all read from
`EncoderConfig`.

Checked against Hugging Face `transformers` (BertModel, DistilBertModel, RobertaModel) to 1e-5 in
tests/test_encoder.py, on reference tensors made by tests/fixtures/make_fixtures.py.

Padding is never computed: the real tokens of a batch are packed into one (N, H) matrix and every
layer except attention works on that matrix token by token. Attention alone needs each sentence's
tokens side by side, so it puts its queries, keys and values back into the padded (B, T) grid and
its output back into the pack. (Short sentences padded to the batch's longest are typically a
third to a half padding.)

`fused=True` swaps the written-out LayerNorm, GELU and attention for PyTorch's fused kernels
(`F.layer_norm`, `F.gelu`, `F.scaled_dot_product_attention`), and computes Q, K and V with one
matrix product of the three weight matrices side by side: the same functions computed in fewer
passes over memory and with better use of the cores, which is what makes encoding fast. Tests check
both paths agree.

`reusing_memory()` (entered by `SentenceModel.encode`) lets the fused path, when it runs without
autograd on a CPU, write its widest products into memory kept from one call to the next instead of
asking the operating system for fresh memory each time.
"""

import contextlib
import contextvars
import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import EncoderConfig


def layer_norm(x, weight, bias, eps):
    """y = (x - mean) / sqrt(var + eps) * weight + bias, over the last dimension, var biased (/H)."""
    mean = x.mean(dim=-1, keepdim=True)
    variance = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(variance + eps) * weight + bias


def gelu(x):
    """Exact GELU: x * Phi(x), Phi the standard normal CDF written with erf (Hendrycks and Gimpel)."""
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    """The tanh approximation of GELU that Hugging Face calls `gelu_new`."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


class LayerNorm(nn.Module):
    def __init__(self, size: int, eps: float, fused: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))
        self.eps = eps
        self.fused = fused

    def forward(self, x):
        if self.fused:
            return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
        return layer_norm(x, self.weight, self.bias, self.eps)


def additive_attention_mask(attention_mask, dtype):
    """(B, T) of 1 = token, 0 = padding  ->  (B, 1, 1, T) of 0 = attend, dtype minimum = ignore.

    The most negative finite number rather than -inf: a row whose keys are all masked then gets a
    uniform softmax instead of NaN (REFERENCE.md section 4).
    """
    blocked = (attention_mask == 0)[:, None, None, :]  # (B, 1, 1, T)
    return torch.zeros(blocked.shape, dtype=dtype, device=attention_mask.device).masked_fill(
        blocked, torch.finfo(dtype).min
    )


def to_grid(packed, token_positions, batch_size, seq_len):
    """(N, H) real tokens -> (B, T, H) with zeros at padding; token_positions: (N,) flat indices
    into the B*T grid, as `Encoder.forward` packs them, or None when the batch has no padding."""
    if token_positions is None:
        return packed.view(batch_size, seq_len, -1)  # (B, T, H): nothing to place
    grid = packed.new_zeros(batch_size * seq_len, packed.shape[-1])  # (B*T, H)
    return grid.index_copy(0, token_positions, packed).view(batch_size, seq_len, -1)  # (B, T, H)


def from_grid(grid, token_positions):
    """(B, T, H) -> (N, H): the real tokens only (all of them when token_positions is None)."""
    flat = grid.reshape(-1, grid.shape[-1])  # (B*T, H)
    return flat if token_positions is None else flat[token_positions]


class Embeddings(nn.Module):
    """Token + position (+ token type) embeddings, then LayerNorm and dropout."""

    def __init__(self, config: EncoderConfig, fused: bool = False):
        super().__init__()
        self.config = config
        H = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, H)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, H)
        # DistilBERT has no token-type table; RoBERTa has one row that is still added.
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, H) if config.type_vocab_size > 0 else None
        )
        self.layer_norm = LayerNorm(H, config.layer_norm_eps, fused)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def position_ids(self, input_ids):
        """0, 1, 2, ... for BERT and DistilBERT. RoBERTa counts real tokens from pad_token_id + 1
        and gives every padding token the padding row, as fairseq did."""
        if self.config.family != "roberta":
            T = input_ids.shape[1]
            return torch.arange(T, device=input_ids.device).expand_as(input_ids)  # (B, T)
        is_token = (input_ids != self.config.pad_token_id).long()  # (B, T)
        return torch.cumsum(is_token, dim=1) * is_token + self.config.pad_token_id  # (B, T)

    def forward(self, input_ids, token_type_ids=None):
        x = self.word_embeddings(input_ids)  # (B, T, H)
        x = x + self.position_embeddings(self.position_ids(input_ids))
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.layer_norm(x))  # (B, T, H)


# The memory kept by `reusing_memory()`: a dict from (name, dtype) to a flat tensor, or None
# outside it. A context variable, so each thread (and each asyncio task) has its own.
_scratch = contextvars.ContextVar("minisbert_scratch", default=None)


@contextlib.contextmanager
def reusing_memory():
    """Within this block, the fused path without autograd on a CPU writes its two widest products
    (Q, K and V side by side, and the feed-forward's activations) into memory kept from one call
    to the next, grown when needed and freed on leaving.

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


def linear_reusing_memory(x, weight, bias, name: str):
    """F.linear(x, weight, bias) for (N, in) x, written into the memory `reusing_memory()` keeps
    under `name` when it applies (see there), else into a fresh tensor."""
    scratch = _scratch.get()
    if (scratch is None or x.device.type != "cpu" or x.ndim != 2 or torch.is_grad_enabled()
            or torch.is_autocast_enabled("cpu")):
        return F.linear(x, weight, bias)
    rows, width = x.shape[0], weight.shape[0]
    memory = scratch.get((name, x.dtype))
    if memory is None or memory.numel() < rows * width:
        memory = scratch[(name, x.dtype)] = torch.empty(rows * width, dtype=x.dtype)
    return torch.addmm(bias, x, weight.T, out=memory[: rows * width].view(rows, width))  # (N, out)


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention with its output projection."""

    def __init__(self, config: EncoderConfig, fused: bool = False):
        super().__init__()
        H = config.hidden_size
        self.num_heads = config.num_heads
        self.head_size = config.head_size
        self.query = nn.Linear(H, H)
        self.key = nn.Linear(H, H)
        self.value = nn.Linear(H, H)
        self.output = nn.Linear(H, H)
        self.attention_dropout = config.attention_dropout
        self.fused = fused

    def forward(self, x, additive_mask, token_positions):
        """x: (N, H) packed real tokens; additive_mask: (B, 1, 1, T); token_positions: (N,) or None."""
        B, T, H = additive_mask.shape[0], additive_mask.shape[-1], x.shape[-1]
        nh, hs = self.num_heads, self.head_size

        def heads(projected):  # (N, H) -> (B, nh, T, hs) on the padded grid
            return to_grid(projected, token_positions, B, T).view(B, T, nh, hs).transpose(1, 2)

        if self.fused:  # one (N, H) x (H, 3H) product instead of three narrow ones: it keeps the cores busier
            weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])  # (3H, H)
            bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])  # (3H,)
            q, k, v = linear_reusing_memory(x, weight, bias, "qkv").split(H, dim=-1)  # 3 x (N, H)
        else:
            q, k, v = self.query(x), self.key(x), self.value(x)  # 3 x (N, H)
        q, k, v = heads(q), heads(k), heads(v)  # (B, nh, T, hs)
        dropout = self.attention_dropout if self.training else 0.0
        if self.fused:
            # Without padding the mask is all zeros; leaving it out spares the kernel adding it.
            mask = None if token_positions is None else additive_mask
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                     dropout_p=dropout)  # (B, nh, T, hs)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(hs)  # (B, nh, T, T)
            scores = scores + additive_mask  # padding keys get the dtype minimum
            probs = torch.softmax(scores, dim=-1)  # (B, nh, T, T), each row sums to 1
            probs = F.dropout(probs, p=dropout)
            context = probs @ v  # (B, nh, T, hs)
        context = from_grid(context.transpose(1, 2).reshape(B, T, H), token_positions)  # (N, H), heads side by side
        return self.output(context)  # (N, H)


class FeedForward(nn.Module):
    """Position-wise W2 act(W1 x + b1) + b2, widening H to intermediate_size and back."""

    def __init__(self, config: EncoderConfig, fused: bool = False):
        super().__init__()
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.activation = config.activation
        self.fused = fused

    def forward(self, x):
        """x: (N, H) -> (N, H)."""
        if not self.fused:
            h = self.intermediate(x)  # (N, I)
            return self.output(gelu(h) if self.activation == "gelu" else gelu_tanh(h))  # (N, H)
        h = linear_reusing_memory(x, self.intermediate.weight, self.intermediate.bias,
                                  "feed-forward")  # (N, I)
        approximate = "none" if self.activation == "gelu" else "tanh"
        if torch.is_grad_enabled():
            h = F.gelu(h, approximate=approximate)
        else:  # nothing needs the product any more: overwrite it
            h = torch.ops.aten.gelu_(h, approximate=approximate)
        return self.output(h)  # (N, H)


class Block(nn.Module):
    """One post-LN transformer block: the residual sum is normalised after each sublayer."""

    def __init__(self, config: EncoderConfig, fused: bool = False):
        super().__init__()
        self.attention = SelfAttention(config, fused)
        self.attention_norm = LayerNorm(config.hidden_size, config.layer_norm_eps, fused)
        self.ffn = FeedForward(config, fused)
        self.output_norm = LayerNorm(config.hidden_size, config.layer_norm_eps, fused)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, x, additive_mask, token_positions):
        x = self.attention_norm(x + self.dropout(self.attention(x, additive_mask, token_positions)))  # (N, H)
        return self.output_norm(x + self.dropout(self.ffn(x)))  # (N, H)


class Encoder(nn.Module):
    """Token ids in, one contextual vector per token out (Hugging Face's `last_hidden_state`)."""

    def __init__(self, config: EncoderConfig, fused: bool = False):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config, fused)
        self.layers = nn.ModuleList(Block(config, fused) for _ in range(config.num_layers))

    def set_fused(self, fused: bool):
        """Switch every LayerNorm, GELU and attention between written-out and fused kernels."""
        for module in self.modules():
            if hasattr(module, "fused"):
                module.fused = fused

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        """(B, T) ids and mask -> (B, T, H); padding positions come out as zeros."""
        B, T = input_ids.shape
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
        additive_mask = additive_attention_mask(attention_mask, x.dtype)  # (B, 1, 1, T)
        # (N,) positions of the real tokens in the B*T grid; None when there is no padding to skip.
        token_positions = None if bool(attention_mask.all()) else attention_mask.flatten().nonzero().squeeze(1)
        x = from_grid(x, token_positions)  # (N, H)
        for block in self.layers:
            x = block(x, additive_mask, token_positions)
        return to_grid(x, token_positions, B, T)  # (B, T, H)
