"""The datasets Sentence-BERT is trained and evaluated on: one module per format, and where each is found.

    beir.py     BEIR retrieval layout (corpus, queries, qrels): SciFact, data/example
    sts.py      scored sentence pairs: the STS benchmark and SICK
    pairs.py    this project's pairs.tsv and triplets.tsv
    msmarco.py  MS MARCO passages, queries, hard negatives and cross-encoder scores
    trec.py     TREC run files and qrels (TREC's and BEIR's), read and written
    quora.py    the Quora duplicate questions
    qa_csv.py   a question/answer CSV turned into the BEIR layout
    locate.py   where a named dataset is found, or downloaded, and what `--data` names (what_data)
    rows.py     what every reader shares: opening files, splitting lines, line-numbered errors

Every reader returns plain Python values (dicts, lists, small dataclasses) and raises ValueError
naming the file and line of a malformed line. Everything a caller needs is importable from here:

    from minisbert import datasets
    scifact = datasets.load_scifact("test")
Checked in tests/datasets/test_datasets.py.
"""

from .beir import RetrievalData, load_beir, read_beir_corpus, read_beir_queries, write_beir
from .locate import (DOWNLOAD_URL_ENV, FOLDER, MIRROR_ENV, QA_CSV, QUORA, REPO_DATA, SOURCES, STS, DataSource,
                     DatasetNotFoundError, Source, download_dataset, find_dataset_in, holds_dataset, load_scifact,
                     load_sick, load_sts, load_stsb, resolve_dataset, sts_name, what_data)
from .msmarco import (HardNegatives, filter_hard_negatives, read_cross_encoder_scores, read_hard_negatives,
                      read_id_text_tsv)
from .pairs import ScoredPair, Triplet, read_pairs_tsv, read_triplets_tsv, write_pairs_tsv, write_triplets_tsv
from .qa_csv import qa_csv_folder, qa_csv_to_beir
from .quora import QUORA_FILE, DuplicateQuestions, read_quora_duplicates
from .sts import (ENTAILMENT_LABELS, SCORE_RANGES, SICK_FILES, SICK_SPLITS, STSB_SPLITS, read_sick, read_stsb,
                  to_unit_score)
from .trec import read_beir_qrels, read_qrels, read_trec_qrels, read_trec_run, write_trec_run
