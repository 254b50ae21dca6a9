"""Sentence embeddings end to end: model directories, encode(), save(), against sentence-transformers.

tiny_st_dense (sentence-transformers 6 format) and tiny_st_legacy (the classic 2.x format most
published models use) hold the same random weights with max pooling, a Dense layer to 16 dims and
Normalize; their reference embeddings are SentenceTransformer(folder).encode(sentences). The real
all-MiniLM-L6-v2 is checked on 13 sentences (empty, very long, punctuation, non-ASCII ...) and on the
golden values published in REFERENCE.md.
"""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from minisbert.model import SentenceModel

from .conftest import FIXTURES


def reference(name):
    folder = FIXTURES / name
    return folder, load_file(folder / "reference.safetensors"), json.loads((folder / "reference.json").read_text())


@pytest.mark.parametrize("name", ["tiny_st_dense", "tiny_st_legacy"])
def test_sentence_transformers_directory(name):
    folder, ref, info = reference(name)
    model = SentenceModel.from_dir(folder, device="cpu")
    assert (model.pooling, model.normalize_embeddings, model.dimension) == ("max", True, 16)
    assert model.tokenizer.max_seq_length == info["max_seq_length"]
    batch = model.tokenizer(info["sentences"])
    assert torch.equal(batch["input_ids"], ref["input_ids"])
    embeddings = model.encode(info["sentences"])
    assert embeddings.dtype == np.float32 and embeddings.shape == (6, 16)
    assert np.abs(embeddings - ref["embeddings"].numpy()).max() <= 1e-5
    unnormalized = model.encode(info["sentences"], normalize=False)
    assert np.abs(unnormalized - ref["dense"].numpy()).max() <= 1e-5


def test_plain_hugging_face_directory_mean_pools_without_normalizing():
    folder, ref, info = reference("tiny_bert")
    model = SentenceModel.from_dir(folder, device="cpu")
    model.tokenizer.rust.enable_truncation(info["max_length"])
    assert (model.pooling, model.normalize_embeddings) == ("mean", False)
    embeddings = model.encode(info["sentences"])
    assert np.abs(embeddings - ref["mean_pooled"].numpy()).max() <= 1e-5


def test_encode_restores_input_order_across_batches():
    folder, _, info = reference("tiny_st_dense")
    model = SentenceModel.from_dir(folder, device="cpu")
    sentences = info["sentences"]
    one_by_one = np.stack([model.encode([s])[0] for s in sentences])
    batched = model.encode(sentences, batch_size=4)  # sorted by length, two uneven batches
    assert np.abs(batched - one_by_one).max() <= 1e-6
    as_torch = model.encode(sentences, output="torch")
    assert isinstance(as_torch, torch.Tensor) and torch.allclose(as_torch, torch.from_numpy(batched), atol=1e-6)
    assert model.encode([]).shape == (0, 16)


def test_encode_rejects_bad_input():
    model = SentenceModel.from_dir(FIXTURES / "tiny_st_dense", device="cpu")
    with pytest.raises(TypeError, match="single string"):
        model.encode("a sentence")
    with pytest.raises(TypeError, match="text 1 is int"):
        model.encode(["fine", 3])
    with pytest.raises(ValueError, match="for GPUs"):
        model.encode(["x"], dtype="float16")
    with pytest.raises(ValueError, match="batch_size"):
        model.encode(["x"], batch_size=0)


def test_save_round_trip(tmp_path):
    folder, ref, info = reference("tiny_st_legacy")
    model = SentenceModel.from_dir(folder, device="cpu")
    model.save(tmp_path / "saved")
    again = SentenceModel.from_dir(tmp_path / "saved", device="cpu")
    assert np.abs(again.encode(info["sentences"]) - ref["embeddings"].numpy()).max() <= 1e-5
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

    monkeypatch.setattr("minisbert.model.save_encoder", disk_full)
    with pytest.raises(OSError, match="No space left"):
        model.save(tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no staging folder left behind


def test_saved_model_loads_in_sentence_transformers(tmp_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    folder, ref, info = reference("tiny_st_legacy")
    SentenceModel.from_dir(folder, device="cpu").save(tmp_path / "m")
    peer = sentence_transformers.SentenceTransformer(str(tmp_path / "m"), device="cpu")
    assert np.abs(peer.encode(info["sentences"]) - ref["embeddings"].numpy()).max() <= 1e-5


def test_minilm_matches_sentence_transformers(minilm):
    ref = load_file(FIXTURES / "minilm" / "reference.safetensors")
    info = json.loads((FIXTURES / "minilm" / "reference.json").read_text())
    batch = minilm.tokenizer(info["sentences"])
    T = batch["input_ids"].shape[1]
    assert T == 256  # the long sentence is truncated at max_seq_length
    assert torch.equal(batch["input_ids"], ref["input_ids"][:, :T])
    assert torch.equal(batch["attention_mask"], ref["attention_mask"][:, :T])
    embeddings = minilm.encode(info["sentences"])
    assert np.abs(embeddings - ref["embeddings"].numpy()).max() <= 1e-5


def test_minilm_golden_values(minilm):
    """REFERENCE.md section 1, computed with sentence-transformers."""
    assert minilm.tokenizer.token_ids(["A man is eating food."]) == [[101, 1037, 2158, 2003, 5983, 2833, 1012, 102]]
    e = minilm.encode(["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."])
    assert np.allclose(e[0, :6], [0.033242, 0.004406, -0.006277, 0.048379, -0.138702, -0.033617], atol=1e-6)
    assert abs(float(e[0] @ e[1]) - 0.755337) < 1e-6
    assert abs(float(e[0] @ e[2]) - -0.104958) < 1e-6
