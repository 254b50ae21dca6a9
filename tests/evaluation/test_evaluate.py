"""Tests for evaluate.py (the command line) and minisbert/evaluation/benchmark.py (ranking, cache, STS).

What "correct" means for evaluation:
- the JSON maps every model to {metric@k: value} for every metric and every k asked for;
- scoring a hand-written TREC run gives hand-computed numbers, and a model whose embeddings rank
  the documents the same way gives the same numbers;
- a run written with --run-file, scored back with --run/--qrels, gives the model's numbers exactly;
- without --output the JSON is named after the data, the split and the models of the run, so a run
  of other models on the same data leaves the earlier results in place;
- a second evaluation of the same model on the same corpus reads the corpus embeddings from the
  cache instead of encoding them, and gives identical numbers; an entry that does not fit (a row
  short, another width or dtype, a NaN, a file cut in half) is encoded again with a warning;
- bad input stops with a message naming the file, line or value at fault;
- nothing is printed or written until the whole evaluation has succeeded: a model that fails to
  load, or a full disk (a file size limit set on the process), leaves no metrics on the screen and no
  part of a run file; an output folder that cannot be written is refused before any work.

evaluate.main runs in-process on the tiny random model in tests/fixtures/tiny_st_legacy (its
embeddings are unit length), BM25 / Jaccard (no model), data/example, and small BEIR folders and
pairs.tsv files written in tmp_path.
"""

import hashlib
import json
import math
import re
import os
import resource
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

import evaluate
import minisbert
from minisbert import datasets
from minisbert.evaluation import benchmark as evaluation
from minisbert.evaluation import metrics, significance
from minisbert.encoding.model import SentenceModel

from ..conftest import FIXTURES, REPO, assert_one_clear_line, run_script
from ..tolerances import float32_apart, scores_apart

TINY = str(FIXTURES / "tiny_st_legacy")
EXAMPLE = REPO / "data" / "example"
METRICS = ("accuracy", "precision", "recall", "mrr", "ndcg", "map")


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Each test gets an empty embedding cache of its own (never the repository's .cache)."""
    monkeypatch.setattr(evaluate, "CACHE_DIR", tmp_path / "cache")
    return tmp_path / "cache" / "embeddings"


def evaluate_to_json(output, *args, per_query: bool = False) -> dict:
    """Run `python evaluate.py ARGS --output OUTPUT` in-process and return the JSON it wrote, less
    each model's per-query values unless per_query (tested on their own)."""
    evaluate.main([*args, "--output", str(output)])
    results = json.loads(output.read_text())
    if not per_query:
        for scores in results.values():
            scores.pop("per_query", None)
    return results


def spy_on_encode(monkeypatch) -> list:
    """Record the texts of every SentenceModel.encode call (the real encode still runs)."""
    calls = []
    encode = SentenceModel.encode

    def recording_encode(self, texts, *args, **kwargs):
        calls.append(list(texts))
        return encode(self, texts, *args, **kwargs)

    monkeypatch.setattr(SentenceModel, "encode", recording_encode)
    return calls


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def write_trec_qrels(path, qrels):
    return write_lines(path, [f"{q} 0 {d} {grade}" for q, judged in qrels.items() for d, grade in judged.items()])


# ---- a problem small enough to score by hand -----------------------------------------------------
# Qrels: q1 judges d1 and d3 relevant (grade 1) and d9 not relevant (grade 0); q2 judges d2 grade 2
# and d5 grade 1. The hand-written run ranks q1: d2, d1, d4, d3 and q2: d2, d7, d5.

HAND_QRELS = {"q1": {"d1": 1, "d3": 1, "d9": 0}, "q2": {"d2": 2, "d5": 1}}
HAND_RUN_LINES = [
    "q1 Q0 d2 1 0.9 hand",
    "q1 Q0 d1 2 0.8 hand",
    "q1 Q0 d4 3 0.7 hand",
    "q1 Q0 d3 4 0.6 hand",
    "q2 Q0 d2 1 0.5 hand",
    "q2 Q0 d7 2 0.4 hand",
    "q2 Q0 d5 3 0.3 hand",
]
LOG2_3 = math.log2(3)  # 1.5849625
HAND_ST = {  # sentence-transformers definitions, the mean of q1 and q2
    # relevant ranks: q1 {2, 4}, q2 {1, 3}
    "accuracy@1": (0 + 1) / 2,
    "accuracy@3": (1 + 1) / 2,
    "precision@1": (0 + 1) / 2,
    "precision@3": (1 / 3 + 2 / 3) / 2,  # = 0.5
    "recall@1": (0 / 2 + 1 / 2) / 2,  # = 0.25
    "recall@3": (1 / 2 + 2 / 2) / 2,  # = 0.75
    "mrr@1": (0 + 1) / 2,
    "mrr@3": (1 / 2 + 1) / 2,  # = 0.75
    "ndcg@1": (0 + 1) / 2,
    # q1: DCG = 1/log2(3) = 0.6309, ideal = 1 + 1/log2(3) = 1.6309 -> 0.3869
    # q2: DCG = 1 + 1/log2(4) = 1.5, ideal = 1.6309 -> 0.9197
    "ndcg@3": ((1 / LOG2_3) / (1 + 1 / LOG2_3) + 1.5 / (1 + 1 / LOG2_3)) / 2,  # = 0.6533
    "map@1": (0 + 1 / 1) / 2,  # q2: precision 1 at rank 1, divided by min(1, 2) = 1
    # q1: precision 1/2 at rank 2, / min(3, 2) = 0.25; q2: (1 + 2/3) / 2 = 0.8333
    "map@3": (0.5 / 2 + (1 + 2 / 3) / 2) / 2,  # = 0.5417
}
# Two float64 computations of a handful of operations on the same values (a metric by hand and from a
# run, a difference of two means, one correlation by two call paths) lie an ulp or two apart (1.1e-16
# each near 1): 1e-12 is far outside that, and far inside what another definition moves a metric by
# (ST's NDCG@3 against trec_eval's here: 0.015).
FLOAT64_APART = 1e-12
HAND_TREC = dict(HAND_ST)  # trec_eval differs in graded NDCG and in MAP@1's denominator
HAND_TREC["map@1"] = (0 + 1 / 2) / 2  # map_cut_1 divides by #relevant = 2, not min(1, 2)
# q2 with graded gains: DCG = 2 + 1/log2(4) = 2.5, ideal = 2 + 1/log2(3) = 2.6309 -> 0.9502
HAND_TREC["ndcg@1"] = (0 + 2 / 2) / 2
HAND_TREC["ndcg@3"] = ((1 / LOG2_3) / (1 + 1 / LOG2_3) + 2.5 / (2 + 1 / LOG2_3)) / 2  # = 0.6685
HAND_TREC["mrr"] = (1 / 2 + 1) / 2  # recip_rank, no cutoff

# Unit vectors at these angles (degrees) make cosine rank the documents as the hand-written run
# does. Angle away from q1 (0): d2 10, d1 20, d4 30, d3 40, d7 75, d5 78, d9 120. Away from q2
# (-30): d2 40, d7 45, d5 48, d1 50, d4 60, d3 70, d9 150.
ANGLES = {"query q1": 0, "query q2": -30, "doc d1": 20, "doc d2": 10, "doc d3": 40, "doc d4": 30,
          "doc d5": -78, "doc d7": -75, "doc d9": 120}


def unit_vector(degrees: float) -> np.ndarray:
    return np.array([math.cos(math.radians(degrees)), math.sin(math.radians(degrees))])


def fake_encode(self, texts, *args, **kwargs):
    return np.stack([unit_vector(ANGLES[text]) for text in texts]).astype(np.float32)  # (n, 2)


@pytest.fixture
def hand_folder(tmp_path):
    """The hand problem as a BEIR folder: documents "doc dX", queries "query qX"."""
    folder = tmp_path / "hand"
    corpus = {d: f"doc {d}" for d in ("d1", "d2", "d3", "d4", "d5", "d7", "d9")}
    datasets.write_beir(folder, corpus, {"q1": "query q1", "q2": "query q2"}, HAND_QRELS)
    return folder


@pytest.mark.parametrize("definitions, expected", [("st", HAND_ST), ("trec", HAND_TREC)])
def test_scoring_a_trec_run_gives_the_hand_computed_numbers(tmp_path, definitions, expected):
    run = write_lines(tmp_path / "hand.trec", HAND_RUN_LINES)
    qrels = write_trec_qrels(tmp_path / "qrels.txt", HAND_QRELS)
    results = evaluate_to_json(tmp_path / "out.json", "--run", str(run), "--qrels", str(qrels),
                               "--k", "1", "3", "--definitions", definitions)
    assert list(results) == [str(run)]
    assert results[str(run)] == pytest.approx(expected, abs=FLOAT64_APART)


@pytest.mark.parametrize("definitions", ["st", "trec"])
def test_a_model_ranking_like_the_run_scores_like_the_run(tmp_path, monkeypatch, hand_folder, definitions):
    monkeypatch.setattr(SentenceModel, "encode", fake_encode)
    run = write_lines(tmp_path / "hand.trec", HAND_RUN_LINES)
    qrels = write_trec_qrels(tmp_path / "qrels.txt", HAND_QRELS)
    from_run = evaluate_to_json(tmp_path / "run.json", "--run", str(run), "--qrels", str(qrels),
                                "--k", "1", "3", "--definitions", definitions)
    from_model = evaluate_to_json(tmp_path / "model.json", "--model", TINY, "--data", str(hand_folder),
                                  "--k", "1", "3", "--definitions", definitions)
    assert from_model[TINY] == pytest.approx(from_run[str(run)], abs=FLOAT64_APART)


def test_dot_and_euclidean_rank_unit_vectors_as_cosine_does(tmp_path, monkeypatch, hand_folder):
    monkeypatch.setattr(SentenceModel, "encode", fake_encode)
    results, runs = {}, {}
    for score in ("cosine", "dot", "euclidean"):
        run_file = tmp_path / f"{score}.trec"
        results[score] = evaluate_to_json(tmp_path / f"{score}.json", "--model", TINY, "--data", str(hand_folder),
                                          "--k", "1", "3", "--score", score, "--run-file", str(run_file),
                                          "--no-cache")[TINY]  # the fake embeddings are not the model's width
        runs[score] = datasets.read_trec_run(run_file)
    assert results["cosine"] == pytest.approx(HAND_ST, abs=FLOAT64_APART)
    assert results["dot"] == results["cosine"]
    assert results["euclidean"] == results["cosine"]
    # Run files hold larger-is-better scores: cosine = dot = cos(angle) for unit vectors, and
    # euclidean the negated distance |q - d| = sqrt(2 - 2 cos(angle)). q1 -> d2 is 10 degrees:
    # cos = 0.98481, distance = sqrt(2 - 1.96962) = 0.17431. In float32 from rounded coordinates: the
    # cosine is at most ten roundings of values below 1 (6e-7) from exact; the distance's |q|² - 2 q·d + |d|²
    # cancels 2 down to 0.03, and its dozen roundings of values up to 2 (1.4e-6) become 4e-6 at most.
    angle = math.radians(10)
    assert runs["cosine"]["q1"]["d2"] == pytest.approx(math.cos(angle), abs=1e-6)
    assert runs["dot"]["q1"]["d2"] == pytest.approx(math.cos(angle), abs=1e-6)
    assert runs["euclidean"]["q1"]["d2"] == pytest.approx(-math.sqrt(2 - 2 * math.cos(angle)), abs=1e-5)
    for score in ("cosine", "dot", "euclidean"):
        assert {q: list(hits) for q, hits in runs[score].items()} == {"q1": ["d2", "d1", "d4"],
                                                                       "q2": ["d2", "d7", "d5"]}


# ---- data/example end to end ------------------------------------------------------------------


def test_models_side_by_side_on_the_example_data(tmp_path):
    output = tmp_path / "example.json"
    results = evaluate_to_json(output, "--model", TINY, "bm25", "jaccard", "--k", "1", "3", "10", per_query=True)
    assert list(results) == [TINY, "bm25", "jaccard"]
    for name, scores in results.items():
        per_query = scores.pop("per_query")
        assert set(scores) == set(per_query) == {f"{metric}@{k}" for metric in METRICS for k in (1, 3, 10)}, name
        assert all(0.0 <= value <= 1.0 for value in scores.values()), name
        for metric, values in per_query.items():  # each query's own value, averaging to the number exactly
            assert list(values) == list(datasets.load_beir(EXAMPLE, "test").queries), name
            assert np.mean(list(values.values())) == scores[metric], (name, metric)
        # One document deep, a hit is the whole story: precision, MRR, NDCG and MAP all equal the hit rate.
        for metric in ("precision", "mrr", "ndcg", "map"):
            assert scores[f"{metric}@1"] == scores["accuracy@1"], (name, metric)
        for metric in ("accuracy", "recall", "mrr"):  # these can only grow with k
            assert scores[f"{metric}@1"] <= scores[f"{metric}@3"] <= scores[f"{metric}@10"], (name, metric)
    # The example was written so that word overlap finds most answers; random weights do not.
    assert results["bm25"]["ndcg@10"] > 0.5 > results[TINY]["ndcg@10"]
    assert results["bm25"] != results["jaccard"]
    # Each model's numbers are its own: BM25 evaluated alone gives the same.
    alone = evaluate_to_json(tmp_path / "alone.json", "--model", "bm25", "--k", "1", "3", "10")
    assert alone["bm25"] == results["bm25"]
    # One TREC run per model, next to the JSON.
    assert sorted(p.name for p in tmp_path.glob("example-*.trec")) == sorted(
        f"example-{evaluate.file_label(name)}.trec" for name in results)


def test_verbose_prints_the_way_each_search_took_and_what_chose_it(tmp_path, capsys):
    # One line per model that searches (BM25 does not): the way minisbert/search/ways.py's table takes
    # for the example's queries over its corpus (float32 numpy rows), and the facts it read.
    from minisbert.search import explain_way
    from minisbert.search.inputs import check_inputs

    evaluate_to_json(tmp_path / "example.json", "--model", TINY, "bm25", "--k", "1", "--verbose")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("search: ")]
    split = datasets.load_beir(EXAMPLE, "test")
    width = minisbert.load(TINY).encode(["a"]).shape[1]
    inputs = check_inputs(np.zeros((len(split.queries), width), np.float32),
                          np.ones((len(split.corpus), width), np.float32), 1, "cosine", 1024, None, None)
    assert lines == [f"search: {explain_way(inputs)}"]
    assert lines[0].endswith(f"for {len(split.queries)} queries, {len(split.corpus)} rows of d = {width}, cosine, "
                             "rows as given (float32), on cpu")


def test_runs_of_other_models_on_the_same_data_keep_their_own_files(tmp_path, monkeypatch):
    # Without --output the results are named after the data, the split and the models, as the run files are:
    # a second model evaluated on data/example leaves the first one's results where they were.
    monkeypatch.chdir(tmp_path)
    shutil.copytree(TINY, tmp_path / "models" / "tiny")
    evaluate.main(["--model", "models/tiny", "--k", "1"])
    evaluate.main(["--model", "bm25", "--k", "1"])
    evaluate.main(["--model", "models/tiny", "bm25", "--k", "1"])
    written = tmp_path / "runs" / "eval"
    assert sorted(p.name for p in written.glob("*.json")) == [
        "example-test-bm25.json", "example-test-models_tiny+bm25.json", "example-test-models_tiny.json"]
    assert sorted(p.name for p in written.glob("*.trec")) == ["example-test-bm25.trec", "example-test-models_tiny.trec"]
    alone, together = (json.loads((written / name).read_text()) for name in
                       ("example-test-bm25.json", "example-test-models_tiny+bm25.json"))
    assert list(alone) == ["bm25"] and list(together) == ["models/tiny", "bm25"]
    assert together["bm25"] == alone["bm25"]


def test_a_long_list_of_models_is_named_by_the_first_and_a_digest_of_all():
    models = [f"runs/learning-rate-sweep/lr-{i}e-5/final" for i in range(1, 9)]
    name = evaluation.results_file("scifact", "test", models).name
    assert re.fullmatch(r"scifact-test-runs_learning-rate-sweep_lr-1e-5_final\+7-more-[0-9a-f]{8}\.json", name), name
    assert evaluation.results_file("scifact", "test", models[:-1] + ["bm25"]).name != name  # another list
    assert evaluation.results_file("scifact", "test", []).name == "scifact-test.json"  # a scored --run file


def test_trec_definitions_add_mrr_without_cutoff(tmp_path):
    results = evaluate_to_json(tmp_path / "trec.json", "--model", "bm25", "--k", "2", "4", "--definitions", "trec")
    assert set(results["bm25"]) == {f"{metric}@{k}" for metric in METRICS for k in (2, 4)} | {"mrr"}
    assert results["bm25"]["mrr@4"] <= results["bm25"]["mrr"]


@pytest.mark.parametrize("definitions", ["st", "trec"])
def test_run_file_scored_back_gives_the_model_numbers(tmp_path, definitions):
    run_file = tmp_path / "runs" / "tiny.trec"  # a folder that does not exist yet
    ks = ["--k", "1", "5", "10", "--definitions", definitions]
    from_model = evaluate_to_json(tmp_path / "model.json", "--model", TINY, "--run-file", str(run_file), *ks)

    example = datasets.load_beir(EXAMPLE, "test")
    lines = [line.split() for line in run_file.read_text().splitlines()]
    assert [q for q, *_ in lines] == [q for q in example.queries for _ in range(10)]  # 10 hits per query
    for start in range(0, len(lines), 10):
        hits = lines[start:start + 10]
        assert [int(rank) for _, _, _, rank, _, _ in hits] == list(range(1, 11))
        scores = [float(score) for _, _, _, _, score, _ in hits]
        assert scores == sorted(scores, reverse=True)
        assert {tag for *_, tag in hits} == {"tiny_st_legacy"}
        assert {q0 for _, q0, *_ in hits} == {"Q0"}

    # The scores are the model's cosine similarities: check the first query against numpy.
    model = minisbert.load(TINY, device="cpu")
    query_id = next(iter(example.queries))
    doc_ids = list(example.corpus)
    query = model.encode([example.queries[query_id]])[0].astype(np.float64)  # (D,)
    corpus = model.encode([example.corpus[d] for d in doc_ids]).astype(np.float64)  # (N, D)
    cosine = corpus @ query / (np.linalg.norm(corpus, axis=1) * np.linalg.norm(query))  # (N,)
    _, _, best_doc, _, best_score, _ = lines[0]
    assert best_doc == doc_ids[int(np.argmax(cosine))]
    # the query was encoded alone here, with 7 others there: float32 apart by scores_apart (tolerances.py)
    assert float(best_score) == pytest.approx(cosine.max(), abs=scores_apart(model))

    qrels = write_trec_qrels(tmp_path / "qrels.txt", example.qrels)
    from_run = evaluate_to_json(tmp_path / "run.json", "--run", str(run_file), "--qrels", str(qrels), *ks)
    assert from_run[str(run_file)] == from_model[TINY]


# ---- the corpus embedding cache ---------------------------------------------------------------


def test_second_run_reads_corpus_embeddings_from_the_cache(tmp_path, monkeypatch, cache_dir):
    encoded = spy_on_encode(monkeypatch)
    a_document = datasets.load_beir(EXAMPLE, "test").corpus["bread-01"]

    first = evaluate_to_json(tmp_path / "first.json", "--model", TINY)
    assert any(a_document in texts for texts in encoded)
    assert len(list(cache_dir.glob("*.safetensors"))) == 1

    encoded.clear()
    second = evaluate_to_json(tmp_path / "second.json", "--model", TINY)
    assert encoded, "queries are always encoded"
    assert not any(a_document in texts for texts in encoded)
    assert second == first

    encoded.clear()
    evaluate_to_json(tmp_path / "third.json", "--model", TINY, "--no-cache")
    assert any(a_document in texts for texts in encoded)


def flip_a_sign(e):
    e = e.copy()
    e[2, 3] = -e[2, 3]
    return e


@pytest.mark.parametrize("damage, problem, digest", [
    (lambda e: (e[:-1]), "have shape", True),  # a stale entry: one row short
    (lambda e: (e[:, :-1]), "have shape", True),
    (lambda e: (e.astype(np.float16)), "are float16, not float32", True),
    (lambda e: (np.where(np.arange(len(e))[:, None] == 2, np.nan, e).astype(np.float32)), "are not the ones written", True),
    (lambda e: (np.where(np.arange(len(e))[:, None] == 2, np.nan, e).astype(np.float32)), "hold values that are not finite",
     "kept"),  # written with a digest of its own: the values themselves are checked too
    (flip_a_sign, "are not the ones written", False),  # a flipped bit, the digest as saved: caught by it alone
    (lambda e: e, "cannot be read", None),  # the file cut in half (below)
])
def test_a_cache_entry_that_does_not_fit_is_encoded_again_with_a_warning(damage, problem, digest, tmp_path, cache_dir):
    from safetensors import safe_open
    from safetensors.torch import save_file

    first = evaluate_to_json(tmp_path / "first.json", "--model", TINY)
    [entry] = cache_dir.glob("*.safetensors")
    good = entry.read_bytes()
    with safe_open(str(entry), framework="np") as opened:
        metadata, embeddings = opened.metadata(), opened.get_tensor("embeddings")
    damaged = damage(embeddings)
    if digest is None:
        entry.write_bytes(good[: len(good) // 2])
    else:
        tensors = {"embeddings": torch.from_numpy(np.ascontiguousarray(damaged))}
        if digest == "kept":
            metadata = {evaluation.DIGEST_KEY: evaluation.tensors_digest(tensors)}
        save_file(tensors, str(entry), metadata=metadata if digest is not True else {})
    with pytest.warns(UserWarning, match=f"cached embeddings {re.escape(str(entry))} {problem}.*encoding the texts again"):
        second = evaluate_to_json(tmp_path / "second.json", "--model", TINY)
    assert second == first
    assert entry.read_bytes() == good  # rebuilt


def test_a_changed_corpus_misses_the_cache(tmp_path, monkeypatch, cache_dir):
    evaluate_to_json(tmp_path / "first.json", "--model", TINY)
    example = datasets.load_beir(EXAMPLE, "test")
    changed = dict(example.corpus, **{"bread-01": example.corpus["bread-01"] + " Rest it afterwards."})
    datasets.write_beir(tmp_path / "changed", changed, example.queries, example.qrels)

    encoded = spy_on_encode(monkeypatch)
    evaluate_to_json(tmp_path / "second.json", "--model", TINY, "--data", str(tmp_path / "changed"))
    assert any(changed["bread-01"] in texts for texts in encoded)
    assert len(list(cache_dir.glob("*.safetensors"))) == 2


def test_a_saved_model_loads_and_only_a_different_one_misses_the_cache(tmp_path, monkeypatch, cache_dir):
    model = minisbert.load(TINY, device="cpu")
    model.save(tmp_path / "same")
    with torch.no_grad():
        model.dense.linear.bias += 0.5
    model.save(tmp_path / "changed")
    first = evaluate_to_json(tmp_path / "first.json", "--model", TINY)

    encoded = spy_on_encode(monkeypatch)
    a_document = datasets.load_beir(EXAMPLE, "test").corpus["bread-01"]
    same = evaluate_to_json(tmp_path / "same.json", "--model", str(tmp_path / "same"))
    assert not any(a_document in texts for texts in encoded), "the same weights and settings hit the cache"
    assert same[str(tmp_path / "same")] == first[TINY]

    evaluate.main(["--model", str(tmp_path / "changed"), "--output", str(tmp_path / "changed.json")])
    assert any(a_document in texts for texts in encoded), "changed weights miss the cache"
    first_run, = tmp_path.glob("first-*.trec")
    changed_run, = tmp_path.glob("changed-*.trec")
    assert datasets.read_trec_run(changed_run) != datasets.read_trec_run(first_run)
    assert len(list(cache_dir.glob("*.safetensors"))) == 2


def test_a_models_query_and_document_prompts_encode_each_side_and_key_the_cache(tmp_path):
    # sentence-transformers' InformationRetrievalEvaluator encodes queries with encode_query and documents
    # with encode_document; evaluation once encoded both plainly, so a model's prompts changed no number.
    retrieval = datasets.load_beir(EXAMPLE, "test")
    model = minisbert.load(TINY, device="cpu")
    plain = evaluation.rank(model, retrieval, 5, cache_dir=tmp_path)
    model.prompts.update({"query": "a dog a dog : ", "document": "the cat sat : "})
    queries = model.encode_query(list(retrieval.queries.values()))
    corpus = model.encode_document(list(retrieval.corpus.values()))
    expected = evaluation.rank_embeddings(queries, corpus, retrieval, 5)
    assert expected != plain  # the prompts move the ranking: the comparison below can fail
    for cache in (tmp_path, None):  # the plain corpus is cached: the prompted one must not be read from it
        assert evaluation.rank(model, retrieval, 5, cache_dir=cache) == expected
    assert len(list(tmp_path.glob("*.safetensors"))) == 2
    # A default prompt: plain encode() put it before the documents, encode_document puts none. Such a
    # model's corpus, as cached before documents were encoded as documents, must not be read back.
    model.prompts.update({"query": "a dog a dog : ", "document": ""})
    model.default_prompt_name = "query"
    documents = list(retrieval.corpus.values())
    old_entry = tmp_path / (f"{evaluation.model_fingerprint(model)}-float32-{evaluation.texts_fingerprint(documents)}"
                            ".safetensors")
    evaluation.write_safetensors(old_entry, {"embeddings": torch.from_numpy(model.encode(documents))}, {})
    expected = evaluation.rank_embeddings(model.encode_query(list(retrieval.queries.values())),
                                          model.encode_document(documents), retrieval, 5)
    assert evaluation.rank(model, retrieval, 5, cache_dir=tmp_path) == expected


def test_the_cache_key_covers_everything_that_changes_embeddings():
    key = evaluation.model_fingerprint(minisbert.load(TINY, device="cpu"))
    assert evaluation.model_fingerprint(minisbert.load(TINY, device="cpu")) == key
    changes = {
        "tokenizer": lambda model: model.tokenizer.rust.add_tokens(["zebra"]),  # one token, not word pieces
        "weights": lambda model: model.encoder.embeddings.word_embeddings.weight.data.mul_(2),
        "pooling": lambda model: setattr(model, "pooling", "mean"),
        "normalization": lambda model: setattr(model, "normalize_embeddings", False),
        "length": lambda model: setattr(model.tokenizer, "max_seq_length", 8),
    }
    for what, change in changes.items():
        model = minisbert.load(TINY, device="cpu")
        change(model)
        assert evaluation.model_fingerprint(model) != key, what


# ---- self-matches -----------------------------------------------------------------------------


@pytest.fixture
def self_match_folder(tmp_path):
    """Query q1 is also a document, with the same text, so it is its own best match."""
    folder = tmp_path / "self"
    corpus = {"q1": "apples and pears", "d1": "apples grow on trees", "d2": "pears are sweet",
              "d3": "bikes have wheels"}
    queries = {"q1": "apples and pears", "q2": "bikes with wheels"}
    datasets.write_beir(folder, corpus, queries, {"q1": {"d1": 1}, "q2": {"d3": 1}})
    return folder


@pytest.mark.parametrize("model", [TINY, "bm25"])
def test_exclude_self_drops_the_document_with_the_query_id(tmp_path, self_match_folder, model):
    def run_of(name, *flags):
        run_file = tmp_path / f"{name}.trec"
        evaluate.main(["--model", model, "--data", str(self_match_folder), "--output", str(tmp_path / f"{name}.json"),
                       "--run-file", str(run_file), *flags])
        return datasets.read_trec_run(run_file)

    assert list(run_of("kept", "--k", "1")["q1"]) == ["q1"]  # identical text scores best
    top_1 = run_of("dropped", "--k", "1", "--exclude-self")["q1"]
    assert len(top_1) == 1 and "q1" not in top_1  # the next best takes its place
    everything = run_of("all", "--k", "4")
    assert set(everything["q1"]) == {"q1", "d1", "d2", "d3"}
    without_self = run_of("all-but-self", "--k", "4", "--exclude-self")
    assert set(without_self["q1"]) == {"d1", "d2", "d3"}
    assert len(without_self["q2"]) == 4  # no document is called q2

    # --exclude-self applies to a scored run file as well.
    qrels = write_trec_qrels(tmp_path / "qrels.txt", {"q1": {"d1": 1}, "q2": {"d3": 1}})
    rescored = evaluate_to_json(tmp_path / "rescored.json", "--run", str(tmp_path / "all.trec"),
                                "--qrels", str(qrels), "--k", "4", "--exclude-self", per_query=True)
    model_run = json.loads((tmp_path / "all-but-self.json").read_text())
    assert rescored[str(tmp_path / "all.trec")] == model_run[model]


# ---- STS --------------------------------------------------------------------------------------


def test_sts_on_a_pairs_folder_matches_numpy(tmp_path):
    pairs = [
        ("a man is playing a guitar", "a man plays the guitar", 0.95),
        ("a dog runs in the park", "a cat sleeps on the sofa", 0.2),
        ("the bread is fresh", "this loaf was baked today", 0.7),
        ("a woman rides a bike", "a person is cycling", 0.8),
        ("stocks fell sharply", "the moon is full tonight", 0.0),
        ("kids play football", "children are playing soccer", 0.9),
    ]
    folder = tmp_path / "sts"
    folder.mkdir()
    write_lines(folder / "pairs.tsv", ["sentence1\tsentence2\tscore"] + [f"{a}\t{b}\t{s}" for a, b, s in pairs])
    results = evaluate_to_json(tmp_path / "sts.json", "--task", "sts", "--model", TINY, "--data", str(folder))

    model = minisbert.load(TINY, device="cpu")
    first = model.encode([a for a, _, _ in pairs]).astype(np.float64)  # (6, D)
    second = model.encode([b for _, b, _ in pairs]).astype(np.float64)  # (6, D)
    cosine = (first * second).sum(1) / (np.linalg.norm(first, axis=1) * np.linalg.norm(second, axis=1))
    gold = np.array([s for _, _, s in pairs])
    # The same embeddings (the same batches) there, their cosines in float32: each within its sums over D of
    # this float64 one (tolerances.py). Cosines further apart than twice that rank alike on any CPU, so
    # ranks are argsort of argsort and Spearman's is the same float64 arithmetic on the same ranks.
    apart = float32_apart(2 * model.dimension)
    assert np.diff(np.sort(cosine)).min() > 2 * apart
    spearman = np.corrcoef(cosine.argsort().argsort(), gold.argsort().argsort())[0, 1]
    pearson = np.corrcoef(cosine, gold)[0, 1]
    assert results[TINY]["spearman"] == pytest.approx(spearman, abs=FLOAT64_APART)
    # Pearson's r is the cosine of the angle between the centred cosines and the centred gold scores: moving
    # n cosines by up to `apart` each turns that angle by at most sqrt(n)·apart / |centred cosines|.
    turned = math.sqrt(len(pairs)) * apart / np.linalg.norm(cosine - cosine.mean())
    assert results[TINY]["pearson"] == pytest.approx(pearson, abs=turned)


def test_sts_needs_pairs_and_models(tmp_path, capsys, hand_folder):
    with pytest.raises(SystemExit, match="pairs.tsv"):
        evaluate.main(["--task", "sts", "--model", TINY, "--data", str(hand_folder),
                       "--output", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit) as stopped:
        evaluate.main(["--task", "sts", "--model", "bm25", "--data", str(hand_folder)])
    assert stopped.value.code == 2
    assert "--task sts needs sentence-embedding models" in capsys.readouterr().err


# STS-B's own files are tab-separated with the score in column 5 and the sentences in 6 and 7; a few
# rows carry two more columns. SICK's have a header and an entailment label.
STSB_LINES = [
    "main-captions\tMSRvid\t2012test\t0001\t4.800\ta man is playing a guitar\ta man plays the guitar",
    "main-captions\tMSRvid\t2012test\t0002\t1.000\ta dog runs in the park\ta cat sleeps on the sofa",
    "main-forums\tanswer-answer\t2016\t0120\t3.5\tthe bread is fresh\tthis loaf was baked today\tsrc\tsrc",
    "main-news\theadlines\t2016\t0015\t0.2\tstocks fell sharply\tthe moon is full tonight",
    "main-news\theadlines\t2016\t0016\t4.0\ta woman rides a bike\ta person is cycling",
]
SICK_LINES = [
    "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment",
    "1\tkids play football\tchildren are playing soccer\t4.7\tENTAILMENT",
    "2\ta dog runs in the park\ta cat sleeps on the sofa\t1.6\tNEUTRAL",
    "3\tthe bread is fresh\tthe bread is stale\t3.1\tCONTRADICTION",
]


def make_sts_folders(root):
    """STS-B in its own layout at root/stsb-release, SICK's as root/holder/sick/."""
    (root / "stsb-release").mkdir()
    for split in ("train", "dev", "test"):
        write_lines(root / "stsb-release" / f"sts-{split}.csv", STSB_LINES if split == "test" else STSB_LINES[:3])
    (root / "holder" / "sick").mkdir(parents=True)
    for name, lines in (("SICK_train.txt", SICK_LINES), ("SICK_trial.txt", SICK_LINES[:3]),
                        ("SICK_test_annotated.txt", SICK_LINES[:1] + SICK_LINES[2:])):
        write_lines(root / "holder" / "sick" / name, lines)


def test_sts_on_stsb_and_sick_folders_in_their_own_layouts(tmp_path):
    make_sts_folders(tmp_path)
    model = minisbert.load(TINY, device="cpu")
    stsb = tmp_path / "stsb-release"
    expected = evaluation.sts_correlations(model, datasets.read_stsb(stsb, "test"))
    # --task sts given, or found from the files: the same numbers, on all five test pairs
    assert evaluate_to_json(tmp_path / "a.json", "--task", "sts", "--model", TINY, "--data", str(stsb)) == \
        {TINY: pytest.approx(expected, abs=FLOAT64_APART)}
    assert evaluate_to_json(tmp_path / "b.json", "--model", TINY, "--data", str(stsb)) == \
        {TINY: pytest.approx(expected, abs=FLOAT64_APART)}
    # A folder holding sick/: SICK's default split is all of it, train + trial + test = 3 + 2 + 2 pairs
    sick = datasets.read_sick(tmp_path / "holder" / "sick", "all")
    assert len(sick) == 7
    assert evaluate_to_json(tmp_path / "c.json", "--task", "sts", "--model", TINY, "--data", str(tmp_path / "holder")) \
        == {TINY: pytest.approx(evaluation.sts_correlations(model, sick), abs=FLOAT64_APART)}


def test_sts_folder_holding_both_datasets_is_ambiguous(tmp_path):
    make_sts_folders(tmp_path)
    (tmp_path / "stsb-release").rename(tmp_path / "holder" / "stsb")
    with pytest.raises(ValueError, match="holds both STS-B .* and SICK .*; pass the folder of the one you mean"):
        evaluate.main(["--task", "sts", "--model", TINY, "--data", str(tmp_path / "holder")])


# ---- a question/answer CSV ----------------------------------------------------------------------

QA_CSV = ('question,answer\n'
          'How long do I boil an egg?,"Boil the egg for eight minutes, then cool it in water."\n'
          'How do I make bread rise?,Yeast makes the bread dough rise in a warm place.\n'
          'Why is the sky blue?,Sunlight scatters off air molecules and blue light scatters most.\n'
          'How do I water a cactus?,Water a cactus once a month and let the soil dry.\n')


def test_a_question_answer_csv_is_evaluated_as_its_beir_layout(tmp_path, cache_dir):
    csv_file = tmp_path / "questions.csv"
    csv_file.write_text(QA_CSV)
    results = evaluate_to_json(tmp_path / "qa.json", "--model", TINY, "bm25", "--data", str(csv_file), "--k", "1", "3")
    # The same rows written as a BEIR folder by hand: query q<i> asks question i, a<i> is its answer.
    rows = [line.split(",", 1) for line in QA_CSV.splitlines()[1:]]
    by_hand = tmp_path / "by_hand"
    datasets.write_beir(by_hand, {f"a{i}": answer.strip('"') for i, (_, answer) in enumerate(rows)},
                        {f"q{i}": question for i, (question, _) in enumerate(rows)}, {f"q{i}": {f"a{i}": 1} for i in range(4)})
    assert results == evaluate_to_json(tmp_path / "hand.json", "--model", TINY, "bm25", "--data", str(by_hand),
                                       "--k", "1", "3")
    assert results["bm25"]["accuracy@1"] == 1.0  # each question shares its key words with its answer only
    # converted once, into the cache: one folder, no staging folder beside it
    assert [p.name for p in (cache_dir.parent / "qa-csv").iterdir()] == [
        f"questions-{hashlib.sha256(QA_CSV.encode()).hexdigest()[:16]}"]


def test_a_csv_without_question_and_answer_columns(tmp_path):
    csv_file = tmp_path / "faq.csv"
    csv_file.write_text("Question,Reply\nWhat is CUDA?,A platform.\n")
    with pytest.raises(ValueError, match=r"faq\.csv: the header \(line 1\) lacks the column\(s\) \['question', 'answer'\]; "
                                         r"the columns found are \['Question', 'Reply'\]"):
        evaluate.main(["--model", "bm25", "--data", str(csv_file), "--output", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_the_command_line_says_what_is_wrong_in_one_line(tmp_path):
    csv_file = tmp_path / "faq.csv"
    csv_file.write_text("prompt,response\nhi,hello\n")
    done = subprocess.run([sys.executable, str(REPO / "evaluate.py"), "--model", "bm25", "--data", str(csv_file),
                           "--output", str(tmp_path / "x.json")], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "MINISBERT_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"error: {csv_file}: the header (line 1) lacks the column(s) "
                                        "['question', 'answer']; the columns found are ['prompt', 'response']. "
                                        "The first line must name the columns"]


# ---- --significance -------------------------------------------------------------------------


def test_significance_compares_each_model_with_the_first_query_by_query(tmp_path, capsys):
    results = evaluate_to_json(tmp_path / "sig.json", "--model", TINY, "bm25", "jaccard", "--significance",
                               per_query=True)
    assert "significance" not in results[TINY]
    for name in ("bm25", "jaccard"):
        assert set(results[name]["significance"]) == set(results[name]["per_query"])
        for metric, test in results[name]["significance"].items():
            expected = significance.compare(results[name]["per_query"][metric], results[TINY]["per_query"][metric])
            assert {k: v for k, v in test.items() if k != "p_holm"} == expected
            assert test["difference"] == pytest.approx(results[name][metric] - results[TINY][metric], abs=FLOAT64_APART)
    # Two comparisons: the randomization p of each metric@k is Holm-adjusted over both.
    for metric in results["bm25"]["significance"]:
        tests = [results[name]["significance"][metric] for name in ("bm25", "jaccard")]
        assert [t["p_holm"] for t in tests] == significance.holm([t["p_randomization"] for t in tests])
    out = capsys.readouterr().out
    assert f"Differences from {TINY}" in out and "Holm-adjusted randomization p over the 2 comparisons" in out
    ndcg = results["bm25"]["significance"]["ndcg@10"]
    line = next(line for line in out.splitlines() if line.startswith("ndcg@10") and f"{ndcg['difference']:+11.4f}" in line)
    assert line.endswith("*") == (ndcg["p_holm"] < 0.05)


def test_significance_on_sts_compares_spearman(tmp_path, capsys):
    folder = tmp_path / "sts"
    folder.mkdir()
    rows = [f"sentence {i} about {topic}\tanother {topic} line {i}\t{(i % 5) / 4}" for i, topic in
            enumerate(["cats", "dogs", "bread", "rain", "stocks", "music", "trains", "chess", "tea", "snow"])]
    write_lines(folder / "pairs.tsv", ["sentence1\tsentence2\tscore"] + rows)
    dense = str(FIXTURES / "tiny_st_dense")
    results = evaluate_to_json(tmp_path / "sts.json", "--task", "sts", "--data", str(folder), "--model", TINY, dense,
                               "--significance")
    test = results[dense]["significance"]["spearman"]
    assert test["difference"] == pytest.approx(results[dense]["spearman"] - results[TINY]["spearman"],
                                               abs=FLOAT64_APART)
    assert test["p_t_test"] is None and 0 < test["p_randomization"] <= 1
    assert "spearman" in capsys.readouterr().out


def test_models_evaluated_on_different_queries_are_not_compared():
    results = {"a": {"per_query": {"ndcg@10": {"q1": 1.0, "q2": 0.0}}},
               "b": {"per_query": {"ndcg@10": {"q1": 1.0, "q3": 0.5}}}}
    with pytest.raises(ValueError, match=r"b and a were evaluated on different queries: .*q3"):
        evaluate.compare_with_first(results)


# ---- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--k", "0"], "--k values must be positive, got [0]"),
    (["--k", "5", "-3"], "--k values must be positive, got [5, -3]"),
    (["--batch-size", "0"], "--batch-size must be positive, got 0"),
    (["--run", "run.trec"], "--run and --qrels go together"),
    (["--qrels", "qrels.txt"], "--run and --qrels go together"),
    (["--score", "manhattan"], "invalid choice: 'manhattan'"),
    (["--significance"], "--significance compares each --model with the first, query by query: give two or more "
                         "models (got all-MiniLM-L6-v2)"),
    (["--model", "bm25", "jaccard", "--significance", "--run", "r.trec", "--qrels", "q.txt"], "(got a --run file)"),
    (["--run", "no-such.trec", "--qrels", "q.txt"], "--run no-such.trec: no such file"),
    (["--run", str(FIXTURES / "minilm" / "reference.json"), "--qrels", "q.txt"], "--qrels q.txt: no such file"),
    # Each was taken and changed nothing: the same numbers printed, and no run file written.
    (["--task", "sts", "--data", "stsb", "--score", "euclidean", "--run-file", "x.trec"],
     "--score --run-file would change nothing when --task sts (no ranking): leave them out"),
    (["--task", "sts", "--k", "3"], "--k would change nothing when --task sts (no ranking): leave it out"),
    (["--run", str(FIXTURES / "minilm" / "reference.json"), "--qrels", str(FIXTURES / "minilm" / "reference.json"),
      "--model", "bm25", "--score", "dot"],
     "--model --score would change nothing when scoring a --run file (no model runs)"),
])
def test_bad_arguments_stop_with_a_usage_message(capsys, argv, message):
    with pytest.raises(SystemExit) as stopped:
        evaluate.main(argv)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_unknown_baseline_or_model_name(tmp_path):
    with pytest.raises(ValueError, match="'bm26' is neither a model directory nor a known model name"):
        evaluate.main(["--model", "bm26", "--output", str(tmp_path / "x.json")])


def test_folder_without_qrels_for_the_split(tmp_path):
    found = r"no qrels for split 'validation'.*splits found: \['dev', 'test', 'train'\]"
    with pytest.raises(FileNotFoundError, match=found):
        evaluate.main(["--model", "bm25", "--split", "validation", "--output", str(tmp_path / "x.json")])


def test_malformed_qrels_line_names_file_and_line(tmp_path):
    run = write_lines(tmp_path / "hand.trec", HAND_RUN_LINES)
    qrels = write_lines(tmp_path / "qrels.txt", ["q1 0 d1 1", "q1 0 d3"])
    with pytest.raises(ValueError, match=r"qrels\.txt, line 2: expected 4 fields"):
        evaluate.main(["--run", str(run), "--qrels", str(qrels), "--output", str(tmp_path / "x.json")])
    qrels = write_lines(tmp_path / "qrels.txt", ["q1 0 d1 1", "", "q1 0 d3 high"])
    with pytest.raises(ValueError, match=r"qrels\.txt, line 3: relevance 'high' is not an integer"):
        evaluate.main(["--run", str(run), "--qrels", str(qrels), "--output", str(tmp_path / "x.json")])


def test_malformed_run_line_names_file_and_line(tmp_path):
    qrels = write_trec_qrels(tmp_path / "qrels.txt", HAND_QRELS)
    run = write_lines(tmp_path / "bad.trec", HAND_RUN_LINES[:2] + ["q1 Q0 d4 3 0.7"])
    with pytest.raises(ValueError, match=r"bad\.trec:3: expected 6 fields"):
        evaluate.main(["--run", str(run), "--qrels", str(qrels), "--output", str(tmp_path / "x.json")])
    run = write_lines(tmp_path / "bad.trec", HAND_RUN_LINES[:1] + ["q1 Q0 d1 2 nan hand"])
    with pytest.raises(ValueError, match=r"bad\.trec:2: score 'nan' is not finite"):
        evaluate.main(["--run", str(run), "--qrels", str(qrels), "--output", str(tmp_path / "x.json")])
    run = write_lines(tmp_path / "bad.trec", HAND_RUN_LINES[:2] + ["q1 Q0 d2 3 0.1 hand"])
    with pytest.raises(ValueError, match=r"bad\.trec:3: document 'd2' appears twice"):
        evaluate.main(["--run", str(run), "--qrels", str(qrels), "--output", str(tmp_path / "x.json")])


def test_run_queries_without_qrels_are_named_in_a_warning(tmp_path):
    run = write_lines(tmp_path / "hand.trec", HAND_RUN_LINES + ["q7 Q0 d1 1 0.2 hand"])
    qrels = write_trec_qrels(tmp_path / "qrels.txt", HAND_QRELS)
    with pytest.warns(UserWarning, match="1 run queries have no qrels and are ignored: 'q7'"):
        results = evaluate_to_json(tmp_path / "x.json", "--run", str(run), "--qrels", str(qrels), "--k", "1", "3")
    assert results[str(run)] == pytest.approx(HAND_ST, abs=FLOAT64_APART)


def test_malformed_beir_folder_names_file_and_line(tmp_path, hand_folder):
    with open(hand_folder / "qrels" / "test.tsv", "a") as qrels:
        qrels.write("q2\td7\n")
    with pytest.raises(ValueError, match=r"test\.tsv, line 7: expected 3 tab-separated fields"):
        evaluate.main(["--model", "bm25", "--data", str(hand_folder), "--output", str(tmp_path / "x.json")])


def test_duplicate_document_id(tmp_path, hand_folder):
    with open(hand_folder / "corpus.jsonl", "a") as corpus:
        corpus.write('{"_id": "d1", "title": "", "text": "again"}\n')
    with pytest.raises(ValueError, match=r"corpus\.jsonl, line 8: duplicate document id 'd1'"):
        evaluate.main(["--model", "bm25", "--data", str(hand_folder), "--output", str(tmp_path / "x.json")])


def test_qrels_naming_unknown_documents_are_dropped_with_a_warning(tmp_path, monkeypatch, hand_folder):
    monkeypatch.setattr(SentenceModel, "encode", fake_encode)
    with open(hand_folder / "qrels" / "test.tsv", "a") as qrels:
        qrels.write("q1\tnowhere\t1\nq8\td1\t1\n")
    with pytest.warns(UserWarning, match=r"dropped 2 judgments naming an unknown query or document"):
        results = evaluate_to_json(tmp_path / "x.json", "--model", TINY, "--data", str(hand_folder), "--k", "1", "3")
    assert results[TINY] == pytest.approx(HAND_ST, abs=FLOAT64_APART)  # as if the two lines were not there


def test_empty_corpus(tmp_path, hand_folder):
    (hand_folder / "corpus.jsonl").write_text("")
    with pytest.warns(UserWarning, match="dropped"), \
            pytest.raises(ValueError, match=r"nothing to evaluate: 0 documents in corpus\.jsonl"):
        evaluate.main(["--model", TINY, "--data", str(hand_folder), "--output", str(tmp_path / "x.json")])


def test_nan_and_mismatched_embeddings(tmp_path, monkeypatch, hand_folder):
    def nan_encode(self, texts, *args, **kwargs):
        embeddings = fake_encode(self, texts)
        if "doc d3" in texts:
            embeddings[texts.index("doc d3")] = np.nan
        return embeddings

    monkeypatch.setattr(SentenceModel, "encode", nan_encode)
    with pytest.raises(ValueError, match="corpus row 2 contains NaN"):  # d1, d2, d3: row 2
        evaluate.main(["--model", TINY, "--data", str(hand_folder), "--output", str(tmp_path / "x.json")])

    def wider_queries(self, texts, *args, **kwargs):
        embeddings = fake_encode(self, texts)
        return np.pad(embeddings, ((0, 0), (0, 1))) if texts[0].startswith("query") else embeddings

    monkeypatch.setattr(SentenceModel, "encode", wider_queries)
    with pytest.raises(ValueError, match="queries have dimension 3 but corpus has dimension 2"):
        evaluate.main(["--model", TINY, "--data", str(hand_folder), "--output", str(tmp_path / "x.json"),
                       "--no-cache"])


def test_run_file_scores_the_same_against_beir_and_trec_qrels(tmp_path, capsys):
    """--qrels takes either format: BEIR's tsv with its header, or TREC's four columns."""
    (tmp_path / "run.trec").write_text("q1 Q0 d1 1 0.9 t\nq1 Q0 d2 2 0.5 t\nq2 Q0 d3 1 0.7 t\n")
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td2\t1\nq2\td3\t1\n")
    (tmp_path / "qrels.trec").write_text("q1 0 d2 1\nq2 0 d3 1\n")
    results = []
    for qrels in ("qrels.tsv", "qrels.trec"):
        out = tmp_path / f"{qrels}.json"
        evaluate.main(["--run", str(tmp_path / "run.trec"), "--qrels", str(tmp_path / qrels), "--k", "1", "2",
                       "--output", str(out)])
        results.append(json.loads(out.read_text()))
    assert results[0] == results[1]
    scores = next(iter(results[0].values()))
    # q1: first relevant at rank 2 -> MRR 1/2; q2: rank 1 -> 1. Mean 0.75.
    assert scores["mrr@2"] == 0.75 and scores["accuracy@1"] == 0.5


def test_a_run_that_fails_prints_no_metrics_and_writes_nothing(tmp_path, hand_folder):
    """The second model does not exist: the first one's numbers and run file must not appear."""
    finished = run_script("evaluate.py", "--model", "bm25", tmp_path / "no-such-model", "--data", hand_folder,
                            "--output", tmp_path / "out" / "results.json", env={"MINISBERT_CACHE": str(tmp_path)})
    assert_one_clear_line(finished, "no-such-model")
    assert "NDCG" not in finished.stdout
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_a_full_disk_while_writing_the_run_file_leaves_no_part_of_it(tmp_path, hand_folder):
    """A real write failure from the kernel: the process may write no file larger than 100 bytes."""

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))

    run_file = tmp_path / "out" / "bm25.trec"
    finished = run_script("evaluate.py", "--model", "bm25", "--data", hand_folder, "--run-file", run_file,
                            "--output", tmp_path / "out" / "results.json", preexec_fn=limit_file_size)
    assert_one_clear_line(finished, "File too large", str(run_file))
    assert "NDCG" not in finished.stdout
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_an_output_folder_that_is_a_file_is_refused_before_any_work(tmp_path, hand_folder):
    (tmp_path / "out").write_text("mine")
    finished = run_script("evaluate.py", "--model", "bm25", "--data", hand_folder, "--output", tmp_path / "out" / "results.json")
    assert_one_clear_line(finished, f"{tmp_path / 'out'} is a file, not a folder")
    assert (tmp_path / "out").read_text() == "mine"


def test_a_corpus_text_that_is_not_valid_unicode_is_named(tmp_path):
    """corpus.jsonl may spell a lone surrogate as the JSON escape \\ud800, which reads as a str: it is
    refused as the file is read, by file, line, field and character."""
    corpus = {"d1": "fine", "d2": "half of a pair SURROGATE of surrogates"}
    datasets.write_beir(tmp_path / "data", corpus, {"q1": "fine"}, {"q1": {"d1": 1}})
    corpus_file = tmp_path / "data" / "corpus.jsonl"
    corpus_file.write_text(corpus_file.read_text().replace("SURROGATE", "\\ud800"))
    finished = run_script("evaluate.py", "--model", TINY, "--data", tmp_path / "data", "--output", tmp_path / "out.json",
                          env={"MINISBERT_CACHE": str(tmp_path / "cache")})
    assert_one_clear_line(finished, f"{corpus_file}, line 2: field 'text' is not valid Unicode: character 15 is "
                                    "'\\ud800' (surrogates not allowed)")
    assert not (tmp_path / "out.json").exists()
