"""One command for a machine with a GPU: does minisbert compute the same on CUDA, and how fast?

    python bench/gpu.py                        # all-MiniLM-L6-v2 on cuda:0
    python bench/gpu.py --model runs/x/final --corpus-rows 8841823 --dim 768

It prints, in order:
1. parity: embeddings of the same texts on CUDA and on the CPU (largest difference; 1e-5 expected
   in float32, TF32 off);
2. search parity: every way of minisbert.search.search that runs on CUDA returns the CPU plain
   loop's scores and indices bit for bit, in one call and query by query, on corpora built to tie;
3. encode throughput: texts per second on CUDA, float32 and with --amp's dtype;
4. a scan over a corpus the size of MS MARCO's passages (8.8M rows x 768, float16 on the GPU, 200
   queries, top-10): seconds, and the memory bandwidth achieved as a fraction of the device's peak
   (a scan reads every corpus byte once, so bandwidth is its physical limit). The peak is
   --peak-gbs, or a device-to-device copy measured here (a copy reads and writes, so it counts
   both).
Without CUDA it says so and exits with code 0 and nothing measured. The parts that need no GPU
(the parity checks run CPU-vs-CPU, the bandwidth arithmetic) are tested in tests/test_gpu_bench.py.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as `python bench/gpu.py` from a clone
import minisbert  # noqa: E402
from minisbert.precision import AMP_SPELLINGS  # noqa: E402
from minisbert.search import search  # noqa: E402

TEXTS = [f"sentence number {i} about {topic}" for i in range(256)
         for topic in ("bread", "bikes", "the sky", "gardens")][:512]


def embedding_parity(model_name: str, device: str, reference_device: str = "cpu") -> float:
    """Largest absolute difference between the embeddings of TEXTS on `device` and on `reference_device`."""
    here = minisbert.load(model_name, device=device).encode(TEXTS, batch_size=64)
    there = minisbert.load(model_name, device=reference_device).encode(TEXTS, batch_size=64)
    return float(np.abs(here - there).max())


def adversarial_corpora(rows: int, dim: int) -> dict:
    """{name: (N, d) corpus} built to tie or nearly tie: exact copies, rows 1e-6 apart, multiples of
    one row (equal cosines), norms from 1e-30 to 1e15, zero rows, small integers."""
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(rows, dim, generator=generator)  # (N, d)
    ties = base.clone()
    ties[rows // 2 : rows // 2 + 5] = ties[7]
    near = base.clone()
    near[rows // 3 : rows // 3 + 5] = ties[7] + 1e-6 * torch.randn(5, dim, generator=generator)
    multiples = base.clone()
    multiples[: rows // 4] = ties[7] * torch.arange(1, rows // 4 + 1)[:, None] / 64
    scales = base * 10.0 ** torch.randint(-30, 16, (rows, 1), generator=generator)
    scales[rows // 5 : rows // 5 + 3] = 0
    integers = torch.randint(-3, 4, (rows, dim), generator=generator).float()
    return {"ties": ties, "near duplicates": near, "multiples": multiples, "scales": scales, "integers": integers}


def search_parity(device: str, rows: int = 20_011, dim: int = 64, queries: int = 50, k: int = 10) -> dict:
    """{corpus and score: True if every way that runs on `device` returns the CPU plain loop's scores
    and indices bit for bit, for the queries in one call and each query alone} (adversarial_corpora)."""
    from minisbert.search import WAY_NAMES
    same = {}
    for name, corpus in adversarial_corpora(rows, dim).items():
        query_rows = torch.cat([corpus[7:8], corpus[:: rows // (queries - 1)][: queries - 1]])  # (Q, d)
        for score in ("cosine", "dot", "euclidean"):
            if score != "cosine" and name == "scales":
                continue  # dot products past float32: refused alike, tested in tests/test_search_property.py
            expected = search(query_rows, corpus, k, score=score, device="cpu", way="plain")
            agree = True
            for way in WAY_NAMES:
                try:
                    found = search(query_rows, corpus, k, score=score, device=device, way=way)
                except ValueError as error:  # a way that cannot run there (a CPU's), and nothing else
                    if "cannot run here" not in str(error):
                        raise
                    continue
                alone = [search(query_rows[i : i + 1], corpus, k, score=score, device=device, way=way)
                         for i in range(0, queries, 7)]
                agree &= all(torch.equal(a.cpu(), b) for a, b in zip(found, expected))
                agree &= all(torch.equal(a.cpu(), b[i * 7 : i * 7 + 1]) for i, one in enumerate(alone)
                             for a, b in zip(one, expected))
            same[f"{name}, {score}"] = agree
    return same


def encode_rate(model_name: str, device: str, dtype: str = "float32", batch_size: int = 256) -> float:
    model = minisbert.load(model_name, device=device)
    texts = TEXTS * 20
    model.encode(texts[:batch_size], batch_size=batch_size, dtype=dtype)  # warm up
    synchronize(device)
    started = time.perf_counter()
    model.encode(texts, batch_size=batch_size, dtype=dtype)
    synchronize(device)
    return len(texts) / (time.perf_counter() - started)


def bandwidth_fraction(bytes_read: int, seconds: float, peak_gbs: float) -> float:
    """Achieved bandwidth (bytes_read / seconds) as a fraction of the peak, in GB/s (1e9 bytes)."""
    return bytes_read / seconds / 1e9 / peak_gbs


def copy_bandwidth_gbs(device: str, megabytes: int = 1024) -> float:
    """Device memory bandwidth from a device-to-device copy: bytes read plus bytes written per second."""
    source = torch.empty(megabytes * 2**20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    synchronize(device)
    started = time.perf_counter()
    for _ in range(10):
        target.copy_(source)
    synchronize(device)
    return 2 * 10 * source.numel() / (time.perf_counter() - started) / 1e9


def scan(device: str, rows: int, dim: int, queries: int = 200, k: int = 10) -> tuple[float, int]:
    """Seconds for a top-k over a random float16 (rows, dim) corpus on `device`, and its size in bytes."""
    generator = torch.Generator(device=device).manual_seed(0)
    corpus = torch.randn(rows, dim, generator=generator, device=device, dtype=torch.float16)  # (N, d)
    query_rows = torch.randn(queries, dim, generator=generator, device=device)  # (Q, d)
    search(query_rows[:2], corpus[:100_000], k, score="dot")  # warm up
    synchronize(device)
    started = time.perf_counter()
    search(query_rows, corpus, k, score="dot")
    synchronize(device)
    return time.perf_counter() - started, corpus.numel() * corpus.element_size()


def synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="all-MiniLM-L6-v2")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--amp", choices=sorted(AMP_SPELLINGS), default="bf16", help="the dtype of the second encode rate")
    p.add_argument("--corpus-rows", type=int, default=8_841_823, help="MS MARCO passages: 8,841,823")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--peak-gbs", type=float, default=None, help="device peak bandwidth (default: measure a copy)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device here (torch.cuda.is_available() is False); nothing measured. "
              "Run it on a machine with an NVIDIA GPU and a CUDA build of torch.")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"device: {torch.cuda.get_device_name(args.device)}, torch {torch.__version__}")
    print(f"1. embeddings, CUDA vs CPU: largest difference {embedding_parity(args.model, args.device):.2e}")
    parity = search_parity(args.device)
    print(f"2. search, CUDA == CPU bit for bit: {sum(parity.values())} of {len(parity)} {parity}")
    dtype = AMP_SPELLINGS[args.amp]
    print(f"3. encode: {encode_rate(args.model, args.device):,.0f} texts/s float32, "
          f"{encode_rate(args.model, args.device, dtype):,.0f} texts/s {dtype}")
    seconds, size = scan(args.device, args.corpus_rows, args.dim)
    peak = args.peak_gbs or copy_bandwidth_gbs(args.device)
    print(f"4. top-10 of 200 queries over {args.corpus_rows:,} x {args.dim} float16 ({size / 1e9:.1f} GB): "
          f"{seconds:.3f} s, {size / seconds / 1e9:.0f} GB/s = {bandwidth_fraction(size, seconds, peak):.0%} "
          f"of {peak:.0f} GB/s ({'given' if args.peak_gbs else 'measured copy'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
