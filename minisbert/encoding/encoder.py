"""The transformer encoder of BERT, DistilBERT and RoBERTa, written out as the papers describe it.

Devlin et al. (2019), "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding", section 3, on Vaswani et al. (2017), "Attention Is All You Need", section 3. A batch
of token sequences, padded to the same length T, goes in; one vector per token comes out:

    x = LayerNorm(word[id] + position[pos] + token_type[type])        embeddings (BERT fig. 2)
    for each block:                                                    post-LN blocks (Vaswani 3.1)
        x = LayerNorm(x + Attention(x))
        x = LayerNorm(x + W2 GELU(W1 x + b1) + b2)                     feed-forward (Vaswani 3.3)

    Attention(x) = concat_h softmax(Q_h K_h^T / sqrt(d_head) + mask) V_h   then W_O   (Vaswani 3.2)

The three families share this arithmetic; they differ in the names of their weights (encoding/weights.py),
in how positions are numbered and in whether a token-type table exists (DistilBERT has none), all
read from `EncoderConfig`.

Checked against Hugging Face `transformers` (BertModel, DistilBertModel, RobertaModel) to 1e-5 in
tests/encoding/test_encoder.py, on reference tensors made by tests/fixtures/make_fixtures.py; each piece's
gradient in tests/encoding/test_encoder_math.py.

This is the reference. minisbert/encoding/fast/tiled_encoder.py computes the same function on the same parameters
faster (padding skipped, fused kernels, memory reused); tests/encoding/test_encoder_fast.py checks that the
two agree. `minisbert.load` plugs the fast one into `SentenceModel` unless asked for this one (`fast=False`).
"""

import math

import torch
from torch import nn

from .config import EncoderConfig
from .encoder_inputs import additive_attention_mask, position_ids


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


GELU_FUNCTIONS = {"gelu": gelu, "gelu_new": gelu_tanh}  # EncoderConfig.activation -> function


class LayerNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x):
        return layer_norm(x, self.weight, self.bias, self.eps)


class Embeddings(nn.Module):
    """Token + position (+ token type) embeddings, then LayerNorm and dropout."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        H = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, H)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, H)
        # DistilBERT has no token-type table; RoBERTa has one row that is still added.
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, H) if config.type_vocab_size > 0 else None
        )
        self.layer_norm = LayerNorm(H, config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, input_ids, token_type_ids=None):
        x = self.word_embeddings(input_ids)  # (B, T, H)
        x = x + self.position_embeddings(position_ids(input_ids, self.config))
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.layer_norm(x))  # (B, T, H)


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention with its output projection."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        H = config.hidden_size
        self.num_heads = config.num_heads
        self.head_size = config.head_size
        self.query = nn.Linear(H, H)
        self.key = nn.Linear(H, H)
        self.value = nn.Linear(H, H)
        self.output = nn.Linear(H, H)
        self.attention_dropout = nn.Dropout(config.attention_dropout)

    def forward(self, x, additive_mask):
        """x: (B, T, H); additive_mask: (B, 1, 1, T), 0 for tokens, the dtype minimum for padding."""
        B, T, H = x.shape
        nh, hs = self.num_heads, self.head_size

        def heads(projected):  # (B, T, H) -> (B, nh, T, hs): each head sees its own hs columns
            return projected.view(B, T, nh, hs).transpose(1, 2)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))  # (B, nh, T, hs)
        scores = q @ k.transpose(-2, -1) / math.sqrt(hs)  # (B, nh, T, T)
        scores = scores + additive_mask  # padding keys get the dtype minimum
        probs = torch.softmax(scores, dim=-1)  # (B, nh, T, T), each row sums to 1
        probs = self.attention_dropout(probs)
        context = probs @ v  # (B, nh, T, hs)
        context = context.transpose(1, 2).reshape(B, T, H)  # (B, T, H), heads side by side
        return self.output(context)  # (B, T, H)


class FeedForward(nn.Module):
    """Position-wise W2 act(W1 x + b1) + b2, widening H to intermediate_size and back."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.activation = GELU_FUNCTIONS[config.activation]

    def forward(self, x):
        return self.output(self.activation(self.intermediate(x)))  # (B, T, I) -> (B, T, H)


class Block(nn.Module):
    """One post-LN transformer block: the residual sum is normalised after each sublayer."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.output_norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, x, additive_mask):
        x = self.attention_norm(x + self.dropout(self.attention(x, additive_mask)))  # (B, T, H)
        return self.output_norm(x + self.dropout(self.ffn(x)))  # (B, T, H)


class Encoder(nn.Module):
    """Token ids in, one contextual vector per token out (Hugging Face's `last_hidden_state`)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        """(B, T) ids and mask (1 = token, 0 = padding) -> (B, T, H).

        Padding positions are computed like any other but no real token attends to them, so they
        change nothing; their own outputs are meaningless and pooling leaves them out."""
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
        additive_mask = additive_attention_mask(attention_mask, x.dtype)  # (B, 1, 1, T)
        for block in self.layers:
            x = block(x, additive_mask)  # (B, T, H)
        return x
