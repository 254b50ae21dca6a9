"""Exact top-k search: for each query embedding, the k corpus embeddings that score best.

Scoring Q queries against N documents of dimension d is one matrix product, (Q, d) @ (d, N), and
the answer is the k best columns of each row. The whole (Q, N) score matrix would take 4·Q·N bytes
(8 GB for 1,000 queries over 2M documents), so the search walks the corpus in chunks and the
queries in chunks, and for each (query chunk, corpus chunk) block it

    1. scores the block: one matrix product, (Qc, d) @ (d, Nc);
    2. takes the block's own top-k of each row;
    3. merges those into the running top-k of each query (`merge_top_k`).

Memory is a few blocks whatever N is, and the corpus is read once. `chunked_search` below is that
loop written out: the plain path, `search(..., fast=False)`, and the reference the fast path is
tested against. The default, `fast=True`, runs minisbert/fast/retrieval.py, which returns the same
top-k faster (it skips most of step 2 and, where the CPU multiplies bfloat16 natively, most of
step 1); its docstring says how. On a CUDA device the fast path is minisbert/fast/device_search.py:
the same three steps, queued for the GPU without waiting on it, block after block (the loop below
reads results back to the host at every chunk, to check it and to drop excluded pairs), with a
corpus in CPU memory copied over while the previous chunk is scored.

Score functions (`score=`):
    cosine     q·c / (|q| |c|)                    larger is better
    dot        q·c                                larger is better
    euclidean  |q - c| = sqrt(|q|² - 2 q·c + |c|²)  smaller is better; returned as the distance
For euclidean the search ranks by the key 2 q·c - |c|² (|q|² is the same for every row of a
query), larger is better, and turns the key into the distance at the end.

Ties. Equal scores are ordered by corpus index, lower first, on every device and for every chunk
size: the block's top-k comes from a stable sort (equal scores stay in column order) and
`merge_top_k` orders equal scores by index. For euclidean the rule applies to the key as computed
in float32. Scores computed in two different ways (by the two paths, or on two devices) may differ
in the last float32 bits, so two rows whose exact scores are that close may come out in either
order.

Inputs and outputs are checked and prepared in minisbert/search_inputs.py, shared by both paths.
Checked against brute force (the full score matrix, computed in float64, and a stable sort) in
tests/test_retrieval.py, and for speed against sentence-transformers `util.semantic_search` and
FAISS `IndexFlatIP` in bench/retrieval.py.
"""

from collections.abc import Hashable, Sequence

import numpy as np
import torch

from .search_inputs import DEFAULT_QUERY_CHUNK_SIZE, SearchInputs, check_inputs, drop_excluded


def search(
    queries: torch.Tensor | np.ndarray,
    corpus: torch.Tensor | np.ndarray,
    k: int,
    score: str = "cosine",
    query_chunk_size: int = DEFAULT_QUERY_CHUNK_SIZE,
    corpus_chunk_size: int | None = None,
    query_ids: Sequence[Hashable] | None = None,
    corpus_ids: Sequence[Hashable] | None = None,
    device: str | torch.device | None = None,
    bf16_screen: bool | None = None,
    fast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[np.ndarray, np.ndarray]:
    """Exact top-k corpus rows for each query row.

    Args:
        queries: (Q, d) float embeddings (torch tensor or numpy array).
        corpus: (N, d) float embeddings. May be float16/bfloat16 (e.g. to halve memory); each
            chunk is upcast to float32 before scoring, so scores are float32 whatever the input.
        k: number of results per query. If k > N the whole corpus is returned, ranked.
        score: "cosine", "dot" or "euclidean" (see the module docstring).
        query_chunk_size, corpus_chunk_size: block shape. Only speed and memory depend on them,
            never the results. corpus_chunk_size defaults to 8192 on CPU, 32768 on CUDA.
        query_ids, corpus_ids: optional ids (any hashable values), one per query and one per
            corpus row. When given, a corpus row whose id equals the query's id is never returned
            for that query (BEIR drops such self-matches), and the next best row takes its place.
        device: where to compute. Defaults to the corpus tensor's device (CPU for numpy). The
            corpus may live elsewhere (e.g. in CPU memory): it is moved chunk by chunk. On a GPU
            there are two ways to hold a large corpus (see minisbert/fast/device_search.py):
            on the GPU in float16, half the memory of float32 (8.8M x 768 takes 13.5 GB):
            `corpus = corpus.half().to("cuda")`; or in CPU memory, streamed to the GPU
            chunk by chunk while the previous chunk is scored, fastest from pinned memory:
            `corpus = corpus.pin_memory()` once, then `search(..., device="cuda")`. A corpus
            in ordinary CPU memory is staged through pinned buffers, one more copy per chunk.
        bf16_screen: fast path on a CPU only: screen each block with a bfloat16 matrix product
            (see minisbert/fast/retrieval.py). The results are the same either way; only the
            speed differs. None (the default) screens on a CPU with native bfloat16 dot
            products. The search on a CUDA device never screens.
        fast: True (the default) runs minisbert/fast/retrieval.py, False the plain
            `chunked_search` below. Both return the same top-k.

    Returns:
        (scores, indices), each (Q, min(k, N)), best first: float32 scores (distances for
        euclidean, smallest first) and int64 corpus row indices. Ties go to the lower corpus
        index. numpy arrays if both inputs are numpy arrays, else torch tensors on `device`.
        Where fewer than min(k, N) rows remain for a query (only possible with ids), the row is
        padded with index -1 and score -inf (+inf distance for euclidean).

    Raises:
        ValueError: unknown score, k < 1, bad chunk sizes, inputs that are not 2-D floating
            point, an empty corpus, mismatched dimensions, a query or corpus row holding NaN or
            inf or too large for float32 (see minisbert/search_inputs.py), ids whose count does
            not match the embeddings, or bf16_screen=True with fast=False.
    """
    inputs = check_inputs(
        queries, corpus, k, score, query_chunk_size, corpus_chunk_size, query_ids, corpus_ids, device
    )
    if fast:
        from .fast.retrieval import fast_search

        top_scores, top_indices = fast_search(inputs, bf16_screen)
    elif bf16_screen:
        raise ValueError("bf16_screen=True needs the fast path; pass fast=True or drop bf16_screen")
    else:
        top_scores, top_indices = chunked_search(inputs)
    return inputs.results(top_scores, top_indices)


def chunked_search(inputs: SearchInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain search: score a block, take its top-k, merge. Returns the (Q, k) scores (ranking
    keys for euclidean) and corpus indices, best first."""
    num_queries, num_docs, k = inputs.queries.shape[0], inputs.corpus.shape[0], inputs.k
    # Running best per query. Padding (-inf, -1) is what a query that has seen nothing holds.
    top_scores = torch.full((num_queries, k), -torch.inf, device=inputs.device)  # (Q, k)
    top_indices = torch.full_like(top_scores, -1, dtype=torch.long)  # (Q, k)

    for doc_start in range(0, num_docs, inputs.corpus_chunk_size):
        # Float32 rows as scored (unit rows for cosine) and their norms (squared for euclidean).
        chunk, sizes = inputs.corpus_chunk(doc_start)  # (Nc, d), (Nc,)
        for query_start in range(0, num_queries, inputs.query_chunk_size):
            rows = slice(query_start, query_start + inputs.query_chunk_size)
            query_chunk = inputs.queries[rows]  # (Qc, d)
            if inputs.score == "euclidean":
                block = torch.addmm(-sizes, query_chunk, chunk.T, alpha=2)  # (Qc, Nc) 2 q·c - |c|²
            else:
                block = query_chunk @ chunk.T  # (Qc, Nc)
            if inputs.excluded is not None:
                drop_excluded(block, inputs.excluded, query_start, doc_start)

            # A stable sort keeps equal scores in column order, i.e. by corpus index.
            block_scores, columns = block.sort(dim=1, descending=True, stable=True)  # (Qc, Nc)
            block_scores, columns = block_scores[:, :k], columns[:, :k]  # (Qc, k')
            # An excluded row scores -inf; it is reported as padding.
            block_indices = torch.where(block_scores == -torch.inf, -1, columns + doc_start)

            top_scores[rows], top_indices[rows] = merge_top_k(
                top_scores[rows], top_indices[rows], block_scores, block_indices, k
            )
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
