"""The sentence-transformers model directory: what `SentenceTransformer.save` writes, read and written
here so that models move freely between the two libraries.

    modules.json               the pipeline: Transformer, Pooling, [Dense], [Normalize]
    config_sentence_transformers.json   similarity_fn_name: how embeddings are compared (common/similarity.py);
                               prompts, default_prompt_name (porting/prompts.py); read and written for
                               porting/sentence_transformer.py (the network in encoding/model.py has no use for it)
    config.json, model.safetensors, tokenizer files, sentence_bert_config.json (max_seq_length;
                               do_lower_case: texts lowercased first, kept in the saved tokenizer.json)
    1_Pooling/config.json      pooling_mode_{mean_tokens, max_tokens, cls_token}
    2_Dense/config.json, 2_Dense/model.safetensors   optional projection
    (Normalize has no files: its entry in modules.json is enough)

sentence-transformers 6 writes some of these differently (module type names, one `pooling_mode`
string, no max_seq_length in sentence_bert_config.json); both forms are read, the classic one is
written (tests/fixtures/README.md shows the two side by side). A plain Hugging Face model directory
(no modules.json) reads as mean pooling without normalisation.

Checked against sentence-transformers, reading its directories and having it read ours, in
tests/encoding/test_model.py.
"""

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path


from ..common.fileio import check_digest, read_json, write_json, write_safetensors
from .pooling import POOLING_MODES, Dense
from ..common.similarity import SIMILARITY_FUNCTIONS
from .weights import (check_finite, check_saved_files, open_safetensors, refuse_pickle, save_encoder_config,
                      save_encoder_weights)

ST_MODULE = "sentence_transformers.models."
ST_ACTIVATIONS = {  # sentence-transformers names the class; we name the function
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.ReLU": "relu",
}
# Tokenizer side files copied on save beside the tokenizer.json we write, for tools that read them.
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                   "merges.txt")


PIPELINE_STEPS = {"Pooling": 0, "Dense": 1, "Normalize": 2}  # the order modules.json may name them in


@dataclass
class Layout:
    """What a model directory says about the pipeline around the encoder."""
    transformer_dir: Path  # holds config.json, model.safetensors and the tokenizer
    pooling: str  # one of POOLING_MODES
    dense: Dense | None  # the optional projection
    normalize_embeddings: bool
    max_seq_length: int | None  # as the directory states it (None: it states none), before the encoder's position limit
    lowercase: bool = False  # sentence_bert_config.json's do_lower_case: texts lowercased before the tokenizer


def read_layout(model_dir) -> Layout:
    """Read a sentence-transformers directory, or a plain Hugging Face model directory."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {model_dir} does not exist")
    check_saved_files(model_dir)  # before any of them is read
    layout = Layout(model_dir, "mean", None, False, 0)
    if (model_dir / "modules.json").is_file():
        read_modules(model_dir, read_json(model_dir / "modules.json"), layout)
    st_config = read_json(layout.transformer_dir / "sentence_bert_config.json", {})
    # sentence-transformers' Transformer module reads do_lower_case where modules.json names it; a plain
    # Hugging Face folder it loads without (its texts as they are).
    layout.lowercase = st_config.get("do_lower_case", False) if (model_dir / "modules.json").is_file() else False
    if not isinstance(layout.lowercase, bool):
        raise ValueError(f"{layout.transformer_dir}: do_lower_case (sentence_bert_config.json) must be true or false, "
                         f"got {layout.lowercase!r}; repair the file")
    max_len = st_config.get("max_seq_length")
    if max_len is None:
        max_len = read_json(layout.transformer_dir / "tokenizer_config.json", {}).get("model_max_length")
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int)):
        raise ValueError(f"{layout.transformer_dir}: max_seq_length (sentence_bert_config.json) or model_max_length "
                         f"(tokenizer_config.json) must be an int, got {max_len!r}; repair the file")
    layout.max_seq_length = max_len
    return layout


def read_modules(model_dir: Path, modules: list, layout: Layout) -> None:
    """Fill `layout` from modules.json: the transformer folder, pooling, Dense and Normalize."""
    if not isinstance(modules, list) or not all(isinstance(entry, dict) and isinstance(entry.get("path", ""), str)
                                                 for entry in modules):
        raise ValueError(f"{model_dir}/modules.json must hold a list of modules, each an object with "
                         "'path' and 'type'; repair or replace the file")
    # "sentence_transformers.models.Pooling" (the classic name) or, since sentence-transformers 6,
    # "sentence_transformers.sentence_transformer.modules.pooling.Pooling": the class name is the last part.
    kinds = [str(entry.get("type", "")).rsplit(".", 1)[-1] for entry in modules]
    if not kinds or kinds[0] != "Transformer":
        raise ValueError(f"{model_dir}/modules.json must start with a Transformer module, got {kinds}")
    layout.transformer_dir = model_dir / modules[0].get("path", "")
    # minisbert's pipeline is Transformer, Pooling, one Dense, Normalize, in that order: a second Dense
    # or a Normalize before the Dense would be read as that pipeline and give other embeddings.
    for entry, kind in zip(modules[1:], kinds[1:]):
        if kind not in PIPELINE_STEPS:
            raise ValueError(f"{model_dir}/modules.json names module type {entry.get('type')!r}; "
                             "minisbert supports Transformer, Pooling, Dense and Normalize")
    steps = [PIPELINE_STEPS[kind] for kind in kinds[1:]]
    if steps != sorted(steps) or kinds.count("Dense") > 1 or kinds.count("Normalize") > 1:
        raise ValueError(f"{model_dir}/modules.json chains {kinds}; minisbert computes Transformer, Pooling, at most "
                         "one Dense, then Normalize, in that order")
    for entry, kind in zip(modules[1:], kinds[1:]):
        folder = model_dir / entry.get("path", "")
        if kind == "Pooling":
            layout.pooling = read_pooling(folder / "config.json")
        elif kind == "Dense":
            layout.dense = read_dense(folder)
        else:  # Normalize
            layout.normalize_embeddings = True


def read_st_config(model_dir: Path) -> tuple:
    """config_sentence_transformers.json's `similarity_fn_name` (cosine where the file or the name is
    missing, or null, as in sentence-transformers), `prompts` ({}), `default_prompt_name` (None) and
    `truncate_dim` (None: every dimension)."""
    path = model_dir / "config_sentence_transformers.json"
    config = read_json(path, {})
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(config).__name__}; repair or remove the file")
    name = config.get("similarity_fn_name") or "cosine"
    if name not in SIMILARITY_FUNCTIONS:
        raise ValueError(f"{path}: similarity_fn_name {name!r} is not one of {SIMILARITY_FUNCTIONS}")
    truncate_dim = config.get("truncate_dim")
    if truncate_dim is not None and (isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int) or truncate_dim <= 0):
        raise ValueError(f"{path}: truncate_dim {truncate_dim!r} is not a positive integer or null")
    return name, config.get("prompts") or {}, config.get("default_prompt_name"), truncate_dim


def read_pooling(config_path: Path) -> str:
    """The pooling mode from 1_Pooling/config.json, in either of sentence-transformers' formats:
    true/false flags `pooling_mode_{mean_tokens, max_tokens, cls_token, ...}` (classic), or one
    string `pooling_mode` (sentence-transformers 6)."""
    config = read_json(config_path)
    if config.get("include_prompt", True) is not True:
        raise ValueError(f"{config_path}: include_prompt false (prompt tokens left out of the pooling) is not "
                         "supported by minisbert, which pools a prompt's tokens with the text's")
    if "pooling_mode" in config:
        chosen = [config["pooling_mode"]]
    else:
        flag_names = {"pooling_mode_mean_tokens": "mean", "pooling_mode_max_tokens": "max",
                      "pooling_mode_cls_token": "cls"}
        chosen = [flag_names.get(key, key) for key, value in config.items()
                  if key.startswith("pooling_mode_") and value is True]
    if len(chosen) != 1 or chosen[0] not in POOLING_MODES:
        raise ValueError(f"{config_path}: minisbert pools with exactly one of {POOLING_MODES}; "
                         f"this config asks for {chosen}")
    return chosen[0]


def read_dense(folder: Path) -> Dense:
    config = read_json(folder / "config.json")
    activation = ST_ACTIVATIONS.get(config.get("activation_function", "torch.nn.modules.activation.Tanh"))
    if activation is None:
        raise ValueError(f"{folder}/config.json: unsupported activation_function "
                         f"{config.get('activation_function')!r}; supported: {list(ST_ACTIVATIONS)}")
    dense = Dense(config["in_features"], config["out_features"], config.get("bias", True), activation)
    weights = folder / "model.safetensors"
    if not weights.is_file():
        if (folder / "pytorch_model.bin").is_file():
            refuse_pickle(folder / "pytorch_model.bin")
        raise FileNotFoundError(f"no model.safetensors in {folder}")
    with open_safetensors(weights) as f:
        state = {key: f.get_tensor(key) for key in f.keys()}
        check_digest(weights, f.metadata(), state)
    state = {key: tensor.float() for key, tensor in state.items()}
    expected = set(dense.linear.state_dict())
    found = {key.removeprefix("linear.") for key in state}
    if found != expected:
        raise ValueError(f"{weights} holds {sorted(state)}; a Dense layer needs "
                         f"{sorted('linear.' + k for k in expected)}")
    for key, tensor in state.items():
        check_finite(tensor, key, weights)
    dense.linear.load_state_dict({key.removeprefix("linear."): t for key, t in state.items()})
    return dense


def write_layout(folder: Path, model, st_config: dict | None = None) -> None:
    """Write `model` (a SentenceModel) into the empty `folder` in the classic layout; st_config, when
    given, as config_sentence_transformers.json (similarity_fn_name, prompts, default_prompt_name and,
    where set, truncate_dim)."""
    save_encoder_config(model.encoder, folder)
    model.tokenizer.save(folder)
    if model.tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            if (model.tokenizer_dir / name).is_file():
                shutil.copyfile(model.tokenizer_dir / name, folder / name)
    if st_config is not None:
        write_json(folder / "config_sentence_transformers.json", st_config)
    write_json(folder / "sentence_bert_config.json",
               {"max_seq_length": model.max_seq_length, "do_lower_case": False})
    write_json(folder / "1_Pooling" / "config.json", {
        "word_embedding_dimension": model.encoder.config.hidden_size,
        "pooling_mode_cls_token": model.pooling == "cls",
        "pooling_mode_mean_tokens": model.pooling == "mean",
        "pooling_mode_max_tokens": model.pooling == "max",
        "pooling_mode_mean_sqrt_len_tokens": False,
    })
    modules = [("", "Transformer"), ("1_Pooling", "Pooling")]
    if model.dense is not None:
        linear = model.dense.linear
        class_name = {v: k for k, v in ST_ACTIVATIONS.items()}[model.dense.activation_name]
        write_json(folder / "2_Dense" / "config.json", {
            "in_features": linear.in_features, "out_features": linear.out_features,
            "bias": linear.bias is not None, "activation_function": class_name,
        })
        tensors = {f"linear.{k}": v.detach().float().cpu().contiguous()
                   for k, v in linear.state_dict().items()}
        write_safetensors(folder / "2_Dense" / "model.safetensors", tensors, {"format": "pt"})
        modules.append(("2_Dense", "Dense"))
    if model.normalize_embeddings:
        modules.append((f"{len(modules)}_Normalize", "Normalize"))
    write_json(folder / "modules.json", [
        {"idx": i, "name": str(i), "path": p, "type": ST_MODULE + kind}
        for i, (p, kind) in enumerate(modules)
    ])
    # The weights last, keeping every other file's SHA-256 (`check_saved_files` reads them back).
    files = {path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
             for path in sorted(folder.rglob("*")) if path.is_file()}
    save_encoder_weights(model.encoder, folder / "model.safetensors", files)
