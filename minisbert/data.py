"""Reading the datasets Sentence-BERT is trained and evaluated on, and finding them on disk.

Every reader returns plain Python values (dicts, lists, small dataclasses) and raises ValueError
naming the file and line for a malformed line, so a bad file is fixed in minutes.

Formats read here:

- BEIR retrieval layout (Thakur et al. 2021), used for SciFact and for `data/example`:
  `corpus.jsonl` ({"_id", "title", "text"} per line), `queries.jsonl` ({"_id", "text"}),
  `qrels/<split>.tsv` (header `query-id corpus-id score`). A document's text is
  `(title + " " + text).strip()`, the string MTEB and sentence-transformers encode for SciFact; the
  published NDCG@10 of 0.64508 for all-MiniLM-L6-v2 depends on it.
- Scored sentence pairs: STS benchmark (`sts-{train,dev,test}.csv` or sentence-transformers'
  `stsbenchmark.tsv.gz`, gold 0..5) and SICK (`SICK_{train,trial,test_annotated}.txt`, relatedness
  1..5 plus an entailment label). MTEB's SICK-R scores all 9,927 pairs (4,500 + 500 + 4,927).
- MS MARCO: `collection.tsv` (pid, passage), `queries.*.tsv` (qid, text), TREC qrels
  (`qid 0 pid rel`), sentence-transformers' hard-negatives jsonl(.gz) and cross-encoder scores
  (seed 000 keeps a negative only if its score is at least `margin` = 3 below the positive's).
- Quora duplicate questions (`id qid1 qid2 question1 question2 is_duplicate`).
- This project's training files: `pairs.tsv` (sentence1, sentence2, score in [0, 1]) and
  `triplets.tsv` (anchor, positive, negative).
- A question/answer CSV turned into BEIR layout, optionally with sampled negative answers (seed 003).

Tab-separated files are split on tabs line by line, with no CSV quoting: some STS benchmark
sentences begin with a double quote that never closes, and a CSV reader then swallows the following
lines into one field (Python's csv module finds 1,119 of the 1,379 test pairs). Blank lines are
skipped everywhere. Files ending in `.gz` are decompressed on the fly.

Named datasets (`scifact`, `stsb`, `sick`) are looked for in this order (see `resolve_dataset`):
a folder the caller names, then `data/<name>/` in this repository, then `<MINISBERT_DATA_MIRROR>/<name>/`,
then, where a network exists, a download from the canonical source into `data/<name>/`.
"""

import csv
import gzip
import hashlib
import json
import os
import pickle
import shutil
import urllib.error
import urllib.request
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from minisbert import lexical

REPO_DATA = Path(__file__).resolve().parent.parent / "data"
MIRROR_ENV = "MINISBERT_DATA_MIRROR"  # a folder holding scifact/, stsb/, sick/ (tests use ../shared/data)
DOWNLOAD_URL_ENV = "MINISBERT_DOWNLOAD_URL"  # replaces every source's base URL (a local mirror, tests)


# ----------------------------------------------------------------------------- what readers return

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


@dataclass(frozen=True)
class ScoredPair:
    """Two sentences and a gold score on the dataset's own scale (`to_unit_score` maps it to [0, 1]).
    `label` is SICK's entailment judgment, None elsewhere."""
    sentence1: str
    sentence2: str
    score: float
    label: str | None = None


@dataclass(frozen=True)
class Triplet:
    anchor: str
    positive: str
    negative: str


@dataclass(frozen=True)
class DuplicateQuestions:
    """One row of the Quora duplicate-questions file."""
    qid1: str
    qid2: str
    question1: str
    question2: str
    is_duplicate: int


@dataclass
class HardNegatives:
    """One line of sentence-transformers' msmarco-hard-negatives file: a query, its positive
    passages and, for each retrieval system that mined them, that system's negative passages."""
    qid: str
    positives: list[str]
    negatives: dict[str, list[str]] = field(default_factory=dict)


# ----------------------------------------------------------------------------- reading lines

def _open_text(path: Path):
    # newline="\n": only "\n" ends a line, so a stray "\r" or control character inside a sentence
    # cannot split a row in two; a trailing "\r" (SICK's test file has CRLF endings) is dropped later.
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", newline="\n")
    return open(path, encoding="utf-8", newline="\n")


def _tab_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(1-based line number, fields split on tabs) for every non-blank line."""
    with _open_text(path) as lines:
        for line_number, line in enumerate(lines, start=1):
            line = line.rstrip("\r\n")
            if line.strip():
                yield line_number, line.split("\t")


def _malformed(path: Path, line_number: int, problem: str) -> ValueError:
    return ValueError(f"{path}, line {line_number}: {problem}; fix or remove that line")


def _number(path: Path, line_number: int, text: str, kind: type, what: str):
    try:
        return kind(text)
    except ValueError:
        expected = "an integer" if kind is int else "a number"
        raise _malformed(path, line_number, f"{what} {text!r} is not {expected}") from None


def _json_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """(1-based line number, JSON object) for every non-blank line of a .jsonl(.gz) file."""
    with _open_text(path) as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise _malformed(path, line_number, f"not valid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise _malformed(path, line_number, "expected a JSON object {...}")
            yield line_number, row


# ----------------------------------------------------------------------------- BEIR layout

def read_beir_corpus(path: str | Path) -> dict[str, str]:
    """corpus.jsonl -> {doc id: (title + " " + text).strip()}; a missing title counts as ""."""
    path = Path(path)
    corpus: dict[str, str] = {}
    for line_number, row in _json_rows(path):
        doc_id = _required_id(path, line_number, row)
        title, text = row.get("title") or "", row.get("text")
        if not isinstance(text, str) or not isinstance(title, str):
            raise _malformed(path, line_number, f"document {doc_id!r} needs string fields 'text' (and 'title')")
        if doc_id in corpus:
            raise _malformed(path, line_number, f"duplicate document id {doc_id!r}")
        corpus[doc_id] = (title + " " + text).strip()
    return corpus


def read_beir_queries(path: str | Path) -> dict[str, str]:
    """queries.jsonl -> {query id: text}, text unchanged."""
    path = Path(path)
    queries: dict[str, str] = {}
    for line_number, row in _json_rows(path):
        query_id = _required_id(path, line_number, row)
        if not isinstance(row.get("text"), str):
            raise _malformed(path, line_number, f"query {query_id!r} needs a string field 'text'")
        if query_id in queries:
            raise _malformed(path, line_number, f"duplicate query id {query_id!r}")
        queries[query_id] = row["text"]
    return queries


def _required_id(path: Path, line_number: int, row: dict) -> str:
    if not isinstance(row.get("_id"), (str, int)):
        raise _malformed(path, line_number, "missing '_id'")
    return str(row["_id"])


def read_beir_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """qrels/<split>.tsv -> {query id: {doc id: int score}}. The header line
    `query-id corpus-id score` is skipped when present; a repeated (query, doc) pair is an error."""
    path = Path(path)
    qrels: dict[str, dict[str, int]] = {}
    for line_number, fields in _tab_rows(path):
        if line_number == 1 and fields[:2] == ["query-id", "corpus-id"]:
            continue
        if len(fields) != 3:
            raise _malformed(path, line_number, "expected 3 tab-separated fields (query-id, corpus-id, score), "
                                                f"found {len(fields)}")
        query_id, doc_id, score = fields
        judged = qrels.setdefault(query_id, {})
        if doc_id in judged:
            raise _malformed(path, line_number, f"query {query_id!r} judges document {doc_id!r} twice")
        judged[doc_id] = _number(path, line_number, score, int, "score")
    return qrels


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
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as out:
        for doc_id, text in corpus.items():
            out.write(json.dumps({"_id": doc_id, "title": "", "text": text}, ensure_ascii=False) + "\n")
    with open(folder / "queries.jsonl", "w", encoding="utf-8") as out:
        for query_id, text in queries.items():
            out.write(json.dumps({"_id": query_id, "text": text}, ensure_ascii=False) + "\n")
    with open(folder / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as out:
        out.write("query-id\tcorpus-id\tscore\n")
        for query_id, judged in qrels.items():
            for doc_id, score in judged.items():
                out.write(f"{query_id}\t{doc_id}\t{score}\n")


# ----------------------------------------------------------------------------- STS benchmark, SICK

STSB_SPLITS = ("train", "dev", "test")
SICK_FILES = {"train": "SICK_train.txt", "trial": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
SICK_SPLITS = ("train", "trial", "dev", "test", "all")  # "dev" is "trial"; "all" is train + trial + test
ENTAILMENT_LABELS = ("CONTRADICTION", "ENTAILMENT", "NEUTRAL")  # a label's id is its index here
SCORE_RANGES = {"stsb": (0.0, 5.0), "sick": (1.0, 5.0)}  # (lowest, highest) gold score
_STSB_GZ_HEADER = ["split", "genre", "dataset", "year", "sid", "score", "sentence1", "sentence2"]


def to_unit_score(dataset: str, score: float) -> float:
    """Gold score -> [0, 1]: STS-B s / 5, SICK (s - 1) / 4."""
    low, high = SCORE_RANGES[dataset]
    return (score - low) / (high - low)


def read_stsb(folder: str | Path, split: str) -> list[ScoredPair]:
    """STS benchmark pairs of one split, raw gold scores 0..5.

    Reads `sts-<split>.csv` (the original release: column 5 score, 6 and 7 the sentences, 1-based;
    some rows carry two extra source columns, ignored) or, failing that, sentence-transformers'
    `stsbenchmark.tsv.gz` (header split/genre/dataset/year/sid/score/sentence1/sentence2).
    """
    if split not in STSB_SPLITS:
        raise ValueError(f"unknown STS benchmark split {split!r}; choose one of {STSB_SPLITS}")
    folder = Path(folder)
    original = folder / f"sts-{split}.csv"
    if original.is_file():
        return [_stsb_pair(original, n, fields, score_at=4) for n, fields in _tab_rows(original)]
    packed = folder / "stsbenchmark.tsv.gz"
    if packed.is_file():
        pairs = []
        for line_number, fields in _tab_rows(packed):
            if line_number == 1:
                if fields != _STSB_GZ_HEADER:
                    raise _malformed(packed, 1, f"expected the header {_STSB_GZ_HEADER}")
            elif fields and fields[0] == split:
                pairs.append(_stsb_pair(packed, line_number, fields, score_at=5))
        return pairs
    raise FileNotFoundError(f"{folder} has neither sts-{split}.csv nor stsbenchmark.tsv.gz")


def _stsb_pair(path: Path, line_number: int, fields: list[str], score_at: int) -> ScoredPair:
    if len(fields) < score_at + 3:
        raise _malformed(path, line_number,
                         f"expected at least {score_at + 3} tab-separated fields, found {len(fields)}")
    score = _number(path, line_number, fields[score_at], float, "score")
    return ScoredPair(fields[score_at + 1], fields[score_at + 2], score)


def read_sick(folder: str | Path, split: str) -> list[ScoredPair]:
    """SICK pairs with raw relatedness 1..5 and the entailment label; `split="all"` concatenates
    train, trial and test (9,927 pairs, what MTEB's SICK-R scores)."""
    if split not in SICK_SPLITS:
        raise ValueError(f"unknown SICK split {split!r}; choose one of {SICK_SPLITS}")
    if split == "all":
        return [pair for part in ("train", "trial", "test") for pair in read_sick(folder, part)]
    path = Path(folder) / SICK_FILES["trial" if split == "dev" else split]
    header = ["pair_ID", "sentence_A", "sentence_B", "relatedness_score", "entailment_judgment"]
    pairs = []
    for line_number, fields in _tab_rows(path):
        if line_number == 1:
            if fields != header:
                raise _malformed(path, 1, f"expected the header {header}")
            continue
        if len(fields) != 5:
            raise _malformed(path, line_number, f"expected 5 tab-separated fields, found {len(fields)}")
        score = _number(path, line_number, fields[3], float, "relatedness score")
        if fields[4] not in ENTAILMENT_LABELS:
            raise _malformed(path, line_number, f"entailment label {fields[4]!r} is not one of {ENTAILMENT_LABELS}")
        pairs.append(ScoredPair(fields[1], fields[2], score, label=fields[4]))
    return pairs


# ----------------------------------------------------------------------------- pairs.tsv, triplets.tsv

PAIRS_HEADER = ["sentence1", "sentence2", "score"]
TRIPLETS_HEADER = ["anchor", "positive", "negative"]


def read_pairs_tsv(path: str | Path) -> list[ScoredPair]:
    """pairs.tsv: `sentence1 \\t sentence2 \\t score` per line, score in [0, 1]; an optional first
    line equal to the header `sentence1 sentence2 score` is skipped."""
    path = Path(path)
    pairs = []
    for line_number, fields in _tab_rows(path):
        if line_number == 1 and fields == PAIRS_HEADER:
            continue
        if len(fields) != 3:
            raise _malformed(path, line_number, "expected 3 tab-separated fields (sentence1, sentence2, score), "
                                                f"found {len(fields)}")
        score = _number(path, line_number, fields[2], float, "score")
        if not 0.0 <= score <= 1.0:
            raise _malformed(path, line_number, f"score {score} is outside [0, 1]")
        pairs.append(ScoredPair(fields[0], fields[1], score))
    return pairs


def read_triplets_tsv(path: str | Path) -> list[Triplet]:
    """triplets.tsv: `anchor \\t positive \\t negative` per line; an optional first line equal to
    the header `anchor positive negative` is skipped."""
    path = Path(path)
    triplets = []
    for line_number, fields in _tab_rows(path):
        if line_number == 1 and fields == TRIPLETS_HEADER:
            continue
        if len(fields) != 3 or not all(f.strip() for f in fields):
            raise _malformed(path, line_number,
                             "expected 3 non-empty tab-separated fields (anchor, positive, negative)")
        triplets.append(Triplet(*fields))
    return triplets


def write_pairs_tsv(path: str | Path, pairs: list[ScoredPair]) -> None:
    """Write pairs.tsv with its header; scores must already be in [0, 1]."""
    rows = [[p.sentence1, p.sentence2, repr(float(p.score))] for p in pairs]
    for p in pairs:
        if not 0.0 <= p.score <= 1.0:
            raise ValueError(f"pair score {p.score} is outside [0, 1]: {p.sentence1!r} / {p.sentence2!r}")
    _write_tsv(Path(path), PAIRS_HEADER, rows)


def write_triplets_tsv(path: str | Path, triplets: list[Triplet]) -> None:
    """Write triplets.tsv with its header."""
    _write_tsv(Path(path), TRIPLETS_HEADER, [[t.anchor, t.positive, t.negative] for t in triplets])


def _write_tsv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        out.write("\t".join(header) + "\n")
        for row in rows:
            if any(("\t" in text or "\n" in text or "\r" in text) for text in row):
                raise ValueError(f"cannot write {path}: a field contains a tab or line break: {row}")
            out.write("\t".join(row) + "\n")


# ----------------------------------------------------------------------------- MS MARCO, Quora

def read_id_text_tsv(path: str | Path) -> dict[str, str]:
    """MS MARCO `collection.tsv` (pid \\t passage) or `queries.*.tsv` (qid \\t text) -> {id: text}."""
    path = Path(path)
    texts: dict[str, str] = {}
    for line_number, fields in _tab_rows(path):
        if len(fields) != 2:
            raise _malformed(path, line_number, f"expected 2 tab-separated fields (id, text), found {len(fields)}")
        if fields[0] in texts:
            raise _malformed(path, line_number, f"duplicate id {fields[0]!r}")
        texts[fields[0]] = fields[1]
    return texts


def read_trec_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """TREC qrels `qid iteration docid relevance` (MS MARCO's qrels.*.tsv, tab- or space-separated)
    -> {qid: {docid: relevance}}; the iteration column is ignored."""
    path = Path(path)
    qrels: dict[str, dict[str, int]] = {}
    with _open_text(path) as lines:
        for line_number, line in enumerate(lines, start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 4:
                raise _malformed(path, line_number,
                                 f"expected 4 fields (qid, iteration, docid, relevance), found {len(fields)}")
            query_id, _, doc_id, relevance = fields
            judged = qrels.setdefault(query_id, {})
            if doc_id in judged:
                raise _malformed(path, line_number, f"query {query_id!r} judges document {doc_id!r} twice")
            judged[doc_id] = _number(path, line_number, relevance, int, "relevance")
    return qrels


def read_hard_negatives(path: str | Path) -> list[HardNegatives]:
    """sentence-transformers' msmarco-hard-negatives.jsonl(.gz): one
    {"qid": .., "pos": [pid, ..], "neg": {system: [pid, ..]}} per line. Ids become strings so they
    match the keys of `read_id_text_tsv`."""
    path = Path(path)
    entries, seen = [], set()
    for line_number, row in _json_rows(path):
        pos, neg = row.get("pos"), row.get("neg", {})
        if "qid" not in row or not isinstance(pos, list) or not isinstance(neg, dict) \
                or not all(isinstance(pids, list) for pids in neg.values()):
            raise _malformed(path, line_number, 'expected {"qid": .., "pos": [..], "neg": {system: [..]}}')
        qid = str(row["qid"])
        if qid in seen:
            raise _malformed(path, line_number, f"duplicate qid {qid!r}")
        seen.add(qid)
        entries.append(HardNegatives(qid, [str(p) for p in pos],
                                     {system: [str(p) for p in pids] for system, pids in neg.items()}))
    return entries


class _NoGlobalsUnpickler(pickle.Unpickler):
    """An unpickler that refuses to look up any class or function.

    A pickle runs code only through callables that it names by module and name (GLOBAL,
    STACK_GLOBAL, INST, OBJ and the extension-registry opcodes all resolve through `find_class`;
    `persistent_load` is left at the default, which refuses). Refusing every name leaves exactly the
    built-in containers and scalars (dict, list, tuple, str, int, float, bool, None), which is all a
    table of cross-encoder scores needs, and makes a hostile file fail before it can do anything.
    """

    def find_class(self, module, name):
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: only plain dicts, lists, strings and numbers are "
            "accepted from a pickle; convert the file to JSON or TSV (qid \\t pid \\t score)")


def read_cross_encoder_scores(path: str | Path) -> dict[str, dict[str, float]]:
    """Cross-encoder scores {qid: {pid: score}} from one of:

    - `.pkl` / `.pkl.gz` (sentence-transformers' cross-encoder-ms-marco-MiniLM-L-6-v2-scores.pkl.gz):
      read with an unpickler that cannot call anything (see `_NoGlobalsUnpickler`);
    - `.json` / `.json.gz`: {"qid": {"pid": score}};
    - `.tsv` / `.tsv.gz`: `qid \\t pid \\t score` per line.
    Ids become strings, scores floats (raw logits; seed 000 squashes them with a sigmoid).
    """
    path = Path(path)
    name = path.name.removesuffix(".gz")
    if name.endswith((".pkl", ".pickle")):
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as raw:
            try:
                table = _NoGlobalsUnpickler(raw).load()
            except pickle.UnpicklingError as error:
                raise pickle.UnpicklingError(f"{path}: {error}") from None
    elif name.endswith(".json"):
        with _open_text(path) as text:
            table = json.load(text)
    elif name.endswith(".tsv"):
        table = {}
        for line_number, fields in _tab_rows(path):
            if len(fields) != 3:
                raise _malformed(path, line_number,
                                 f"expected 3 tab-separated fields (qid, pid, score), found {len(fields)}")
            table.setdefault(fields[0], {})[fields[1]] = _number(path, line_number, fields[2], float, "score")
    else:
        raise ValueError(f"{path}: unknown cross-encoder score format; expected .pkl(.gz), .json(.gz) or .tsv(.gz)")
    if not isinstance(table, dict) or not all(isinstance(s, dict) for s in table.values()):
        raise ValueError(f"{path}: expected a mapping qid -> {{pid: score}}")
    try:
        return {str(q): {str(p): float(s) for p, s in scores.items()} for q, scores in table.items()}
    except (TypeError, ValueError):
        raise ValueError(f"{path}: every score must be a number") from None


def filter_hard_negatives(entries: list[HardNegatives], ce_scores: dict[str, dict[str, float]],
                          margin: float = 3.0) -> list[HardNegatives]:
    """Keep a negative only if the cross-encoder scores it at least `margin` below the query's
    lowest-scored positive (seed 000, margin 3 in logits): a "negative" that the cross-encoder
    rates about as high as a positive is probably an unlabelled positive.

    Negatives without a score, and negatives that are also positives, are dropped; a query whose
    positives lack scores cannot be judged and is left out.
    """
    kept = []
    for entry in entries:
        scores = ce_scores.get(entry.qid, {})
        if not entry.positives or not all(p in scores for p in entry.positives):
            continue
        ceiling = min(scores[p] for p in entry.positives) - margin
        negatives = {system: [p for p in pids if p in scores and p not in entry.positives and scores[p] <= ceiling]
                     for system, pids in entry.negatives.items()}
        kept.append(HardNegatives(entry.qid, list(entry.positives), negatives))
    return kept


QUORA_COLUMNS = ("id", "qid1", "qid2", "question1", "question2", "is_duplicate")


def read_quora_duplicates(path: str | Path) -> list[DuplicateQuestions]:
    """quora_duplicate_questions.tsv, columns found by name in its header. Unlike the other TSV
    files this one is read as CSV with double-quote quoting, because some questions in the
    published file are quoted and span lines."""
    path = Path(path)
    rows = []
    with _open_text(path) as text:
        reader = csv.reader(text, delimiter="\t")
        header = next(reader, [])
        missing = [c for c in QUORA_COLUMNS if c not in header]
        if missing:
            raise _malformed(path, 1, f"header lacks column(s) {missing}; expected {list(QUORA_COLUMNS)}")
        at = {c: header.index(c) for c in QUORA_COLUMNS}
        for fields in reader:
            if not fields:
                continue
            if len(fields) != len(header):
                raise _malformed(path, reader.line_num, f"expected {len(header)} fields, found {len(fields)}")
            label = _number(path, reader.line_num, fields[at["is_duplicate"]], int, "is_duplicate")
            if label not in (0, 1):
                raise _malformed(path, reader.line_num, f"is_duplicate must be 0 or 1, found {label}")
            rows.append(DuplicateQuestions(fields[at["qid1"]], fields[at["qid2"]],
                                           fields[at["question1"]], fields[at["question2"]], label))
    return rows


# ----------------------------------------------------------------------------- Q&A CSV -> BEIR (seed 003)

def qa_csv_to_beir(csv_path: str | Path, out_folder: str | Path, *, question_column: str = "question",
                   answer_column: str = "answer", split: str = "test", negatives_per_question: int = 0,
                   similarity: Callable[[list[str], list[str]], np.ndarray] = lexical.jaccard_matrix,
                   threshold: float | None = None, seed: int = 0) -> RetrievalData:
    """Turn a CSV of question/answer rows into a BEIR folder and return it as `load_beir` reads it.

    Row i (0-based) becomes query `q{i}` and document `a{i}`, judged relevant (score 1). With
    `negatives_per_question` > 0, each question also gets up to that many answers of other rows,
    drawn at random among those whose similarity to the question is below `threshold`, judged 0
    ("not relevant") so that an evaluation sees explicit negatives (seed 003).

    `similarity(texts_a, texts_b)` returns the (len(a), len(b)) similarity matrix, e.g. cosine of
    embeddings; the default is word-set Jaccard from lexical.py. It is called once with all
    questions against all answers, so it needs O(n^2) memory. When `threshold` is None it is set as
    seed 003 does, a third of the way up from the lowest to the highest question-to-own-answer
    similarity: t = min(s_ii) + (max(s_ii) - min(s_ii)) / 3. Seed 003 compares a candidate answer
    with the question's own answer; here the candidate is compared with the question itself, the
    same kind of pair the threshold was measured on. Answers identical to the question's own are
    never drawn.
    """
    csv_path = Path(csv_path)
    questions, answers = [], []
    with open(csv_path, encoding="utf-8", newline="") as text:
        reader = csv.DictReader(text)
        for column in (question_column, answer_column):
            if column not in (reader.fieldnames or []):
                raise ValueError(f"{csv_path}: no column {column!r}; columns are {reader.fieldnames}")
        for row in reader:
            question, answer = (row[question_column] or "").strip(), (row[answer_column] or "").strip()
            if not question or not answer:
                raise _malformed(csv_path, reader.line_num, "empty question or answer")
            questions.append(question)
            answers.append(answer)

    corpus = {f"a{i}": answer for i, answer in enumerate(answers)}
    queries = {f"q{i}": question for i, question in enumerate(questions)}
    qrels = {f"q{i}": {f"a{i}": 1} for i in range(len(questions))}
    if negatives_per_question > 0:
        sims = np.asarray(similarity(questions, answers), dtype=np.float64)  # (n, n)
        if threshold is None:
            own = np.diag(sims)  # (n,) similarity of each question to its own answer
            threshold = own.min() + (own.max() - own.min()) / 3
        rng = np.random.default_rng(seed)
        for i in range(len(questions)):
            candidates = [j for j in np.flatnonzero(sims[i] < threshold) if j != i and answers[j] != answers[i]]
            if candidates:
                chosen = rng.choice(candidates, size=min(negatives_per_question, len(candidates)), replace=False)
                for j in sorted(int(j) for j in chosen):
                    qrels[f"q{i}"][f"a{j}"] = 0
    write_beir(out_folder, corpus, queries, qrels, split=split)
    return load_beir(out_folder, split)


# ----------------------------------------------------------------------------- named datasets

@dataclass(frozen=True)
class Source:
    """Where a named dataset comes from and how to recognise and check it.

    files:   names fetched from `base_url + "/" + name`; .zip files are unpacked.
    sha256:  expected SHA-256 of a fetched file (checked before unpacking) or of a file inside the
             dataset folder after unpacking (a path relative to it).
    layouts: a folder holds the dataset if every file of one of these layouts is in it.
    """
    base_url: str
    files: tuple[str, ...]
    sha256: dict[str, str]
    layouts: tuple[tuple[str, ...], ...]


SOURCES = {
    # BEIR's archive. BEIR publishes its MD5, 5f7d1de60b170fc8027bb7898e2efca1; the SHA-256 below
    # is that archive's (2,816,079 bytes) as two independent public projects record it.
    "scifact": Source(
        base_url="https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets",
        files=("scifact.zip",),
        sha256={"scifact.zip": "536e14446a0ba56ed1398ab1055f39fe852686ecad24a6306c80c490fa8e0165"},
        layouts=(("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"),)),
    # sentence-transformers' repackaging of the STS benchmark. Nobody publishes a digest for it, so
    # it is checked for integrity only: gzip's CRC-32 must hold and the reader must accept every
    # line (as for every dataset). The original release's sts-*.csv, when present, are preferred.
    "stsb": Source(
        base_url="https://sbert.net/datasets",
        files=("stsbenchmark.tsv.gz",),
        sha256={},
        layouts=(("sts-train.csv", "sts-dev.csv", "sts-test.csv"), ("stsbenchmark.tsv.gz",))),
    # The SemEval-2014 task 1 release. No digests are published for the zips, so the unpacked files
    # are checked against the SHA-256 of the copies in the project's data mirror, which come from
    # this release; should the host ever serve other bytes, the download fails with both digests.
    "sick": Source(
        base_url="http://alt.qcri.org/semeval2014/task1/data/uploads",
        files=("sick_train.zip", "sick_trial.zip", "sick_test_annotated.zip"),
        sha256={"SICK_train.txt": "266cf8047149bd1d68138dd30439f3122bff30069740ac6705bb6197d9f1b48e",
                "SICK_trial.txt": "5a88cfb62f8c6bd2a3cce0f2421ba2cb8c2be5ab4a800f6f01e2c64aafb7db56",
                "SICK_test_annotated.txt": "2b8aa806658d6fc23c6824c83776c2d4fee7556000817b5ec0f982861413b7d0"},
        layouts=(tuple(SICK_FILES.values()),)),
}


class DatasetNotFoundError(FileNotFoundError):
    """A named dataset is in none of the places looked in and could not be downloaded."""


def holds_dataset(folder: str | Path, name: str) -> bool:
    """Whether `folder` has every file of one of dataset `name`'s layouts."""
    return any(all((Path(folder) / f).exists() for f in layout) for layout in _source(name).layouts)


def find_dataset_in(folder: str | Path, name: str) -> Path | None:
    """`folder` itself if it holds dataset `name`, else `folder/name` if that does, else None."""
    for candidate in (Path(folder), Path(folder) / name):
        if holds_dataset(candidate, name):
            return candidate
    return None


def resolve_dataset(name: str, folder: str | Path | None = None, *, data_root: str | Path = REPO_DATA,
                    download: bool = True, base_url: str | None = None) -> Path:
    """The folder holding dataset `name`, looked for in this order:

    1. `folder`, when given: it or its subfolder `<name>` (if neither holds it, that is an error at
       once: a folder named on purpose should not be silently replaced by another copy);
    2. `<data_root>/<name>` (data_root is this repository's data/ folder by default);
    3. `$MINISBERT_DATA_MIRROR/<name>`;
    4. when `download` is true: the canonical source (or `base_url`, or $MINISBERT_DOWNLOAD_URL),
       unpacked and checked into `<data_root>/<name>` by `download_dataset`.
    Raises DatasetNotFoundError naming every place looked in and how to get the data.
    """
    source = _source(name)
    if folder is not None:
        found = find_dataset_in(folder, name)
        if found is None:
            raise DatasetNotFoundError(f"dataset {name!r} is not in {folder} nor in {Path(folder) / name}: "
                                       f"expected the files {' + '.join(source.layouts[0])}")
        return found
    looked = []
    local = Path(data_root) / name
    if holds_dataset(local, name):
        return local
    looked.append(str(local))
    mirror = os.environ.get(MIRROR_ENV)
    if mirror:
        if holds_dataset(Path(mirror) / name, name):
            return Path(mirror) / name
        looked.append(str(Path(mirror) / name))
    else:
        looked.append(f"${MIRROR_ENV} (not set)")
    if download:
        try:
            return download_dataset(name, data_root=data_root, base_url=base_url)
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            url = _base_url(source, base_url)
            reason = error if isinstance(error, urllib.error.HTTPError) else getattr(error, "reason", error)
            looked.append(f"download from {url} failed ({reason})")
    else:
        looked.append("download (not attempted)")
    raise DatasetNotFoundError(
        f"dataset {name!r} not found. Looked in: {'; '.join(looked)}. To get it, set {MIRROR_ENV} to a "
        f"folder that holds {name}/, or pass --data FOLDER, or download "
        f"{', '.join(_base_url(source, base_url) + '/' + f for f in source.files)} and unpack it into {local}.")


def download_dataset(name: str, data_root: str | Path = REPO_DATA, base_url: str | None = None) -> Path:
    """Fetch dataset `name` into `<data_root>/<name>` and return that folder.

    Everything happens in `<data_root>/.<name>.part`; only after every digest (and, for archives,
    every CRC) has checked out is that folder renamed to `<name>`, so an interrupted or corrupted
    download never leaves something that `resolve_dataset` would accept. A digest mismatch raises
    ValueError with both digests.
    """
    source = _source(name)
    url = _base_url(source, base_url)
    target = Path(data_root) / name
    if target.exists():
        raise FileExistsError(f"{target} exists but does not hold {name} ({' + '.join(source.layouts[0])}); "
                              "remove it and try again")
    staging = Path(data_root) / f".{name}.part"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for file_name in source.files:
            path = staging / file_name
            _check_sha256(path, _fetch(f"{url}/{file_name}", path), source.sha256.get(file_name))
            if file_name.endswith(".zip"):
                _unzip(path, staging)
            elif file_name.endswith(".gz"):
                with gzip.open(path, "rb") as packed:  # reading to the end checks CRC-32 and length
                    while packed.read(1 << 20):
                        pass
        found = find_dataset_in(staging, name)
        if found is None:
            raise ValueError(f"the files from {url} did not contain {name} ({' + '.join(source.layouts[0])})")
        for relative, expected in source.sha256.items():
            if relative not in source.files:
                _check_sha256(found / relative, _sha256_of(found / relative), expected)
        _READ_EVERYTHING[name](found)  # a line the reader rejects fails the download, not a later run
        os.replace(found, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def load_scifact(split: str = "test", folder: str | Path | None = None, download: bool = True) -> RetrievalData:
    """SciFact (BEIR): test = 300 queries / 339 judgments, train = 809 / 919, 5,183 documents."""
    return load_beir(resolve_dataset("scifact", folder, download=download), split)


def load_stsb(split: str = "test", folder: str | Path | None = None, download: bool = True) -> list[ScoredPair]:
    """STS benchmark: train 5,749, dev 1,500, test 1,379 pairs, gold 0..5."""
    return read_stsb(resolve_dataset("stsb", folder, download=download), split)


def load_sick(split: str = "all", folder: str | Path | None = None, download: bool = True) -> list[ScoredPair]:
    """SICK: train 4,500, trial 500, test 4,927, all 9,927 pairs, relatedness 1..5."""
    return read_sick(resolve_dataset("sick", folder, download=download), split)


_READ_EVERYTHING = {
    "scifact": lambda folder: [load_beir(folder, split.stem) for split in (folder / "qrels").glob("*.tsv")],
    "stsb": lambda folder: [read_stsb(folder, split) for split in STSB_SPLITS],
    "sick": lambda folder: read_sick(folder, "all"),
}


def _source(name: str) -> Source:
    if name not in SOURCES:
        raise ValueError(f"unknown dataset {name!r}; named datasets are {sorted(SOURCES)}")
    return SOURCES[name]


def _base_url(source: Source, base_url: str | None) -> str:
    return (base_url or os.environ.get(DOWNLOAD_URL_ENV) or source.base_url).rstrip("/")


def _fetch(url: str, path: Path) -> str:
    """Stream `url` into `path`; returns the SHA-256 of what was written."""
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=60) as response, open(path, "wb") as out:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as data:
        while chunk := data.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _check_sha256(path: Path, actual: str, expected: str | None) -> None:
    if expected is not None and actual != expected:
        raise ValueError(f"{path.name}: SHA-256 is {actual}, expected {expected}; the download is corrupt "
                         "or the source changed, so it was discarded")


def _unzip(path: Path, into: Path) -> None:
    # zipfile strips absolute paths and ".." from member names, so members stay inside `into`.
    with zipfile.ZipFile(path) as archive:
        broken = archive.testzip()
        if broken is not None:
            raise ValueError(f"{path.name}: member {broken} fails its CRC check")
        archive.extractall(into)
    path.unlink()
