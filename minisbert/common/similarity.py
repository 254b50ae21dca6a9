"""How two sets of sentence embeddings are compared: the similarity functions a model can name.

Reimers and Gurevych (2019), "Sentence-BERT", compare sentences by the cosine of their embeddings
(section 3); a model trained with another objective may be meant to be compared by another function,
and a sentence-transformers directory names it in config_sentence_transformers.json
(`similarity_fn_name`; cosine where none is named). For embeddings a (n, D) and b (m, D), each gives
an (n, m) matrix in which larger means more similar:

    cosine     a_i·b_j / (|a_i| |b_j|)
    dot        a_i·b_j
    euclidean  -|a_i - b_j|              (the distance, negated)
    manhattan  -sum_d |a_id - b_jd|      (the distance, negated)

`similarity_pairwise` compares a_i with b_i only, an (n,) vector of the same functions.

The cosine and the distances are computed here and nowhere else: the training objectives
(training/losses.py) and the STS evaluation (evaluation/benchmark.py) call `cosine_matrix`, `pairwise_cosine` and
`pairwise_distance` on tensors, differentiably. Every unit row in minisbert is made by `unit_rows`
(pooling's normalisation too), whose norms are summed in float64 in one fixed order, so a row of
entries near 1e-20 is a unit row everywhere. The search's definition of a returned score,
`exact_scores`, is here too (minisbert/search/plain.py states it).

These are sentence-transformers' `SentenceTransformer.similarity` and `similarity_pairwise`
functions; tests/common/test_similarity.py checks each against its definition computed entry by entry in
float64, tests/porting/test_st_calls.py against sentence-transformers' own results.
"""

import warnings

import numpy as np
import torch

SIMILARITY_FUNCTIONS = ("cosine", "dot", "euclidean", "manhattan")


def cosine_matrix(a: torch.Tensor, b: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """(n, m) scale · cos(a_i, b_j) of a (n, D) and b (m, D): unit rows multiplied (a zero row scores
    0), a's scaled before the product (the multiple-negatives ranking loss's inverse temperature)."""
    return (scale * unit_rows(a)) @ unit_rows(b).T  # (n, m)


def pairwise_cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(n,) cos(a_i, b_i) of a and b (n, D)."""
    return (unit_rows(a) * unit_rows(b)).sum(dim=-1)  # (n,)


def pairwise_distance(a: torch.Tensor, b: torch.Tensor, ord: float = 2.0) -> torch.Tensor:
    """(n,) ||a_i - b_i|| of a and b (n, D): euclidean (ord 2) or manhattan (ord 1)."""
    return torch.linalg.vector_norm(a - b, ord=ord, dim=-1)  # (n,)


def fixed_sum(terms: torch.Tensor) -> torch.Tensor:
    """(...,) the sums of `terms` (..., d) over the last dimension, in float64, always added in the
    same order: the last half of the columns added onto the first half, again and again (an odd
    middle column waits for a later round) until one is left. Every step is one correctly rounded
    float64 addition, so the result depends on the terms alone, never on a kernel, a thread count or
    how many rows came together."""
    return _fixed_sum_(terms.to(torch.float64, copy=True))


def _fixed_sum_(terms: torch.Tensor) -> torch.Tensor:
    """`fixed_sum` of float64 `terms`, added into them in place."""
    width = terms.shape[-1]
    while width > 1:
        half = width // 2
        terms[..., :half].add_(terms[..., width - half : width])  # (`+=` would copy the half back onto itself)
        width -= half
    return terms[..., 0] if terms.shape[-1] else terms.sum(-1)


def row_norms(matrix: torch.Tensor) -> torch.Tensor:
    """(...,) float64 Euclidean norms of the rows of `matrix` (..., d): the square root of the
    `fixed_sum` of the squares. A float32 entry's square is exact in float64 and can neither
    overflow nor underflow there, so the norm of any finite float32 row is right to float64
    rounding, whatever its scale."""
    rows = matrix.to(torch.float64)
    return _fixed_sum_(rows * rows).sqrt()


def unit_rows(matrix: torch.Tensor, norms: torch.Tensor | None = None) -> torch.Tensor:
    """Each row of `matrix` (..., d) divided by its norm (`row_norms`, or `norms` where the caller has
    them already), in float64, then rounded to `matrix`'s dtype; rows of zeros stay zero. The one
    place minisbert makes unit rows: pooling's normalisation, the losses' and STS's cosines,
    `util.cos_sim` and every search divide here, so all of them agree on every input, from rows of
    entries near 1e-30 to rows near 1e30. Differentiable."""
    norms = row_norms(matrix) if norms is None else norms  # (...,)
    tiniest = torch.finfo(torch.float64).tiny  # a zero row divided by it stays zero
    return (matrix.to(torch.float64) / norms.clamp_min(tiniest)[..., None]).to(matrix.dtype)


def exact_scores(queries: torch.Tensor, rows: torch.Tensor, score: str) -> torch.Tensor:
    """(M,) the score of each query row with the row beside it, (M, d) each, as the search defines
    it (minisbert/search/plain.py): `fixed_sum` of the float64 products (exact: two float32 numbers
    multiply without rounding in float64), rounded once to float32. cosine and dot take the rows
    as scored (unit rows for cosine); euclidean returns sqrt(fixed_sum((q - c)²)), the distance."""
    queries, rows = queries.to(torch.float64), rows.to(torch.float64)
    if score == "euclidean":
        differences = queries - rows
        return _fixed_sum_(differences.mul_(differences)).sqrt().to(torch.float32)
    return _fixed_sum_(queries * rows).to(torch.float32)


def similarity(a, b, function: str = "cosine") -> torch.Tensor:
    """(n, m) similarities of the rows of `a` (n, D) to those of `b` (m, D), by `function`.

    a, b: numpy arrays, torch tensors, or lists of embeddings (what encode(convert_to_numpy=False)
    returns; lists of lists of floats too); a single embedding (D,) counts as one row."""
    a, b = checked_pair(a, b, function)
    if function == "cosine":
        return cosine_matrix(a, b)  # (n, m)
    if function == "dot":
        return a @ b.T  # (n, m)
    return -torch.cdist(a, b, p=2.0 if function == "euclidean" else 1.0)  # (n, m)


def similarity_pairwise(a, b, function: str = "cosine") -> torch.Tensor:
    """(n,) similarities of a_i (n, D) to b_i (n, D) alone, by `function`; inputs as for `similarity`.
    Two single embeddings (D,) give one 0-d tensor, as in sentence-transformers (so f"{s:.3f}" works)."""
    single = getattr(a, "ndim", None) == 1 and getattr(b, "ndim", None) == 1
    a, b = checked_pair(a, b, function)
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"pairwise similarity needs as many rows in a as in b, got {a.shape[0]} and {b.shape[0]}")
    if function == "cosine":
        scores = pairwise_cosine(a, b)  # (n,)
    elif function == "dot":
        scores = (a * b).sum(dim=-1)  # (n,)
    else:
        scores = -pairwise_distance(a, b, ord=2.0 if function == "euclidean" else 1.0)  # (n,)
    return scores[0] if single else scores


def check_similarity_function(name: str, what: str = "similarity function") -> None:
    """A ValueError unless `name` is one of SIMILARITY_FUNCTIONS; `what` names it in the message."""
    if name not in SIMILARITY_FUNCTIONS:
        raise ValueError(f"unknown {what} {name!r}; choose one of {SIMILARITY_FUNCTIONS}")


def checked_pair(a, b, function: str) -> tuple:
    """a and b as 2-D tensors of embeddings of the same size, for a known similarity function."""
    check_similarity_function(function)
    a, b = as_rows(a, "a"), as_rows(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"embeddings of different sizes: a has {a.shape[1]} dimensions, b has {b.shape[1]}")
    common = torch.promote_types(a.dtype, b.dtype)  # float16 beside float32 compares in float32
    return a.to(common), b.to(common)


def as_rows(embeddings, name: str) -> torch.Tensor:
    """Embeddings as a 2-D floating-point tensor: (D,) -> (1, D), (n, D) as it is; a list of embeddings
    stacked; a numpy array of any byte order and strides (`array_as_tensor`). Integers are refused."""
    if isinstance(embeddings, list) and embeddings:
        if all(isinstance(row, torch.Tensor) for row in embeddings):
            embeddings = torch.stack(embeddings)
        elif all(isinstance(row, np.ndarray) for row in embeddings):
            embeddings = np.stack(embeddings)
        else:
            embeddings = torch.tensor(embeddings, dtype=torch.float32)
    if isinstance(embeddings, np.ndarray):
        embeddings = array_as_tensor(embeddings)
    if not isinstance(embeddings, torch.Tensor):
        raise TypeError(f"{name} must be a numpy array, a torch tensor or a non-empty list of embeddings, "
                        f"got {type(embeddings).__name__}")
    if embeddings.dim() not in (1, 2):
        raise ValueError(f"{name} must be one embedding (D,) or a matrix of them (n, D), "
                         f"got shape {tuple(embeddings.shape)}")
    if not embeddings.is_floating_point():  # an integer row's unit row would round to zeros
        raise ValueError(f"{name} holds {embeddings.dtype} numbers; embeddings are floating point "
                         "(convert them, e.g. .astype(np.float32))")
    # Contiguous: torch's products add in an order that follows the strides, and the same values
    # should give the same bits whatever their layout (a transposed tensor, a broadcast row).
    return (embeddings if embeddings.dim() == 2 else embeddings.unsqueeze(0)).contiguous()


def array_as_tensor(array: np.ndarray) -> torch.Tensor:
    """A numpy array as a torch tensor of the same values: read in place wherever torch can read it
    (views, broadcast rows, read-only memory maps: minisbert only reads them, so torch's warning that
    it may write is moot), copied where torch cannot (another byte order, a negative stride)."""
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if any(stride < 0 for stride in array.strides):
        array = np.ascontiguousarray(array)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        return torch.from_numpy(array)
