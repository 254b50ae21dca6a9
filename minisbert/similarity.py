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
(losses.py) and the STS evaluation (evaluation.py) call `cosine_matrix`, `pairwise_cosine` and
`pairwise_distance` on tensors, differentiably. The search (search_inputs.py) measures its rows
with `row_norms` and `squared_row_norms`, which stay right for rows whose squares leave float32's
range, and divides by the norms or uses the squares in its ranking key.

These are sentence-transformers' `SentenceTransformer.similarity` and `similarity_pairwise`
functions; tests/test_similarity.py checks each against its definition computed entry by entry in
float64, tests/test_st_calls.py against sentence-transformers' own results.
"""

import numpy as np
import torch

from .pooling import normalize

SIMILARITY_FUNCTIONS = ("cosine", "dot", "euclidean", "manhattan")


def cosine_matrix(a: torch.Tensor, b: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """(n, m) scale · cos(a_i, b_j) of a (n, D) and b (m, D): unit rows multiplied (a zero row scores
    0), a's scaled before the product (the multiple-negatives ranking loss's inverse temperature)."""
    return (scale * normalize(a)) @ normalize(b).T  # (n, m)


def pairwise_cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(n,) cos(a_i, b_i) of a and b (n, D)."""
    return (normalize(a) * normalize(b)).sum(dim=-1)  # (n,)


def pairwise_distance(a: torch.Tensor, b: torch.Tensor, ord: float = 2.0) -> torch.Tensor:
    """(n,) ||a_i - b_i|| of a and b (n, D): euclidean (ord 2) or manhattan (ord 1)."""
    return torch.linalg.vector_norm(a - b, ord=ord, dim=-1)  # (n,)


def row_norms(matrix: torch.Tensor) -> torch.Tensor:
    """(n,) Euclidean norms of the rows. Squares beyond float32's range overflow to inf or
    underflow to zero, so a row whose norm comes out as inf or below 2^-60 is measured again after
    dividing by its largest entry (otherwise a row of entries near 1e30 would have norm inf, one
    of entries near 1e-30 norm 0)."""
    norms = torch.linalg.vector_norm(matrix, dim=1)  # (n,)
    redo = ((norms < 2.0**-60) | torch.isposinf(norms)).nonzero()[:, 0]  # (r,)
    if redo.numel():
        rows = matrix[redo]  # (r, d)
        scale = rows.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(matrix.dtype).tiny)  # (r, 1)
        norms[redo] = scale[:, 0] * torch.linalg.vector_norm(rows / scale, dim=1)
    return norms


SQUARES_PIECE_ROWS = 4096


def squared_row_norms(matrix: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """(n,) squared Euclidean norms of the rows (written into `out` if given), for the search: on
    a CPU no gradient flows through them."""
    # Summing squares directly (not squaring a norm) keeps |c|² exact for integer-valued rows, so
    # rows at equal distance get exactly equal ranking keys.
    if matrix.device.type != "cpu":
        return torch.linalg.vecdot(matrix, matrix, out=out)
    # On a CPU the squares are made SQUARES_PIECE_ROWS rows at a time, in a buffer that stays in
    # the cache: over 200,000 x 384 rows on a 2-core AMD EPYC (Zen 4), torch.linalg.vecdot and
    # (matrix * matrix).sum(1) took 93-96 ms, in pieces 11 ms (a norm, one pass, takes 9).
    matrix = matrix.detach()
    out = torch.empty(matrix.shape[0], dtype=matrix.dtype) if out is None else out
    squares = torch.empty(min(matrix.shape[0], SQUARES_PIECE_ROWS), matrix.shape[1], dtype=matrix.dtype)
    for start in range(0, matrix.shape[0], SQUARES_PIECE_ROWS):
        piece = matrix[start : start + SQUARES_PIECE_ROWS]  # (p, d)
        torch.mul(piece, piece, out=squares[: piece.shape[0]])
        torch.sum(squares[: piece.shape[0]], dim=1, out=out[start : start + piece.shape[0]])
    return out


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
    return a, b


def as_rows(embeddings, name: str) -> torch.Tensor:
    """Embeddings as a 2-D tensor: (D,) -> (1, D), (n, D) as it is; a list of embeddings stacked."""
    if isinstance(embeddings, list) and embeddings:
        if all(isinstance(row, torch.Tensor) for row in embeddings):
            embeddings = torch.stack(embeddings)
        elif all(isinstance(row, np.ndarray) for row in embeddings):
            embeddings = np.stack(embeddings)
        else:
            embeddings = torch.tensor(embeddings, dtype=torch.float32)
    if isinstance(embeddings, np.ndarray):
        embeddings = torch.from_numpy(embeddings)
    if not isinstance(embeddings, torch.Tensor):
        raise TypeError(f"{name} must be a numpy array, a torch tensor or a non-empty list of embeddings, "
                        f"got {type(embeddings).__name__}")
    if embeddings.dim() not in (1, 2):
        raise ValueError(f"{name} must be one embedding (D,) or a matrix of them (n, D), "
                         f"got shape {tuple(embeddings.shape)}")
    return embeddings if embeddings.dim() == 2 else embeddings.unsqueeze(0)
