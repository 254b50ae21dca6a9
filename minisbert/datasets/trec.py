"""TREC run files and qrels: every file of rankings or relevance judgments minisbert reads or writes.

    run file     `qid Q0 docid rank score tag`, one line per ranked document (what trec_eval reads;
                 evaluate.py writes one per model and scores one with --run)
    TREC qrels   `qid iteration docid relevance` (trec_eval's judgments; MS MARCO's qrels.*.tsv,
                 tab- or space-separated)
    BEIR qrels   `query-id \\t corpus-id \\t score` after that header line (a BEIR folder's qrels/<split>.tsv)

A run reads into {qid: {docid: score}} and qrels into {qid: {docid: relevance}}, the shapes
evaluation/metrics.py scores. A run is written ranked as trec_eval will rank it (metrics.rank_by_score,
ties="trec"), whole or not at all (fileio.atomic_write). Checked in tests/evaluation/test_metrics.py and
tests/datasets/test_datasets.py.
"""

import math
from collections.abc import Hashable, Iterable, Mapping
from pathlib import Path

from ..common.fileio import atomic_write
from ..evaluation.metrics import rank_by_score
from .rows import lines, malformed, number, tab_rows


def read_qrels(path: Path) -> dict:
    """TREC qrels, or BEIR's tab-separated qrels recognised by their `query-id` header."""
    first_line = next((text for _, text in lines(Path(path))), "")  # a byte-order mark dropped
    if first_line.startswith("query-id"):
        return read_beir_qrels(path)
    return read_trec_qrels(path)


def read_beir_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """qrels/<split>.tsv -> {query id: {doc id: int score}}. The header line
    `query-id corpus-id score` is skipped when present; a repeated (query, doc) pair is an error."""
    path = Path(path)
    qrels: dict[str, dict[str, int]] = {}
    for line_number, fields in tab_rows(path):
        if line_number == 1 and fields[:2] == ["query-id", "corpus-id"]:
            continue
        if len(fields) != 3:
            raise malformed(path, line_number, "expected 3 tab-separated fields (query-id, corpus-id, score), "
                                               f"found {len(fields)}")
        query_id, doc_id, score = fields
        judged = qrels.setdefault(query_id, {})
        if doc_id in judged:
            raise malformed(path, line_number, f"query {query_id!r} judges document {doc_id!r} twice")
        judged[doc_id] = number(path, line_number, score, int, "score")
    return qrels


def read_trec_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """TREC qrels `qid iteration docid relevance` (MS MARCO's qrels.*.tsv, tab- or space-separated)
    -> {qid: {docid: relevance}}; the iteration column is ignored."""
    path = Path(path)
    qrels: dict[str, dict[str, int]] = {}
    for line_number, line in lines(path):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 4:
            raise malformed(path, line_number,
                            f"expected 4 fields (qid, iteration, docid, relevance), found {len(fields)}")
        query_id, _, doc_id, relevance = fields
        judged = qrels.setdefault(query_id, {})
        if doc_id in judged:
            raise malformed(path, line_number, f"query {query_id!r} judges document {doc_id!r} twice")
        judged[doc_id] = number(path, line_number, relevance, int, "relevance")
    return qrels


def read_trec_run(path: str | Path) -> dict[str, dict[str, float]]:
    """Read a TREC run file, lines `qid Q0 docid rank score tag`, into {qid: {docid: score}}.

    The rank column is checked to be an integer but otherwise ignored, as trec_eval ignores it:
    rank with `rank_by_score(..., ties="trec")` to get trec_eval's order.
    """
    run: dict[str, dict[str, float]] = {}
    for line_number, fields in _fields(path, 6, "qid Q0 docid rank score tag"):
        query_id, _, doc_id, rank, score, _ = fields
        _parse(int, rank, "rank", path, line_number)
        results = run.setdefault(query_id, {})
        if doc_id in results:
            raise ValueError(
                f"{path}:{line_number}: document {doc_id!r} appears twice for query {query_id!r}"
            )
        results[doc_id] = _parse(float, score, "score", path, line_number)
    return run


def write_trec_run(
    path: str | Path, run: Mapping[Hashable, Mapping[Hashable, float]], tag: str = "minisbert"
) -> None:
    """Write {qid: {docid: score}} as a TREC run file, ranked as trec_eval will rank it (score
    descending, ties by doc id descending), with ranks starting at 1."""
    if not tag or any(c.isspace() for c in tag):
        raise ValueError(f"run tag must be a non-empty word without spaces, got {tag!r}")

    def write(tmp: Path):
        with open(tmp, "w", encoding="utf-8") as file:
            for query_id, scores in run.items():
                if not isinstance(scores, Mapping):  # a TREC run line holds a score
                    raise ValueError(f"query {query_id!r}: a run to write maps doc ids to scores, got a "
                                     f"{type(scores).__name__}")
                for rank, doc_id in enumerate(rank_by_score(scores, ties="trec"), start=1):
                    for name, value in (("query id", query_id), ("doc id", doc_id)):
                        if not str(value) or any(c.isspace() for c in str(value)):
                            raise ValueError(
                                f"{name} {value!r} cannot be written to a TREC file: it is empty "
                                f"or has spaces"
                            )
                    file.write(f"{query_id} Q0 {doc_id} {rank} {float(scores[doc_id])!r} {tag}\n")

    atomic_write(Path(path), write)  # whole or not at all: a failure leaves no partial run file


def _fields(path: str | Path, count: int, layout: str) -> Iterable[tuple[int, list[str]]]:
    """(line number, its `count` whitespace-separated fields) of each non-blank line, read as every
    dataset file is (datasets/rows.py's `lines`: a byte-order mark dropped, .gz decompressed)."""
    for line_number, line in lines(Path(path)):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != count:
            raise ValueError(
                f"{path}:{line_number}: expected {count} fields '{layout}', got "
                f"{len(fields)}: {line.strip()!r}"
            )
        yield line_number, fields


def _parse(kind: type, text: str, name: str, path: str | Path, line_number: int):
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(
            f"{path}:{line_number}: {name} {text!r} is not a valid {kind.__name__}"
        ) from None
    if kind is float and not math.isfinite(value):
        raise ValueError(f"{path}:{line_number}: {name} {text!r} is not finite")
    return value
