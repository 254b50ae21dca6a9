"""Tests of minisbert/search/bounds.py: each error bound the search uses holds, and is nearly reached.

For each bound, a seeded property test draws many cases (dimension, scale, kind of rows: random,
rows of mixed signs that cancel, rows of very different sizes, rows whose products underflow) and
checks that the true error never exceeds the bound. The true error is computed exactly: two float32
numbers multiply exactly in float64, and math.fsum rounds a sum once. A bound that held only because
it is far too wide would screen nothing out, so each bound also meets an adversarial row built so
that the arithmetic fixes how large its error must be (a lower bound L, computed from the
construction, not measured): the test asserts that the error reaches L and says what fraction of the
bound L is. The float32 sums are taken in the order torch's kernel chooses and in the orders numpy
makes explicit (one term at a time, pairwise): the bounds hold for any order.
"""

import math

import numpy as np
import pytest
import torch

from minisbert.search.fast import int8_blocks, int8_rows
from minisbert.search.fast.device import HalfRows
from minisbert.search.fast.screen import Chunk
from minisbert.search import prepare_corpus
from minisbert.common.similarity import unit_rows
from minisbert.search.inputs import check_inputs
from minisbert.search.bounds import (F32_UNIT, HALF_SUBNORMAL_ERROR, HALF_UNIT, INT8_STEP_ERROR, PRODUCT_UNITS, RAW_DIMS,
                                     RAW_NORM_SLACK, ROUGH, SLACK, SMALLEST_COSINE_NORM, UNIT_NORM, Bounds,
                                     half_screen_error, int8_rows_coefficients, linear_error, raw_reach,
                                     summation_error)

U = F32_UNIT
CASES = 150
DIMS = (1, 2, 3, 8, 24, 100, 384, 1000)
KINDS = ("random", "cancelling", "sizes", "underflowing")
SCORES = ("cosine", "dot", "euclidean")
TIE = 2.0**-12  # 1 + TIE² is a tie in float32 (TIE² = u), rounded to the even 1


def exact_dots(queries: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(Q, N) float64: each q·c of float32 rows (held as float64), summed exactly and rounded once."""
    return np.array([[math.fsum(q * c) for c in rows] for q in queries])


def exact_norms(rows: np.ndarray) -> np.ndarray:
    return np.sqrt([math.fsum(row * row) for row in rows])


def float32_unit_rows(rows: np.ndarray) -> np.ndarray:
    """Each row divided by its norm in float64, each entry rounded to float32 (zero rows stay zero)."""
    return (rows / np.maximum(exact_norms(rows), 1e-300)[:, None]).astype(np.float32).astype(np.float64)


def float32_sums(queries: np.ndarray, rows: np.ndarray) -> dict:
    """{order: (Q, N) float32 q·c}: torch's kernel (what the loop runs), one term at a time, pairwise."""
    q32, c32 = queries.astype(np.float32), rows.astype(np.float32)
    products = q32[:, None, :] * c32[None, :, :]  # (Q, N, d), each rounded to float32
    return {"kernel": (torch.from_numpy(q32) @ torch.from_numpy(c32).T).numpy(),
            "one at a time": np.add.accumulate(products, axis=2, dtype=np.float32)[..., -1],
            "pairwise": products.sum(axis=2, dtype=np.float32)}


def draw_rows(kind: str, rng, count: int, dim: int) -> np.ndarray:
    """(count, dim) float32 numbers (held as float64) of a kind."""
    values = rng.standard_normal((count, dim))
    if kind == "cancelling":  # large entries whose products cancel to a small score
        values[:, 1::2] = values[:, : dim // 2 * 2 : 2] * (1 + 1e-6 * rng.standard_normal((count, dim // 2)))
        values[:, 1::2] *= -1 if count % 2 else 1
        values *= 1e3
    if kind == "sizes":
        values *= 10.0 ** rng.integers(-15, 15, (count, 1))
    if kind == "underflowing":  # products below 2^-126, which a kernel may flush to zero
        values *= 2.0**-70
    return values.astype(np.float32).astype(np.float64)


def tie_row(dim: int):
    """(1, d) float32 (1, t, ..., t), t² = u, and its exact squared norm 1 + (d - 1) u."""
    row = np.full((1, dim), TIE)
    row[0, 0] = 1.0
    return row, 1 + (dim - 1) * U


# ---- 1. The float32 score: `Bounds` --------------------------------------------------------------


def assert_score_bound_holds(case: str, score: str, queries, rows, multiplied_queries, multiplied_rows,
                             unit: float = 0.0) -> None:
    """Every float32 score of `multiplied_queries` x `multiplied_rows` (the inputs as the product takes
    them), in every order of the sum, lies within `Bounds`' E (and E_p for `unit`) of the exact score of
    `queries` x `rows`: cosine and dot against the exact score rounded to float32, euclidean's key
    2 q·c - |c|² (2 q·c in float32, less |c|² rounded to float32) against the exact key."""
    query_norms, row_norms = exact_norms(queries), exact_norms(rows)
    bound = Bounds(score, torch.from_numpy(query_norms), float(row_norms.max()), queries.shape[1],
                   unit=unit).error.numpy()[:, None]
    exact = exact_dots(queries, rows)  # (Q, N)
    for order, sums in float32_sums(multiplied_queries, multiplied_rows).items():
        if score == "euclidean":
            keys = 2 * sums - (row_norms**2).astype(np.float32)[None, :]
            error = np.abs(keys.astype(np.float64) - (2 * exact - row_norms[None, :] ** 2))
        else:
            error = np.abs(sums.astype(np.float64) - exact.astype(np.float32))
        assert (error <= bound).all(), f"{case}, {order}: off by {float((error / bound).max()):.3g} bounds"


def test_the_float32_unit_is_what_rounding_to_float32_can_move_a_value_by():
    """u = 2^-24 (section 1): rounding to float32 moves a value by at most u of itself, and by all but
    a hair of it for a value just short of halfway between 1 and the next float32. Every bound is a
    multiple of u, so a u too small is a bound some inputs break, and one too large proves less."""
    just_short = 1 + F32_UNIT * (1 - 2.0**-20)  # rounds down to 1
    moved = abs(just_short - float(torch.tensor(just_short, dtype=torch.float64).float())) / just_short
    assert 0.999 * F32_UNIT < moved <= F32_UNIT
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(100_000, dtype=torch.float64, generator=generator) * 1e3
    assert ((values - values.float().double()).abs() <= F32_UNIT * values.abs()).all()



def test_the_float16_units_are_what_rounding_to_float16_can_move_a_value_by():
    """u_h = 2^-11 and ε_h = 2^-25 (section 4): rounding to float16 moves a normal number by at most u_h
    of itself and a number below 2^-14 by at most ε_h, each reached within 1% among 200,000 random
    values (about ten of the normal ones, and 2,000 of the small ones, are expected that close: values
    near halfway between two float16 numbers, the normal ones just above a power of two). A smaller
    constant is a screen bound some rows break."""
    # float32 values, as the screen rounds them (a float64 value would be rounded twice, via float32).
    generator = torch.Generator().manual_seed(1)
    normal = torch.rand(200_000, generator=generator) * 2.0 + 2.0**-14  # [2^-14, 2 + 2^-14)
    moved = ((normal.double() - normal.half().double()).abs() / normal.double()).max()
    assert 0.99 * HALF_UNIT < moved <= HALF_UNIT
    small = torch.rand(200_000, generator=generator) * 2.0**-14  # float16's subnormals
    moved = (small.double() - small.half().double()).abs().max()
    assert 0.99 * HALF_SUBNORMAL_ERROR < moved <= HALF_SUBNORMAL_ERROR


def test_a_unit_row_has_a_norm_of_at_most_the_unit_norm_bound():
    """UNIT_NORM = 1 + 2u (section 1), what a search takes for a cosine query's norm: the unit rows
    `unit_rows` makes of random rows of every dimension and of scales from 1e-30 to 1e30 have norms
    (summed exactly) at most UNIT_NORM, and some above 1 (by up to 0.79u at d = 2 and 3 with this
    seed, each entry rounded once more to float32): a bound of 1 would let a row's bound fall short."""
    generator = torch.Generator().manual_seed(2)
    largest = 0.0
    for dim in DIMS:
        rows = torch.randn(5_000, dim, generator=generator) * torch.logspace(-30, 30, 5_000)[:, None]
        norms = exact_norms(unit_rows(rows).double().numpy())
        assert norms.max() <= UNIT_NORM, (dim, (norms.max() - 1) / U)
        largest = max(largest, norms.max())
    assert largest > 1 + U / 2
    # A cosine search takes the bound as its queries' norms, in float64 as the bounds compute (0 for a zero query).
    queries = torch.cat([torch.randn(2, 8, generator=generator), torch.zeros(1, 8)])
    taken = check_inputs(queries, torch.randn(5, 8, generator=generator), 1, "cosine", 1024, None, None).query_norms
    assert taken.dtype == torch.float64 and taken.tolist() == [UNIT_NORM, UNIT_NORM, 0.0]


@pytest.mark.parametrize("flushed", [False, True])
def test_the_norms_of_rows_as_given_are_bounded_by_their_float32_norms_even_with_squares_flushed(flushed):
    """`raw_reach` (section 1): a row's norm is at most its float32 norm m (1 + 2^-10) + √d 2^-63,
    with squares below 2^-126 kept as subnormals or flushed to zero (torch.set_flush_denormal(True)),
    for rows of every dimension and of scales from 2^-80 to 2^40. Rows of entries just below 2^-63,
    whose squares all fall below 2^-126, reach the bound within 2^-19 where they are flushed (m = 0:
    at some dimensions, as torch's kernel for the shape sums).
    And the arithmetic the bound's constants rest on: γ_d / 2 + u, the float32 norm's error, is at most
    half of RAW_NORM_SLACK's 2^-10 for d < RAW_DIMS, and at SMALLEST_COSINE_NORM the flushed squares
    move a cosine row's norm by less than E's 1% of its 4u."""
    assert summation_error(RAW_DIMS) / 2 + U <= (RAW_NORM_SLACK - 1) / 2
    assert RAW_DIMS * 2.0**-127 / SMALLEST_COSINE_NORM**2 < (SLACK - 1) * ROUGH["roundings"] * U
    if flushed and not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormal numbers to zero")
    try:
        generator, reached = torch.Generator().manual_seed(3), []
        for dim in DIMS:
            scales = 2.0 ** torch.linspace(-80, 40, 2_000)[:, None]
            rows = torch.randn(2_000, dim, generator=generator) * scales * (torch.rand(2_000, dim, generator=generator) < 0.5)
            rows = torch.cat([rows.float(), torch.full((1, dim), 2.0**-63 * (1 - 2.0**-20))])
            measured = torch.linalg.vector_norm(rows, dim=1)  # float32, as the fast ways measure them
            exact = torch.from_numpy(exact_norms(rows.double().numpy()))
            bound = raw_reach(measured.double(), dim)
            assert (exact <= bound).all(), (dim, float((exact / bound).max()))
            if float(measured[-1]) == 0:  # every square flushed (the kernel may sum some shapes otherwise)
                assert float(exact[-1] / bound[-1]) > 1 - 2.0**-19, dim
                reached.append(dim)
    finally:
        torch.set_flush_denormal(False)
    assert flushed or not reached, reached
    if flushed and not reached:
        pytest.skip("the bound held, but torch's norm kernel here flushed no row's squares: its flush term went untried")


def test_the_int8_coefficients_cover_each_term_of_their_bound():
    """Section 2: s_fl <= s_q s (q'·c') + α |e_c| + β |ĉ| needs α >= |q| + 3u |q̂| + γ_d |q| (the
    error of q against e_c, the scalings, the float32 sum) and β >= |e_q| + 3u |q̂| + γ_d |q|, with
    |q̂| <= |q| + |e_q|. Checked for every dimension and size, with e_q = 0 too (a query its int8 copy
    holds exactly), where nothing but σ and γ_d is left in β."""
    for dim in (1, 16, 384, 1024):
        gamma = summation_error(dim)
        for size in (1e-3, 1.0, 1e3):
            for error in (0.0, 1e-6 * size, 0.01 * size):
                norms, errors = torch.tensor([size], dtype=torch.float64), torch.tensor([error], dtype=torch.float64)
                alpha, beta = int8_rows_coefficients(dim, norms, errors)[:, 0].tolist()
                scalings = 3 * F32_UNIT * (size + error)
                assert alpha >= size + scalings + gamma * size, (dim, size, error)
                assert beta >= error + scalings + gamma * size, (dim, size, error)


def test_the_float32_score_bound_holds_in_any_order_of_summation():
    """|s_fl - s_x| <= E for every score, every kind of row and every order of the float32 sum:
    cosine and dot against the exact score rounded to float32, euclidean's key 2 q·c - |c|² against
    the exact key (search/bounds.py, section 1)."""
    rng = np.random.default_rng(55)
    for case in range(CASES):
        dim, kind, score = int(rng.choice(DIMS)), str(rng.choice(KINDS)), str(rng.choice(SCORES))
        queries, rows = draw_rows(kind, rng, 3, dim), draw_rows(kind, rng, 20, dim)
        if score == "cosine":  # rows as scored: float32 unit rows
            queries, rows = float32_unit_rows(queries), float32_unit_rows(rows)
        assert_score_bound_holds(f"case {case}: {score}, {kind}, d = {dim}", score, queries, rows, queries, rows)


@pytest.mark.parametrize("dim", [8, 24, 384, 1000])
def test_the_float32_score_bound_is_nearly_reached(dim):
    """q = c = (1, t, ..., t) with t² = u: the exact q·c is 1 + (d - 1) u, and a sum one term at a
    time rounds every 1 + u (a tie) to 1, losing u at each of d - 1 additions; the exact score,
    rounded to float32 (spacing 2u above 1), moves at most u back. So the dot score's error is at
    least L = (d - 2) u, against E = 1.01 (γ_d + 2u)(1 + (d - 1) u): (d - 2) / (1.01 (d + 2)),
    0.98 of the bound at d = 384. Euclidean's key 2 q·c - |c|² doubles the loss: L = 2 (d - 1) u
    less the rounding of |c|² (u |c|²; the subtraction is exact, Sterbenz), against an E four times
    as wide ((|q| + |c|)² = 4 |c|²): about half of it."""
    row, squared_norm = tie_row(dim)
    sums = float32_sums(row, row)["one at a time"]
    assert sums[0, 0] == 1.0  # every addition rounded the tie to 1
    dot_error = abs(1.0 - float(np.float32(squared_norm)))
    dot_bound = float(Bounds("dot", torch.tensor([math.sqrt(squared_norm)]), math.sqrt(squared_norm), dim).error)
    key = 2 * sums[0, 0] - np.float32(squared_norm)
    key_error = abs(float(key) - squared_norm)  # the exact key 2 |c|² - |c|²
    key_bound = float(Bounds("euclidean", torch.tensor([math.sqrt(squared_norm)]), math.sqrt(squared_norm), dim).error)
    for error, bound, lowest in ((dot_error, dot_bound, (dim - 2) * U),
                                 (key_error, key_bound, 2 * (dim - 1) * U - U * squared_norm)):
        assert lowest <= error <= bound
    assert (dim - 2) * U / dot_bound >= (dim - 2) / (1.01 * (dim + 2) * (1 + 2 * dim * U)) > 0.59  # d = 8
    assert (2 * (dim - 1) - 1.01) * U / key_bound > 0.29  # d = 8; 0.49 at d = 384


def rounded_inputs(values: np.ndarray, bits: int) -> np.ndarray:
    """float32 `values` rounded to `bits` significant bits (8: bfloat16, 11: TF32), to nearest, ties
    to even, then flushed to zero below float32's normal range: what a reduced-precision product
    does to its inputs at worst (held as float64)."""
    integers = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    dropped = 24 - bits
    odd = (integers >> dropped) & 1
    integers = ((integers + (1 << (dropped - 1)) - 1 + odd) >> dropped) << dropped
    rounded = integers.astype(np.uint32).view(np.float32).astype(np.float64)
    return np.where(np.abs(rounded) < 2.0**-126, 0.0, rounded)


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_the_bound_of_products_of_rounded_inputs_holds_and_is_nearly_reached(precision):
    """torch.set_float32_matmul_precision("high") or ("medium") lets a product round its inputs to
    TF32 or bfloat16 first (search/bounds.py, E_p). Every score, kind of row and order of the float32
    sum of the rounded inputs' products lies within E + E_p of the exact score. And q = c = (x, ..., x),
    x just below the midpoint 1 + u_p above 1, rounds every entry down to 1: the sum of d ones is exact,
    the exact score d x² is off by d (x² - 1), about 2 u_p d: nearly all of E_p."""
    bits = {"tf32": 11, "bf16": 8}[precision]
    unit = PRODUCT_UNITS[precision]
    assert unit == 2.0 ** -bits
    rng = np.random.default_rng(56)
    for case in range(CASES):
        dim, kind, score = int(rng.choice(DIMS)), str(rng.choice(KINDS)), str(rng.choice(SCORES))
        queries, rows = draw_rows(kind, rng, 3, dim), draw_rows(kind, rng, 20, dim)
        if score == "cosine":
            queries, rows = float32_unit_rows(queries), float32_unit_rows(rows)
        assert_score_bound_holds(f"case {case}: {score}, {kind}, d = {dim}", score, queries, rows,
                                 rounded_inputs(queries, bits), rounded_inputs(rows, bits), unit)
    dim = 384
    x = 1 + unit - 2.0**-20  # below the midpoint between 1 and the next number of `bits` bits
    row = np.full((1, dim), np.float32(x), dtype=np.float64)
    assert (rounded_inputs(row, bits) == 1.0).all()
    sums = float32_sums(rounded_inputs(row, bits), rounded_inputs(row, bits))["one at a time"]
    exact = math.fsum(row[0] * row[0])
    error = abs(float(sums[0, 0]) - float(np.float32(exact)))
    norm = math.sqrt(exact)
    bound = float(Bounds("dot", torch.tensor([norm]), norm, dim, unit=unit).error)
    assert sums[0, 0] == dim and error <= bound
    assert error / bound > 0.9, error / bound  # about 0.98 for bfloat16 and TF32 at d = 384


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_the_flush_term_of_products_of_rounded_inputs_is_nearly_reached(precision):
    """E_p's term 2 (1 + u_p) η √d (|q| + R) (search/bounds.py): an input below 2^-126 that the product
    flushes to zero loses its whole product with the other input. q = (2^20, ..., 2^20) against
    c = (x, ..., x), x = 2^-126 (1 - 2^-7) (held exactly in TF32 and bfloat16, then flushed): every
    product is lost, d 2^20 x in all, half of the term (its 2 is for euclidean's 2 q·c, so a dot
    score reaches half): E's own d 2^-124 for products flushed in float32 is 2^-19 of it. And the
    same with q and c swapped, where R is the large one."""
    unit = PRODUCT_UNITS[precision]
    dim, large, small = 384, 2.0**20, 2.0**-126 * (1 - 2.0**-7)
    for query_entry, row_entry in ((large, small), (small, large)):
        query, row = np.full((1, dim), query_entry), np.full((1, dim), row_entry)
        bits = {"tf32": 11, "bf16": 8}[precision]
        assert (rounded_inputs(query, bits) * rounded_inputs(row, bits) == 0).all()  # every product flushed
        error = abs(float(np.float32(exact_dots(query, row)[0, 0])))  # the float32 sum of the flushed products is 0
        bound = float(Bounds("dot", torch.from_numpy(exact_norms(query)), float(exact_norms(row)[0]), dim,
                             unit=unit).error[0])
        # (1 - 2^-7) / (2.02 (1 + u_p) (1 + γ_d)), less E_p's 2 u_p |q| R beside it: 0.487 (bfloat16), 0.491 (TF32)
        assert 0.48 < error / bound <= 1, (query_entry, error / bound)


def test_the_linear_form_a_device_search_takes_is_section_1s_bound():
    """`linear_error`'s slope |q| + offset (what a search on a GPU compares with, computed without the
    host) is `Bounds`' E for cosine and dot: for every dimension, query norm and row norm from 2^-125 to
    2^10, both kinds of float32 score (`ROUGH` too) and every product setting, equal but for float64
    rounding and E_p's d η² counted twice (2^-252 d, far below it)."""
    rng = np.random.default_rng(58)
    for _ in range(CASES):
        dim, unit = int(rng.choice(DIMS)), float(rng.choice([0.0, *PRODUCT_UNITS.values()]))
        query_norm, largest = (float(2.0 ** rng.uniform(-125, 10)) for _ in range(2))  # E_p's flush terms show below 2^-100
        counts = ROUGH if rng.random() < 0.5 else {"sums": 1, "roundings": 2}
        slope, offset = linear_error(dim, largest, **counts, unit=unit)
        expected = float(Bounds("dot", torch.tensor([query_norm], dtype=torch.float64), largest, dim, **counts,
                                unit=unit).error[0])
        assert slope * query_norm + offset == pytest.approx(expected, rel=1e-12, abs=0), (dim, unit, query_norm, largest)


def test_the_floors_give_up_no_more_than_the_bound_and_a_rounding():
    """`lower` and `floor` turn E into the score a row must reach: for cosine and dot kth - E (never
    above it, rounded down to float32); for euclidean, from a distance D = -kth, the key |q|² - D² - E,
    lowered only by the roundings the distance may carry (D (1 + 2.01u) + 2^-149, and |q|² to 1e-12).
    A floor much lower than this would still be sound but would screen nothing out."""
    rng = np.random.default_rng(57)
    for _ in range(CASES):
        dim, norm = int(rng.choice(DIMS)), float(10.0 ** rng.uniform(-3, 3))
        query_norms, reach = torch.tensor([norm], dtype=torch.float64), float(10.0 ** rng.uniform(-3, 3))
        kth = torch.tensor([float(np.float32(rng.uniform(-1, 1) * norm * reach))], dtype=torch.float64)
        for score in ("dot", "euclidean"):
            bounds = Bounds(score, query_norms, reach, dim)
            error = float(bounds.error)
            if score == "dot":
                floor, ideal = float(bounds.floor(kth)), float(kth) - error
                assert float(bounds.lower(kth)) == ideal
            else:
                distance = float(np.float32(abs(float(kth)) + norm))  # a float32 distance, its negative the kth
                floor = float(bounds.floor(torch.tensor([-distance], dtype=torch.float64)))
                ideal = norm**2 - distance**2 - error
                # `lower` alone, from a key x: the negated distance -sqrt(|q|² - x + E), lowered only
                # by |q|²'s 1e-12 (at most 1e-6 |q| under the root) and the root's 2.01u and 2^-149.
                key = float(np.float32(norm**2 - distance**2))  # a float32 key, as the searches hold them
                low = float(bounds.lower(torch.tensor([key], dtype=torch.float64)))
                ideal_low = -math.sqrt(max(norm**2 - key + error, 0.0))
                assert ideal_low - (2.02 * U * abs(ideal_low) + 1e-6 * norm + 2.0**-148) <= low <= ideal_low, (
                    dim, norm, reach, key)
            spacing = float(np.spacing(np.float32(abs(ideal))))
            # dot: only the rounding down to float32; euclidean: that, the distance's 2.01u + 2^-149
            # (2 (2.01u D² + 2^-149 D), squared) and |q|²'s 1e-12.
            slack = spacing + (0 if score == "dot" else 4.03 * U * distance**2 + 2.0**-147 * distance + 1e-12 * norm**2)
            assert ideal - slack <= floor <= ideal, (score, dim, norm, reach, float(kth))


# ---- rows measured in float32 by a fast way: `ROUGH` -------------------------------------------


def measured_scores(queries: np.ndarray, rows: np.ndarray, score: str) -> np.ndarray:
    """(Q, N) float64 values of the float32 scores search/fast/spans_blocks.py computes over rows as given: the
    product, and for cosine divided by the row's float32 norm, for euclidean the key with it squared."""
    q32, c32 = torch.from_numpy(queries.astype(np.float32)), torch.from_numpy(rows.astype(np.float32))
    block, norms = q32 @ c32.T, torch.linalg.vector_norm(c32, dim=1)
    if score == "cosine":
        block = block / norms
    elif score == "euclidean":
        block = block.mul(2).sub(norms * norms)
    return block.double().numpy()


def test_the_bound_of_scores_over_rows_measured_in_float32_holds():
    """A fast way's score over rows as given (cosine: q̂·c / |c|_fl32) lies within `ROUGH` of the
    exact score of the float32 unit rows (each entry of c / |c| rounded to float32), for unit queries."""
    rng = np.random.default_rng(56)
    for case in range(CASES):
        dim, kind, score = int(rng.choice(DIMS)), str(rng.choice(KINDS[:3])), str(rng.choice(SCORES))
        queries, rows = draw_rows(kind, rng, 3, dim), draw_rows(kind, rng, 20, dim)
        if score == "cosine":
            queries = float32_unit_rows(queries)
            exact = exact_dots(queries, float32_unit_rows(rows)).astype(np.float32)  # as the contract scores
            reach = 1 + 2.0**-10  # search/fast/spans_blocks.py's `_raw_reach` for cosine
        else:
            exact = exact_dots(queries, rows)
            reach = float(exact_norms(rows).max())
            if score == "euclidean":
                exact = 2 * exact - exact_norms(rows)[None, :] ** 2
        bound = Bounds(score, torch.from_numpy(exact_norms(queries)), reach, dim, **ROUGH).error.numpy()[:, None]
        error = np.abs(measured_scores(queries, rows, score) - exact)
        assert (error <= bound).all(), (f"case {case}: {score}, {kind}, d = {dim}: off by "
                                        f"{float((error / bound).max()):.3g} bounds")


def test_the_bound_of_scores_over_rows_measured_in_float32_is_half_reached():
    """`ROUGH` covers two sums (the product's and, for cosine, the norm's). The row of the test above
    (1, t, ..., t) makes the product's sum lose (d - 2) u or more one term at a time; the norm's sum
    loses as much, but its loss moves a cosine the other way, so one sum's loss is what a construction
    reaches: (d - 2) / (1.01 (2d + 4)), about half of the bound."""
    dim = 384
    row, squared_norm = tie_row(dim)
    error = abs(float(float32_sums(row, row)["one at a time"][0, 0]) - float(np.float32(squared_norm)))
    bound = float(Bounds("dot", torch.tensor([math.sqrt(squared_norm)]), math.sqrt(squared_norm), dim, **ROUGH).error)
    assert (dim - 2) * U <= error <= bound
    assert error / bound >= (dim - 2) / (1.01 * (2 * dim + 4) * (1 + 2 * dim * U)) > 0.48


# ---- 2. The int8 copy of a prepared corpus (search/fast/int8_rows.py) -----------------------------------

needs_int8_blocks = pytest.mark.skipif(not int8_blocks.int8_blocks_exact(24),
                                       reason="torch's int8 product is not exact for rows of 127 on this CPU")


@pytest.mark.parametrize("dim", [24, 384])
def test_the_int8_copy_bound_holds(dim):
    # Every row's bound must lie above its float32 score as a search computes it (torch.mv, the
    # rescoring) and above its exact score; rows the screen cannot bound get +inf. The rows mix
    # ordinary ones with one large entry among small ones, rows of entries near 2^-30 and 2^50
    # (just inside and outside the range screened), a zero row, and rows int8 holds exactly.
    generator = torch.Generator().manual_seed(dim)
    rows = torch.randn(4000, dim, generator=generator)
    rows[:500] /= rows[:500].norm(dim=1, keepdim=True)
    rows[500:600, 0] = 1000.0
    rows[600:700] *= 2.0**-31
    rows[700:800] *= 2.0**-28
    rows[800:900] *= 2.0**48
    rows[900:1000] *= 2.0**52
    rows[1000] = 0
    rows[1001:1100] = torch.randint(-63, 64, (99, dim), generator=generator) / 8
    copy = int8_rows.int8_rows(rows)
    largest = rows.abs().amax(dim=1)
    outside = (largest < int8_rows.SMALLEST_ENTRY) | (largest > int8_rows.LARGEST_ENTRY)
    error_norms = copy.terms[:, 0]
    assert torch.isposinf(error_norms[outside]).all() and torch.isfinite(error_norms[~outside]).all()
    # Each term the copy keeps bounds its quantity (section 2), exactly computed: for rows it holds
    # exactly |e_c| is 0, and the bound is what covers ĉ's rounding to float32.
    c_hat = copy.values.double() * copy.scales.double()[:, None]  # s c', exact in float64
    exact_terms = torch.stack([(rows.double() - c_hat).norm(dim=1), c_hat.norm(dim=1)], dim=1)[~outside]
    assert (copy.terms[~outside].double() >= exact_terms).all()
    queries = torch.cat([torch.randn(1, dim, generator=generator), rows[1001:1002], rows[:1] * 2.0**-20])
    for screened in (queries[:1], queries[1:2], queries[2:], queries):  # alone, and three in one product
        screen = int8_rows.Int8RowsScreen(screened, rows.shape[0])
        assert screen.usable()
        for column, query in enumerate(screened):
            bounds = screen.upper_bounds(copy)[:, column].double()
            float32_scores = torch.mv(rows, query).double()
            exact = rows.double() @ query.double()
            finite = torch.isfinite(float32_scores)
            assert (~(bounds[finite] < float32_scores[finite])).all()  # NaN bounds keep a row in
            assert (~(bounds < exact)).all()


def test_the_int8_copy_bound_is_nearly_reached():
    """c = q = s (63, a, ..., a), a = 40.49: every entry but the first is 0.49 of a step above the
    integer the copy keeps, the same way, so q·e_c and e_q·ĉ are nearly |q| |e_c| and |e_q| |ĉ|
    (Cauchy-Schwarz nearly an equality: e_c lies along q). The error q·c - q̂·ĉ = q·e_c + e_q·ĉ is
    computed from the construction exactly; the float32 score lies within γ_d |q| |c| of q·c, so the
    screen's error is at least L = q·e_c + e_q·ĉ - γ_d |q| |c|, 0.98 of the bound at d = 384 (the rest:
    the bound's 1%, its γ_d and scaling terms, and the angle, cos = 0.997)."""
    dim, step = 384, 1 / 63
    row = torch.full((1, dim), 40.49 * step)
    row[0, 0] = 63 * step
    copy = int8_rows.int8_rows(row)
    screen = int8_rows.Int8RowsScreen(row, 1)
    upper = float(screen.upper_bounds(copy)[0, 0])  # s_q s (q'·c') + α |e_c| + β |ĉ|
    integers, query_integers = copy.values[0].double(), screen.query_values[:, 0].double()  # c', q'
    scaled = float(copy.scales[0]) * float(screen.query_scales[0]) * float(integers @ query_integers)  # s_q s (q'·c')
    c = row[0].double().numpy()
    c_hat = integers.numpy() * float(copy.scales[0])  # exact in float64
    q_hat = query_integers.numpy() * float(screen.query_scales[0])
    lowest = (math.fsum(c * (c - c_hat)) + math.fsum((c - q_hat) * c_hat)
              - summation_error(dim) * math.fsum(c * c))
    float32_score = float(torch.mv(row, row[0]))
    assert lowest <= float32_score - scaled <= upper - scaled
    assert lowest / (upper - scaled) > 0.95


def test_the_int8_copy_bound_is_close_enough_to_screen():
    # The bound is what makes the screen pay: for random unit rows and d = 384 it is about 3% of
    # |q| |c| (search/fast/int8_rows.py). If it were 10% or more, a one-query search of random data would
    # score a large part of the corpus on its own.
    generator = torch.Generator().manual_seed(1)
    rows = torch.randn(5000, 384, generator=generator)
    rows /= rows.norm(dim=1, keepdim=True)
    query = torch.randn(1, 384, generator=generator)
    query /= query.norm()
    copy = int8_rows.int8_rows(rows)
    screen = int8_rows.Int8RowsScreen(query, rows.shape[0])
    margin = screen.upper_bounds(copy)[:, 0].double() - rows.double() @ query[0].double()
    assert float(margin.max()) < 0.1


# ---- 3. The int8 blocks of many queries (search/fast/int8_blocks.py) ------------------------------------


def loaded_blocks(queries, rows, divided: bool):
    """Int8Blocks for `queries` with `rows` loaded as one chunk: as given (dot; or unit rows),
    or undivided with the divisors that make unit rows (`divided`); and the rows as scored."""
    blocks = int8_blocks.Int8Blocks(queries, queries.shape[0], -(-rows.shape[0] // 64) * 64)
    norms = torch.linalg.vector_norm(rows, dim=1)
    if divided:
        divisors = norms.clamp_min(torch.finfo(torch.float32).tiny)[:, None]
        blocks.load_chunk(Chunk(rows, divisors, None, 1 + 2.0**-10, None))
        return blocks, rows / divisors
    blocks.load_chunk(Chunk(rows, None, None, float(norms.amax()), None))
    return blocks, rows


@needs_int8_blocks
def test_the_int8_step_error_is_the_most_a_block_entry_moves():
    """INT8_STEP_ERROR = 1/2 + 2^-14 (section 3): c / s is rounded to float32 before it is rounded to an
    integer, so an entry lies within half a step and a float32 rounding of c' (127 u) of its int8 value;
    entries built halfway between two steps come within 2^-20 of half a step."""
    step = 1 / 127
    halves = (torch.arange(-126, 126, dtype=torch.float64) + 0.5) * step  # every halfway point
    rows = halves.repeat(1, 4).reshape(-1, 24).float()
    rows[:, 0] = 127 * step  # the piece's largest entry: its step is `step`
    blocks, _ = loaded_blocks(torch.ones(1, 24), rows, False)
    scale = float(blocks.scales[0])
    moved = (rows.double() / scale - blocks.chunk_buffer[: rows.shape[0]].double()).abs().max()
    assert 0.5 - 2.0**-20 < moved <= INT8_STEP_ERROR


@needs_int8_blocks
@pytest.mark.parametrize("divided", [False, True])
def test_the_int8_block_bound_holds_and_is_nearly_reached(divided):
    # For every entry, the float32 score the search rescores with (vecdot of the query and the row
    # as scored) must lie within B of s_q s (q'·c'). The pieces (1,024 rows each) mix ordinary rows,
    # a piece of zero rows, rows of entries near 2^-34 (a piece not screened, unless made unit rows)
    # and 2^45, and rows built to round badly: every entry just under half a step above a multiple
    # of the piece's step (made unit rows, they keep that shape), in the direction of positive
    # queries, so that the corpus's rounding errors add up and the error reaches more than half the
    # bound (measured: 0.80 of it as given, 0.82 made unit rows; a bound half as wide fails there).
    generator = torch.Generator().manual_seed(5)
    dim = 24
    rows = torch.randn(5 * 1024, dim, generator=generator)
    rows[1024:2048] = 0
    rows[2048:3072] *= 2.0**-34
    rows[3072:3584] *= 2.0**45
    step = 1 / 127
    rows[4096:] = (torch.randint(0, 120, (1024, dim), generator=generator) + 0.49) * step
    rows[4096:, 0] = 127 * step  # the piece's largest entry: its step is `step`
    if divided:  # undivided rows, made unit rows by the search: the last piece with its own step
        rows[4096:] *= 3.0
    queries = torch.rand(40, dim, generator=generator) + 0.5  # positive entries
    queries[20:] = torch.randn(20, dim, generator=generator)
    for chunk in (rows, rows[4096:]):  # the whole, and the rows built to round badly on their own
        blocks, scored = loaded_blocks(queries, chunk, divided)
        scales, bounds = blocks.bounds(slice(0, 40))  # (40, pieces)
        products = blocks.query_values.double() @ blocks.chunk_buffer[: chunk.shape[0]].double().T  # exact
        pieces = torch.arange(chunk.shape[0]) // 1024
        scales, bounds = scales[:, pieces], bounds[:, pieces]  # (40, N)
        scores = torch.linalg.vecdot(queries[:, None, :], scored[None, :, :]).double()  # (40, N), float32 sums
        error = (scores - scales * products).abs()
        screened = scales > 0
        assert (error[screened] <= bounds[screened]).all()
    assert float((error / bounds)[:20].max()) > 0.5  # (the largest row norm of the whole is 2^45 times more)
    screened = (blocks.query_scales[:, None] * loaded_blocks(queries, rows, divided)[0].scales > 0)
    assert screened[:, [0, 3, 4]].all() and not screened[:, 1].any()
    assert screened[:, 2].all() if divided else not screened[:, 2].any()


# ---- 4. The float16 copy of a prepared cosine corpus (search/fast/device.py) -----------------------------


def unit_rows_of(values: np.ndarray) -> np.ndarray:
    """(n, d) float32 unit rows (held as float64) as a prepared cosine corpus keeps them."""
    return prepare_corpus(torch.from_numpy(values).float(), "cosine", screen=False).rows.double().numpy()


def float16_sums(queries: np.ndarray, rows: np.ndarray) -> dict:
    """{order: (Q, N) float32 s16}: the screen's own product (search/fast/device.py's `HalfRows`, on a CPU the
    float16 values widened and multiplied in float32), and numpy's sums of the float16 values in
    float32, one term at a time and pairwise (each product exact in float32, section 4, step 2)."""
    sums = float32_sums(queries.astype(np.float16).astype(np.float64), rows.astype(np.float16).astype(np.float64))
    copy = HalfRows(torch.from_numpy(rows).float())
    screen = copy.product(copy.rounded(torch.from_numpy(queries).float()), 0, len(rows))
    return {**sums, "screen": screen.numpy()}


def spread_rows(rng, count: int, dim: int) -> np.ndarray:
    """Rows whose entries span eight decades: their unit rows hold many entries below 2^-14, which
    round to float16's subnormals (the ε_h terms)."""
    return rng.standard_normal((count, dim)) * 10.0 ** rng.integers(-8, 1, (count, dim))


def test_the_float16_screen_bound_holds_in_any_order_of_summation():
    rng = np.random.default_rng(4)
    for case in range(CASES // 3):
        dim, kind = int(rng.choice(DIMS)), str(rng.choice([*KINDS, "spread"]))
        values = spread_rows(rng, 24, dim) if kind == "spread" else draw_rows(kind, rng, 24, dim)
        rows = unit_rows_of(values)
        queries = np.concatenate([rows[:4], unit_rows_of(draw_rows("random", rng, 4, dim))])  # (8, d)
        slope, offset = half_screen_error(dim, float(exact_norms(rows).max()))
        bound = slope * exact_norms(queries)[:, None] + offset  # (Q, 1)
        exact = exact_dots(queries, rows)  # (Q, N), q·c before its rounding to float32: ρ is in E
        for order, sums in float16_sums(queries, rows).items():
            error = np.abs(sums.astype(np.float64) - exact)
            assert (error <= bound).all(), (f"case {case}: {kind}, d = {dim}, {order}: off by "
                                            f"{float((error / bound).max()):.3g} bounds")


def adversarial_unit_row(dim: int, rng) -> np.ndarray:
    """A float32 unit row (d = 4^m) whose entries but the last are ±x, x = 2^e (1 + 2^-11 - 2^-20),
    2^e = 1 / √d: just below the float16 rounding midpoint above 2^e, so each rounds down to 2^e, by
    almost u_h of itself; the last entry makes the row a unit row."""
    x = (1 + 2.0**-11 - 2.0**-20) / math.sqrt(dim)
    row = np.full(dim, x)
    row[-1] = math.sqrt(1 - (dim - 1) * x * x)
    return (row * rng.choice([-1.0, 1.0], dim)).astype(np.float32).astype(np.float64)


@pytest.mark.parametrize("dim", [64, 256])
def test_the_float16_screen_bound_is_nearly_reached(dim):
    """The adversarial row scored with itself. The arithmetic fixes the screen's error from below:
    the float16 products fall short of the exact ones by the rounding loss D = Σ (c_i² - fl16(c_i)²)
    (numpy's float16 rounding, summed exactly), and the float32 sum of the products (at most 1)
    moves that by at most γ_d = d u / (1 - d u) (section 1). So the error is at least L = D - γ_d: 0.95
    of E at d = 64, 0.91 at d = 256 (where E's accumulation term, γ at 4u for tensor cores, is 6% of it)."""
    row = adversarial_unit_row(dim, np.random.default_rng(dim))
    assert np.array_equal(unit_rows_of(row[None, :])[0], row)  # a unit row already: the corpus keeps it
    halves = row.astype(np.float16).astype(np.float64)
    assert (np.abs(halves[:-1]) == 1 / math.sqrt(dim)).all()  # every entry but the last rounded down to 2^e
    loss = math.fsum(row * row) - math.fsum(halves * halves)
    lowest = loss - summation_error(dim)
    slope, offset = half_screen_error(dim, float(exact_norms(row[None, :])[0]))
    bound = slope * exact_norms(row[None, :])[0] + offset
    error = abs(float(float16_sums(row[None, :], row[None, :])["screen"][0, 0]) - math.fsum(row * row))
    assert lowest <= error <= bound
    assert lowest / bound >= (0.95 if dim == 64 else 0.91), lowest / bound


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_float16_screen_bound_holds_on_cuda_tensor_cores():
    """Tensor cores add products their own way (section 4, step 3): the bound holds for their sums too,
    on random, spread and adversarial unit rows of all-MiniLM-L6-v2's dimension."""
    rng, dim = np.random.default_rng(5), 384
    rows = unit_rows_of(np.concatenate([rng.standard_normal((64, dim)), spread_rows(rng, 64, dim),
                                        [adversarial_unit_row(256, rng).tolist() + [0.0] * (dim - 256)]]))
    queries = rows[::8]
    copy = HalfRows(torch.from_numpy(rows).float().cuda())
    screen = copy.product(copy.rounded(torch.from_numpy(queries).float().cuda()), 0, len(rows)).cpu().numpy()
    slope, offset = half_screen_error(dim, float(exact_norms(rows).max()))
    error = np.abs(screen.astype(np.float64) - exact_dots(queries, rows))
    assert (error <= slope * exact_norms(queries)[:, None] + offset).all()
