"""The BEIR retrieval layout: a corpus, queries, and relevance judgments per split.

Thakur, Reimers, Rücklé, Srivastava and Gurevych 2021, "BEIR: A Heterogeneous Benchmark for
Zero-shot Evaluation of Information Retrieval Models", distribute all their datasets in one layout,
used here for SciFact, for `data/example` and for a converted Q&A CSV (qa_csv.py):

    corpus.jsonl        {"_id": ..., "title": ..., "text": ...} per line
    queries.jsonl       {"_id": ..., "text": ...} per line
    qrels/<split>.tsv   header `query-id corpus-id score`, then one judgment per line

A document's text is `(title + " " + text).strip()`, the string MTEB and sentence-transformers
encode for SciFact; the published NDCG@10 of 0.64508 for all-MiniLM-L6-v2 depends on it.
Checked in tests/datasets/test_datasets.py.
"""

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

from .rows import json_rows, malformed, write_lines
from .trec import read_beir_qrels


@dataclass
class RetrievalData:
    """One split of a retrieval dataset.

    corpus:  document id -> document text (every document, whatever the split)
    queries: query id -> query text, only the queries judged in this split's qrels
    qrels:   query id -> {document id: relevance}, relevance an int (0 = judged not relevant)
    """
    corpus: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def read_beir_corpus(path: str | Path) -> dict[str, str]:
    """corpus.jsonl -> {doc id: (title + " " + text).strip()}; a missing title counts as ""."""
    path = Path(path)
    corpus: dict[str, str] = {}
    for line_number, row in json_rows(path):
        doc_id = _required_id(path, line_number, row)
        title, text = row.get("title") or "", row.get("text")
        if not isinstance(text, str) or not isinstance(title, str):
            raise malformed(path, line_number, f"document {doc_id!r} needs string fields 'text' (and 'title')")
        if doc_id in corpus:
            raise malformed(path, line_number, f"duplicate document id {doc_id!r}")
        corpus[doc_id] = (title + " " + text).strip()
    return corpus


def read_beir_queries(path: str | Path) -> dict[str, str]:
    """queries.jsonl -> {query id: text}, text unchanged."""
    path = Path(path)
    queries: dict[str, str] = {}
    for line_number, row in json_rows(path):
        query_id = _required_id(path, line_number, row)
        if not isinstance(row.get("text"), str):
            raise malformed(path, line_number, f"query {query_id!r} needs a string field 'text'")
        if query_id in queries:
            raise malformed(path, line_number, f"duplicate query id {query_id!r}")
        queries[query_id] = row["text"]
    return queries


def _required_id(path: Path, line_number: int, row: dict) -> str:
    if not isinstance(row.get("_id"), (str, int)):
        raise malformed(path, line_number, "missing '_id'")
    return str(row["_id"])


def load_beir(folder: str | Path, split: str = "test") -> RetrievalData:
    """Read a BEIR-layout folder for one split.

    Qrels naming a query or document that the folder does not have are dropped with a warning
    (warnings.warn), as are queries left with no judgments; the queries kept are those judged in
    `qrels/<split>.tsv`, in the order of queries.jsonl.
    """
    folder = Path(folder)
    qrels_path = folder / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        available = sorted(p.stem for p in (folder / "qrels").glob("*.tsv"))
        raise FileNotFoundError(f"no qrels for split {split!r}: {qrels_path} does not exist "
                                f"(splits found: {available})")
    corpus = read_beir_corpus(folder / "corpus.jsonl")
    all_queries = read_beir_queries(folder / "queries.jsonl")
    qrels = read_beir_qrels(qrels_path)

    dropped = [(q, d) for q, judged in qrels.items() for d in judged if q not in all_queries or d not in corpus]
    if dropped:
        warnings.warn(f"{qrels_path}: dropped {len(dropped)} judgments naming an unknown query or document, "
                      f"e.g. (query, doc) {dropped[:3]}", stacklevel=2)
    qrels = {q: {d: s for d, s in judged.items() if d in corpus}
             for q, judged in qrels.items() if q in all_queries}
    qrels = {q: judged for q, judged in qrels.items() if judged}
    queries = {q: text for q, text in all_queries.items() if q in qrels}
    return RetrievalData(corpus=corpus, queries=queries, qrels={q: qrels[q] for q in queries})


def write_beir(folder: str | Path, corpus: dict[str, str], queries: dict[str, str],
               qrels: dict[str, dict[str, int]], split: str = "test") -> None:
    """Write corpus.jsonl (title ""), queries.jsonl and qrels/<split>.tsv under `folder`."""
    folder = Path(folder)
    write_lines(folder / "corpus.jsonl", (json.dumps({"_id": doc_id, "title": "", "text": text}, ensure_ascii=False)
                                          for doc_id, text in corpus.items()))
    write_lines(folder / "queries.jsonl", (json.dumps({"_id": query_id, "text": text}, ensure_ascii=False)
                                           for query_id, text in queries.items()))
    write_lines(folder / "qrels" / f"{split}.tsv",
                ["query-id\tcorpus-id\tscore"] + [f"{query_id}\t{doc_id}\t{score}"
                                                  for query_id, judged in qrels.items()
                                                  for doc_id, score in judged.items()])
