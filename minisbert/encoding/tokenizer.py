"""Text to token ids, through the `tokenizers` package (the Rust library behind Hugging Face's fast
tokenizers).

A model directory describes its tokenizer in one of three ways, tried in this order:
1. `tokenizer.json`: the whole pipeline, serialised (normaliser, pre-tokenizer, model, post-processor).
2. `vocab.txt`: BERT's WordPiece. Built here: BERT's normaliser (lowercasing if `tokenizer_config.json`
   says `do_lower_case`), split on whitespace and punctuation, WordPiece with `##` continuations,
   then `[CLS] ... [SEP]`.
3. `vocab.json` + `merges.txt`: RoBERTa's byte-level BPE. Built here: text as bytes mapped to
   printable characters, BPE merges, then `<s> ... </s>`.

Batches come back truncated to `max_seq_length` (special tokens included), padded to the longest
sequence, with the attention mask (1 = token, 0 = padding) and token types (all 0: one sentence).
Checked against Hugging Face's tokenizers in tests/encoding/test_tokenizer.py.
"""

import numbers
from collections.abc import Mapping
from pathlib import Path

import torch
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from ..common.fileio import read_json

WORDPIECE_SPECIALS = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]"}
BPE_SPECIALS = {"cls_token": "<s>", "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}


def special_tokens(model_dir: Path, defaults: dict) -> dict:
    """Special token strings from tokenizer_config.json / special_tokens_map.json, else defaults."""
    found = dict(defaults)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        for key, value in read_json(model_dir / name, {}).items():
            if key in defaults:
                found[key] = value["content"] if isinstance(value, dict) else value
    return found


def wordpiece_from_vocab(vocab_file: Path, lowercase: bool, specials: dict, strip_accents: bool | None = None,
                         chinese_chars: bool = True) -> RustTokenizer:
    """BertTokenizer's pipeline from its vocab.txt. strip_accents None: as lowercase (BertTokenizer's
    rule); chinese_chars: each CJK character a word of its own (its tokenize_chinese_chars)."""
    vocab = {}
    for index, token in enumerate(vocab_file.read_text(encoding="utf-8").splitlines()):
        vocab[token] = index  # a repeated line keeps its last index, as BertTokenizer does
    tokenizer = RustTokenizer(models.WordPiece(vocab, unk_token=specials["unk_token"]))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=chinese_chars, strip_accents=strip_accents, lowercase=lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = specials["cls_token"], specials["sep_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])],
    )
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def byte_level_bpe(vocab_file: Path, merges_file: Path, specials: dict) -> RustTokenizer:
    tokenizer = RustTokenizer(models.BPE.from_file(str(vocab_file), str(merges_file)))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    cls, sep = specials["cls_token"], specials["sep_token"]
    tokenizer.post_processor = processors.RobertaProcessing(
        (sep, tokenizer.token_to_id(sep)), (cls, tokenizer.token_to_id(cls)),
        trim_offsets=True, add_prefix_space=False,
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


class Tokenizer:
    def __init__(self, rust_tokenizer: RustTokenizer, max_seq_length: int, pad_token: str,
                 uses_token_types: bool = True):
        pad_id = rust_tokenizer.token_to_id(pad_token)
        if pad_id is None:
            raise ValueError(f"padding token {pad_token!r} is not in the tokenizer's vocabulary")
        self.rust = rust_tokenizer
        self.pad_token = pad_token
        self.pad_id = pad_id
        self.uses_token_types = uses_token_types
        # Whatever a tokenizer.json carried, truncation and padding are ours to set.
        self.max_seq_length = max_seq_length
        self.rust.no_padding()

    @property
    def max_seq_length(self) -> int:
        """The most tokens a text keeps, special tokens included; longer texts are cut at the end."""
        return self._max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 2:
            raise ValueError(f"max_seq_length must be an int of at least 2 (room for the special "
                             f"tokens around a text), got {value!r}")
        self._max_seq_length = int(value)
        self.rust.enable_truncation(max_length=int(value))

    @classmethod
    def from_dir(cls, model_dir, max_seq_length: int, uses_token_types: bool = True) -> "Tokenizer":
        model_dir = Path(model_dir)
        config = read_json(model_dir / "tokenizer_config.json", {})
        if (model_dir / "tokenizer.json").is_file():
            try:
                rust = RustTokenizer.from_file(str(model_dir / "tokenizer.json"))
            except Exception as error:  # the tokenizers package raises a bare Exception for a file it cannot read
                raise ValueError(f"{model_dir / 'tokenizer.json'} is not a tokenizer the tokenizers package can read "
                                 f"({error}); repair it or replace it with the model's original") from None
            is_bpe = isinstance(rust.model, models.BPE)
            pad = special_tokens(model_dir, BPE_SPECIALS if is_bpe else WORDPIECE_SPECIALS)["pad_token"]
        elif (model_dir / "vocab.txt").is_file():
            specials = special_tokens(model_dir, WORDPIECE_SPECIALS)
            rust = wordpiece_from_vocab(model_dir / "vocab.txt", config.get("do_lower_case", True), specials,
                                        config.get("strip_accents"), config.get("tokenize_chinese_chars", True))
            pad = specials["pad_token"]
        elif (model_dir / "vocab.json").is_file() and (model_dir / "merges.txt").is_file():
            specials = special_tokens(model_dir, BPE_SPECIALS)
            rust = byte_level_bpe(model_dir / "vocab.json", model_dir / "merges.txt", specials)
            pad = specials["pad_token"]
        else:
            raise FileNotFoundError(
                f"no tokenizer in {model_dir}: expected tokenizer.json, vocab.txt, or "
                "vocab.json + merges.txt"
            )
        return cls(rust, max_seq_length, pad, uses_token_types)

    def lowercase_first(self) -> None:
        """Lowercase every text before the tokenizer's own normalization (a directory's do_lower_case),
        kept in its tokenizer.json when saved."""
        normalizer = self.rust.normalizer
        self.rust.normalizer = (normalizers.Lowercase() if normalizer is None
                                else normalizers.Sequence([normalizers.Lowercase(), normalizer]))

    def token_ids(self, texts) -> list:
        """Token ids of each text, truncated but not padded: a list of lists, one per text.

        `texts` is any iterable of str (a list, a tuple, a generator, ...), read once."""
        texts = self.text_list(texts)
        try:
            encodings = self.rust.encode_batch(texts)
        except TypeError:  # the Rust side refuses a str that is not valid Unicode, without saying which
            for position, text in enumerate(texts):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as error:
                    raise ValueError(f"text {position} is not valid Unicode: character {error.start} is "
                                     f"{text[error.start]!r} ({error.reason}), near {text[max(0, error.start - 30):error.start]!r}; "
                                     "fix the text or the way it was read (decode files as UTF-8)") from None
            raise
        return [encoding.ids for encoding in encodings]

    @staticmethod
    def text_list(texts) -> list:
        """`texts`, any iterable of str read once, as a list; a clear error for anything else."""
        if isinstance(texts, (str, bytes)):
            raise TypeError(f"expected an iterable of texts, got a single {type(texts).__name__} "
                            f"{texts[:40]!r}; wrap it in a list")
        if isinstance(texts, Mapping):
            raise TypeError(f"expected an iterable of texts, got a {type(texts).__name__}; "
                            "pass list(d.values()) or list(d.keys()), whichever holds the texts")
        try:
            texts = iter(texts)
        except TypeError:
            raise TypeError(f"expected an iterable of texts, got {type(texts).__name__}: {texts!r:.60}") from None
        texts = list(texts)  # a generator can be read only once
        for position, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"text {position} is {type(text).__name__}, not str: {text!r:.60}")
        return texts

    def pad(self, id_lists) -> dict:
        """Pad token id lists to the longest into tensors: input_ids, attention_mask (B, T)."""
        longest = max(len(ids) for ids in id_lists)
        input_ids = torch.full((len(id_lists), longest), self.pad_id, dtype=torch.long)  # (B, T)
        attention_mask = torch.zeros((len(id_lists), longest), dtype=torch.long)  # (B, T)
        for row, ids in enumerate(id_lists):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, : len(ids)] = 1
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.uses_token_types:
            batch["token_type_ids"] = torch.zeros_like(input_ids)
        return batch

    def __call__(self, texts) -> dict:
        return self.pad(self.token_ids(texts))

    def save(self, model_dir) -> None:
        self.rust.save(str(Path(model_dir) / "tokenizer.json"))
