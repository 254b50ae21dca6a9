"""Tests for the int8 screens: of a few queries over a prepared corpus (minisbert/search/fast/int8_rows.py)
and the int8 blocks of a search of many queries (minisbert/search/fast/int8_blocks.py). A search through
either finds what the plain search and brute force find, ties and left-out rows included, and which
searches take them (minisbert/search/ways.py's WAYS). Their bounds are tested in tests/search/test_search_bounds.py.

tests/search/test_search_property.py runs every way, these among them, against the plain loop on corpora built to tie.
"""

import pytest
import torch

from minisbert.search import ways as ways_module
from minisbert.search.fast import int8_blocks, int8_rows, spans_blocks
from minisbert.search import choose_way, load_corpus, prepare_corpus, search
from minisbert.search.inputs import check_inputs

from .test_retrieval import assert_matches_brute_force, brute_force, count_calls, two_norm_embeddings

needs_int8 = pytest.mark.skipif(not int8_rows.int8_product_runs(24, torch.device("cpu")),
                                reason="torch's int8 product does not run exactly on this CPU")


def screened_spans(monkeypatch) -> list:
    """Record what each Int8RowsScreen.candidates returns: None where a span failed the screen."""
    return count_calls(monkeypatch, int8_rows.Int8RowsScreen, "candidates")


def exact_problem(score: str, rows: int, generator: torch.Generator):
    """(N, 24) rows whose every score is exact in float32, many of them tied: for cosine, rows
    of four entries +-1 (unit rows of +-0.5, which int8 holds exactly); for dot, multiples of
    1/8 in [-2, 2] (which it does not). Rows 1000 on repeat earlier ones."""
    if score == "cosine":
        corpus = two_norm_embeddings(rows, 24, generator)
    else:
        corpus = torch.randint(-16, 17, (rows, 24), generator=generator) / 8
    corpus[1000:] = corpus[torch.randint(0, 1000, (rows - 1000,), generator=generator)]
    return corpus


@needs_int8
@pytest.mark.parametrize("score", ["cosine", "dot"])
def test_one_query_through_the_int8_screen_finds_what_the_plain_search_finds(score, monkeypatch):
    # 20,000 rows: a first span of 4,032 rows in float32, then one of 15,968 through the screen.
    # Every score is exact, so the screened search must agree with the plain one bit for bit,
    # ties and the self-matches left out included.
    generator = torch.Generator().manual_seed(3)
    corpus = exact_problem(score, 20000, generator)
    merged = screened_spans(monkeypatch)
    prepared = prepare_corpus(corpus, score=score, screen=True)
    assert prepared.int8_copy is not None
    for row in (0, 5000, 19999):
        query = corpus[row : row + 1]
        ids = {"query_ids": [f"d{row}"], "corpus_ids": [f"d{i}" for i in range(corpus.shape[0])]}
        for k in (1, 10, 100):
            for kwargs in ({}, ids):
                scores, indices = search(query, prepared, k, **kwargs)
                plain_scores, plain_indices = search(query, corpus, k, score=score, way="plain", **kwargs)
                assert torch.equal(indices, plain_indices) and torch.equal(scores, plain_scores)
    assert any(result is not None for result in merged), "no span went through the screen"


@needs_int8
@pytest.mark.parametrize("score", ["cosine", "dot"])
def test_a_few_queries_through_the_int8_screen_find_what_the_plain_search_finds(score, monkeypatch):
    # As above, with 4, 5 (three zero columns in the product) and 64 queries in one call, each of
    # them also searched alone: one answer, bit for bit, whatever the call.
    generator = torch.Generator().manual_seed(5)
    corpus = exact_problem(score, 20000, generator)
    merged = screened_spans(monkeypatch)
    prepared = prepare_corpus(corpus, score=score, screen=True)
    counts = [n for n in (4, 5, 64) if int8_rows.int8_product_runs(24, torch.device("cpu"), n)]
    if not counts:
        pytest.skip("torch's int8 product is not exact here for several query columns")
    for num_queries in counts:
        queries = corpus[torch.randint(0, 20000, (num_queries,), generator=generator)]
        assert choose_way(check_inputs(queries, prepared, 10, None, 1024, None, None)) == "spans, int8"
        scores, indices = search(queries, prepared, 10)
        plain_scores, plain_indices = search(queries, corpus, 10, score=score, way="plain")
        assert torch.equal(indices, plain_indices) and torch.equal(scores, plain_scores)
        for row in (0, num_queries - 1):
            alone_scores, alone_indices = search(queries[row : row + 1], prepared, 10)
            assert torch.equal(alone_indices[0], indices[row]) and torch.equal(alone_scores[0], scores[row])
    assert any(result is not None for result in merged), "no span went through the screen"


@needs_int8
@pytest.mark.parametrize("score", ["cosine", "dot"])
def test_random_embeddings_through_the_int8_screen_match_brute_force(score, monkeypatch, tmp_path):
    generator = torch.Generator().manual_seed(4)
    corpus = torch.randn(30000, 64, generator=generator)
    merged = screened_spans(monkeypatch)
    path = tmp_path / "corpus.safetensors"
    prepare_corpus(corpus, score=score).save(path)
    for prepared in (prepare_corpus(corpus, score=score, screen=True), load_corpus(path, screen=True)):
        assert prepared.int8_copy is not None
        for num_queries in (1, 1, 1, 16, 16):
            queries = torch.randn(num_queries, 64, generator=generator)
            _, indices = search(queries, prepared, 10)
            assert torch.equal(indices, brute_force(queries, corpus, 10, score)[1])
    # Each search's first span finds its first k-th best in float32 (the screen is not tried there);
    # every later span must pass the screen.
    assert len(merged) >= 10 and all(result is not None for result in merged), merged


def test_queries_outside_the_screened_range_are_not_screened():
    for scale in (0.0, 2.0**-31, 2.0**51):
        assert not int8_rows.Int8RowsScreen(torch.full((1, 8), scale), 10).usable()
        assert not int8_rows.Int8RowsScreen(torch.cat([torch.ones(3, 8), torch.full((1, 8), scale)]), 10).usable()


def test_an_int8_product_that_saturates_is_not_used(monkeypatch):
    # A kernel that shifts one side to unsigned bytes and adds four products in 16 bits saturates
    # on rows of 63 (4 · 191 · 63 > 32,767), the way the AVX2 kernel does on rows of 127 (module
    # docstring): emulated here, the probe must refuse it.
    def saturating(rows, columns, out=None):
        shifted = (rows.long() + 128)[:, :, None] * columns.long()  # (n, d, c)
        fours = shifted.unflatten(1, (-1, 4)).sum(2).clamp(-32768, 32767)  # (n, d / 4, c)
        return (fours.sum(1) - 128 * columns.long().sum(0)).int()  # (n, c)

    monkeypatch.setattr(torch, "_int_mm", saturating)
    assert not int8_rows._int8_product_runs(24)  # what the machine's fact is measured by
    assert not int8_rows._int8_product_runs(24, 16)


def test_the_probe_of_the_int8_product_holds_the_extremes_at_every_sign_pairing():
    # The probe's first four rows are all +-LEVELS: one row against itself, against its negation and
    # against a row of alternating signs gives d·L², -d·L² and 0, the largest sums of either sign
    # a kernel must hold exactly (with an even d).
    rows = int8_rows.probe_integers(1024, 24, int8_rows.LEVELS)
    extremes = rows[:4].long()
    assert extremes.abs().eq(int8_rows.LEVELS).all()
    assert set((extremes @ extremes.T).flatten().tolist()) == {24 * int8_rows.LEVELS**2, -24 * int8_rows.LEVELS**2, 0}
    assert rows[4:].abs().max() <= int8_rows.LEVELS


def test_an_int8_product_that_does_not_run_is_not_exact(monkeypatch):
    # torch raises where its int8 product is not built for the CPU or the shape: a probe that cannot run
    # is no evidence of exact sums.
    def not_built(left, right, out=None):
        raise RuntimeError("_int_mm: not built for this CPU")

    monkeypatch.setattr(torch, "_int_mm", not_built)
    rows = int8_rows.probe_integers(64, 24, int8_rows.LEVELS)
    assert not int8_rows.exact_product(rows, rows[:1].T.contiguous())
    assert not int8_rows._int8_product_runs(24)


def test_which_corpora_keep_an_int8_copy():
    corpus = torch.randn(100, 24)
    assert prepare_corpus(corpus, screen=False).int8_copy is None
    assert prepare_corpus(corpus, score="euclidean", screen=True).int8_copy is None
    assert prepare_corpus(torch.randn(10, 5000), screen=True).int8_copy is None  # 5000 · 63² >= 2^24
    if int8_rows.int8_product_runs(24, torch.device("cpu")):
        assert prepare_corpus(corpus, score="dot", screen=True).int8_copy is not None
    # By default, where the int8 product is measured quicker than the float32 one.
    assert (prepare_corpus(corpus).int8_copy is not None) == int8_rows.int8_screen_pays(24)


@needs_int8
def test_one_query_that_cannot_be_screened_is_searched_in_float32(monkeypatch):
    merged = screened_spans(monkeypatch)
    corpus = torch.randn(20000, 24)
    prepared = prepare_corpus(corpus, score="dot", screen=True)
    query = torch.randn(1, 24) * 2.0**-40
    _, indices = search(query, prepared, 5, way="spans, int8")
    assert torch.equal(indices, brute_force(query, corpus, 5, "dot")[1])
    assert merged == []



@needs_int8
def test_a_span_that_fails_the_screen_leaves_the_next_span_screened(monkeypatch):
    # Three spans of 4,032, 16,128 and 64,512 unit rows, scoring 0.1, 0.2 and 0 with the query e0. The
    # second fails the screen (every row reaches the k-th best of the first); scored in float32, it
    # raises the k-th best to 0.2, which no row of the third can reach: that span must be screened
    # (it passes, with no candidate), not skipped by a back-off meant for blocks of equal size.
    generator = torch.Generator().manual_seed(4)
    spans = ((4032, 0.1), (16128, 0.2), (64512, 0.0))
    parts = []
    for rows, along in spans:
        rest = torch.nn.functional.normalize(torch.randn(rows, 23, generator=generator), dim=1)
        parts.append(torch.cat([torch.full((rows, 1), along), rest * (1 - along**2) ** 0.5], dim=1))
    corpus = torch.cat(parts)
    prepared = prepare_corpus(corpus, screen=True)
    merged = screened_spans(monkeypatch)
    query = torch.eye(24)[:1]
    scores, indices = search(query, prepared, 10, way="spans, int8")
    plain_scores, plain_indices = search(query, corpus, 10, way="plain")
    assert torch.equal(indices, plain_indices) and torch.equal(scores, plain_scores)
    assert len(merged) == 2 and merged[0] is None, "the screen was not tried on the second span and again on the third"
    assert merged[1] is not None and merged[1][0].numel() == 0

# ---- The int8 blocks of a search of many queries -------------------------------------------------

needs_int8_blocks = pytest.mark.skipif(not int8_blocks.int8_blocks_exact(24),
                                       reason="torch's int8 product is not exact for rows of 127 on this CPU")


def screened_blocks(monkeypatch) -> list:
    """Record what each Int8Blocks.candidates call returns: None where the block failed the screen."""
    return count_calls(monkeypatch, int8_blocks.Int8Blocks, "candidates")


@needs_int8_blocks
@pytest.mark.parametrize("score", ["cosine", "dot"])
def test_many_queries_through_the_int8_screen_match_brute_force(score, monkeypatch):
    # 300 queries (more than a few-query search takes) over 20,000 random rows in chunks of 2,000:
    # the first chunk, screened against a floor made from its own block, is too wide a screen at
    # d = 32 and fills the top-k in float32; every later one must pass the screen.
    generator = torch.Generator().manual_seed(6)
    queries, corpus = torch.randn(300, 32, generator=generator), torch.randn(20000, 32, generator=generator)
    corpus[:5000] *= 3.0  # rows of two sizes for dot
    screened = screened_blocks(monkeypatch)
    assert_matches_brute_force(queries, corpus, 10, score, corpus_chunk_size=2000, way="blocks, int8")
    assert len(screened) == 10 and all(result is not None for result in screened[1:]), screened


@needs_int8_blocks
@pytest.mark.parametrize("score", ["cosine", "dot"])
def test_many_queries_through_the_int8_screen_find_what_the_plain_search_finds(score, monkeypatch):
    # Every score exact (exact_problem), rows repeated (ties within and across chunks) and each
    # query's own row left out by ids: the screened search must agree with the plain one bit for
    # bit, at k = 1, 10 and 100, and also through a prepared corpus.
    generator = torch.Generator().manual_seed(7)
    corpus = exact_problem(score, 20000, generator)
    rows = torch.randint(0, 20000, (300,), generator=generator)
    queries = corpus[rows]
    ids = {"query_ids": [f"d{row}" for row in rows.tolist()], "corpus_ids": [f"d{i}" for i in range(20000)]}
    screened = screened_blocks(monkeypatch)
    for k in (1, 10, 100):
        for kwargs in ({}, ids):
            plain_scores, plain_indices = search(queries, corpus, k, score=score, way="plain", **kwargs)
            for searched in (corpus, prepare_corpus(corpus, score=score)):
                scores, indices = search(queries, searched, k, score=score, way="blocks, int8", **kwargs)
                assert torch.equal(indices, plain_indices) and torch.equal(scores, plain_scores)
    assert any(result is not None for result in screened), "no block went through the screen"


@needs_int8_blocks
@pytest.mark.parametrize("score", ["cosine", "dot"])
def test_queries_and_rows_the_int8_blocks_cannot_scale_are_still_found(score):
    # A zero query, and for dot queries of entries near 2^-40 and 2^51 (outside the range scaled),
    # and chunks of tiny rows (and for dot, of zero rows: brute force has no cosine for them) among
    # ordinary ones: the entries the screen cannot bound pass it, and the search finds what the
    # plain search finds (for the zero query, whose scores are all 0, the first rows) and, for the
    # others, what brute force finds.
    generator = torch.Generator().manual_seed(8)
    queries, corpus = torch.randn(200, 24, generator=generator), torch.randn(8000, 24, generator=generator)
    queries[0] = 0
    if score == "dot":
        queries[1] *= 2.0**-40
        queries[2] *= 2.0**51
    if score == "dot":
        corpus[2000:3000] = 0
    corpus[5000:6000] *= 2.0**-34
    _, indices = search(queries, corpus, 10, score=score, corpus_chunk_size=1000, way="blocks, int8")
    _, plain_indices = search(queries, corpus, 10, score=score, way="plain")
    assert torch.equal(indices[:3], plain_indices[:3])
    assert_matches_brute_force(queries[1:], corpus, 10, score, corpus_chunk_size=1000, way="blocks, int8")


def test_an_int8_block_product_that_saturates_is_not_used(monkeypatch):
    # Without AVX512-VNNI, oneDNN adds pairs of products of unsigned by signed bytes in 16 bits,
    # which saturates on integers of 127 (module docstring): emulated here, the probe must refuse it.
    def saturating(left, right, out=None):
        shifted = (left.long()[:, None, :] + 128) * right.T.long()[None, :, :]  # (m, n, d)
        pairs = shifted.unflatten(2, (-1, 2)).sum(3).clamp(-32768, 32767)  # (m, n, d / 2)
        return (pairs.sum(2) - 128 * right.long().sum(0)[None, :]).int()

    assert saturating(torch.ones(2, 4, dtype=torch.int8), torch.ones(4, 3, dtype=torch.int8)).eq(4).all()
    monkeypatch.setattr(torch, "_int_mm", saturating)
    assert not int8_blocks._int8_blocks_exact(24)  # what the machine's fact is measured by


def ways(num_queries, corpus, score="cosine"):
    """The way minisbert/search/ways.py's WAYS chooses for a search of `num_queries` over `corpus`."""
    return choose_way(check_inputs(torch.randn(num_queries, 24), corpus, 5, score, 1024, None, None))


def test_which_searches_screen_with_int8_blocks():
    # Never for euclidean; by default where the int8 product is exact and measured to pay.
    corpus = torch.randn(20_000, 24)
    pays = int8_blocks.int8_blocks_pay(24) if int8_blocks.int8_blocks_exact(24) else False
    assert ways(300, corpus, "euclidean") != "blocks, int8"
    assert (ways(300, corpus, "dot") == "blocks, int8") == pays
    with pytest.raises(ValueError, match="cannot run here"):
        search(torch.randn(300, 24), corpus, 5, score="euclidean", way="blocks, int8")


@pytest.mark.parametrize("int8_blocks_pay", [True, False])
def test_the_table_gives_each_count_of_queries_its_way(monkeypatch, int8_blocks_pay):
    """WAYS read as bench/README.md gives its reasons ("Search"), with the machine's facts set: int8
    products are exact here, and the int8 blocks pay or not. Over a small corpus every few queries
    take "one span". Over a larger one: one query, and from SCREENED_FEW_QUERIES up to FEW_QUERIES_INT8,
    are screened with a prepared corpus's int8 copy ("spans, int8"); 2 or 3 queries, and any count over
    rows as given or without the copy, read spans up to FEW_QUERIES. More queries than that read blocks,
    and where the int8 blocks pay, more than FEW_QUERIES_INT8 already do, through int8 products
    ("blocks, int8"). Euclidean scores are never screened with int8 products (no int8 copy, no int8
    blocks): a row's |c|^2 is not in an int8 product."""
    from minisbert.search.fast.tuning import FEW_QUERIES, FEW_QUERIES_INT8, SCREENED_FEW_QUERIES, SMALL_CORPUS_ROWS

    for where in (ways_module, spans_blocks):
        monkeypatch.setattr(where, "int8_product_runs", lambda *_: True)
    monkeypatch.setattr(ways_module, "int8_blocks_exact", lambda dim: True)
    monkeypatch.setattr(ways_module, "int8_blocks_pay", lambda dim: int8_blocks_pay)
    generator = torch.Generator().manual_seed(5)
    small, large = (torch.randn(rows, 8, generator=generator) for rows in (SMALL_CORPUS_ROWS, SMALL_CORPUS_ROWS + 1))
    counts = (1, 2, SCREENED_FEW_QUERIES - 1, SCREENED_FEW_QUERIES, FEW_QUERIES_INT8, FEW_QUERIES_INT8 + 1,
              FEW_QUERIES, FEW_QUERIES + 1)
    for score in ("cosine", "dot", "euclidean"):
        int8 = score != "euclidean"
        for corpus, rows, prepared in ((small, SMALL_CORPUS_ROWS, False), (large, SMALL_CORPUS_ROWS + 1, False),
                                       (prepare_corpus(large, score, screen=True), SMALL_CORPUS_ROWS + 1, True)):
            for count in counts:
                blocks_int8 = int8 and int8_blocks_pay and count > FEW_QUERIES_INT8
                if count > FEW_QUERIES or blocks_int8:
                    expected = "blocks, int8" if blocks_int8 else "blocks"
                elif rows <= SMALL_CORPUS_ROWS:
                    expected = "one span"
                elif int8 and prepared and (count == 1 or SCREENED_FEW_QUERIES <= count <= FEW_QUERIES_INT8):
                    expected = "spans, int8"
                else:
                    expected = "spans"
                queries = torch.randn(count, 8, generator=generator)
                checked = check_inputs(queries, corpus, 5, None if prepared else score, 1024, None, None)
                assert choose_way(checked) == expected, (score, rows, prepared, count)
