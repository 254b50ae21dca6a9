"""The Quora duplicate questions: pairs of questions, each judged duplicate or not.

Quora's first public data set (Iyer, Dandekar and Csernai 2017, "First Quora Dataset Release:
Question Pairs") is one file, `quora_duplicate_questions.tsv`, with the header
`id qid1 qid2 question1 question2 is_duplicate` and over 400,000 rows. Bagge, Topsøe and Rørhauge,
"SRoBERTa Yields Similar Performance on Duplicate Question Retrieval Using Reduced Embedding Sizes"
(DTU), study embedding sizes on triplets built from it. Some of its questions are quoted and span
lines, so it is read as a CSV file with tabs between fields (rows.csv_records).
Checked in tests/datasets/test_datasets.py.
"""

from dataclasses import dataclass
from pathlib import Path

from .rows import csv_records, malformed, number

QUORA_FILE = "quora_duplicate_questions.tsv"  # its name, by which a folder is known to hold it
QUORA_COLUMNS = ("id", "qid1", "qid2", "question1", "question2", "is_duplicate")


@dataclass(frozen=True)
class DuplicateQuestions:
    """One row of the Quora duplicate-questions file."""
    qid1: str
    qid2: str
    question1: str
    question2: str
    is_duplicate: int


def read_quora_duplicates(path: str | Path) -> list[DuplicateQuestions]:
    """quora_duplicate_questions.tsv -> one DuplicateQuestions per row, columns found by name."""
    path = Path(path)
    rows = []
    for line_number, row in csv_records(path, QUORA_COLUMNS, delimiter="\t"):
        label = number(path, line_number, row["is_duplicate"], int, "is_duplicate")
        if label not in (0, 1):
            raise malformed(path, line_number, f"is_duplicate must be 0 or 1, found {label}")
        rows.append(DuplicateQuestions(row["qid1"], row["qid2"], row["question1"], row["question2"], label))
    return rows
