"""Sentence embeddings end to end: model directories, encode(), save(), against sentence-transformers.

tiny_st_dense (sentence-transformers 6 format) and tiny_st_legacy (the classic 2.x format most
published models use) hold the same random weights with max pooling, a Dense layer to 16 dims and
Normalize; their reference embeddings are SentenceTransformer(folder).encode(sentences). The real
all-MiniLM-L6-v2 is checked on 13 sentences (empty, very long, punctuation, non-ASCII ...) and on
golden values computed with sentence-transformers (stored in tests/fixtures/minilm/reference.json).
Each comparison with sentence-transformers holds for the plain path and the fast path alike.

encode() takes one text or any iterable of texts and returns exactly one row per text, in order, in
the forms sentence-transformers' encode() returns; anything else is refused with an error naming what
was given. similarity() compares embeddings by the function the model directory names.
A damaged model directory (a safetensors file cut short; config.json, tokenizer.json or modules.json
that is not JSON, lacks a field or has one of the wrong type; a tokenizer larger than the embedding
table) is refused with one message naming the file and what is wrong; so is a text that is not
valid Unicode (a lone surrogate), by its position.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import minisbert
from minisbert.encoding.fast.batching import FAST_PATH
from minisbert.encoding.model import SentenceModel
from minisbert.porting.sentence_transformer import SentenceTransformer

from ..conftest import FIXTURES, assert_one_clear_line, reference, run_script
from ..tolerances import embeddings_apart, float32_apart, scale


BOTH_PATHS = pytest.mark.parametrize("fast", [False, True], ids=["plain", "fast"])


def close(ours, expected, model) -> bool:
    """Within what two float32 computations of the model's embeddings may differ (tests/tolerances.py):
    the references were made by sentence-transformers on another CPU, with other kernels."""
    return np.abs(ours - expected).max() <= embeddings_apart(model) * scale(expected)


@BOTH_PATHS
@pytest.mark.parametrize("name", ["tiny_st_dense", "tiny_st_legacy"])
def test_sentence_transformers_directory(name, fast):
    folder, ref, info = reference(name)
    model = SentenceModel.from_dir(folder, device="cpu", fast_path=FAST_PATH if fast else None)
    assert (model.pooling, model.normalize_embeddings, model.dimension) == ("max", True, 16)
    assert model.tokenizer.max_seq_length == info["max_seq_length"]
    batch = model.tokenizer(info["sentences"])
    assert torch.equal(batch["input_ids"], ref["input_ids"])
    embeddings = model.encode(info["sentences"])
    assert embeddings.dtype == np.float32 and embeddings.shape == (6, 16)
    assert close(embeddings, ref["embeddings"].numpy(), model)
    # As in sentence-transformers, normalize_embeddings=False leaves the directory's Normalize module on;
    # the Dense layer's own output is what the model gives without that module.
    assert np.abs(model.encode(info["sentences"], normalize_embeddings=False) - embeddings).max() == 0
    model.normalize_embeddings = False
    assert close(model.encode(info["sentences"]), ref["dense"].numpy(), model)
    normalized = model.encode(info["sentences"], normalize_embeddings=True)
    assert close(normalized, ref["embeddings"].numpy(), model)


@BOTH_PATHS
def test_plain_hugging_face_directory_mean_pools_without_normalizing(fast):
    folder, ref, info = reference("tiny_bert")
    model = SentenceModel.from_dir(folder, device="cpu", fast_path=FAST_PATH if fast else None)
    model.tokenizer.max_seq_length = info["max_length"]
    assert (model.pooling, model.normalize_embeddings) == ("mean", False)
    embeddings = model.encode(info["sentences"])
    assert close(embeddings, ref["mean_pooled"].numpy(), model)


LIMITS = json.loads((FIXTURES / "hf_limits" / "reference.json").read_text())["folders"]


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_a_directory_as_transformers_saves_it_encodes_at_most_its_positions(name):
    """tests/fixtures/hf_limits: BERT, DistilBERT and RoBERTa saved by transformers with the limit
    absent, huge (1e30, what save_pretrained writes for a tokenizer that had none) and 512, above the
    positions. max_seq_length is the smaller of the limit and the positions the model can use, as in
    sentence-transformers, which counts RoBERTa's two unused rows as positions (18 where 16 are usable)."""
    expected = LIMITS[name]
    model = minisbert.load(FIXTURES / "hf_limits" / name, device="cpu")
    usable = expected["max_position_embeddings"] - (2 if name.startswith("roberta") else 0)
    assert model.max_seq_length == usable == min(expected["st_max_seq_length"], usable)
    long_text = " ".join(["hello world"] * 40)
    assert len(model.tokenizer.token_ids([long_text])[0]) == usable  # cut to the positions, no index error
    assert model.encode(long_text).shape == (8,)


def test_encode_restores_input_order_across_batches():
    folder, _, info = reference("tiny_st_dense")
    model = SentenceModel.from_dir(folder, device="cpu")
    sentences = info["sentences"]
    one_by_one = np.stack([model.encode([s])[0] for s in sentences])
    batched = model.encode(sentences, batch_size=4)  # sorted by length, two uneven batches
    assert close(batched, one_by_one, model)  # other padding lengths: the kernels add in other orders
    assert model.encode([]).shape == (0, 16)


def test_encode_returns_what_sentence_transformers_returns():
    """A numpy array by default, one tensor with convert_to_tensor, a list of tensors with neither,
    and one embedding for one str, all float32."""
    folder, _, info = reference("tiny_st_dense")
    model = SentenceModel.from_dir(folder, device="cpu")
    sentences = info["sentences"]
    expected = model.encode(sentences)
    assert isinstance(expected, np.ndarray) and expected.dtype == np.float32 and expected.shape == (6, 16)
    as_tensor = model.encode(sentences, convert_to_tensor=True, convert_to_numpy=True)  # the tensor wins
    assert isinstance(as_tensor, torch.Tensor) and as_tensor.dtype == torch.float32
    assert torch.equal(as_tensor, torch.from_numpy(expected))
    as_list = model.encode(sentences, convert_to_numpy=False)
    assert isinstance(as_list, list) and len(as_list) == 6
    assert all(isinstance(row, torch.Tensor) and row.shape == (16,) for row in as_list)
    assert torch.equal(torch.stack(as_list), torch.from_numpy(expected))
    one = model.encode(sentences[2])
    assert isinstance(one, np.ndarray) and one.shape == (16,)
    assert close(one, expected[2], model)
    assert model.encode(sentences[2], convert_to_tensor=True).shape == (16,)


def test_similarity_uses_the_function_the_directory_names(tmp_path):
    folder, _, info = reference("tiny_st_legacy")
    model = SentenceTransformer.from_dir(folder, device="cpu")
    assert model.similarity_fn_name == "cosine"  # no config_sentence_transformers.json: the default
    a, b = model.encode(info["sentences"][:2]), model.encode(info["sentences"][2:])
    apart = float32_apart(2 * model.dimension)  # two sums over D (norms, then the product) of unit rows
    assert torch.allclose(model.similarity(a, b), torch.from_numpy(a @ b.T), rtol=0, atol=apart)
    model.similarity_fn_name = "euclidean"
    model.save(tmp_path / "m")
    again = SentenceTransformer.from_dir(tmp_path / "m", device="cpu")
    assert again.similarity_fn_name == "euclidean"
    assert torch.allclose(again.similarity(a, b), -torch.cdist(torch.from_numpy(a), torch.from_numpy(b)),
                          rtol=0, atol=apart)
    # Edited by hand, the file is refused as not the one saved; the same content in a directory that
    # another tool wrote (no record of its files: here, the fixture's weights) is read, and its value checked.
    (tmp_path / "m" / "config_sentence_transformers.json").write_text('{"similarity_fn_name": "cosine_sim"}')
    with pytest.raises(ValueError, match="config_sentence_transformers.json is not the file saved"):
        SentenceTransformer.from_dir(tmp_path / "m", device="cpu")
    shutil.copyfile(folder / "model.safetensors", tmp_path / "m" / "model.safetensors")
    with pytest.raises(ValueError, match="similarity_fn_name 'cosine_sim' is not one of"):
        SentenceTransformer.from_dir(tmp_path / "m", device="cpu")
    (tmp_path / "m" / "config_sentence_transformers.json").write_text('["cosine"]')
    with pytest.raises(ValueError, match="config_sentence_transformers.json must hold a JSON object, got list"):
        SentenceTransformer.from_dir(tmp_path / "m", device="cpu")


@pytest.mark.parametrize("make_texts", [
    lambda texts: texts,
    tuple,
    lambda texts: (text for text in texts),  # a generator: read once
    lambda texts: iter(texts),
    lambda texts: map(str.strip, texts),
    np.array,  # numpy strings are str
    lambda texts: {text: None for text in texts}.keys(),
], ids=["list", "tuple", "generator", "iterator", "map", "numpy", "dict-keys"])
def test_encode_takes_any_iterable_of_texts(make_texts):
    folder, ref, info = reference("tiny_st_dense")
    model = SentenceModel.from_dir(folder, device="cpu")
    texts = [s.strip() for s in info["sentences"]]  # distinct already; strip changes none of them
    embeddings = model.encode(make_texts(texts))
    assert embeddings.shape == (len(texts), 16)
    assert np.abs(embeddings - model.encode(texts)).max() == 0


@pytest.mark.parametrize("texts, error, message", [
    (b"a sentence", TypeError, "single bytes"),
    (["fine", 3], TypeError, "text 1 is int"),
    (["fine", None], TypeError, "text 1 is NoneType"),
    ([b"bytes"], TypeError, "text 0 is bytes"),
    ((t for t in ["fine", ["nested"]]), TypeError, "text 1 is list"),
    ({"id1": "a text"}, TypeError, "got a dict; pass list"),
    (3, TypeError, "got int: 3"),
    (None, TypeError, "got NoneType"),
])
def test_encode_refuses_what_is_not_an_iterable_of_texts(texts, error, message):
    model = SentenceModel.from_dir(FIXTURES / "tiny_st_dense", device="cpu")
    with pytest.raises(error, match=message):
        model.encode(texts)


@pytest.mark.parametrize("arguments, message", [
    ({"dtype": "float16"}, "for GPUs"),
    ({"dtype": "int4"}, "dtype must be one of"),
    ({"batch_size": 0}, "batch_size must be a positive int, got 0"),
    ({"batch_size": 2.5}, "batch_size must be a positive int, got 2.5"),
])
def test_encode_refuses_bad_options(arguments, message):
    model = SentenceModel.from_dir(FIXTURES / "tiny_st_dense", device="cpu")
    with pytest.raises(ValueError, match=message):
        model.encode(["x"], **arguments)


@BOTH_PATHS
def test_encode_leaves_the_model_in_its_mode_even_when_it_fails(fast, monkeypatch):
    folder, _, info = reference("tiny_st_dense")
    model = SentenceModel.from_dir(folder, device="cpu", fast_path=FAST_PATH if fast else None)
    model.train()
    model.encode(info["sentences"])
    assert model.training and all(m.training for m in model.modules())

    def failing(x):
        raise RuntimeError("injected failure in the Dense layer")

    monkeypatch.setattr(model.dense.activation, "forward", failing)  # both paths run the activation module
    with pytest.raises(RuntimeError, match="injected failure"):
        model.encode(info["sentences"])
    assert model.training and all(m.training for m in model.modules())
    model.eval()
    with pytest.raises(RuntimeError, match="injected failure"):
        model.encode(info["sentences"])
    assert not any(m.training for m in model.modules())


def test_save_round_trip(tmp_path):
    folder, ref, info = reference("tiny_st_legacy")
    model = SentenceModel.from_dir(folder, device="cpu")
    model.save(tmp_path / "saved")
    again = SentenceModel.from_dir(tmp_path / "saved", device="cpu")
    assert close(again.encode(info["sentences"]), ref["embeddings"].numpy(), again)
    modules = json.loads((tmp_path / "saved" / "modules.json").read_text())
    assert [m["path"] for m in modules] == ["", "1_Pooling", "2_Dense", "3_Normalize"]
    model.save(tmp_path / "saved")  # saving over an earlier save replaces it whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]


def test_save_failure_leaves_previous_model(tmp_path, monkeypatch):
    model = SentenceModel.from_dir(FIXTURES / "tiny_st_legacy", device="cpu")
    model.save(tmp_path / "m")
    before = (tmp_path / "m" / "model.safetensors").read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("minisbert.encoding.st_directory.save_encoder_weights", disk_full)
    with pytest.raises(OSError, match="No space left"):
        model.save(tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no staging folder left behind


@pytest.mark.parametrize("load", [lambda folder: SentenceModel.from_dir(folder, device="cpu"),
                                  lambda folder: minisbert.load(folder, device="cpu")])
def test_a_save_never_removes_what_it_did_not_write(tmp_path, monkeypatch, load):
    # A save replaces its folder whole (atomic). It once replaced any folder: a user's notes and data
    # (saving to runs/x for runs/x/final) were removed, a link became a folder with the link left
    # hidden beside it, and "." had no name. Now only an empty folder or one an earlier save filled
    # alone is replaced; anything else is refused and left as it was.
    model = load(FIXTURES / "tiny_st_legacy")
    user = tmp_path / "user"
    (user / "data").mkdir(parents=True)
    (user / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"user holds what no minisbert save wrote there \(data, notes.txt\)"):
        model.save(user)
    assert sorted(p.name for p in user.iterdir()) == ["data", "notes.txt"]
    model.save(tmp_path / "saved")
    model.save(tmp_path / "saved")  # an earlier save alone: replaced
    (tmp_path / "link").symlink_to(tmp_path / "saved")
    model.save(tmp_path / "link")  # through a link: the folder it names
    assert (tmp_path / "link").is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["link", "saved", "user"]
    (tmp_path / "saved" / "README.md").write_text("a card written beside the model")
    with pytest.raises(ValueError, match=r"saved holds what no minisbert save wrote there \(README.md\)"):
        model.save(tmp_path / "saved")
    (tmp_path / "empty").mkdir()
    model.save(tmp_path / "empty")
    assert load(tmp_path / "empty").encode(["a"]).shape == model.encode(["a"]).shape
    with pytest.raises(ValueError, match="is a file, not a folder"):
        model.save(user / "notes.txt")
    monkeypatch.chdir(tmp_path / "empty")
    for path in (".", tmp_path):
        with pytest.raises(ValueError, match="holds the working folder"):
            model.save(path)


def test_do_lower_case_in_sentence_bert_config_lowercases_each_text_first(tmp_path):
    # sentence-transformers 6.3 (in the peer environment, on these folders) lowercases the texts before its
    # tokenizer where a folder's modules.json names its Transformer and sentence_bert_config.json says
    # do_lower_case, and leaves them as they are in a plain Hugging Face folder with the same file. minisbert
    # once read only max_seq_length there, and a cased tokenizer saw the capitals.
    plain = tmp_path / "plain"
    shutil.copytree(FIXTURES / "tiny_roberta", plain)  # a cased tokenizer
    (plain / "sentence_bert_config.json").write_text(json.dumps({"do_lower_case": True}))
    layout = tmp_path / "layout"
    shutil.copytree(plain, layout)
    (layout / "1_Pooling").mkdir()
    (layout / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                                  "pooling_mode_mean_tokens": True}))
    (layout / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    cased, lowered = minisbert.load(plain, device="cpu"), minisbert.load(layout, device="cpu")
    texts = ["The Man is eating FOOD .", "ÉTÉ à Paris"]
    assert not np.array_equal(cased.encode(texts), cased.encode([text.lower() for text in texts]))
    assert np.array_equal(lowered.encode(texts), cased.encode([text.lower() for text in texts]))
    lowered.save(tmp_path / "saved")  # the lowercasing is kept in the saved tokenizer.json
    assert np.array_equal(minisbert.load(tmp_path / "saved", device="cpu").encode(texts), lowered.encode(texts))
    (layout / "sentence_bert_config.json").write_text(json.dumps({"do_lower_case": "yes"}))
    with pytest.raises(ValueError, match="do_lower_case .* must be true or false, got 'yes'"):
        minisbert.load(layout, device="cpu")


def test_saved_model_loads_in_sentence_transformers(tmp_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    folder, ref, info = reference("tiny_st_legacy")
    model = SentenceModel.from_dir(folder, device="cpu")
    model.save(tmp_path / "m")
    peer = sentence_transformers.SentenceTransformer(str(tmp_path / "m"), device="cpu")
    assert close(peer.encode(info["sentences"]), ref["embeddings"].numpy(), model)


@BOTH_PATHS
def test_minilm_matches_sentence_transformers(minilm, fast):
    _, ref, info = reference("minilm")
    batch = minilm.tokenizer(info["sentences"])
    T = batch["input_ids"].shape[1]
    assert T == 256  # the long sentence is truncated at max_seq_length
    assert torch.equal(batch["input_ids"], ref["input_ids"][:, :T])
    assert torch.equal(batch["attention_mask"], ref["attention_mask"][:, :T])
    embeddings = minilm.encode(info["sentences"], fast=fast)
    assert close(embeddings, ref["embeddings"].numpy(), minilm)


def test_minilm_golden_values(minilm):
    """Values computed with sentence-transformers, stored as `golden` in tests/fixtures/minilm/reference.json."""
    golden = reference("minilm")[2]["golden"]
    assert minilm.tokenizer.token_ids([golden["sentence"]]) == [golden["input_ids"]]
    e = minilm.encode([golden["sentence"], "A man is eating a piece of bread.", "The girl is carrying a baby."])
    # Published to 6 decimals (off by up to 5e-7), and computed in float32 by other kernels elsewhere.
    bound = 5e-7 + embeddings_apart(minilm)
    assert np.abs(e[0, :6] - golden["first_six"]).max() <= bound
    assert abs(float(e[0] @ e[1]) - golden["cosine_to_sentence_1"]) <= bound + float32_apart(minilm.dimension)
    assert abs(float(e[0] @ e[2]) - golden["cosine_to_sentence_2"]) <= bound + float32_apart(minilm.dimension)


# ---- damaged model directories: one message naming the file and what is wrong -----------------


def cut_in_half(path: Path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def edit_json(name: str, change):
    def edit(folder: Path):
        data = json.loads((folder / name).read_text())
        (folder / name).write_text(json.dumps(change(data)))
    return edit


def grow_vocabulary(tokenizer: dict) -> dict:
    vocab = tokenizer["model"]["vocab"]
    vocab.update({f"extra{i}": len(vocab) + i for i in range(3)})
    return tokenizer


DAMAGES = [
    ("model.safetensors cut short", lambda f: cut_in_half(f / "model.safetensors"),
     "model.safetensors is not a readable safetensors file"),
    ("dense weights cut short", lambda f: cut_in_half(f / "2_Dense" / "model.safetensors"),
     "2_Dense/model.safetensors is not a readable safetensors file"),
    ("config.json not JSON", lambda f: (f / "config.json").write_text('{"model_type": "bert",'),
     "config.json line 1 column 23: not valid JSON"),
    ("config.json a list", lambda f: (f / "config.json").write_text("[]"),
     "config.json: config.json must hold a JSON object"),
    ("a field missing", edit_json("config.json", lambda c: {k: v for k, v in c.items() if k != "hidden_size"}),
     "config.json: config.json of a bert model lacks the field 'hidden_size'"),
    ("a field of the wrong type", edit_json("config.json", lambda c: {**c, "hidden_size": "32"}),
     "config.json: config field hidden_size must be int, got '32'"),
    ("a bool for a number", edit_json("config.json", lambda c: {**c, "layer_norm_eps": True}),
     "config.json: config field layer_norm_eps must be float, got True"),
    ("a decoder's config", edit_json("config.json", lambda c: {**c, "is_decoder": True}),
     "config.json sets is_decoder: a decoder's attention"),  # was read as an encoder: 0.03 from sentence-transformers
    ("pad token outside the table", edit_json("config.json", lambda c: {**c, "pad_token_id": 1000}),
     "config.json: config field pad_token_id 1000 is not a row of the 46-row token embedding table"),
    ("tokenizer.json not a tokenizer", lambda f: (f / "tokenizer.json").write_text('{"version": 1}'),
     "tokenizer.json is not a tokenizer the tokenizers package can read"),
    ("tokenizer larger than the table", edit_json("tokenizer.json", grow_vocabulary),
     "has 49 tokens but the model's embedding table (vocab_size in config.json) has 46 rows"),
    ("modules.json not JSON", lambda f: (f / "modules.json").write_text("[{"),
     "modules.json line 1 column 3: not valid JSON"),
    ("modules.json path not a string", edit_json("modules.json", lambda m: [{**m[0], "path": 0}, *m[1:]]),
     "modules.json must hold a list of modules"),
    # sentence-transformers runs any chain; minisbert's is Transformer, Pooling, one Dense, Normalize: read
    # as that, a second Dense was dropped and a Normalize before the Dense moved after it (other embeddings).
    ("a second Dense", edit_json("modules.json", lambda m: [*m[:3], m[2], *m[3:]]),
     "modules.json chains ['Transformer', 'Pooling', 'Dense', 'Dense', 'Normalize']; minisbert computes"),
    ("Normalize before Dense", edit_json("modules.json", lambda m: [m[0], m[1], m[3], m[2]]),
     "modules.json chains ['Transformer', 'Pooling', 'Normalize', 'Dense']"),
    ("max_seq_length not an int", edit_json("sentence_bert_config.json", lambda c: {**c, "max_seq_length": "128"}),
     "max_seq_length (sentence_bert_config.json) or model_max_length (tokenizer_config.json) must be an int"),
]


@pytest.mark.parametrize("damage, message", [d[1:] for d in DAMAGES], ids=[d[0] for d in DAMAGES])
def test_a_damaged_model_directory_is_named_with_what_is_wrong(damage, message, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(FIXTURES / "tiny_st_dense", folder)
    damage(folder)
    with pytest.raises(ValueError) as refused:
        minisbert.load(folder, device="cpu")
    assert message in str(refused.value)
    assert str(folder) in str(refused.value)


@pytest.mark.parametrize("damage, message", [DAMAGES[0][1:], DAMAGES[5][1:]], ids=[DAMAGES[0][0], DAMAGES[5][0]])
def test_evaluate_py_names_a_damaged_model_in_one_line(damage, message, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(FIXTURES / "tiny_st_dense", folder)
    damage(folder)
    finished = run_script("evaluate.py", "--model", folder, "--output", tmp_path / "out.json")
    assert_one_clear_line(finished, message)
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("fast", [True, False])
def test_encode_names_a_text_that_is_not_valid_unicode(fast):
    model = SentenceModel.from_dir(FIXTURES / "tiny_st_dense", device="cpu", fast_path=FAST_PATH if fast else None)
    with pytest.raises(ValueError, match=r"text 2 is not valid Unicode: character 4 is '\\ud800' \(surrogates not allowed\)"):
        model.encode(["fine", "also fine", "bad \ud800 text"])
