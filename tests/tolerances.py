"""Where the tests' float32 tolerances come from.

Two float32 computations of one function that add in a different order (another kernel, another
CPU's vector width, AVX2's 8 lanes against AVX-512's 16, packed tokens instead of padded ones, a
reference made on another machine) each differ from the exact result by their rounding errors, so
from each other by at most the sum of both. Each rounding is off by at most u = 2^-24 of its result
(float32's unit roundoff), and a value reached through n roundings in sequence by at most
n·u/(1 - n·u) of the sum of the magnitudes of the terms that made it (Higham, "Accuracy and Stability
of Numerical Algorithms", 2nd ed., 2002, section 3.1). That worst case needs every rounding to go the
same way; rounding errors of a long computation behave as independent, and then the error stays
below λ·√n·u of those magnitudes except with probability about 2n·exp(-λ²/2) (Higham and Mary, "A New
Approach to Probabilistic Rounding Error Analysis", SIAM J. Sci. Comput., 2019). With λ = 8 that
probability is below 1e-10 for every n here: a tolerance of 2·8·√n·u does not fail by chance, on any
CPU, and is still far below what a real mistake changes (a dropped bias, a wrong eps, a token
attending to padding move values by 1e-3 and more).

torch computes float32 products in float32 on every CPU (torch.get_float32_matmul_precision() is
"highest", and minisbert never lowers it): AMX CPUs do not round float32 inputs to bfloat16 here.
Tests of bfloat16 give their own bounds (tests/encoding/test_bfloat16.py, tests/search/test_retrieval.py).

The scale a bound is taken of is the largest |value| of the tensor compared, at least 1: the terms
these sums add are of order one (LayerNorm outputs of unit variance, weights of fan-in variance,
N(0, 1) loss weights), so a value near 0 is a sum of terms of order one that cancelled.
"""

import math

import torch

UNIT_ROUNDOFF = 2.0 ** -24  # float32
LAMBDA = 8  # the probabilistic bound fails with probability about 2n·exp(-32) < 1e-10
ADAMW_ROUNDINGS = 7  # per entry and step: the decay, two for each moment, √v, + ε, the division, the update


def encoder_roundings(config, tokens: int) -> int:
    """n for one output of an encoder: the roundings in sequence on the longest path through it. Each
    post-LN block: two LayerNorms (a mean, then a variance: 2H each), the query/key/value projection
    (H), the scores (head size), softmax's sum and the weighted sum of values (T each), the output
    projection (H), the FFN's two products (H and the intermediate width); then the embeddings'
    LayerNorm (2H) and pooling's mean over the tokens (T)."""
    h = config.hidden_size
    block = 2 * 2 * h + h + config.head_size + 2 * tokens + h + h + config.intermediate_size
    return config.num_layers * block + 2 * h + tokens


def gradient_roundings(config, tokens: int, batch_tokens: int) -> int:
    """n for one entry of a parameter's gradient: backpropagation retraces the forward path (its
    roundings once more, on top of the forward's own), then sums the entry's terms over every token
    of the batch."""
    return 2 * encoder_roundings(config, tokens) + batch_tokens


def training_roundings(config, tokens: int, batch_tokens: int, steps: int, head: int = 0) -> int:
    """n for a value logged at step `steps` of a training run (its loss, its gradient norm). Each step
    starts from the weights the step before made with its forward and backward passes and AdamW's
    update, so the roundings of every step lie in sequence on the path to the value. Each step is
    counted whole (gradient_roundings, a head's products there and back, AdamW), the last one's
    backward pass standing in for the loss's own sums (similarities over D, a softmax and a mean over
    the batch), which are fewer. `head`: what a model adds after pooling (a Dense layer's H, the
    normalisation's D).

    AdamW scales each entry's step by the running size of that entry's gradient, so an entry whose
    gradient is near 0 carries more than u of its size into the update: for such entries this n is
    the length of the chain, not a proof. The tests that use it say how far inside it the differences
    measured on AVX-512 with AMX, AVX2 and SSE kernels stay."""
    return steps * (gradient_roundings(config, tokens, batch_tokens) + 2 * head + ADAMW_ROUNDINGS)


def float32_apart(roundings: int) -> float:
    """The most two float32 computations of `roundings` roundings each differ by, relative to scale."""
    return 2 * LAMBDA * math.sqrt(roundings) * UNIT_ROUNDOFF


def scale(tensor) -> float:
    """The largest |value|, at least 1 (see above)."""
    values = tensor.detach() if hasattr(tensor, "detach") else tensor
    return max(1.0, float(abs(values).max()))


def embedding_roundings(model) -> int:
    """n for a SentenceModel's embeddings: its encoder at max_seq_length tokens, then a Dense layer's
    product over H and the normalisation's sum over D where it has them."""
    extra = (model.encoder.config.hidden_size if model.dense is not None else 0) + \
        (model.dimension if model.normalize_embeddings else 0)
    return encoder_roundings(model.encoder.config, model.max_seq_length) + extra


def embeddings_apart(model) -> float:
    """The bound for a SentenceModel's embeddings (relative to scale)."""
    return float32_apart(embedding_roundings(model))


def scores_apart(model) -> float:
    """The bound for a score of two of a SentenceModel's embeddings, each computed apart (relative to
    scale): the embeddings' path, then the score's sums over D (normalising for cosine, the product)."""
    return float32_apart(embedding_roundings(model) + 2 * model.dimension)


def search_roundings(d: int, score: str) -> int:
    """n for a float32 search score of two d-long rows (minisbert/search/plain.py, minisbert/search/fast/):
    - dot, q·c: one sum of d products;
    - cosine, (q/|q|)·(c/|c|), or (q/|q|)·c / |c| on the fast path's few-query spans: the dot product's
      d, and for each row its norm (d squares summed, a square root) and the division by it;
    - euclidean, |q|² - (2 q·c - |c|²), the ranking key made by one addmm (or as (2q - c)·c when a
      screened entry is scored again: one rounding more): the longest of the sums of d terms, then the
      additions and subtractions after it."""
    return {"dot": d, "cosine": 3 * d + 4, "euclidean": d + 3}[score]


def search_scores_apart(queries, corpus, indices, score: str, distances=None, roundings: int = 0):
    """(Q, k) float64: the most each float32 search score of the (Q, d) `queries` against the corpus
    rows `indices` (Q, k) differs from the exact score, or from another float32 computation of it (an
    AVX2 kernel's against an AVX-512 or AMX one's, a GPU's against a CPU's). `distances`: the (Q, k)
    exact distances, for euclidean. `roundings`: what the rows went through before the search (a
    scaling, a norm measured again: one rounding more each).

    Each bound is float32_apart(search_roundings) times the sum of the magnitudes of the terms that
    made the score, the quantity Higham's bound is relative to (see above):
    - dot: sum_i |q_i c_i|, at most |q| |c|, and larger than |q·c| where the products cancel;
    - cosine: 1, since the products of two unit rows sum to at most 1 in magnitude and the norms'
      relative errors multiply a cosine of at most 1;
    - euclidean: |q|² + 2 sum_i |q_i c_i| + |c|², the terms of the squared distance D². Float32 gets
      D² off by at most that times float32_apart, e; the distance sqrt(D² + e) is then off from D by
      |e| / (sqrt(D² + e) + D), at most |e| / D, and at most sqrt(|e|), which is what is left where D
      is near 0 (a row close to the query: its D² is a difference of much larger terms). The square
      root rounds once more, by u of D.
    Padding (row -1) gets a bound too; its scores are infinite, and callers compare them exactly."""
    queries = torch.as_tensor(queries).double()  # (Q, d)
    corpus = torch.as_tensor(corpus).double()  # (N, d)
    indices = indices.clamp_min(0)  # (Q, k)
    apart = float32_apart(search_roundings(queries.shape[1], score) + roundings)
    if score == "cosine":
        return torch.full(indices.shape, apart, dtype=torch.float64)
    products = (queries.abs() @ corpus.abs().T).gather(1, indices)  # (Q, k) sum_i |q_i c_i|
    if score == "dot":
        return apart * products
    squared = apart * (queries.pow(2).sum(1)[:, None] + 2 * products + corpus.pow(2).sum(1)[indices])  # (Q, k)
    # fmin skips a NaN: a zero query against a zero row gives 0 / 0, and its bound is then sqrt(0) = 0.
    return torch.fmin(squared / distances, squared.sqrt()) + 2 * UNIT_ROUNDOFF * distances
