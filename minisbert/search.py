"""The search the library calls: exact top-k on any embeddings, by the plain loop or a fast path.

`search` offers the choice. Both paths start from the same checked inputs (minisbert/search_inputs.py:
rows near float32's limits, scores that could overflow, ids to leave out) and return the same
top-k, ties included:

- fast=False runs the plain search of minisbert/retrieval.py: score a block, take its top-k,
  merge; the reference the fast paths are tested against.
- fast=True (the default) runs minisbert/fast/retrieval.py, which returns the same top-k with less
  work: for a few queries, a span of the corpus at a time, checked, scored and merged in a few
  calls; for many, it skips most of the plain path's step 2 and, where the CPU multiplies bfloat16
  natively, most of step 1; its docstring says how. On a CUDA device the fast path is
  minisbert/fast/device_search.py: the same three steps, queued for the GPU without waiting on
  it, block after block (the plain loop reads results back to the host at every chunk, to check
  it and to drop excluded pairs), with a corpus in CPU memory copied over while the previous
  chunk is scored.

On a GPU there are two ways to hold a large corpus (see minisbert/fast/device_search.py): on the
GPU in float16, half the memory of float32 (8.8M x 768 takes 13.5 GB): `corpus.half().to("cuda")`;
or in CPU memory, streamed to the GPU chunk by chunk while the previous chunk is scored, fastest
from pinned memory: `corpus = corpus.pin_memory()` once, then `search(..., device="cuda")`. A corpus
in ordinary CPU memory is staged through pinned buffers, one more copy per chunk.

A corpus searched again and again is best prepared once, `prepare_corpus`: its rows are checked
and normalised (cosine) once, and smaller copies are kept beside them for the fast path's screens
on a CPU: a bfloat16 copy where the CPU multiplies bfloat16 natively, for calls of a few queries
or more (half the bytes to read), and for one query an int8 copy (a quarter of the bytes:
minisbert/fast/int8_screen.py). The float32 rows still decide every score. `search` takes it in place of the
embeddings; `.save(path)` writes it and `load_corpus(path)` reads it back, so a corpus encoded
once is searched again without encoding it again:

    corpus = prepare_corpus(model.encode(documents))      # score="cosine"
    corpus.save("corpus.safetensors")
    scores, rows = search(model.encode(["a question"]), load_corpus("corpus.safetensors"), k=10)

Score functions, the tie rule and the loop are described in minisbert/retrieval.py. For euclidean
the tie rule applies to the ranking key 2 q·c - |c|² as computed in float32. Checked against brute
force in tests/test_retrieval.py and tests/test_device_search.py, and for speed against
sentence-transformers `util.semantic_search` and FAISS `IndexFlatIP` in bench/retrieval.py.
"""

from collections.abc import Hashable, Sequence
from pathlib import Path

import numpy as np
import torch

from . import cpu, retrieval
from .fast.int8_screen import int8_product_runs, int8_rows, int8_screen_pays
from .fast.retrieval import fast_search
from .fast.screen import screen_rows
from .search_inputs import DEFAULT_QUERY_CHUNK_SIZE, PreparedCorpus, check_inputs, prepare, read_prepared


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
    bf16_screen: bool | None = None,
    int8_screen: bool | None = None,
    fast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[np.ndarray, np.ndarray]:
    """Exact top-k corpus rows for each query row.

    Args:
        queries: (Q, d) float embeddings (torch tensor or numpy array).
        corpus: (N, d) float embeddings, or a PreparedCorpus (`prepare_corpus`). May be
            float16/bfloat16 (e.g. to halve memory); each chunk is upcast to float32 before
            scoring, so scores are float32 whatever the input.
        k: number of results per query. If k > N the whole corpus is returned, ranked.
        score: "cosine" (the default), "dot" or "euclidean" (see minisbert/retrieval.py). For a
            prepared corpus, the score it was prepared for (another is refused).
        query_chunk_size, corpus_chunk_size: block shape. Only speed and memory depend on them,
            never the results. corpus_chunk_size defaults to 8192 on CPU; on CUDA, 32768 for
            a corpus streamed from CPU memory, and for one on the GPU as many rows as make a
            block of 2^25 scores (at least 32768, at most 512 MB of float32 rows).
        query_ids, corpus_ids: optional ids (any hashable values), one per query and one per
            corpus row. When given, a corpus row whose id equals the query's id is never returned
            for that query (BEIR drops such self-matches), and the next best row takes its place.
        device: where to compute. Defaults to the corpus tensor's device (CPU for numpy). The
            corpus may live elsewhere (e.g. in CPU memory): it is moved chunk by chunk (see the
            module docstring for a large corpus on a GPU).
        bf16_screen: fast path on a CPU only: screen each block with a bfloat16 matrix product
            (see minisbert/fast/retrieval.py). The results are the same either way; only the
            speed differs. None (the default) screens on a CPU with native bfloat16 dot
            products. The search on a CUDA device never screens. (A prepared corpus's int8
            screen for one query is chosen when it is prepared: `prepare_corpus`'s screen.)
        int8_screen: fast path on a CPU, cosine and dot, more queries than read the corpus a
            span at a time: screen each block with an int8 matrix product instead
            (minisbert/fast/int8_screen.py's Int8Blocks), where torch's int8 product is exact.
            None (the default) does so where, measured once per process, it takes well under
            the time of the product it replaces (bfloat16 if bf16_screen, else float32). Results
            never depend on it.
        fast: True (the default) runs minisbert/fast/retrieval.py, False the plain loop of
            minisbert/retrieval.py. Both return the same top-k.

    Returns:
        (scores, indices), each (Q, min(k, N)), best first: float32 scores (distances for
        euclidean, smallest first) and int64 corpus row indices. Ties go to the lower corpus
        index. numpy arrays if both inputs are numpy arrays (or numpy queries and a prepared
        corpus), else torch tensors on `device`.
        Where fewer than min(k, N) rows remain for a query (only possible with ids), the row is
        padded with index -1 and score -inf (+inf distance for euclidean).

    Raises:
        ValueError: unknown score, k < 1, bad chunk sizes, inputs that are not 2-D floating
            point, an empty corpus, mismatched dimensions, a query or corpus row holding NaN or
            inf or too large for float32 (see minisbert/search_inputs.py), ids whose count does
            not match the embeddings, or bf16_screen=True or int8_screen=True with fast=False.
    """
    if not fast:
        for name, value in (("bf16_screen", bf16_screen), ("int8_screen", int8_screen)):
            if value:
                raise ValueError(f"{name}=True needs the fast path; pass fast=True or drop {name}")
        return retrieval.search(queries, corpus, k, score, query_chunk_size, corpus_chunk_size, query_ids,
                                corpus_ids, device)
    inputs = check_inputs(queries, corpus, k, score, query_chunk_size, corpus_chunk_size, query_ids, corpus_ids,
                          device)
    return inputs.results(*fast_search(inputs, bf16_screen, int8_screen))


def prepare_corpus(embeddings: torch.Tensor | np.ndarray, score: str = "cosine",
                   screen: bool | None = None) -> PreparedCorpus:
    """(N, d) embeddings checked once and kept as `score` scores them, for many searches.

    Refuses what `search` refuses (rows holding NaN or inf), with the same messages. screen: keep
    the copies the fast path screens with on a CPU: a bfloat16 copy of the rows (N·d·2 bytes more)
    for searches of several queries, and for cosine and dot an int8 copy (N·(d + 12) bytes more)
    for one query. None (the default) keeps the bfloat16 copy on a CPU that multiplies bfloat16
    natively, and the int8 copy where torch's int8 product is exact and, measured once per
    process, quicker than the float32 one (minisbert/fast/int8_screen.py); True keeps both where
    they run exactly; False neither. Results never depend on it."""
    return _with_screens(prepare(embeddings, score), screen)


def load_corpus(path: str | Path, screen: bool | None = None) -> PreparedCorpus:
    """The prepared corpus `PreparedCorpus.save` wrote to `path`; screen as in `prepare_corpus`."""
    return _with_screens(read_prepared(path), screen)


def _with_screens(prepared: PreparedCorpus, screen: bool | None) -> PreparedCorpus:
    """`prepared` with the screens' copies that `screen` asks for (see `prepare_corpus`)."""
    keep_bfloat16 = prepared.rows.device.type == "cpu" and cpu.native_bfloat16() if screen is None else screen
    if keep_bfloat16:
        prepared.screen = screen_rows(prepared.rows, prepared.norm_terms, prepared.score)
    dim, device = prepared.rows.shape[1], prepared.rows.device
    if screen is not False and prepared.score != "euclidean" and int8_product_runs(dim, device):
        if screen or int8_screen_pays(dim):
            prepared.int8 = int8_rows(prepared.rows)
    return prepared
