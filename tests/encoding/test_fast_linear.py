"""The fast encoder's products (minisbert/encoding/fast/tiled_linear.py): every kernel computes what the plain encoder
computes, the measurement keeps the quicker one, and kept weights follow the parameters.

"Correct" means: with each kernel forced (MINISBERT_GEMM=torch, =onednn where this CPU runs it), the
fast encoder's hidden states and encode()'s embeddings agree with the plain encoder's on random models
of every family and activation, on every fixture model and on all-MiniLM-L6-v2, as closely as two
float32 computations of the same sums in another order can (tests/tolerances.py: the kernels block
and vectorise the sums differently, so bit equality is not to be had), and the forced kernel is the one
that ran; left to measure, `linear` times each kernel on each shape once per machine and keeps the
quicker in the machine's file, where the next process finds it (checked with a kernel made slow on
purpose); after an optimizer step or load_state_dict, encode() sees the new weights; reused memory
changes no bit and autograd still flows; and a bad MINISBERT_GEMM, or a kernel forced where it
cannot run, is refused naming it.
"""

import json
import types

import numpy as np
import pytest
import torch

from minisbert.common import cpu
from minisbert.encoding.fast import tiled_encoder as fast_encoder
from minisbert.encoding.fast import tiled_linear as fast_linear
from minisbert.common import machine
from minisbert.encoding.fast.batching import FAST_PATH
from minisbert.common.fileio import with_digest
from minisbert.encoding.model import SentenceModel
from minisbert.training.optim import AdamW

from ..conftest import reference
from .test_encoder_fast import DENSE, FIXTURE_MODELS, MASK, random_encoder, real_tokens
from ..tolerances import encoder_roundings, float32_apart, gradient_roundings, scale

BACKENDS_HERE = [backend for backend in fast_linear.BACKENDS if fast_linear.runs(backend, torch.float32)]


@pytest.fixture
def counted_kernels(monkeypatch):
    """How often each kernel ran, counted while the kernels themselves run unchanged."""
    counts = dict.fromkeys(fast_linear.BACKENDS, 0)
    for backend, product in list(fast_linear.PRODUCTS.items()):
        def counted(*args, backend=backend, product=product):
            counts[backend] += 1
            return product(*args)

        monkeypatch.setitem(fast_linear.PRODUCTS, backend, counted)
    return counts


@pytest.mark.parametrize("backend", BACKENDS_HERE)
@pytest.mark.parametrize("activation", ["gelu", "gelu_new"])
@pytest.mark.parametrize("family", ["bert", "distilbert", "roberta"])
def test_each_kernel_equals_the_plain_encoder_on_random_models(family, activation, backend, monkeypatch,
                                                               counted_kernels):
    monkeypatch.setenv(fast_linear.BACKEND_VARIABLE, backend)
    encoder, ids = random_encoder(family, activation)
    with torch.no_grad():
        fast_encoder.forward(encoder, ids, MASK)  # the machine's facts are checked once, before counting
        counted_kernels.update(dict.fromkeys(counted_kernels, 0))
        for mask in (MASK, torch.ones_like(MASK)):
            plain = real_tokens(encoder(ids, mask), mask)
            fast = real_tokens(fast_encoder.forward(encoder, ids, mask), mask)
            assert (fast - plain).abs().max() <= float32_apart(encoder_roundings(encoder.config, MASK.shape[1])) * \
                scale(plain)
    products = fast_encoder.products(encoder.layers[0], activation)
    tile = fast_linear.tile_rows(products, torch.float32)
    stacked = all(fast_linear.keeps_tiles(backend, layers, gelu, torch.float32, tile) for layers, gelu in products)
    tiles = [-(-int(mask.sum()) // tile) for mask in (MASK, torch.ones_like(MASK))]
    calls = len(tiles) if stacked else sum(tiles)  # a call a product: its tiles in one stack, or a call a tile
    assert counted_kernels[backend] == calls * 4 * encoder.config.num_layers  # 4 products a block
    assert sum(counted_kernels.values()) == counted_kernels[backend]


@pytest.mark.parametrize("backend", BACKENDS_HERE)
@pytest.mark.parametrize("name", FIXTURE_MODELS)
def test_each_kernel_gives_the_plain_embeddings_on_fixture_models(name, backend, monkeypatch, counted_kernels):
    monkeypatch.setenv(fast_linear.BACKEND_VARIABLE, backend)
    folder, _, info = reference(name)
    model = SentenceModel.from_dir(folder, device="cpu", fast_path=FAST_PATH)
    plain = model.encode(info["sentences"], fast=False)
    assert sum(counted_kernels.values()) == 0  # the plain path never reaches encoding/fast/tiled_linear.py
    fast = model.encode(info["sentences"], fast=True)
    roundings = encoder_roundings(model.encoder.config, model.max_seq_length) + DENSE
    assert np.abs(fast - plain).max() <= float32_apart(roundings) * scale(plain)
    assert counted_kernels[backend] > 0 and sum(counted_kernels.values()) == counted_kernels[backend]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS_HERE)
def test_each_kernel_gives_the_plain_embeddings_on_minilm(minilm, backend, monkeypatch):
    monkeypatch.setenv(fast_linear.BACKEND_VARIABLE, backend)
    sentences = reference("minilm")[2]["sentences"]
    bound = float32_apart(encoder_roundings(minilm.encoder.config, minilm.max_seq_length))  # unit vectors: scale 1
    assert np.abs(minilm.encode(sentences, fast=True) - minilm.encode(sentences, fast=False)).max() <= bound


@pytest.fixture
def fresh_machine_file(timed_probes):
    """An empty file of machine facts (common/machine.py) for this test alone, the probes timing as a user's do."""
    return timed_probes


def kernel_facts() -> dict:
    return {name: value for name, value in machine.known().items() if name.startswith("quicker product kernel")}


def test_the_measurement_keeps_the_quicker_kernel_once_per_shape_for_the_machine(monkeypatch, fresh_machine_file):
    if len(BACKENDS_HERE) < 2:
        pytest.skip("this CPU runs one kernel only: nothing to choose")
    monkeypatch.delenv(fast_linear.BACKEND_VARIABLE, raising=False)
    encoder, ids = random_encoder("bert", "gelu")
    measured = []
    quickest = fast_linear._quickest
    monkeypatch.setattr(fast_linear, "_quickest", lambda *args: measured.append(args[1]) or quickest(*args))
    # The clock the measurement reads moves only when a kernel runs: 1 ms, or 1 s for the slow one.
    clock = [0.0]
    monkeypatch.setattr(machine, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    for slow in fast_linear.BACKENDS:
        measured.clear()
        fresh_machine_file.unlink(missing_ok=True)
        machine.forget()
        with monkeypatch.context() as patch:
            for backend, product in list(fast_linear.PRODUCTS.items()):
                def timed(*args, product=product, seconds=1.0 if backend == slow else 0.001):
                    clock[0] += seconds
                    return product(*args)

                patch.setitem(fast_linear.PRODUCTS, backend, timed)
            with torch.no_grad():
                fast_encoder.forward(encoder, ids, MASK)
                fast_encoder.forward(encoder, ids, MASK)
            # Q/K/V, attention output, feed-forward in (with GELU), feed-forward out: four shapes, once each.
            assert len(measured) == 4 and len(kernel_facts()) == 4
            assert set(kernel_facts().values()) == set(fast_linear.BACKENDS) - {slow}
        # Kept in the machine's file: another process (here: this one, its copy dropped) reads the
        # choice back instead of measuring again, on whatever clock.
        machine.forget()
        with torch.no_grad():
            fast_encoder.forward(encoder, ids, MASK)
        assert len(measured) == 4 and set(kernel_facts().values()) == set(fast_linear.BACKENDS) - {slow}
        assert "quicker product kernel, 16 x 48, float32" in json.loads(fresh_machine_file.read_text())


def test_the_measurement_leaves_torchs_random_numbers_alone(monkeypatch, fresh_machine_file):
    """Measuring draws its inputs from a generator of its own: a training run's dropout masks must not
    depend on whether its machine had met a shape before (a resumed run may have)."""
    if len(BACKENDS_HERE) < 2:
        pytest.skip("this CPU runs one kernel only: nothing is measured")
    monkeypatch.delenv(fast_linear.BACKEND_VARIABLE, raising=False)
    encoder, ids = random_encoder("bert", "gelu")
    state = torch.get_rng_state()
    with torch.no_grad():
        fast_encoder.forward(encoder, ids, MASK)
    assert len(kernel_facts()) == 4  # every shape was measured
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("backend", BACKENDS_HERE)
def test_encode_after_training_uses_the_new_weights(backend, monkeypatch):
    """Kept weights (cast, stacked, reordered) are made again when a parameter changes."""
    monkeypatch.setenv(fast_linear.BACKEND_VARIABLE, backend)
    folder, _, info = reference("tiny_st_dense")
    model = SentenceModel.from_dir(folder, device="cpu", fast_path=FAST_PATH)
    before = model.encode(info["sentences"])
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    optimizer = AdamW(model.parameters(), lr=1e-2)
    model.train()
    model(model.tokenize(info["sentences"])).sum().backward()  # autograd through the fast encoder
    optimizer.step()
    after = model.encode(info["sentences"])
    assert np.abs(after - before).max() > 1e-3  # the step moves them by 0.58, float32 by `bound` below (3e-5)
    bound = float32_apart(encoder_roundings(model.encoder.config, model.max_seq_length) + DENSE)  # unit vectors
    assert np.abs(after - model.encode(info["sentences"], fast=False)).max() <= bound
    model.load_state_dict(state)  # and back: copied into the same tensors
    assert np.array_equal(model.encode(info["sentences"]), before)  # the same weights, kernels and rows


@pytest.mark.parametrize("activation", ["gelu", "gelu_new"])
def test_reusing_memory_gives_identical_results_and_keeps_autograd(activation, monkeypatch):
    monkeypatch.setenv(fast_linear.BACKEND_VARIABLE, "torch")  # the kernel that writes into kept memory
    encoder, ids = random_encoder("bert", activation)
    with torch.no_grad():
        expected = fast_encoder.forward(encoder, ids, MASK)
        with fast_linear.reusing_memory():
            reused = fast_encoder.forward(encoder, ids, MASK)
            scratch = fast_linear._scratch.get()[("feed-forward", torch.float32)]
            # A second, longer batch grows the memory; a shorter one reuses it.
            longer = fast_encoder.forward(encoder, torch.cat([ids, ids]), torch.cat([MASK, MASK]))
            again = fast_encoder.forward(encoder, ids, MASK)
    assert torch.equal(reused, expected) and torch.equal(again, expected)
    assert torch.equal(longer, torch.cat([expected, expected]))
    tile = fast_linear.tile_rows(fast_encoder.products(encoder.layers[0], activation), torch.float32)
    assert scratch.numel() == tile * encoder.config.intermediate_size  # 13 tokens: one tile
    assert fast_linear._scratch.get() is None  # freed on leaving

    # With autograd on, the memory is not reused and GELU does not overwrite: gradients still flow.
    with fast_linear.reusing_memory():
        fast_encoder.forward(encoder, ids, MASK).sum().backward()
    gradient = encoder.layers[0].ffn.intermediate.weight.grad.clone()
    encoder.zero_grad()
    encoder(ids, MASK).sum().backward()
    plain = encoder.layers[0].ffn.intermediate.weight.grad
    roundings = gradient_roundings(encoder.config, MASK.shape[1], int(MASK.sum()))
    assert (gradient - plain).abs().max() <= float32_apart(roundings) * scale(plain)


def test_which_kernels_run_follows_the_cpu_flags(monkeypatch):
    monkeypatch.setattr(cpu, "flags", lambda: frozenset({"avx", "avx2", "fma"}))
    assert fast_linear.runs("torch", torch.bfloat16)
    assert fast_linear.runs("onednn", torch.float32) == torch.backends.mkldnn.is_available()
    assert not fast_linear.runs("onednn", torch.bfloat16)  # oneDNN's bfloat16 needs AVX-512 BW/VL/DQ
    assert not fast_linear.runs("onednn", torch.float64)
    monkeypatch.setattr(cpu, "flags", lambda: frozenset({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}))
    assert fast_linear.runs("onednn", torch.bfloat16) == torch.backends.mkldnn.is_available()
    monkeypatch.setattr(cpu, "flags", lambda: frozenset({"neon"}))
    assert not fast_linear.runs("onednn", torch.float32)


@pytest.mark.parametrize("value, message", [
    ("mkl", r"MINISBERT_GEMM='mkl': choose one of \['torch', 'onednn'\], or auto"),
    ("onednn", "MINISBERT_GEMM=onednn, but that kernel cannot multiply torch.float64 on this CPU"),
])
def test_a_bad_or_impossible_kernel_choice_is_refused(value, message, monkeypatch):
    monkeypatch.setenv(fast_linear.BACKEND_VARIABLE, value)
    encoder, ids = random_encoder("bert", "gelu")
    encoder.double()  # float64: torch's kernel only
    with torch.no_grad(), pytest.raises(ValueError, match=message):
        fast_encoder.forward(encoder, ids, MASK)


def test_the_kept_kernel_choices_are_printed_with_the_machine(monkeypatch, fresh_machine_file):
    """What bench/encode.py and evaluate.py --verbose print: the machine, then each fact kept about it."""
    monkeypatch.delenv(fast_linear.BACKEND_VARIABLE, raising=False)
    encoder, ids = random_encoder("bert", "gelu")
    with torch.no_grad():
        fast_encoder.forward(encoder, ids, MASK)
    lines = machine.report().splitlines()
    assert lines[0] == f"machine: {machine.describe()}" and str(fresh_machine_file) in lines[1]
    assert all(f"  {name}: {value}" in lines for name, value in kernel_facts().items())
    assert len(kernel_facts()) == (4 if len(BACKENDS_HERE) > 1 else 0)


def test_the_report_prints_the_facts_this_process_chose_by_and_counts_the_rest(fresh_machine_file):
    """A fact another run kept, or one an older minisbert named (no code asks for it now), is counted
    in the report, not printed as if it chose anything."""
    assert machine.fact("a fact asked for here", lambda: 1) == 1
    facts = machine.known()  # as another run of this machine wrote them, with their digest
    fresh_machine_file.write_text(json.dumps(with_digest({**facts, "a fact of an older minisbert": 2})))
    machine.forget()
    lines = machine.report().splitlines()
    assert "  a fact asked for here: 1" in lines and not any("older minisbert" in line for line in lines)
    assert lines[-1] == "  (1 more kept, not asked for by this process)"


def test_with_probes_off_nothing_is_timed_and_each_choice_is_its_first_candidate(monkeypatch):
    """The test suite's own setting (tests/conftest.py): no call is run to time it, so no choice
    depends on the machine's load; and a misspelt setting is named, not taken as "on"."""
    monkeypatch.setenv(machine.PROBES_VARIABLE, "off")
    ran = []
    assert machine.best_times({"first": lambda: ran.append(1), "second": lambda: ran.append(2)}) == \
        {"first": 0.0, "second": 0.0}
    assert machine.time_ratio(lambda: ran.append(3), lambda: ran.append(4)) == 1.0 and ran == []
    encoder, _ = random_encoder("bert", "gelu")
    layers = [encoder.layers[0].ffn.intermediate]
    assert fast_linear._quickest(list(BACKENDS_HERE), layers, "none", None, torch.float32) == BACKENDS_HERE[0]
    monkeypatch.setenv(machine.PROBES_VARIABLE, "no")
    with pytest.raises(ValueError, match="MINISBERT_PROBES='no': choose on"):
        machine.best_times({"first": lambda: None})
