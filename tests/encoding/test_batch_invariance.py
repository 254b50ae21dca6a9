"""Same text, same vector: encode() gives a text the same embedding, to the last bit, whatever batch
it is in (minisbert/encoding/fast/batching.py says how the fast path makes that hold; the plain path runs each
text alone).

"Correct" means: for each way this CPU can compute an embedding (the plain path, and the fast path
with each product kernel a machine's fact can choose, forced in turn with MINISBERT_GEMM) in each
dtype it multiplies natively (float32, and bfloat16 where it has bfloat16 products), batches drawn
from a seed give every text exactly (torch.equal) the embedding it gets encoded alone, as one string.
A batch is a few of 32 texts of 2 to 250 tokens (pairs of them share a length), in any order and
with repeats, encoded as a list at a batch size of 1 to 64 under a token budget from one long text
to many. Without autograd the model's forward pass holds the same: a text padded among others, down
to one token, equals it alone. No tolerance here: anything but equality fails.

The fast path holds this by construction, not by luck of the kernels (encoding/fast/tiled_linear.py): no kernel
is called with a shape that depends on the batch. A CPU whose kernels happen to give a row the same
bits at any row count would pass the property test even with that broken, so the construction is
checked too, by watching every call: each product gets whole tiles, stacked only where the
machine's check found the kernel keeps a tile's bits in a stack (a kernel planted to fail that check
is run a tile a call), each attention call one text or a fixed number of texts of one length, only at
lengths where the machine's check found the kernel keeps a text's bits among them. And
two processes on one machine, the first of them
timing the kernels while the machine is loaded (as a user's process does; the test session itself
times nothing: tests/conftest.py), give the same bits: the kernel chosen for each product is kept
per machine (common/machine.py).

The model is random, of all-MiniLM-L6-v2's widths (so its products and attention meet the kernels
the real model meets) but one block deep, with a Dense layer and Normalize after mean pooling, so that
every step encode() takes is covered and the tests run in seconds on any CPU.
"""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from minisbert.common import cpu
from minisbert.encoding.config import EncoderConfig
from minisbert.encoding.encoder import Encoder
from minisbert.encoding.fast import batching as fast_encode
from minisbert.encoding.fast import tiled_encoder as fast_encoder
from minisbert.encoding.fast import tiled_linear as fast_linear
from minisbert.common import machine
from minisbert.encoding.fast.batching import FAST_PATH
from minisbert.encoding.model import SentenceModel
from minisbert.encoding.pooling import Dense
from minisbert.common.precision import computing_in
from minisbert.encoding.tokenizer import Tokenizer

from ..conftest import FIXTURES, REPO

MINILM_WIDTHS = dict(hidden_size=384, num_heads=12, intermediate_size=1536)
LONGEST = 250  # tokens, [CLS] and [SEP] included
BATCH_SIZES = (1, 2, 3, 5, 16, 17, 64)
TEXTS_IN_A_BATCH = (1, 2, 3, 5, 16, 17, 32)
TOKEN_BUDGETS = (fast_encode.CPU_TOKENS_PER_FORWARD, 700, LONGEST, 8192)  # LONGEST: one long text a batch
BATCHES = 16  # drawn for each way and dtype


def ways(kernels) -> list:
    """(dtype, kernel) for each dtype and kernel in `kernels` (None: the plain path), skipped where this
    CPU does not run them."""
    params = []
    for dtype in ("float32", "bfloat16"):
        for kernel in kernels:
            reason = None
            if dtype == "bfloat16" and not cpu.native_bfloat16():
                reason = "this CPU has no native bfloat16 products (AVX512-BF16 or AMX): encode() refuses bfloat16 here"
            elif kernel is not None and not fast_linear.runs(kernel, getattr(torch, dtype)):
                reason = f"the {kernel} kernel cannot multiply {dtype} on this CPU"
            params.append(pytest.param(dtype, kernel, id=f"{dtype}-{kernel or 'plain'}",
                                       marks=[pytest.mark.skip(reason=reason)] if reason else []))
    return params


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
    """32 texts of 0 to 248 words of the vocabulary, one token each: 2 to 250 tokens, two texts of
    each length (attention meets texts that share a length)."""
    words = [w for w in model.tokenizer.rust.get_vocab() if w.isalpha() and w.islower()]
    generator = torch.Generator().manual_seed(0)
    lengths = [0, 1, LONGEST - 2] + torch.randint(0, LONGEST - 1, (13,), generator=generator).tolist()
    texts = [" ".join(words[i] for i in torch.randint(0, len(words), (n,), generator=generator).tolist())
             for n in lengths + lengths]
    tokens = list(map(len, model.tokenizer.token_ids(texts)))
    assert (min(tokens), max(tokens)) == (2, LONGEST)
    return texts


@pytest.mark.parametrize("dtype, kernel", ways([None, *fast_linear.BACKENDS]))
def test_a_text_gets_the_same_bits_in_any_batch(model, texts, dtype, kernel, monkeypatch):
    if kernel is not None:
        monkeypatch.setenv(fast_linear.BACKEND_VARIABLE, kernel)

    def encode(inputs, batch_size=32):
        return model.encode(inputs, batch_size=batch_size, convert_to_tensor=True, dtype=dtype,
                            fast=kernel is not None)

    alone = torch.stack([encode(text) for text in texts])  # (32, D): each text its own call, as one string
    draw = random.Random(f"{dtype} {kernel}")
    for _ in range(BATCHES):
        chosen = draw.choices(range(len(texts)), k=draw.choice(TEXTS_IN_A_BATCH))  # any order, repeats
        batch_size, budget = draw.choice(BATCH_SIZES), draw.choice(TOKEN_BUDGETS)
        monkeypatch.setattr(fast_encode, "CPU_TOKENS_PER_FORWARD", budget)
        embeddings = encode([texts[i] for i in chosen], batch_size)  # (k, D): a list, of one text too
        different = (embeddings != alone[chosen]).any(dim=1).sum().item()
        assert different == 0, (f"{different} of {len(chosen)} texts differ from them alone at batch size "
                                f"{batch_size}, {budget} tokens a forward pass")


@pytest.mark.parametrize("dtype, kernel", ways(fast_linear.BACKENDS))
def test_the_forward_pass_of_one_text_equals_it_in_a_padded_batch(model, texts, dtype, kernel, monkeypatch):
    """What training's forward gives (autograd on: one product of all rows) is not promised bit for
    bit, but the fast forward without it is: a text padded among longer ones equals it alone."""
    monkeypatch.setenv(fast_linear.BACKEND_VARIABLE, kernel)
    id_lists = model.tokenizer.token_ids(texts[:8])
    id_lists.append(id_lists[0][:1])  # one token: [CLS] alone
    with torch.no_grad(), computing_in(dtype, model.device):
        together = model(model.tokenizer.pad(id_lists))  # (9, D)
        for row, ids in enumerate(id_lists):
            assert torch.equal(model(model.tokenizer.pad([ids]))[0], together[row]), len(ids)


@pytest.mark.parametrize("dtype, kernel", ways(fast_linear.BACKENDS))
def test_no_kernel_is_called_with_a_shape_that_depends_on_the_batch(model, texts, dtype, kernel, monkeypatch):
    """Each product gets whole tiles (the encoder's tile, or the Dense layer's own), aligned, at most
    STACK_ROWS rows a call, and more than one tile only where this machine's kernel keeps a tile's bits
    in a stack for that product (else one a call); each attention call gets the number of texts its
    length decides; the Dense layer is one of the products."""
    monkeypatch.setenv(fast_linear.BACKEND_VARIABLE, kernel)
    model.encode(texts[:2], dtype=dtype)  # the machine's facts are known before the calls are watched
    products, attention = [], []
    for backend, product in list(fast_linear.PRODUCTS.items()):
        def watched(x, weights, gelu, out, product=product):
            products.append((x.shape[0], out.shape[0], x.is_contiguous() and x.data_ptr() % 64 == 0, x.shape[1],
                             out.shape[1]))
            return product(x, weights, gelu, out)

        monkeypatch.setitem(fast_linear.PRODUCTS, backend, watched)
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, *rest: attention.append((q.shape[0], q.shape[2])) or sdpa(q, *rest))
    many = (sorted(texts, key=len)[:8] * 32)[:33]  # short ones: more texts than a tile has rows
    monkeypatch.setattr(fast_encode, "CPU_TOKENS_PER_FORWARD", len(many) * LONGEST)
    model.encode(texts[:17], batch_size=5, dtype=dtype)  # batches of 5, 5, 5 and 2 texts
    model.encode(many, batch_size=len(many), dtype=dtype)
    model.encode(texts * 4, batch_size=128, dtype=dtype)  # one batch of more rows than a call gets
    # The encoder's tokens and the Dense layer's texts are tiled apart, each by its own products' facts
    # (on one CPU kind the Dense layer kept 16-row tiles where a block's products needed 32), and each
    # product gets stacks of tiles only where its own kernel keeps a tile's bits in one.
    dtype_ = getattr(torch, dtype)
    encoder_products = fast_encoder.products(model.encoder.layers[0], model.encoder.config.activation)
    tile = fast_linear.tile_rows(encoder_products, dtype_)
    dense_tile = fast_linear.tile_rows([([model.dense.linear], None)], dtype_)
    shapes = {(layers[0].in_features, sum(layer.out_features for layer in layers)): (layers, gelu, tile)
              for layers, gelu in encoder_products}  # the test's model: no two products of one shape
    dense_shape = (model.dense.linear.in_features, model.dense.linear.out_features)
    shapes[dense_shape] = ([model.dense.linear], None, dense_tile)
    assert len(shapes) == 5 and products and {(fan_in, out) for *_, fan_in, out in products} == set(shapes)
    for (fan_in, out), (layers, gelu, its_tile) in shapes.items():
        calls = [(rows, written, aligned) for rows, written, aligned, i, o in products if (i, o) == (fan_in, out)]
        keeps = fast_linear.keeps_tiles(kernel, layers, gelu, dtype_, its_tile)
        assert all(rows == written and rows % its_tile == 0 and aligned and rows <= fast_linear.STACK_ROWS
                   for rows, written, aligned in calls), (fan_in, out)  # whole tiles in, as many out, aligned
        sizes = {rows for rows, _, _ in calls}
        if (fan_in, out) != dense_shape:
            # A block's product: the batch of 128 texts is cut into stacks of STACK_ROWS, or a tile a call.
            assert max(sizes) == (fast_linear.STACK_ROWS if keeps else its_tile), (fan_in, out)
            assert len(sizes) > 2 or not keeps, (fan_in, out)
        else:
            assert keeps or sizes == {its_tile}  # the Dense layer: a tile a call unless it keeps them
    width = MINILM_WIDTHS["hidden_size"]
    assert sum(1 for rows, _, _, fan_in, out in products
               if fan_in == width and rows <= 2 * shapes[fan_in, out][2]) >= 6  # short batches
    # Attention: a text alone, or among ATTENTION_TEXTS of its length where the machine's check allows it.
    assert attention and {count for count, _ in attention} <= {1, fast_encoder.ATTENTION_TEXTS}
    heads, head_size = model.encoder.config.num_heads, model.encoder.config.head_size
    assert all(count == 1 or fast_encoder.shares_a_call(length, heads, head_size, getattr(torch, dtype))
               for count, length in attention)
    assert fast_encoder.ATTENTION_TEXTS in {count for count, _ in attention}  # `many` has 8 texts of one length


def products_of(model) -> list:
    """(layers, gelu) of each product the fast path makes with `model`: the four of each block, the Dense layer."""
    return fast_encoder.products(model.encoder.layers[0], model.encoder.config.activation) + [([model.dense.linear], None)]


def test_an_attention_kernel_that_gives_a_text_other_bits_among_others_gets_one_text_a_call(model, texts, monkeypatch,
                                                                                            timed_probes):
    """shares_a_call compares, bit for bit, texts of a length among ATTENTION_TEXTS with each alone: a
    kernel whose bits depend on the number of texts (planted: the last bit moves in calls of several
    texts of 40 tokens or more) is found out at those lengths, and encode() keeps its promise with it."""
    sdpa = F.scaled_dot_product_attention

    def count_dependent(q, *rest):
        out = sdpa(q, *rest)
        if q.shape[0] > 1 and q.shape[2] >= 40:
            out.view(torch.int32).bitwise_xor_(1)
        return out

    monkeypatch.setattr(F, "scaled_dot_product_attention", count_dependent)
    heads, head_size = model.encoder.config.num_heads, model.encoder.config.head_size
    assert fast_encoder.shares_a_call(12, heads, head_size, torch.float32)
    assert not fast_encoder.shares_a_call(40, heads, head_size, torch.float32)
    same_length = [t for t in texts if len(model.tokenizer.token_ids([t])[0]) > 40][:2]
    alone = torch.stack([model.encode(text, convert_to_tensor=True) for text in same_length])
    assert torch.equal(model.encode(same_length * 9, batch_size=18, convert_to_tensor=True)[:2], alone)


def test_a_kernel_that_gives_a_tile_other_bits_in_a_stack_gets_one_tile_a_call(model, texts, monkeypatch, timed_probes):
    """keeps_tiles compares, bit for bit, each stack of tiles up to STACK_ROWS rows with its tiles alone:
    a kernel whose tiles' bits depend on the stack (planted here: the last bit of every result moves in
    stacks of more than half that many rows only) is found out at every tile size, run a tile a call,
    and encode() keeps its promise with it."""
    monkeypatch.setenv(fast_linear.BACKEND_VARIABLE, "torch")
    product = fast_linear.PRODUCTS["torch"]

    def stack_dependent(x, weights, gelu, out):
        result = product(x, weights, gelu, out)
        if x.shape[0] > fast_linear.STACK_ROWS // 2:  # only large stacks: the check must try them
            result.view(torch.int32).bitwise_xor_(1)
        return result

    monkeypatch.setitem(fast_linear.PRODUCTS, "torch", stack_dependent)
    for layers, gelu in products_of(model):
        assert not any(fast_linear.keeps_tiles("torch", layers, gelu, torch.float32, tile) for tile in fast_linear.TILE_SIZES)
    assert fast_linear.tile_rows(products_of(model), torch.float32) == fast_linear.TILE_SIZES[-1]
    alone = torch.stack([model.encode(text, convert_to_tensor=True) for text in texts[:8]])
    assert torch.equal(model.encode(texts[:8] * 40, batch_size=320, convert_to_tensor=True)[:8], alone)


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
    (tmp_path / "texts.json").write_text(json.dumps(texts[:8]))  # a few: what is checked here is the kernels' choice
    dtypes = ["float32"] + (["bfloat16"] if cpu.native_bfloat16() else [])
    # The kernels are chosen as a user's process chooses them: timed, into a machine file of this test's own.
    machine_file = tmp_path / "machine.json"
    env = {**os.environ, machine.MACHINE_FILE_VARIABLE: str(machine_file), machine.PROBES_VARIABLE: "on"}
    env.pop(fast_linear.BACKEND_VARIABLE, None)

    def encode_in_a_process(name):
        subprocess.run([sys.executable, "-c", ENCODE_IN_A_PROCESS, str(tmp_path / "model"),
                        str(tmp_path / "texts.json"), str(tmp_path / name), *dtypes],
                       env=env, cwd=REPO, check=True, capture_output=True, text=True)

    def kernel_facts() -> dict:
        facts = json.loads(machine_file.read_text()) if machine_file.exists() else {}
        return {name: value for name, value in facts.items() if name.startswith("quicker product kernel")}

    # The loaded process runs first: it meets every product's shape first and measures it under load.
    load = busy_processes(os.cpu_count() or 1)
    try:
        encode_in_a_process("loaded")
    finally:
        for process in load:
            process.kill()
            process.wait()
    measured = kernel_facts()
    choosing = [dtype for dtype in dtypes if all(fast_linear.runs(b, getattr(torch, dtype)) for b in fast_linear.BACKENDS)]
    assert len(measured) == 5 * len(choosing), measured  # Q/K/V, attention output, feed-forward in and out, Dense
    encode_in_a_process("idle")
    assert kernel_facts() == measured  # read back, not measured again
    for dtype in dtypes:
        loaded, idle = np.load(tmp_path / f"loaded-{dtype}.npy"), np.load(tmp_path / f"idle-{dtype}.npy")
        assert loaded.shape == (8, 256) and np.array_equal(loaded, idle), dtype
