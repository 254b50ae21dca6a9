"""A sentence-embedding model: tokenizer -> encoder -> pooling -> (dense) -> (normalize).

Reimers and Gurevych (2019), "Sentence-BERT: Sentence Embeddings using Siamese BERT-Networks",
figure 1: the same network embeds each sentence on its own; sentences are then compared by cosine
similarity. `SentenceModel.forward` is that network on a tokenized batch (what training
differentiates), `encode()` the way to run it over many texts, and `save`/`from_dir` move it to and
from a sentence-transformers directory (encoding/st_directory.py).

sentence-transformers' other calls (prompts, truncate_dim, precision, token embeddings,
similarity, encode_query/encode_document) are a class of their own over this one:
porting/sentence_transformer.py, which is what `minisbert.load` returns.

Same text, same vector: encode() gives a text the same embedding, to the bit, whatever batch it is
in. The plain way runs the network on each text alone, as the figure draws it. This module is that
plain way, and imports nothing from minisbert/fast/: a fast path (encoding/fast/batching.py: the fast encoder
with padding skipped and fused kernels, batches cut to CPU cache size, memory reused) is plugged in
from outside, as `fast_path`, by `minisbert.load(..., fast=True)`, the default. It computes the same
function and keeps the promise on a CPU (encoding/fast/batching.py says how). Checked against
sentence-transformers in tests/encoding/test_model.py, the two ways against each other in
tests/encoding/test_encoder_fast.py, the promise in tests/encoding/test_batch_invariance.py, the precisions
(common/precision.py) in tests/encoding/test_bfloat16.py.
"""

import contextlib
import numbers
from pathlib import Path

import torch
from torch import nn

from .encoder import Encoder
from ..common.fileio import write_dir
from .pooling import Dense, normalize, pool
from ..common.precision import computing_in, default_device
from ..common.progress import Progress
from .st_directory import read_layout, write_layout
from .tokenizer import Tokenizer
from .weights import load_encoder, saved_files

PROGRESS_MIN_TEXTS = 1000  # show a progress line for inputs at least this long


class SentenceModel(nn.Module):
    def __init__(self, encoder: Encoder, tokenizer: Tokenizer, pooling: str = "mean",
                 dense: Dense = None, normalize_embeddings: bool = False, tokenizer_dir=None, fast_path=None):
        super().__init__()
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.pooling = pooling  # one of pooling.POOLING_MODES, checked where it is used (pool)
        self.dense = dense
        self.normalize_embeddings = normalize_embeddings
        # Where the tokenizer's side files (vocab, special tokens) came from, to copy them on save.
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else None
        # What runs the encoder, the Dense layer and encode()'s batches fast (encoding/fast/batching.py's FAST_PATH),
        # used unless a call says fast=False; None: the plain way only.
        self.fast_path = fast_path

    def extra_repr(self) -> str:
        """The first line of print(model): its pooling, and the path that runs it (the fast path plugged in
        describes the kernels it runs here; None: the plain network)."""
        path = "plain network" if self.fast_path is None else self.fast_path.describe(self)
        return f"pooling={self.pooling!r}, normalize_embeddings={self.normalize_embeddings}, path: {path}"

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dimension(self) -> int:
        """The size of the model's embeddings."""
        return self.dense.linear.out_features if self.dense is not None else self.encoder.config.hidden_size

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

    def fast_path_for(self, fast: bool = None):
        """The fast path a call runs, or None for the plain way: fast=None follows the model (its
        fast_path, if any), False is the plain way, True the fast path (an error if none is plugged in)."""
        if fast and self.fast_path is None:
            raise ValueError("fast=True, but this model has no fast path plugged in: load it with "
                             "minisbert.load(..., fast=True), or pass fast_path=minisbert.encoding.fast.batching.FAST_PATH")
        return None if fast is False else self.fast_path

    def forward_tokens(self, batch: dict, fast: bool = None) -> torch.Tensor:
        """A tokenized batch -> the encoder's token vectors (B, T, H)."""
        ids, mask, types = batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids")
        path = self.fast_path_for(fast)
        if path is not None:
            return path.encoder(self.encoder, ids, mask, types)  # (B, T, H)
        return self.encoder(ids, mask, types)  # (B, T, H)

    def forward(self, batch: dict, fast: bool = None):
        """A tokenized batch -> sentence embeddings (B, D), differentiable (used in training)."""
        tokens = self.forward_tokens(batch, fast)  # (B, T, H)
        embeddings = pool(tokens, batch["attention_mask"], self.pooling)  # (B, H); float32 under autocast too
        if self.dense is not None:
            path = self.fast_path_for(fast)
            dense = self.dense(embeddings) if path is None else path.dense(self.dense, embeddings)  # (B, D)
            embeddings = dense.float()  # an autocast product is back in float32
        if self.normalize_embeddings:
            embeddings = normalize(embeddings)
        return embeddings

    def tokenize(self, texts) -> dict:
        return {name: t.to(self.device) for name, t in self.tokenizer(texts).items()}

    @torch.inference_mode()
    def encode(self, sentences, batch_size: int = 32, show_progress_bar: bool = None,
               convert_to_numpy: bool = True, convert_to_tensor: bool = False,
               normalize_embeddings: bool = False, dtype: str = "float32", fast: bool = None):
        """Embed `sentences` (arguments as sentence-transformers' encode() names them): one str -> one
        embedding (D,); any iterable of str -> (n, D), rows in its order; as `convert_output` says.
        normalize_embeddings: scale each to unit length (a model ending in Normalize always does).
        show_progress_bar: None shows a progress line from PROGRESS_MIN_TEXTS texts on.
        dtype: the precision the encoder computes in (common/precision.py); embeddings are float32 anyway (or
        the weights' dtype, where the network itself was cast: `model.half()`, `.bfloat16()`, `.double()`).
        fast: None follows the model (its fast path, if it has one); False runs the plain encoder on
        one text at a time. Either way a text gets the same embedding whatever batch it is in."""
        one_sentence = isinstance(sentences, str)
        id_lists = self.tokenizer.token_ids([sentences] if one_sentence else sentences)
        # float32, or the parameters' own dtype where the network was cast (model.half(), .double()):
        # a network of float16 weights gives float16 embeddings, as sentence-transformers' does.
        embeddings = torch.empty((len(id_lists), self.dimension), dtype=self.parameters_dtype(),
                                 device=self.device if convert_to_tensor else "cpu")  # (n, D)
        for rows, batch in self.batches(id_lists, batch_size, show_progress_bar, dtype, fast):
            batch_embeddings = self(batch, fast=fast)  # (B, D)
            if normalize_embeddings:
                batch_embeddings = normalize(batch_embeddings)
            embeddings[rows] = batch_embeddings.to(embeddings.device)  # back to input order
        return convert_output(embeddings, one_sentence, convert_to_numpy, convert_to_tensor)

    def parameters_dtype(self) -> torch.dtype:
        """The dtype of the network's weights: float32 unless it was cast (`.half()`, `.double()`)."""
        return self.encoder.embeddings.word_embeddings.weight.dtype

    def batches(self, id_lists: list, batch_size: int, show_progress_bar, dtype: str, fast):
        """Yield (rows, padded batch on the model's device), the model in eval mode and computing in
        `dtype`, where `rows` are the batch's indices into id_lists.

        Sorted by length, so that each batch pads little; the caller puts rows back in input order.
        The plain way runs each text alone: what the network gives one text is then the same in any
        call, whatever else is encoded with it. A fast path (encoding/fast/batching.py) makes batches of up to
        batch_size texts, cut to the CPU's cache, and reuses memory between them."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        computing = computing_in(dtype, self.device)
        n = len(id_lists)
        longest_first = sorted(range(n), key=lambda i: -len(id_lists[i]))
        path = self.fast_path_for(fast)
        if path is not None:
            row_lists, memory = path.batching(longest_first, id_lists, batch_size, self.device)
        else:
            row_lists, memory = ([row] for row in longest_first), contextlib.nullcontext()
        progress = Progress(n, "encoded", "texts",
                            show=n >= PROGRESS_MIN_TEXTS if show_progress_bar is None else show_progress_bar)
        was_training = self.training
        if was_training:  # switching walks every submodule: a short query's encode() would pay for it
            self.eval()
        try:
            with memory, computing:
                for rows in row_lists:
                    yield rows, {k: t.to(self.device) for k, t in self.tokenizer.pad([id_lists[i] for i in rows]).items()}  # (B, T)
                    progress.update(len(rows))
        finally:
            if was_training:
                self.train()
            progress.close()

    def save(self, path) -> None:
        """Write the sentence-transformers layout to `path`, replacing it only once fully written. An
        existing folder is replaced only where it is empty or holds what an earlier save wrote and
        nothing more: any other file in it would be lost, so such a folder is refused, naming them."""
        write_model_dir(path, lambda folder: write_layout(folder, self))

    @classmethod
    def from_dir(cls, model_dir, device=None, fast_path=None) -> "SentenceModel":
        """Load a sentence-transformers directory, or a plain Hugging Face model directory.
        device: None picks cuda, then mps, then cpu. fast_path: see __init__ (minisbert.load plugs one in)."""
        layout = read_layout(model_dir)
        encoder = load_encoder(layout.transformer_dir)
        # As in sentence-transformers, the smaller of the directory's limit (absent, or 1e30: Hugging Face's
        # "no limit", written when a tokenizer was saved without one) and the positions.
        limit = min(layout.max_seq_length or encoder.config.max_tokens, encoder.config.max_tokens)
        tokenizer = Tokenizer.from_dir(layout.transformer_dir, limit, uses_token_types=encoder.config.type_vocab_size > 0)
        if layout.lowercase:  # sentence-transformers lowercases such texts before its tokenizer: ours does it first
            tokenizer.lowercase_first()
        check_vocabulary(tokenizer, encoder, layout.transformer_dir)
        model = cls(encoder, tokenizer, layout.pooling, layout.dense, layout.normalize_embeddings,
                    layout.transformer_dir, fast_path=fast_path)
        return model.to(device if device is not None else default_device()).eval()


def write_model_dir(path, fill) -> None:
    """fill(folder) on a staging folder, then moved in place of `path` (fileio.write_dir), where
    `check_replaceable` lets it: every save of a model folder goes through here."""
    target = Path(path).resolve()  # "." has a name, and a link's folder is written, not the link
    check_replaceable(target)
    write_dir(target, fill)


def check_replaceable(target: Path) -> None:
    """Refuse to save over `target` where that would lose something: a file, or a folder holding
    anything but the files a minisbert save wrote there (`saved_files`) and their folders."""
    working = Path.cwd().resolve()
    if target == working or target in working.parents:
        raise ValueError(f"{target} holds the working folder, which a save would replace under this process; "
                         "save to another folder")
    if not target.exists():
        return
    if not target.is_dir():
        raise ValueError(f"{target} is a file, not a folder: save the model to a folder")
    present = {entry.relative_to(target).as_posix() for entry in target.rglob("*")}
    written = saved_files(target) or set()
    kept = written | {parent.as_posix() for name in written for parent in Path(name).parents if parent != Path(".")}
    if others := sorted(present - kept):
        listed = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise ValueError(f"{target} holds what no minisbert save wrote there ({listed}); saving would remove it: "
                         "save to a new or empty folder, or move those out first")


def check_vocabulary(tokenizer: Tokenizer, encoder: Encoder, folder: Path) -> None:
    """Refuse a tokenizer with more tokens than the encoder has embedding rows: their ids would fail,
    or read another token's row, at encode time."""
    tokens = tokenizer.rust.get_vocab_size(with_added_tokens=True)
    if tokens > encoder.config.vocab_size:
        raise ValueError(f"the tokenizer in {folder} has {tokens} tokens but the model's embedding table (vocab_size "
                         f"in config.json) has {encoder.config.vocab_size} rows; the tokenizer belongs to another "
                         "model: use the model's own")


def convert_output(embeddings: torch.Tensor, one_text: bool, convert_to_numpy: bool, convert_to_tensor: bool):
    """encode()'s (n, D) tensor in the form asked for: the tensor itself, on the model's device
    (convert_to_tensor, which wins); a numpy array (convert_to_numpy, encode's default); or, with
    both False, a list of (D,) tensors. For one text (one_text) its row alone."""
    if convert_to_tensor:
        result = embeddings
    elif convert_to_numpy:  # numpy has no bfloat16: float32 holds its every value
        result = (embeddings.float() if embeddings.dtype == torch.bfloat16 else embeddings).cpu().numpy()
    else:
        result = list(embeddings)
    return result[0] if one_text else result
