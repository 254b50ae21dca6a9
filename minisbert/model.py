"""A sentence-embedding model: tokenizer -> encoder -> pooling -> (dense) -> (normalize).

Reimers and Gurevych (2019), "Sentence-BERT: Sentence Embeddings using Siamese BERT-Networks",
figure 1: the same network embeds each sentence on its own; sentences are then compared by cosine
similarity. `SentenceModel.forward` is that network on a tokenized batch (what training
differentiates), `encode()` the way to run it over many texts, and `save`/`from_dir` move it to and
from a sentence-transformers directory (st_directory.py).

Two ways to compute the same thing: the plain encoder (encoder.py, written as the papers describe
it) and the fast one (fast/encoder.py: padding skipped, fused kernels; for `encode` also batches cut
to CPU cache size and memory reused, fast/encode.py). `fast=True`, the default, runs the fast one;
`fast=False` the plain one. Checked against sentence-transformers in tests/test_model.py, the two
ways against each other in tests/test_encoder_fast.py.
"""

import contextlib
import numbers
from pathlib import Path

import torch
from torch import nn

from .encoder import Encoder
from .fast import encode as fast_encode
from .fast import encoder as fast_encoder
from .fileio import write_dir
from .pooling import POOLING_MODES, Dense, normalize, pool
from .progress import Progress
from .st_directory import read_layout, write_layout
from .tokenizer import Tokenizer
from .weights import load_encoder

PROGRESS_MIN_TEXTS = 1000  # show a progress line for inputs at least this long
AUTOCAST_DTYPES = {"float32": None, "float16": torch.float16, "bfloat16": torch.bfloat16}


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


class SentenceModel(nn.Module):
    def __init__(self, encoder: Encoder, tokenizer: Tokenizer, pooling: str = "mean",
                 dense: Dense = None, normalize_embeddings: bool = False, tokenizer_dir=None,
                 fast: bool = True):
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
        self.fast = fast  # run the fast encoder (True) or the plain one, unless a call says otherwise

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dimension(self) -> int:
        return self.dense.linear.out_features if self.dense is not None else self.encoder.config.hidden_size

    def forward(self, batch: dict, normalize_embeddings: bool = None, fast: bool = None):
        """A tokenized batch -> sentence embeddings (B, D), differentiable (used in training)."""
        ids, mask, types = batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids")
        if self.fast if fast is None else fast:
            tokens = fast_encoder.forward(self.encoder, ids, mask, types)  # (B, T, H)
        else:
            tokens = self.encoder(ids, mask, types)  # (B, T, H)
        embeddings = pool(tokens, mask, self.pooling)  # (B, H)
        if self.dense is not None:
            embeddings = self.dense(embeddings)  # (B, D)
        if self.normalize_embeddings if normalize_embeddings is None else normalize_embeddings:
            embeddings = normalize(embeddings)
        return embeddings

    def tokenize(self, texts) -> dict:
        return {name: t.to(self.device) for name, t in self.tokenizer(texts).items()}

    @torch.inference_mode()
    def encode(self, texts, batch_size: int = 32, normalize: bool = None, output: str = "numpy",
               dtype: str = "float32", show_progress: bool = None, fast: bool = None):
        """Embed `texts` (any iterable of str) -> float32 array (n, D), rows in the order of `texts`.

        normalize: None follows the model directory (all-MiniLM-L6-v2 normalises); True/False force.
        output: "numpy" or "torch". dtype: "float32"; "float16"/"bfloat16" only on a GPU.
        fast: None follows the model's setting; False runs the plain encoder in plain batches.
        """
        if output not in ("numpy", "torch"):
            raise ValueError(f"output must be 'numpy' or 'torch', got {output!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if dtype not in AUTOCAST_DTYPES:
            raise ValueError(f"dtype must be one of {list(AUTOCAST_DTYPES)}, got {dtype!r}")
        if AUTOCAST_DTYPES[dtype] is not None and self.device.type == "cpu":
            raise ValueError(f"dtype {dtype} is for GPUs; on the CPU encode in float32")
        fast = self.fast if fast is None else fast
        id_lists = self.tokenizer.token_ids(texts)
        n = len(id_lists)
        embeddings = torch.empty((n, self.dimension), dtype=torch.float32)  # (n, D)

        # Sort by length, so that each batch pads little; then batch, forward, and put the rows back
        # in input order. The fast way cuts batches to the CPU's cache and reuses memory between them.
        longest_first = sorted(range(n), key=lambda i: -len(id_lists[i]))
        if fast:
            batches = fast_encode.batches(longest_first, id_lists, batch_size, self.device)
            memory = fast_encoder.reusing_memory()
        else:
            batches = (longest_first[start:start + batch_size] for start in range(0, n, batch_size))
            memory = contextlib.nullcontext()
        autocast = torch.autocast(self.device.type, dtype=AUTOCAST_DTYPES[dtype] or torch.float32,
                                  enabled=AUTOCAST_DTYPES[dtype] is not None)
        progress = Progress(n, "encoded", "texts",
                            show=n >= PROGRESS_MIN_TEXTS if show_progress is None else show_progress)
        was_training = self.training
        self.eval()
        try:
            with memory, autocast:
                for rows in batches:
                    batch = {k: t.to(self.device) for k, t in self.tokenizer.pad([id_lists[i] for i in rows]).items()}  # (B, T)
                    embeddings[rows] = self(batch, normalize, fast).float().cpu()  # back to input order
                    progress.update(len(rows))
        finally:
            self.train(was_training)
            progress.close()
        return embeddings.numpy() if output == "numpy" else embeddings

    def save(self, path) -> None:
        """Write the sentence-transformers layout to `path`, replacing it only once fully written."""
        path = Path(path)
        write_dir(path, lambda folder: write_layout(folder, self))

    @classmethod
    def from_dir(cls, model_dir, device=None, fast: bool = True) -> "SentenceModel":
        """Load a sentence-transformers directory, or a plain Hugging Face model directory."""
        layout = read_layout(model_dir)
        encoder = load_encoder(layout.transformer_dir)
        tokenizer = Tokenizer.from_dir(layout.transformer_dir, min(layout.max_seq_length, encoder.config.max_tokens),
                                       uses_token_types=encoder.config.type_vocab_size > 0)
        tokens = tokenizer.rust.get_vocab_size(with_added_tokens=True)
        if tokens > encoder.config.vocab_size:  # ids past the table would fail, or read another row, at encode time
            raise ValueError(f"the tokenizer in {layout.transformer_dir} has {tokens} tokens but the model's embedding "
                             f"table (vocab_size in config.json) has {encoder.config.vocab_size} rows; the tokenizer "
                             "belongs to another model: use the model's own")
        model = cls(encoder, tokenizer, layout.pooling, layout.dense, layout.normalize_embeddings,
                    layout.transformer_dir, fast)
        return model.to(device if device is not None else default_device()).eval()
