"""The search the library calls: exact top-k on any embeddings, the plain loop or a faster way.

Every way returns the plain loop's answer (minisbert/search/plain.py says what a score is) bit for bit:
each ends in the same exact rescoring and differs only in how it finds the candidates. `WAYS`
chooses, first match wins, from facts about the call and the machine (an exact and quicker int8
product, measured once per machine: common/machine.py). `way=NAME` or MINISBERT_SEARCH_WAY=NAME forces
one (way="plain": the plain loop); each search logs the way it took, why, and how many queries it
could not prove and left to the plain loop (`WayChoice`). Rows a query leaves out (`query_ids`,
`corpus_ids`: BEIR's self-matches) are dropped after any way (`_without`).

A corpus searched again and again is best prepared once (`prepare_corpus`: checked, unit rows for
cosine, on a CPU an int8 copy to screen a few queries with, held as its `int8_copy`). `load_corpus` checks a saved one's
rows again and their SHA-256, kept in the file's metadata, so a file damaged or edited elsewhere is
refused, naming it:

    corpus = prepare_corpus(model.encode(documents))      # score="cosine"
    corpus.save("corpus.safetensors")
    scores, rows = search(model.encode(["a question"]), load_corpus("corpus.safetensors"), k=10)

On a GPU the "device" way runs (one product and one top-k per block, the exact rescoring and its
proof on the device, one wait for the host: search/fast/device.py); way="device, half", over a prepared cosine
corpus, is the same screened by the corpus's float16 copy on tensor cores (not yet chosen by itself:
its CUDA product has not run on a GPU); a corpus can stay in CPU
memory (`device="cuda"` moves it a chunk at a time). Tested way against way in
tests/search/test_search_property.py, timed beside faiss in bench/retrieval.py.
"""

import contextlib
import logging
import math
import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from . import plain
from ..common.fileio import DIGEST_KEY, check_digest
from .fast import device, spans_blocks as fast, span_product
from .fast.int8_blocks import int8_blocks_exact, int8_blocks_pay
from .fast.int8_rows import int8_product_runs
from .fast.tuning import DEVICE_BLOCK_ENTRIES, FEW_QUERIES, FEW_QUERIES_INT8, SCREENED_FEW_QUERIES, SMALL_CORPUS_ROWS
from .inputs import (CORPUS_FORMAT, DEFAULT_CORPUS_CHUNK_SIZE, DEFAULT_QUERY_CHUNK_SIZE, PreparedCorpus, SearchInputs,
                     as_embedding_matrix, check_arguments, check_inputs, scored_rows)

WAY_VARIABLE = "MINISBERT_SEARCH_WAY"
# Each search logs one INFO line here: the way it took and the facts it chose by (`WayChoice`).
log = logging.getLogger("minisbert.search")  # named for the package a user imports
# Arguments a search no longer takes, and what to pass instead.
REMOVED_ARGUMENTS = {"fast": "way='plain' runs the plain loop (fast=False did); leave way out to choose"}


# Facts about a search (s: its checked inputs) and the machine that the table below reads.
def _on_cpu(s: SearchInputs) -> bool:
    return s.device.type == "cpu"


def _small(s: SearchInputs) -> bool:
    return s.corpus.shape[0] <= SMALL_CORPUS_ROWS and _few(s)


def _int8_copy(s: SearchInputs) -> bool:
    return (_on_cpu(s) and s.prepared is not None and s.prepared.int8_copy is not None
            and int8_product_runs(s.queries.shape[1], s.device, s.queries.shape[0]))


def _screened_few(s: SearchInputs) -> bool:
    num_queries = s.queries.shape[0]
    return (num_queries == 1 or SCREENED_FEW_QUERIES <= num_queries <= FEW_QUERIES_INT8) and _few(s)


def _few(s: SearchInputs) -> bool:
    few = FEW_QUERIES_INT8 if s.queries.shape[0] > FEW_QUERIES_INT8 and _int8_blocks_pay(s) else FEW_QUERIES
    return s.queries.shape[0] <= min(few, s.query_chunk_size)


def _int8_product(s: SearchInputs) -> bool:
    return _on_cpu(s) and s.score != "euclidean" and int8_blocks_exact(s.queries.shape[1])


def _int8_blocks_pay(s: SearchInputs) -> bool:
    return s.score != "euclidean" and int8_blocks_pay(s.queries.shape[1])


def _plain(inputs: SearchInputs):
    """The plain loop, as a way: its values and indices, and no query answered by another."""
    return (*plain.chunked_search(inputs), 0)


def _settled(way):
    """A fast way, its top-K scored exactly (`fast.finish`); the plain loop where that proves nothing (ties)."""
    return _completed(lambda inputs: fast.finish(inputs, *way(inputs)))


def _completed(way):
    """A way that returns exact values, indices and the queries it cannot prove them for; the plain
    loop for those (one wait for the device: `unproved.any()`). Returns the values, the indices and
    how many queries fell back: each is a failure of speed (`WayChoice.fell_back`)."""
    def run(inputs: SearchInputs):
        values, indices, unproved = way(inputs)
        if not unproved.any():
            return values, indices, 0
        rest = replace(inputs, queries=inputs.queries[unproved], query_norms=inputs.query_norms[unproved])
        values[unproved], indices[unproved] = plain.chunked_search(rest)  # the same search for those queries
        return values, indices, int(unproved.sum())
    return run


# The ways, first match wins. A forced way runs where "can run" holds, else it is refused.
WAYS = (
    # name               can run          taken when          runs
    ("plain",            lambda s: True,  lambda s: False,    _plain),
    # Never chosen until bench/gpu.py has run it on a GPU (its CUDA product is untried): way= forces it.
    ("device, half",     device.half_screen_runs, lambda s: False, _completed(device.search_device_half)),
    ("device",           lambda s: True,  lambda s: not _on_cpu(s), _completed(device.search_device)),
    ("one span",         _on_cpu,         _small,             _settled(partial(fast.search_spans, one_span=True))),
    ("spans, int8",      _int8_copy,      _screened_few,      _settled(partial(fast.search_spans, screen=True))),
    ("spans",            _on_cpu,         _few,               _settled(fast.search_spans)),
    ("blocks, int8",     _int8_product,   _int8_blocks_pay,   _settled(partial(fast.search_blocks, screen=True))),
    ("blocks",           _on_cpu,         lambda s: True,     _settled(fast.search_blocks)),
)
WAY_NAMES = tuple(name for name, *_ in WAYS)


@dataclass(frozen=True)
class WayChoice:
    """The way a search took, and what it was chosen by: forced, or the ways of WAYS before it,
    each passed over because it cannot run here or is not taken for these inputs."""

    name: str
    forced: bool
    passed_over: tuple  # ((way, "cannot run" or "not taken"), ...) in the order of WAYS
    facts: str  # the inputs the table read: queries, rows, dimension, score, corpus form, device
    fell_back: int | None = None  # once the search ran: queries the way could not prove, answered by the plain loop

    def __str__(self):
        how = "forced" if self.forced else "chosen; passed over: " + (
            ", ".join(f"{name} ({why})" for name, why in self.passed_over) or "none")
        fell_back = "" if not self.fell_back else f"; {self.fell_back:,} queries fell back to the plain loop"
        return f"way {self.name!r} ({how}) for {self.facts}{fell_back}"


def choose_way(inputs: SearchInputs, forced: str | None = None) -> str:
    """`forced` (or MINISBERT_SEARCH_WAY) if it can run, else the first of WAYS that can run and is taken."""
    return explain_way(inputs, forced).name


def explain_way(inputs: SearchInputs, forced: str | None = None) -> WayChoice:
    """`choose_way`'s choice with the facts it was made by (`WayChoice`)."""
    # Where a forced way came from, for the error that names it: the argument, or the variable.
    source, remedy = "", "leave way out"
    if not forced and os.environ.get(WAY_VARIABLE):
        forced, source, remedy = os.environ[WAY_VARIABLE], f" (from {WAY_VARIABLE})", f"unset {WAY_VARIABLE}"
    forced = forced or None
    passed_over = []
    for name, can_run, taken, _ in WAYS:
        if name == forced:
            if not can_run(inputs):
                raise ValueError(f"the search way {forced!r}{source} cannot run here (a CPU, an exact int8 product, "
                                 "prepare_corpus(..., screen=True), its query count, or a prepared cosine corpus on the "
                                 "device with float16 products summed in float32 is missing: on a GPU "
                                 "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False); "
                                 f"{remedy}")
            return WayChoice(name, True, (), _facts(inputs))
        if forced is None:
            runs = can_run(inputs)
            if runs and taken(inputs):
                return WayChoice(name, False, tuple(passed_over), _facts(inputs))
            passed_over.append((name, "not taken" if runs else "cannot run"))
    raise ValueError(f"unknown search way {forced!r}{source}; choose one of {list(WAY_NAMES)}, or {remedy}")


def _facts(s: SearchInputs) -> str:
    (num_queries, dim), num_docs = s.queries.shape, s.corpus.shape[0]
    if s.prepared is None:
        form = f"rows as given ({str(s.corpus.dtype).removeprefix('torch.')})"
    else:
        form = "a prepared corpus" + (" with its int8 copy" if s.prepared.int8_copy is not None else "")
    products = "" if not s.product_unit else f", products of inputs rounded by 2^{math.log2(s.product_unit):.0f} (torch's setting)"
    return f"{num_queries:,} queries, {num_docs:,} rows of d = {dim}, {s.score}, {form}, on {s.device}{products}"


class _Collected(logging.Handler):
    """Keeps each `WayChoice` logged while it is attached (`recorded_ways`)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.choices = []

    def emit(self, record: logging.LogRecord) -> None:
        self.choices.append(record.msg)


@contextlib.contextmanager
def recorded_ways():
    """Collect the `WayChoice` of every search made inside the `with` block (what evaluate.py
    --verbose and bench/retrieval.py print): a list, filled as the searches run."""
    handler, level = _Collected(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler.choices
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def search(queries, corpus, k: int, score: str | None = None, query_chunk_size: int = DEFAULT_QUERY_CHUNK_SIZE,
           corpus_chunk_size: int | None = None, query_ids=None, corpus_ids=None, device=None, way: str | None = None,
           return_way: bool = False, **removed):
    """Exact top-k corpus rows for each query row.

    Args:
        queries: (Q, d) float embeddings (torch tensor or numpy array), of any floating dtype.
        corpus: (N, d) float embeddings, or a `PreparedCorpus`. Both are rounded to float32 first
            (float16, bfloat16 exactly; float64 to the nearest float32), and the search is of those
            float32 rows: their checks, norms, unit rows and scores (search/plain.py).
        k: results per query (an int, numpy's too); with k > N the whole corpus, ranked.
        score: "cosine" (the default), "dot" or "euclidean" (search/plain.py); a prepared corpus's own.
        query_chunk_size, corpus_chunk_size: block shape (default 1024 x 8192, on a GPU up to 1 GB): speed, memory.
        query_ids, corpus_ids: one id per query and per corpus row; a row whose id equals the query's
            is never returned for it (BEIR drops such self-matches), the next best takes its place.
        device: where to compute; defaults to the corpus tensor's device (CPU for numpy).
        way: one of WAY_NAMES to force it ("plain": the plain loop; results never depend on it); None
            chooses (`WAYS`), as MINISBERT_SEARCH_WAY=NAME forces where way is None. Each search logs
            the way it took and the facts it chose by (`WayChoice`) to the "minisbert.search" logger.
        return_way: also return that `WayChoice` (its `name`, why, and how many queries fell back).

    Returns:
        (scores, indices), each (Q, min(k, N)), best first: float32 scores (distances for euclidean,
        smallest first) and int64 row indices, equal scores by lower index; -1 and -inf (+inf
        distance) where ids left fewer rows. numpy arrays for numpy queries and a numpy or prepared
        corpus, else torch tensors on `device`. With return_way, (scores, indices, WayChoice).

    Raises:
        ValueError: an unknown score or way, k < 1, bad chunk sizes, inputs not 2-D floating point, an
            empty corpus, mismatched dimensions, a row not finite in float32, scores past float32, bad ids,
            an argument search no longer takes (`REMOVED_ARGUMENTS`: fast=), naming what replaces it.
    """
    for name in removed:
        if name not in REMOVED_ARGUMENTS:
            raise TypeError(f"search() got an unexpected keyword argument {name!r}")
        raise ValueError(f"search() no longer takes {name}=: {REMOVED_ARGUMENTS[name]}")
    span_product.refuse_removed_variable()  # on every path, not only where a span product runs
    inputs = check_inputs(queries, corpus, k, score, query_chunk_size, corpus_chunk_size, device)
    excluded = _excluded_pairs(query_ids, corpus_ids, inputs.queries.shape[0], inputs.corpus.shape[0], inputs.device)
    k = inputs.k
    if excluded is not None:  # search past the rows to leave out, then drop them (`_without`)
        most = int(excluded[:, 0].bincount().max()) if excluded.numel() else 0
        inputs = replace(inputs, k=min(k + most, inputs.corpus.shape[0]))
    choice = explain_way(inputs, way)
    name = choice.name
    if name.startswith("device") and corpus_chunk_size is None:  # a device's blocks: up to DEVICE_BLOCK_ENTRIES scores
        rows = max(1, min(inputs.query_chunk_size, inputs.queries.shape[0]))
        inputs = replace(inputs, corpus_chunk_size=max(DEFAULT_CORPUS_CHUNK_SIZE, DEVICE_BLOCK_ENTRIES // rows))
    values, indices, fell_back = next(run for way_name, _, _, run in WAYS if way_name == name)(inputs)
    choice = replace(choice, fell_back=fell_back)
    log.info(choice)
    if excluded is not None:
        values, indices = _without(excluded, values, indices, k, inputs.corpus.shape[0])
    return (*inputs.results(values, indices), choice) if return_way else inputs.results(values, indices)


def _excluded_pairs(query_ids: Sequence[Hashable] | None, corpus_ids: Sequence[Hashable] | None, num_queries: int,
                   num_docs: int, device: torch.device) -> torch.Tensor | None:
    """(P, 2) [query row, corpus row] pairs whose ids are equal, or None without ids."""
    if query_ids is None and corpus_ids is None:
        return None
    if query_ids is None or corpus_ids is None:
        raise ValueError("pass both query_ids and corpus_ids, or neither")
    query_ids, corpus_ids = _id_values(query_ids, "query_ids"), _id_values(corpus_ids, "corpus_ids")
    if len(query_ids) != num_queries or len(corpus_ids) != num_docs:
        raise ValueError(f"got {len(query_ids)} query_ids for {num_queries} queries and {len(corpus_ids)} "
                         f"corpus_ids for {num_docs} corpus rows; pass one id per row")
    rows_of_query_id: dict[Hashable, list[int]] = {}
    for row, query_id in enumerate(query_ids):
        rows_of_query_id.setdefault(query_id, []).append(row)
    pairs = [(query_row, doc_row) for doc_row, doc_id in enumerate(corpus_ids)
             for query_row in rows_of_query_id.get(doc_id, ())]
    return torch.tensor(pairs, dtype=torch.long, device=device).reshape(-1, 2)


def _id_values(ids, name: str) -> list:
    """The ids as values that compare as they read: a tensor's or a numpy array's elements (and 0-d
    tensors or numpy scalars in a list) become Python numbers; a tensor element compares by identity,
    so left as it is, no row would ever match. Anything else unhashable is refused, naming it."""
    if hasattr(ids, "tolist") and hasattr(ids, "ndim"):  # a torch tensor or a numpy array
        if ids.ndim != 1:
            raise ValueError(f"{name} must hold one id per row (a 1-D sequence); got shape {tuple(ids.shape)}")
        return ids.tolist()
    values = []
    for position, value in enumerate(ids):
        if hasattr(value, "item") and hasattr(value, "ndim"):  # a 0-d tensor or a numpy scalar
            if value.ndim != 0:
                raise ValueError(f"{name}[{position}] holds {tuple(value.shape)} values, not one id")
            value = value.item()
        try:
            hash(value)
        except TypeError:
            raise ValueError(f"{name}[{position}] is a {type(value).__name__}, which cannot be an id; pass "
                             "strings or integers") from None
        values.append(value)
    return values


def _without(excluded: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, k: int, num_docs: int):
    """The (Q, k) first of the (Q, K) values and indices (best first) that are not (P, 2) `excluded`
    [query row, corpus row] pairs; -inf and -1 where fewer are left. Since a query leaves out at most
    K - k rows, these are its top k among the rows it keeps, ties as ever."""
    rows = torch.arange(indices.shape[0], device=indices.device)[:, None]  # (Q, 1)
    dropped = torch.isin(rows * num_docs + indices, excluded[:, 0] * num_docs + excluded[:, 1]) & (indices >= 0)
    order = dropped.to(torch.int32).argsort(dim=1, stable=True)[:, :k]  # kept entries first, in their order
    values, indices, dropped = values.gather(1, order), indices.gather(1, order), dropped.gather(1, order)
    return values.masked_fill(dropped, -math.inf), indices.masked_fill(dropped, -1)


# Formats 1 and 2 kept other norm terms ("sizes", "norm_terms"); their rows are read, the norms made again.
OLD_FORMATS = ("minisbert prepared corpus 1", "minisbert prepared corpus 2", "minisbert prepared corpus 3")
# A unit row rounded to float32 has a norm within d·2^-24 of 1 (each entry moves by 2^-24 of itself);
# rows that formats 1 and 2 divided in float32 by float32 norms, within 2·d·2^-24. Twice that is allowed.
UNIT_SLACK = 4 * 2.0**-24


def prepare_corpus(embeddings, score: str = "cosine", screen: bool | None = None) -> PreparedCorpus:
    """(N, d) embeddings checked once (refused where `search` refuses them) and kept as `score` scores
    them. screen: keep the int8 copy that screens a few queries on a CPU (cosine, dot; N·(d + 12)
    bytes): None where torch's int8 product is exact and pays (measured once per machine), True where
    it is exact, False never. Results never depend on it."""
    corpus = as_embedding_matrix(embeddings, "corpus")
    check_arguments(corpus[:0], corpus, 1, score, 1, None)
    rows = torch.empty(corpus.shape, device=corpus.device)  # filled a piece at a time: no second copy
    norms = torch.empty(corpus.shape[0], dtype=torch.float64, device=corpus.device)
    for start in range(0, corpus.shape[0], DEFAULT_CORPUS_CHUNK_SIZE):
        piece = slice(start, start + DEFAULT_CORPUS_CHUNK_SIZE)
        rows[piece], norms[piece] = scored_rows(corpus[piece], score, "corpus", start)
    return PreparedCorpus(rows, norms, score, fast.int8_copy(rows, score, screen))


def load_corpus(path: str | Path, screen: bool | None = None) -> PreparedCorpus:
    """The corpus `PreparedCorpus.save` wrote to `path`, each row checked as `prepare_corpus` checks it:
    finite, a unit row (or zero) for cosine, its norm as saved. screen: as in prepare_corpus."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as opened:
            metadata, tensors = opened.metadata() or {}, {name: opened.get_tensor(name) for name in opened.keys()}
    except FileNotFoundError as error:
        raise ValueError(f"{path}: no such file") from error
    except (OSError, SafetensorError) as error:
        raise ValueError(f"{path}: not a prepared corpus file ({'a folder' if path.is_dir() else error})") from error
    score, rows = metadata.get("score"), tensors.get("rows")
    if metadata.get("format") not in (CORPUS_FORMAT, *OLD_FORMATS) or score not in ("cosine", "dot", "euclidean"):
        raise ValueError(f"{path}: not a prepared corpus file (metadata {metadata}); write one with "
                         "minisbert.search.prepare_corpus(...).save(path)")
    if rows is None or rows.ndim != 2 or rows.dtype != torch.float32 or rows.shape[0] == 0:
        raise ValueError(f"{path}: a prepared corpus needs 'rows', a non-empty (N, d) float32 matrix; got "
                         f"{ {name: (tuple(t.shape), str(t.dtype)) for name, t in tensors.items()} }")
    damaged = "the file was damaged or edited after it was saved"
    try:  # the rows as they are: row_norms of them, finite and within float32
        _, norms = scored_rows(rows, "dot" if score == "cosine" else score, f"{path}: corpus", 0)
    except ValueError as error:
        raise ValueError(f"{error}; {damaged}") from None
    if score == "cosine" and (bad := ((norms - 1).abs() > UNIT_SLACK * rows.shape[1]) & (norms != 0)).any():
        row = int(bad.nonzero()[0])
        raise ValueError(f"{path}: row {row} has norm {float(norms[row]):.9g}, not 1: a cosine corpus holds unit "
                         f"rows; {damaged}")
    saved = tensors.get("norms", torch.empty(0))  # `PreparedCorpus.save` writes the rows' float64 norms
    if metadata["format"] in (CORPUS_FORMAT, OLD_FORMATS[-1]) and not (saved.dtype == torch.float64 and
                                                                     torch.equal(saved, norms)):
        raise ValueError(f"{path}: its 'norms' ({saved.dtype}) do not match its rows' float64 norms; {damaged}")
    if metadata["format"] == CORPUS_FORMAT and metadata.get(DIGEST_KEY) is None:
        raise ValueError(f"{path}: a prepared corpus of format {CORPUS_FORMAT!r} without its SHA-256; {damaged}")
    check_digest(path, metadata, tensors)
    return PreparedCorpus(rows, norms, score, fast.int8_copy(rows, score, screen))
