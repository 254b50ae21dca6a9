"""The loader fails loudly, naming the tensor, whenever a checkpoint does not fit the model exactly
or holds a value that is not finite (a NaN or inf weight would make every embedding NaN).

Each test writes a checkpoint with one thing wrong and checks the error names it. (That correct
checkpoints load correctly is shown by the parity tests in tests/encoding/test_encoder.py.)
"""

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from minisbert.encoding.encoder import Encoder
from minisbert.encoding.model import SentenceModel
from minisbert.encoding.weights import (config_from_hf, config_to_hf, load_encoder, load_encoder_weights, name_table,
                                        save_encoder)

from ..conftest import FIXTURES

BERT = {"model_type": "bert", "vocab_size": 30, "hidden_size": 8, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 12}


@pytest.fixture
def saved(tmp_path):
    """A tiny random BERT saved with Hugging Face names; returns (folder, encoder, tensors)."""
    torch.manual_seed(0)
    encoder = Encoder(config_from_hf(BERT))
    save_encoder(encoder, tmp_path)
    return tmp_path, encoder, load_file(tmp_path / "model.safetensors")


def reload_with(folder, tensors):
    save_file(tensors, str(folder / "model.safetensors"))
    return load_encoder(folder)


def test_round_trip_and_hf_names(saved):
    folder, encoder, tensors = saved
    assert "encoder.layer.1.attention.self.query.weight" in tensors
    assert "embeddings.LayerNorm.bias" in tensors
    loaded = load_encoder(folder)
    for (name, p), (_, q) in zip(encoder.named_parameters(), loaded.named_parameters()):
        assert torch.equal(p, q), name


def test_prefix_heads_and_buffers_are_set_aside(saved):
    folder, encoder, tensors = saved
    renamed = {f"bert.{k}": v for k, v in tensors.items()}
    renamed["bert.pooler.dense.weight"] = torch.zeros(8, 8)
    renamed["cls.predictions.bias"] = torch.zeros(30)
    renamed["bert.embeddings.position_ids"] = torch.arange(12)[None]
    loaded = reload_with(folder, renamed)
    assert torch.equal(loaded.layers[0].ffn.output.weight, encoder.layers[0].ffn.output.weight)


def test_old_gamma_beta_names_load(saved):
    folder, encoder, tensors = saved
    renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in tensors.items()}
    loaded = reload_with(folder, renamed)
    assert torch.equal(loaded.embeddings.layer_norm.weight, encoder.embeddings.layer_norm.weight)


def test_missing_tensor_is_named(saved):
    folder, _, tensors = saved
    del tensors["encoder.layer.1.output.dense.bias"]
    with pytest.raises(ValueError, match=r"lacks 1 tensor.*encoder\.layer\.1\.output\.dense\.bias"):
        reload_with(folder, tensors)


def test_unexpected_tensor_is_named(saved):
    folder, _, tensors = saved
    tensors["encoder.layer.2.output.dense.bias"] = torch.zeros(8)  # a third layer the config lacks
    with pytest.raises(ValueError, match=r"unexpected tensor 'encoder\.layer\.2\.output\.dense\.bias'"):
        reload_with(folder, tensors)


def test_shape_mismatch_is_named(saved):
    folder, _, tensors = saved
    tensors["encoder.layer.0.intermediate.dense.weight"] = torch.zeros(8, 16)  # transposed
    with pytest.raises(ValueError, match=r"intermediate\.dense\.weight.*shape \(8, 16\).*\(16, 8\)"):
        reload_with(folder, tensors)


def test_unusable_dtype_is_named(saved):
    folder, _, tensors = saved
    tensors["embeddings.word_embeddings.weight"] = torch.zeros(30, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"word_embeddings\.weight.*dtype torch\.int32"):
        reload_with(folder, tensors)


def test_half_precision_checkpoint_loads_as_float32(saved):
    folder, encoder, tensors = saved
    loaded = reload_with(folder, {k: v.half() for k, v in tensors.items()})
    assert loaded.layers[0].attention.key.weight.dtype == torch.float32
    # every float16 value is a float32 value: loading adds no rounding to the one saving in float16 made
    assert torch.equal(loaded.layers[0].attention.key.weight, encoder.layers[0].attention.key.weight.half().float())


@pytest.mark.parametrize("key, index, value", [
    ("encoder.layer.0.attention.output.dense.weight", (0, 0), float("nan")),
    ("embeddings.word_embeddings.weight", (29, 7), float("inf")),
    ("encoder.layer.1.output.LayerNorm.bias", (3,), float("-inf")),
])
def test_non_finite_weights_are_refused_naming_the_tensor(saved, key, index, value):
    folder, _, tensors = saved
    tensors[key][index] = value
    with pytest.raises(ValueError, match=rf"tensor '{re.escape(key)}' in .* 1 value\(s\) that are not finite "
                                         rf"\(first at index {re.escape(str(index))}: {value}\)"):
        reload_with(folder, tensors)


def test_float64_beyond_float32_range_is_refused(saved):
    """1e39 is finite in float64 but becomes inf in the float32 model: refused too."""
    folder, _, tensors = saved
    tensors = {k: v.double() for k, v in tensors.items()}
    tensors["encoder.layer.0.intermediate.dense.bias"][5] = 1e39
    with pytest.raises(ValueError, match=r"'encoder\.layer\.0\.intermediate\.dense\.bias'.*not finite.*index \(5,\): inf"):
        reload_with(folder, tensors)
    tensors["encoder.layer.0.intermediate.dense.bias"][5] = 1e30  # large but representable: loads
    # as float32's nearest value to it, 1.5e22 (1.5e-8 of it) away
    assert reload_with(folder, tensors).layers[0].ffn.intermediate.bias[5].item() == torch.tensor(1e30).item()


def test_non_finite_dense_layer_is_refused(tmp_path):
    shutil.copytree(FIXTURES / "tiny_st_legacy", tmp_path / "model")
    weights = tmp_path / "model" / "2_Dense" / "model.safetensors"
    tensors = load_file(weights)
    tensors["linear.bias"][2] = float("nan")
    save_file(tensors, str(weights))
    with pytest.raises(ValueError, match=r"tensor 'linear\.bias' in .*2_Dense/model\.safetensors.*not finite"):
        SentenceModel.from_dir(tmp_path / "model", device="cpu")


def test_pickles_are_refused(saved):
    folder, encoder, _ = saved
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not opened")
    with pytest.raises(ValueError, match="pickled PyTorch checkpoint"):
        load_encoder(folder)
    with pytest.raises(ValueError, match="pickled PyTorch checkpoint"):
        load_encoder_weights(encoder, folder / "pytorch_model.bin")


def test_a_sharded_checkpoint_is_named_with_how_to_read_it(saved):
    # It said "no model.safetensors in DIR", where the folder holds the model in shards.
    folder, _, _ = saved
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    with pytest.raises(ValueError, match=r"holds the model in shards \(model.safetensors.index.json\); minisbert reads "
                                         "one model.safetensors"):
        load_encoder(folder)


def test_name_tables_cover_every_parameter_once():
    for model_type, extra in (("bert", {}), ("roberta", {"pad_token_id": 1}),
                              ("distilbert", None)):
        if model_type == "distilbert":
            hf = {"model_type": "distilbert", "vocab_size": 30, "dim": 8, "n_layers": 2, "n_heads": 2,
                  "hidden_dim": 16, "max_position_embeddings": 12}
        else:
            hf = {**BERT, "model_type": model_type, **extra}
        config = config_from_hf(hf)
        table = name_table(config)
        ours = dict(Encoder(config).named_parameters())
        assert sorted(table.values()) == sorted(ours), model_type
        assert len(set(table)) == len(table)


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gpt2"}, "unknown model_type 'gpt2'"),
    ({"hidden_size": 10, "num_attention_heads": 3}, "hidden size 10 is not divisible .* 3"),
    ({"hidden_act": "swish"}, "unsupported activation 'swish'"),
    ({"num_hidden_layers": None}, "lacks the field 'num_hidden_layers'"),
])
def test_config_errors(tmp_path, change, message):
    hf = {**BERT, **change}
    hf = {k: v for k, v in hf.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=message):
        load_encoder(tmp_path)


def test_distilbert_config_is_normalised():
    config = config_from_hf({"model_type": "distilbert", "vocab_size": 30, "dim": 8, "n_layers": 3,
                                    "n_heads": 2, "hidden_dim": 16, "max_position_embeddings": 12,
                                    "activation": "gelu"})
    assert (config.hidden_size, config.num_layers, config.num_heads, config.intermediate_size) == (8, 3, 2, 16)
    assert config.type_vocab_size == 0 and config.layer_norm_eps == 1e-12
    assert config_from_hf(config_to_hf(config)) == config
