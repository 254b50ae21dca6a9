"""The similarity functions: each entry of the (n, m) matrix is its definition, computed here one pair at
a time in float64 (cosine a·b / (|a| |b|), dot a·b, euclidean -|a - b|, manhattan -sum |a_d - b_d|);
numpy arrays and tensors, single embeddings and matrices are all accepted; wrong inputs are refused
naming what is wrong; and sentence-transformers' own snippet runs on minisbert with the import changed."""

import math
import warnings

import numpy as np
import pytest
import torch

import minisbert
from minisbert.common.similarity import SIMILARITY_FUNCTIONS, similarity, similarity_pairwise

from ..conftest import reference
from ..tolerances import float32_apart, scale

DEFINITIONS = {
    "cosine": lambda a, b: sum(x * y for x, y in zip(a, b)) / (math.hypot(*a) * math.hypot(*b)),
    "dot": lambda a, b: sum(x * y for x, y in zip(a, b)),
    "euclidean": lambda a, b: -math.dist(a, b),
    "manhattan": lambda a, b: -sum(abs(x - y) for x, y in zip(a, b)),
}


@pytest.mark.parametrize("function", SIMILARITY_FUNCTIONS)
def test_each_entry_is_the_definition(function):
    generator = np.random.default_rng(0)
    a = generator.normal(size=(5, 7)).astype(np.float32)
    b = (3 * generator.normal(size=(4, 7))).astype(np.float32)  # rows of other lengths than a's
    scores = similarity(a, b, function)
    assert isinstance(scores, torch.Tensor) and scores.shape == (5, 4)
    expected = [[DEFINITIONS[function](a[i].tolist(), b[j].tolist()) for j in range(4)] for i in range(5)]
    # float32 against float64: at most one float32 computation of D = 7 terms (the norms, then the
    # product or the difference's sum) from the exact value, relative to the values' scale.
    assert np.abs(scores.numpy() - np.array(expected)).max() <= float32_apart(3 * 7) * scale(np.array(expected))
    assert torch.equal(similarity(torch.from_numpy(a), torch.from_numpy(b), function), scores)
    one = similarity(a[1], b, function)  # one embedding (D,) is one row: the same sums, other kernel shapes
    assert one.shape == (1, 4)
    assert torch.allclose(one[0], scores[1], rtol=0, atol=float32_apart(3 * 7) * scale(np.array(expected)))


def test_cosine_is_the_default_and_zero_rows_score_zero():
    a = np.array([[1.0, 0.0], [0.0, 0.0]], dtype=np.float32)
    b = np.array([[2.0, 2.0]], dtype=np.float32)
    # float32 sums over D = 2 (tolerances.py); the zero row is exactly 0
    assert torch.allclose(similarity(a, b), torch.tensor([[math.sqrt(0.5)], [0.0]]), rtol=0, atol=float32_apart(3 * 2))


@pytest.mark.parametrize("a, b, function, error, message", [
    (np.ones((2, 3)), np.ones((2, 4)), "cosine", ValueError, "a has 3 dimensions, b has 4"),
    (np.ones((2, 3, 1)), np.ones((2, 3)), "cosine", ValueError,
     r"a must be one embedding \(D,\) or .* shape \(2, 3, 1\)"),
    ("1.0 2.0", np.ones((2, 2)), "cosine", TypeError, "a must be a numpy array, a torch tensor or a non-empty list .* got str"),
    ([], np.ones((2, 2)), "cosine", TypeError, "a must be a numpy array, a torch tensor or a non-empty list .* got list"),
    (np.ones((2, 2)), np.ones((2, 2)), "cos_sim", ValueError, "unknown similarity function 'cos_sim'"),
])
def test_bad_inputs_are_refused(a, b, function, error, message):
    with pytest.raises(error, match=message):
        similarity(a, b, function)


@pytest.mark.parametrize("function", SIMILARITY_FUNCTIONS)
def test_lists_of_embeddings_are_stacked_and_pairwise_is_the_diagonal(function):
    """What encode(convert_to_numpy=False) returns, a list of (D,) tensors, compares as their stack,
    as do lists of arrays and lists of lists; similarity_pairwise is the matrix's diagonal."""
    a, b = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)), torch.randn(3, 5)
    matrix = similarity(a, b, function)
    apart = float32_apart(3 * 5) * scale(matrix)  # the same sums of D = 5 terms, by another kernel
    for as_list in (list, lambda t: [row.numpy() for row in t], lambda t: t.tolist()):
        assert torch.allclose(similarity(as_list(a), as_list(b), function), matrix, rtol=0, atol=apart)
    assert torch.allclose(similarity_pairwise(a, b, function), matrix.diagonal(), rtol=0, atol=apart)
    with pytest.raises(ValueError, match="as many rows in a as in b, got 3 and 2"):
        similarity_pairwise(a, b[:2], function)


@pytest.mark.parametrize("function", SIMILARITY_FUNCTIONS)
def test_any_numpy_layout_compares_as_its_values_and_integers_are_refused(function):
    """What a porting user hands util.cos_sim: reversed rows, another byte order, a broadcast row, a
    read-only array, columns laid out first (a transposed tensor). Each compares as a plain copy of its values does, bit for bit and
    with no warning (torch reads none of the first two as they are; minisbert never writes an input);
    float16 beside float32 compares in float32; integers, whose unit rows would round to zeros, are
    refused, naming them."""
    generator = np.random.default_rng(1)
    a, b = generator.standard_normal((6, 5)).astype(np.float32), generator.standard_normal((4, 5)).astype(np.float32)
    read_only = a.copy()
    read_only.flags.writeable = False
    for form in (a[::-1], a[:, ::-1], a.astype(">f4"), np.broadcast_to(a[0], (6, 5)), read_only, np.asfortranarray(a),
                 torch.from_numpy(a.T.copy()).T):
        copy = np.ascontiguousarray(form, dtype=np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for given, plain in (((form, b), (copy, b)), ((b, form), (b, copy))):  # the form on either side
                assert torch.equal(similarity(*given, function), similarity(*plain, function))
                pairs = [similarity_pairwise(first[:4], second[:4], function) for first, second in (given, plain)]
                assert torch.equal(*pairs)
    half = a.astype(np.float16)
    assert torch.equal(similarity(half, b, function), similarity(half.astype(np.float32), b, function))
    for integers in (np.arange(10).reshape(2, 5), torch.arange(10).reshape(2, 5), np.arange(5, dtype=">i4")):
        with pytest.raises(ValueError, match=r"a holds torch.int(64|32) numbers; embeddings are floating point"):
            similarity(integers, b, function)


# A snippet written for sentence-transformers (its usual quickstart shape: construct, encode, compare),
# with only the import line changed.
SNIPPET = """
from minisbert import SentenceTransformer

model = SentenceTransformer(MODEL)
sentences = [
    "The train left the station late.",
    "Our train was delayed this morning.",
    "She planted tomatoes in the garden.",
]
embeddings = model.encode(sentences)
similarities = model.similarity(embeddings, embeddings)
"""


def test_a_sentence_transformers_snippet_runs_with_the_import_changed():
    folder = reference("tiny_st_dense")[0]
    names = {"MODEL": str(folder)}
    exec(SNIPPET, names)
    embeddings, similarities = names["embeddings"], names["similarities"]
    assert isinstance(embeddings, np.ndarray) and embeddings.shape == (3, minisbert.load(folder).dimension)
    assert similarities.shape == (3, 3)
    assert torch.equal(similarities, similarity(embeddings, embeddings, "cosine"))  # the same call
    # Unit rows (the model normalises): cosine with itself is 1 up to a float32 sum over D.
    assert torch.allclose(similarities.diagonal(), torch.ones(3), rtol=0, atol=float32_apart(embeddings.shape[1]))


def test_one_cosine_at_float32s_limits():
    # Rows of entries near 1e-20 and 1e30: their squares leave float32's range, not float64's, where
    # unit_rows measures them. Pooling's normalisation, util.cos_sim and the search agree on them: the
    # true cosines (1, -1, 1/sqrt(8)·sum of signs...), to float32 rounding (2 roundings of order 1).
    from minisbert.porting import util
    from minisbert.encoding.pooling import normalize
    from minisbert.search import search

    signs = torch.tensor([[1.0, -1, 1, 1, -1, 1, 1, 1]])
    corpus = torch.cat([torch.full((1, 8), 1e-20), torch.full((1, 8), -3e-20), signs * 1e30, signs * 1e-30])
    query = torch.full((1, 8), 2e-20)
    expected = torch.tensor([1.0, -1.0, 0.5, 0.5])  # (6 - 2) / 8 for the signed rows
    assert torch.allclose(torch.linalg.vector_norm(normalize(corpus), dim=1), torch.ones(4), atol=1e-6)
    assert torch.allclose(util.cos_sim(query, corpus)[0], expected, atol=1e-6)
    scores, rows = search(query, corpus, 4)
    assert torch.allclose(scores[0], expected[rows[0]], atol=1e-6)
    assert rows[0].tolist() == [0, 2, 3, 1]  # 0.5 twice: the lower row first


def fixed_order_sum(terms: list[float]) -> float:
    """fixed_sum's documented order written out on a Python list: the last half of the terms added onto
    the first half (an odd middle term waits), again and again until one is left; no terms sum to 0."""
    while len(terms) > 1:
        half = len(terms) // 2
        terms = [a + b for a, b in zip(terms[:half], terms[-half:])] + terms[half:-half]
    return terms[0] if terms else 0.0


def test_fixed_sum_adds_in_its_documented_order_whatever_the_batch():
    # Terms of every magnitude from 1e-8 to 1e8, so that another order would round differently: the sums
    # must equal the order written out in Python floats bit for bit, a row alone as in a batch of rows.
    from minisbert.common.similarity import fixed_sum

    generator = np.random.default_rng(0)
    for width in [*range(0, 18), 383, 384]:
        terms = generator.normal(size=(3, width)) * 10.0 ** generator.integers(-8, 9, size=(3, width))
        sums = fixed_sum(torch.from_numpy(terms))
        assert sums.shape == (3,) and sums.dtype == torch.float64
        assert sums.tolist() == [fixed_order_sum(row.tolist()) for row in terms], width
        assert fixed_sum(torch.from_numpy(terms[1:2])).tolist() == sums[1:2].tolist()


def test_exact_scores_are_the_exact_sums_rounded_once_to_float32():
    """exact_scores, the search's definition of a score (minisbert/search/plain.py): the float64 sum of the
    exact products q_i c_i (for euclidean the root of the sum of (q_i - c_i)²), rounded once to float32."""
    from fractions import Fraction

    from minisbert.common.similarity import exact_scores

    generator = np.random.default_rng(1)
    for d in (1, 2, 7, 384):
        # Small integers: every product and sum is exact in float64, so the one rounding to float32 (of the
        # sum, or of its correctly rounded float64 root) fixes the answer bit for bit.
        q, c = (generator.integers(-3, 4, size=(5, d)).astype(np.float32) for _ in range(2))
        sums = [sum(int(x) * int(y) for x, y in zip(a, b)) for a, b in zip(q, c)]
        squares = [sum((int(x) - int(y)) ** 2 for x, y in zip(a, b)) for a, b in zip(q, c)]
        for score, expected in (("dot", sums), ("cosine", sums), ("euclidean", [math.sqrt(s) for s in squares])):
            scores = exact_scores(torch.from_numpy(q), torch.from_numpy(c), score)
            assert scores.dtype == torch.float32 and scores.tolist() == np.float32(expected).tolist(), (d, score)
        # Random rows of scales 1e-3 to 1e3: against the exact value (Fraction), rounded to float64. The
        # terms are exact in float64 (a product of two float32 numbers has 48 bits; q_i - c_i, of scales
        # within 2^20 of each other, at most 44), a square rounds once; a sum in ceil(log2 d) levels of
        # additions is off by at most that many units 2^-53 of the sum of the terms' magnitudes (Higham 4.2);
        # a root halves a relative error and rounds once; the reference rounds once (and its root once
        # more); the float32 rounding adds 2^-24 of the result.
        q = (generator.normal(size=(5, d)) * 10.0 ** generator.integers(-3, 4, size=(5, 1))).astype(np.float32)
        c = (generator.normal(size=(5, d)) * 10.0 ** generator.integers(-3, 4, size=(5, 1))).astype(np.float32)
        levels = math.ceil(math.log2(d)) if d > 1 else 0
        for score in ("dot", "euclidean"):
            scores = exact_scores(torch.from_numpy(q), torch.from_numpy(c), score).tolist()
            for row, (a, b) in enumerate(zip(q.astype(float), c.astype(float))):
                if score == "dot":
                    terms = [Fraction(x) * Fraction(y) for x, y in zip(a, b)]
                    exact, bound = float(sum(terms)), (levels + 1) * 2.0**-53 * float(sum(abs(t) for t in terms))
                else:
                    exact = math.sqrt(float(sum((Fraction(x) - Fraction(y)) ** 2 for x, y in zip(a, b))))
                    bound = ((levels + 1) / 2 + 1 + 1.5) * 2.0**-53 * exact  # squares and sum, root; the reference's
                assert abs(scores[row] - exact) <= 2.0**-24 * abs(exact) + bound, (d, score, row)
            alone = [exact_scores(torch.from_numpy(q[i : i + 1]), torch.from_numpy(c[i : i + 1]), score).item()
                     for i in range(5)]
            assert alone == scores  # a row's score depends on its row alone
