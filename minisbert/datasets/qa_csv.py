"""A CSV file of question/answer rows turned into the BEIR layout, so any model can be scored on it.

Silveri, "Choosing the Right SBERT Model for Your Data with BEIR" (Nerd For Tech, January 2024,
section "Negative Sampling") evaluates candidate models on a company's own Q&A pairs this way:
each question is a query, each answer a document, the row's own answer its one relevant document.
Optionally each question also gets answers of other rows judged "not relevant" (score 0), drawn
among those less similar to it than a threshold, so that an evaluation sees explicit negatives.

`evaluate.py --data questions.csv` reaches this through `qa_csv_folder`, which converts a CSV once
into a folder of the cache named by the file's digest.
Checked in tests/datasets/test_datasets.py and, end to end, in tests/evaluation/test_evaluate.py.
"""

from pathlib import Path
from typing import Callable

import numpy as np

from ..evaluation import lexical
from ..common.download import sha256_of
from ..common.fileio import write_dir
from .beir import RetrievalData, load_beir, write_beir
from .rows import csv_records, malformed


def qa_csv_to_beir(csv_path: str | Path, out_folder: str | Path, *, question_column: str = "question",
                   answer_column: str = "answer", split: str = "test", negatives_per_question: int = 0,
                   similarity: Callable[[list[str], list[str]], np.ndarray] = lexical.jaccard_matrix,
                   threshold: float | None = None, seed: int = 0) -> RetrievalData:
    """Write the BEIR layout of a question/answer CSV into `out_folder` and return it as
    `load_beir` reads it.

    Row i (0-based) becomes query `q{i}` and document `a{i}`, judged relevant (score 1). With
    `negatives_per_question` > 0, each question also gets up to that many answers of other rows,
    drawn at random among those whose similarity to the question is below `threshold`, judged 0.

    `similarity(texts_a, texts_b)` returns the (len(a), len(b)) similarity matrix, e.g. cosine of
    embeddings; the default is word-set Jaccard from evaluation/lexical.py. It is called once with all
    questions against all answers, so it needs O(n^2) memory. When `threshold` is None it is set as
    Silveri does, a third of the way up from the lowest to the highest question-to-own-answer
    similarity: t = min(s_ii) + (max(s_ii) - min(s_ii)) / 3. Silveri compares a candidate answer
    with the question's own answer; here the candidate is compared with the question itself, the
    same kind of pair the threshold was measured on. Answers identical to the question's own are
    never drawn.
    """
    csv_path = Path(csv_path)
    questions, answers = [], []
    for line_number, row in csv_records(csv_path, (question_column, answer_column)):
        question, answer = row[question_column].strip(), row[answer_column].strip()
        if not question or not answer:
            raise malformed(csv_path, line_number, "empty question or answer")
        questions.append(question)
        answers.append(answer)
    if not questions:
        raise ValueError(f"{csv_path} has a header but no question/answer rows")

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


def qa_csv_folder(csv_path: str | Path, cache_dir: str | Path) -> Path:
    """The BEIR folder of a question/answer CSV (columns `question` and `answer`, positives only),
    converted on first use into `<cache_dir>/<file stem>-<digest>/`. The digest is the CSV's
    SHA-256, so an edited file is converted again; the folder is assembled beside its final name
    and renamed into place whole, so an interrupted conversion is never taken for a finished one."""
    csv_path = Path(csv_path)
    if not csv_path.is_file():
        raise FileNotFoundError(f"{csv_path} does not exist; --data takes a dataset name, a folder, "
                                "or a CSV file of question/answer rows")
    target = Path(cache_dir) / f"{csv_path.stem}-{sha256_of(csv_path)[:16]}"
    if not target.is_dir():
        write_dir(target, lambda folder: qa_csv_to_beir(csv_path, folder))
    return target
