"""Does int8 pay? minisbert float32 beside the same model with int8 weights, on this CPU.

    python bench/int8.py --limit 320 --rounds 3        # speed and cosine on 320 SciFact documents
    python bench/int8.py --limit 320 --ndcg            # and SciFact test NDCG@10 of both (full corpus)

The int8 model is torch's own dynamic quantization (`torch.ao.quantization.quantize_dynamic` with
`per_channel_dynamic_qconfig`): every nn.Linear gets int8 weights with one scale per output channel,
and each product quantizes its input on the fly with a scale taken from that input (its range). The
quantized products run on torch's fbgemm kernels (AVX2 / AVX-512 integer dot products). Quantized
modules replace nn.Linear, so the int8 model runs minisbert's plain encoder, which calls its
nn.Linear modules; the fast path reads the weights itself and has no int8 kernels. So the figures
printed are: minisbert float32 (fast path, as encode() runs by default), minisbert float32 plain
path (what int8 replaces the products of), and int8 on the plain path.

minisbert ships int8 only if it is at least 1.5x faster than float32 on a CPU without native
bfloat16, at an NDCG@10 cost of at most 0.005; this script is how that is measured. It prints the CPU
and its flags, each round's rate (rounds take turns, so load from elsewhere hits every contender), the
mean rates and their ratio to float32, the lowest cosine of a document's int8 embedding to its
float32 one, and with --ndcg the two NDCG@10 figures.
"""

import argparse
import copy
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import minisbert  # noqa: E402
from bench.encode import scifact_documents  # noqa: E402
from bench.peer import cpu_summary  # noqa: E402
from minisbert import datasets
from minisbert.evaluation import metrics  # noqa: E402
from minisbert.evaluation.benchmark import rank  # noqa: E402

WARM_UP_TEXTS = 64


def int8_copy(model):
    """A copy of `model` whose nn.Linear layers hold per-channel int8 weights (dynamic quantization),
    set to run the plain encoder."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # torch announces that quantized tensors will move to torchao
        warnings.simplefilter("ignore")
        quantized = quantize_dynamic(copy.deepcopy(model), {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    quantized.fast_path = None  # the plain path: the fast one reads float weights itself
    return quantized


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="all-MiniLM-L6-v2")
    p.add_argument("--data", type=Path, default=Path(os.environ.get(
        "MINISBERT_DATA_MIRROR", Path(__file__).resolve().parents[2] / "shared" / "data")) / "scifact")
    p.add_argument("--limit", type=int, default=320, help="documents timed (0: all)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-length", type=int, default=256)
    p.add_argument("--ndcg", action="store_true", help="also SciFact test NDCG@10 of float32 and int8 (full corpus)")
    args = p.parse_args()
    if args.limit < 0 or args.rounds < 1 or args.batch_size < 1 or args.max_seq_length < 1:
        p.error("--limit must be >= 0 and --rounds, --batch-size, --max-seq-length positive")
    if not (args.data / "corpus.jsonl").is_file():
        p.error(f"no corpus.jsonl in {args.data}: pass --data FOLDER (SciFact, BEIR layout)")

    texts = scifact_documents(args.data, args.limit)
    print(f"{len(texts):,} SciFact documents, batch {args.batch_size}, max_seq_length {args.max_seq_length}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, quantized engine "
          f"{torch.backends.quantized.engine}, load {os.getloadavg()[0]:.2f}")
    print(f"CPU: {cpu_summary()}")
    model = minisbert.load(args.model, device="cpu")
    model.max_seq_length = args.max_seq_length
    models = {"float32 (fast path)": (model, True), "float32 (plain path)": (model, False),
              "int8 (plain path)": (int8_copy(model), False)}

    def encode(name, batch):
        chosen, fast = models[name]
        return chosen.encode(batch, batch_size=args.batch_size, show_progress_bar=False, fast=fast)

    for name in models:
        encode(name, texts[:WARM_UP_TEXTS])
    rates, embeddings = {name: [] for name in models}, {}
    for round_number in range(1, args.rounds + 1):
        for name in models:
            start = time.perf_counter()
            embeddings[name] = encode(name, texts)
            rates[name].append(len(texts) / (time.perf_counter() - start))
            print(f"round {round_number}  {name:22s} {rates[name][-1]:7.1f} texts/s  (load {os.getloadavg()[0]:.2f})",
                  flush=True)

    reference = "float32 (fast path)"
    mean = {name: sum(r) / len(r) for name, r in rates.items()}
    unit = {name: e / np.linalg.norm(e, axis=1, keepdims=True) for name, e in embeddings.items()}
    print(f"\n{'contender':22s} {'texts/s':>8s}  {'vs float32 fast':>16s}  {'vs float32 plain':>16s}  min cosine")
    for name in models:
        cosine = float((unit[name] * unit[reference]).sum(axis=1).min())
        print(f"{name:22s} {mean[name]:8.1f}  {mean[name] / mean[reference]:15.2f}x  "
              f"{mean[name] / mean['float32 (plain path)']:15.2f}x  {cosine:.5f}")

    if args.ndcg:
        test = datasets.load_beir(args.data, "test")
        for name in (reference, "int8 (plain path)"):
            chosen, _ = models[name]  # the float32 model runs its fast path, the int8 copy has none
            run = rank(chosen, test, 10, score="cosine", batch_size=args.batch_size)
            ndcg = metrics.evaluate_run(run, test.qrels, (10,))["ndcg@10"]
            print(f"SciFact test NDCG@10, {name}: {ndcg:.5f}", flush=True)


if __name__ == "__main__":
    main()
