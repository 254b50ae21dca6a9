"""A sentence-embedding model: tokenizer -> encoder -> pooling -> (dense) -> (normalize).

Reimers and Gurevych (2019), "Sentence-BERT", figure 1: the same network embeds each sentence on its
own; sentences are then compared by cosine similarity. `SentenceModel` is that network and
`encode()` the way to run it over many texts.

A model directory in the sentence-transformers layout (what `SentenceTransformer.save` writes) is
read and written, so models move freely between the two libraries:

    modules.json               the pipeline: Transformer, Pooling, [Dense], [Normalize]
    config.json, model.safetensors, tokenizer files, sentence_bert_config.json (max_seq_length)
    1_Pooling/config.json      pooling_mode_{mean_tokens, max_tokens, cls_token}
    2_Dense/config.json, 2_Dense/model.safetensors   optional projection
    (Normalize has no files: its entry in modules.json is enough)

A plain Hugging Face model directory (no modules.json) gets mean pooling and no normalisation.
Checked against sentence-transformers in tests/test_model.py.
"""

import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from .encoder import Encoder, reusing_memory
from .pooling import POOLING_MODES, Dense, normalize, pool
from .fileio import atomic_write, make_staging_dir, read_json, replace_dir, write_json
from .progress import Progress
from .tokenizer import Tokenizer
from .weights import load_encoder, refuse_pickle, save_encoder

ST_MODULE = "sentence_transformers.models."
ST_ACTIVATIONS = {  # sentence-transformers names the class; we name the function
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.ReLU": "relu",
}
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                   "merges.txt")
PROGRESS_MIN_TEXTS = 1000  # show a progress line for inputs at least this long
CPU_TOKENS_PER_FORWARD = 2048  # see SentenceModel.rows_per_forward


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


class SentenceModel(nn.Module):
    def __init__(self, encoder: Encoder, tokenizer: Tokenizer, pooling: str = "mean",
                 dense: Dense = None, normalize_embeddings: bool = False, tokenizer_dir=None):
        super().__init__()
        if pooling not in POOLING_MODES:
            raise ValueError(f"unknown pooling mode {pooling!r}; choose one of {POOLING_MODES}")
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.dense = dense
        self.normalize_embeddings = normalize_embeddings
        # Where the tokenizer's side files (vocab, special tokens) came from, to copy them on save.
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else None

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dimension(self) -> int:
        return self.dense.linear.out_features if self.dense is not None else self.encoder.config.hidden_size

    def forward(self, batch: dict, normalize_embeddings: bool = None):
        """A tokenized batch -> sentence embeddings (B, D), differentiable (used in training)."""
        tokens = self.encoder(batch["input_ids"], batch["attention_mask"],
                              batch.get("token_type_ids"))  # (B, T, H)
        embeddings = pool(tokens, batch["attention_mask"], self.pooling)  # (B, H)
        if self.dense is not None:
            embeddings = self.dense(embeddings)  # (B, D)
        if self.normalize_embeddings if normalize_embeddings is None else normalize_embeddings:
            embeddings = normalize(embeddings)
        return embeddings

    def tokenize(self, texts) -> dict:
        return {name: t.to(self.device) for name, t in self.tokenizer(texts).items()}

    @torch.inference_mode()
    def encode(self, texts, batch_size: int = 32, normalize: bool = None, output: str = "numpy",
               dtype: str = "float32", show_progress: bool = None):
        """Embed `texts` (a list of str) -> float32 array (n, D), rows in the order of `texts`.

        normalize: None follows the model directory (all-MiniLM-L6-v2 normalises); True/False force.
        output: "numpy" or "torch". dtype: "float32"; "float16"/"bfloat16" only on a GPU.
        Texts are sorted by token count so each batch pads little, then put back in order; on a
        CPU a batch is cut further to keep activations in cache (see rows_per_forward).
        """
        if output not in ("numpy", "torch"):
            raise ValueError(f"output must be 'numpy' or 'torch', got {output!r}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        autocast_dtype = {"float32": None, "float16": torch.float16, "bfloat16": torch.bfloat16}
        if dtype not in autocast_dtype:
            raise ValueError(f"dtype must be one of {list(autocast_dtype)}, got {dtype!r}")
        if autocast_dtype[dtype] is not None and self.device.type == "cpu":
            raise ValueError(f"dtype {dtype} is for GPUs; on the CPU encode in float32")
        id_lists = self.tokenizer.token_ids(texts)
        n = len(id_lists)
        embeddings = torch.empty((n, self.dimension), dtype=torch.float32)  # (n, D)
        if n == 0:
            return embeddings.numpy() if output == "numpy" else embeddings
        was_training = self.training
        self.eval()
        longest_first = sorted(range(n), key=lambda i: -len(id_lists[i]))
        progress = Progress(n, "encoded", "texts",
                            show=n >= PROGRESS_MIN_TEXTS if show_progress is None else show_progress)
        start = 0
        autocast = torch.autocast(self.device.type, dtype=autocast_dtype[dtype] or torch.float32,
                                  enabled=autocast_dtype[dtype] is not None)
        with reusing_memory(), autocast:
            while start < n:
                rows = longest_first[start:start + self.rows_per_forward(batch_size, len(id_lists[longest_first[start]]))]
                batch = {k: t.to(self.device) for k, t in self.tokenizer.pad([id_lists[i] for i in rows]).items()}
                embeddings[rows] = self(batch, normalize).float().cpu()  # back to input order
                progress.update(len(rows))
                start += len(rows)
        progress.close()
        self.train(was_training)
        return embeddings.numpy() if output == "numpy" else embeddings

    def rows_per_forward(self, batch_size: int, longest: int) -> int:
        """Texts per forward pass: batch_size, and on a CPU also at most CPU_TOKENS_PER_FORWARD
        tokens, so that each layer's activations stay in the processor's cache instead of streaming
        through main memory (on 2 cores, 4 forward passes of 8 x 256 tokens run about 20% faster than one of 32 x 256).
        Every text's embedding is the same either way: rows never interact."""
        if self.device.type != "cpu":
            return batch_size
        return max(1, min(batch_size, CPU_TOKENS_PER_FORWARD // longest))

    def save(self, path) -> None:
        """Write the sentence-transformers layout to `path`, replacing it only once fully written."""
        path = Path(path)
        staging = make_staging_dir(path)
        try:
            self.write_layout(staging)
            replace_dir(staging, path)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def write_layout(self, folder: Path) -> None:
        save_encoder(self.encoder, folder)
        self.tokenizer.save(folder)
        if self.tokenizer_dir is not None:
            for name in TOKENIZER_FILES:
                if (self.tokenizer_dir / name).is_file():
                    shutil.copyfile(self.tokenizer_dir / name, folder / name)
        write_json(folder / "sentence_bert_config.json",
                   {"max_seq_length": self.tokenizer.max_seq_length, "do_lower_case": False})
        H = self.encoder.config.hidden_size
        write_json(folder / "1_Pooling" / "config.json", {
            "word_embedding_dimension": H,
            "pooling_mode_cls_token": self.pooling == "cls",
            "pooling_mode_mean_tokens": self.pooling == "mean",
            "pooling_mode_max_tokens": self.pooling == "max",
            "pooling_mode_mean_sqrt_len_tokens": False,
        })
        modules = [("", "Transformer"), ("1_Pooling", "Pooling")]
        if self.dense is not None:
            linear = self.dense.linear
            class_name = {v: k for k, v in ST_ACTIVATIONS.items()}[self.dense.activation_name]
            write_json(folder / "2_Dense" / "config.json", {
                "in_features": linear.in_features, "out_features": linear.out_features,
                "bias": linear.bias is not None, "activation_function": class_name,
            })
            tensors = {f"linear.{k}": v.detach().float().cpu().contiguous()
                       for k, v in linear.state_dict().items()}
            atomic_write(folder / "2_Dense" / "model.safetensors",
                         lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
            modules.append(("2_Dense", "Dense"))
        if self.normalize_embeddings:
            modules.append((f"{len(modules)}_Normalize", "Normalize"))
        write_json(folder / "modules.json", [
            {"idx": i, "name": str(i), "path": p, "type": ST_MODULE + kind}
            for i, (p, kind) in enumerate(modules)
        ])

    @classmethod
    def from_dir(cls, model_dir, device=None, fused: bool = True) -> "SentenceModel":
        """Load a sentence-transformers directory, or a plain Hugging Face model directory."""
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise FileNotFoundError(f"model directory {model_dir} does not exist")
        modules = read_json(model_dir / "modules.json") if (model_dir / "modules.json").is_file() else None
        transformer_dir, pooling, dense, normalize_embeddings = model_dir, "mean", None, False
        if modules is not None:
            transformer_dir, pooling, dense, normalize_embeddings = read_modules(model_dir, modules)
        encoder = load_encoder(transformer_dir, fused=fused)
        max_len = read_json(transformer_dir / "sentence_bert_config.json", {}).get("max_seq_length")
        if max_len is None:
            max_len = read_json(transformer_dir / "tokenizer_config.json", {}).get("model_max_length", 512)
        max_len = min(max_len, encoder.config.max_tokens)
        tokenizer = Tokenizer.from_dir(transformer_dir, max_len,
                                       uses_token_types=encoder.config.type_vocab_size > 0)
        model = cls(encoder, tokenizer, pooling, dense, normalize_embeddings, transformer_dir)
        return model.to(device if device is not None else default_device()).eval()


def read_modules(model_dir: Path, modules: list):
    """modules.json -> (transformer folder, pooling mode, Dense or None, normalize flag)."""
    # "sentence_transformers.models.Pooling" (the classic name) or, since sentence-transformers 6,
    # "sentence_transformers.sentence_transformer.modules.pooling.Pooling": the class name is the last part.
    kinds = [entry.get("type", "").rsplit(".", 1)[-1] for entry in modules]
    if not kinds or kinds[0] != "Transformer":
        raise ValueError(f"{model_dir}/modules.json must start with a Transformer module, got {kinds}")
    transformer_dir, pooling, dense, normalize_embeddings = model_dir / modules[0].get("path", ""), "mean", None, False
    for entry, kind in zip(modules[1:], kinds[1:]):
        folder = model_dir / entry.get("path", "")
        if kind == "Pooling":
            pooling = read_pooling(folder / "config.json")
        elif kind == "Dense":
            dense = read_dense(folder)
        elif kind == "Normalize":
            normalize_embeddings = True
        else:
            raise ValueError(f"{model_dir}/modules.json names module type {entry.get('type')!r}; "
                             "minisbert supports Transformer, Pooling, Dense and Normalize")
    return transformer_dir, pooling, dense, normalize_embeddings


def read_pooling(config_path: Path) -> str:
    """The pooling mode from 1_Pooling/config.json, in either of sentence-transformers' formats:
    true/false flags `pooling_mode_{mean_tokens, max_tokens, cls_token, ...}` (classic), or one
    string `pooling_mode` (sentence-transformers 6)."""
    config = read_json(config_path)
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
    with safe_open(str(weights), framework="pt") as f:
        state = {key: f.get_tensor(key) for key in f.keys()}
    expected = set(dense.linear.state_dict())
    found = {key.removeprefix("linear.") for key in state}
    if found != expected:
        raise ValueError(f"{weights} holds {sorted(state)}; a Dense layer needs "
                         f"{sorted('linear.' + k for k in expected)}")
    dense.linear.load_state_dict({key.removeprefix("linear."): t.float() for key, t in state.items()})
    return dense
