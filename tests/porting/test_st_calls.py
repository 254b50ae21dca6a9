"""The sentence-transformers calls a porting user makes, checked against what sentence-transformers 6.2
returned for the same calls on the same all-MiniLM-L6-v2 (tests/fixtures/st_calls/, written by
tests/fixtures/make_st_calls.py); and the calls minisbert does not support, refused by name.

What "the same" means here: float results within what two float32 computations of the model may
differ by (tests/tolerances.py: 1.6e-4 for all-MiniLM-L6-v2's unit embeddings; the references were
made on another CPU by other kernels; token embeddings, up to about 10, relative to their largest
value); quantisation bit for bit on sentence-transformers' own
float embeddings, and on ours one bucket apart at most where a value sits on a bucket edge (with
ranges taken from six embeddings, each dimension's largest value sits on one); search results with
the same ids in the same order and scores within two float32 dot products of 384 terms apart.
"""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import minisbert
from minisbert import SentenceTransformer
from minisbert.porting import util
from minisbert.common.hub import resolve
from minisbert.encoding.model import SentenceModel
from minisbert.encoding.pooling import normalize
from minisbert.porting.quantize import quantize_embeddings

from ..conftest import FIXTURES, reference
from ..tolerances import float32_apart, encoder_roundings, scale

MINILM = {"hidden_size": 384, "num_layers": 6, "num_heads": 12, "intermediate_size": 1536}  # config.json
ATOL = float32_apart(encoder_roundings(SimpleNamespace(**MINILM, head_size=32), 256) + 384)  # + Normalize
SCORES = float32_apart(384)  # a dot product of two given embeddings


@pytest.fixture(scope="module")
def st():
    """(reference tensors, reference.json) of tests/fixtures/st_calls/."""
    _, tensors, facts = reference("st_calls")
    return tensors, facts


@pytest.fixture(scope="module")
def minilm_fresh(one_thread):
    """A model of its own, which the tests here may change (the session's `minilm` is shared)."""
    return minisbert.load("all-MiniLM-L6-v2", device="cpu")


def tiny():
    return SentenceTransformer(FIXTURES / "tiny_st_dense", device="cpu")


# ---------------------------------------------------------------------------------------------
# max_seq_length: read, written, saved, and what it changes


def test_max_seq_length_changes_what_is_encoded():
    model, text = tiny(), "hello world " * 20
    assert model.max_seq_length == 12  # sentence_bert_config.json's
    full = model.encode(text)
    model.max_seq_length = 4
    assert model.tokenizer.max_seq_length == 4
    assert len(model.tokenizer.token_ids([text])[0]) == 4  # [CLS] hello world [SEP]
    cut = model.encode(text)
    assert not np.allclose(full, cut, rtol=0, atol=ATOL)  # more than float32 could move it
    assert np.allclose(cut, model.encode(" ".join(text.split()[:2])), rtol=0, atol=ATOL)  # [CLS] hello world [SEP]


def test_max_seq_length_above_the_positions_is_refused_and_saved_values_reload(tmp_path):
    model = tiny()
    positions = model.encoder.config.max_tokens  # 24
    with pytest.raises(ValueError, match=f"max_seq_length 25 is more tokens than this model has positions "
                                         f"\\({positions}\\); choose at most {positions}"):
        model.max_seq_length = 25
    with pytest.raises(ValueError, match="max_seq_length must be an int of at least 2"):
        model.max_seq_length = 1
    assert model.max_seq_length == 12
    model.max_seq_length = 7
    model.save(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "sentence_bert_config.json").read_text())["max_seq_length"] == 7
    assert SentenceModel.from_dir(tmp_path / "m", device="cpu").max_seq_length == 7
    model.limit_max_seq_length(1000)  # the scripts' --max-seq-length: a cap
    assert model.max_seq_length == positions


def test_max_seq_length_on_minilm_matches_sentence_transformers(st, minilm_fresh):
    tensors, facts = st
    model = minilm_fresh
    assert model.max_seq_length == facts["max_seq_length"] == 256
    assert torch.allclose(model.encode(facts["long"], convert_to_tensor=True), tensors["long_256"], rtol=0, atol=ATOL)
    model.max_seq_length = 16
    try:
        assert torch.allclose(model.encode(facts["long"], convert_to_tensor=True), tensors["long_16"], rtol=0,
                              atol=ATOL)
    finally:
        model.max_seq_length = 256
    assert facts["reloaded_max_seq_length"] == 16  # sentence-transformers reloads what it saved, as we do


# ---------------------------------------------------------------------------------------------
# encode's forms and options


def test_one_string_without_numpy_is_one_tensor(st, minilm_fresh):
    tensors, facts = st
    single = minilm_fresh.encode("one string", convert_to_numpy=False)
    assert isinstance(single, torch.Tensor) and single.shape == (384,) and facts["single_type"] == "Tensor"
    assert torch.allclose(single, tensors["single"], rtol=0, atol=ATOL)
    normalized = minilm_fresh.encode("one string", convert_to_numpy=False, normalize_embeddings=True)
    assert torch.allclose(normalized, tensors["single_normalized"], rtol=0, atol=ATOL)


def test_truncate_dim_as_sentence_transformers_applies_it(st):
    tensors, facts = st
    model = SentenceTransformer(resolve("all-MiniLM-L6-v2"), device="cpu", truncate_dim=128)
    assert model.get_sentence_embedding_dimension() == facts["truncated_dimension"] == 128
    assert model.get_embedding_dimension() == 128  # sentence-transformers 6.2's name for it
    sentences = facts["sentences"]
    assert torch.allclose(model.encode(sentences, convert_to_tensor=True), tensors["truncate_128"], rtol=0, atol=ATOL)
    normalized = model.encode(sentences, convert_to_tensor=True, normalize_embeddings=True)  # truncated, then normalised
    assert torch.allclose(normalized, tensors["truncate_128_normalized"], rtol=0, atol=ATOL)
    model.truncate_dim = None
    assert model.get_sentence_embedding_dimension() == facts["dimension"] == 384
    called = model.encode(sentences, convert_to_tensor=True, truncate_dim=64)
    assert torch.allclose(called, tensors["truncate_64_call"], rtol=0, atol=ATOL)


def test_similarity_of_lists_and_pairwise(st, minilm_fresh):
    tensors, facts = st
    full = tensors["full"]
    queries, corpus = list(full[:2]), [row.tolist() for row in full[2:]]
    assert torch.allclose(minilm_fresh.similarity(queries, corpus), tensors["similarity_lists"], rtol=0, atol=ATOL)
    assert torch.allclose(minilm_fresh.similarity_pairwise(full[:3], full[3:]), tensors["pairwise"], rtol=0, atol=ATOL)
    single = minilm_fresh.similarity_pairwise(full[0].numpy(), full[1].numpy())  # two embeddings: one 0-d score
    assert list(single.shape) == facts["pairwise_single_shape"] == [] and f"{single:.3f}"
    assert torch.allclose(single, tensors["pairwise_single"], rtol=0, atol=ATOL)


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_precision_quantises_as_sentence_transformers_does(st, minilm_fresh, precision):
    tensors, facts = st
    expected = tensors[precision].numpy()
    same_floats = quantize_embeddings(tensors["full"], precision)
    assert same_floats.dtype == expected.dtype and (same_floats == expected).all()
    ours = minilm_fresh.encode(facts["sentences"], precision=precision)
    assert ours.dtype == expected.dtype and ours.shape == expected.shape
    apart = np.abs(ours.astype(np.int16) - expected.astype(np.int16))
    if precision.endswith("binary"):
        assert (apart == 0).all()  # the sign of a value is not a rounding matter (none sits at 0 here)
    else:
        assert apart.max() <= 1 and (apart > 0).mean() < 0.01  # a value on a bucket edge may fall either side
    with pytest.raises(ValueError, match="one embedding has no range"):
        minilm_fresh.encode(["one text"], precision="int8")


def test_precision_none_is_float32_and_float64_quantises_as_sentence_transformers(st, minilm_fresh):
    tensors, facts = st
    none = minilm_fresh.encode(facts["sentences"], precision=None)  # wrappers pass None for "not set"
    assert none.dtype == np.float32 and np.array_equal(none, minilm_fresh.encode(facts["sentences"]))
    assert np.allclose(none, tensors["precision_none"].numpy(), rtol=0, atol=ATOL)
    for precision in ("int8", "uint8"):  # float64 stays float64; only the buckets' start and step are float32
        ours = quantize_embeddings(tensors["float64_embeddings"].numpy(), precision)
        assert ours.dtype == tensors[f"float64_{precision}"].numpy().dtype
        assert np.array_equal(ours, tensors[f"float64_{precision}"].numpy())


def test_an_empty_list_gives_no_rows_of_the_asked_width_and_type(st, minilm_fresh):
    """A difference kept (README, "Coming from sentence-transformers"): sentence-transformers returns
    an empty (0,) array (float64, whatever precision was asked) or tensor; minisbert returns (0, D) of
    the dtype asked for, so that code stacking or concatenating results needs no special case."""
    _, facts = st
    assert facts["empty"]["numpy_int8"] == {"type": "ndarray", "shape": [0], "dtype": "float64"}
    assert facts["empty"]["tensor_truncate_dim"] == {"type": "Tensor", "shape": [0], "dtype": "torch.float32"}
    assert facts["empty"]["list"] == {"type": "list", "shape": [0], "dtype": "None"}
    expected = {(): ((0, 384), np.float32), (("truncate_dim", 8),): ((0, 8), np.float32),
                (("precision", "int8"),): ((0, 384), np.int8), (("precision", "binary"),): ((0, 48), np.int8)}
    for options, (shape, dtype) in expected.items():
        result = minilm_fresh.encode([], **dict(options))
        assert (result.shape, result.dtype) == (shape, dtype), options
    assert minilm_fresh.encode([], convert_to_tensor=True, truncate_dim=8).shape == (0, 8)
    assert minilm_fresh.encode([], convert_to_numpy=False) == []


def test_token_embeddings_are_each_texts_real_tokens(st, minilm_fresh):
    tensors, facts = st
    tokens = minilm_fresh.encode(facts["sentences"][:3], output_value="token_embeddings")
    for i, vectors in enumerate(tokens):
        assert vectors.shape == tensors[f"token_embeddings_{i}"].shape
        assert torch.allclose(vectors, tensors[f"token_embeddings_{i}"], rtol=0, atol=ATOL * scale(vectors))
    single = minilm_fresh.encode(facts["sentences"][0], output_value="token_embeddings")
    assert torch.allclose(single, tensors["token_embeddings_single"], rtol=0, atol=ATOL * scale(single))


def test_prompts_encode_query_and_encode_document(st, minilm_fresh):
    tensors, facts = st
    model = SentenceTransformer(resolve("all-MiniLM-L6-v2"), device="cpu", prompts=facts["prompts"])
    assert model.prompts == facts["prompted_prompts"] and minilm_fresh.prompts == facts["plain_prompts"]
    assert facts["pooling_include_prompt"]  # the prompt's tokens are pooled with the text's, as here
    sentences = facts["sentences"]
    assert torch.allclose(model.encode_query(sentences[:2], convert_to_tensor=True), tensors["query"], rtol=0,
                          atol=ATOL)
    # "document" is always a prompt ("" unless set), and it comes before "passage": no prompt here
    assert torch.allclose(model.encode_document(sentences[2:4], convert_to_tensor=True), tensors["document"],
                          rtol=0, atol=ATOL)
    named = model.encode(sentences[:2], prompt_name="query", convert_to_tensor=True)
    assert torch.allclose(named, tensors["prompt_name_query"], rtol=0, atol=ATOL)
    text = minilm_fresh.encode(sentences[:2], prompt="Represent this: ", convert_to_tensor=True)
    assert torch.allclose(text, tensors["prompt_text"], rtol=0, atol=ATOL)
    with pytest.raises(ValueError, match="prompt_name 'passages' is not one of the model's prompts"):
        model.encode("x", prompt_name="passages")


def test_prompts_are_saved_and_read_back(tmp_path):
    model = tiny()
    model.prompts["query"] = "query: "
    model.default_prompt_name = "query"
    model.save(tmp_path / "m")
    again = SentenceTransformer(tmp_path / "m", device="cpu")
    assert again.prompts == {"query": "query: ", "document": ""} and again.default_prompt_name == "query"
    assert np.allclose(again.encode("hello"), again.encode("query: hello", prompt=""), rtol=0, atol=ATOL)  # the default
    assert not np.allclose(again.encode("hello"), again.encode("hello", prompt=""), rtol=0, atol=ATOL)


def test_util_matches_sentence_transformers(st):
    from minisbert import util as ported  # sentence-transformers' `from sentence_transformers import util`, ported

    assert ported is util
    tensors, facts = st
    queries, corpus = tensors["full"][:2], tensors["full"][2:]
    found = util.semantic_search(queries, corpus, top_k=3)
    assert [[hit["corpus_id"] for hit in hits] for hits in found] == \
        [[hit["corpus_id"] for hit in hits] for hits in facts["semantic_search"]]
    assert np.allclose([[hit["score"] for hit in hits] for hits in found],
                       [[hit["score"] for hit in hits] for hits in facts["semantic_search"]], rtol=0, atol=SCORES)
    assert torch.allclose(util.cos_sim(list(queries), list(corpus)), tensors["cos_sim_lists"], rtol=0, atol=SCORES)
    assert torch.allclose(util.dot_score(queries, corpus), tensors["dot_score"], rtol=0, atol=SCORES)
    # unit rows, up to their float32 sums over D; the empty text's row (the last) stays 0
    assert torch.allclose(util.normalize_embeddings(corpus).norm(dim=1)[:-1], torch.ones(3), rtol=0, atol=2 * SCORES)
    with pytest.raises(ValueError, match="score_function must be minisbert.util.cos_sim or minisbert.util.dot_score"):
        util.semantic_search(queries, corpus, score_function=lambda a, b: a @ b.T)


def test_semantic_search_takes_what_sentence_transformers_takes():
    # sentence-transformers' semantic_search (5.7, run in the peer environment on such inputs) returns an
    # empty list per query for top_k=0 and for an empty corpus (its loop over corpus chunks never runs,
    # and torch.topk with k = 0 picks nothing), [] for no queries, and takes a numpy integer top_k and
    # embeddings that require grad (a model's outputs outside torch.no_grad()).
    generator = torch.Generator().manual_seed(0)
    queries, corpus = torch.randn(3, 8, generator=generator), torch.randn(40, 8, generator=generator)
    hits = util.semantic_search(queries, corpus, top_k=2)
    assert util.semantic_search(queries, corpus, top_k=0) == [[], [], []]
    assert util.semantic_search(queries, corpus[:0], top_k=3) == [[], [], []]
    assert util.semantic_search(queries[:0], corpus, top_k=2) == []
    assert util.semantic_search(queries, corpus, top_k=np.int64(2)) == hits
    assert util.semantic_search(queries.clone().requires_grad_(), corpus.clone().requires_grad_(), top_k=2) == hits


def test_normalize_embeddings_takes_what_similarity_takes_and_refuses_integers():
    # Integer rows once came back as zeros (their unit rows rounded to integers), and an array raised
    # "'numpy.ndarray' object has no attribute 'to'"; sentence-transformers refuses integers too.
    rows = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    unit = util.normalize_embeddings(rows)
    assert torch.equal(unit, normalize(rows))
    for form in (rows.numpy(), list(rows), rows.tolist()):
        assert torch.equal(util.normalize_embeddings(form), unit)
    assert torch.equal(util.normalize_embeddings(rows[1]), unit[1])  # one embedding (D,) stays one
    for integers in (torch.tensor([[3, 4]]), np.array([[3, 4]])):
        with pytest.raises(ValueError, match="embeddings holds torch.int64 numbers; embeddings are floating point"):
            util.normalize_embeddings(integers)


# ---------------------------------------------------------------------------------------------
# Nothing silently ignored


@pytest.mark.parametrize("attribute", ["model_card_data", "backend", "do_lower_case", "include_prompt"])
def test_a_sentence_transformers_attribute_minisbert_lacks_is_refused(attribute):
    with pytest.raises(AttributeError, match=f"minisbert does not support sentence-transformers' attribute "
                                             f"'{attribute}': setting it would change nothing"):
        setattr(tiny(), attribute, None)


@pytest.mark.parametrize("argument, hint", [
    ("device", "model.to\\(device\\)"), ("pool", "one process"), ("processing_kwargs", "model.max_seq_length"),
    ("batch_sise", "not an argument of encode"),
])
def test_an_encode_argument_minisbert_lacks_is_refused(argument, hint):
    with pytest.raises(TypeError, match=f"minisbert's encode\\(\\) does not support the argument\\(s\\) "
                                        f"\\['{argument}'\\].*{hint}"):
        tiny().encode(["a"], **{argument: None})


@pytest.mark.parametrize("options, message", [
    ({"output_value": None}, "output_value must be one of"),
    ({"precision": "int4"}, "precision must be one of"),
    ({"output_value": "token_embeddings", "normalize_embeddings": True}, "sentence embeddings only"),
    ({"truncate_dim": 0}, "truncate_dim must be a positive int or None, got 0"),
    ({"prompt": "a", "prompt_name": "query"}, "got both prompt='a' and prompt_name='query'"),
])
def test_bad_sentence_transformers_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        tiny().encode(["a", "b"], **options)


def test_the_constructor_refuses_what_it_does_not_take():
    with pytest.raises(TypeError, match=r"does not support the argument\(s\) \['trust_remote_code'\]"):
        SentenceTransformer(FIXTURES / "tiny_st_dense", device="cpu", trust_remote_code=True)


def test_the_constructor_takes_similarity_fn_name_and_settings_that_change_embeddings_change_the_cache_key():
    from minisbert.evaluation.benchmark import model_fingerprint

    model = SentenceTransformer(FIXTURES / "tiny_st_dense", device="cpu", similarity_fn_name="dot")
    assert model.similarity_fn_name == "dot"
    with pytest.raises(ValueError, match="unknown similarity_fn_name 'cos'"):
        SentenceTransformer(FIXTURES / "tiny_st_dense", device="cpu", similarity_fn_name="cos")
    plain = model_fingerprint(model)
    model.truncate_dim = 8
    truncated = model_fingerprint(model)
    model.truncate_dim, model.prompts["query"], model.default_prompt_name = None, "query: ", "query"
    assert len({plain, truncated, model_fingerprint(model)}) == 3


# ---------------------------------------------------------------------------------------------
# Where a porting user met minisbert parting from sentence-transformers


def test_truncate_dim_is_saved_and_read_back_as_sentence_transformers_does(st, tmp_path):
    _, facts = st
    model = SentenceTransformer(resolve("all-MiniLM-L6-v2"), device="cpu", truncate_dim=128)
    model.save(tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config_sentence_transformers.json").read_text())
    assert saved.get("truncate_dim") == facts["truncate_saved_config"]["truncate_dim"] == 128
    assert SentenceTransformer(tmp_path / "m", device="cpu").truncate_dim == facts["truncate_reloaded"]
    assert SentenceTransformer(tmp_path / "m", device="cpu", truncate_dim=32).truncate_dim == \
        facts["truncate_reloaded_overridden"]
    assert SentenceTransformer(tmp_path / "m", device="cpu").encode("a text").shape == (128,)


# A network cast to float16 or bfloat16 rounds every hidden state to 11 or 8 significant bits: two
# such computations of 6 blocks (sentence-transformers', and minisbert's other kernels) part by a few
# roundings of that size, |a - b| ~ 1e-3 (float16) and 1e-2 (bfloat16) for unit vectors, so a cosine
# of 1 - |a - b|^2 / 2 above 0.9999 and 0.999. float64 agrees as float32 does (ATOL).
CAST_COSINE = {"half": 0.9999, "bfloat16": 0.999}


@pytest.mark.parametrize("cast", ["half", "bfloat16", "double"])
def test_a_cast_network_encodes_as_sentence_transformers_does(st, cast):
    tensors, facts = st
    model = getattr(SentenceTransformer(resolve("all-MiniLM-L6-v2"), device="cpu"), cast)()
    as_numpy = model.encode(facts["sentences"][:2])
    as_tensor = model.encode(facts["sentences"][:2], convert_to_tensor=True)
    assert str(as_numpy.dtype) == facts["cast"][cast]["numpy_dtype"]
    assert str(as_tensor.dtype) == facts["cast"][cast]["tensor_dtype"]
    theirs = tensors[f"cast_{cast}"]
    if cast == "double":
        assert (as_tensor.float() - theirs).abs().max() <= ATOL
    else:
        cosine = torch.nn.functional.cosine_similarity(as_tensor.float(), theirs, dim=1)
        assert cosine.min() >= CAST_COSINE[cast]


def test_a_model_built_in_memory_gives_the_bits_of_the_same_model_saved_and_loaded(tmp_path):
    """sentence-transformers' own test_safetensors: a model with a Dense layer built from its modules,
    saved and loaded, encodes "Hello, World!" to the same vector. Built with no fast_path named it
    runs the path load() plugs in; with fast_path=None, the plain network, as load(fast=False) does."""
    from minisbert.porting.sentence_transformer import SentenceTransformer as Network

    parts = SentenceModel.from_dir(FIXTURES / "tiny_st_dense", device="cpu")
    network = (parts.encoder, parts.tokenizer, parts.pooling, parts.dense, parts.normalize_embeddings)
    built = Network(*network, tokenizer_dir=parts.tokenizer_dir).eval()
    built.save(tmp_path / "m")
    for fast_path, fast in ((built.fast_path, True), (None, False)):
        model = Network(*network, tokenizer_dir=parts.tokenizer_dir, fast_path=fast_path).eval()
        loaded = minisbert.load(tmp_path / "m", device="cpu", fast=fast)
        assert np.array_equal(model.encode("Hello, World!"), loaded.encode("Hello, World!")), fast
    assert built.fast_path is minisbert.default_fast_path()
