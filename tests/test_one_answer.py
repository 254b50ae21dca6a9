"""One answer whatever the way: every way of the search, forced, returns the plain loop's indices and
scores bit for bit (minisbert/retrieval.py defines a returned score as one fixed arithmetic, and every
way ends in the same exact rescoring), on corpora built to tie and to round badly; a query gets the
same results alone as in a call of 1,000; and a saved corpus damaged or edited elsewhere is refused.
"""

import pytest
import torch
from safetensors.torch import load_file, save_file

from minisbert import retrieval
from minisbert.fast import retrieval as fast_retrieval
from minisbert.fast import span_product, tuning
from minisbert.search import WAY_NAMES, load_corpus, prepare_corpus, search

DIM = 24
ROWS = 700  # in chunks of 300 rows, spans of 64 then up to 320


def adversarial_corpora(generator):
    """(name, (N, DIM) corpus): rows built so that scores tie exactly or within float32 rounding."""
    integers = torch.randint(-3, 4, (ROWS, DIM), generator=generator).float()
    yield "small integers", integers  # every dot product exact; many exact ties
    multiples = integers[:35].repeat(20, 1) * torch.randint(1, 6, (ROWS, 1), generator=generator).float()
    yield "multiples", multiples  # equal cosines in every group of 35 rows
    near = torch.randn(ROWS, DIM, generator=generator)
    near[1::2] = near[::2] + 1e-6 * torch.randn(ROWS // 2, DIM, generator=generator)
    yield "near duplicates", near  # pairs whose scores differ by far less than float32 rounding
    scales = 10.0 ** torch.randint(-30, 16, (ROWS, 1), generator=generator).double()
    yield "norms from 1e-30 to 1e15", (torch.randn(ROWS, DIM, generator=generator).double() * scales).float()
    zeros = torch.randn(ROWS, DIM, generator=generator)
    zeros[::7] = 0
    yield "zero rows", zeros
    yield "bfloat16", torch.randint(-3, 4, (ROWS, DIM), generator=generator).to(torch.bfloat16)
    yield "float16", (torch.randn(ROWS, DIM, generator=generator) / 4).half()


@pytest.fixture
def short_spans(monkeypatch):
    """Spans of a few groups, so that the few-query ways cross many spans and their growth here."""
    monkeypatch.setattr(fast_retrieval, "FIRST_SPAN_ROWS", 64)
    monkeypatch.setattr(fast_retrieval, "SPAN_ROWS", 5 * 64)
    monkeypatch.setattr(span_product, "PIECE_ENTRIES", 80)


def forms(corpus, score, folder):
    """The corpus as given, prepared with every copy, and saved and loaded."""
    prepared = prepare_corpus(corpus, score, screen=True)
    prepared.save(folder / "corpus.safetensors")
    return {"as given": corpus, "prepared": prepared,
            "saved and loaded": load_corpus(folder / "corpus.safetensors", screen=True)}


def results_of(queries, corpus, k, score, **kwargs):
    """search's (scores, indices), or the error's message where it refuses; None where the way cannot run."""
    try:
        return search(queries, corpus, k, score=score, **kwargs)
    except ValueError as error:
        return None if "cannot run here" in str(error) else str(error)


def assert_same(got, expected, what):
    if isinstance(expected, str) or isinstance(got, str):
        assert got == expected, what
    else:
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), what


KINDS = ("small integers", "multiples", "near duplicates", "norms from 1e-30 to 1e15", "zero rows", "bfloat16",
         "float16")


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("score", ["cosine", "dot", "euclidean"])
def test_every_way_returns_the_plain_loops_bits_on_adversarial_corpora(score, kind, short_spans, tmp_path):
    generator = torch.Generator().manual_seed(KINDS.index(kind))
    for name, corpus in adversarial_corpora(generator):
        if name != kind:
            continue
        num_docs = corpus.shape[0]
        # Queries: rows of the corpus (exact ties with themselves and their copies) and fresh ones.
        queries = corpus[torch.randint(0, num_docs, (390,), generator=generator)].float()
        queries[1::2] = torch.randint(-3, 4, (195, DIM), generator=generator).float()
        ids = {"query_ids": [f"d{i}" for i in torch.randint(0, num_docs, (390,), generator=generator).tolist()],
               "corpus_ids": [f"d{i}" for i in range(num_docs)]}
        searched_forms = forms(corpus, score, tmp_path)
        # k + 16 = N: a fast way keeps every row (fast/tuning.py's KEPT_BEYOND_K); k > N: the whole corpus.
        for k in (1, 10, num_docs - tuning.KEPT_BEYOND_K, num_docs + 1):
            # Around the ways' thresholds (fast/tuning.py): a prepared corpus's int8 copy screens 1 query
            # and from 4 (not 3); spans end at the query chunk (50 here), or at 64 or 128 queries, where
            # the int8 copy's product grows from 64 columns to 128 and from 128 to 256.
            for num_queries in (1, 3, 4, 50, 51, 64, 65, 128, 129, 390):
                chosen = {"query_ids": ids["query_ids"][:num_queries], "corpus_ids": ids["corpus_ids"]}
                expected = results_of(queries[:num_queries], corpus, k, score, fast=False, **chosen,
                                      corpus_chunk_size=500)
                for form, searched in searched_forms.items():
                    for way in (None, *WAY_NAMES):
                        got = results_of(queries[:num_queries], searched, k, score, way=way, **chosen,
                                         query_chunk_size=50, corpus_chunk_size=300)
                        if got is not None:
                            assert_same(got, expected, f"{name}, k={k}, {num_queries} queries, {form}, way={way}")


@pytest.mark.parametrize("score", ["cosine", "dot", "euclidean"])
def test_a_query_alone_gets_what_it_gets_among_1000(score):
    # Rows that are multiples of each other tie exactly in cosine; small integers tie in dot and
    # euclidean. A query searched alone takes other ways than in a call of 1,000 queries.
    generator = torch.Generator().manual_seed(1)
    base = torch.randint(-2, 3, (60, DIM), generator=generator).float()
    corpus = base.repeat(300, 1) * torch.randint(1, 4, (18_000, 1), generator=generator).float()
    queries = torch.randn(1000, DIM, generator=generator)
    queries[::2] = corpus[torch.randint(0, 18_000, (500,), generator=generator)]
    for searched in (corpus, prepare_corpus(corpus, score, screen=True)):
        batch_scores, batch_indices = search(queries, searched, 10, score=score)
        for row in range(0, 1000, 50):
            scores, indices = search(queries[row : row + 1], searched, 10, score=score)
            assert torch.equal(indices[0], batch_indices[row]) and torch.equal(scores[0], batch_scores[row])


def test_the_plain_loop_is_the_definition_written_out():
    # The plain loop's scores are exact_scores of the rows it returns; its order is theirs, ties to the
    # lower row, checked against every row's exact score.
    from minisbert.similarity import exact_scores, unit_rows
    generator = torch.Generator().manual_seed(2)
    corpus = torch.randint(-2, 3, (500, DIM), generator=generator).float() * torch.rand(500, 1, generator=generator)
    queries = torch.randn(7, DIM, generator=generator)
    for score in ("cosine", "dot", "euclidean"):
        scores, indices = retrieval.search(queries, corpus, 20, score=score, corpus_chunk_size=64)
        rows, given = (unit_rows(corpus), unit_rows(queries)) if score == "cosine" else (corpus, queries)
        every = torch.stack([exact_scores(given[q].expand(500, -1), rows, score) for q in range(7)])  # (7, 500)
        order = every.argsort(dim=1, descending=score != "euclidean", stable=True)[:, :20]
        assert torch.equal(indices, order) and torch.equal(scores, every.gather(1, order))


@pytest.mark.parametrize("score", ["cosine", "dot", "euclidean"])
def test_a_saved_corpus_damaged_or_edited_elsewhere_is_refused(score, tmp_path):
    path = tmp_path / "corpus.safetensors"
    prepare_corpus(torch.randn(300, DIM), score).save(path)
    saved = load_file(str(path))
    metadata = {"format": "minisbert prepared corpus 3", "score": score}

    def edited(change):
        tensors = {name: tensor.clone() for name, tensor in saved.items()}
        change(tensors)
        save_file(tensors, str(path), metadata=metadata)
        return path

    def put_nan(tensors):
        tensors["rows"][123, 4] = float("nan")

    with pytest.raises(ValueError, match=f"{path}: corpus row 123 contains NaN or inf"):
        load_corpus(edited(put_nan))
    if score == "cosine":
        def scale_row(tensors):
            tensors["rows"][42] *= 1000

        with pytest.raises(ValueError, match=f"{path}: row 42 has norm .*, not 1"):
            load_corpus(edited(scale_row))

    def shift_row(tensors):
        tensors["rows"][7] = tensors["rows"][8]

    with pytest.raises(ValueError, match=f"{path}: its 'norms' .* do not match its rows"):
        load_corpus(edited(shift_row))

    def narrow_norms(tensors):  # zero rows, their norms right in value but float32: minisbert writes float64
        tensors["rows"], tensors["norms"] = torch.zeros_like(tensors["rows"]), torch.zeros(300)

    with pytest.raises(ValueError, match=f"{path}: its 'norms' \\(torch.float32\\) do not match"):
        load_corpus(edited(narrow_norms))
