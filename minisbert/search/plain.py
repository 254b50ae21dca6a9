"""Exact top-k search, the plain way: score a block of the corpus, keep what can reach the top k,
score that exactly, merge.

For each query embedding, the k corpus embeddings that score best: the k best columns of each row
of one matrix product, (Q, d) @ (d, N). Its (Q, N) scores would take 4·Q·N bytes (8 GB for 1,000
queries over 2M documents), so `search` walks the corpus and the queries in chunks.

What a returned score is. The rows searched are the inputs rounded to float32, whatever their
floating dtype (float16 and bfloat16 exactly, float64 to the nearest float32): every check, norm,
unit row and score is of those float32 rows. A float32 product sums each q·c in an order its kernel
chooses (it changes with the kernel, the block's shape and the machine), which can turn a near tie.
So a score is one fixed arithmetic of the query row and the corpus row (minisbert/common/similarity.py's
`exact_scores`):

    cosine     q̂·ĉ over the unit rows q̂, ĉ that `unit_rows` makes     larger is better
    dot        q·c                                                     larger is better
    euclidean  |q - c|                                                 smaller is better

each summed in float64 in one fixed pairwise order over the exact products (for euclidean the
squares of the differences, each computed in float64; the distance is the root of the sum), then
rounded once to float32; equal scores go to the lower corpus index. Every path (this
loop, minisbert/fast/'s ways, any chunk size or query count, a prepared or a raw corpus) returns
these scores in this order, bit for bit.

The loop. For each (query chunk, corpus chunk) block it
    1. scores the block in float32: one matrix product, (Qc, d) @ (d, Nc) (for euclidean the key
       2 q·c - |c|², which orders rows as the distance does);
    2. keeps the candidates: each float32 score lies within a proven bound E of the exact one, so
       only entries within 2E of the query's k-th best can be in its top k (`Bounds`). A float32
       sum of d products, in any order, lies within γ Σ|q_i c_i| <= γ |q| |c| of the true sum,
       γ = d·u / (1 - d·u), u = 2^-24 (Higham, "Accuracy and Stability of Numerical Algorithms",
       3.1), and the exact score rounds once more; so, R the chunk's largest row norm,
           E = 1.01 (γ + 2u) |q| R + d·2^-124        (euclidean's keys: (|q| + R)² for |q| R).
       search/bounds.py proves it, term by term, beside every other bound the search uses;
    3. scores the candidates exactly and merges them into the running top-k (`settle`).

Memory is a few blocks whatever N is; sentence-transformers' `util.semantic_search` is step 1 and
a top-k. The checks and `settle` are in search/inputs.py, beside `exact_top_k`, the same exact
scores of the rows the fast ways (search/fast/) keep; the bounds in search/bounds.py (with what
TF32 or bfloat16 products add where torch is set to them: the search reads that setting and never
changes it). Tested in
tests/search/test_retrieval.py against brute force, in tests/search/test_search_property.py against exact
arithmetic, and every way against this loop; the bounds in tests/search/test_search_bounds.py.
"""

import math

import torch

from .bounds import Bounds
from .inputs import DEFAULT_QUERY_CHUNK_SIZE, SearchInputs, check_inputs, settle


def search(queries, corpus, k: int, score: str | None = None, query_chunk_size: int = DEFAULT_QUERY_CHUNK_SIZE,
           corpus_chunk_size: int | None = None, device=None):
    """Exact top-k corpus rows for each query row, the plain way. The arguments and what comes
    back are those of `minisbert.search.search` (see there; ids to leave out are its own)."""
    inputs = check_inputs(queries, corpus, k, score, query_chunk_size, corpus_chunk_size, device)
    return inputs.results(*chunked_search(inputs))


def chunked_search(inputs: SearchInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The loop on checked inputs: the (Q, k) values (negated distances for euclidean) and indices, best first."""
    queries, k, score = inputs.queries, inputs.k, inputs.score
    top_values = torch.full((queries.shape[0], k), -math.inf, device=inputs.device)  # (Q, k)
    top_indices = torch.full_like(top_values, -1, dtype=torch.long)  # (Q, k)
    for doc_start in range(0, inputs.corpus.shape[0], inputs.corpus_chunk_size):
        rows, norms = inputs.corpus_chunk(doc_start)  # (Nc, d) as scored, (Nc,) float64
        for query_start in range(0, queries.shape[0], inputs.query_chunk_size):
            chunk = slice(query_start, query_start + inputs.query_chunk_size)
            if score == "euclidean":  # 2 q·c - |c|²
                block = torch.addmm(-(norms**2).float(), queries[chunk], rows.T, alpha=2)  # (Qc, Nc)
            else:
                block = queries[chunk] @ rows.T  # (Qc, Nc)
            bounds = Bounds(score, inputs.query_norms[chunk], float(norms.max()), rows.shape[1],
                            unit=inputs.product_unit)
            # The k-th best so far, or what the block's own k best guarantee, whichever is higher.
            kth = top_values[chunk, -1].double()
            if block.shape[1] >= k:
                kth = torch.maximum(kth, bounds.lower(block.topk(k, dim=1).values[:, -1]))
            floor = bounds.floor(kth)  # (Qc,)
            candidates = ((block >= floor[:, None]) & (block > -math.inf)).nonzero(as_tuple=True)  # (M,), (M,)
            settle(queries[chunk], rows.__getitem__, candidates, doc_start, score, top_values[chunk],
                   top_indices[chunk])
    return top_values, top_indices
