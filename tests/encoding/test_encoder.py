"""Parity: minisbert's hand-written encoder computes what Hugging Face transformers computes.

The reference tensors in tests/fixtures/tiny_*/reference.safetensors were made by
tests/fixtures/make_fixtures.py with transformers' BertModel, DistilBertModel and RobertaModel (eager
attention, fp32) on random-weight checkpoints saved from task-head models, so loading must also strip
the `bert.`/`distilbert.`/`roberta.` prefix and set the heads aside. "Correct" means: last hidden states
at every real (unpadded) token, and the pooled vectors, within what two float32 computations of the
same sums in another order differ by (tests/tolerances.py: 2.6e-5 of the largest value, at least 1;
the references were made on another CPU, by other kernels), on a padded batch of sentences of
different lengths, one of them truncated, for the plain encoder and the fast one alike. (That the token ids agree is
tests/encoding/test_tokenizer.py's part.)
"""

import pytest
import torch

from minisbert.encoding.encoder_inputs import position_ids
from minisbert.encoding.fast import tiled_encoder as fast_encoder
from minisbert.encoding.model import SentenceModel
from minisbert.encoding.pooling import pool

from ..conftest import reference
from ..tolerances import encoder_roundings, float32_apart, scale

FAMILIES = ["tiny_bert", "tiny_distilbert", "tiny_roberta"]


def last_hidden_state(model, input_ids, attention_mask, token_type_ids, fast):
    with torch.no_grad():
        if fast:
            return fast_encoder.forward(model.encoder, input_ids, attention_mask, token_type_ids)
        return model.encoder(input_ids, attention_mask, token_type_ids)


@pytest.mark.parametrize("fast", [False, True], ids=["plain", "fast"])
@pytest.mark.parametrize("name", FAMILIES)
def test_last_hidden_state_matches_hugging_face(name, fast):
    folder, ref, _ = reference(name)
    model = SentenceModel.from_dir(folder, device="cpu")
    hidden = last_hidden_state(model, ref["input_ids"], ref["attention_mask"], ref.get("token_type_ids"), fast)
    real = ref["attention_mask"].bool()  # (B, T): compare real tokens only
    expected = ref["last_hidden_state"][real]
    bound = float32_apart(encoder_roundings(model.encoder.config, real.shape[1])) * scale(expected)
    assert (hidden[real] - expected).abs().max() <= bound


@pytest.mark.parametrize("fast", [False, True], ids=["plain", "fast"])
@pytest.mark.parametrize("name", FAMILIES)
def test_pooling_matches_sentence_transformers(name, fast):
    folder, ref, _ = reference(name)
    model = SentenceModel.from_dir(folder, device="cpu")
    hidden = last_hidden_state(model, ref["input_ids"], ref["attention_mask"], ref.get("token_type_ids"), fast)
    roundings = encoder_roundings(model.encoder.config, ref["input_ids"].shape[1])  # pooling's mean included
    for mode in ("mean", "max", "cls"):
        pooled = pool(hidden, ref["attention_mask"], mode)
        expected = ref[f"{mode}_pooled"]
        assert (pooled - expected).abs().max() <= float32_apart(roundings) * scale(expected), mode


@pytest.mark.parametrize("fast", [False, True], ids=["plain", "fast"])
def test_second_segment_uses_token_type_one(fast):
    """Pairs are the only inputs that reach row 1 of BERT's token-type table."""
    folder, ref, info = reference("tiny_bert")
    model = SentenceModel.from_dir(folder, device="cpu")
    encodings = model.tokenizer.rust.encode_batch([tuple(pair) for pair in info["pairs"]])
    assert [e.ids for e in encodings] == [row[mask.bool()].tolist() for row, mask in
                                          zip(ref["pair_input_ids"], ref["pair_attention_mask"])]
    hidden = last_hidden_state(model, ref["pair_input_ids"], ref["pair_attention_mask"],
                               ref["pair_token_type_ids"], fast)
    real = ref["pair_attention_mask"].bool()
    expected = ref["pair_last_hidden_state"][real]
    bound = float32_apart(encoder_roundings(model.encoder.config, real.shape[1])) * scale(expected)
    assert (hidden[real] - expected).abs().max() <= bound


def test_roberta_positions_skip_padding():
    folder, ref, _ = reference("tiny_roberta")
    model = SentenceModel.from_dir(folder, device="cpu")
    assert model.encoder.config.positions_after_pad
    assert torch.equal(position_ids(ref["input_ids"], model.encoder.config), ref["position_ids"])


def test_bert_and_distilbert_number_positions_from_zero():
    for name in ("tiny_bert", "tiny_distilbert"):
        folder, ref, _ = reference(name)
        config = SentenceModel.from_dir(folder, device="cpu").encoder.config
        assert not config.positions_after_pad, name
        assert torch.equal(position_ids(ref["input_ids"], config)[0], torch.arange(ref["input_ids"].shape[1]))
