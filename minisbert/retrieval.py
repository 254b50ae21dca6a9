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

This module is the plain search, the reference every faster path is tested against. What it
needs besides the loop, and shares with the fast paths, is in minisbert/search_inputs.py: the checks
of the inputs (shapes, rows that are not finite, scores that could overflow float32, ids to leave
out) and the rows as each score function scores them. minisbert/search.py is the search the library
calls: this loop with fast=False, else minisbert/fast/. Checked against brute force (every score in
float64, a stable sort) with chunk sizes that do not divide N in tests/test_retrieval.py.
"""

from collections.abc import Hashable, Sequence

import numpy as np
import torch

from .search_inputs import DEFAULT_QUERY_CHUNK_SIZE, PreparedCorpus, SearchInputs, check_inputs, drop_excluded


def search(
    queries: torch.Tensor | np.ndarray,
    corpus: torch.Tensor | np.ndarray | PreparedCorpus,
    k: int,
    score: str | None = None,
    query_chunk_size: int = DEFAULT_QUERY_CHUNK_SIZE,
    corpus_chunk_size: int | None = None,
    query_ids: Sequence[Hashable] | None = None,
    corpus_ids: Sequence[Hashable] | None = None,
    device: str | torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[np.ndarray, np.ndarray]:
    """Exact top-k corpus rows for each query row, the plain way. The arguments and what comes
    back are those of `minisbert.search.search` (see there); score defaults to cosine, or to the
    score a prepared corpus was made for."""
    inputs = check_inputs(queries, corpus, k, score, query_chunk_size, corpus_chunk_size, query_ids,
                          corpus_ids, device)
    return inputs.results(*chunked_search(inputs))


def chunked_search(inputs: SearchInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The loop below on checked inputs: corpus chunks checked and made ready by
    `SearchInputs.corpus_chunk`, excluded pairs dropped block by block. Returns the (Q, k) scores
    (ranking keys for euclidean) and corpus indices, best first."""
    starts = range(0, inputs.corpus.shape[0], inputs.corpus_chunk_size)
    chunks = (inputs.corpus_chunk(start) for start in starts)  # (Nc, d) rows as scored, (Nc,) norm terms

    def drop(block, query_start, doc_start):  # the pairs whose ids are equal
        drop_excluded(block, inputs.excluded, query_start, doc_start)

    return top_k_by_blocks(inputs.queries, chunks, inputs.k, inputs.score, inputs.query_chunk_size,
                           drop if inputs.excluded is not None else None)


def top_k_by_blocks(queries: torch.Tensor, chunks, k: int, score: str, query_chunk_size: int,
                    drop=None) -> tuple:
    """The loop: for each corpus chunk (rows as scored, norm terms) from `chunks`, for each query chunk,
    score the block, take its top k, merge. Returns the (Q, k) running top-k: scores (ranking keys
    for euclidean) and corpus indices. drop(block, query_start, doc_start), if given, sets entries
    never to return to -inf (search.py's excluded ids); they come out as padding, index -1."""
    num_queries, doc_start = queries.shape[0], 0
    top_scores = torch.full((num_queries, k), -torch.inf, device=queries.device)  # (Q, k) nothing seen yet
    top_indices = torch.full_like(top_scores, -1, dtype=torch.long)  # (Q, k)
    for chunk, norm_terms in chunks:  # (Nc, d), (Nc,)
        for query_start in range(0, num_queries, query_chunk_size):
            rows = slice(query_start, query_start + query_chunk_size)
            if score == "euclidean":
                block = torch.addmm(-norm_terms, queries[rows], chunk.T, alpha=2)  # (Qc, Nc) 2 q·c - |c|²
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
