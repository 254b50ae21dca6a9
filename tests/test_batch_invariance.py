"""Same text, same vector: encode() gives a text the same embedding, to the last bit, whatever batch
it is in (minisbert/fast/encode.py says how the fast path keeps that; the plain path runs each text
alone).

"Correct" means: 64 texts of 2 to 250 tokens, encoded at batch sizes 1, 2, 5, 16 and 64, in order and
shuffled, with another token budget, as a list and one string at a time, give every text exactly the
embedding (torch.equal) it gets when encoded alone; in float32, and in bfloat16 where the CPU
multiplies it natively; on the fast path and the plain path. And two processes on one machine, one of
them while the machine is loaded, give the same bits. No tolerance here: anything but equality fails.

The model is random, of all-MiniLM-L6-v2's widths (so its products and attention meet the kernels
the real model meets) but one block deep, with a Dense layer and Normalize after mean pooling, so that
every step encode() takes is covered and the test runs in seconds on any CPU.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from minisbert import cpu
from minisbert.config import EncoderConfig
from minisbert.encoder import Encoder
from minisbert.fast import encode as fast_encode
from minisbert.fast import machine
from minisbert.fast.encode import FAST_PATH
from minisbert.model import SentenceModel
from minisbert.pooling import Dense
from minisbert.tokenizer import Tokenizer

from .conftest import FIXTURES, REPO

MINILM_WIDTHS = dict(hidden_size=384, num_heads=12, intermediate_size=1536)
LONGEST = 250  # tokens, [CLS] and [SEP] included
BATCH_SIZES = (1, 2, 5, 16, 64)
DTYPES = [pytest.param("float32"), pytest.param("bfloat16", marks=pytest.mark.skipif(
    not cpu.native_bfloat16(), reason="this CPU has no native bfloat16 products (AVX512-BF16 or AMX): "
                                      "encode() refuses bfloat16 here"))]


@pytest.fixture(scope="module")
def model():
    vocab = FIXTURES / "tiny_bert"
    tokenizer = Tokenizer.from_dir(vocab, max_seq_length=LONGEST)
    config = EncoderConfig(family="bert", vocab_size=tokenizer.rust.get_vocab_size(), num_layers=1,
                           max_position_embeddings=LONGEST, type_vocab_size=2, layer_norm_eps=1e-12,
                           activation="gelu", pad_token_id=0, hidden_dropout=0.1, attention_dropout=0.1,
                           positions_after_pad=False, **MINILM_WIDTHS)
    torch.manual_seed(0)
    dense = Dense(config.hidden_size, 256, activation="tanh")
    return SentenceModel(Encoder(config), tokenizer, "mean", dense, normalize_embeddings=True,
                         tokenizer_dir=vocab, fast_path=FAST_PATH).eval()


@pytest.fixture(scope="module")
def texts(model) -> list:
    """64 texts of 0 to 248 words of the vocabulary, one token each: 2 to 250 tokens."""
    words = [w for w in model.tokenizer.rust.get_vocab() if w.isalpha() and w.islower()]
    generator = torch.Generator().manual_seed(0)
    lengths = [0, LONGEST - 2] + torch.randint(0, LONGEST - 1, (62,), generator=generator).tolist()
    texts = [" ".join(words[i] for i in torch.randint(0, len(words), (n,), generator=generator).tolist())
             for n in lengths]
    assert sorted(map(len, model.tokenizer.token_ids(texts)))[::63] == [2, LONGEST]
    return texts


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "plain"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_text_gets_the_same_bits_in_any_batch(model, texts, dtype, fast, monkeypatch):
    def encode(inputs, **options):
        return model.encode(inputs, convert_to_tensor=True, dtype=dtype, fast=fast, **options)

    alone = torch.stack([encode(text) for text in texts])  # (64, D): each text its own call, as one string
    shuffled = torch.randperm(len(texts), generator=torch.Generator().manual_seed(1)).tolist()
    for batch_size in BATCH_SIZES:
        for order in (list(range(len(texts))), shuffled):
            embeddings = encode([texts[i] for i in order], batch_size=batch_size)
            different = (embeddings != alone[order]).any(dim=1).sum().item()
            assert different == 0, f"{different} of {len(texts)} rows differ at batch size {batch_size}"
    assert torch.equal(encode([texts[5]]), alone[5:6])  # a list of one
    monkeypatch.setattr(fast_encode, "CPU_TOKENS_PER_FORWARD", 700)  # another token budget, other company
    assert torch.equal(encode(texts, batch_size=64), alone)


def test_the_forward_pass_of_one_text_equals_it_in_a_padded_batch(model, texts):
    """What training's forward gives (rows, not whole tiles) is not promised bit for bit, but the
    fast forward without autograd is: a text padded among longer ones equals it alone."""
    batch = model.tokenize(texts[:8])
    with torch.no_grad():
        together = model(batch)  # (8, D)
        for row, text in enumerate(texts[:8]):
            assert torch.equal(model(model.tokenize([text]))[0], together[row])


ENCODE_IN_A_PROCESS = """
import json, sys
import numpy as np
import minisbert
model = minisbert.load(sys.argv[1], device="cpu")
texts = json.loads(open(sys.argv[2]).read())
for dtype in sys.argv[4:]:
    np.save(f"{sys.argv[3]}-{dtype}.npy", model.encode(texts, batch_size=16, dtype=dtype))
"""


def busy_processes(count: int) -> list:
    """`count` processes that keep a core each busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def test_two_processes_one_of_them_under_load_give_the_same_bits(model, texts, tmp_path):
    model.save(tmp_path / "model")
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    dtypes = ["float32"] + (["bfloat16"] if cpu.native_bfloat16() else [])
    env = {**os.environ, machine.MACHINE_FILE_VARIABLE: str(tmp_path / "machine.json")}
    env.pop("MINISBERT_GEMM", None)  # the kernels are chosen as a user's process chooses them

    def encode_in_a_process(name):
        subprocess.run([sys.executable, "-c", ENCODE_IN_A_PROCESS, str(tmp_path / "model"),
                        str(tmp_path / "texts.json"), str(tmp_path / name), *dtypes],
                       env=env, cwd=REPO, check=True, capture_output=True, text=True)

    # The loaded process runs first: it meets every product's shape first and measures it under load.
    load = busy_processes(os.cpu_count() or 1)
    try:
        encode_in_a_process("loaded")
    finally:
        for process in load:
            process.kill()
            process.wait()
    encode_in_a_process("idle")
    for dtype in dtypes:
        loaded, idle = np.load(tmp_path / f"loaded-{dtype}.npy"), np.load(tmp_path / f"idle-{dtype}.npy")
        assert loaded.shape == (len(texts), 256) and np.array_equal(loaded, idle), dtype
