"""Scored sentence pairs for semantic textual similarity: the STS benchmark and SICK.

- STS benchmark (Cer, Diab, Agirre, Lopez-Gazpio and Specia 2017, "SemEval-2017 Task 1: Semantic
  Textual Similarity Multilingual and Crosslingual Focused Evaluation"): train 5,749, dev 1,500,
  test 1,379 pairs, gold score 0..5. Read from the original release, `sts-{train,dev,test}.csv`
  (tab-separated despite the name: column 5 the score, 6 and 7 the sentences, 1-based; some rows
  carry two extra source columns, ignored), or from sentence-transformers' repackaging
  `stsbenchmark.tsv.gz` (header split/genre/dataset/year/sid/score/sentence1/sentence2).
- SICK (Marelli, Bentivogli, Baroni, Bernardi, Menini and Zamparelli 2014, "SemEval-2014 Task 1:
  Evaluation of Compositional Distributional Semantic Models on Full Sentences through Semantic
  Relatedness and Textual Entailment"): `SICK_train.txt` 4,500, `SICK_trial.txt` 500,
  `SICK_test_annotated.txt` 4,927 pairs, relatedness 1..5 and an entailment label. MTEB's SICK-R
  scores all 9,927 pairs, the split called "all" here.

SBERT's regression objective (Reimers and Gurevych 2019, "Sentence-BERT: Sentence Embeddings
using Siamese BERT-Networks", section 3) fits the cosine similarity of a pair to its gold score,
here scaled to [0, 1] by `to_unit_score`; its classification objective takes three NLI labels,
which SICK's entailment judgments provide.
Checked in tests/datasets/test_datasets.py.
"""

from pathlib import Path

from .pairs import ScoredPair
from .rows import malformed, number, tab_rows

STSB_SPLITS = ("train", "dev", "test")
SICK_FILES = {"train": "SICK_train.txt", "trial": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
SICK_SPLITS = ("train", "trial", "dev", "test", "all")  # "dev" is "trial"; "all" is train + trial + test
ENTAILMENT_LABELS = ("CONTRADICTION", "ENTAILMENT", "NEUTRAL")  # a label's id is its index here
SCORE_RANGES = {"stsb": (0.0, 5.0), "sick": (1.0, 5.0)}  # (lowest, highest) gold score
_STSB_GZ_HEADER = ["split", "genre", "dataset", "year", "sid", "score", "sentence1", "sentence2"]
_SICK_HEADER = ["pair_ID", "sentence_A", "sentence_B", "relatedness_score", "entailment_judgment"]


def to_unit_score(dataset: str, score: float) -> float:
    """Gold score -> [0, 1]: STS-B s / 5, SICK (s - 1) / 4. A score off the dataset's scale is refused
    (it would become a target cosine outside [0, 1])."""
    if dataset not in SCORE_RANGES:
        raise ValueError(f"unknown STS dataset {dataset!r}; choose one of {list(SCORE_RANGES)}")
    low, high = SCORE_RANGES[dataset]
    if not low <= score <= high:  # a NaN fails too
        raise ValueError(f"{dataset} gold score {score!r} is outside its scale [{low}, {high}]")
    return (score - low) / (high - low)


def read_stsb(folder: str | Path, split: str) -> list[ScoredPair]:
    """STS benchmark pairs of one split, raw gold scores 0..5; `sts-<split>.csv` is read in
    preference to `stsbenchmark.tsv.gz` when a folder has both."""
    if split not in STSB_SPLITS:
        raise ValueError(f"unknown STS benchmark split {split!r}; choose one of {STSB_SPLITS}")
    folder = Path(folder)
    original = folder / f"sts-{split}.csv"
    if original.is_file():
        return [_stsb_pair(original, n, fields, score_at=4) for n, fields in tab_rows(original)]
    packed = folder / "stsbenchmark.tsv.gz"
    if packed.is_file():
        pairs = []
        for line_number, fields in tab_rows(packed):
            if line_number == 1:
                if fields != _STSB_GZ_HEADER:
                    raise malformed(packed, 1, f"expected the header {_STSB_GZ_HEADER}")
            elif fields and fields[0] == split:
                pairs.append(_stsb_pair(packed, line_number, fields, score_at=5))
        return pairs
    raise FileNotFoundError(f"{folder} has neither sts-{split}.csv nor stsbenchmark.tsv.gz")


def _stsb_pair(path: Path, line_number: int, fields: list[str], score_at: int) -> ScoredPair:
    if len(fields) < score_at + 3:
        raise malformed(path, line_number,
                        f"expected at least {score_at + 3} tab-separated fields, found {len(fields)}")
    score = number(path, line_number, fields[score_at], float, "score")
    return ScoredPair(fields[score_at + 1], fields[score_at + 2], score)


def read_sick(folder: str | Path, split: str) -> list[ScoredPair]:
    """SICK pairs with raw relatedness 1..5 and the entailment label; `split="all"` concatenates
    train, trial and test (9,927 pairs, what MTEB's SICK-R scores)."""
    if split not in SICK_SPLITS:
        raise ValueError(f"unknown SICK split {split!r}; choose one of {SICK_SPLITS}")
    if split == "all":
        return [pair for part in ("train", "trial", "test") for pair in read_sick(folder, part)]
    path = Path(folder) / SICK_FILES["trial" if split == "dev" else split]
    if not path.is_file():
        raise FileNotFoundError(f"{Path(folder)} has no {path.name} (SICK's {split} split)")
    pairs = []
    for line_number, fields in tab_rows(path):
        if line_number == 1:
            if fields != _SICK_HEADER:
                raise malformed(path, 1, f"expected the header {_SICK_HEADER}")
            continue
        if len(fields) != 5:
            raise malformed(path, line_number, f"expected 5 tab-separated fields, found {len(fields)}")
        score = number(path, line_number, fields[3], float, "relatedness score")
        if fields[4] not in ENTAILMENT_LABELS:
            raise malformed(path, line_number, f"entailment label {fields[4]!r} is not one of {ENTAILMENT_LABELS}")
        pairs.append(ScoredPair(fields[1], fields[2], score, label=fields[4]))
    return pairs
