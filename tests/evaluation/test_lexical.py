"""What "correct" means for the lexical baselines: hand-worked BM25 and Jaccard values, a brute-force
BM25 written straight from the formula, and ties broken by the lower document index."""

import math
from collections import Counter

import numpy as np
import pytest

from minisbert import datasets
from minisbert.evaluation import lexical

# BM25 here and by hand or brute force is float64 arithmetic of a handful of operations in another order
# (log1p against log(1 + x), weights made once against per token): a few ulps (2.2e-16 relative each)
# apart, far inside 1e-12; another k1 or b moves the scores by 1e-2 and more.
FLOAT64_APART = 1e-12

# avgdl = (3 + 2 + 4) / 3 = 3, N = 3
CORPUS = ["Apple banana, apple.", "banana cherry", "cherry cherry cherry date"]


def test_tokenize_lowercases_and_splits_on_non_alphanumerics():
    assert lexical.tokenize("Covid-19's R_0, Été!") == ["covid", "19", "s", "r", "0", "été"]
    assert lexical.tokenize(" ... ") == []


def test_bm25_hand_computed_scores():
    bm25 = lexical.BM25(CORPUS)  # k1 = 1.2, b = 0.75
    # idf(apple) = ln(1 + (3 - 1 + 0.5) / (1 + 0.5)) = ln(8/3); in doc 0 tf = 2 and |d| = avgdl, so
    # the length factor is 1 and the tf part is 2 * 2.2 / (2 + 1.2) = 1.375.
    expected_apple = 1.375 * math.log(8 / 3)  # = 1.348640
    # idf(banana) = ln(1 + 1.5 / 2.5) = ln(1.6). Doc 0: tf 1, factor 1 -> 2.2 / 2.2 = 1.
    # Doc 1: |d| = 2, factor 0.25 + 0.75 * 2/3 = 0.75 -> 2.2 / (1 + 1.2 * 0.75) = 2.2 / 1.9.
    expected_banana = [math.log(1.6), 2.2 / 1.9 * math.log(1.6), 0.0]  # [0.470004, 0.544215, 0]
    # cherry, doc 2: tf 3, |d| = 4, factor 0.25 + 0.75 * 4/3 = 1.25 -> 6.6 / (3 + 1.5) = 1.466667.
    expected_cherry = [0.0, 2.2 / 1.9 * math.log(1.6), 6.6 / 4.5 * math.log(1.6)]  # [0, 0.544215, 0.689339]
    np.testing.assert_allclose(bm25.scores("apple"), [expected_apple, 0.0, 0.0], rtol=FLOAT64_APART)
    np.testing.assert_allclose(bm25.scores("BANANA"), expected_banana, rtol=FLOAT64_APART)
    np.testing.assert_allclose(bm25.scores("cherry"), expected_cherry, rtol=FLOAT64_APART)
    # A query is a sum over its tokens, a repeated token counted each time.
    np.testing.assert_allclose(bm25.scores("banana cherry banana"),
                               2 * np.array(expected_banana) + np.array(expected_cherry), rtol=FLOAT64_APART)
    scores, indices = bm25.search(["cherry", "banana"], k=2)
    np.testing.assert_array_equal(indices, [[2, 1], [1, 0]])
    np.testing.assert_allclose(scores, [[expected_cherry[2], expected_cherry[1]],
                                        [expected_banana[1], expected_banana[0]]], rtol=FLOAT64_APART)


def brute_force_bm25(corpus, query, k1=1.2, b=0.75):
    """The module docstring's formula, one document and one query token at a time."""
    docs = [Counter(lexical.tokenize(text)) for text in corpus]
    lengths = [sum(d.values()) for d in docs]
    avgdl = sum(lengths) / len(docs)
    scores = []
    for doc, length in zip(docs, lengths):
        total = 0.0
        for token in lexical.tokenize(query):
            n = sum(1 for d in docs if token in d)
            idf = math.log(1 + (len(docs) - n + 0.5) / (n + 0.5))
            tf = doc[token]
            total += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avgdl))
        scores.append(total)
    return np.array(scores)


@pytest.mark.parametrize("k1,b", [(1.2, 0.75), (0.9, 0.4), (2.0, 0.0)])
def test_bm25_matches_brute_force_on_random_corpus(k1, b):
    rng = np.random.default_rng(7)
    words = [f"w{i}" for i in range(12)]
    corpus = [" ".join(rng.choice(words, size=rng.integers(1, 9))) for _ in range(30)]
    queries = [" ".join(rng.choice(words + ["unseen"], size=rng.integers(1, 5))) for _ in range(10)]
    bm25 = lexical.BM25(corpus, k1=k1, b=b)
    for query in queries:
        np.testing.assert_allclose(bm25.scores(query), brute_force_bm25(corpus, query, k1, b), rtol=FLOAT64_APART,
                                   atol=FLOAT64_APART)  # atol: the documents that share no token score 0


def test_ties_go_to_the_lower_index():
    scores, indices = lexical.BM25(["x y", "z", "x y", "x y"]).search(["x"], k=2)
    np.testing.assert_array_equal(indices, [[0, 2]])
    assert scores[0, 0] == scores[0, 1]
    # A query sharing no token with the corpus scores 0 everywhere: the first k documents.
    _, indices = lexical.BM25(["a", "b", "c"]).search(["nothing"], k=2)
    np.testing.assert_array_equal(indices, [[0, 1]])


def test_top_k_agrees_with_a_stable_full_sort():
    rng = np.random.default_rng(0)
    for _ in range(200):
        scores = rng.integers(0, 4, size=rng.integers(1, 30)).astype(float)  # many ties
        k = int(rng.integers(1, 35))
        values, indices = lexical.top_k(scores, k)
        reference = np.argsort(-scores, kind="stable")[:k]
        np.testing.assert_array_equal(indices, reference)
        np.testing.assert_array_equal(values, scores[reference])


def test_k_larger_than_corpus_is_clamped():
    scores, indices = lexical.BM25(CORPUS).search(["apple", "date", "zebra"], k=10)
    assert scores.shape == indices.shape == (3, 3)
    assert indices.dtype == np.int64


def test_jaccard_hand_computed():
    # {the, cat, sat} vs {the, cat, ran}: 2 shared of 4 distinct -> 0.5
    assert lexical.jaccard_similarity("The cat sat.", "the cat ran") == 0.5
    # Word sets, not bags: repeats do not count. {cat} vs {cat}: 1/1
    assert lexical.jaccard_similarity("cat cat", "Cat!") == 1.0
    assert lexical.jaccard_similarity("", "...") == 0.0  # both empty: defined as 0
    assert lexical.jaccard_similarity("cat", "") == 0.0  # 0 shared of 1


def test_jaccard_search_and_matrix():
    corpus = ["the cat sat", "a dog ran", "the cat"]
    # query {the, cat, sat}: doc 0 3/3, doc 1 0/6, doc 2 2/3
    scores, indices = lexical.Jaccard(corpus).search(["The cat sat"], k=3)
    np.testing.assert_array_equal(indices, [[0, 2, 1]])
    # One float64 division of the same two counts there and here: equal to the bit.
    np.testing.assert_array_equal(scores, [[1.0, 2 / 3, 0.0]])
    queries = ["cat", "dog dog ran", "", "sat on the mat"]
    matrix = lexical.jaccard_matrix(queries, corpus)
    assert matrix.shape == (4, 3)
    expected = [[lexical.jaccard_similarity(q, d) for d in corpus] for q in queries]
    np.testing.assert_array_equal(matrix, expected)


@pytest.mark.parametrize("call, name", [
    (lambda text: lexical.BM25(CORPUS).search(text, 2), "query_texts"),
    (lambda text: lexical.Jaccard(CORPUS).search(text, 2), "query_texts"),
    (lambda text: lexical.BM25(text), "corpus_texts"),
    (lambda text: lexical.Jaccard(text), "corpus_texts"),
    (lambda text: lexical.jaccard_matrix(text, CORPUS), "texts_a"),
    (lambda text: lexical.jaccard_matrix(CORPUS, text), "corpus_texts"),
])
def test_one_string_where_texts_are_expected_is_refused(call, name):
    # Iterated, "cat dog" is seven one-letter texts: seven queries, or a corpus of letters, and no error.
    for text in ("cat dog", b"cat dog"):
        with pytest.raises(TypeError, match=f"{name} must be a list of texts, got a single (str|bytes) .*wrap it in a list"):
            call(text)


def test_a_negative_k_is_refused_naming_it():
    for k in (-1, 1.5, True):
        with pytest.raises(ValueError, match=f"k must be a non-negative integer, got {k!r}"):
            lexical.BM25(CORPUS).search(["apple"], k)
    assert lexical.BM25(CORPUS).search(["apple"], np.int64(0))[0].shape == (1, 0)


@pytest.mark.slow
def test_bm25_on_scifact_test(data_mirror):
    scifact = datasets.load_beir(data_mirror / "scifact", "test")
    doc_ids = list(scifact.corpus)
    _, indices = lexical.BM25(list(scifact.corpus.values())).search(list(scifact.queries.values()), k=10)
    ndcg = []
    for query_id, row in zip(scifact.queries, indices):
        relevant = scifact.qrels[query_id]  # all SciFact judgments are 1: binary gains
        dcg = sum(1 / math.log2(rank + 2) for rank, j in enumerate(row) if relevant.get(doc_ids[j], 0) > 0)
        ideal = sum(1 / math.log2(rank + 2) for rank in range(min(10, len(relevant))))
        ndcg.append(dcg / ideal)
    # Measured once with this implementation (BEIR's Anserini BM25 reports 0.665, MTEB's 0.687): 0.6634478.
    # Where two of a query's top 11 scores differ they differ by 1.1e-5 of the top one at least, 1e11 ulps
    # of float64, so every CPU ranks alike and gets this number; 5e-5 is ten times its rounding to 0.66345.
    assert np.mean(ndcg) == pytest.approx(0.66345, abs=5e-5)
