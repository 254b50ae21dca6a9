"""The inputs of an exact top-k search, checked and made ready to score.

The plain search (minisbert/retrieval.py) and the fast one (minisbert/fast/retrieval.py) both start
from a `SearchInputs` and end with its `results`, so they accept, refuse and return exactly the
same things. A corpus searched many times can be checked and made ready once: a `PreparedCorpus`
holds its rows as they are scored (unit rows for cosine) and their norm terms, and is saved and loaded
whole (minisbert/search.py: `prepare_corpus`, `load_corpus`).

A row's norm term is what its score needs of its norm: the norm |c| for cosine (which divides by
it) and dot (whose overflow bound uses it), the squared norm |c|² for euclidean, whose ranking key
2 q·c - |c|² holds it. The squared norm is summed from the squares, not squared from the norm, so
that it is exact for rows of small integers.

What is checked here, for the queries and the corpus alike:

- each is a 2-D floating-point torch tensor or numpy array, of the same dimension; k and the chunk
  sizes are positive integers; ids, if given, are one per row;
- every row holds only finite numbers and its norm (its squared norm for euclidean, which the
  distance needs) is finite in float32;
- for dot and euclidean, no score can overflow float32: |q·c| <= |q| |c| and |q - c|² <= (|q| + |c|)²
  (Cauchy-Schwarz), so the largest query norm and the largest corpus norm bound every score. Cosine
  scores lie in [-1, 1].

An input that fails gets a ValueError naming the input and the row. The corpus is checked chunk by
chunk as it is scored: here by `SearchInputs.corpus_chunk`, which reads each chunk's outcome back
to the host, and on a GPU by minisbert/fast/device_search.py, which keeps it on the device and
reads it once at the end; both raise through `not_finite_error` and `check_scores_fit`, so the
messages are the same. (The CPU fast path's few-query dot product checks a span by a detector row
instead, and a span that fails is checked here: minisbert/fast/retrieval.py.) A prepared corpus was
checked when it was prepared; a search over it checks only the queries, and the score bound
against its largest row. Tested through every search in tests/test_retrieval.py and
tests/test_device_search.py.
"""

import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from .fileio import atomic_write
from .similarity import row_norms, squared_row_norms

if TYPE_CHECKING:
    from .fast.int8_screen import Int8Rows

SCORE_FUNCTIONS = ("cosine", "dot", "euclidean")

# Measured on a 2-core AVX-512 CPU. Each block costs one matrix product plus a few dozen small
# tensor operations, several of which start worker threads. Narrow blocks make the product a
# little faster on an idle machine (1000 x 384 by 384 x 2048: 93 GFLOP/s a core, x 8192: 89),
# but on a machine busy with other work every thread start can wait for a free core, and then
# fewer, wider blocks win by far (with 2 threads under load: x 2048: 49 GFLOP/s, x 8192: 76).
# (1024, 8192) float32 blocks, 32 MB, balance the two.
DEFAULT_QUERY_CHUNK_SIZE = 1024
DEFAULT_CORPUS_CHUNK_SIZE = 8192
# On a GPU each chunk costs a few dozen kernel launches, about 0.5 ms in all (and no host
# synchronisation: see minisbert/fast/device_search.py), so fewer, wider chunks are better. A
# corpus on the GPU is read in chunks of CUDA_BLOCK_ENTRIES // Qc rows, at least 32768, so a
# (Qc, Nc) block holds 2^25 entries: 128 MB of float32 scores and 256 MB of int64 keys. A chunk's
# rows take at most CUDA_CHUNK_BYTES in float32. Measured on an H200 (2026-11-26), one query over
# 1,000,000 x 384 rows: 16.3 ms in 32768-row chunks, 3.3 ms in one chunk. A corpus streamed from
# CPU memory keeps 32768-row chunks (not measured: its copies take longer than the launches, and
# its two pinned staging buffers stay small).
DEFAULT_CUDA_CORPUS_CHUNK_SIZE = 32768
CUDA_BLOCK_ENTRIES = 2**25
CUDA_CHUNK_BYTES = 2**29
# Cosine divides by max(|v|, TINY): a zero vector scores 0 instead of NaN.
TINY = torch.finfo(torch.float32).tiny
# The largest score allowed, with a factor 2 to spare for the rounding of the float32 sums.
LARGEST_SCORE = torch.finfo(torch.float32).max / 2


@dataclass
class PreparedCorpus:
    """A corpus checked once and kept as the search scores it (see `prepare`)."""

    rows: torch.Tensor  # (N, d) float32 rows as scored: unit rows for cosine
    norm_terms: torch.Tensor  # (N,) float32: squared norms for euclidean, else the rows' norms as given
    score: str  # the score function the rows were prepared for
    screen: torch.Tensor | None = None  # (N, d') bfloat16 copy for the fast path's screen, if kept
    int8: "Int8Rows | None" = None  # int8 copy for a one-query search's screen, if kept

    @cached_property
    def largest_norm_term(self) -> tuple[int, float]:
        """(row, norm term) of the first row with the largest norm term: every search over the
        corpus checks its score bound with it, so it is found once (a pass over the N norm terms
        costs a few percent of a one-query search)."""
        return _largest(self.norm_terms)

    def save(self, path: str | Path) -> None:
        """Write the rows, norm terms and score function to one safetensors file, atomically. The
        screens' copies are not saved: `load_corpus` makes them again, one pass over the rows."""
        metadata = {"format": CORPUS_FORMAT, "score": self.score}
        tensors = {"rows": self.rows.contiguous().cpu(), "norm_terms": self.norm_terms.contiguous().cpu()}
        atomic_write(Path(path), lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


CORPUS_FORMAT = "minisbert prepared corpus 2"
# Format 1 named the norm terms "sizes"; its files are read as they are.
OLD_FORMATS = {"minisbert prepared corpus 1": "sizes"}


def prepare(embeddings: torch.Tensor | np.ndarray, score: str) -> PreparedCorpus:
    """Check every row of (N, d) `embeddings` once and keep them as `score` scores them; refuses
    what a search would refuse, with the same messages. Without a screen (see minisbert/search.py)."""
    corpus = _as_embedding_matrix(embeddings, "corpus")
    _check_arguments(corpus[:0], corpus, 1, score, 1, None)
    rows = torch.empty(corpus.shape, dtype=torch.float32, device=corpus.device)  # (N, d)
    norm_terms = torch.empty(corpus.shape[0], dtype=torch.float32, device=corpus.device)  # (N,)
    for start in range(0, corpus.shape[0], DEFAULT_CORPUS_CHUNK_SIZE):
        end = start + DEFAULT_CORPUS_CHUNK_SIZE
        rows[start:end], norm_terms[start:end] = scored_rows(corpus[start:end].to(torch.float32), score, start)
    return PreparedCorpus(rows, norm_terms, score)


def scored_rows(chunk: torch.Tensor, score: str, start: int, largest_query: tuple[int, float] | None = None,
                out: torch.Tensor | None = None, unit: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The (n, d) float32 rows of `chunk`, numbered from `start`, checked (`checked_norm_terms`) and as
    `score` scores them: unit rows for cosine (written into `out` if given; with unit=False the rows
    as they are, to be divided by `unit_divisors` later), else as they are; and their (n,) norm terms."""
    norm_terms, _ = checked_norm_terms(chunk, score, "corpus", start, largest_query)  # (n,)
    if score == "cosine" and unit:
        out = None if out is None else out[: chunk.shape[0]]
        chunk = torch.div(chunk, unit_divisors(norm_terms), out=out)
    return chunk, norm_terms


def unit_divisors(norms: torch.Tensor) -> torch.Tensor:
    """(n, 1) what cosine divides rows with (n,) `norms` by to make them unit rows: max(|c|, TINY)."""
    return norms.clamp_min(TINY)[:, None]


def read_prepared(path: str | Path) -> PreparedCorpus:
    """The PreparedCorpus `PreparedCorpus.save` wrote to `path` (without its screen)."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as opened:
            metadata = opened.metadata() or {}
        tensors = load_file(str(path))
    except FileNotFoundError as error:
        raise ValueError(f"{path}: no such file") from error
    except (OSError, SafetensorError) as error:
        raise ValueError(f"{path}: not a prepared corpus file ({error})") from error
    norm_key = "norm_terms" if metadata.get("format") == CORPUS_FORMAT else OLD_FORMATS.get(metadata.get("format"))
    if norm_key is None or metadata.get("score") not in SCORE_FUNCTIONS:
        raise ValueError(f"{path}: not a prepared corpus file (metadata {json.dumps(metadata)}); write one "
                         "with minisbert.search.prepare_corpus(...).save(path)")
    rows, norm_terms = tensors.get("rows"), tensors.get(norm_key)
    if rows is None or norm_terms is None or rows.ndim != 2 or norm_terms.shape != rows.shape[:1]:
        raise ValueError(f"{path}: a prepared corpus needs 'rows' (N, d) and '{norm_key}' (N,), got "
                         f"{ {name: tuple(t.shape) for name, t in tensors.items()} }")
    return PreparedCorpus(rows, norm_terms, metadata["score"])


@dataclass
class SearchInputs:
    """One search, checked: what `check_inputs` returns."""

    queries: torch.Tensor  # (Q, d) float32 on `device`; unit rows for cosine
    query_norm_terms: torch.Tensor  # (Q,) float32 squared norms for euclidean, else norms (as given)
    corpus: torch.Tensor  # (N, d) as given: any floating dtype, any device; read chunk by chunk
    k: int  # results per query: min(k asked for, N)
    score: str
    query_chunk_size: int
    corpus_chunk_size: int
    excluded: torch.Tensor | None  # (P, 2) [query row, corpus row] pairs never to return
    device: torch.device
    return_numpy: bool  # both inputs were numpy arrays
    prepared: PreparedCorpus | None = None  # the corpus as prepared, when it was (corpus = its rows)
    # (row, norm term) of the query with the largest norm term, for the score bound of dot and euclidean;
    # None where no bound applies (cosine, or no queries).
    largest_query_norm_term: tuple[int, float] | None = None

    def corpus_chunk(
        self, doc_start: int, out: torch.Tensor | None = None, size: int | None = None, unit: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The corpus chunk of `size` rows (default corpus_chunk_size) starting at row
        `doc_start`, checked: (Nc, d) float32 rows on the device, as they are scored (unit rows
        for cosine, written into `out` if given; unit=False leaves them undivided: see
        `scored_rows`), and their (Nc,) norm terms: squared norms for euclidean (the ranking key
        needs them), else norms. A prepared corpus's are read as kept."""
        end = doc_start + (size or self.corpus_chunk_size)
        if self.prepared is not None:
            prepared = self.prepared
            return prepared.rows[doc_start:end].to(self.device), prepared.norm_terms[doc_start:end].to(self.device)
        chunk = self.corpus[doc_start:end].to(device=self.device, dtype=torch.float32)  # (Nc, d)
        return scored_rows(chunk, self.score, doc_start, self.largest_query_norm_term, out, unit)

    def results(
        self, top_scores: torch.Tensor, top_indices: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | tuple[np.ndarray, np.ndarray]:
        """Turn the running (Q, k) top-k (ranking keys 2 q·c - |c|² for euclidean) into what
        `search` returns: distances for euclidean, numpy arrays for numpy inputs."""
        if self.score == "euclidean":
            squared = self.query_norm_terms[:, None] - top_scores  # (Q, k) |q|² - 2 q·c + |c|²
            # The square root is taken in float64 and rounded to float32, which gives the
            # correctly rounded float32 root (53 >= 2·24 + 2 bits: the double rounding is
            # harmless) on every device: torch's float32 sqrt on CUDA is not correctly rounded
            # (on an H200 it differed from the CPU's in 0.6% of 10^7 random floats).
            top_scores = squared.clamp_min(0).double().sqrt().float()
        if self.return_numpy:
            return top_scores.cpu().numpy(), top_indices.cpu().numpy()
        return top_scores, top_indices


def check_inputs(
    queries: torch.Tensor | np.ndarray,
    corpus: torch.Tensor | np.ndarray,
    k: int,
    score: str,
    query_chunk_size: int,
    corpus_chunk_size: int | None,
    query_ids: Sequence[Hashable] | None,
    corpus_ids: Sequence[Hashable] | None,
    device: str | torch.device | None,
) -> SearchInputs:
    """Check the arguments of `minisbert.search.search` (see there) and the queries, and
    prepare them. Corpus rows are checked chunk by chunk, by `SearchInputs.corpus_chunk`."""
    prepared = corpus if isinstance(corpus, PreparedCorpus) else None
    if prepared is not None:
        if score is not None and score != prepared.score:
            raise ValueError(f"the corpus was prepared for score={prepared.score!r}, not {score!r}; prepare it "
                             f"again for {score!r}, or leave score out")
        score, corpus = prepared.score, prepared.rows
    elif score is None:
        score = "cosine"
    return_numpy = isinstance(queries, np.ndarray) and (prepared is not None or isinstance(corpus, np.ndarray))
    queries = _as_embedding_matrix(queries, "queries")
    corpus = _as_embedding_matrix(corpus, "corpus")
    _check_arguments(queries, corpus, k, score, query_chunk_size, corpus_chunk_size)
    device = torch.device(device) if device is not None else corpus.device
    if corpus_chunk_size is None:
        corpus_chunk_size = default_corpus_chunk_size(
            queries.shape[0], corpus.shape[1], corpus.device, query_chunk_size, device
        )

    queries = queries.to(device=device, dtype=torch.float32)  # (Q, d)
    query_norm_terms = row_norm_terms(queries, score)  # (Q,)
    check_finite_rows(query_norm_terms, "queries", 0)
    largest_query = _largest(query_norm_terms) if score != "cosine" and queries.shape[0] > 0 else None
    if score == "cosine":
        queries = queries / query_norm_terms.clamp_min(TINY)[:, None]
    elif prepared is not None and largest_query is not None:  # checked against the prepared rows once
        check_scores_fit(score, *largest_query, *prepared.largest_norm_term)
    return SearchInputs(
        queries=queries,
        query_norm_terms=query_norm_terms,
        corpus=corpus,
        k=min(k, corpus.shape[0]),
        score=score,
        query_chunk_size=query_chunk_size,
        corpus_chunk_size=corpus_chunk_size,
        excluded=_excluded_pairs(query_ids, corpus_ids, queries.shape[0], corpus.shape[0], device),
        device=device,
        return_numpy=return_numpy,
        prepared=prepared,
        largest_query_norm_term=largest_query,
    )


def default_corpus_chunk_size(
    num_queries: int, dim: int, corpus_device: torch.device, query_chunk_size: int, device: torch.device
) -> int:
    """Rows per corpus chunk when the caller gives none (see DEFAULT_CUDA_CORPUS_CHUNK_SIZE), for
    `num_queries` queries and a corpus of `dim` columns stored on `corpus_device`, searched on
    `device`."""
    if device.type != "cuda":
        return DEFAULT_CORPUS_CHUNK_SIZE
    if corpus_device.type != "cuda":
        return DEFAULT_CUDA_CORPUS_CHUNK_SIZE
    query_rows = max(1, min(num_queries, query_chunk_size))
    widest = CUDA_CHUNK_BYTES // (4 * max(1, dim))
    return max(DEFAULT_CUDA_CORPUS_CHUNK_SIZE, min(CUDA_BLOCK_ENTRIES // query_rows, widest))


def _largest(norm_terms: torch.Tensor) -> tuple[int, float]:
    """(row, norm term) of the first largest of the (n,) norm terms."""
    row = int(norm_terms.argmax())
    return row, float(norm_terms[row])


def row_norm_terms(matrix: torch.Tensor, score: str) -> torch.Tensor:
    """(n,) what each score function needs of a row: its squared norm for euclidean, else its
    norm. NaN or inf exactly when the row holds a NaN or an inf, or is too large for float32."""
    return squared_row_norms(matrix) if score == "euclidean" else row_norms(matrix)


def checked_norm_terms(
    chunk: torch.Tensor, score: str, name: str, start: int, largest_query: tuple[int, float] | None = None
) -> tuple[torch.Tensor, bool]:
    """(n,) norm terms of the (n, d) float32 rows of `chunk` (see `row_norm_terms`), numbered from `start`,
    after checking them: every norm term finite and, given the (row, norm term) of the largest query, no
    score beyond float32's range; and whether every norm came out in float32's comfortable range
    (no row so small or so large that its squares underflow or overflow: see `row_norms`). One
    reduction and one read in the usual case; the rows that need care are found after."""
    norm_terms = quick_norm_terms(chunk, score)
    ordinary = norm_terms_are_ordinary(norm_terms, score)
    if not ordinary:
        norm_terms = row_norm_terms(chunk, score)
        check_finite_rows(norm_terms, name, start)
    if largest_query is not None and norm_terms.numel():
        largest = float(norm_terms.max())
        if score_bound(score, largest_query[1], largest) > LARGEST_SCORE:
            check_scores_fit(score, largest_query[0], largest_query[1], start + int(norm_terms.argmax()), largest)
    return norm_terms, ordinary


def quick_norm_terms(rows: torch.Tensor, score: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """`row_norm_terms` in one pass, right for every row that `norm_terms_are_ordinary` passes."""
    if score == "euclidean":
        return squared_row_norms(rows, out=out)
    return torch.linalg.vector_norm(rows, dim=1, out=out)


def norm_terms_are_ordinary(
    norm_terms: torch.Tensor, score: str, largest_query: tuple[int, float] | None = None
) -> bool:
    """Whether the (n,) norm terms from `quick_norm_terms` need no second look: all finite, no norm so small
    that its squares may have underflowed (below 2^-60), and, given the (row, norm term) of the largest
    query, no score that could pass float32's range. One reduction and one read."""
    if norm_terms.numel() == 0:
        return True
    smallest, largest = (float(value) for value in torch.aminmax(norm_terms))
    # Written so that a NaN fails the test too.
    ordinary = largest < float("inf") and (score == "euclidean" or smallest >= 2.0**-60)
    if largest_query is not None and ordinary:
        ordinary = score_bound(score, largest_query[1], largest) <= LARGEST_SCORE
    return ordinary


def check_finite_rows(norm_terms: torch.Tensor, name: str, start: int) -> None:
    """Raise naming the first of the (n,) rows, numbered from `start`, whose norm term is NaN or inf."""
    finite = torch.isfinite(norm_terms)  # (n,)
    if not finite.all():
        raise not_finite_error(name, start + int(finite.logical_not().nonzero()[0]))


def not_finite_error(name: str, row: int) -> ValueError:
    """The error for row `row` of `name` ("queries" or "corpus"), whose norm term is NaN or inf."""
    return ValueError(
        f"{name} row {row} contains NaN or inf, or values too large for float32; embed it "
        f"again or drop it"
    )


def check_scores_fit(
    score: str, query_row: int, query_term: float, doc_row: int, doc_term: float
) -> None:
    """Raise if the query row and the corpus row with the largest norm terms (norms, or squared norms
    for euclidean; see `row_norm_terms`) could score beyond float32. Plain numbers, read from the
    device by the caller: `SearchInputs.corpus_chunk` reads them chunk by chunk, the device
    search (minisbert/fast/device_search.py) all at once at the end."""
    if score_bound(score, query_term, doc_term) > LARGEST_SCORE:
        query_norm, doc_norm = (query_term**0.5, doc_term**0.5) if score == "euclidean" else (query_term, doc_term)
        raise ValueError(
            f"queries row {query_row} (norm {query_norm:.3g}) and corpus row {doc_row} "
            f"(norm {doc_norm:.3g}) may score beyond float32 with score={score!r}; scale the "
            f"embeddings down or use score='cosine'"
        )


def score_bound(score: str, query_term: float, doc_term: float) -> float:
    """The largest |score| a query and a row of these norm terms (see `row_norm_terms`) can have."""
    if score == "euclidean":
        return (query_term**0.5 + doc_term**0.5) ** 2
    return query_term * doc_term


def drop_excluded(
    block: torch.Tensor, excluded: torch.Tensor, query_start: int, doc_start: int, fill: float = -torch.inf
) -> None:
    """Set the excluded (query, corpus) entries that fall in this (Qc, Nc) block to -inf (or `fill`),
    in place."""
    query_rows = excluded[:, 0] - query_start
    doc_rows = excluded[:, 1] - doc_start
    inside = (query_rows >= 0) & (query_rows < block.shape[0])
    inside &= (doc_rows >= 0) & (doc_rows < block.shape[1])
    block[query_rows[inside], doc_rows[inside]] = fill


def _excluded_pairs(
    query_ids: Sequence[Hashable] | None,
    corpus_ids: Sequence[Hashable] | None,
    num_queries: int,
    num_docs: int,
    device: torch.device,
) -> torch.Tensor | None:
    """(P, 2) [query row, corpus row] pairs whose ids are equal, or None without ids."""
    if query_ids is None and corpus_ids is None:
        return None
    if query_ids is None or corpus_ids is None:
        raise ValueError("pass both query_ids and corpus_ids, or neither")
    if len(query_ids) != num_queries or len(corpus_ids) != num_docs:
        raise ValueError(
            f"got {len(query_ids)} query_ids for {num_queries} queries and {len(corpus_ids)} "
            f"corpus_ids for {num_docs} corpus rows; pass one id per row"
        )
    rows_of_query_id: dict[Hashable, list[int]] = {}
    for row, query_id in enumerate(query_ids):
        rows_of_query_id.setdefault(query_id, []).append(row)
    pairs = [
        (query_row, doc_row)
        for doc_row, doc_id in enumerate(corpus_ids)
        for query_row in rows_of_query_id.get(doc_id, ())
    ]
    return torch.tensor(pairs, dtype=torch.long, device=device).reshape(-1, 2)


def _as_embedding_matrix(embeddings: torch.Tensor | np.ndarray, name: str) -> torch.Tensor:
    if isinstance(embeddings, np.ndarray):
        embeddings = torch.from_numpy(embeddings)
    if not isinstance(embeddings, torch.Tensor):
        raise ValueError(
            f"{name} must be a torch tensor or numpy array, got {type(embeddings).__name__}"
        )
    if embeddings.ndim != 2:
        raise ValueError(
            f"{name} must be 2-D (rows, dim), got shape {tuple(embeddings.shape)}; "
            f"for a single vector pass v[None, :]"
        )
    if not embeddings.is_floating_point():
        raise ValueError(f"{name} must be floating point, got {embeddings.dtype}")
    return embeddings


def _check_arguments(
    queries: torch.Tensor,
    corpus: torch.Tensor,
    k: int,
    score: str,
    query_chunk_size: int,
    corpus_chunk_size: int | None,
) -> None:
    if score not in SCORE_FUNCTIONS:
        raise ValueError(f"unknown score {score!r}; choose one of {', '.join(SCORE_FUNCTIONS)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    chunk_sizes = {"query_chunk_size": query_chunk_size, "corpus_chunk_size": corpus_chunk_size}
    for name, size in chunk_sizes.items():
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"{name} must be a positive integer, got {size!r}")
    if corpus.shape[0] == 0:
        raise ValueError("corpus is empty: there is nothing to search")
    if queries.shape[1] != corpus.shape[1]:
        raise ValueError(
            f"queries have dimension {queries.shape[1]} but corpus has dimension "
            f"{corpus.shape[1]}; embed both with the same model"
        )
    if corpus.shape[1] == 0:
        raise ValueError("embeddings have dimension 0")
