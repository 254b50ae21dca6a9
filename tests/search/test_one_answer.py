"""One answer whatever the call: a query gets the same results alone as in a call of 1,000; the plain
loop's results are minisbert/search/plain.py's definition written out; and a saved corpus damaged or
edited elsewhere is refused. That every way of the search, forced, returns the plain loop's indices
and scores bit for bit, on corpora built to tie and to round badly, is tests/search/test_search_property.py.
"""

import pytest
import torch
from safetensors.torch import load_file, save_file

from minisbert.search import plain
from minisbert.search import load_corpus, prepare_corpus, search

DIM = 24


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
    from minisbert.common.similarity import exact_scores, unit_rows
    generator = torch.Generator().manual_seed(2)
    corpus = torch.randint(-2, 3, (500, DIM), generator=generator).float() * torch.rand(500, 1, generator=generator)
    queries = torch.randn(7, DIM, generator=generator)
    for score in ("cosine", "dot", "euclidean"):
        scores, indices = plain.search(queries, corpus, 20, score=score, corpus_chunk_size=64)
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
