"""What the plain search (search/plain.py) and its fast ways (minisbert/fast/) share: the inputs'
checks and the step that decides every result: candidates scored exactly and ranked (`settle` in
the plain loop, `exact_top_k` at the end of every fast way). The error bounds are in search/bounds.py.

Checks (`check_inputs`, and each corpus chunk as it is read): 2-D floating-point inputs of one
dimension; k and the chunk sizes positive integers; every row, rounded to float32 (`scored_rows`),
finite, its norm (squared for euclidean) within float32; for dot and euclidean no score beyond
float32 (|q·c| <= |q| |c|, |q - c|² <= (|q| + |c|)²). A failure raises a ValueError naming the input
and the row.
"""

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..common.fileio import write_safetensors
from .bounds import UNIT_NORM, product_unit
from ..common.similarity import array_as_tensor, exact_scores, row_norms, unit_rows

SCORE_FUNCTIONS = ("cosine", "dot", "euclidean")
DEFAULT_QUERY_CHUNK_SIZE = 1024  # a (1024, 8192) float32 block is 32 MB
DEFAULT_CORPUS_CHUNK_SIZE = 8192
LARGEST_SCORE = torch.finfo(torch.float32).max / 2  # a factor 2 to spare for rounding
SETTLE_PIECE = 1024  # candidates scored exactly at once: 3 MB of float64 for d = 384, kept in the cache
CORPUS_FORMAT = "minisbert prepared corpus 4"  # what `PreparedCorpus.save` writes (search/ways.py's `load_corpus` reads it)


@dataclass(eq=False)
class PreparedCorpus:
    """A corpus checked once and kept as the search scores it (minisbert/search/ways.py: `prepare_corpus`),
    with the fast copies a search may screen it with."""

    rows: torch.Tensor  # (N, d) float32 rows as scored: unit rows (`unit_rows`) for cosine
    norms: torch.Tensor  # (N,) float64 norms of those rows (`row_norms`)
    score: str
    int8_copy: object = None  # search/fast/int8_rows.py's Int8Rows of the rows, where it screens a few queries here
    largest_norm: float | None = None  # the rows' largest norm, measured at the first device search
    half_copy: object = None  # search/fast/device.py's HalfRows (float16 rows), made at the first "device, half" search

    def __repr__(self) -> str:
        """What the corpus holds and the copies a search may screen it with here (not its numbers)."""
        copies = [name for name, copy in (("int8", self.int8_copy), ("float16", self.half_copy)) if copy is not None]
        return (f"PreparedCorpus({self.rows.shape[0]:,} rows of d = {self.rows.shape[1]}, score={self.score!r}, "
                f"on {self.rows.device}, screening copies: {', '.join(copies) or 'none'})")

    def save(self, path) -> None:
        """Write the rows, their norms, the score and the tensors' SHA-256 (which `load_corpus`
        checks) to one safetensors file, atomically. The fast copies are not written: they are made
        again from the rows (`load_corpus`, the first device search), so no file can carry a copy that
        disagrees with them."""
        tensors = {"rows": self.rows.contiguous().cpu(), "norms": self.norms.contiguous().cpu()}
        write_safetensors(Path(path), tensors, {"format": CORPUS_FORMAT, "score": self.score})


def scored_rows(chunk: torch.Tensor, score: str, name: str, start: int,
                bounded: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunk`'s (n, d) rows rounded to float32, checked, as `score` scores them (unit rows for cosine),
    and their float64 norms. The rows searched are the float32 ones, whatever dtype was given: every
    check, norm, unit row and score is of them (a float64 entry beyond float32's range rounds to inf).
    bounded: for cosine, a bound on each unit row's norm (search/bounds.py's UNIT_NORM; 0 for a zero
    row) rather than the norm itself: all a search needs of them (its error bounds), one sum fewer."""
    chunk = chunk.to(torch.float32)  # (n, d)
    norms = row_norms(chunk)  # (n,) float64, inf or NaN only for a row holding inf or NaN
    fits = norms <= torch.finfo(torch.float32).max ** (0.5 if score == "euclidean" else 1.0)  # False for NaN too
    if not fits.all():
        row = start + int(fits.logical_not().nonzero()[0])
        raise ValueError(f"{name} row {row} contains NaN or inf, or values too large for float32; embed it "
                         "again or drop it")
    if score == "cosine":
        chunk = unit_rows(chunk, norms)
        norms = (norms > 0).to(norms.dtype) * UNIT_NORM if bounded else row_norms(chunk)  # float64, as the norms
    return chunk, norms


@dataclass(frozen=True)
class SearchInputs:
    """One search, checked: what `check_inputs` returns. Never changed after the checks: a search
    that needs other values (more results, other blocks) makes a new one (`dataclasses.replace`)."""

    queries: torch.Tensor  # (Q, d) float32 on `device`, as scored (unit rows for cosine)
    query_norms: torch.Tensor  # (Q,) float64 norms of those rows (for cosine bounds on them: `scored_rows`)
    corpus: torch.Tensor  # (N, d) as given (any floating dtype and device), or a prepared corpus's rows
    k: int  # results per query: min(k asked for, N)
    score: str
    query_chunk_size: int
    corpus_chunk_size: int
    device: torch.device
    return_numpy: bool  # both inputs were numpy arrays
    prepared: PreparedCorpus | None = None
    product_unit: float = 0.0  # how far torch's products here may round each input (search/bounds.py's `product_unit`)

    def corpus_chunk(self, start: int, size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows start to start + size (default corpus_chunk_size) as scored and checked, and their norms
        (of rows as given for cosine, bounds on them: `scored_rows`)."""
        end = start + (size or self.corpus_chunk_size)
        if self.prepared is not None:
            return self.prepared.rows[start:end].to(self.device), self.prepared.norms[start:end].to(self.device)
        rows, norms = scored_rows(self.corpus[start:end].to(self.device), self.score, "corpus", start, bounded=True)
        self.check_scores_fit(norms, start)
        return rows, norms

    def rows_as_scored(self, indices: torch.Tensor) -> torch.Tensor:
        """(M, d) float32 corpus rows `indices` as the contract scores them: a prepared corpus's, or rows
        as given rounded to float32 (unit rows for cosine, as `scored_rows` makes them)."""
        rows = self.corpus.index_select(0, indices.to(self.corpus.device)).to(self.device, torch.float32)
        return unit_rows(rows) if self.score == "cosine" and self.prepared is None else rows

    def check_scores_fit(self, norms: torch.Tensor, start: int) -> None:
        """Raise if the largest query and any of these (n,) corpus norms could score beyond float32, naming
        the first such corpus row (the same row whatever the chunks, so every way names it)."""
        if self.score == "cosine" or self.queries.shape[0] == 0 or norms.numel() == 0:
            return
        query_row = int(self.query_norms.argmax())
        query_norm = float(self.query_norms[query_row])
        bounds = (query_norm + norms) ** 2 if self.score == "euclidean" else query_norm * norms  # (n,)
        beyond = bounds > LARGEST_SCORE  # (n,)
        if beyond.any():
            doc_row = int(beyond.nonzero()[0])
            doc_norm = float(norms[doc_row])
            raise ValueError(f"queries row {query_row} (norm {query_norm:.3g}) and corpus row {start + doc_row} "
                             f"(norm {doc_norm:.3g}) may score beyond float32 with score={self.score!r}; scale "
                             "the embeddings down or use score='cosine'")

    def results(self, values: torch.Tensor, indices: torch.Tensor):
        """What `search` returns: distances for euclidean (the values are their negatives), numpy for numpy inputs."""
        scores = -values if self.score == "euclidean" else values
        return (scores.cpu().numpy(), indices.cpu().numpy()) if self.return_numpy else (scores, indices)


def check_inputs(queries, corpus, k, score, query_chunk_size, corpus_chunk_size, device) -> SearchInputs:
    """The arguments of `minisbert.search.search`, checked (the corpus as it is read: `corpus_chunk`)."""
    prepared = corpus if isinstance(corpus, PreparedCorpus) else None
    if prepared is not None:
        if score is not None and score != prepared.score:
            raise ValueError(f"the corpus was prepared for score={prepared.score!r}, not {score!r}; prepare it "
                             f"again for {score!r}, or leave score out")
        score, corpus = prepared.score, prepared.rows
    score = score or "cosine"
    return_numpy = isinstance(queries, np.ndarray) and (prepared is not None or isinstance(corpus, np.ndarray))
    queries, corpus = as_embedding_matrix(queries, "queries"), as_embedding_matrix(corpus, "corpus")
    check_arguments(queries, corpus, k, score, query_chunk_size, corpus_chunk_size)
    device = torch.device(device) if device is not None else corpus.device
    queries, query_norms = scored_rows(queries.to(device), score, "queries", 0, bounded=True)
    inputs = SearchInputs(queries, query_norms, corpus, min(int(k), corpus.shape[0]), score, int(query_chunk_size),
                          int(corpus_chunk_size or DEFAULT_CORPUS_CHUNK_SIZE), device, return_numpy, prepared,
                          product_unit(device))
    if prepared is not None:
        inputs.check_scores_fit(prepared.norms, 0)
    return inputs


def settle(queries: torch.Tensor, doc_rows, candidates: tuple, doc_start: int, score: str,
           top_values: torch.Tensor, top_indices: torch.Tensor) -> None:
    """Score the candidates ((M,) query rows, ascending; (M,) chunk rows, given by doc_rows as scored) exactly
    and merge them into the (Qc, k) top-k, in place, SETTLE_PIECE at a time (bounded however many tie)."""
    rows, columns = candidates
    values = torch.empty(rows.shape, device=rows.device)  # (M,)
    for start in range(0, rows.numel(), SETTLE_PIECE):
        piece = slice(start, start + SETTLE_PIECE)
        values[piece] = exact_scores(queries.index_select(0, rows[piece]), doc_rows(columns[piece]), score)
    merge_candidates(-values if score == "euclidean" else values, candidates, doc_start, top_values, top_indices)


def exact_top_k(queries: torch.Tensor, doc_rows, columns: torch.Tensor, score: str, k: int, piece: int,
                padded: bool = False):
    """The (Q, k) exact values (negated distances for euclidean) and corpus rows, best first, of each
    query's candidates, (Q, K) corpus `columns` given by doc_rows as scored; equal values by lower
    row. `padded`: columns may hold -1 (fewer candidates), which come last as -inf. The candidates of
    all Q queries are scored about `piece` pairs at a time (at least one each), so memory stays
    bounded at any K; no step reads a value back (a GPU's search waits for nothing here)."""
    columns = columns.sort(dim=1).values  # (Q, K) ascending: a stable sort by value keeps equal ones in row order
    missing = columns < 0 if padded else None
    queries = queries.double()[:, None, :]  # (Q, 1, d)
    width = max(1, piece // max(1, columns.shape[0]))  # candidates of each query scored at once
    parts = [_exact_part(queries, doc_rows, part.clamp_min(0) if padded else part, score)
             for part in columns.split(width, dim=1)]
    values = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)  # (Q, K)
    if score == "euclidean":
        values = -values
    if missing is not None:
        values = values.masked_fill(missing, -math.inf)
    # + 0.0 makes -0.0 equal to 0.0 for every sort (a radix sort tells them apart); the values keep their sign.
    order = (values + 0.0).sort(dim=1, descending=True, stable=True).indices[:, :k]  # (Q, k)
    return values.gather(1, order), columns.gather(1, order)


def _exact_part(queries: torch.Tensor, doc_rows, columns: torch.Tensor, score: str) -> torch.Tensor:
    """(Q, w) exact scores of the (Q, 1, d) float64 queries with their (Q, w) corpus rows."""
    docs = doc_rows(columns.flatten()).unflatten(0, columns.shape)  # (Q, w, d)
    return exact_scores(queries.expand_as(docs), docs, score)  # each query's row read w times


def merge_candidates(values: torch.Tensor, candidates: tuple, doc_start: int, top_values: torch.Tensor,
                     top_indices: torch.Tensor) -> None:
    """Merge (M,) values (larger is better) at (M,) query rows (ascending) and chunk rows into a (Qc, k) top-k."""
    rows, columns = candidates
    if rows.numel() == 0:
        return
    # Lay the candidates out as a padded (A, width) matrix, one line per query row that has any.
    active, line, per_line = torch.unique_consecutive(rows, return_inverse=True, return_counts=True)
    slot = torch.arange(rows.numel(), device=rows.device) - (per_line.cumsum(0) - per_line)[line]
    new_values = torch.full((active.numel(), int(per_line.max())), -math.inf, device=rows.device)
    new_indices = torch.full_like(new_values, -1, dtype=torch.long)
    new_values[line, slot], new_indices[line, slot] = values, columns + doc_start
    top_values[active], top_indices[active] = merge_top_k(top_values[active], top_indices[active], new_values,
                                                          new_indices, top_values.shape[1])


def merge_top_k(scores, indices, other_scores, other_indices, k: int, largest: bool = True):
    """Two top-k lists of the same queries, (Q, a) and (Q, b) scores and indices, in any order (shards), merged into
    (Q, min(k, a + b)), best first (largest=False: smallest), ties by lower index; padding (-1, -inf/+inf) last."""
    scores = torch.cat([scores, other_scores], dim=1)  # (Q, a + b)
    indices = torch.cat([indices, other_indices], dim=1)
    # Index order first (padding, -1, last), then a stable sort by score keeps it among equals.
    by_index = torch.where(indices < 0, torch.iinfo(torch.long).max, indices).argsort(dim=1, stable=True)
    scores, indices = scores.gather(1, by_index), indices.gather(1, by_index)
    by_score = scores.argsort(dim=1, descending=largest, stable=True)[:, :k]  # (Q, k)
    return scores.gather(1, by_score), indices.gather(1, by_score)


def as_embedding_matrix(embeddings, name: str) -> torch.Tensor:
    """`embeddings` as a detached torch tensor, checked to be a 2-D floating-point matrix. A numpy array
    of any byte order and strides is taken (torch reads only native order and non-negative strides:
    such an array is copied to one it reads, the same values); any other, read-only ones too, is read in place."""
    if isinstance(embeddings, np.ndarray):
        embeddings = array_as_tensor(embeddings)
    if not isinstance(embeddings, torch.Tensor):
        raise ValueError(f"{name} must be a torch tensor or numpy array, got {type(embeddings).__name__}")
    if embeddings.device.type == "meta":
        raise ValueError(f"{name} is on the meta device: it has a shape but no values to search; "
                         "move it to a real device (or load its values) first")
    if embeddings.ndim != 2 or not embeddings.is_floating_point():
        raise ValueError(f"{name} must be a 2-D (rows, dim) floating-point matrix, got shape "
                         f"{tuple(embeddings.shape)} {embeddings.dtype}; for a single vector pass v[None, :]")
    return embeddings.detach()  # not differentiable: scores are computed again, exactly, and indices picked


def check_arguments(queries, corpus, k, score, query_chunk_size, corpus_chunk_size) -> None:
    if score not in SCORE_FUNCTIONS:
        raise ValueError(f"unknown score {score!r}; choose one of {', '.join(SCORE_FUNCTIONS)}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    for name, size in {"query_chunk_size": query_chunk_size, "corpus_chunk_size": corpus_chunk_size}.items():
        if size is not None and (isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1):
            raise ValueError(f"{name} must be a positive integer, got {size!r}")
    if corpus.shape[0] == 0:
        raise ValueError("corpus is empty: there is nothing to search")
    if queries.shape[1] != corpus.shape[1]:
        raise ValueError(f"queries have dimension {queries.shape[1]} but corpus has dimension {corpus.shape[1]}; "
                         "embed both with the same model")
    if corpus.shape[1] == 0:
        raise ValueError("embeddings have dimension 0")
