"""One command for a machine with a GPU: does minisbert compute the same on CUDA, and how fast?
Every figure of bench/README.md's "GPUs" section, in under 5 minutes on an H200:

    python bench/gpu.py                        # all-MiniLM-L6-v2 on cuda:0
    python bench/gpu.py --model runs/x/final --corpus-rows 8841823 --dim 768

It prints, in order:
1. the CUDA tests (tests/ collected with -k cuda: the search on CUDA against the CPU's, the float16
   screen's bound on tensor cores), run by pytest;
2. search parity: every way of minisbert.search.search that runs on CUDA returns the CPU plain
   loop's scores and indices bit for bit, in one call and query by query, on corpora built to tie,
   as given and prepared;
3. the search table: ms per call of the device way against `torch.topk(q @ C.T)` at 1, 16 and 1,000
   queries over 1,000,000 x 384 float32 rows, k = 10, as given (dot, cosine) and prepared (cosine:
   the float16 screen, and the float32 one forced); the kernels and host waits of one query over the
   prepared corpus (torch's profiler; torch.cuda's sync debug mode);
4. bandwidth: one query over the prepared corpus as a fraction of the device's memory bandwidth
   (--peak-gbs, or a device-to-device copy measured here: a copy reads and writes, so it counts both);
5. with the model's weights here: embeddings of the same texts on CUDA and on the CPU (largest
   difference; 1e-5 expected in float32, TF32 off) and texts per second, float32 and --amp's dtype;
6. a scan over a corpus the size of MS MARCO's passages (--corpus-rows x --dim float16 on the GPU,
   200 queries, top-10): seconds and the bandwidth reached.
Without CUDA it says so and exits with code 0 and nothing measured. The parts that need no GPU
(the parity checks run CPU-vs-CPU, the timing and bandwidth arithmetic) are tested in tests/test_gpu_bench.py.
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as `python bench/gpu.py` from a clone
import minisbert  # noqa: E402
from minisbert.search.fast.device import host_waits  # noqa: E402
from minisbert.common.hub import default_weights_dir  # noqa: E402
from minisbert.common.precision import AMP_SPELLINGS  # noqa: E402
from minisbert.search import WAY_NAMES, prepare_corpus, search  # noqa: E402

TEXTS = [f"sentence number {i} about {topic}" for i in range(256)
         for topic in ("bread", "bikes", "the sky", "gardens")][:512]
QUERY_COUNTS = (1, 16, 1000)
ROUNDS = 5  # timed calls per cell, after one untimed: the best is reported


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
    """{corpus, score and form: True if every way that runs on `device` returns the CPU plain loop's
    scores and indices bit for bit, for the queries in one call and each query alone}
    (adversarial_corpora, as given and, for cosine, prepared on `device`)."""
    same = {}
    for name, corpus in adversarial_corpora(rows, dim).items():
        query_rows = torch.cat([corpus[7:8], corpus[:: rows // (queries - 1)][: queries - 1]])  # (Q, d)
        for score in ("cosine", "dot", "euclidean"):
            if score != "cosine" and name == "scales":
                continue  # dot products past float32: refused alike, tested in tests/search/test_search_property.py
            expected = search(query_rows, corpus, k, score=score, device="cpu", way="plain")
            forms = {"as given": corpus}
            if score == "cosine":
                forms["prepared"] = prepare_corpus(corpus.to(device), score, screen=False)
            for form, searched in forms.items():
                agree = True
                for way in WAY_NAMES:
                    try:
                        found = search(query_rows, searched, k, score=score, device=device, way=way)
                    except ValueError as error:  # a way that cannot run there (a CPU's), and nothing else
                        if "cannot run here" not in str(error):
                            raise
                        continue
                    alone = [search(query_rows[i : i + 1], searched, k, score=score, device=device, way=way)
                             for i in range(0, queries, 7)]
                    agree &= all(torch.equal(a.cpu(), b) for a, b in zip(found, expected))
                    agree &= all(torch.equal(a.cpu(), b[i * 7 : i * 7 + 1]) for i, one in enumerate(alone)
                                 for a, b in zip(one, expected))
                same[f"{name}, {score}, {form}"] = agree
    return same


def best_ms(call, device: str, rounds: int = ROUNDS) -> float:
    """The quickest of `rounds` calls, in ms, after one untimed call (warm-up, a corpus's copies made)."""
    call()
    times = []
    for _ in range(rounds):
        synchronize(device)
        started = time.perf_counter()
        call()
        synchronize(device)
        times.append(time.perf_counter() - started)
    return 1e3 * min(times)


def search_table(device: str, rows: int = 1_000_000, dim: int = 384, k: int = 10, query_counts=QUERY_COUNTS,
                 rounds: int = ROUNDS) -> dict:
    """{(method, queries): ms per call} over (rows, dim) float32 rows on `device` (module docstring, 3)."""
    generator = torch.Generator(device=device).manual_seed(0)
    corpus = torch.randn(rows, dim, generator=generator, device=device)  # (N, d)
    prepared = prepare_corpus(corpus, "cosine", screen=False)
    methods = {
        "torch.topk(q @ C.T)": lambda q: torch.topk(q @ corpus.T, k, dim=1),
        "device, dot, as given": lambda q: search(q, corpus, k, score="dot"),
        "device, cosine, as given": lambda q: search(q, corpus, k, score="cosine"),
        "device, prepared (float16 screen)": lambda q: search(q, prepared, k, way="device, half"),
        "device, prepared (float32 screen)": lambda q: search(q, prepared, k, way="device"),
    }
    table = {}
    for count in query_counts:
        queries = torch.randn(count, dim, generator=generator, device=device)
        for method, run in methods.items():
            table[method, count] = best_ms(lambda: run(queries), device, rounds)
    return table


def speedups(table: dict, reference: str = "torch.topk(q @ C.T)") -> dict:
    """{(method, queries): the reference's ms over the method's} for every method but the reference."""
    return {(method, count): table[reference, count] / ms for (method, count), ms in table.items()
            if method != reference}


def launches_and_waits(call, device: str) -> tuple[int, int]:
    """(GPU kernels and copies, host waits) of one `call()`, after a warm-up call: the kernels from
    torch's profiler, the waits from torch.cuda's sync debug mode (one warning per synchronising call)."""
    from torch.profiler import ProfilerActivity, profile
    call()
    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiled:
        call()
        synchronize(device)
    kernels = sum(1 for event in profiled.events() if event.device_type == torch.autograd.DeviceType.CUDA)
    return kernels, len(host_waits(call))


def bandwidth_fraction(bytes_read: int, seconds: float, peak_gbs: float) -> float:
    """Achieved bandwidth (bytes_read / seconds) as a fraction of the peak, in GB/s (1e9 bytes)."""
    return bytes_read / seconds / 1e9 / peak_gbs


def copy_bandwidth_gbs(device: str, megabytes: int = 1024) -> float:
    """Device memory bandwidth from a device-to-device copy: bytes read plus bytes written per second."""
    source = torch.empty(megabytes * 2**20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    seconds = best_ms(lambda: target.copy_(source), device) / 1e3
    return 2 * source.numel() / seconds / 1e9


def run_cuda_tests() -> tuple[int, str]:
    """(pytest's exit code, its last line) for the tests collected with -k cuda (module docstring, 1)."""
    files = ["tests/search/test_retrieval.py", "tests/search/test_device_search.py", "tests/search/test_search_bounds.py"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow",
                           "-k", "cuda", *files], cwd=REPO, capture_output=True, text=True)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode, lines[-1] if lines else "(no output)"


def model_here(name: str) -> bool:
    """True where the model's folder is on this machine (a path, or a known name already fetched)."""
    return Path(name).expanduser().is_dir() or (default_weights_dir() / name).is_dir()


def embedding_parity(model_name: str, device: str, reference_device: str = "cpu") -> float:
    """Largest absolute difference between the embeddings of TEXTS on `device` and on `reference_device`."""
    here = minisbert.load(model_name, device=device).encode(TEXTS, batch_size=64)
    there = minisbert.load(model_name, device=reference_device).encode(TEXTS, batch_size=64)
    return float(np.abs(here - there).max())


def encode_rate(model_name: str, device: str, dtype: str = "float32", batch_size: int = 256) -> float:
    model = minisbert.load(model_name, device=device)
    texts = TEXTS * 20
    model.encode(texts[:batch_size], batch_size=batch_size, dtype=dtype)  # warm up
    synchronize(device)
    started = time.perf_counter()
    model.encode(texts, batch_size=batch_size, dtype=dtype)
    synchronize(device)
    return len(texts) / (time.perf_counter() - started)


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
    p.add_argument("--corpus-rows", type=int, default=8_841_823, help="the scan's rows; MS MARCO passages: 8,841,823")
    p.add_argument("--dim", type=int, default=768, help="the scan's dimension")
    p.add_argument("--peak-gbs", type=float, default=None, help="device peak bandwidth (default: measure a copy)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device here (torch.cuda.is_available() is False); nothing measured. "
              "Run it on a machine with an NVIDIA GPU and a CUDA build of torch.")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    # The float16 screen ("device, half") runs only where float16 products are summed in float32.
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    started = time.perf_counter()
    print(f"device: {torch.cuda.get_device_name(args.device)}, torch {torch.__version__}", flush=True)
    code, last = run_cuda_tests()
    print(f"1. CUDA tests (pytest -k cuda): {'passed' if code == 0 else f'FAILED (exit {code})'}: {last}", flush=True)
    parity = search_parity(args.device)
    print(f"2. search, CUDA == CPU bit for bit: {sum(parity.values())} of {len(parity)} {parity}", flush=True)
    table = search_table(args.device)
    ratios = speedups(table)
    print("3. search, 1,000,000 x 384 float32 rows, k = 10: ms per call (best of 5), and the one-liner's ms over it")
    for method in dict.fromkeys(method for method, _ in table):
        cells = [f"{table[method, count]:8.2f}" + (f" ({ratios[method, count]:.2f}x)" if (method, count) in ratios
                                                   else "") for count in QUERY_COUNTS]
        print(f"   {method:36s}" + "".join(f"{cell:>20s}" for cell in cells))
    generator = torch.Generator(device=args.device).manual_seed(1)
    corpus = torch.randn(1_000_000, 384, generator=generator, device=args.device)
    prepared = prepare_corpus(corpus, "cosine", screen=False)
    query = torch.randn(1, 384, generator=generator, device=args.device)
    kernels, waits = launches_and_waits(lambda: search(query, prepared, 10, way="device, half"), args.device)
    print(f"   one query over the prepared corpus: {kernels} GPU kernels and copies, {waits} host waits "
          "(the search's checks included)", flush=True)
    peak = args.peak_gbs or copy_bandwidth_gbs(args.device)
    seconds = best_ms(lambda: search(query, prepared, 10, way="device, half"), args.device) / 1e3
    copy_bytes = prepared.half_copy.rows.numel() * prepared.half_copy.rows.element_size()
    print(f"4. one query over the prepared corpus reads its float16 copy ({copy_bytes / 1e9:.2f} GB) in "
          f"{1e3 * seconds:.3f} ms: {copy_bytes / seconds / 1e9:,.0f} GB/s = "
          f"{bandwidth_fraction(copy_bytes, seconds, peak):.0%} of {peak:,.0f} GB/s "
          f"({'given' if args.peak_gbs else 'measured copy'})", flush=True)
    del corpus, prepared
    if model_here(args.model):
        dtype = AMP_SPELLINGS[args.amp]
        print(f"5. embeddings, CUDA vs CPU: largest difference {embedding_parity(args.model, args.device):.2e}; "
              f"encode: {encode_rate(args.model, args.device):,.0f} texts/s float32, "
              f"{encode_rate(args.model, args.device, dtype):,.0f} texts/s {dtype}", flush=True)
    else:
        print(f"5. embeddings: skipped, model {args.model!r} is not on this machine (fetch it first: "
              f"python -m minisbert.encoding.weights fetch {args.model})", flush=True)
    seconds, size = scan(args.device, args.corpus_rows, args.dim)
    print(f"6. top-10 of 200 queries over {args.corpus_rows:,} x {args.dim} float16 ({size / 1e9:.1f} GB): "
          f"{seconds:.3f} s, {size / seconds / 1e9:.0f} GB/s = {bandwidth_fraction(size, seconds, peak):.0%} "
          f"of {peak:.0f} GB/s")
    print(f"bench/gpu.py took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
