"""Retrieval metrics: Precision, Accuracy, Recall, MRR, NDCG and MAP at k, query by query.

A retrieval metric is only meaningful together with its definition, and the two definitions in use
disagree (the table in tests/fixtures/README.md sets them side by side). Both are implemented and selected with `definitions=`:

"st"    sentence-transformers `InformationRetrievalEvaluator` (what sentence-transformers and the
        Sentence-BERT papers report). Relevance is binary: a qrel grade > 0 is relevant. MAP@k
        divides by min(k, #relevant). Averages run over the queries that have at least one
        relevant document.
"trec"  trec_eval as wrapped by pytrec_eval and used by BEIR and MTEB. A grade >= 1 is relevant;
        NDCG uses the grade itself as gain and builds the ideal ranking from every judged
        document; MAP@k (trec_eval `map_cut`) divides by #relevant. Averages run over the queries
        present in both the run and the qrels, including queries whose qrels hold no relevant
        document (they score 0).

trec_eval's `recip_rank` has no cutoff; it is reported as "mrr" (no "@"). "mrr@k", with cutoff, is
also reported in "trec" mode because BEIR and MTEB publish MRR@10 computed that way; with binary
relevance >= 1 it is the same formula as the "st" one.

Every metric below is a plain function of a (queries, ranks) relevance matrix, vectorised over
queries; `per_query_scores` builds the matrices from a run and qrels, and `evaluate_run`
averages them. Both definition sets are checked against their reference on a random graded run
(pytrec_eval and sentence-transformers 6.2 numbers in tests/fixtures/metric_reference.json) and
against hand-computed examples in tests/evaluation/test_metrics.py.

The STS benchmarks' correlations are in evaluation/correlation.py; run and qrels files are read and written
by datasets/trec.py.
"""

import numbers
import warnings
from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np

DEFINITIONS = ("st", "trec")
TIES = ("trec", "st", "stable")

# A run maps each query id to its results: either doc ids ranked best first, or {doc id: score}.
Run = Mapping[Hashable, Sequence[Hashable] | Mapping[Hashable, float]]
# Qrels map each query id to {doc id: integer relevance grade}.
Qrels = Mapping[Hashable, Mapping[Hashable, int]]


# ---- per-query metrics ----------------------------------------------------------------------
# `relevant` is a (Q, depth) bool matrix: relevant[i, r] says whether the document at rank r + 1
# of query i is relevant. Ranks past the end of a short result list are False. `num_relevant` is
# (Q,): how many relevant documents query i has in the qrels. Each function returns (Q,) values.


def accuracy_at_k(relevant: np.ndarray, k: int) -> np.ndarray:
    """Accuracy@k (hit rate; trec_eval `success_k`): 1 if any of the top k is relevant, else 0.

    Same in sentence-transformers and trec_eval.
    """
    return relevant[:, :k].any(axis=1).astype(np.float64)


def precision_at_k(relevant: np.ndarray, k: int) -> np.ndarray:
    """Precision@k = (relevant documents in the top k) / k.

    Always divided by k, also when fewer than k documents were returned (sentence-transformers
    and trec_eval `P_k` agree).
    """
    return relevant[:, :k].sum(axis=1) / k


def recall_at_k(relevant: np.ndarray, num_relevant: np.ndarray, k: int) -> np.ndarray:
    """Recall@k = (relevant documents in the top k) / (relevant documents in the qrels).

    0 for a query without relevant documents (trec_eval `recall_k`; sentence-transformers never
    sees such queries).
    """
    hits = relevant[:, :k].sum(axis=1)
    return np.divide(hits, num_relevant, out=np.zeros(len(hits)), where=num_relevant > 0)


def mrr_at_k(relevant: np.ndarray, k: int) -> np.ndarray:
    """Reciprocal rank: 1 / (rank of the first relevant document among the top k), else 0.

    sentence-transformers MRR@k. With k = the whole ranking it is trec_eval `recip_rank`.
    """
    top = relevant[:, :k]
    first = top.argmax(axis=1)  # index of the first True; 0 when there is none
    return np.where(top.any(axis=1), 1.0 / (first + 1), 0.0)


def ndcg_at_k(gains: np.ndarray, ideal_gains: np.ndarray, k: int) -> np.ndarray:
    """NDCG@k = DCG@k / ideal DCG@k, with DCG@k = sum over ranks r <= k of gain_r / log2(r + 1).

    gains: (Q, depth) gain of the document at each rank. ideal_gains: (Q, width) the best
    possible gains, sorted descending (zero-padded). 0 where the ideal DCG is 0.
    "st": gains are 0/1 and the ideal is min(k, #relevant) ones (sentence-transformers).
    "trec": gains are the grades and the ideal sorts all judged grades (trec_eval `ndcg_cut_k`).
    """
    discounts = 1.0 / np.log2(np.arange(2, k + 2))  # (k,): 1/log2(2), 1/log2(3), ...
    top, ideal = gains[:, :k], ideal_gains[:, :k]
    dcg = top @ discounts[: top.shape[1]]
    ideal_dcg = ideal @ discounts[: ideal.shape[1]]
    return np.divide(dcg, ideal_dcg, out=np.zeros(len(dcg)), where=ideal_dcg > 0)


def map_at_k(
    relevant: np.ndarray, num_relevant: np.ndarray, k: int, definitions: str = "st"
) -> np.ndarray:
    """Average precision at k: (sum of Precision@r over the ranks r <= k holding a relevant
    document) / D.

    "st": D = min(k, #relevant) (sentence-transformers MAP@k), so a query whose top k are all
    relevant scores 1 whatever #relevant is. "trec": D = #relevant (trec_eval `map_cut_k`), so
    the same query with 20 relevant documents scores 10/20 at k = 10. 0 when D = 0.
    """
    _check_definitions(definitions)
    top = relevant[:, :k]
    precision_at_rank = np.cumsum(top, axis=1) / np.arange(1, top.shape[1] + 1)  # (Q, k)
    summed = (precision_at_rank * top).sum(axis=1)
    denominator = np.minimum(k, num_relevant) if definitions == "st" else num_relevant
    return np.divide(summed, denominator, out=np.zeros(len(summed)), where=denominator > 0)


# ---- a whole run ----------------------------------------------------------------------------


def evaluate_run(
    run: Run, qrels: Qrels, ks: Iterable[int] = (1, 3, 5, 10, 100), definitions: str = "st"
) -> dict[str, float]:
    """Average every metric at every k over the evaluated queries: the mean of
    `per_query_scores(run, qrels, ks, definitions)`, metric by metric (so the per-query values
    average to these numbers exactly). Arguments, queries averaged and errors: per_query_scores.

    Returns:
        {"accuracy@k", "precision@k", "recall@k", "mrr@k", "ndcg@k", "map@k"} for every k,
        plus "mrr" (no cutoff) for "trec".
    """
    return average_scores(per_query_scores(run, qrels, ks, definitions))


def average_scores(per_query: Mapping[str, Mapping[Hashable, float]]) -> dict[str, float]:
    """{metric: mean over the queries} of per_query_scores' {metric: {query id: value}}."""
    return {name: float(np.mean(list(values.values()))) for name, values in per_query.items()}


def per_query_scores(
    run: Run, qrels: Qrels, ks: Iterable[int] = (1, 3, 5, 10, 100), definitions: str = "st"
) -> dict[str, dict[Hashable, float]]:
    """Every metric at every k for each evaluated query: {"ndcg@10": {query id: value}, ...}.

    Args:
        run: query id -> ranked doc ids (best first), or -> {doc id: score}. Scored results are
            ranked with `rank_by_score(results, ties=definitions)`, so equal scores are ordered
            as the chosen reference orders them (doc id descending for "trec", ascending for
            "st"). Pass ranked lists to keep an order of your own.
        qrels: query id -> {doc id: integer grade}. Unlisted documents count as not relevant.
        ks: cutoffs.
        definitions: "st" or "trec" (see the module docstring).

    Which queries are evaluated:
        "st": queries of the qrels with a relevant document. Such a query missing from the run
            scores 0 and a warning names it.
        "trec": queries in both the run and the qrels. Qrels queries missing from the run are
            left out (as pytrec_eval does) and a warning names them.
        Both: run queries without qrels are ignored, with a warning.

    Raises:
        ValueError: unknown definitions, bad ks, a doc id listed twice for one query, a score that
            is not a finite number, results that are no ranking (a set, a string, hits as dicts), qrels
            that are not {doc id: grade}, a grade that is not an integer, doc ids of a kind the qrels'
            cannot equal (numbers against strings), or nothing left to evaluate.
    """
    _check_definitions(definitions)
    ks = list(ks) if isinstance(ks, Iterable) else ks
    if not isinstance(ks, list) or not ks or any(isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1
                                                 for k in ks):
        raise ValueError(f"ks must be positive integers, got {ks!r}")
    ks = sorted({int(k) for k in ks})
    rankings = {
        query_id: _ranking(query_id, results, definitions) for query_id, results in run.items()
    }
    query_ids = _queries_to_average(rankings, qrels, definitions)
    ranked, judged = (_id_kinds(doc_id for q in query_ids for doc_id in table.get(q, ())) for table in (rankings, qrels))
    if ranked and judged and not ranked & judged:  # semantic_search's corpus_id is a row number, BEIR's ids are strings
        raise ValueError(f"the run's doc ids are {' and '.join(sorted(ranked))}s and the qrels' "
                         f"{' and '.join(sorted(judged))}s: none can match (1 is not '1'); map the run's ids to the qrels'")

    depth = max([ks[-1]] + [len(rankings.get(query_id, ())) for query_id in query_ids])
    grades, ideal_grades = _grade_matrices(rankings, qrels, query_ids, depth, ks[-1])
    if definitions == "st":
        relevant = grades > 0
        gains = relevant.astype(np.float64)
        ideal_gains = (ideal_grades > 0).astype(np.float64)
    else:
        relevant = grades >= 1
        gains = np.maximum(grades, 0).astype(np.float64)
        ideal_gains = np.maximum(ideal_grades, 0).astype(np.float64)
    num_relevant = np.array(
        [sum(_is_relevant(grade, definitions) for grade in qrels[q].values()) for q in query_ids]
    )

    columns = {}  # metric name -> (Q,) values, in query_ids' order
    for k in ks:
        columns[f"accuracy@{k}"] = accuracy_at_k(relevant, k)
        columns[f"precision@{k}"] = precision_at_k(relevant, k)
        columns[f"recall@{k}"] = recall_at_k(relevant, num_relevant, k)
        columns[f"mrr@{k}"] = mrr_at_k(relevant, k)
        columns[f"ndcg@{k}"] = ndcg_at_k(gains, ideal_gains, k)
        columns[f"map@{k}"] = map_at_k(relevant, num_relevant, k, definitions)
    if definitions == "trec":
        columns["mrr"] = mrr_at_k(relevant, depth)
    return {name: dict(zip(query_ids, values.tolist())) for name, values in columns.items()}


def rank_by_score(scores: Mapping[Hashable, float], ties: str = "trec") -> list[Hashable]:
    """Doc ids sorted by score, highest first, with one of three rules for equal scores:

    ties="trec": doc id descending, compared as strings: what trec_eval does, whatever the rank
        column of the run file says.
    ties="st": doc id ascending: what sentence-transformers' InformationRetrievalEvaluator does
        (checked with version 6.2; older releases left ties in heap order).
    ties="stable": the mapping's own order (e.g. the order `retrieval.search` returned them in,
        lower corpus index first).
    A score that is not a finite number is refused (a NaN would rank wherever the sort met it).
    """
    for doc_id, score in scores.items():  # a NaN would rank wherever the sort meets it
        if isinstance(score, bool) or not isinstance(score, numbers.Real) or not np.isfinite(score):
            raise ValueError(f"document {doc_id!r} has the score {score!r}: scores must be finite numbers")
    if ties == "trec":
        return sorted(scores, key=lambda doc_id: (scores[doc_id], str(doc_id)), reverse=True)
    if ties == "st":
        return sorted(scores, key=lambda doc_id: (-scores[doc_id], doc_id))
    if ties == "stable":
        return sorted(scores, key=lambda doc_id: -scores[doc_id])  # sorted() is stable
    raise ValueError(f"unknown ties rule {ties!r}; choose one of {', '.join(TIES)}")


def _ranking(query_id: Hashable, results, ties: str) -> list[Hashable]:
    if isinstance(results, Mapping):
        return rank_by_score(results, ties)
    if isinstance(results, (str, bytes, set, frozenset)) or not isinstance(results, Iterable):  # a set has no order
        raise ValueError(
            f"run results for query {query_id!r} must be a list of doc ids or a "
            f"{{doc id: score}} mapping, got {type(results).__name__}"
        )
    ranking = list(results)
    seen = set()
    for doc_id in ranking:
        if not isinstance(doc_id, Hashable):
            raise ValueError(f"run results for query {query_id!r} hold a {type(doc_id).__name__}, not a doc id "
                             "(semantic_search's hits: {hit['corpus_id']: hit['score'] for hit in hits})")
        if doc_id in seen:
            raise ValueError(f"run lists document {doc_id!r} twice for query {query_id!r}")
        seen.add(doc_id)
    return ranking


def _id_kinds(doc_ids) -> set[str]:
    """What kinds of ids these are, as equality sees them: any number can equal another (numpy's 1, 1.0)."""
    return {"number" if isinstance(doc_id, numbers.Number) else type(doc_id).__name__ for doc_id in doc_ids}


def _is_relevant(grade: int, definitions: str) -> bool:
    return grade > 0 if definitions == "st" else grade >= 1


def _queries_to_average(rankings: dict, qrels: Qrels, definitions: str) -> list[Hashable]:
    for query_id, judged in qrels.items():
        if not isinstance(judged, Mapping):
            raise ValueError(f"qrels for query {query_id!r} must map doc ids to grades, got a "
                             f"{type(judged).__name__} (a set of relevant ids: {{doc_id: 1 for doc_id in ids}})")
        for doc_id, grade in judged.items():
            if isinstance(grade, bool) or not isinstance(grade, numbers.Integral):
                raise ValueError(
                    f"qrels grade for query {query_id!r}, document {doc_id!r} must be an "
                    f"integer, got {grade!r}"
                )
    _warn_about(
        "run queries have no qrels and are ignored", [q for q in rankings if q not in qrels]
    )
    if definitions == "st":
        query_ids = [q for q, judged in qrels.items() if any(g > 0 for g in judged.values())]
        _warn_about(
            "queries with relevant documents are missing from the run and score 0",
            [q for q in query_ids if q not in rankings],
        )
    else:
        query_ids = [q for q in rankings if q in qrels]
        _warn_about(
            "qrels queries are missing from the run and are left out of the averages, as "
            "trec_eval does",
            [q for q in qrels if q not in rankings],
        )
    if not query_ids:
        raise ValueError(
            f"no query to evaluate: the run has {len(rankings)} queries, the qrels "
            f"{len(qrels)}, and with definitions={definitions!r} none qualifies; check that "
            f"the query ids match"
        )
    return query_ids


def _warn_about(problem: str, query_ids: list) -> None:
    if query_ids:
        examples = ", ".join(repr(q) for q in query_ids[:5])
        more = f" and {len(query_ids) - 5} more" if len(query_ids) > 5 else ""
        warnings.warn(f"{len(query_ids)} {problem}: {examples}{more}", stacklevel=3)


def _grade_matrices(
    rankings: dict, qrels: Qrels, query_ids: list, depth: int, ideal_width: int
) -> tuple[np.ndarray, np.ndarray]:
    """(Q, depth) grade of the document at each rank (0 if unjudged or past the end), and
    (Q, ideal_width) the judged grades sorted descending (the ideal ranking)."""
    grades = np.zeros((len(query_ids), depth), dtype=np.int64)
    ideal_grades = np.zeros((len(query_ids), ideal_width), dtype=np.int64)
    for row, query_id in enumerate(query_ids):
        judged = qrels[query_id]
        ranking = rankings.get(query_id, [])
        grades[row, : len(ranking)] = [judged.get(doc_id, 0) for doc_id in ranking]
        best = sorted(judged.values(), reverse=True)[:ideal_width]
        ideal_grades[row, : len(best)] = best
    return grades, ideal_grades


def _check_definitions(definitions: str) -> None:
    if definitions not in DEFINITIONS:
        raise ValueError(
            f"unknown definitions {definitions!r}; choose one of {', '.join(DEFINITIONS)}"
        )
