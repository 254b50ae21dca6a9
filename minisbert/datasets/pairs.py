"""This project's own training files: scored pairs and triplets, one per line, tab-separated.

    pairs.tsv      sentence1 <tab> sentence2 <tab> score    score in [0, 1], the target of the
                                                             Siamese regression losses (training/losses.py)
    triplets.tsv   anchor <tab> positive <tab> negative     for the triplet losses and MNRL

A first line equal to the header (`sentence1 sentence2 score`, `anchor positive negative`) is
skipped; the writers always write it. `data/example` holds one file of each.
Checked in tests/datasets/test_datasets.py.
"""

from dataclasses import dataclass
from pathlib import Path

from .rows import malformed, number, tab_rows, write_lines


@dataclass(frozen=True)
class ScoredPair:
    """Two sentences and a gold score on the dataset's own scale (`sts.to_unit_score` maps STS-B's
    and SICK's to [0, 1]). `label` is SICK's entailment judgment, None elsewhere."""
    sentence1: str
    sentence2: str
    score: float
    label: str | None = None


@dataclass(frozen=True)
class Triplet:
    anchor: str
    positive: str
    negative: str


PAIRS_HEADER = ["sentence1", "sentence2", "score"]
TRIPLETS_HEADER = ["anchor", "positive", "negative"]


def read_pairs_tsv(path: str | Path) -> list[ScoredPair]:
    """pairs.tsv -> ScoredPair per line; a score outside [0, 1] is an error."""
    path = Path(path)
    pairs = []
    for line_number, fields in tab_rows(path):
        if line_number == 1 and fields == PAIRS_HEADER:
            continue
        if len(fields) != 3:
            raise malformed(path, line_number, "expected 3 tab-separated fields (sentence1, sentence2, score), "
                                               f"found {len(fields)}")
        score = number(path, line_number, fields[2], float, "score")
        if not 0.0 <= score <= 1.0:
            raise malformed(path, line_number, f"score {score} is outside [0, 1]")
        pairs.append(ScoredPair(fields[0], fields[1], score))
    return pairs


def read_triplets_tsv(path: str | Path) -> list[Triplet]:
    """triplets.tsv -> Triplet per line; every field must be non-empty."""
    path = Path(path)
    triplets = []
    for line_number, fields in tab_rows(path):
        if line_number == 1 and fields == TRIPLETS_HEADER:
            continue
        if len(fields) != 3 or not all(f.strip() for f in fields):
            raise malformed(path, line_number, "expected 3 non-empty tab-separated fields (anchor, positive, negative)")
        triplets.append(Triplet(*fields))
    return triplets


def write_pairs_tsv(path: str | Path, pairs: list[ScoredPair]) -> None:
    """Write pairs.tsv with its header; scores must already be in [0, 1]."""
    for p in pairs:
        if not 0.0 <= p.score <= 1.0:
            raise ValueError(f"pair score {p.score} is outside [0, 1]: {p.sentence1!r} / {p.sentence2!r}")
    _write_tsv(Path(path), PAIRS_HEADER, [[p.sentence1, p.sentence2, repr(float(p.score))] for p in pairs])


def write_triplets_tsv(path: str | Path, triplets: list[Triplet]) -> None:
    """Write triplets.tsv with its header."""
    _write_tsv(Path(path), TRIPLETS_HEADER, [[t.anchor, t.positive, t.negative] for t in triplets])


def _write_tsv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    for row in rows:
        if any(("\t" in text or "\n" in text or "\r" in text) for text in row):
            raise ValueError(f"cannot write {path}: a field contains a tab or line break: {row}")
    write_lines(path, ["\t".join(header)] + ["\t".join(row) for row in rows])
