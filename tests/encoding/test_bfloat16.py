"""Encoding in bfloat16: refused where the CPU would only emulate it, and close to float32 where it runs.

"Correct" means: on a CPU without native bfloat16, encode(dtype="bfloat16") and evaluate.py --dtype
bfloat16 stop with an error that says so (and float16 is for GPUs); where bfloat16 runs, the matrix
products take bfloat16 inputs while the hidden states that LayerNorm, pooling and normalisation see stay
float32, and every embedding has cosine at least 0.9995 to its float32 embedding, on the plain and the
fast path, on every fixture model and on all-MiniLM-L6-v2 (slow). This CPU may lack native bfloat16: the
tests turn the capability check on, and torch then computes bfloat16 in software, slowly but with the
same rounding.

Why 0.9995: bfloat16 keeps 8 significant bits, so each product's inputs move by up to 2^-9 (0.2%); the
errors of many products mostly cancel, and the embeddings' directions move far less. Measured 1 - cosine
is at most 3.4e-5 on the fixture models (AMX here; software bfloat16 rounds alike) and 3e-5 on
all-MiniLM-L6-v2 (bench/README.md): 1 - 0.9995 = 5e-4 is 15 times that.
"""

import importlib.util
import re

import numpy as np
import pytest
import torch

import evaluate
from minisbert.common import cpu
from minisbert.encoding.fast import tiled_encoder as fast_encoder
from minisbert.encoding.fast import tiled_linear as fast_linear
from minisbert.encoding.fast.batching import FAST_PATH
from minisbert.encoding.model import SentenceModel
from minisbert.common.precision import autocast_dtype

from ..conftest import REPO, reference
from .test_encoder_fast import FIXTURE_MODELS
from ..tolerances import embeddings_apart, scale

BOTH_PATHS = pytest.mark.parametrize("fast", [False, True], ids=["plain", "fast"])


@pytest.fixture
def native_bfloat16(monkeypatch):
    monkeypatch.setattr(cpu, "native_bfloat16", lambda: True)


def min_cosine(a, b):
    a, b = torch.from_numpy(a).double(), torch.from_numpy(b).double()
    return torch.nn.functional.cosine_similarity(a, b).min().item()


def test_a_cpu_without_native_bfloat16_is_told_so(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu, "native_bfloat16", lambda: False)
    model = SentenceModel.from_dir(reference("tiny_bert")[0], device="cpu")
    with pytest.raises(ValueError, match="dtype bfloat16 needs a CPU that multiplies bfloat16 natively .* "
                                         "more slowly than float32: use float32 here, or a GPU"):
        model.encode(["a sentence"], dtype="bfloat16")
    with pytest.raises(ValueError, match="dtype bfloat16 needs a CPU"):
        evaluate.main(["--model", str(reference("tiny_bert")[0]), "--device", "cpu", "--dtype", "bfloat16",
                       "--no-cache", "--output", str(tmp_path / "results.json")])
    assert not (tmp_path / "results.json").exists()
    assert autocast_dtype("bfloat16", "cuda") == torch.bfloat16  # a GPU is not asked about its flags
    with pytest.raises(ValueError, match="dtype float16 is for GPUs"):
        autocast_dtype("float16", "cpu")


@BOTH_PATHS
@pytest.mark.parametrize("name", FIXTURE_MODELS)
def test_bfloat16_embeddings_are_within_cosine_0_9995_of_float32(name, fast, native_bfloat16):
    folder, _, info = reference(name)
    model = SentenceModel.from_dir(folder, device="cpu", fast_path=FAST_PATH if fast else None)
    float32 = model.encode(info["sentences"])
    bfloat16 = model.encode(info["sentences"], dtype="bfloat16")
    assert bfloat16.dtype == np.float32
    # the products did round to bfloat16: more than float32 adding in another order moves them (measured
    # 3.5e-3 and more, against at most 1e-4) ...
    assert np.abs(bfloat16 - float32).max() > embeddings_apart(model) * scale(float32)
    assert min_cosine(bfloat16, float32) >= 0.9995  # ... and the embeddings stay this close


@pytest.mark.parametrize("backend", [b for b in fast_linear.BACKENDS if fast_linear.runs(b, torch.bfloat16)])
def test_each_kernel_that_multiplies_bfloat16_here_stays_as_close(backend, native_bfloat16, monkeypatch):
    """oneDNN's bfloat16 kernel needs AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT: elsewhere only torch's is tried."""
    monkeypatch.setenv(fast_linear.BACKEND_VARIABLE, backend)
    folder, _, info = reference("tiny_st_dense")
    model = SentenceModel.from_dir(folder, device="cpu", fast_path=FAST_PATH)
    assert min_cosine(model.encode(info["sentences"], dtype="bfloat16"), model.encode(info["sentences"])) >= 0.9995


def test_products_are_bfloat16_while_the_hidden_states_stay_float32(native_bfloat16, monkeypatch):
    folder, _, info = reference("tiny_bert")
    model = SentenceModel.from_dir(folder, device="cpu")
    batch = model.tokenize(info["sentences"])
    product_inputs = []
    product = fast_linear.PRODUCTS["torch"]
    monkeypatch.setitem(fast_linear.PRODUCTS, "torch",
                        lambda x, *rest: product_inputs.append(x.dtype) or product(x, *rest))
    monkeypatch.setenv(fast_linear.BACKEND_VARIABLE, "torch")
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        fast = fast_encoder.forward(model.encoder, batch["input_ids"], batch["attention_mask"])
        plain = model.encoder(batch["input_ids"], batch["attention_mask"])
    assert product_inputs and set(product_inputs) == {torch.bfloat16}
    assert fast.dtype == plain.dtype == torch.float32  # the residual stream, and so LayerNorm and pooling


@pytest.mark.slow
@BOTH_PATHS
def test_minilm_bfloat16_embeddings_are_within_cosine_0_9995_of_float32(minilm, fast, native_bfloat16):
    sentences = reference("minilm")[2]["sentences"]
    float32 = minilm.encode(sentences, fast=fast)
    assert min_cosine(minilm.encode(sentences, dtype="bfloat16", fast=fast), float32) >= 0.9995


def test_the_bfloat16_benchmark_needs_emulate_here_and_then_reports_against_its_bounds(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("bfloat16_bench", REPO / "bench" / "bfloat16.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(cpu, "native_bfloat16", lambda: False)
    args = ["--model", str(reference("tiny_bert")[0]), "--data", str(REPO / "data" / "example"), "--limit", "6"]
    with pytest.raises(SystemExit):
        bench.main(args)
    assert "pass --emulate" in capsys.readouterr().err
    bench.main(args + ["--ndcg", "--emulate"])
    out = capsys.readouterr().out
    assert "EMULATED bfloat16" in out and "6 documents of " in out and "test split, 8 queries, 48 documents" in out
    assert re.search(r"lowest cosine, bfloat16 to float32: 0\.99\d+ .*bound 0\.9995: holds", out)
    assert re.search(r"bfloat16 - float32: [+-]0\.\d{5} \(bound 0\.002: (holds|FAILS)\)", out)
