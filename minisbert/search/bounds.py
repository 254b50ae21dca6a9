"""Every error bound the search uses, each with its proof: the one room a student reads after the loop.

The search (minisbert/search/plain.py) returns exact scores, but it finds its candidates with cheaper
arithmetic: float32 products, and in minisbert/fast/ int8 (and on a GPU half-precision) copies. A
cheap score may only rule a row out where a proven bound says the exact score cannot reach the top k.
This module holds those bounds; the plain loop and every screen read them from here, and
tests/search/test_search_bounds.py checks each one holds on random and adversarial rows and is nearly reached.

The model of rounding (Higham, "Accuracy and Stability of Numerical Algorithms", 2.2). A float32
operation on float32 numbers x, y whose result lies in float32's normal range returns the exact
result rounded to nearest:

    fl(x op y) = (x op y)(1 + δ),   |δ| <= u = 2^-24,

and a fused multiply-add rounds once. Below the normal range (2^-126) a kernel may flush a product
to zero: an absolute error below 2^-126 each. Every product of two float32 numbers, and every sum of a
few of them, is exact in float64 (24 + 24 significant bits < 53), which is how the exact scores and
the tests' references are computed.

A sum of d terms in any order. A float32 sum of d products q_i c_i, in any order a kernel chooses
(blocked, vectorised, fused or not), makes each term pass through at most d roundings (its product
and at most d - 1 additions), so (Higham, Lemma 3.1 and 3.4)

    |fl(Σ q_i c_i) - Σ q_i c_i| <= γ_d Σ |q_i c_i|,   γ_d = d u / (1 - d u)      (`summation_error`)

and Σ |q_i c_i| <= |q| |c| (Cauchy-Schwarz). The bound is reached: 1 followed by d - 1 terms of
exactly u, added one at a time, loses u at every addition (each a tie, rounded to the even 1).
"""

import math

import torch

F32_UNIT = 2.0**-24  # u: rounding to float32 moves a value by at most this fraction of itself
FLUSHED = 2.0**-124  # four times the most a product flushed to zero (below 2^-126) loses
SMALLEST_SUBNORMAL = 2.0**-149  # the absolute error of rounding to float32 in the subnormal range
SLACK = 1.01  # each bound is widened by 1%: the float64 arithmetic that computes it, and second-order terms


def summation_error(dim: int) -> float:
    """γ_d: a float32 sum of d products, in any order, lies within γ_d Σ|q_i c_i| of the true sum."""
    return dim * F32_UNIT / (1 - dim * F32_UNIT)


# ---- 1. The float32 score (search/plain.py's loop, step 2) ---------------------------------------------
#
# The loop multiplies a block in float32 and compares each float32 score s_fl with the exact score
# s_x (the contract: the float64 sum of the exact products, rounded once to float32). For cosine and
# dot, with R the largest norm of the chunk's rows (unit rows for cosine: R <= 1 + d u),
#
#     |s_fl - s_x| <= |s_fl - q·c| + |q·c - s_x|
#                  <= γ_d |q| R                  the float32 sum, any order
#                   + u |q| R                     rounding the exact score to float32
#                   + d 2^-53 |q| R               the float64 sum under it, far below 1% of u
#                   + d 2^-126                    products flushed to zero
#
# For euclidean the loop scores the key 2 q·c - |c|² (`torch.addmm`: ordered as the distance is,
# since |q - c|² = |q|² - key). Its float32 value is off by γ_d 2 |q| R (the product), u R² (|c|²
# rounded to float32) and u |key| <= u (2 |q| R + R²) (the addition): at most
# (γ_d + 2u) (|q| + R)², as (|q| + R)² >= 2 |q| R + R². (A kernel that adds -|c|² into its sum
# instead sums d + 1 terms: γ_{d+1} <= γ_d + u (1 + 2du), inside the same bound and its 1%.)
# One formula covers the three scores:
#
#     E = 1.01 (γ_d + 2u) reach² + d 2^-124,   reach² = |q| R (cosine, dot) or (|q| + R)² (euclidean)
#
# (for cosine and dot the second u is spare).
#
# Rows measured here in float32 (`ROUGH`). A fast way over rows as given (search/fast/spans_blocks.py) takes
# each row's norm in float32: |c|² is a sum of d terms, within γ_d |c|², so the norm within
# γ_d / 2 + u of itself. Cosine divides the float32 product by it: off by γ_d (the product),
# γ_d / 2 + u (the norm) and u (the division), of |q| (unit queries, rows of norm 1 after the
# division); the exact score is of the unit row rounded entry by entry to float32 (u |q| more) and
# is rounded once (u): 1.5 γ_d + 4u in all. Euclidean's key subtracts the float32 norm squared
# (γ_d + 3u of R²), dot uses no norm. Each lies within E with 2 sums and 4 roundings.

# Products of rounded inputs. torch may compute a float32 product from inputs rounded to fewer bits,
# as its settings say (`torch.set_float32_matmul_precision("high")`: TF32, 11 significant bits;
# "medium": bfloat16, 8), still summed in float32. The search reads the setting, never changes it
# (`product_unit`), and widens E instead. An input x rounds to x + δ, |δ| <= u_p |x| + η (u_p = 2^-11
# or 2^-8; η = 2^-126 where a number below float32's normal range is flushed to zero), so
#
#     |fl(q_i) fl(c_i) - q_i c_i| <= (2 u_p + u_p²) |q_i c_i| + (1 + u_p) η (|q_i| + |c_i|) + η²,
#
# and over the d terms (Σ|q_i c_i| <= |q| |c|, Σ|q_i| <= √d |q|): (2 u_p + u_p²) |q| R
# + (1 + u_p) η √d (|q| + R) + d η². The product of two such inputs is exact in float32 (at most 22
# significant bits); their float32 sum is off by γ_d of their absolute sum, at most (1 + u_p)² times
# the exact one's: the terms above taken (1 + γ_d) times cover it. With the 1% (`product_error`):
#
#     E_p = 1.01 (1 + γ_d) ((2 u_p + u_p²) reach² + 2 (1 + u_p) η √d (|q| + R) + d η²),   added to E
#
# (the 2: euclidean's key multiplies 2 q·c; its 2 |q| R <= (|q| + R)² = reach² there).

ROUGH = {"sums": 2, "roundings": 4}  # the bound of a score made from rows measured in float32 (above)
PRODUCT_UNITS = {"tf32": 2.0**-11, "bf16": 2.0**-8}  # u_p of each reduced precision torch may multiply in
FLUSH = 2.0**-126  # η: what rounding an input below float32's normal range may lose (flushed to zero)


def product_unit(device: torch.device) -> float:
    """u_p: how far torch's float32 matrix products on `device` may round each input first, as torch's
    settings stand now (read, never changed): 0 for full float32 products, else TF32's or bfloat16's."""
    backend = torch.backends.cuda.matmul if device.type == "cuda" else getattr(torch.backends.mkldnn, "matmul", None)
    precision = getattr(backend, "fp32_precision", None)
    if precision is None:  # a torch without per-backend settings: the one setting it has
        precision = {"high": "tf32", "medium": "bf16"}.get(torch.get_float32_matmul_precision(), "ieee")
    return PRODUCT_UNITS.get(precision, 0.0)


def product_error(dim: int, unit: float, reach_squared, norms_sum):
    """E_p above: the error a product of inputs rounded by `unit` adds, for reach² and |q| + R (any
    broadcastable values); 0 where the inputs are not rounded."""
    if unit == 0.0:
        return 0.0
    relative = (2 * unit + unit * unit) * reach_squared
    return SLACK * (1 + summation_error(dim)) * (relative + 2 * (1 + unit) * FLUSH * dim**0.5 * norms_sum
                                                   + dim * FLUSH * FLUSH)
# A unit row's norm, bounded instead of summed. `unit_rows` divides a row x by n, its norm computed in
# float64 (within (d/2 + 1) 2^-53 of itself: `row_norms`' sum and root), rounds each quotient to float64
# (2^-53) and then to float32 (u): every entry lies within (1 + u)(1 + 2^-53)(1 + (d/2 + 1) 2^-53) of
# |x_i| / |x|, so the row's norm is at most 1 + u + (d + 4) 2^-53 < 1 + 2u for d < 2^27 (0 for a zero row).
# The searches multiply by a query's norm only in their bounds, so a cosine query (and a chunk of
# rows as given) takes this bound instead of a second fixed-order sum (search/inputs.py's `scored_rows`).
UNIT_NORM = 1 + 2 * F32_UNIT
# Rows as given that a fast way measures itself in float32 (`raw_reach`), and where it leaves them to the
# plain search's checks. A float32 norm m of a row of norm n is within γ_d / 2 + u < 2^-11 of n (d <
# 16,000) where no square falls below float32's normal range. A kernel may flush such a square to zero
# (x86 kernels do after torch.set_flush_denormal(True)): d of them lose less than d 2^-126 of n², so
# n <= m (1 + 2^-10) + √d 2^-63. A cosine row is divided by m: for n >= 2^-40 the flushed squares move
# m by less than d 2^-127 / n² < 2^-33 of itself, inside E's 1% of its 4u; smaller rows go to the plain loop.
RAW_NORM_SLACK = 1 + 2.0**-10  # float32 norms are off by less than 2^-10 of themselves (d < RAW_DIMS) ...
FLUSHED_NORM = 2.0**-63  # ... and by less than √d times this where squares are flushed to zero
RAW_DIMS = 16_000  # rows of this many entries or more are left to the plain search's checks
SMALLEST_COSINE_NORM = 2.0**-40  # cosine: rows below this norm (zero rows too) are left to the plain loop
LARGEST_RAW_SCORE = torch.finfo(torch.float32).max / 4  # ... and rows whose scores could come near float32's limit


def raw_reach(largest, dim: int):
    """An upper bound on the norms of rows of `dim` entries whose largest float32 norm is `largest`
    (a float or a tensor), as above."""
    return largest * RAW_NORM_SLACK + dim**0.5 * FLUSHED_NORM


class Bounds:
    """E, how far a float32 score can lie from the exact one (section 1), and the floors the search
    compares float32 scores with."""

    def __init__(self, score: str, query_norms: torch.Tensor, largest_norm: float, dim: int, sums: int = 1,
                 roundings: int = 2, unit: float = 0.0):
        """query_norms (Qc,) float64; a float32 score made by `sums` sums of d terms and `roundings`
        roundings, of rows of norm at most `largest_norm`, by a product whose inputs may be rounded by
        `unit` (`product_unit`)."""
        self.score, self.query_norms = score, query_norms
        reach = query_norms + largest_norm if score == "euclidean" else (query_norms * largest_norm).sqrt()
        self.error = SLACK * (sums * summation_error(dim) + roundings * F32_UNIT) * reach**2 + dim * FLUSHED  # (Qc,)
        if unit:  # products of rounded inputs (torch's setting)
            self.error = self.error + product_error(dim, unit, reach**2, query_norms + largest_norm)

    def lower(self, approximate: torch.Tensor) -> torch.Tensor:
        """(Qc,) float64 below which the exact k-th best cannot lie when k float32 scores are >=
        `approximate` (Qc,): each of their exact scores is >= approximate - E. For euclidean the
        exact score is a distance: |q - c|² = |q|² - key <= |q|² - approximate + E (|q|² in float64,
        within 1e-12 of itself), its root rounds to float32 within 2u (taken 2.01u) and above 2^-149."""
        approximate = approximate.double()
        if self.score != "euclidean":
            return approximate - self.error
        squared = (self.query_norms**2 * (1 + 1e-12) - approximate + self.error).clamp_min(0)
        return -(squared.sqrt() * (1 + 2.01 * F32_UNIT) + SMALLEST_SUBNORMAL)

    def floor(self, kth: torch.Tensor) -> torch.Tensor:
        """(Qc,) float32, rounded down: at or below the float32 score of any entry whose exact score
        can reach `kth` (Qc,): an exact score >= kth has a float32 one >= kth - E (for euclidean the
        inverse of `lower`: a distance D = -kth has a key >= |q|² - D² - E)."""
        if self.score != "euclidean":
            floor = kth - self.error
        else:
            distance = (-kth + SMALLEST_SUBNORMAL) / (1 - 2.01 * F32_UNIT)
            floor = self.query_norms**2 * (1 - 1e-12) - distance**2 - self.error
        rounded = floor.float()
        return torch.where(rounded.double() > floor, torch.nextafter(rounded, torch.full_like(rounded, -math.inf)), rounded)


# ---- 2. The int8 copy of a prepared corpus (search/fast/int8_rows.py: a few queries) ------------------------
#
# A row c is kept as d integers c' = round(c / s) in [-63, 63] and a float32 scale s; ĉ = s c'
# (computed in float32: each entry off by u of itself). A query is quantized the same way: q', s_q,
# q̂ = s_q q' (in float64). With e_c = c - ĉ and e_q = q - q̂,
#
#     q·c - q̂·ĉ = q·e_c + e_q·ĉ,   so   |q·c - q̂·ĉ| <= |q| |e_c| + |e_q| |ĉ|      (Cauchy-Schwarz).
#
# The copy keeps upper bounds on |e_c| and |ĉ| (`int8_copy_terms`). The screen compares with the
# float32 score s_fl, within γ_d |q| |c| <= γ_d |q| (|ĉ| + |e_c|) of q·c, and computes q̂·ĉ as
# s_q s (q'·c'): the integer sum exact (search/fast/int8_rows.py says why), the two scalings and the
# conversion 3u of |q̂| |ĉ| at most, and |q̂| <= |q| + |e_q|. So
#
#     s_fl <= s_q s (q'·c') + α |e_c| + β |ĉ|,
#     α = 1.01 (|q| + σ + γ_d |q|),   β = 1.01 (|e_q| + σ + γ_d |q|),   σ = 2^-20 (|q| + |e_q|) >= 3u |q̂|
#
# (`int8_rows_coefficients`; the 1% also covers the float32 arithmetic of the bound itself).

def int8_copy_terms(rows: torch.Tensor, approximations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n,) upper bounds on |e_c| = |c - ĉ| and on |ĉ|, for (n, d) float32 rows and their float32 ĉ.
    The float32 norm of the computed difference misses: the rounding of ĉ (2^-24 |ĉ|, taken twice),
    squares that underflowed (each below 2^-126: sqrt(d) 2^-63 in all, taken twice), and its own
    error, less than 2^-10 of itself for d < 16,000 (γ_d / 2 + u)."""
    norms = torch.linalg.vector_norm(approximations, dim=1)  # (n,)
    error_norms = torch.linalg.vector_norm(rows - approximations, dim=1) + 2.0**-23 * norms
    error_norms += rows.shape[1] ** 0.5 * 2.0**-62
    return error_norms * (1 + 2.0**-10), norms * (1 + 2.0**-10)


def int8_rows_coefficients(dim: int, query_norms: torch.Tensor, query_error_norms: torch.Tensor) -> torch.Tensor:
    """(2, Q) float64 α and β of section 2, from the (Q,) float64 |q| and |e_q|."""
    gamma, scaling = summation_error(dim), 2.0**-20 * (query_norms + query_error_norms)  # (Q,)
    return SLACK * torch.stack([query_norms + scaling + gamma * query_norms,
                                query_error_norms + scaling + gamma * query_norms])


# ---- 3. The int8 blocks of many queries (search/fast/int8_blocks.py) ---------------------------------------
#
# The rows of a piece share one float32 scale s = m / 127 (m the piece's largest |c_i|), and
# c' = round(c / s): c / s is rounded to float32 (u of at most 127·(1 + u)) before it is rounded to an
# integer, so each entry of c - s c' is at most s (1/2 + 2^-14) in size. A query has q', s_q and
# e_q = q - s_q q' (float64). With q̂ = s_q q' and ĉ = s c',
#
#     q·c - q̂·ĉ = q̂·(c - ĉ) + e_q·c,   so   |q·c - s_q s (q'·c')| <= s_q s L1(q') (1/2 + 2^-14) + |e_q| R,
#
# L1(q') = Σ |q'_i|, R the chunk's largest row norm. The float32 score that decides (search/fast/screen.py's
# rescoring) lies within γ_d |q| R of q·c. So
#
#     |s_fl - s_q s (q'·c')| <= B = 1.01 (s_q s L1(q') (1/2 + 2^-14) + (|e_q| + γ_d |q|) R),
#
# and an entry can beat a k-th best `kth` only if q'·c' > T = floor((kth - B) / (s_q s)), computed in
# float64 (its roundings, below 2^-40 of |T|, are covered by the 1%, since B / (s_q s) is at least 63).

INT8_STEP_ERROR = 0.5 + 2.0**-14  # |c / s - c'| for an int8 entry, in steps s (section 3)


def int8_blocks_bound(dim: int, scales: torch.Tensor, l1_norms: torch.Tensor, query_error_norms: torch.Tensor,
                      query_norms: torch.Tensor, largest_norm: float) -> torch.Tensor:
    """B of section 3: s_q s (scales), L1(q'), |e_q| and |q| broadcast together; R = largest_norm."""
    gamma = summation_error(dim)
    return SLACK * (scales * l1_norms * INT8_STEP_ERROR + (query_error_norms + gamma * query_norms) * largest_norm)


# ---- 4. The float16 copy of a prepared cosine corpus (search/fast/device.py: a GPU's screen) ----------------
#
# A cosine query q and corpus row c are float32 unit rows (or zero): |q| <= 1 + d u, |c| <= R, R the
# corpus's largest norm. On a GPU the screen computes
#
#     s16 = Σ fl16(q_i) fl16(c_i),   each product exact, summed in float32 in any order,
#
# and the search returns s_x, the contract's exact score. Rounding to float16 moves x by at most
# u_h |x| (u_h = 2^-11) in float16's normal range and by at most ε_h = 2^-25 (half its smallest
# subnormal, 2^-24) below 2^-14: fl16(x) = x + δ, |δ| <= u_h |x| + ε_h. No entry overflows (|x| <= 1,
# float16's largest number is 65504), so the copy needs no scale; a corpus of other rows gets no copy.
#
#   1. The copy's and the query's rounding: Σ fl16(q_i) fl16(c_i) - Σ q_i c_i = Σ (q_i δc_i + c_i δq_i + δq_i δc_i),
#      at most (2 u_h + u_h²) Σ|q_i c_i| + (1 + u_h) ε_h (Σ|q_i| + Σ|c_i|) + d ε_h², with Σ|q_i c_i| <= |q| |c|
#      (Cauchy-Schwarz) and Σ|q_i| <= √d |q|.
#   2. The products: two float16 numbers have 11 significant bits each, so their product has at most
#      22 and lies between 2^-48 and 1 (or is 0), inside float32's normal range: it is exact.
#   3. Their sum: in float32, in any order, each addition rounded to nearest, within γ Σ|p_i| of the
#      true sum, γ = d w / (1 - d w), w = u (section 1). Tensor cores add several products at once,
#      aligned to the largest and truncated (Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior
#      of NVIDIA tensor cores", PeerJ Computer Science 7:e330, 2021): a fused addition of m terms
#      loses less than (m + 1) 2^-23 of the largest, so w = HALF_ACCUMULATION_UNIT = 2^-22 (4u) covers
#      fused additions of up to 4 new products, and their partial sums added again. And
#      Σ|p_i| <= (1 + u_h)² Σ|q_i c_i| + (1 + u_h) ε_h (Σ|q_i| + Σ|c_i|) + d ε_h².
#   4. The exact score: the float64 fixed-order sum (L = ceil(log2 d) levels, 2^-53 each: Higham 4.2)
#      rounded once to float32: within ρ Σ|q_i c_i| of q·c, ρ = u + (L + 1) 2^-53.
#
# Adding 1 to 4, with |c| <= R:
#
#     |s16 - s_x| <= (2 u_h + u_h² + γ (1 + u_h)² + ρ) |q| R + (1 + γ) ((1 + u_h) ε_h √d (|q| + R) + d ε_h²),
#
# E = slope |q| + offset, widened by 1% (`half_screen_error`). It is nearly reached: a unit row whose
# entries but one sit just below a float16 rounding midpoint above a power of two, x = 2^e (1 + 2^-11 - 2^-20),
# rounds each of them down by almost u_h of itself, and scored with itself loses almost 2 u_h: 0.95 of
# E at d = 64 (tests/search/test_search_bounds.py builds it).
#
# A search on a GPU compares without waiting for the host, so it takes E in this linear form, and
# section 1's E for cosine and dot too (its reach² is |q| R): `linear_error`.

HALF_UNIT = 2.0**-11  # u_h: rounding to float16 moves a normal number by at most this fraction of itself
HALF_SUBNORMAL_ERROR = 2.0**-25  # ε_h: ... and a number below 2^-14 by at most this much
HALF_ACCUMULATION_UNIT = 2.0**-22  # w: a product's share of the float32 sum's error, tensor cores included


def half_screen_error(dim: int, largest_norm: float) -> tuple[float, float]:
    """(slope, offset) of section 4: the float16 screen's score of a query of norm |q| lies within
    slope |q| + offset of the exact score, over unit rows of norm at most `largest_norm`."""
    u, eps, sqrt_d = HALF_UNIT, HALF_SUBNORMAL_ERROR, dim**0.5
    gamma = dim * HALF_ACCUMULATION_UNIT / (1 - dim * HALF_ACCUMULATION_UNIT)
    exact = F32_UNIT + ((dim - 1).bit_length() + 1) * 2.0**-53  # ρ; (d - 1).bit_length() = ceil(log2 d)
    slope = (2 * u + u * u + gamma * (1 + u) ** 2 + exact) * largest_norm + (1 + gamma) * (1 + u) * eps * sqrt_d
    offset = (1 + gamma) * ((1 + u) * eps * sqrt_d * largest_norm + dim * eps * eps)
    return SLACK * slope, SLACK * offset


def linear_error(dim: int, largest_norm: float, sums: int = 1, roundings: int = 2,
                 unit: float = 0.0) -> tuple[float, float]:
    """(slope, offset): section 1's E for cosine and dot (`Bounds`), with E_p for inputs rounded by
    `unit`, as slope |q| + offset (E_p's |q| + R term split between the two)."""
    slope = SLACK * (sums * summation_error(dim) + roundings * F32_UNIT) * largest_norm
    return (slope + product_error(dim, unit, largest_norm, 1.0),
            dim * FLUSHED + product_error(dim, unit, 0.0, largest_norm))
