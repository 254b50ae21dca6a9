"""What bfloat16 costs in accuracy: minisbert's bfloat16 beside its float32, encoding and training.

    python bench/bfloat16.py --limit 320                  # cosine to float32 on 320 SciFact documents, and speed
    python bench/bfloat16.py --limit 320 --ndcg           # and SciFact test NDCG@10 of both (full corpus)
    python bench/bfloat16.py --limit 0 --train-steps 120  # and train.py on STS-B with each, scored on STS-B test
    python bench/bfloat16.py ... --emulate                # on a CPU without native bfloat16 (see below)

The figures, with the bounds minisbert holds bfloat16 to:
- the lowest cosine of a document's bfloat16 embedding to its float32 one (bound: 0.9995), and the
  texts per second of each (bench/encode.py compares the speeds with sentence-transformers);
- with --ndcg, SciFact test NDCG@10 with each precision, as `evaluate.py --data scifact --dtype ...`
  computes it (bound: bfloat16 within 0.002 of float32);
- with --train-steps N, `train.py --arch siamese --metric cosine --data stsb --max-steps N --dtype ...`
  run for each precision from the same seed: its training time, and the STS-B test Spearman of the
  final model (encoded in float32, so that the figure measures the training alone).

--emulate. encode() and train.py refuse bfloat16 on a CPU without native bfloat16 instructions, where
torch computes it in software, several times slower than float32. With --emulate this script lifts
the refusal for itself and runs the same code on those software kernels. The products still round
their inputs to bfloat16 and sum in float32 (native kernels do the same, in another order), so the
accuracy figures stand for a native CPU's; the speeds do not, and are printed as such.

Printed first: the CPU and its flags.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import minisbert  # noqa: E402
import train  # noqa: E402
from bench.encode import scifact_documents  # noqa: E402
from bench.peer import cpu_summary  # noqa: E402
from minisbert.common import cpu
from minisbert import datasets
from minisbert.evaluation import metrics  # noqa: E402
from minisbert.evaluation.benchmark import rank, sts_correlations  # noqa: E402

DTYPES = ("float32", "bfloat16")
WARM_UP_TEXTS = 32
COSINE_BOUND, NDCG_BOUND = 0.9995, 0.002


def encoding(model, texts, batch_size) -> dict:
    """Each precision's embeddings of `texts` (unit length) and texts per second."""
    embeddings, rates = {}, {}
    for dtype in DTYPES:
        model.encode(texts[:WARM_UP_TEXTS], batch_size=batch_size, dtype=dtype)
        start = time.perf_counter()
        e = model.encode(texts, batch_size=batch_size, dtype=dtype, show_progress_bar=False)
        rates[dtype] = len(texts) / (time.perf_counter() - start)
        embeddings[dtype] = e / np.linalg.norm(e, axis=1, keepdims=True)
        print(f"  {dtype:9s} {rates[dtype]:7.1f} texts/s", flush=True)
    return {"cosines": (embeddings["bfloat16"] * embeddings["float32"]).sum(axis=1), "rates": rates}


def training(model_name: str, steps: int, stsb: str, folder: Path) -> dict:
    """train.py for `steps` steps in each precision; {dtype: (training seconds, STS-B test Spearman)}."""
    test = datasets.load_sts(stsb, "test")
    results = {}
    for dtype in DTYPES:
        output = folder / dtype
        train.main(["--model", model_name, "--arch", "siamese", "--metric", "cosine", "--data", stsb,
                    "--max-steps", str(steps), "--dtype", dtype, "--eval-steps", "0", "--output", str(output)])
        seconds = json.loads((output / "summary.json").read_text())["training_seconds"]
        spearman = sts_correlations(minisbert.load(str(output / "final")), test)["spearman"]
        results[dtype] = (seconds, spearman)
        print(f"  {dtype:9s} {steps} steps in {seconds:.0f} s, STS-B test Spearman {spearman:.4f}", flush=True)
    return results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data_root = Path(os.environ.get("MINISBERT_DATA_MIRROR", Path(__file__).resolve().parents[2] / "shared" / "data"))
    p.add_argument("--model", default="all-MiniLM-L6-v2")
    p.add_argument("--data", type=Path, default=data_root / "scifact",
                   help="SciFact (or another corpus with test qrels) in the BEIR layout")
    p.add_argument("--stsb", default="stsb", help="STS-B for --train-steps: stsb or a folder")
    p.add_argument("--limit", type=int, default=320, help="documents compared by cosine (0: none)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-length", type=int, default=256)
    p.add_argument("--ndcg", action="store_true", help="SciFact test NDCG@10 of both precisions (full corpus)")
    p.add_argument("--train-steps", type=int, default=0, help="train.py on STS-B for this many steps in each (0: no)")
    p.add_argument("--emulate", action="store_true",
                   help="on a CPU without native bfloat16, run torch's software bfloat16 (accuracy only)")
    args = p.parse_args(argv)
    if args.limit < 0 or args.train_steps < 0 or args.batch_size < 1 or args.max_seq_length < 1:
        p.error("--limit and --train-steps must be >= 0, --batch-size and --max-seq-length positive")
    if (args.limit or args.ndcg) and not (args.data / "corpus.jsonl").is_file():
        p.error(f"no corpus.jsonl in {args.data}: pass --data FOLDER (SciFact, BEIR layout)")

    print(f"CPU: {cpu_summary()}\ntorch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load {os.getloadavg()[0]:.2f}")
    emulated = not cpu.native_bfloat16()
    if emulated:
        if not args.emulate:
            p.error("this CPU has no native bfloat16 (no avx512_bf16 or amx_bf16 flag), so minisbert refuses it; "
                    "pass --emulate to measure its accuracy on torch's software kernels")
        cpu.native_bfloat16 = lambda: True  # lifts the refusal in this process only (precision.autocast_dtype reads it)
        print("EMULATED bfloat16: torch's software kernels. The accuracy figures hold for a native CPU; the "
              "bfloat16 speeds below do not.")

    model = minisbert.load(args.model, device="cpu")
    model.limit_max_seq_length(args.max_seq_length)  # at most the model's positions
    if args.limit:
        texts = scifact_documents(args.data, args.limit)
        print(f"\n{len(texts):,} documents of {args.data}, batch {args.batch_size}, "
              f"max_seq_length {model.tokenizer.max_seq_length}:")
        result = encoding(model, texts, args.batch_size)
        lowest = float(result["cosines"].min())
        print(f"  lowest cosine, bfloat16 to float32: {lowest:.6f} (median {float(np.median(result['cosines'])):.6f}; "
              f"bound {COSINE_BOUND}: {'holds' if lowest >= COSINE_BOUND else 'FAILS'})")
        if not emulated:
            print(f"  bfloat16 / float32 speed: {result['rates']['bfloat16'] / result['rates']['float32']:.2f}x")

    if args.ndcg:
        test = datasets.load_beir(args.data, "test")
        print(f"\n{args.data} test split, {len(test.queries)} queries, {len(test.corpus):,} documents:")
        ndcg = {}
        for dtype in DTYPES:
            start = time.perf_counter()
            run = rank(model, test, 10, score="cosine", batch_size=args.batch_size, dtype=dtype)
            ndcg[dtype] = metrics.evaluate_run(run, test.qrels, (10,))["ndcg@10"]
            print(f"  {dtype:9s} NDCG@10 {ndcg[dtype]:.5f}  ({time.perf_counter() - start:.0f} s)", flush=True)
        gap = ndcg["bfloat16"] - ndcg["float32"]
        print(f"  bfloat16 - float32: {gap:+.5f} (bound {NDCG_BOUND}: {'holds' if abs(gap) <= NDCG_BOUND else 'FAILS'})")

    if args.train_steps:
        print(f"\ntrain.py --arch siamese --metric cosine --data {args.stsb} --max-steps {args.train_steps}:")
        with tempfile.TemporaryDirectory(prefix="minisbert-bfloat16-") as folder:
            trained = training(args.model, args.train_steps, args.stsb, Path(folder))
        (f32_seconds, f32_spearman), (bf16_seconds, bf16_spearman) = trained["float32"], trained["bfloat16"]
        print(f"  Spearman, bfloat16 - float32: {bf16_spearman - f32_spearman:+.4f}"
              + ("" if emulated else f"; fit speed bfloat16 / float32: {f32_seconds / bf16_seconds:.2f}x"))


if __name__ == "__main__":
    main()
