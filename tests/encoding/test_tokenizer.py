"""Text to token ids as Hugging Face's tokenizers compute them, for each of the three ways a model
directory can describe its tokenizer.

The fixtures hold one of each: tiny_bert a `vocab.txt` (WordPiece, lowercasing, built by
minisbert), tiny_roberta a `vocab.json` + `merges.txt` (byte-level BPE, built by minisbert),
tiny_distilbert and tiny_st_dense a `tokenizer.json`; their reference ids and token strings were
made by transformers' AutoTokenizer and by sentence-transformers (tests/fixtures/make_fixtures.py).
"Correct" means: the same ids and tokens on six sentences (accents, an emoji, unknown words, runs of
spaces, one cut by truncation); truncation at max_seq_length with the special tokens kept, whatever
a tokenizer.json carried; padding with the model's own padding id and a mask that marks real tokens.
"""

import json

import pytest
import torch
from tokenizers import models

from minisbert.encoding.tokenizer import Tokenizer

from ..conftest import FIXTURES, reference

KINDS = {  # fixture -> (the model it builds, its padding id, whether it gives token types)
    "tiny_bert": (models.WordPiece, 0, True),
    "tiny_distilbert": (models.WordPiece, 0, False),
    "tiny_roberta": (models.BPE, 1, False),
    "tiny_st_dense": (models.WordPiece, 0, True),
}


def fixture_tokenizer(name, max_seq_length):
    return Tokenizer.from_dir(FIXTURES / name, max_seq_length, uses_token_types=KINDS[name][2])


@pytest.mark.parametrize("name", KINDS)
def test_ids_and_tokens_match_hugging_face(name):
    _, ref, info = reference(name)
    max_length = info.get("max_length", info.get("max_seq_length"))  # 16, or 12 for tiny_st_dense
    tokenizer = fixture_tokenizer(name, max_length)
    assert isinstance(tokenizer.rust.model, KINDS[name][0])
    batch = tokenizer(info["sentences"])
    assert torch.equal(batch["input_ids"], ref["input_ids"])
    assert torch.equal(batch["attention_mask"], ref["attention_mask"])
    tokens = [[tokenizer.rust.id_to_token(i) for i in ids] for ids in tokenizer.token_ids(info["sentences"])]
    assert tokens == info["tokens"]


def test_wordpiece_from_vocab_txt_lowercases_as_its_config_says():
    tokenizer = fixture_tokenizer("tiny_bert", 16)  # tokenizer_config.json: do_lower_case true
    assert tokenizer.token_ids(["A MAN"]) == tokenizer.token_ids(["a man"])
    assert tokenizer.rust.id_to_token(tokenizer.token_ids(["A MAN"])[0][1]) == "a"


def test_wordpiece_from_vocab_txt_alone_lowercases_as_bert_tokenizer_does(tmp_path):
    # No tokenizer_config.json: transformers' BertTokenizer defaults to do_lower_case=True.
    (tmp_path / "vocab.txt").write_bytes((FIXTURES / "tiny_bert" / "vocab.txt").read_bytes())
    tokenizer = Tokenizer.from_dir(tmp_path, 16)
    lowered = fixture_tokenizer("tiny_bert", 16).token_ids(["a man"])
    assert tokenizer.token_ids(["A MAN"]) == tokenizer.token_ids(["a man"]) == lowered


@pytest.mark.parametrize("config, ids", [
    ({"do_lower_case": True}, [2, 5, 8, 10, 11, 3]),  # strip_accents unset: stripped where lowercased
    ({"do_lower_case": True, "strip_accents": False}, [2, 4, 7, 10, 11, 3]),  # lowercased, accents kept
    ({"do_lower_case": False, "strip_accents": True}, [2, 6, 8, 10, 11, 3]),  # cased, accents stripped
    ({"do_lower_case": True, "tokenize_chinese_chars": False}, [2, 5, 8, 9, 3]),  # 你好 one word
])
def test_wordpiece_from_vocab_txt_reads_every_normalizing_setting_of_its_config(tmp_path, config, ids):
    # The ids transformers' BertTokenizer (5.x, in the peer environment) gives with these settings. strip_accents
    # and tokenize_chinese_chars were once left at their defaults: an uncased model that keeps accents (a Turkish
    # BERT) read "café" as "cafe".
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\ncafé\ncafe\nCafe\nnaïve\nnaive\n你好\n你\n好\n",
                                        encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer.from_dir(tmp_path, 16).token_ids(["Café naïve 你好"]) == [ids]


def test_wordpiece_cleans_control_characters_and_splits_chinese_characters_as_bert_does():
    # BERT's basic tokenizer (transformers' BertTokenizer: clean_text and tokenize_chinese_chars, both on by
    # default): a NUL, U+FFFD and other control characters are dropped, and each CJK ideograph is a word of
    # its own (here each unknown: [UNK] once per character, not once for the run).
    tokenizer = fixture_tokenizer("tiny_bert", 16)
    assert tokenizer.token_ids(["a\x00 man\x07\ufffd"]) == tokenizer.token_ids(["a man"])
    unknown = tokenizer.rust.token_to_id("[UNK]")
    assert tokenizer.token_ids(["\u4f60\u597d"])[0][1:-1] == [unknown, unknown]  # 你好


@pytest.mark.parametrize("name", KINDS)
def test_truncation_follows_max_seq_length_and_keeps_the_special_tokens(name):
    tokenizer = fixture_tokenizer(name, 512)
    long_text = "the girl is playing with a dog in the park " * 10
    full, short = tokenizer.token_ids([long_text, "a man"])
    assert len(full) > 40 and len(short) <= 5
    for length in (40, 5, 2):
        tokenizer.max_seq_length = length  # the only thing a caller sets
        cut, short_again = tokenizer.token_ids([long_text, "a man"])
        assert len(cut) == length
        assert cut[:-1] == full[:length - 1] and cut[-1] == full[-1]  # the text is cut, the end token stays
        assert short_again == (short if length >= len(short) else short[:length - 1] + short[-1:])


def test_a_stale_truncation_in_tokenizer_json_does_not_win():
    """tiny_st_legacy's tokenizer.json truncates at 8; the model's max_seq_length is 12."""
    _, ref, info = reference("tiny_st_legacy")
    tokenizer = Tokenizer.from_dir(FIXTURES / "tiny_st_legacy", info["max_seq_length"])
    assert tokenizer.rust.truncation["max_length"] == 12
    assert torch.equal(tokenizer(info["sentences"])["input_ids"], ref["input_ids"])


@pytest.mark.parametrize("value", [1, 0, -3, 2.0, "16", None, True])
def test_max_seq_length_must_leave_room_for_the_special_tokens(value):
    """The Rust tokenizer silently ignores a limit of 1 (it returns the whole text)."""
    tokenizer = fixture_tokenizer("tiny_bert", 16)
    with pytest.raises(ValueError, match=f"max_seq_length must be an int of at least 2.*got {value!r}"):
        tokenizer.max_seq_length = value
    assert tokenizer.max_seq_length == 16 and tokenizer.rust.truncation["max_length"] == 16


@pytest.mark.parametrize("name", KINDS)
def test_padding_uses_the_models_padding_id_and_marks_real_tokens(name):
    _, pad_id, gives_types = KINDS[name]
    tokenizer = fixture_tokenizer(name, 16)
    id_lists = tokenizer.token_ids(["a man is eating food.", "", "dogs run."])
    lengths = [len(ids) for ids in id_lists]
    assert lengths[1] == 2  # an empty text is its two special tokens
    batch = tokenizer.pad(id_lists)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (3, max(lengths))
    for row, ids in enumerate(id_lists):
        assert batch["input_ids"][row, :len(ids)].tolist() == ids
        assert (batch["input_ids"][row, len(ids):] == pad_id).all()
        assert batch["attention_mask"][row].tolist() == [1] * len(ids) + [0] * (max(lengths) - len(ids))
    assert ("token_type_ids" in batch) == gives_types
    if gives_types:
        assert not batch["token_type_ids"].any()  # one sentence: all type 0


def test_a_tokenizer_gives_token_types_unless_told():
    # as BERT's do: token types are the default; DistilBERT and RoBERTa say they have none
    rust = fixture_tokenizer("tiny_bert", 16).rust
    assert "token_type_ids" in Tokenizer(rust, 16, "[PAD]")(["a man"])
    assert "token_type_ids" not in Tokenizer(rust, 16, "[PAD]", uses_token_types=False)(["a man"])
    assert "token_type_ids" in Tokenizer.from_dir(FIXTURES / "tiny_bert", 16)(["a man"])


def test_a_generator_is_read_once_and_gives_every_text():
    tokenizer = fixture_tokenizer("tiny_bert", 16)
    texts = ["a man", "the girl is playing", ""]
    assert tokenizer.token_ids(text for text in texts) == tokenizer.token_ids(texts)


def test_save_and_reload_give_the_same_ids(tmp_path):
    _, _, info = reference("tiny_roberta")
    tokenizer = fixture_tokenizer("tiny_roberta", 16)
    tokenizer.save(tmp_path)
    again = Tokenizer.from_dir(tmp_path, 16)  # now from tokenizer.json, not vocab.json + merges.txt
    assert again.token_ids(info["sentences"]) == tokenizer.token_ids(info["sentences"])
    assert again.pad_id == 1


def test_a_folder_without_a_tokenizer_or_padding_token_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no tokenizer in {tmp_path}: expected tokenizer.json"):
        Tokenizer.from_dir(tmp_path, 16)
    (tmp_path / "vocab.json").write_bytes((FIXTURES / "tiny_roberta" / "vocab.json").read_bytes())
    with pytest.raises(FileNotFoundError, match="vocab.json \\+ merges.txt"):  # half of a BPE tokenizer is none
        Tokenizer.from_dir(tmp_path, 16)
    (tmp_path / "vocab.json").unlink()
    (tmp_path / "vocab.txt").write_text("[CLS]\n[SEP]\n[UNK]\nword\n")
    with pytest.raises(ValueError, match=r"padding token '\[PAD\]' is not in the tokenizer's vocabulary"):
        Tokenizer.from_dir(tmp_path, 16)
