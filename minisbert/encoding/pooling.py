"""From one vector per token to one vector per sentence.

Reimers and Gurevych (2019), "Sentence-BERT", section 3: the sentence embedding is a pooling of the
encoder's output tokens, by one of three strategies:
- mean: the average of the real tokens' vectors (SBERT's default): sum_t m_t x_t / max(sum_t m_t, eps);
- max: the element-wise maximum over real tokens (padding never wins);
- cls: the vector of the first token, [CLS] or <s>.
Optionally a dense layer then maps H to D dimensions, y = act(W x + b) (to make embeddings smaller),
and the result is scaled to unit length, x / max(||x||, eps), so that a dot product is the cosine.

These match sentence-transformers' `Pooling`, `Dense` and `Normalize` modules; tests check them
against embeddings that sentence-transformers computed (tests/encoding/test_model.py).
"""

import torch
from torch import nn

from ..common.similarity import unit_rows

POOLING_MODES = ("mean", "max", "cls")
DENSE_ACTIVATIONS = {"tanh": nn.Tanh, "identity": nn.Identity, "relu": nn.ReLU}


def mean_pool(token_embeddings, attention_mask):
    """(B, T, H), (B, T) -> (B, H): average over real tokens only."""
    mask = attention_mask.unsqueeze(-1).to(token_embeddings.dtype)  # (B, T, 1)
    summed = (token_embeddings * mask).sum(dim=1)  # (B, H)
    counts = mask.sum(dim=1).clamp(min=1e-9)  # (B, 1); an all-padding row divides by eps, not 0
    return summed / counts


def max_pool(token_embeddings, attention_mask):
    """(B, T, H), (B, T) -> (B, H): element-wise maximum over real tokens only."""
    blocked = (attention_mask == 0).unsqueeze(-1)  # (B, T, 1)
    lowest = torch.finfo(token_embeddings.dtype).min
    return token_embeddings.masked_fill(blocked, lowest).max(dim=1).values  # (B, H)


def cls_pool(token_embeddings, attention_mask):
    """(B, T, H) -> (B, H): the first token's vector."""
    return token_embeddings[:, 0]


POOLING_FUNCTIONS = {"mean": mean_pool, "max": max_pool, "cls": cls_pool}


def pool(token_embeddings, attention_mask, mode: str):
    if mode not in POOLING_FUNCTIONS:
        raise ValueError(f"unknown pooling mode {mode!r}; choose one of {POOLING_MODES}")
    return POOLING_FUNCTIONS[mode](token_embeddings, attention_mask)


def normalize(embeddings):
    """Each row divided by its L2 norm (rows of zeros stay zero): common/similarity.py's `unit_rows`."""
    return unit_rows(embeddings)


class Dense(nn.Module):
    """y = act(W x + b): projects pooled H-dim embeddings to D dims (sentence-transformers `Dense`)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 activation: str = "tanh"):
        super().__init__()
        if activation not in DENSE_ACTIVATIONS:
            raise ValueError(f"unknown dense activation {activation!r}; choose one of {list(DENSE_ACTIVATIONS)}")
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation_name = activation
        self.activation = DENSE_ACTIVATIONS[activation]()

    def forward(self, x):
        return self.activation(self.linear(x))  # (B, D)
