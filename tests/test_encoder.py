"""Parity: minisbert's hand-written encoder computes what Hugging Face transformers computes.

The reference tensors in tests/fixtures/tiny_*/reference.safetensors were made by
tests/fixtures/make_fixtures.py with transformers' BertModel, DistilBertModel and RobertaModel (eager
attention, fp32) on random-weight checkpoints saved from task-head models, so loading must also strip
the `bert.`/`distilbert.`/`roberta.` prefix and set the heads aside. "Correct" means: the same token
ids, and last hidden states within 1e-5 at every real (unpadded) token, on a padded batch of
sentences of different lengths, one of them truncated.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from minisbert.model import SentenceModel
from minisbert.pooling import pool

from .conftest import FIXTURES

FAMILIES = ["tiny_bert", "tiny_distilbert", "tiny_roberta"]


def reference(name):
    folder = FIXTURES / name
    return folder, load_file(folder / "reference.safetensors"), json.loads((folder / "reference.json").read_text())


@pytest.mark.parametrize("name", FAMILIES)
def test_tokenizer_matches_hugging_face(name):
    folder, ref, info = reference(name)
    model = SentenceModel.from_dir(folder, device="cpu")
    model.tokenizer.max_seq_length = info["max_length"]
    model.tokenizer.rust.enable_truncation(info["max_length"])
    batch = model.tokenizer(info["sentences"])
    assert torch.equal(batch["input_ids"], ref["input_ids"])
    assert torch.equal(batch["attention_mask"], ref["attention_mask"])


@pytest.mark.parametrize("fused", [False, True], ids=["written-out", "fused"])
@pytest.mark.parametrize("name", FAMILIES)
def test_last_hidden_state_matches_hugging_face(name, fused):
    folder, ref, _ = reference(name)
    model = SentenceModel.from_dir(folder, device="cpu", fused=fused)
    with torch.no_grad():
        hidden = model.encoder(ref["input_ids"], ref["attention_mask"], ref.get("token_type_ids"))
    real = ref["attention_mask"].bool()  # (B, T): compare real tokens only
    assert (hidden[real] - ref["last_hidden_state"][real]).abs().max() <= 1e-5


@pytest.mark.parametrize("name", FAMILIES)
def test_pooling_matches_sentence_transformers(name):
    folder, ref, _ = reference(name)
    model = SentenceModel.from_dir(folder, device="cpu", fused=False)
    with torch.no_grad():
        hidden = model.encoder(ref["input_ids"], ref["attention_mask"], ref.get("token_type_ids"))
    for mode in ("mean", "max", "cls"):
        pooled = pool(hidden, ref["attention_mask"], mode)
        assert (pooled - ref[f"{mode}_pooled"]).abs().max() <= 1e-5, mode


def test_second_segment_uses_token_type_one():
    """Pairs are the only inputs that reach row 1 of BERT's token-type table."""
    folder, ref, info = reference("tiny_bert")
    model = SentenceModel.from_dir(folder, device="cpu", fused=False)
    encodings = model.tokenizer.rust.encode_batch([tuple(pair) for pair in info["pairs"]])
    assert [e.ids for e in encodings] == [row[mask.bool()].tolist() for row, mask in
                                          zip(ref["pair_input_ids"], ref["pair_attention_mask"])]
    with torch.no_grad():
        hidden = model.encoder(ref["pair_input_ids"], ref["pair_attention_mask"], ref["pair_token_type_ids"])
    real = ref["pair_attention_mask"].bool()
    assert (hidden[real] - ref["pair_last_hidden_state"][real]).abs().max() <= 1e-5


def test_roberta_positions_skip_padding():
    folder, ref, _ = reference("tiny_roberta")
    model = SentenceModel.from_dir(folder, device="cpu")
    assert torch.equal(model.encoder.embeddings.position_ids(ref["input_ids"]), ref["position_ids"])
