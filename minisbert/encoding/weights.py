"""Loading and saving encoder weights in Hugging Face's safetensors layout.

The three families store the same tensors under different names. `NAME_TABLE` below maps each of
minisbert's parameter names to the checkpoint name in BERT, DistilBERT and RoBERTa, side by side; it
is the only place those names appear. Loading follows three rules:

1. Keys are normalised first: a task head's prefix (`bert.`, `distilbert.`, `roberta.`) is stripped,
   old TensorFlow-era `gamma`/`beta` become `weight`/`bias`, and tensors sentence embeddings do not use
   (`pooler.*`, `cls.*`, `lm_head.*`, `vocab_*`, buffers such as `*.position_ids`) are set aside.
2. Every parameter is filled with NaN before loading and must be written exactly once; a missing
   tensor, an unexpected tensor, a shape mismatch, an unusable dtype or a value that is not finite
   (NaN, inf, or beyond float32's range) raises an error that names the tensor (the MLAB loader's
   discipline): a model with one non-finite weight would embed every text as NaN.
3. Nothing is unpickled: `.bin`/`.pt` checkpoints are refused (a pickle can run arbitrary code).

`config.json` names the model's shape differently in each family too: `config_from_hf` reads any of
the three into EncoderConfig (encoding/config.py), so the model code never asks which family it is running,
and `config_to_hf` writes the family's own spelling back for saving.

Linear weights are stored (out_features, in_features) by both Hugging Face and torch, so they copy
as they are. Square matrices would load silently transposed if that were wrong, which is why the
parity tests compare outputs and not only shapes.

Command line: `python -m minisbert.encoding.weights fetch NAME [--dir weights/]` (see common/hub.py).
Checked in tests/encoding/test_weights.py.
"""

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .config import FAMILIES, EncoderConfig
from .encoder import Encoder
from ..common.fileio import DIGEST_KEY, check_digest, read_json, write_json, write_safetensors

# minisbert name                  BERT (and RoBERTa)                     DistilBERT
EMBEDDING_NAMES = [
    ("embeddings.word_embeddings", "embeddings.word_embeddings", "embeddings.word_embeddings"),
    ("embeddings.position_embeddings", "embeddings.position_embeddings", "embeddings.position_embeddings"),
    ("embeddings.token_type_embeddings", "embeddings.token_type_embeddings", None),
    ("embeddings.layer_norm", "embeddings.LayerNorm", "embeddings.LayerNorm"),
]
LAYER_NAMES = [  # {i} is the block number
    ("layers.{i}.attention.query", "encoder.layer.{i}.attention.self.query", "transformer.layer.{i}.attention.q_lin"),
    ("layers.{i}.attention.key", "encoder.layer.{i}.attention.self.key", "transformer.layer.{i}.attention.k_lin"),
    ("layers.{i}.attention.value", "encoder.layer.{i}.attention.self.value", "transformer.layer.{i}.attention.v_lin"),
    ("layers.{i}.attention.output", "encoder.layer.{i}.attention.output.dense", "transformer.layer.{i}.attention.out_lin"),
    ("layers.{i}.attention_norm", "encoder.layer.{i}.attention.output.LayerNorm", "transformer.layer.{i}.sa_layer_norm"),
    ("layers.{i}.ffn.intermediate", "encoder.layer.{i}.intermediate.dense", "transformer.layer.{i}.ffn.lin1"),
    ("layers.{i}.ffn.output", "encoder.layer.{i}.output.dense", "transformer.layer.{i}.ffn.lin2"),
    ("layers.{i}.output_norm", "encoder.layer.{i}.output.LayerNorm", "transformer.layer.{i}.output_layer_norm"),
]
COLUMN = {"bert": 1, "roberta": 1, "distilbert": 2}

FAMILY_PREFIXES = ("bert.", "distilbert.", "roberta.")
IGNORED_PREFIXES = ("pooler.", "cls.", "lm_head.", "vocab_", "qa_outputs.", "classifier.", "pre_classifier.")
IGNORED_BUFFERS = (".position_ids", ".token_type_ids")  # index buffers some versions saved
LOADABLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def config_from_hf(hf: dict) -> EncoderConfig:
    """Read a Hugging Face `config.json` dict of model_type bert, distilbert or roberta. DistilBERT
    says `dim`, `n_layers`, `n_heads`, `hidden_dim` and `activation` where BERT and RoBERTa say
    `hidden_size`, `num_hidden_layers`, `num_attention_heads`, `intermediate_size` and `hidden_act`;
    BERT and RoBERTa read `layer_norm_eps`, DistilBERT's is fixed at 1e-12 and absent from its config."""
    if not isinstance(hf, dict):
        raise ValueError(f"config.json must hold a JSON object of fields, got {type(hf).__name__}")
    family = hf.get("model_type")
    if family not in FAMILIES:
        raise ValueError(
            f"unknown model_type {family!r} in config.json; minisbert supports {FAMILIES}"
        )
    for field in ("is_decoder", "add_cross_attention"):  # a decoder attends to earlier tokens only
        if hf.get(field):
            raise ValueError(f"config.json sets {field}: a decoder's attention, which minisbert's encoder (every "
                             "token attending to every other) does not compute")
    try:
        if family == "distilbert":
            return EncoderConfig(
                family=family,
                vocab_size=hf["vocab_size"],
                hidden_size=hf["dim"],
                num_layers=hf["n_layers"],
                num_heads=hf["n_heads"],
                intermediate_size=hf["hidden_dim"],
                max_position_embeddings=hf["max_position_embeddings"],
                type_vocab_size=0,
                layer_norm_eps=1e-12,
                activation=hf.get("activation", "gelu"),
                pad_token_id=hf.get("pad_token_id", 0),
                hidden_dropout=hf.get("dropout", 0.1),
                attention_dropout=hf.get("attention_dropout", 0.1),
                positions_after_pad=False,
            )
        return EncoderConfig(
            family=family,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            intermediate_size=hf["intermediate_size"],
            max_position_embeddings=hf["max_position_embeddings"],
            type_vocab_size=hf.get("type_vocab_size", 2),
            layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
            activation=hf.get("hidden_act", "gelu"),
            pad_token_id=hf.get("pad_token_id", 1 if family == "roberta" else 0),
            hidden_dropout=hf.get("hidden_dropout_prob", 0.1),
            attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
            positions_after_pad=family == "roberta",  # fairseq's numbering, kept by RobertaModel
        )
    except KeyError as missing:
        raise ValueError(f"config.json of a {family} model lacks the field {missing}") from None

def config_to_hf(config: EncoderConfig) -> dict:
    """The family's own `config.json` fields, so Hugging Face tools can load a saved model."""
    if config.family == "distilbert":
        return {
            "model_type": "distilbert",
            "architectures": ["DistilBertModel"],
            "vocab_size": config.vocab_size,
            "dim": config.hidden_size,
            "n_layers": config.num_layers,
            "n_heads": config.num_heads,
            "hidden_dim": config.intermediate_size,
            "max_position_embeddings": config.max_position_embeddings,
            "activation": config.activation,
            "pad_token_id": config.pad_token_id,
            "dropout": config.hidden_dropout,
            "attention_dropout": config.attention_dropout,
            "sinusoidal_pos_embds": False,
        }
    architecture = "BertModel" if config.family == "bert" else "RobertaModel"
    return {
        "model_type": config.family,
        "architectures": [architecture],
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "layer_norm_eps": config.layer_norm_eps,
        "hidden_act": config.activation,
        "pad_token_id": config.pad_token_id,
        "hidden_dropout_prob": config.hidden_dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "position_embedding_type": "absolute",
    }


def name_table(config: EncoderConfig) -> dict:
    """{checkpoint tensor name: minisbert parameter name} for this config's family and depth."""
    column = COLUMN[config.family]
    modules = [(row[0], row[column]) for row in EMBEDDING_NAMES if row[column] is not None]
    for i in range(config.num_layers):
        modules += [(row[0].format(i=i), row[column].format(i=i)) for row in LAYER_NAMES]
    table = {}
    for ours, theirs in modules:
        suffixes = ("weight",) if "embeddings" in ours and "norm" not in ours else ("weight", "bias")
        for suffix in suffixes:
            table[f"{theirs}.{suffix}"] = f"{ours}.{suffix}"
    return table


def normalise_key(key: str):
    """The checkpoint key as the name table spells it, or None for a tensor we do not use."""
    for prefix in FAMILY_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    if key.startswith(IGNORED_PREFIXES) or key.endswith(IGNORED_BUFFERS):
        return None
    if key.endswith(".gamma"):
        key = key[: -len("gamma")] + "weight"
    elif key.endswith(".beta"):
        key = key[: -len("beta")] + "bias"
    return key


def refuse_pickle(path: Path):
    raise ValueError(
        f"{path} is a pickled PyTorch checkpoint; minisbert loads only safetensors because unpickling "
        "can run arbitrary code. Convert it once where you trust the file, e.g. "
        "`safetensors.torch.save_file(torch.load(path, weights_only=True), 'model.safetensors')`."
    )


def find_checkpoint(model_dir: Path) -> Path:
    path = model_dir / "model.safetensors"
    if path.is_file():
        return path
    for pickled in ("pytorch_model.bin", "model.pt", "model.bin"):
        if (model_dir / pickled).is_file():
            refuse_pickle(model_dir / pickled)
    if (model_dir / "model.safetensors.index.json").is_file():  # what transformers writes past its max_shard_size
        raise ValueError(f"{model_dir} holds the model in shards (model.safetensors.index.json); minisbert reads one "
                         "model.safetensors: load it once with transformers and save_pretrained(folder, "
                         "max_shard_size='100GB') where you trust the files")
    raise FileNotFoundError(f"no model.safetensors in {model_dir}")


def check_finite(tensor, key: str, path: Path) -> None:
    """Refuse a checkpoint tensor holding NaN or inf (after conversion to the parameter's dtype, so
    a float64 value beyond float32's range counts too)."""
    bad = ~torch.isfinite(tensor)
    if bad.any():
        where = tuple(bad.nonzero()[0].tolist())
        raise ValueError(f"tensor {key!r} in {path} holds {int(bad.sum())} value(s) that are not finite "
                         f"(first at index {where}: {tensor[where].item()}); the checkpoint is damaged "
                         "or came from a run that diverged: load another one")


def open_safetensors(path: Path):
    """safe_open(path), with an error naming the file when it is not a whole safetensors file."""
    try:
        return safe_open(str(path), framework="pt")
    except SafetensorError as error:
        raise ValueError(f"{path} is not a readable safetensors file ({error}); it is cut short or damaged: "
                         "download or save the model again") from None


def load_encoder_weights(encoder: Encoder, path) -> None:
    """Copy a safetensors checkpoint into `encoder`, checking every name, shape and dtype."""
    path = Path(path)
    if path.suffix in (".bin", ".pt", ".pth"):
        refuse_pickle(path)
    table = name_table(encoder.config)
    parameters = dict(encoder.named_parameters())
    assert set(table.values()) == set(parameters), "name table and Encoder disagree"
    written = set()
    with torch.no_grad():
        for parameter in parameters.values():
            parameter.fill_(float("nan"))
        with open_safetensors(path) as checkpoint:
            stored = None  # a file with a digest is read whole once, to check it; others a tensor at a time
            if DIGEST_KEY in (checkpoint.metadata() or {}):  # written by minisbert: the bytes as written?
                stored = {key: checkpoint.get_tensor(key) for key in checkpoint.keys()}
                check_digest(path, checkpoint.metadata(), stored)
            for key in checkpoint.keys():
                name = normalise_key(key)
                if name is None:
                    continue
                if name not in table:
                    raise ValueError(
                        f"unexpected tensor {key!r} in {path} for a {encoder.config.family} model "
                        f"with {encoder.config.num_layers} layers"
                    )
                ours = table[name]
                if ours in written:
                    raise ValueError(f"tensor for {ours!r} appears twice in {path} (last: {key!r})")
                tensor = checkpoint.get_tensor(key) if stored is None else stored[key]
                target = parameters[ours]
                if tensor.dtype not in LOADABLE_DTYPES:
                    raise ValueError(f"tensor {key!r} in {path} has dtype {tensor.dtype}; "
                                     f"expected one of {LOADABLE_DTYPES}")
                if tensor.shape != target.shape:
                    raise ValueError(f"tensor {key!r} in {path} has shape {tuple(tensor.shape)}; "
                                     f"the config asks for {tuple(target.shape)}")
                tensor = tensor.to(target.dtype)
                check_finite(tensor, key, path)
                target.copy_(tensor)
                written.add(ours)
    missing = [theirs for theirs, ours in table.items() if ours not in written]
    if missing:
        raise ValueError(f"{path} lacks {len(missing)} tensor(s) the model needs: {missing[:5]}")
    never_written = [name for name, p in parameters.items() if torch.isnan(p).any()]
    assert not never_written, f"parameters {never_written[:5]} were never written from {path}"


FILES_KEY = "minisbert files sha256"  # model.safetensors's metadata: the SHA-256 of the directory's other files


def save_encoder_weights(encoder: Encoder, path, files: dict | None = None) -> None:
    """Write `encoder` as a Hugging Face base-model checkpoint (no prefix), atomically. files: the
    SHA-256 of the model directory's other files (path -> digest), kept in the metadata (FILES_KEY)
    so that loading can tell they are the ones written with these weights."""
    table = name_table(encoder.config)
    parameters = dict(encoder.named_parameters())
    tensors = {theirs: parameters[ours].detach().float().cpu().contiguous()
               for theirs, ours in table.items()}
    metadata = {"format": "pt"} if files is None else {"format": "pt", FILES_KEY: json.dumps(files, sort_keys=True)}
    write_safetensors(Path(path), tensors, metadata)  # transformers reads "format" only


def load_encoder(model_dir) -> Encoder:
    """Build an Encoder from a Hugging Face model directory (config.json + model.safetensors)."""
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"no config.json in {model_dir}")
    try:
        config = config_from_hf(read_json(config_path))
    except ValueError as error:
        raise ValueError(f"{config_path}: {error}; repair the file or use the model's original") from None
    encoder = Encoder(config)
    load_encoder_weights(encoder, find_checkpoint(model_dir))
    return encoder


def save_encoder_config(encoder: Encoder, model_dir) -> None:
    """config.json, in Hugging Face's names; the weights beside it: `save_encoder_weights`."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    write_json(model_dir / "config.json", config_to_hf(encoder.config))


def save_encoder(encoder: Encoder, model_dir) -> None:
    """A Hugging Face model directory: config.json and model.safetensors."""
    save_encoder_config(encoder, model_dir)
    save_encoder_weights(encoder, Path(model_dir) / "model.safetensors")


def saved_files(model_dir: Path) -> set[str] | None:
    """The files (paths relative to `model_dir`) a minisbert save wrote there: its weights and those
    whose SHA-256 they keep; None where no minisbert save wrote the folder."""
    weights = Path(model_dir) / "model.safetensors"
    if not weights.is_file():
        return None
    try:
        with open_safetensors(weights) as opened:
            kept = json.loads((opened.metadata() or {}).get(FILES_KEY) or "null")
    except ValueError:  # not a safetensors file, or a damaged record: not a save minisbert can vouch for
        return None
    return {"model.safetensors", *kept} if isinstance(kept, dict) else None


def check_saved_files(model_dir: Path) -> None:
    """Refuse a model directory whose files are not the ones written beside its weights: each file
    whose SHA-256 the weights' metadata keeps (FILES_KEY; written by minisbert) must be there, with that
    digest. A directory from another tool keeps none: nothing to check."""
    weights = Path(model_dir) / "model.safetensors"
    if not weights.is_file():
        return
    with open_safetensors(weights) as opened:
        kept = (opened.metadata() or {}).get(FILES_KEY)
    if kept is None:
        return
    try:
        digests = json.loads(kept)
    except ValueError:
        digests = None
    if not isinstance(digests, dict):
        raise ValueError(f"{weights}: its record of the model's files is damaged; save or download the model again")
    for name, digest in sorted(digests.items()):
        path = Path(model_dir) / name
        if not path.is_file():
            raise ValueError(f"{path} is missing: the model was saved with it; save or copy the model again")
        if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            raise ValueError(f"{path} is not the file saved with the model's weights (its SHA-256 differs): it was "
                             "damaged or edited after it was saved; save or copy the model again")


if __name__ == "__main__":
    from ..common.hub import main

    raise SystemExit(main())
