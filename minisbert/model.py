"""A sentence-embedding model: tokenizer -> encoder -> pooling -> (dense) -> (normalize).

Reimers and Gurevych (2019), "Sentence-BERT: Sentence Embeddings using Siamese BERT-Networks",
figure 1: the same network embeds each sentence on its own; sentences are then compared by cosine
similarity. `SentenceModel.forward` is that network on a tokenized batch (what training
differentiates), `encode()` the way to run it over many texts and `similarity()` the way to compare
the results (both with sentence-transformers' names and defaults, so that its snippets run with the
import changed), and `save`/`from_dir` move it to and from a sentence-transformers directory
(st_directory.py).

sentence-transformers' other calls that a porting user makes (max_seq_length, truncate_dim, prompts
and encode_query/encode_document, precision, token embeddings, similarity_pairwise) are here too,
their machinery in small modules beside this one: prompts.py, quantize.py, and porting.py, which
refuses by name what minisbert does not do. Checked against sentence-transformers 6.2 in
tests/test_st_calls.py.

Two ways to compute the same thing: the plain encoder (encoder.py, written as the papers describe
it) and the fast one (fast/encoder.py: padding skipped, fused kernels; for `encode` also batches cut
to CPU cache size and memory reused, fast/encode.py; products on the quickest kernel measured on
this machine, fast/linear.py). `fast=True`, the default, runs the fast one; `fast=False` the plain
one. Checked against sentence-transformers in tests/test_model.py, the two ways against each other
in tests/test_encoder_fast.py, the precisions in tests/test_bfloat16.py.
"""

import contextlib
import numbers
from pathlib import Path

import torch
from torch import nn

from . import cpu
from .encoder import Encoder
from .fast import encode as fast_encode
from .fast import encoder as fast_encoder
from .fast import linear as fast_linear
from .fileio import write_dir
from .pooling import POOLING_MODES, Dense, normalize, pool
from .porting import (check_output, checked_truncate_dim, convert_output, refuse_attribute,
                      refuse_encode_arguments)
from .progress import Progress
from .prompts import QUERY_PROMPT_NAME, check_default_prompt_name, document_prompt_name, model_prompts, resolve_prompt
from .quantize import quantize_embeddings
from .similarity import SIMILARITY_FUNCTIONS, similarity, similarity_pairwise
from .st_directory import read_layout, write_layout
from .tokenizer import Tokenizer
from .weights import load_encoder

PROGRESS_MIN_TEXTS = 1000  # show a progress line for inputs at least this long
AUTOCAST_DTYPES = {"float32": None, "float16": torch.float16, "bfloat16": torch.bfloat16}
AMP_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # train.py / evaluate.py --amp, another spelling of --dtype


def dtype_for(amp: str | None, dtype: str) -> str:
    """The precision asked for by train.py's and evaluate.py's --dtype and --amp, its other spelling
    (bf16 = bfloat16, fp16 = float16); a ValueError when both are given and disagree."""
    if amp is None:
        return dtype
    if dtype not in ("float32", AMP_DTYPES[amp]):
        raise ValueError(f"--amp {amp} and --dtype {dtype} disagree: give one of them")
    return AMP_DTYPES[amp]


def check_dtype(dtype: str, device) -> torch.dtype:
    """The autocast dtype for computing in `dtype` on `device` (None: plain float32), or a ValueError
    saying why not. float32 runs anywhere; float16 on GPUs; bfloat16 on GPUs and on CPUs that
    multiply it natively (cpu.py): elsewhere torch would emulate it, more slowly than float32.
    LayerNorm, softmax, pooling and normalisation stay in float32 under autocast (see forward)."""
    if dtype not in AUTOCAST_DTYPES:
        raise ValueError(f"dtype must be one of {list(AUTOCAST_DTYPES)}, got {dtype!r}")
    if torch.device(device).type == "cpu":
        if dtype == "float16":
            raise ValueError("dtype float16 is for GPUs; on a CPU compute in float32 (or bfloat16 where the CPU "
                             "has it natively)")
        if dtype == "bfloat16" and not cpu.native_bfloat16():
            raise ValueError("dtype bfloat16 needs a CPU that multiplies bfloat16 natively (flag avx512_bf16 or "
                             "amx_bf16 in /proc/cpuinfo); this one has neither, so torch would emulate it, more "
                             "slowly than float32: use float32 here, or a GPU")
    return AUTOCAST_DTYPES[dtype]



def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


class SentenceModel(nn.Module):
    def __init__(self, encoder: Encoder, tokenizer: Tokenizer, pooling: str = "mean",
                 dense: Dense = None, normalize_embeddings: bool = False, tokenizer_dir=None,
                 fast: bool = True, similarity_fn_name: str = "cosine", truncate_dim: int | None = None,
                 prompts: dict | None = None, default_prompt_name: str | None = None):
        super().__init__()
        if pooling not in POOLING_MODES:
            raise ValueError(f"unknown pooling mode {pooling!r}; choose one of {POOLING_MODES}")
        if similarity_fn_name not in SIMILARITY_FUNCTIONS:
            raise ValueError(f"unknown similarity function {similarity_fn_name!r}; "
                             f"choose one of {SIMILARITY_FUNCTIONS}")
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.dense = dense
        self.normalize_embeddings = normalize_embeddings
        # Where the tokenizer's side files (vocab, special tokens) came from, to copy them on save.
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else None
        self.fast = fast  # run the fast encoder (True) or the plain one, unless a call says otherwise
        self.similarity_fn_name = similarity_fn_name  # how `similarity` compares embeddings
        self.truncate_dim = truncate_dim  # keep the first truncate_dim dimensions of each embedding (None: all)
        self.prompts = model_prompts(prompts, {})  # prompt name -> text put before an input (prompts.py)
        check_default_prompt_name(self.prompts, default_prompt_name)
        self.default_prompt_name = default_prompt_name  # the prompt encode() uses when told none

    def __setattr__(self, name, value):
        refuse_attribute(name)  # a sentence-transformers attribute minisbert would ignore (porting.py)
        super().__setattr__(name, value)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dimension(self) -> int:
        """The size of the model's embeddings, before any truncate_dim."""
        return self.dense.linear.out_features if self.dense is not None else self.encoder.config.hidden_size

    def get_sentence_embedding_dimension(self) -> int:
        """The size of what encode() returns: the model's, or truncate_dim where that is smaller."""
        return self.dimension if self.truncate_dim is None else min(self.dimension, self.truncate_dim)

    get_embedding_dimension = get_sentence_embedding_dimension  # sentence-transformers 6.2's newer name

    @property
    def max_seq_length(self) -> int:
        """The most tokens of a text that are encoded, special tokens included; the rest is cut off.
        Set it to change that, up to the number of positions the encoder has."""
        return self.tokenizer.max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int):
        positions = self.encoder.config.max_tokens
        if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value > positions:
            raise ValueError(f"max_seq_length {value} is more tokens than this model has positions ({positions}); "
                             f"choose at most {positions}")
        self.tokenizer.max_seq_length = value  # which refuses anything but an int of at least 2

    def limit_max_seq_length(self, at_most: int) -> None:
        """Encode at most `at_most` tokens per text, or as many as the encoder has positions where that
        is fewer: what a directory's limit and the scripts' --max-seq-length mean (a cap, not a request)."""
        self.max_seq_length = min(at_most, self.encoder.config.max_tokens)

    def forward_tokens(self, batch: dict, fast: bool = None) -> torch.Tensor:
        """A tokenized batch -> the encoder's token vectors (B, T, H)."""
        ids, mask, types = batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids")
        if self.fast if fast is None else fast:
            return fast_encoder.forward(self.encoder, ids, mask, types)  # (B, T, H)
        return self.encoder(ids, mask, types)  # (B, T, H)

    def forward(self, batch: dict, fast: bool = None):
        """A tokenized batch -> sentence embeddings (B, D), differentiable (used in training)."""
        tokens = self.forward_tokens(batch, fast)  # (B, T, H)
        embeddings = pool(tokens, batch["attention_mask"], self.pooling)  # (B, H); float32 under autocast too
        if self.dense is not None:
            embeddings = self.dense(embeddings).float()  # (B, D); an autocast product is back in float32
        if self.normalize_embeddings:
            embeddings = normalize(embeddings)
        return embeddings

    def tokenize(self, texts) -> dict:
        return {name: t.to(self.device) for name, t in self.tokenizer(texts).items()}

    @torch.inference_mode()
    def encode(self, sentences, batch_size: int = 32, show_progress_bar: bool = None,
               convert_to_numpy: bool = True, convert_to_tensor: bool = False,
               normalize_embeddings: bool = False, dtype: str = "float32", fast: bool = None, *,
               prompt_name: str = None, prompt: str = None, output_value: str = "sentence_embedding",
               precision: str = "float32", truncate_dim: int = None, **unsupported):
        """Embed `sentences`, with the arguments and results of sentence-transformers' encode().

        sentences: one str -> one embedding (D,); any iterable of str -> (n, D), rows in its order.
        Results: a numpy array (convert_to_numpy, the default); one tensor on the model's device
        (convert_to_tensor, which wins over convert_to_numpy); or, with both False, a list of (D,)
        tensors (for one str, one (D,) tensor).
        normalize_embeddings: True scales each embedding to unit length (after truncate_dim). A model
        whose directory ends in Normalize (all-MiniLM-L6-v2 does) normalises either way, as in
        sentence-transformers.
        prompt / prompt_name: a text put before each sentence, or the name of one in `self.prompts`;
        neither: the one named by `self.default_prompt_name`, if any (prompts.py).
        output_value: "sentence_embedding", or "token_embeddings": per text a (T_i, H) tensor of its
        tokens' vectors from the encoder (padding left out).
        precision: float32 (or None), or int8, uint8, binary, ubinary (quantize.py; int8/uint8 take each
        dimension's range from the embeddings themselves, so encode at least two texts).
        truncate_dim: keep the first truncate_dim dimensions (None: the model's truncate_dim).
        show_progress_bar: None shows a progress line from PROGRESS_MIN_TEXTS texts on.
        dtype: the precision the encoder computes in (see check_dtype); embeddings are float32 anyway.
        fast: None follows the model's setting; False runs the plain encoder in plain batches.
        """
        refuse_encode_arguments(unsupported)
        precision = "float32" if precision is None else precision  # as sentence-transformers reads None
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        check_output(output_value, precision, normalize_embeddings, truncate_dim)
        truncate_dim = checked_truncate_dim(self.truncate_dim if truncate_dim is None else truncate_dim)
        prompt = resolve_prompt(self.prompts, self.default_prompt_name, prompt, prompt_name)
        one_sentence = isinstance(sentences, str)
        texts = [sentences] if one_sentence else sentences
        if prompt:
            texts = [prompt + text for text in self.tokenizer.text_list(texts)]
        id_lists = self.tokenizer.token_ids(texts)
        batches = self.batches(id_lists, batch_size, show_progress_bar, dtype, fast)
        if output_value == "token_embeddings":
            tokens = [None] * len(id_lists)
            for rows, batch in batches:
                for row, vectors in zip(rows, self.forward_tokens(batch, fast).float()):  # (T, H) each
                    tokens[row] = vectors[:len(id_lists[row])]
            return tokens[0] if one_sentence else tokens
        width = min(self.dimension, truncate_dim or self.dimension)
        embeddings = torch.empty((len(id_lists), width), dtype=torch.float32,
                                 device=self.device if convert_to_tensor else "cpu")  # (n, D)
        for rows, batch in batches:
            batch_embeddings = self(batch, fast=fast)[:, :truncate_dim]  # (B, D), float32
            if normalize_embeddings:
                batch_embeddings = normalize(batch_embeddings)
            embeddings[rows] = batch_embeddings.to(embeddings.device)  # back to input order
        if precision != "float32":
            embeddings = torch.from_numpy(quantize_embeddings(embeddings, precision))
        return convert_output(embeddings, one_sentence, convert_to_numpy, convert_to_tensor)

    def batches(self, id_lists: list, batch_size: int, show_progress_bar, dtype: str, fast):
        """Yield (rows, padded batch on the model's device), the model in eval mode and computing in
        `dtype`, where `rows` are the batch's indices into id_lists.

        Sorted by length, so that each batch pads little; the caller puts rows back in input order.
        The fast way cuts batches to the CPU's cache and reuses memory between them."""
        autocast_dtype = check_dtype(dtype, self.device)
        n = len(id_lists)
        longest_first = sorted(range(n), key=lambda i: -len(id_lists[i]))
        if self.fast if fast is None else fast:
            row_lists = fast_encode.batches(longest_first, id_lists, batch_size, self.device)
            memory = fast_linear.reusing_memory()
        else:
            row_lists = (longest_first[start:start + batch_size] for start in range(0, n, batch_size))
            memory = contextlib.nullcontext()
        autocast = torch.autocast(self.device.type, dtype=autocast_dtype or torch.float32,
                                  enabled=autocast_dtype is not None)
        progress = Progress(n, "encoded", "texts",
                            show=n >= PROGRESS_MIN_TEXTS if show_progress_bar is None else show_progress_bar)
        was_training = self.training
        self.eval()
        try:
            with memory, autocast:
                for rows in row_lists:
                    yield rows, {k: t.to(self.device) for k, t in self.tokenizer.pad([id_lists[i] for i in rows]).items()}  # (B, T)
                    progress.update(len(rows))
        finally:
            self.train(was_training)
            progress.close()

    def encode_query(self, sentences, **options):
        """encode() with the model's "query" prompt, unless told another (sentence-transformers' name)."""
        if options.get("prompt") is None and options.get("prompt_name") is None:
            options["prompt_name"] = QUERY_PROMPT_NAME if QUERY_PROMPT_NAME in self.prompts else None
        return self.encode(sentences, **options)

    def encode_document(self, sentences, **options):
        """encode() with the model's "document", "passage" or "corpus" prompt, the first it has."""
        if options.get("prompt") is None and options.get("prompt_name") is None:
            options["prompt_name"] = document_prompt_name(self.prompts)
        return self.encode(sentences, **options)

    def similarity(self, a, b) -> torch.Tensor:
        """(n, m) similarities of embeddings a (n, D) to b (m, D) by the model's similarity function
        (`similarity_fn_name`: cosine unless the model directory names another; similarity.py)."""
        return similarity(a, b, self.similarity_fn_name)

    def similarity_pairwise(self, a, b) -> torch.Tensor:
        """(n,) similarities of a_i to b_i, for embeddings a and b (n, D), by `similarity_fn_name`."""
        return similarity_pairwise(a, b, self.similarity_fn_name)

    def save(self, path) -> None:
        """Write the sentence-transformers layout to `path`, replacing it only once fully written."""
        path = Path(path)
        write_dir(path, lambda folder: write_layout(folder, self))

    @classmethod
    def from_dir(cls, model_dir, device=None, fast: bool = True, truncate_dim: int | None = None,
                 prompts: dict | None = None, default_prompt_name: str | None = None) -> "SentenceModel":
        """Load a sentence-transformers directory, or a plain Hugging Face model directory.
        truncate_dim, prompts, default_prompt_name: as sentence-transformers' constructor takes them
        (prompts and default_prompt_name given here win over the directory's)."""
        layout = read_layout(model_dir)
        encoder = load_encoder(layout.transformer_dir)
        # As in sentence-transformers, the smaller of the directory's limit and the positions: a limit may
        # be absent, or 1e30, Hugging Face's "no limit", written when a tokenizer was saved without one.
        positions = encoder.config.max_tokens
        limit = positions if layout.max_seq_length is None else min(layout.max_seq_length, positions)
        tokenizer = Tokenizer.from_dir(layout.transformer_dir, limit,
                                       uses_token_types=encoder.config.type_vocab_size > 0)
        tokens = tokenizer.rust.get_vocab_size(with_added_tokens=True)
        if tokens > encoder.config.vocab_size:  # ids past the table would fail, or read another row, at encode time
            raise ValueError(f"the tokenizer in {layout.transformer_dir} has {tokens} tokens but the model's embedding "
                             f"table (vocab_size in config.json) has {encoder.config.vocab_size} rows; the tokenizer "
                             "belongs to another model: use the model's own")
        prompts = model_prompts(prompts, layout.prompts)
        model = cls(encoder, tokenizer, layout.pooling, layout.dense, layout.normalize_embeddings,
                    layout.transformer_dir, fast, layout.similarity_fn_name, truncate_dim, prompts,
                    default_prompt_name if default_prompt_name is not None else layout.default_prompt_name)
        return model.to(device if device is not None else default_device()).eval()
