"""Exact top-k search, the plain way: score a block of the corpus, take its top k, merge.

For each query embedding, the k corpus embeddings that score best. Scoring Q queries against N
documents of dimension d is one matrix product, (Q, d) @ (d, N), and the answer is the k best
columns of each row. The whole (Q, N) score matrix would take 4·Q·N bytes (8 GB for 1,000 queries
over 2M documents), so `search` walks the corpus in chunks and the queries in chunks, and for each
(query chunk, corpus chunk) block it

    1. scores the block: one matrix product, (Qc, d) @ (d, Nc);
    2. takes the block's own top-k of each row;
    3. merges those into the running top-k of each query (`merge_top_k`).

Memory is a few blocks whatever N is, and the corpus is read once. sentence-transformers'
`util.semantic_search` is the same loop.

Score functions (`score=`):
    cosine     q·c / (|q| |c|)                    larger is better
    dot        q·c                                larger is better
    euclidean  |q - c| = sqrt(|q|² - 2 q·c + |c|²)  smaller is better; returned as the distance
For euclidean the search ranks by the key 2 q·c - |c|² (|q|² is the same for every row of a
query), larger is better, and turns the key into the distance at the end.

Ties. Equal scores are ordered by corpus index, lower first, for every chunk size: the block's
top-k comes from a stable sort (equal scores stay in column order) and `merge_top_k` orders equal
scores by index. Scores computed in two different ways (on two devices, say) may differ in the
last float32 bits, so two rows whose exact scores are that close may come out in either order.

This module is the plain search, and it reads alone: it checks shape, dtype and finiteness, and
expects embeddings of the size models produce. minisbert/search.py is the search the library
calls: it runs the loop below (`top_k_by_blocks`) or the fast paths in minisbert/fast/, and
adds what a search over any embeddings needs (rows near float32's limits, scores that could
overflow, query ids to leave out). Checked against brute force (every score in float64, a stable
sort) with chunk sizes that do not divide N in tests/test_retrieval.py.
"""

import numpy as np
import torch

SCORE_FUNCTIONS = ("cosine", "dot", "euclidean")


def search(queries, corpus, k: int, score: str = "cosine", query_chunk_size: int = 1024,
           corpus_chunk_size: int = 8192) -> tuple:
    """Exact top-k corpus rows for each query row: (scores, indices), each (Q, min(k, N)), best
    first, ties to the lower index. queries (Q, d) and corpus (N, d): floating-point torch tensors
    or numpy arrays (numpy results for numpy inputs). Scores are float32, distances for euclidean.
    The chunk sizes change only speed and memory (minisbert/search_inputs.py says why these)."""
    return_numpy = isinstance(queries, np.ndarray) and isinstance(corpus, np.ndarray)
    queries, corpus = embedding_matrix(queries, "queries"), embedding_matrix(corpus, "corpus")
    if score not in SCORE_FUNCTIONS:
        raise ValueError(f"unknown score {score!r}; choose one of {', '.join(SCORE_FUNCTIONS)}")
    if queries.shape[1] != corpus.shape[1] or corpus.shape[0] == 0 or not isinstance(k, int) or k < 1:
        raise ValueError(f"need k >= 1 (got {k}) and a non-empty corpus of the queries' dimension: got queries "
                         f"{tuple(queries.shape)} and corpus {tuple(corpus.shape)}")
    queries, query_sizes = scoring_rows(queries.float(), score, "queries", 0)  # (Q, d), (Q,)
    chunks = (scoring_rows(corpus[start:start + corpus_chunk_size].float(), score, "corpus", start)
              for start in range(0, corpus.shape[0], corpus_chunk_size))
    top_scores, top_indices = top_k_by_blocks(queries, chunks, min(k, corpus.shape[0]), score, query_chunk_size)
    if score == "euclidean":  # from the ranking key 2 q·c - |c|² back to the distance
        top_scores = (query_sizes[:, None] - top_scores).clamp_min(0).sqrt()  # (Q, k)
    if return_numpy:
        return top_scores.numpy(), top_indices.numpy()
    return top_scores, top_indices


def embedding_matrix(embeddings, name: str) -> torch.Tensor:
    """`embeddings` as a 2-D floating-point tensor, or a ValueError naming what it is instead."""
    if isinstance(embeddings, np.ndarray):
        embeddings = torch.from_numpy(embeddings)
    if not isinstance(embeddings, torch.Tensor) or embeddings.ndim != 2 or not embeddings.is_floating_point():
        raise ValueError(f"{name} must be a 2-D floating-point torch tensor or numpy array (rows, dim), got "
                         f"{getattr(embeddings, 'dtype', type(embeddings).__name__)} of shape "
                         f"{tuple(getattr(embeddings, 'shape', ()))}")
    return embeddings


def scoring_rows(rows: torch.Tensor, score: str, name: str, start: int) -> tuple:
    """The (n, d) float32 rows as they are scored (unit rows for cosine) and their (n,) sizes:
    squared norms for euclidean (its ranking key needs them), else norms. Refuses, by row number,
    a row holding NaN or inf or too large for float32."""
    sizes = torch.linalg.vecdot(rows, rows) if score == "euclidean" else torch.linalg.vector_norm(rows, dim=1)
    if not torch.isfinite(sizes).all():
        row = start + int(torch.isfinite(sizes).logical_not().nonzero()[0])
        raise ValueError(f"{name} row {row} contains NaN or inf, or values too large for float32; embed it "
                         "again or drop it")
    if score == "cosine":  # a zero row scores 0 instead of NaN
        rows = rows / sizes.clamp_min(torch.finfo(torch.float32).tiny)[:, None]
    return rows, sizes


def top_k_by_blocks(queries: torch.Tensor, chunks, k: int, score: str, query_chunk_size: int,
                    drop=None) -> tuple:
    """The loop: for each corpus chunk (rows as scored, sizes) from `chunks`, for each query chunk,
    score the block, take its top k, merge. Returns the (Q, k) running top-k: scores (ranking keys
    for euclidean) and corpus indices. drop(block, query_start, doc_start), if given, sets entries
    never to return to -inf (search.py's excluded ids); they come out as padding, index -1."""
    num_queries, doc_start = queries.shape[0], 0
    top_scores = torch.full((num_queries, k), -torch.inf, device=queries.device)  # (Q, k) nothing seen yet
    top_indices = torch.full_like(top_scores, -1, dtype=torch.long)  # (Q, k)
    for chunk, sizes in chunks:  # (Nc, d), (Nc,)
        for query_start in range(0, num_queries, query_chunk_size):
            rows = slice(query_start, query_start + query_chunk_size)
            if score == "euclidean":
                block = torch.addmm(-sizes, queries[rows], chunk.T, alpha=2)  # (Qc, Nc) 2 q·c - |c|²
            else:
                block = queries[rows] @ chunk.T  # (Qc, Nc)
            if drop is not None:
                drop(block, query_start, doc_start)
            # A stable sort keeps equal scores in column order, i.e. by corpus index.
            block_scores, columns = block.sort(dim=1, descending=True, stable=True)  # (Qc, Nc)
            block_scores, columns = block_scores[:, :k], columns[:, :k]  # (Qc, k')
            block_indices = torch.where(block_scores == -torch.inf, -1, columns + doc_start)
            top_scores[rows], top_indices[rows] = merge_top_k(
                top_scores[rows], top_indices[rows], block_scores, block_indices, k)
        doc_start += chunk.shape[0]
    return top_scores, top_indices


def merge_top_k(
    scores: torch.Tensor,
    indices: torch.Tensor,
    other_scores: torch.Tensor,
    other_indices: torch.Tensor,
    k: int,
    largest: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two top-k lists of the same queries into one, with the search's tie rule.

    Args:
        scores, indices: (Q, a) scores and corpus indices, one row per query (e.g. the running
            top-k, or the results of one corpus shard with its indices made global).
        other_scores, other_indices: (Q, b) more of the same (e.g. one block's top-k, or another
            shard's results).
        k: how many to keep per query.
        largest: True when larger scores are better (cosine, dot, and euclidean ranking keys);
            False for euclidean distances as `search` returns them.

    Returns:
        (scores, indices), each (Q, min(k, a + b)), best first, equal scores ordered by corpus
        index, lower first. Padding (index -1, score -inf, or +inf with largest=False) sorts
        after every real entry. Neither list needs to hold lower indices than the other, so
        results of corpus shards can be merged in any order.
    """
    scores = torch.cat([scores, other_scores], dim=1)  # (Q, a + b)
    indices = torch.cat([indices, other_indices], dim=1)  # (Q, a + b)
    # Put the entries in index order, then sort stably by score: equal scores keep index order.
    by_index = indices.argsort(dim=1, stable=True)  # (Q, a + b)
    scores, indices = scores.gather(1, by_index), indices.gather(1, by_index)
    by_score = scores.argsort(dim=1, descending=largest, stable=True)[:, :k]  # (Q, k)
    return scores.gather(1, by_score), indices.gather(1, by_score)
