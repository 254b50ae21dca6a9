"""sentence-transformers' `util` functions a porting user calls most, as thin names over minisbert's
own code (`from minisbert import util` in place of `from sentence_transformers import util`):

    cos_sim(a, b)               (n, m) cosine similarities          common/similarity.py
    dot_score(a, b)             (n, m) dot products                 common/similarity.py
    normalize_embeddings(x)     each row scaled to unit length      encoding/pooling.py
    semantic_search(q, c, ...)  per query, a list of {"corpus_id", "score"}, best first: search.search
                                (the fast path), its (Q, k) results in sentence-transformers' form

a and b take what similarity() takes: arrays, tensors, lists of embeddings. Checked against
sentence-transformers' util on all-MiniLM-L6-v2's embeddings in tests/porting/test_st_calls.py.
"""

import torch

from ..encoding.pooling import normalize
from ..search.ways import search
from ..common.similarity import as_rows, similarity


def cos_sim(a, b) -> torch.Tensor:
    """(n, m) cosine similarities of the rows of a to the rows of b."""
    return similarity(a, b, "cosine")


def dot_score(a, b) -> torch.Tensor:
    """(n, m) dot products of the rows of a with the rows of b."""
    return similarity(a, b, "dot")


def normalize_embeddings(embeddings) -> torch.Tensor:
    """Each row divided by its L2 norm (rows of zeros stay zero), of what similarity() takes: one
    embedding (D,) stays one; an array or a list becomes a tensor; integers are refused (their unit
    rows would round to zeros)."""
    unit = normalize(as_rows(embeddings, "embeddings"))  # (n, D)
    return unit[0] if getattr(embeddings, "ndim", 2) == 1 else unit


SCORE_NAMES = {cos_sim: "cosine", dot_score: "dot"}


def semantic_search(query_embeddings, corpus_embeddings, query_chunk_size: int = 100,
                    corpus_chunk_size: int = 500000, top_k: int = 10, score_function=cos_sim) -> list:
    """For each query, its top_k corpus rows, best first, as [{"corpus_id": row, "score": score}, ...]
    (fewer when the corpus has fewer rows; none for top_k=0 or an empty corpus). Equal scores: the
    lower corpus row first.

    score_function: cos_sim or dot_score (minisbert's search takes no other function). The chunk
    sizes are accepted for sentence-transformers' signature; minisbert's search picks its own,
    which change only speed, never the results."""
    if score_function not in SCORE_NAMES:
        raise ValueError(f"score_function must be minisbert.util.cos_sim or minisbert.util.dot_score, got "
                         f"{score_function!r}; for another score call minisbert.search.search(score=...)")
    queries, corpus = as_rows(query_embeddings, "query_embeddings"), as_rows(corpus_embeddings, "corpus_embeddings")
    if top_k == 0 or len(corpus) == 0:  # nothing to find: an empty list per query, as sentence-transformers gives
        return [[] for _ in range(len(queries))]
    scores, indices = search(queries, corpus, min(top_k, len(corpus)), score=SCORE_NAMES[score_function])
    # tolist() gives Python ints and floats, as sentence-transformers' hits hold.
    return [[{"corpus_id": row, "score": score} for row, score in zip(query_rows, query_scores)]
            for query_rows, query_scores in zip(indices.tolist(), scores.tolist())]
