"""What "correct" means for the dataset readers: each format read from a small file written here,
malformed lines (and bytes that are not UTF-8) reported with file and line, hostile pickles refused,
a question/answer CSV converted once and whole, named datasets found in the documented order, a
folder recognised by the files of any layout the readers know (itself or as <name>/), and downloads
checked before they are accepted (against a local HTTP server, tests/http_server.py)."""

import gzip
import hashlib
import io
import json
import os
import pickle
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

from minisbert import datasets

from ..http_server import closed_port_url


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="")
    return path


def write_gz(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8", newline="") as out:
        out.write(text)
    return path


def jsonl(rows) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def make_beir(folder: Path, qrels_lines=("q1\td1\t1", "q2\td2\t1", "q2\td3\t0")) -> Path:
    write(folder / "corpus.jsonl", jsonl([
        {"_id": "d1", "title": "Tea", "text": "Green tea is steamed."},
        {"_id": "d2", "title": "", "text": "  Coffee is roasted.  "},  # empty title: no leading space
        {"_id": "d3", "text": "Cocoa is fermented."},  # no title at all
    ]))
    write(folder / "queries.jsonl", jsonl([
        {"_id": "q0", "text": "never judged"},
        {"_id": "q1", "text": "how is green tea made"},
        {"_id": "q2", "text": "what happens to coffee beans"},
    ]))
    write(folder / "qrels" / "test.tsv", "query-id\tcorpus-id\tscore\n" + "".join(l + "\n" for l in qrels_lines))
    return folder


# ----------------------------------------------------------------------------- reading lines

def test_invalid_utf8_is_reported_with_its_line_and_a_byte_order_mark_is_dropped(tmp_path):
    path = tmp_path / "queries.jsonl"
    path.write_bytes(b'{"_id": "q1", "text": "fine"}\n{"_id": "q2", "text": "caf\xe9"}\n')  # Latin-1 e-acute
    with pytest.raises(ValueError, match=rf"{path}, line 2: byte 27 of the line, 0xe9, is not UTF-8"):
        datasets.read_beir_queries(path)
    path.write_bytes("\ufeff".encode() + b'{"_id": "q1", "text": "caf\xc3\xa9"}\r\n')  # as spreadsheets save
    assert datasets.read_beir_queries(path) == {"q1": "caf\u00e9"}


# ----------------------------------------------------------------------------- BEIR

def test_load_beir_joins_title_and_text_and_keeps_judged_queries(tmp_path):
    split = datasets.load_beir(make_beir(tmp_path), "test")
    assert split.corpus == {"d1": "Tea Green tea is steamed.", "d2": "Coffee is roasted.", "d3": "Cocoa is fermented."}
    assert split.queries == {"q1": "how is green tea made", "q2": "what happens to coffee beans"}  # q0 unjudged
    assert split.qrels == {"q1": {"d1": 1}, "q2": {"d2": 1, "d3": 0}}


def test_qrels_naming_unknown_ids_are_dropped_with_a_warning(tmp_path):
    make_beir(tmp_path, ("q1\td1\t1", "q1\tghost-doc\t1", "ghost-query\td2\t1"))
    with pytest.warns(UserWarning, match="dropped 2 judgments"):
        split = datasets.load_beir(tmp_path, "test")
    assert split.qrels == {"q1": {"d1": 1}}
    assert list(split.queries) == ["q1"]


def test_missing_split_names_the_file_and_the_splits_found(tmp_path):
    make_beir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"dev\.tsv.*\['test'\]"):
        datasets.load_beir(tmp_path, "dev")


@pytest.mark.parametrize("file_name,content,line,message", [
    ("corpus.jsonl", '{"_id": "a", "text": "x"}\n{"_id": "b", "text": \n', 2, "not valid JSON"),
    ("corpus.jsonl", '{"_id": "a", "text": "x"}\n\n{"_id": "a", "text": "y"}\n', 3, "duplicate document id 'a'"),
    ("corpus.jsonl", '{"text": "no id"}\n', 1, "missing '_id'"),
    ("queries.jsonl", '{"_id": "q", "text": "x"}\n{"_id": "q", "text": "y"}\n', 2, "duplicate query id"),
    ("qrels.tsv", "query-id\tcorpus-id\tscore\nq\td\t1\nq\te\tone\n", 3, "score 'one' is not an integer"),
    ("qrels.tsv", "q\td\t1\nq\td\t1\n", 2, "judges document 'd' twice"),
    ("qrels.tsv", "q\td 1\n", 1, "expected 3 tab-separated fields"),
])
def test_malformed_beir_lines_name_file_and_line(tmp_path, file_name, content, line, message):
    path = write(tmp_path / file_name, content)
    reader = {"corpus.jsonl": datasets.read_beir_corpus, "queries.jsonl": datasets.read_beir_queries,
              "qrels.tsv": datasets.read_beir_qrels}[file_name]
    with pytest.raises(ValueError) as error:
        reader(path)
    assert f"{path}, line {line}:" in str(error.value)
    assert message in str(error.value)


# ----------------------------------------------------------------------------- STS benchmark, SICK

STSB_ROWS = (
    'main-captions\tMSRvid\t2012test\t0001\t5.000\tA plane is taking off.\tAn air plane is taking off.\n'
    # an unbalanced double quote: a CSV reader would swallow the following lines into this field
    'main-forums\tanswer-answer\t2016\t0120\t1\tHe said "no.\tShe said no.\tsource A\tsource B\n'
    'main-news\theadlines\t2016\t0015\t3.2\tA\tB\n'
)


def test_stsb_original_files_by_raw_tab_splitting(tmp_path):
    write(tmp_path / "sts-dev.csv", STSB_ROWS)
    pairs = datasets.read_stsb(tmp_path, "dev")
    assert pairs == [datasets.ScoredPair("A plane is taking off.", "An air plane is taking off.", 5.0),
                     datasets.ScoredPair('He said "no.', "She said no.", 1.0),
                     datasets.ScoredPair("A", "B", 3.2)]


def test_stsb_sentence_transformers_gz_format(tmp_path):
    write_gz(tmp_path / "stsbenchmark.tsv.gz",
             "split\tgenre\tdataset\tyear\tsid\tscore\tsentence1\tsentence2\n"
             "train\tmain-news\theadlines\t2016\t1\t2.5\tt1\tt2\n"
             "test\tmain-news\theadlines\t2016\t2\t4.0\tu1\tu2\n"
             "test\tmain-captions\tMSRvid\t2012\t3\t0.0\tv1\tv2\n")
    assert datasets.read_stsb(tmp_path, "test") == [datasets.ScoredPair("u1", "u2", 4.0), datasets.ScoredPair("v1", "v2", 0.0)]
    assert datasets.read_stsb(tmp_path, "dev") == []


def test_stsb_malformed_line(tmp_path):
    path = write(tmp_path / "sts-test.csv", STSB_ROWS + "main-news\theadlines\t2016\t0016\tfive\tA\tB\n"
                 + "too\tfew\n")
    with pytest.raises(ValueError, match=rf"{path}, line 4: score 'five' is not a number"):
        datasets.read_stsb(tmp_path, "test")


SICK_HEADER = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"


def make_sick(folder: Path) -> Path:
    write(folder / "SICK_train.txt", SICK_HEADER + "1\tA dog runs\tA dog is running\t4.8\tENTAILMENT\n")
    write(folder / "SICK_trial.txt", SICK_HEADER + "2\tA cat sleeps\tNo cat sleeps\t3\tCONTRADICTION\n")
    # the published test file has Windows line endings
    write(folder / "SICK_test_annotated.txt", (SICK_HEADER + "3\tA man cooks\tA woman sings\t1.2\tNEUTRAL\n"
                                               "4\tKids play\tChildren play\t5\tENTAILMENT\n").replace("\n", "\r\n"))
    return folder


def test_sick_splits_labels_and_all(tmp_path):
    make_sick(tmp_path)
    assert datasets.read_sick(tmp_path, "test") == [datasets.ScoredPair("A man cooks", "A woman sings", 1.2, "NEUTRAL"),
                                                datasets.ScoredPair("Kids play", "Children play", 5.0, "ENTAILMENT")]
    assert datasets.read_sick(tmp_path, "dev") == datasets.read_sick(tmp_path, "trial")
    assert [p.score for p in datasets.read_sick(tmp_path, "all")] == [4.8, 3.0, 1.2, 5.0]  # train, trial, test
    assert datasets.ENTAILMENT_LABELS.index("CONTRADICTION") == 0


def test_sick_bad_label_and_bad_header(tmp_path):
    make_sick(tmp_path)
    write(tmp_path / "SICK_train.txt", SICK_HEADER + "1\ta\tb\t4\tENTAILMENT\n2\ta\tb\t4\tMAYBE\n")
    with pytest.raises(ValueError, match=r"SICK_train\.txt, line 3: entailment label 'MAYBE'"):
        datasets.read_sick(tmp_path, "train")
    write(tmp_path / "SICK_trial.txt", "1\ta\tb\t4\tENTAILMENT\n")
    with pytest.raises(ValueError, match=r"SICK_trial\.txt, line 1: expected the header"):
        datasets.read_sick(tmp_path, "trial")


def test_scores_to_unit_interval():  # approx: one float64 division may land an ulp from the literal
    assert datasets.to_unit_score("stsb", 3.8) == pytest.approx(0.76)  # 3.8 / 5
    assert datasets.to_unit_score("sick", 4.0) == pytest.approx(0.75)  # (4 - 1) / 4
    assert datasets.to_unit_score("sick", 1.0) == 0.0
    for dataset, score in (("stsb", 7.0), ("stsb", -0.5), ("sick", 0.5), ("sick", float("nan"))):
        with pytest.raises(ValueError, match=f"{dataset} gold score {score!r} is outside its scale"):
            datasets.to_unit_score(dataset, score)  # 7 became the target 1.4, a cosine no pair can reach
    with pytest.raises(ValueError, match="unknown STS dataset 'sts12'"):
        datasets.to_unit_score("sts12", 3.0)


# ----------------------------------------------------------------------------- pairs.tsv, triplets.tsv

def test_pairs_and_triplets_round_trip(tmp_path):
    pairs = [datasets.ScoredPair("a cat", "a kitten", 0.9), datasets.ScoredPair("a cat", "a tax form", 0.0)]
    triplets = [datasets.Triplet("how to boil an egg", "Boil the egg for eight minutes.", "Paint dries overnight.")]
    datasets.write_pairs_tsv(tmp_path / "pairs.tsv", pairs)
    datasets.write_triplets_tsv(tmp_path / "triplets.tsv", triplets)
    assert (tmp_path / "pairs.tsv").read_text().splitlines()[0] == "sentence1\tsentence2\tscore"
    assert datasets.read_pairs_tsv(tmp_path / "pairs.tsv") == pairs
    assert datasets.read_triplets_tsv(tmp_path / "triplets.tsv") == triplets
    # without a header the first line is data
    write(tmp_path / "bare.tsv", "x\ty\t0.5\n")
    assert datasets.read_pairs_tsv(tmp_path / "bare.tsv") == [datasets.ScoredPair("x", "y", 0.5)]


def test_pairs_and_triplets_malformed(tmp_path):
    path = write(tmp_path / "pairs.tsv", "sentence1\tsentence2\tscore\nx\ty\t0.5\nx\ty\t3.5\n")
    with pytest.raises(ValueError, match=rf"{path}, line 3: score 3.5 is outside \[0, 1\]"):
        datasets.read_pairs_tsv(path)
    path = write(tmp_path / "triplets.tsv", "a\tp\tn\na\tp\n")
    with pytest.raises(ValueError, match=rf"{path}, line 2: expected 3 non-empty"):
        datasets.read_triplets_tsv(path)
    with pytest.raises(ValueError, match="tab or line break"):
        datasets.write_triplets_tsv(tmp_path / "bad.tsv", [datasets.Triplet("a\tb", "p", "n")])


# ----------------------------------------------------------------------------- MS MARCO, Quora

def test_msmarco_collection_queries_and_qrels(tmp_path):
    collection = write(tmp_path / "collection.tsv", "0\tThe first passage.\n1\tThe second passage.\n")
    assert datasets.read_id_text_tsv(collection) == {"0": "The first passage.", "1": "The second passage."}
    queries = write_gz(tmp_path / "queries.train.tsv.gz", "121352\tdefine extreme\n")
    assert datasets.read_id_text_tsv(queries) == {"121352": "define extreme"}
    qrels = write(tmp_path / "qrels.train.tsv", "121352\t0\t2912791\t1\n634306 0 7282917 1\n")
    assert datasets.read_trec_qrels(qrels) == {"121352": {"2912791": 1}, "634306": {"7282917": 1}}
    bad = write(tmp_path / "dup.tsv", "0\ta\n0\tb\n")
    with pytest.raises(ValueError, match=rf"{bad}, line 2: duplicate id '0'"):
        datasets.read_id_text_tsv(bad)
    bad = write(tmp_path / "bad_qrels.tsv", "1 0 2 1\n1 0 3\n")
    with pytest.raises(ValueError, match=rf"{bad}, line 2: expected 4 fields"):
        datasets.read_trec_qrels(bad)


def test_hard_negatives_and_margin_filter(tmp_path):
    path = write_gz(tmp_path / "msmarco-hard-negatives.jsonl.gz", jsonl([
        {"qid": 1, "pos": [10], "neg": {"bm25": [11, 12, 13], "tas-b": [12, 14, 10]}},
        {"qid": 2, "pos": [20], "neg": {"bm25": [21]}},
    ]))
    entries = datasets.read_hard_negatives(path)
    assert entries[0] == datasets.HardNegatives("1", ["10"], {"bm25": ["11", "12", "13"], "tas-b": ["12", "14", "10"]})
    scores = {"1": {"10": 9.0, "11": 7.0, "12": 6.0, "13": -2.0},  # 14 has no score
              "2": {"21": 0.0}}  # the positive 20 has no score: query 2 cannot be judged
    kept = datasets.filter_hard_negatives(entries, scores, margin=3.0)
    # ceiling = 9 - 3 = 6: 11 (7 > 6) goes, 12 (6 <= 6) and 13 stay; 14 unscored and 10 positive go
    assert kept == [datasets.HardNegatives("1", ["10"], {"bm25": ["12", "13"], "tas-b": ["12"]})]
    bad = write(tmp_path / "bad.jsonl", jsonl([{"qid": 1, "pos": [1], "neg": {}}]) + '{"qid": 2, "pos": 3}\n')
    with pytest.raises(ValueError, match=rf"{bad}, line 2: expected"):
        datasets.read_hard_negatives(bad)


def test_cross_encoder_scores_from_pickle_json_and_tsv(tmp_path):
    table = {571018: {7349777: 9.25, 6948601: -4.5}, 1: {2: 0.0}}  # int ids, as in the published file
    expected = {"571018": {"7349777": 9.25, "6948601": -4.5}, "1": {"2": 0.0}}
    with gzip.open(tmp_path / "scores.pkl.gz", "wb") as out:
        pickle.dump(table, out)
    assert datasets.read_cross_encoder_scores(tmp_path / "scores.pkl.gz") == expected
    write(tmp_path / "scores.json", json.dumps(table))
    assert datasets.read_cross_encoder_scores(tmp_path / "scores.json") == expected
    write(tmp_path / "scores.tsv", "571018\t7349777\t9.25\n571018\t6948601\t-4.5\n1\t2\t0\n")
    assert datasets.read_cross_encoder_scores(tmp_path / "scores.tsv") == expected


class Hostile:
    """Unpickling this runs a shell command: pickle calls what __reduce__ names."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"echo pwned > {self.marker}",)


def test_restricted_unpickler_refuses_code_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({1: {2: Hostile(marker)}})
    with gzip.open(tmp_path / "scores.pkl.gz", "wb") as out:
        out.write(payload)
    with pytest.raises(ValueError, match=r"scores\.pkl\.gz: refusing to load (os|posix)\.system"):
        datasets.read_cross_encoder_scores(tmp_path / "scores.pkl.gz")
    assert not marker.exists()
    # The same bytes through the ordinary unpickler do run the command: the refusal above is what
    # stopped it.
    pickle.loads(payload)
    assert marker.read_text().strip() == "pwned"


def test_quora_duplicates_by_column_name(tmp_path):
    path = write(tmp_path / "quora_duplicate_questions.tsv",
                 "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
                 "0\t1\t2\tHow do I learn Python?\tWhat is the best way to learn Python?\t1\n"
                 '1\t3\t4\t"A question\nover two lines?"\tAnother question\t0\n')
    assert datasets.read_quora_duplicates(path) == [
        datasets.DuplicateQuestions("1", "2", "How do I learn Python?", "What is the best way to learn Python?", 1),
        datasets.DuplicateQuestions("3", "4", "A question\nover two lines?", "Another question", 0)]
    bad = write(tmp_path / "bad.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n0\t1\t2\ta\tb\tyes\n")
    with pytest.raises(ValueError, match=rf"{bad}, line 2: is_duplicate 'yes' is not an integer"):
        datasets.read_quora_duplicates(bad)
    bad = write(tmp_path / "no_header.tsv", "0\t1\t2\ta\tb\t1\n")
    with pytest.raises(ValueError, match=r"no_header\.tsv: the header \(line 1\) lacks the column\(s\) \['id', "):
        datasets.read_quora_duplicates(bad)


# ----------------------------------------------------------------------------- Q&A CSV -> BEIR

QA_CSV = ('question,answer\n'
          'How do I reset my password?,"Open settings, then choose reset password."\n'
          'Where is the GPU driver log?,The driver writes its log to /var/log.\n'
          'What is CUDA?,CUDA is a parallel computing platform.\n'
          'How do I update drivers?,Download the newest driver package and install it.\n')


def test_qa_csv_to_beir_positives_only(tmp_path):
    split = datasets.qa_csv_to_beir(write(tmp_path / "qa.csv", QA_CSV), tmp_path / "beir")
    assert split.queries["q0"] == "How do I reset my password?"
    assert split.corpus["a0"] == "Open settings, then choose reset password."
    assert split.qrels == {f"q{i}": {f"a{i}": 1} for i in range(4)}
    assert (tmp_path / "beir" / "qrels" / "test.tsv").read_text().startswith("query-id\tcorpus-id\tscore\n")


def test_qa_csv_negatives_are_sampled_below_the_threshold(tmp_path):
    # A made-up similarity: question i vs answer j. Own answers (diagonal) score 0.9, 0.6, 0.3, 0.6,
    # so Silveri's threshold is 0.3 + (0.9 - 0.3) / 3 = 0.5.
    table = np.array([[0.9, 0.1, 0.2, 0.7],
                      [0.4, 0.6, 0.5, 0.1],
                      [0.8, 0.9, 0.3, 0.95],
                      [0.2, 0.3, 0.45, 0.6]])

    def similarity(questions, answers):
        assert len(questions) == len(answers) == 4
        return table

    split = datasets.qa_csv_to_beir(write(tmp_path / "qa.csv", QA_CSV), tmp_path / "beir",
                                negatives_per_question=5, similarity=similarity)
    # Below 0.5 and not the own answer: q0 -> a1, a2; q1 -> a0, a3 (a2 = 0.5 is not below);
    # q2 -> none; q3 -> a0, a1, a2. Five requested, so all of them are taken.
    assert split.qrels == {"q0": {"a0": 1, "a1": 0, "a2": 0}, "q1": {"a1": 1, "a0": 0, "a3": 0},
                           "q2": {"a2": 1}, "q3": {"a3": 1, "a0": 0, "a1": 0, "a2": 0}}
    # One negative each: drawn from the same candidates, reproducibly for a seed.
    first = datasets.qa_csv_to_beir(tmp_path / "qa.csv", tmp_path / "one", negatives_per_question=1,
                                similarity=similarity, seed=3)
    again = datasets.qa_csv_to_beir(tmp_path / "qa.csv", tmp_path / "two", negatives_per_question=1,
                                similarity=similarity, seed=3)
    assert first.qrels == again.qrels
    for query_id, judged in first.qrels.items():
        negatives = {d for d, s in judged.items() if s == 0}
        assert len(negatives) == (0 if query_id == "q2" else 1)
        assert negatives <= {d for d, s in split.qrels[query_id].items() if s == 0}


def test_qa_csv_default_jaccard_and_bad_columns(tmp_path):
    path = write(tmp_path / "qa.csv", QA_CSV)
    split = datasets.qa_csv_to_beir(path, tmp_path / "beir", negatives_per_question=2, threshold=0.05)
    for i in range(4):  # any answer sharing no word with the question qualifies (Jaccard 0 < 0.05)
        assert split.qrels[f"q{i}"][f"a{i}"] == 1
    assert sum(s == 0 for judged in split.qrels.values() for s in judged.values()) > 0
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['prompt'\]; the columns found are \['question', 'answer'\]"):
        datasets.qa_csv_to_beir(path, tmp_path / "x", question_column="prompt")


def test_qa_csv_rows_that_do_not_fit_the_header(tmp_path):
    path = write(tmp_path / "qa.csv", "question,answer\nWhat is CUDA?,A platform, for GPUs.\n")
    with pytest.raises(ValueError, match=rf"{path}, line 2: expected 2 fields as in the header, found 3 "
                                         r"\(quote a field that holds ','\)"):
        datasets.qa_csv_to_beir(path, tmp_path / "x")
    path = write(tmp_path / "qa.csv", "question,answer\nWhat is CUDA?,\n")
    with pytest.raises(ValueError, match=rf"{path}, line 2: empty question or answer"):
        datasets.qa_csv_to_beir(path, tmp_path / "x")
    with pytest.raises(ValueError, match="has a header but no question/answer rows"):
        datasets.qa_csv_to_beir(write(tmp_path / "empty.csv", "question,answer\n"), tmp_path / "x")


def test_qa_csv_folder_converts_once_per_content(tmp_path, monkeypatch):
    path = write(tmp_path / "questions.csv", QA_CSV)
    cache = tmp_path / "cache"
    folder = datasets.qa_csv_folder(path, cache)
    assert folder.parent == cache and folder.name.startswith("questions-")
    assert datasets.load_beir(folder, "test").qrels == {f"q{i}": {f"a{i}": 1} for i in range(4)}
    assert [p.name for p in cache.iterdir()] == [folder.name]  # no staging folder left

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(datasets.qa_csv, "qa_csv_to_beir", no_conversion)
    assert datasets.qa_csv_folder(path, cache) == folder  # same bytes: the cached folder
    monkeypatch.undo()
    write(path, QA_CSV + "What is a GPU?,A graphics processor.\n")
    edited = datasets.qa_csv_folder(path, cache)
    assert edited != folder and len(datasets.load_beir(edited, "test").queries) == 5
    with pytest.raises(FileNotFoundError, match=r"missing\.csv does not exist; --data takes"):
        datasets.qa_csv_folder(tmp_path / "missing.csv", cache)


def test_a_failed_conversion_leaves_nothing_in_the_cache(tmp_path):
    path = write(tmp_path / "questions.csv", "prompt,response\nhi,hello\n")
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['question', 'answer'\]; the columns found are "
                                         r"\['prompt', 'response'\]"):
        datasets.qa_csv_folder(path, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


# ----------------------------------------------------------------------------- named datasets

@pytest.fixture
def no_mirror(monkeypatch):
    monkeypatch.delenv(datasets.MIRROR_ENV, raising=False)
    monkeypatch.delenv(datasets.DOWNLOAD_URL_ENV, raising=False)


def test_resolution_order(tmp_path, monkeypatch, no_mirror):
    user, repo, mirror = tmp_path / "user", tmp_path / "repo_data", tmp_path / "mirror"
    for folder in (user / "scifact", repo / "scifact", mirror / "scifact"):
        make_beir(folder)
    monkeypatch.setenv(datasets.MIRROR_ENV, str(mirror))
    # 1. a folder the caller names: the dataset folder itself, or a folder holding <name>/
    assert datasets.resolve_dataset("scifact", user / "scifact", data_root=repo) == user / "scifact"
    assert datasets.resolve_dataset("scifact", user, data_root=repo) == user / "scifact"
    # 2. data/<name> of the repository before 3. the mirror
    assert datasets.resolve_dataset("scifact", data_root=repo) == repo / "scifact"
    (repo / "scifact" / "corpus.jsonl").unlink()
    assert datasets.resolve_dataset("scifact", data_root=repo, download=False) == mirror / "scifact"
    # a named folder without the dataset is an error, not a reason to look elsewhere
    with pytest.raises(datasets.DatasetNotFoundError, match="is not in .* expected one of the files corpus.jsonl"):
        datasets.resolve_dataset("scifact", tmp_path / "empty", data_root=repo)


def test_offline_error_names_dataset_places_and_remedies(tmp_path, no_mirror):
    url = closed_port_url()
    with pytest.raises(datasets.DatasetNotFoundError) as error:
        datasets.resolve_dataset("sick", data_root=tmp_path, base_url=url)
    message = str(error.value)
    assert "dataset 'sick' not found" in message
    assert str(tmp_path / "sick") in message
    assert "$MINISBERT_DATA_MIRROR (not set)" in message
    assert f"download from {url} failed ({url}/sick_train.zip is unreachable" in message
    assert "set MINISBERT_DATA_MIRROR" in message and "--data FOLDER" in message
    assert list(tmp_path.iterdir()) == []  # no dataset folder, no staging folder
    with pytest.raises(ValueError, match="unknown dataset 'msmarco'"):
        datasets.resolve_dataset("msmarco")


def scifact_like_zip(tmp_path: Path) -> bytes:
    """A tiny archive laid out like BEIR's scifact.zip: everything under scifact/."""
    make_beir(tmp_path / "zip_source")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in sorted((tmp_path / "zip_source").rglob("*")):
            if path.is_file():
                archive.write(path, "scifact/" + path.relative_to(tmp_path / "zip_source").as_posix())
    return buffer.getvalue()


def test_download_checks_digest_then_unpacks(tmp_path, monkeypatch, server, no_mirror):
    archive = scifact_like_zip(tmp_path)
    server.files["/scifact.zip"] = archive
    real = datasets.SOURCES["scifact"]
    monkeypatch.setitem(datasets.SOURCES, "scifact", datasets.Source(
        base_url=real.base_url, files=real.files, layouts=real.layouts,
        sha256={"scifact.zip": hashlib.sha256(archive).hexdigest()}))
    root = tmp_path / "repo_data"
    monkeypatch.setenv(datasets.DOWNLOAD_URL_ENV, server.url)  # the base URL is overridable by environment...
    assert datasets.resolve_dataset("scifact", data_root=root) == root / "scifact"
    assert sorted(p.name for p in root.iterdir()) == ["scifact"]  # no staging folder, no zip left
    assert datasets.load_beir(root / "scifact", "test").qrels == {"q1": {"d1": 1}, "q2": {"d2": 1, "d3": 0}}


def test_download_with_wrong_digest_leaves_nothing(tmp_path, monkeypatch, server, no_mirror):
    server.files["/scifact.zip"] = scifact_like_zip(tmp_path)
    root = tmp_path / "repo_data"
    # ...or by argument. The real entry expects BEIR's archive, not this one.
    with pytest.raises(ValueError, match=r"scifact\.zip: SHA-256 is [0-9a-f]{64}, expected 536e1444"):
        datasets.resolve_dataset("scifact", data_root=root, base_url=server.url)
    assert list(root.iterdir()) == []
    # A digest of a file inside the archive is checked after unpacking.
    real = datasets.SOURCES["scifact"]
    monkeypatch.setitem(datasets.SOURCES, "scifact", datasets.Source(
        base_url=real.base_url, files=real.files, layouts=real.layouts, sha256={"corpus.jsonl": "0" * 64}))
    with pytest.raises(ValueError, match=r"corpus\.jsonl: SHA-256 is .*expected 0000"):
        datasets.download_dataset("scifact", data_root=root, base_url=server.url)
    assert list(root.iterdir()) == []


def test_download_of_a_missing_file_is_reported_as_not_found(tmp_path, server, no_mirror):
    # the server has no files: 404
    with pytest.raises(datasets.DatasetNotFoundError,
                       match=rf"from {server.url} failed \({server.url}/stsbenchmark\.tsv\.gz does not exist \(HTTP 404\)"):
        datasets.resolve_dataset("stsb", data_root=tmp_path / "repo_data", base_url=server.url)
    assert list((tmp_path / "repo_data").iterdir()) == []


def test_a_download_the_reader_rejects_is_not_kept(tmp_path, server, no_mirror):
    stsb_gz = io.BytesIO()
    with gzip.open(stsb_gz, "wt", encoding="utf-8") as out:
        out.write("split\tgenre\tdataset\tyear\tsid\tscore\tsentence1\tsentence2\n"
                  "test\tmain-news\theadlines\t2016\t2\tfour\tu1\tu2\n")
    server.files["/stsbenchmark.tsv.gz"] = stsb_gz.getvalue()
    with pytest.raises(ValueError, match=r"stsbenchmark\.tsv\.gz, line 2: score 'four' is not a number"):
        datasets.resolve_dataset("stsb", data_root=tmp_path, base_url=server.url)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- what --data stands for

def make_stsb(folder: Path) -> Path:
    for split in datasets.STSB_SPLITS:
        write(folder / f"sts-{split}.csv", STSB_ROWS)
    return folder


def test_sts_name_recognises_each_layout_in_the_folder_or_below_it(tmp_path):
    assert datasets.sts_name("stsb") == "stsb" and datasets.sts_name("sick") == "sick"  # names: no I/O
    make_stsb(tmp_path / "original")
    write_gz(tmp_path / "packed" / "stsbenchmark.tsv.gz", "")
    make_sick(tmp_path / "parent" / "sick")
    assert datasets.sts_name(str(tmp_path / "original")) == "stsb"
    assert datasets.sts_name(str(tmp_path / "packed")) == "stsb"
    assert datasets.sts_name(str(tmp_path / "parent" / "sick")) == "sick"
    assert datasets.sts_name(str(tmp_path / "parent")) == "sick"  # a folder holding sick/
    assert datasets.sts_name(str(make_beir(tmp_path / "beir"))) is None
    assert datasets.sts_name("scifact") is None and datasets.sts_name(str(tmp_path / "no-such-folder")) is None
    make_stsb(tmp_path / "parent" / "stsb")
    with pytest.raises(ValueError, match=r"holds both STS-B .* and SICK .*; pass the folder of the one you mean"):
        datasets.sts_name(str(tmp_path / "parent"))


def test_load_sts_reads_a_folder_in_its_own_layout(tmp_path):
    make_stsb(tmp_path / "mine" / "stsb")
    make_sick(tmp_path / "theirs")
    assert datasets.load_sts(str(tmp_path / "mine"), "dev") == datasets.read_stsb(tmp_path / "mine" / "stsb", "dev")
    assert [p.label for p in datasets.load_sts(str(tmp_path / "theirs"), "all")] == \
        ["ENTAILMENT", "CONTRADICTION", "NEUTRAL", "ENTAILMENT"]
    # a folder with only the test split of STS-B is still STS-B; the missing split is named when read
    only_test = tmp_path / "only_test"
    write(only_test / "sts-test.csv", STSB_ROWS)
    assert len(datasets.load_sts(str(only_test), "test")) == 3
    with pytest.raises(FileNotFoundError, match=r"only_test has neither sts-train\.csv nor stsbenchmark\.tsv\.gz"):
        datasets.load_sts(str(only_test), "train")


def test_what_data_names_the_kind_of_every_data_value_without_reading_it(tmp_path):
    """One answer to "what does --data name?", for train.py, evaluate.py and the studies alike."""
    make_stsb(tmp_path / "stsb_copy")
    write(tmp_path / "quora" / datasets.QUORA_FILE, "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n")
    kinds = {value: datasets.what_data(value) for value in
             ("stsb", "sick", str(tmp_path / "stsb_copy"), "questions.csv", str(tmp_path / "quora"), "example",
              "scifact", "nonsense")}
    assert [(source.kind, source.sts) for source in kinds.values()] == [
        (datasets.STS, "stsb"), (datasets.STS, "sick"), (datasets.STS, "stsb"), (datasets.QA_CSV, None),
        (datasets.QUORA, None), (datasets.FOLDER, None), (datasets.FOLDER, None), (datasets.FOLDER, None)]
    with pytest.raises(ValueError, match="--data 'nonsense' is neither a folder nor a named dataset"):
        kinds["nonsense"].folder()  # a folder is looked for (and a named dataset fetched) only when asked


def test_the_retrieval_folder_is_the_folder_or_its_scifact_or_the_converted_csv(tmp_path):
    make_beir(tmp_path / "holder" / "scifact")
    for data in (tmp_path / "holder", tmp_path / "holder" / "scifact"):
        assert datasets.what_data(str(data)).retrieval_folder(tmp_path / "cache") == tmp_path / "holder" / "scifact"
    assert datasets.what_data("example").retrieval_folder(tmp_path / "cache") == datasets.REPO_DATA / "example"
    write(tmp_path / "qa.csv", "question,answer\nwhy is the sky blue,air scatters blue light\n")
    folder = datasets.what_data(str(tmp_path / "qa.csv")).retrieval_folder(tmp_path / "cache")
    assert folder.parent == tmp_path / "cache" and (folder / "corpus.jsonl").is_file()


# ----------------------------------------------------------------------------- real data (mirror)

@pytest.mark.slow
def test_real_scifact_counts(data_mirror, no_mirror):
    test = datasets.load_scifact("test", folder=data_mirror, download=False)
    assert len(test.corpus) == 5183
    assert len(test.queries) == 300
    assert sum(len(judged) for judged in test.qrels.values()) == 339
    train = datasets.load_scifact("train", folder=data_mirror, download=False)
    assert (len(train.queries), sum(len(judged) for judged in train.qrels.values())) == (809, 919)


@pytest.mark.slow
def test_real_sts_counts(data_mirror):
    assert [len(datasets.load_stsb(s, folder=data_mirror, download=False)) for s in datasets.STSB_SPLITS] == [5749, 1500, 1379]
    sick = {s: datasets.load_sick(s, folder=data_mirror, download=False) for s in ("train", "trial", "test", "all")}
    assert [len(sick[s]) for s in ("train", "trial", "test")] == [4500, 500, 4927]
    assert len(sick["all"]) == 4500 + 500 + 4927 == 9927
    assert all(1.0 <= p.score <= 5.0 and p.label in datasets.ENTAILMENT_LABELS for p in sick["all"])


@pytest.mark.slow
def test_mirror_files_match_the_recorded_digests(data_mirror):
    # The SICK digests that a download is checked against are those of the mirror's files.
    for name, digest in datasets.SOURCES["sick"].sha256.items():
        assert hashlib.sha256((data_mirror / "sick" / name).read_bytes()).hexdigest() == digest


# ----------------------------------------------------------------------------- the repository's example

def test_example_dataset_is_complete_and_keeps_test_questions_out_of_training():
    folder = datasets.REPO_DATA / "example"
    splits = {}
    for split in ("train", "dev", "test"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # every judgment must name a known query and document
            splits[split] = datasets.load_beir(folder, split)
    assert len(splits["test"].corpus) == 48
    assert [len(splits[s].queries) for s in ("train", "dev", "test")] == [8, 6, 8]
    assert not set(splits["train"].queries) & set(splits["test"].queries)
    pairs = datasets.read_pairs_tsv(folder / "pairs.tsv")
    triplets = datasets.read_triplets_tsv(folder / "triplets.tsv")
    assert len(pairs) == len(triplets) == 84
    training_text = {p.sentence1 for p in pairs} | {p.sentence2 for p in pairs} | \
        {t.anchor for t in triplets} | {t.positive for t in triplets} | {t.negative for t in triplets}
    held_out = set(splits["dev"].queries.values()) | set(splits["test"].queries.values())
    assert not training_text & held_out
