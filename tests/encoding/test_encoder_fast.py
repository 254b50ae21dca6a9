"""The fast path computes what the plain path computes.

minisbert/encoding/fast/tiled_encoder.py runs the plain `Encoder`'s own parameters through packed tokens and fused
kernels; minisbert/encoding/fast/batching.py cuts encode()'s batches to a token budget. (Its products, encoding/fast/tiled_linear.py,
have tests of their own in tests/encoding/test_fast_linear.py: each kernel, the measurement, reused memory.)
"Correct" means: on every fixture model (BERT, DistilBERT, RoBERTa, and a sentence-transformers model
with max pooling, a Dense layer and Normalize) and on random models of each family and activation,
the two paths give last hidden states, embeddings (in training mode too, dropout off) and every
parameter's gradient that differ by no more than two float32 computations of the same sums in
another order can (tests/tolerances.py: 2.6e-5 of the tensor's scale for the tiny models' forward,
3.8e-5 for their gradients; the kernels add in other orders, so bit equality is not to be had); with
dropout on, the fast path applies it; and whatever the batch size or token budget, encode() returns
the same rows in the same order.
"""

import re
import subprocess
import sys

import pytest
import torch
from torch import nn

import minisbert
from minisbert.encoding.config import EncoderConfig
from minisbert.encoding.encoder import Encoder
from minisbert.encoding.fast import batching as fast_encode
from minisbert.encoding.fast import tiled_encoder as fast_encoder
from minisbert.encoding.fast.batching import FAST_PATH
from minisbert.encoding.model import SentenceModel

from ..test_packaging import module_imports
from ..conftest import REPO, reference
from .test_encoder_math import TINY
from ..tolerances import encoder_roundings, float32_apart, gradient_roundings, scale

FIXTURE_MODELS = ["tiny_bert", "tiny_distilbert", "tiny_roberta", "tiny_st_dense"]
DENSE = 32  # tiny_st_dense's Dense layer (32 -> 16) and Normalize (16) add these roundings; the others none
MASK = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])  # three lengths, padded to 7


def random_encoder(family, activation):
    config = EncoderConfig(**{**TINY, "activation": activation, "family": family,
                              "pad_token_id": 1 if family == "roberta" else 0,
                              "positions_after_pad": family == "roberta",
                              "type_vocab_size": 0 if family == "distilbert" else 2})
    torch.manual_seed(0)
    encoder = Encoder(config).eval()
    ids = torch.randint(2, 50, MASK.shape).masked_fill(MASK == 0, config.pad_token_id)  # (3, 7)
    return encoder, ids


def close_at_scale(a, b, roundings):
    """|a - b| within what two float32 computations of `roundings` roundings may differ, everywhere."""
    return (a - b).abs().max().item() <= float32_apart(roundings) * scale(b)


def real_tokens(hidden, mask):
    return hidden[mask.bool()]  # (N, H): padding outputs are not part of the function


@pytest.mark.parametrize("activation", ["gelu", "gelu_new"])
@pytest.mark.parametrize("family", ["bert", "distilbert", "roberta"])
def test_fast_encoder_equals_plain_on_random_models(family, activation):
    encoder, ids = random_encoder(family, activation)
    token_types = None if family == "distilbert" else torch.randint(0, 2, ids.shape)
    with torch.no_grad():
        for mask in (MASK, torch.ones_like(MASK)):  # padded, and without padding (nothing packed, no mask)
            for types in (None, token_types):
                plain = real_tokens(encoder(ids, mask, types), mask)
                fast = real_tokens(fast_encoder.forward(encoder, ids, mask, types), mask)
                assert close_at_scale(fast, plain, encoder_roundings(encoder.config, MASK.shape[1])), mask.sum()


@pytest.mark.parametrize("name", FIXTURE_MODELS)
def test_fast_equals_plain_on_fixture_models(name):
    folder, _, info = reference(name)
    model = SentenceModel.from_dir(folder, device="cpu", fast_path=FAST_PATH)
    batch = model.tokenize(info["sentences"])
    with torch.no_grad():
        plain = model.encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
        fast = fast_encoder.forward(model.encoder, batch["input_ids"], batch["attention_mask"],
                                    batch.get("token_type_ids"))
    roundings = encoder_roundings(model.encoder.config, batch["input_ids"].shape[1])
    assert close_at_scale(real_tokens(fast, batch["attention_mask"]), real_tokens(plain, batch["attention_mask"]),
                          roundings)
    plain_embeddings = model.encode(info["sentences"], fast=False)
    fast_embeddings = model.encode(info["sentences"], fast=True)
    assert close_at_scale(torch.from_numpy(fast_embeddings), torch.from_numpy(plain_embeddings), roundings + DENSE)


def no_dropout(model):
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


@pytest.mark.parametrize("name", FIXTURE_MODELS)
def test_training_forward_and_gradients_agree_with_dropout_off(name):
    folder, _, info = reference(name)
    model = SentenceModel.from_dir(folder, device="cpu", fast_path=FAST_PATH).train()
    no_dropout(model)
    batch = model.tokenize(info["sentences"])
    weights = torch.randn(len(info["sentences"]), model.dimension, generator=torch.Generator().manual_seed(0))
    results = {}
    for fast in (False, True):
        model.zero_grad()
        embeddings = model(batch, fast=fast)  # (B, D)
        (embeddings * weights).sum().backward()  # a loss that weighs every output differently
        gradients = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[fast] = embeddings.detach(), gradients
    (plain, plain_gradients), (fast, fast_gradients) = results[False], results[True]
    tokens = batch["input_ids"].shape[1]
    assert close_at_scale(fast, plain, encoder_roundings(model.encoder.config, tokens) + DENSE)
    assert sorted(fast_gradients) == sorted(n for n, _ in model.named_parameters())  # every one reached
    roundings = gradient_roundings(model.encoder.config, tokens, int(batch["attention_mask"].sum())) + 2 * DENSE
    for parameter_name, gradient in plain_gradients.items():
        assert close_at_scale(fast_gradients[parameter_name], gradient, roundings), parameter_name


def test_fast_path_applies_each_dropout_in_training_mode_only():
    folder, _, info = reference("tiny_bert")
    model = SentenceModel.from_dir(folder, device="cpu", fast_path=FAST_PATH)
    batch = model.tokenize(info["sentences"])
    with torch.no_grad():
        evaluated = model(batch, fast=True)
        model.train()
        # config: 0.1 and 0.1. Dropout moves the outputs by 0.4 and more here, float32 by 1e-4 at most
        # (close_at_scale): 1e-3 lies between.
        assert not torch.allclose(model(batch, fast=True), evaluated, atol=1e-3)
        no_dropout(model)
        roundings = encoder_roundings(model.encoder.config, batch["input_ids"].shape[1])
        assert close_at_scale(model(batch, fast=True), evaluated, roundings)  # training mode may pick other kernels
        model.encoder.layers[1].attention.attention_dropout.p = 0.5  # attention's own dropout alone
        assert not torch.allclose(model(batch, fast=True), evaluated, atol=1e-3)  # as above
        model.eval()
        assert close_at_scale(model(batch, fast=True), evaluated, roundings)


def test_token_budget_batches_cover_every_text_once_in_order():
    generator = torch.Generator().manual_seed(0)
    id_lists = [[0] * int(n) for n in torch.randint(2, 300, (101,), generator=generator)]
    longest_first = sorted(range(len(id_lists)), key=lambda i: -len(id_lists[i]))
    cpu = list(fast_encode.batches(longest_first, id_lists, 32, torch.device("cpu")))
    assert [i for rows in cpu for i in rows] == longest_first
    for rows in cpu:
        padded_tokens = len(rows) * len(id_lists[rows[0]])
        assert len(rows) <= 32 and (padded_tokens <= fast_encode.CPU_TOKENS_PER_FORWARD or len(rows) == 1)
    assert any(len(rows) < 32 for rows in cpu[:-1])  # the budget did cut
    # Off the CPU (the device is only inspected, not used) batches are batch_size texts.
    gpu = list(fast_encode.batches(longest_first, id_lists, 32, torch.device("cuda")))
    assert [len(rows) for rows in gpu] == [32, 32, 32, 5]


def test_fast_and_plain_encode_agree_whatever_the_batches(monkeypatch):
    folder, _, info = reference("tiny_st_dense")
    model = SentenceModel.from_dir(folder, device="cpu", fast_path=FAST_PATH)
    words = " ".join(info["sentences"]).split()
    texts = [" ".join(words[i:i + 1 + i % 11]) for i in range(37)]  # 37 texts of 1 to 11 words
    expected = model.encode(texts, batch_size=1, fast=False)
    monkeypatch.setattr(fast_encode, "CPU_TOKENS_PER_FORWARD", 30)  # so the budget cuts these short texts
    roundings = encoder_roundings(model.encoder.config, model.max_seq_length) + DENSE
    for batch_size in (5, 17, 64):
        for fast in (False, True):
            ours = model.encode(texts, batch_size=batch_size, fast=fast)
            assert close_at_scale(torch.from_numpy(ours), torch.from_numpy(expected), roundings), (batch_size, fast)


def test_the_model_setting_and_each_call_choose_the_path(monkeypatch):
    folder, _, info = reference("tiny_bert")
    calls = []
    original = fast_encoder.forward
    monkeypatch.setattr(fast_encoder, "forward", lambda *args: calls.append(1) or original(*args))
    model = SentenceModel.from_dir(folder, device="cpu", fast_path=FAST_PATH)
    model.encode(info["sentences"])
    assert len(calls) == 1
    model.encode(info["sentences"], fast=False)
    model(model.tokenize(info["sentences"]), fast=False)
    assert len(calls) == 1
    model(model.tokenize(info["sentences"]))
    assert len(calls) == 2
    plain = SentenceModel.from_dir(folder, device="cpu")  # the network alone: nothing plugged in
    plain.encode(info["sentences"])
    plain(plain.tokenize(info["sentences"]))
    assert len(calls) == 2
    with pytest.raises(ValueError, match="fast=True, but this model has no fast path plugged in"):
        plain.encode(info["sentences"], fast=True)
    assert minisbert.load(folder, device="cpu").fast_path is FAST_PATH
    assert minisbert.load(folder, device="cpu", fast=False).fast_path is None


def imported_with(module):
    """Every module of minisbert/ that `module`'s code reaches: what it imports, at any depth of its code
    (tests/test_packaging.py's reading of the sources), what those import, and so on. A reader of the
    module meets these; the package's __init__ (`minisbert.load`) and minisbert/encoding/backend.py, which offer
    the choice of path, are not followed (a class built in memory asks encoding/backend.py for the default).
    test_the_plain_model_loads_and_encodes_without_the_fast_path checks what actually runs."""
    graph, loaded, waiting = module_imports(), set(), [module]
    while waiting:
        name = waiting.pop()
        if name not in loaded and name not in ("minisbert", "minisbert.encoding.backend"):
            loaded.add(name)
            waiting += graph.get(name, ())
    return loaded


def test_plain_and_fast_modules_do_not_import_each_other():
    """The plain encoder and model read alone; the fast ones share only what is below both."""
    for plain_module in ("minisbert.encoding.encoder", "minisbert.encoding.model",
                         "minisbert.porting.sentence_transformer"):
        assert not [m for m in imported_with(plain_module) if "fast" in m.split(".")], plain_module
    for fast_module in ("minisbert.encoding.fast.tiled_encoder", "minisbert.encoding.fast.batching",
                        "minisbert.encoding.fast.tiled_linear"):
        loaded = imported_with(fast_module)
        assert "minisbert.encoding.encoder" not in loaded and "minisbert.encoding.model" not in loaded, fast_module


def test_the_plain_model_loads_and_encodes_without_the_fast_path():
    folder = reference("tiny_st_dense")[0]
    encode = ("import sys, minisbert; model = minisbert.load(sys.argv[1], device='cpu', fast=False); "
              "model.encode(['A man is eating food.', 'A man rides a horse.']); "
              "from minisbert.porting.sentence_transformer import SentenceTransformer as Built; "  # built in memory, plain
              "Built(model.encoder, model.tokenizer, fast_path=None).encode(['A man rides a horse.']); "
              "print(*sorted(sys.modules))")
    finished = subprocess.run([sys.executable, "-c", encode, str(folder)], cwd=REPO, capture_output=True,
                              text=True, check=True)
    assert "minisbert.encoding.model" in finished.stdout.split()
    assert not [m for m in finished.stdout.split() if m.startswith("minisbert") and "fast" in m.split(".")]


def test_print_model_names_the_path_and_the_kernel_each_product_runs(monkeypatch, timed_probes):
    """The backend in sight: print(model) says which path runs it and, for the fast path, which kernel each
    of its products runs on this machine: "measured at first use" before the first encode (an empty facts
    file), then the very kernel each product was given (recorded at `_backend`, where the encoder asks)."""
    from minisbert.encoding.fast import tiled_linear

    folder = reference("tiny_st_dense")[0]
    model = minisbert.load(folder, device="cpu")
    products = re.search(r"this machine's kernels \((.*)\)", repr(model).splitlines()[1]).group(1).split(", ")
    assert len(products) == 5 and all(line.endswith("measured at first use") for line in products), products
    given = {}
    original = tiled_linear._backend

    def recorded(layers, gelu, keep_as, dtype):
        backend = original(layers, gelu, keep_as, dtype)
        given[f"{layers[0].in_features} x {sum(layer.out_features for layer in layers)}"] = backend
        return backend

    monkeypatch.setattr(tiled_linear, "_backend", recorded)
    model.encode(["A man is eating food.", "A man rides a horse."])
    shown = re.search(r"this machine's kernels \((.*)\)", repr(model).splitlines()[1]).group(1).split(", ")
    assert dict(line.rsplit(" ", 1) for line in shown) == given
    for forced in (backend for backend in tiled_linear.BACKENDS if tiled_linear.runs(backend, torch.float32)):
        monkeypatch.setenv(tiled_linear.BACKEND_VARIABLE, forced)  # forced: every product says so
        assert repr(model).splitlines()[1].count(f" {forced}") == 5, forced
    assert "path: plain network" in repr(minisbert.load(folder, device="cpu", fast=False)).splitlines()[1]
