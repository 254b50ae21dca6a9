"""Tests for minisbert.evaluation.metrics.

Each expected value is worked out by hand in the comment beside it. log2 values used throughout:
1/log2(2) = 1, 1/log2(3) = 0.630930, 1/log2(4) = 0.5, 1/log2(5) = 0.430677.
The last tests compare whole runs with numbers written by pytrec_eval and by
sentence-transformers (tests/fixtures/make_metric_reference.py).

Every value is float64, a sum or mean of a few fractions: computed here and by hand (or by pytrec_eval,
sentence-transformers) it lies a few ulps (1.1e-16 each near 1) from the other. pytest.approx's and
assert_allclose's defaults (relative 1e-6 and 1e-7) and abs=1e-12 are far outside that (measured: 0 to
8e-17), and far inside what another definition changes (1e-2 and more in these small examples).
"""

import gzip
import json
import math

import numpy as np
import pytest

from minisbert.evaluation.correlation import average_ranks, pearson, spearman
from minisbert.datasets.trec import read_qrels, read_trec_run, write_trec_run
from minisbert.datasets.beir import RetrievalData
from minisbert.evaluation.benchmark import rank_embeddings, run_from_search
from minisbert.evaluation.metrics import (accuracy_at_k, evaluate_run, map_at_k, mrr_at_k, ndcg_at_k, per_query_scores,
                                          precision_at_k, rank_by_score, recall_at_k)

from ..conftest import FIXTURES

L3, L5 = 1 / math.log2(3), 1 / math.log2(5)
FIXTURE = FIXTURES / "metric_reference.json"


# ---- one binary query, both definitions ------------------------------------------------------
# qrels {a, b, c} relevant; ranking [x, a, y, b, z]: relevant at ranks 2 and 4, 3 relevant in all.

BINARY_QRELS = {"q": {"a": 1, "b": 1, "c": 1}}
BINARY_RUN = {"q": ["x", "a", "y", "b", "z"]}


@pytest.mark.parametrize("definitions", ["st", "trec"])
def test_binary_query_by_hand(definitions):
    m = evaluate_run(BINARY_RUN, BINARY_QRELS, ks=(1, 3, 5, 10), definitions=definitions)
    assert m["accuracy@1"] == 0  # rank 1 is x
    assert m["accuracy@3"] == 1  # a at rank 2
    assert m["precision@3"] == pytest.approx(1 / 3)  # a
    assert m["precision@5"] == pytest.approx(2 / 5)  # a, b
    assert m["precision@10"] == pytest.approx(2 / 10)  # only 5 returned: still divided by 10
    assert m["recall@3"] == pytest.approx(1 / 3)  # a of {a, b, c}
    assert m["recall@5"] == pytest.approx(2 / 3)
    assert m["mrr@1"] == 0
    assert m["mrr@10"] == pytest.approx(1 / 2)  # first relevant at rank 2
    # DCG@3 = 1/log2(3); ideal DCG@3 = 1 + 1/log2(3) + 1/log2(4) (three relevant)
    assert m["ndcg@3"] == pytest.approx(L3 / (1 + L3 + 0.5))  # 0.296082
    # DCG@5 = 1/log2(3) + 1/log2(5); ideal DCG@5 is still three ones
    assert m["ndcg@5"] == pytest.approx((L3 + L5) / (1 + L3 + 0.5))  # 0.498193
    # AP@5: precision at rank 2 = 1/2, at rank 4 = 2/4; sum 1.0; divided by min(5, 3) = 3 ("st")
    # or by 3 relevant ("trec"): the same here.
    assert m["map@5"] == pytest.approx(1.0 / 3)
    assert m["map@1"] == 0


@pytest.mark.parametrize("definitions", ["st", "trec"])
def test_the_default_cutoffs_are_those_sentence_transformers_reports(definitions):
    # InformationRetrievalEvaluator reports accuracy, precision and recall @ 1, 3, 5, 10, MRR and NDCG @ 10
    # and MAP @ 100; minisbert reports every metric at each of those cutoffs (and "mrr" for trec).
    names = {f"{metric}@{k}" for metric in ("accuracy", "precision", "recall", "mrr", "ndcg", "map")
             for k in (1, 3, 5, 10, 100)} | ({"mrr"} if definitions == "trec" else set())
    assert set(evaluate_run(BINARY_RUN, BINARY_QRELS, definitions=definitions)) == names
    assert set(per_query_scores(BINARY_RUN, BINARY_QRELS, definitions=definitions)) == names


def test_st_and_trec_disagree_on_map_when_many_relevant():
    # 20 relevant documents, the top 10 all relevant (tests/fixtures/README.md, the metric table).
    qrels = {"q": {f"d{i}": 1 for i in range(20)}}
    run = {"q": [f"d{i}" for i in range(10)]}
    # st: (1/1 + 2/2 + ... + 10/10) / min(10, 20) = 10 / 10 = 1.0
    assert evaluate_run(run, qrels, ks=[10], definitions="st")["map@10"] == pytest.approx(1.0)
    # trec map_cut_10: the same sum divided by all 20 relevant = 0.5
    assert evaluate_run(run, qrels, ks=[10], definitions="trec")["map@10"] == pytest.approx(0.5)
    # recall@10 = 10/20 in both
    assert evaluate_run(run, qrels, ks=[10], definitions="st")["recall@10"] == pytest.approx(0.5)


def test_graded_ndcg_st_binary_vs_trec_graded():
    # qrels {d1: 2, d2: 1}, ranking [d2, d1] (tests/fixtures/README.md, the metric table).
    qrels, run = {"q": {"d1": 2, "d2": 1}}, {"q": ["d2", "d1"]}
    # st, binary: DCG = 1 + 1/log2(3) = ideal DCG -> 1.0
    assert evaluate_run(run, qrels, ks=[2], definitions="st")["ndcg@2"] == pytest.approx(1.0)
    # trec, graded: DCG = 1/1 + 2/log2(3) = 2.261860; ideal [2, 1]: 2 + 1/log2(3) = 2.630930
    # 2.261860 / 2.630930 = 0.859719
    trec = evaluate_run(run, qrels, ks=[2], definitions="trec")["ndcg@2"]
    assert trec == pytest.approx((1 + 2 * L3) / (2 + L3))
    assert round(trec, 3) == 0.860  # as tests/fixtures/README.md's table shows it: 2.2e-4 from a rounding edge


def test_trec_ideal_uses_all_judged_grades_and_ignores_negative_ones():
    # qrels {a: 3, b: 1, c: -1, d: 0}; ranking [c, b, e]
    qrels, run = {"q": {"a": 3, "b": 1, "c": -1, "d": 0}}, {"q": ["c", "b", "e"]}
    m = evaluate_run(run, qrels, ks=[1, 3], definitions="trec")
    # ranks: c (grade -1, gain 0), b (gain 1), e (unjudged, 0): DCG@3 = 1/log2(3)
    # ideal from all judged grades sorted: [3, 1, 0]: 3 + 1/log2(3) = 3.630930
    assert m["ndcg@3"] == pytest.approx(L3 / (3 + L3))  # 0.173765
    assert m["ndcg@1"] == 0
    # 2 relevant (grade >= 1): a and b. MAP@3 = (1/2) / 2 = 0.25; recall@3 = 1/2
    assert m["map@3"] == pytest.approx(0.25)
    assert m["recall@3"] == pytest.approx(0.5)


def test_trec_mrr_has_no_cutoff_but_mrr_at_k_does():
    qrels, run = {"q": {"a": 1}}, {"q": ["w", "x", "y", "a"]}
    m = evaluate_run(run, qrels, ks=[3], definitions="trec")
    assert m["mrr@3"] == 0  # a is at rank 4
    assert m["mrr"] == pytest.approx(1 / 4)  # trec_eval recip_rank
    assert "mrr" not in evaluate_run(run, qrels, ks=[3], definitions="st")


# ---- which queries are averaged ------------------------------------------------------------


def test_query_without_relevant_documents_st_skips_trec_counts_zero():
    qrels = {"q1": {"a": 1}, "q2": {"b": 0}}  # q2 has judgements but nothing relevant
    run = {"q1": ["a"], "q2": ["b"]}
    # st averages over q1 only: precision@1 = 1
    assert evaluate_run(run, qrels, ks=[1], definitions="st")["precision@1"] == 1.0
    # trec averages over both, q2 scoring 0: (1 + 0) / 2
    assert evaluate_run(run, qrels, ks=[1], definitions="trec")["precision@1"] == 0.5


def test_qrels_query_missing_from_run_warns():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}}
    run = {"q1": ["a"]}
    missing = "1 queries with relevant documents are missing from the run and score 0: 'q2'"
    with pytest.warns(UserWarning, match=missing):
        st = evaluate_run(run, qrels, ks=[1], definitions="st")
    assert st["accuracy@1"] == 0.5  # (1 + 0) / 2
    with pytest.warns(UserWarning, match="missing from the run and are left out of the averages"):
        trec = evaluate_run(run, qrels, ks=[1], definitions="trec")
    assert trec["accuracy@1"] == 1.0  # q1 only


def test_run_query_without_qrels_warns_and_is_ignored():
    with pytest.warns(UserWarning, match="1 run queries have no qrels and are ignored: 'zz'"):
        m = evaluate_run({"q": ["a"], "zz": ["b"]}, {"q": {"a": 1}}, ks=[1])
    assert m["precision@1"] == 1.0


@pytest.mark.parametrize("extra, rest", [(5, "'z4'$"), (6, "'z4' and 1 more$"), (9, "'z4' and 4 more$")])
def test_a_warning_names_five_queries_and_counts_the_rest(extra, rest):
    run = {"q": ["a"], **{f"z{i}": ["b"] for i in range(extra)}}
    with pytest.warns(UserWarning, match=f"{extra} run queries have no qrels and are ignored: 'z0', 'z1', .*{rest}"):
        evaluate_run(run, {"q": {"a": 1}}, ks=[1])


# ---- scored runs and ties ------------------------------------------------------------------


def test_rank_by_score_tie_rules():
    scores = {"d10": 1.0, "d9": 1.0, "a": 0.5, "d2": 1.0}
    # trec: score desc, then doc id desc as strings: "d9" > "d2" > "d10"
    assert rank_by_score(scores, ties="trec") == ["d9", "d2", "d10", "a"]
    # st: doc id ascending
    assert rank_by_score(scores, ties="st") == ["d10", "d2", "d9", "a"]
    # stable: the mapping's order
    assert rank_by_score(scores, ties="stable") == ["d10", "d9", "d2", "a"]
    with pytest.raises(ValueError, match="unknown ties rule 'random'"):
        rank_by_score(scores, ties="random")


def test_scored_run_is_ranked_with_the_definitions_tie_rule():
    qrels = {"q": {"b": 1}}
    run = {"q": {"a": 1.0, "b": 1.0, "c": 1.0}}  # all tied
    # trec order c, b, a -> b at rank 2
    assert evaluate_run(run, qrels, ks=[3], definitions="trec")["mrr"] == 0.5
    # st order a, b, c -> b at rank 2 as well; at k=1 neither finds it
    assert evaluate_run(run, qrels, ks=[1, 3], definitions="st")["mrr@3"] == 0.5
    qrels = {"q": {"c": 1}}
    assert evaluate_run(run, qrels, ks=[1], definitions="trec")["accuracy@1"] == 1.0  # c first
    assert evaluate_run(run, qrels, ks=[1], definitions="st")["accuracy@1"] == 0.0  # a first


def test_run_from_search_drops_padding_and_keeps_order():
    scores = np.array([[0.9, 0.8], [0.7, -np.inf]])
    indices = np.array([[2, 0], [1, -1]])
    run = run_from_search(scores, indices, ["q1", "q2"], ["d0", "d1", "d2"])
    assert run == {"q1": {"d2": 0.9, "d0": 0.8}, "q2": {"d1": 0.7}}
    assert list(run["q1"]) == ["d2", "d0"]
    with pytest.raises(ValueError, match="must both be"):
        run_from_search(scores, indices, ["q1"], ["d0", "d1", "d2"])
    with pytest.raises(ValueError, match="row 2 found, past the 2 corpus ids"):
        run_from_search(scores, indices, ["q1", "q2"], ["d0", "d1"])


def test_embeddings_not_one_per_query_and_document_are_refused():
    # Two rows for three documents ranked only the first two: d3, the relevant one, could never be found.
    data = RetrievalData(corpus={"d1": "a", "d2": "b", "d3": "c"}, queries={"q1": "c"}, qrels={"q1": {"d3": 1}})
    rows = np.eye(3, dtype=np.float32)
    assert rank_embeddings(rows[2:], rows, data, 1) == {"q1": {"d3": 1.0}}
    for queries, corpus, message in ((rows[2:], rows[:2], "2 corpus embeddings for the 3 corpus"),
                                     (rows[2:], np.eye(5, 3, dtype=np.float32), "5 corpus embeddings for the 3"),
                                     (rows, rows, "3 queries embeddings for the 1 queries")):
        with pytest.raises(ValueError, match=message):
            rank_embeddings(queries, corpus, data, 1)


# ---- the per-query functions on matrices ---------------------------------------------------


def test_per_query_functions_vectorised_over_queries():
    relevant = np.array(
        [
            [1, 0, 1, 0],  # q0: relevant at ranks 1 and 3, 2 relevant in the qrels
            [0, 0, 0, 0],  # q1: nothing found, 5 relevant
            [0, 1, 1, 1],  # q2: ranks 2, 3, 4, 3 relevant
        ],
        dtype=bool,
    )
    num_relevant = np.array([2, 5, 3])
    np.testing.assert_allclose(accuracy_at_k(relevant, 1), [1, 0, 0])
    np.testing.assert_allclose(precision_at_k(relevant, 4), [2 / 4, 0, 3 / 4])
    np.testing.assert_allclose(recall_at_k(relevant, num_relevant, 2), [1 / 2, 0, 1 / 3])
    np.testing.assert_allclose(mrr_at_k(relevant, 4), [1, 0, 1 / 2])
    # q0: (1/1 + 2/3) / min(4, 2) = 0.833333; q2: (1/2 + 2/3 + 3/4) / min(4, 3) = 0.638889
    np.testing.assert_allclose(
        map_at_k(relevant, num_relevant, 4, "st"), [(1 + 2 / 3) / 2, 0, (1 / 2 + 2 / 3 + 3 / 4) / 3]
    )
    # trec divides by #relevant: q0 (1/1) / 2; q2 (1/2) / 3 (st would divide q2 by min(2, 3) = 2)
    np.testing.assert_allclose(map_at_k(relevant, num_relevant, 2, "trec"), [1 / 2, 0, (1 / 2) / 3])
    ideal = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]], dtype=float)
    # q0: (1 + 1/log2(4)) / (1 + 1/log2(3)) = 1.5 / 1.630930 = 0.919721
    # q2: (1/log2(3) + 1/log2(4) + 1/log2(5)) / (1 + 1/log2(3) + 1/log2(4)) = 1.561607 / 2.130930 = 0.732829
    np.testing.assert_allclose(
        ndcg_at_k(relevant.astype(float), ideal, 4), [1.5 / (1 + L3), 0, (L3 + 0.5 + L5) / (1 + L3 + 0.5)]
    )


def test_ndcg_is_zero_when_nothing_is_relevant():
    assert ndcg_at_k(np.zeros((1, 3)), np.zeros((1, 3)), 3).tolist() == [0.0]


# ---- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "run, qrels, kwargs, message",
    [
        ({"q": ["a", "b", "a"]}, {"q": {"a": 1}}, {}, "run lists document 'a' twice for query 'q'"),
        ({"q": "abc"}, {"q": {"a": 1}}, {}, "must be a list of doc ids"),
        ({"q": ["a"]}, {"q": {"a": 1.5}}, {}, "grade for query 'q', document 'a' must be an integer"),
        ({"q": ["a"]}, {"q": {"a": 1}}, {"ks": [0]}, "ks must be positive integers"),
        ({"q": ["a"]}, {"q": {"a": 1}}, {"ks": []}, "ks must be positive integers"),
        ({"q": ["a"]}, {"q": {"a": 1}}, {"definitions": "beir"}, "unknown definitions 'beir'"),
        ({"q": ["a"]}, {"q": {"a": 0}}, {}, "no query to evaluate"),
        # Each of these gave a number with no error: a NaN ranked wherever the sort met it (NDCG 0 or 1
        # by the dict's order), a set's order is arbitrary, and ids of another kind match nothing (0s).
        ({"q": {"a": math.nan, "b": 0.5, "c": 0.9}}, {"q": {"c": 1}}, {}, "document 'a' has the score nan: scores"),
        ({"q": {"a": "0.9"}}, {"q": {"a": 1}}, {}, "document 'a' has the score '0.9'"),
        ({"q": {"a", "b"}}, {"q": {"a": 1}}, {}, "must be a list of doc ids .* got set"),
        ({"q": [1, 2]}, {"q": {"1": 1}}, {}, r"the run's doc ids are numbers and the qrels' strs: none can match"),
        ({"q": [{"corpus_id": 0, "score": 0.9}]}, {"q": {0: 1}}, {}, "hold a dict, not a doc id"),
        ({"q": ["a"]}, {"q": {"a"}}, {}, "qrels for query 'q' must map doc ids to grades, got a set"),
        ({"q": ["a"]}, {"q": {"a": 1}}, {"ks": 10}, "ks must be positive integers, got 10"),
    ],
)
def test_bad_input_raises_clear_error(run, qrels, kwargs, message):
    with pytest.raises(ValueError, match=message):
        evaluate_run(run, qrels, **kwargs)


def test_ids_of_other_number_types_match_and_numpy_cutoffs_are_taken():
    # 1, 1.0 and numpy's 1 are equal dict keys: ids of those kinds match, and numpy integers are cutoffs.
    qrels = {"q": {1: 1, 2: 1}}
    expected = evaluate_run({"q": [1, 3, 2]}, qrels, ks=[1, 3])
    assert evaluate_run({"q": [np.int64(1), 3.0, np.int32(2)]}, qrels, ks=[np.int64(1), 3]) == expected


# ---- cross-checks against pytrec_eval and sentence-transformers ----------------------------


@pytest.fixture(scope="module")
def reference():
    return json.loads(FIXTURE.read_text())


def test_trec_definitions_match_pytrec_eval(reference):
    with pytest.warns(UserWarning) as caught:
        ours = evaluate_run(reference["run"], reference["qrels"], reference["ks"], definitions="trec")
    assert len(caught) == 2  # q7 is in the qrels only, q_unjudged in the run only
    names = {
        "P": "precision", "recall": "recall", "success": "accuracy", "ndcg_cut": "ndcg", "map_cut": "map"
    }
    expected = reference["pytrec_eval_averages"]
    for trec_name, value in expected.items():
        if trec_name == "recip_rank":
            ours_name = "mrr"
        else:
            measure, k = trec_name.rsplit("_", 1)
            ours_name = f"{names[measure]}@{k}"
        assert ours[ours_name] == pytest.approx(value, abs=1e-12), trec_name
    assert len(expected) == 5 * len(reference["ks"]) + 1


def test_st_definitions_match_sentence_transformers(reference):
    with pytest.warns(UserWarning):
        ours = evaluate_run(reference["run"], reference["qrels"], reference["ks"], definitions="st")
    expected = reference["sentence_transformers_averages"]
    assert set(ours) == set(expected)
    for name, value in expected.items():
        assert ours[name] == pytest.approx(value, abs=1e-12), name


# ---- correlations --------------------------------------------------------------------------


def test_pearson_by_hand():
    # x - mean = [-1.5, -0.5, 0.5, 1.5], y - mean = [-3, -1, 0, 4]
    # sum of products = 4.5 + 0.5 + 0 + 6 = 11; sums of squares 5 and 26 -> 11 / sqrt(130)
    assert pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(11 / math.sqrt(130))  # 0.964764


def test_pearson_is_the_same_number_at_any_scale_of_its_inputs():
    # Scaling by a power of two is exact and leaves the correlation as it is. Unscaled, squares of
    # 2^1020-sized values overflowed (0.0 came back) and of 2^-1070-sized ones underflowed to 0 (refused
    # as constant). scipy.stats.pearsonr (1.17, in the peer environment) gives it from 2^-600 to 2^600,
    # 0.9588 at 2^-1070 and NaN at 2^1020.
    x, y = [1, 2, 3, 4], [2, 4, 5, 9]
    expected = pearson(x, y)
    for power in (-1070, -600, -1, 1, 600, 1020):
        assert pearson([math.ldexp(v, power) for v in x], y) == expected, power
        assert pearson(x, [math.ldexp(v, power) for v in y]) == expected, power


def test_spearman_averages_tied_ranks():
    assert average_ranks(np.array([10, 20, 20, 30])).tolist() == [1, 2.5, 2.5, 4]
    assert average_ranks(np.array([3.0, 1.0, 3.0, 3.0])).tolist() == [3, 1, 3, 3]  # ranks 2, 3, 4 -> 3
    # ranks of x [1, 2.5, 2.5, 4], of y [1, 3, 2, 4]; minus the mean 2.5:
    # [-1.5, 0, 0, 1.5] and [-1.5, 0.5, -0.5, 1.5]; products 2.25 + 0 + 0 + 2.25 = 4.5;
    # squares 4.5 and 5 -> 4.5 / sqrt(22.5) = 0.948683 (scipy.stats.spearmanr agrees)
    assert spearman([1, 2, 2, 3], [10, 30, 20, 40]) == pytest.approx(4.5 / math.sqrt(22.5))
    # any increasing relation has rank correlation 1, not its Pearson correlation
    assert spearman([1, 2, 3, 4], [1, 8, 27, 1000]) == pytest.approx(1.0)
    assert pearson([1, 2, 3, 4], [1, 8, 27, 1000]) < 0.9


@pytest.mark.parametrize(
    "x, y, message",
    [
        ([1, 2, 3], [1, 2], "equal length"),
        ([1], [2], "at least 2 pairs"),
        ([1, 1, 1], [1, 2, 3], "one of the inputs is constant"),
        ([0.1] * 3, [1, 2, 3], "one of the inputs is constant"),  # its mean rounds: x - mean was not 0 (gave 0.0)
        ([1, float("nan")], [1, 2], "NaN or inf"),
    ],
)
def test_correlation_bad_input(x, y, message):
    with pytest.raises(ValueError, match=message):
        pearson(x, y)


# ---- TREC files ----------------------------------------------------------------------------


def test_trec_run_round_trip_writes_trec_eval_order(tmp_path):
    path = tmp_path / "run.txt"
    write_trec_run(path, {"q1": {"d1": 0.5, "d2": 0.9, "d3": 0.5}, "q2": {"d7": 1.0}}, tag="test")
    assert path.read_text().splitlines() == [
        "q1 Q0 d2 1 0.9 test",
        "q1 Q0 d3 2 0.5 test",  # tie with d1: doc id descending
        "q1 Q0 d1 3 0.5 test",
        "q2 Q0 d7 1 1.0 test",
    ]
    assert read_trec_run(path) == {"q1": {"d2": 0.9, "d3": 0.5, "d1": 0.5}, "q2": {"d7": 1.0}}


@pytest.mark.parametrize(
    "reader, text, message",
    [
        (read_trec_run, "q1 Q0 d1 1 0.5\n", r"file.txt:1: expected 6 fields"),
        (read_trec_run, "q1 Q0 d1 1 x tag\n", r"file.txt:1: score 'x' is not a valid float"),
        (read_trec_run, "q1 Q0 d1 1 nan tag\n", r"file.txt:1: score 'nan' is not finite"),
        (read_trec_run, "q1 Q0 d1 one 0.5 tag\n", r"file.txt:1: rank 'one' is not a valid int"),
        (read_trec_run, "q1 Q0 d1 1 0.5 t\nq1 Q0 d1 2 0.4 t\n", r"file.txt:2: document 'd1' appears twice"),
    ],
)
def test_malformed_trec_files_name_file_and_line(tmp_path, reader, text, message):
    path = tmp_path / "file.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        reader(path)


@pytest.mark.parametrize("reader, text", [
    (read_trec_run, "q1 Q0 d1 1 0.9 x\r\nq1 Q0 d2 2 0.5 x\r\n"),
    (read_qrels, "q1 0 d1 1\nq1 0 d2 0\n"),
    (read_qrels, "query-id\tcorpus-id\tscore\nq1\td1\t1\n"),
])
def test_trec_files_saved_with_a_byte_order_mark_or_gzipped_read_as_the_plain_file(tmp_path, reader, text):
    # A spreadsheet program or PowerShell saves "\ufeff" first: left in, "\ufeffq1" is another query, which
    # takes the first line's document away from q1 (a run's top hit lost; NDCG 0.5 where it is 1.0).
    expected = reader(_written(tmp_path / "plain.txt", text.encode()))
    for name, data in (("bom.txt", "\ufeff".encode() + text.encode()), ("run.txt.gz", gzip.compress(text.encode()))):
        assert reader(_written(tmp_path / name, data)) == expected, name


def _written(path, data: bytes):
    path.write_bytes(data)
    return path


def test_write_trec_run_rejects_ids_with_spaces(tmp_path):
    with pytest.raises(ValueError, match="doc id 'a b' cannot be written"):
        write_trec_run(tmp_path / "run.txt", {"q": {"a b": 1.0}})


@pytest.mark.parametrize("run, message", [({"q": {"a": math.nan}}, "document 'a' has the score nan"),
                                          ({"q": ["a", "b"]}, "query 'q': a run to write maps doc ids to scores, got a list")])
def test_write_trec_run_refuses_what_it_cannot_write_and_leaves_the_file_as_it_was(tmp_path, run, message):
    # A NaN was written at rank 1, a file read_trec_run then refused.
    path = tmp_path / "run.txt"
    write_trec_run(path, {"q": {"a": 1.0}})
    before = path.read_bytes()
    with pytest.raises(ValueError, match=message):
        write_trec_run(path, run)
    assert path.read_bytes() == before
