"""MS MARCO passage ranking files, and the hard negatives filtered by a cross-encoder.

MS MARCO (Nguyen et al. 2016, "MS MARCO: A Human Generated MAchine Reading COmprehension Dataset")
ships `collection.tsv` (pid, passage), `queries.*.tsv` (qid, text) and TREC qrels
(`qid 0 pid relevance`, read by trec.py). sentence-transformers adds two files ("msmarco-hard-negatives", Reimers
2021, on the Hugging Face hub): for each training query, the negatives that several retrieval
systems ranked high (`msmarco-hard-negatives.jsonl.gz`), and a cross-encoder's score for each
(query, passage) among them (`cross-encoder-ms-marco-MiniLM-L-6-v2-scores.pkl.gz`).

Rygaard, Bramsløw, Jensen and Bagger, "Distance Dilemma: Siamese vs. Triplet SBERT Networks for
Information Retrieval" (DTU), section 2.1, train on exactly these: they keep a negative only when
the cross-encoder scores it at least 3 logits below the positive (`filter_hard_negatives`), and
squash the scores with a sigmoid into [0, 1] labels for their Siamese regression.

The scores come as a pickle, and unpickling runs whatever code a file names; they are read with an
unpickler that can build nothing but dicts, lists, strings and numbers (`_NoGlobalsUnpickler`).
Checked in tests/datasets/test_datasets.py.
"""

import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path

from .rows import json_rows, malformed, number, open_binary, tab_rows


@dataclass
class HardNegatives:
    """One line of the hard-negatives file: a query, its positive passages and, for each retrieval
    system that mined them, that system's negative passages."""
    qid: str
    positives: list[str]
    negatives: dict[str, list[str]] = field(default_factory=dict)


def read_id_text_tsv(path: str | Path) -> dict[str, str]:
    """`collection.tsv` (pid \\t passage) or `queries.*.tsv` (qid \\t text) -> {id: text}."""
    path = Path(path)
    texts: dict[str, str] = {}
    for line_number, fields in tab_rows(path):
        if len(fields) != 2:
            raise malformed(path, line_number, f"expected 2 tab-separated fields (id, text), found {len(fields)}")
        if fields[0] in texts:
            raise malformed(path, line_number, f"duplicate id {fields[0]!r}")
        texts[fields[0]] = fields[1]
    return texts


def read_hard_negatives(path: str | Path) -> list[HardNegatives]:
    """msmarco-hard-negatives.jsonl(.gz): one {"qid": .., "pos": [pid, ..], "neg": {system: [pid, ..]}}
    per line. Ids become strings so they match the keys of `read_id_text_tsv`."""
    path = Path(path)
    entries, seen = [], set()
    for line_number, row in json_rows(path):
        pos, neg = row.get("pos"), row.get("neg", {})
        if "qid" not in row or not isinstance(pos, list) or not isinstance(neg, dict) \
                or not all(isinstance(pids, list) for pids in neg.values()):
            raise malformed(path, line_number, 'expected {"qid": .., "pos": [..], "neg": {system: [..]}}')
        qid = str(row["qid"])
        if qid in seen:
            raise malformed(path, line_number, f"duplicate qid {qid!r}")
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
    """Cross-encoder scores {qid: {pid: score}} (raw logits) from one of:

    - `.pkl` / `.pkl.gz` (sentence-transformers' cross-encoder-ms-marco-MiniLM-L-6-v2-scores.pkl.gz),
      read with an unpickler that cannot call anything (see `_NoGlobalsUnpickler`);
    - `.json` / `.json.gz`: {"qid": {"pid": score}};
    - `.tsv` / `.tsv.gz`: `qid \\t pid \\t score` per line.
    """
    path = Path(path)
    name = path.name.removesuffix(".gz")
    if name.endswith((".pkl", ".pickle")):
        with open_binary(path) as raw:
            try:
                table = _NoGlobalsUnpickler(raw).load()
            except pickle.UnpicklingError as error:  # a ValueError, so train.py reports it in one line
                raise ValueError(f"{path}: {error}") from None
    elif name.endswith(".json"):
        with open_binary(path) as raw:
            try:
                table = json.load(raw)
            except ValueError as error:  # JSONDecodeError or UnicodeDecodeError
                raise ValueError(f"{path}: not valid JSON ({error}); repair or replace the file") from None
    elif name.endswith(".tsv"):
        table = {}
        for line_number, fields in tab_rows(path):
            if len(fields) != 3:
                raise malformed(path, line_number,
                                f"expected 3 tab-separated fields (qid, pid, score), found {len(fields)}")
            table.setdefault(fields[0], {})[fields[1]] = number(path, line_number, fields[2], float, "score")
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
    lowest-scored positive (Rygaard et al., section 2.1: margin 3 in logits): a "negative" that the
    cross-encoder rates about as high as a positive is probably an unlabelled positive.

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
