"""Benchmark exact top-k search: minisbert.search.search against the obvious alternatives, at the
numbers of queries people search with: one (a demo, a service answering one request), a few
(a dev set), and a thousand (an evaluation).

For each corpus size and each number of queries per call it times, side by side in one run, on
random L2-normalised float32 data (fixed seed):
    minisbert search, score="dot" and score="cosine" (cosine also checks and normalises every
        row: the one-shot call), taking the way minisbert/search/ways.py's WAYS chooses (printed, with
        the facts it was chosen by, from one search before the timing),
        score="dot" unscreened (way "spans" or "blocks"), a corpus prepared once (prepare_corpus,
        cosine: checked and normalised once, with the copies its screens read where they pay),
        minisbert.porting.util.semantic_search (sentence-transformers' call, over the search), and, if
        asked for, score="dot" with way="plain" (the plain loop); and with --ways, each way named
        forced, over rows as given (dot) and a prepared corpus (cosine): whether a way of WAYS pays
    the floor, if asked for: the float32 product of the queries and every row (by the machine's
        quickest kernel, timed at that size and named), and the exact scores
        of each query's k best rows (found beforehand), the two steps no way of minisbert's that
        multiplies in float32 can leave out (`floor`); and the floor with norms, if asked for: that
        and each row's float32 norm taken while the rows are in the cache, which a search over rows
        as given needs besides (`floor(norms=True)`)
    plain torch.topk(queries @ corpus.T)    (chunked over queries only if the full score matrix
                                            would not fit in --plain-budget-gb; it says so)
    plain torch.topk(cos_sim(queries, corpus))   (the cosine one-liner: sentence-transformers'
                                            cos_sim normalises both sides, then multiplies;
                                            chunked the same way)
    sentence_transformers.util.semantic_search (cosine; when importable)
    faiss.IndexFlatIP                       (inner product; when importable; its index holds a
                                            copy of the corpus)
It also measures the read-once bound: the time this machine takes to read the corpus's float32
rows once (the fastest of a few full reductions over them), which no exact search of a few
queries over those rows can beat, and prints each method's time per call as a multiple of it.
Timing interleaves the methods round by round (method A, B, C, A, B, C, ...), so that a change
in the load of a shared machine hits them alike; in a round each method makes enough calls for
32 queries at least and, on a CPU, for 0.25 s, after a pause of 0.3 s in which the previous
method's threads go idle; the best round is reported, with the slowest, and each ratio with the
range of the same-round ratios. Peak memory is measured, at the largest number of queries, in a fresh
subprocess per method, one search each: the peak resident set (VmHWM, reset just before the
search) minus the resident set at that moment, or torch.cuda.max_memory_allocated on a GPU. Every
method's top-k is compared with minisbert's for the same score function. The CPU's vector
extensions are printed with the figures, since the ratios depend on them, and so are the facts
minisbert measured once on this machine to choose its ways (minisbert/common/machine.py).

faiss and sentence-transformers are never dependencies of minisbert: they run in a child process
of the peer environment's Python, named by --peer-python or MINISBERT_PEER_PYTHON (bench/peer.py),
which reads the same data (written once to shared memory), builds its index once and searches
when asked, taking turns with minisbert's methods in this process. Without a peer Python they
are skipped.

On CUDA it also reports the fraction of the memory-bandwidth roofline for an 8.8M x 768 float16
corpus (the size of the MS MARCO passage collection, 8,841,823 passages, Nguyen et al. 2016,
"MS MARCO: A Human Generated MAchine Reading COmprehension Dataset") when the GPU has room for
it; the bandwidth is --bandwidth-gbs or, if not given, measured with a device-to-device copy.

Run:
    python bench/retrieval.py --peer-python /path/to/peer-env/bin/python
    MINISBERT_PEER_PYTHON=/path/to/peer-env/bin/python python bench/retrieval.py --sizes 200000 --queries 1 16 1000 10000
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # minisbert from this checkout
from bench.peer import add_peer_python_option, check_peer_python, cpu_summary  # noqa: E402

METHODS = (
    "minisbert-dot", "minisbert-cosine", "minisbert-prepared", "minisbert-util", "minisbert-float32",
    "minisbert-plain", "floor", "floor-norms", "plain", "plain-cosine", "semantic_search", "faiss",
)
# The plain path sorts every block, and the floors are no search; they are timed only when asked for with --methods.
DEFAULT_METHODS = tuple(m for m in METHODS if m not in ("minisbert-plain", "floor", "floor-norms"))
LABELS = {
    "minisbert-dot": 'minisbert search(score="dot")',
    "minisbert-float32": 'minisbert (dot, no screen)',
    "minisbert-plain": 'minisbert (dot, way="plain")',
    "minisbert-cosine": 'minisbert search(score="cosine")',
    "minisbert-prepared": "minisbert search(prepare_corpus(C))",
    "minisbert-util": "minisbert util.semantic_search",
    "floor": "floor: product, exact scores of the k",
    "floor-norms": "floor: product, row norms, exact scores",
    "plain": "torch.topk(q @ C.T)",
    "plain-cosine": "torch.topk(cos_sim(q, C))",
    "semantic_search": "sentence-transformers semantic_search",
    "faiss": "faiss IndexFlatIP",
}
# Each method's top-k is compared with minisbert's for the same score function.
SAME_SCORE_AS = {
    "minisbert-dot": "minisbert-dot",
    "minisbert-cosine": "minisbert-cosine",
    "minisbert-prepared": "minisbert-cosine",
    "minisbert-util": "minisbert-cosine",
    "minisbert-float32": "minisbert-dot",
    "minisbert-plain": "minisbert-dot",
    "floor": "minisbert-dot",
    "floor-norms": "minisbert-dot",
    "plain": "minisbert-dot",
    "plain-cosine": "minisbert-cosine",
    "semantic_search": "minisbert-cosine",
    "faiss": "minisbert-dot",
}


def label(method: str) -> str:
    """A method's name in the tables; a forced way (--ways) is "way NAME, dot" or "way NAME, prepared"."""
    if method.startswith("minisbert-way:"):
        _, way, *prepared = method.split(":")
        return f"minisbert way={way!r}, {'prepared' if prepared else 'dot'}"
    return LABELS[method]


def same_score_as(method: str) -> str:
    """The method whose top-k this method's must equal."""
    if method.startswith("minisbert-way:"):
        return "minisbert-prepared" if method.endswith(":prepared") else "minisbert-dot"
    return SAME_SCORE_AS[method]


MSMARCO_DOCS, MSMARCO_DIM, MSMARCO_QUERIES = 8_841_823, 768, 200
# Run by the peer environment's Python, in a child process (see Peer).
PEER_METHODS = ("semantic_search", "faiss")
WARM_UP_QUERIES = 128  # up to this many queries per call, methods warm up on the timed queries
# A pause before each method's turn, and turns of at least MIN_TURN_SECONDS on a CPU. A BLAS
# library's threads keep the cores busy for a while after a call (OpenBLAS's, under faiss,
# busy-wait for more work), and the method timed next ran slower: over 10,000 rows, 16 queries a
# call (two calls a turn), the dot search took 4.4 ms after faiss's turn and 2.5 ms without faiss
# in the rounds, and faiss 6.8 ms after the other methods and 3.3 ms after a pause.
SETTLE_SECONDS = 0.3
MIN_TURN_SECONDS = 0.25


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 1_000_000], help="corpus sizes N")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, nargs="+", default=[1, 16, 1000], help="queries per call")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per method; the best is reported")
    parser.add_argument(
        "--devices", nargs="+", default=["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    )
    parser.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=METHODS)
    parser.add_argument("--ways", nargs="+", default=[], metavar="WAY",
                        help="also time each of these ways of minisbert/search/ways.py's WAYS, forced, over rows as "
                             "given (dot) and over a prepared corpus (cosine): whether a way pays for its row")
    add_peer_python_option(parser)
    parser.add_argument("--plain-budget-gb", type=float, default=None,
                        help="largest score matrix the plain method may build "
                             "(default: a quarter of free memory)")
    parser.add_argument("--bandwidth-gbs", type=float, default=None,
                        help="GPU peak memory bandwidth for the roofline (default: measure with a copy)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run one method, print JSON
    parser.add_argument("--serve-peer", help=argparse.SUPPRESS)  # internal: a data folder; see Peer
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--num-queries", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--device", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_budget_gb is None:
        args.plain_budget_gb = _available_memory_gb() / 4
    if args.worker:
        print(json.dumps(run_one(args)))
        return
    if args.serve_peer:
        serve_peer(args)
        return
    check_peer_python(parser, args.peer_python)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; peer: {args.peer_python or 'none'}")
    print(f"CPU: {cpu_summary()}")
    print(f"load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for device in args.devices:
        for size in args.sizes:
            for num_queries in args.queries:
                compare(args, size, num_queries, device, memory=num_queries == max(args.queries))
        if device == "cuda":
            roofline(args)
    print(f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    from minisbert.common import machine
    print(machine.report())


def compare(args, size: int, num_queries: int, device: str, memory: bool) -> None:
    print(f"\nN = {size:,} x d = {args.dim}, {num_queries:,} queries per call, k = {args.k}, {device}")
    methods = [m for m in args.methods if device == "cpu" or m not in PEER_METHODS]
    methods += [f"minisbert-way:{way}{form}" for way in args.ways for form in ("", ":prepared")]
    queries, corpus = make_data(size, args.dim, num_queries, torch.device(device))
    calls = -(-32 // num_queries)  # per round: enough calls for 32 queries at least
    prepared, notes = {}, {}
    for method in methods:
        if method in PEER_METHODS:
            continue
        prepared[method], notes[method], _ = prepare(method, queries, corpus, args)
        # Warm up with the timed number of queries where a call is short: the few-query search
        # measures its product's kernels the first time it meets a number of queries
        # (minisbert/search/fast/span_product.py), once per process.
        prepared[method](queries if num_queries <= WARM_UP_QUERIES else queries[:10])
    peer = None
    wanted = [m for m in methods if m in PEER_METHODS]
    if wanted and args.peer_python is None:
        print(f"{', '.join(label(m) for m in wanted)}: skipped, no peer environment "
              f"(--peer-python or $MINISBERT_PEER_PYTHON)")
    elif wanted:
        peer = Peer(args, queries, corpus, wanted)
        for method in wanted:
            if method in peer.skipped:
                print(f"{label(method):40s} skipped: {peer.skipped[method]}")
            else:
                prepared[method], notes[method] = peer.searcher(method, calls), peer.notes[method]

    seconds = {method: [] for method in prepared}  # per round: seconds per call
    indices = {}
    read_once = []
    try:
        for _ in range(args.repeats):
            read_once.append(read_once_seconds(corpus))
            for method, search_fn in prepared.items():
                time.sleep(SETTLE_SECONDS)
                if method in PEER_METHODS:  # timed by the peer itself, without the hand-over
                    found, elapsed = search_fn(queries)
                else:
                    found, elapsed = take_turn(search_fn, queries, calls, corpus.device)
                if isinstance(found, list):  # util.semantic_search's hits
                    found = [[hit["corpus_id"] for hit in row] for row in found]
                indices[method] = np.asarray(torch.as_tensor(found).cpu())
                seconds[method].append(elapsed)
    finally:
        if peer is not None:
            peer.close()
    del prepared, queries, corpus

    bound = min(read_once)
    print(f"read-once bound: {bound * 1e3:.2f} ms to read the {size * args.dim * 4 / 1e6:.0f} MB of float32 rows "
          f"once ({size * args.dim * 4 / bound / 1e9:.1f} GB/s)")
    print(f"{'method':40s} {'queries/s':>10s} {'(slowest round)':>15s} {'ms/call':>8s} {'/ bound':>8s} "
          f"{'peak extra MB':>14s}  {'same top-k':>10s}")
    throughput = {}
    for method, timings in seconds.items():
        throughput[method] = num_queries / min(timings)
        slowest = num_queries / max(timings)
        reference = indices.get(same_score_as(method))
        agreement = "" if reference is None else f"{(indices[method] == reference).all(axis=1).mean():.1%}"
        memory_mb = peak_memory_in_subprocess(args, method, size, num_queries, device) if memory else float("nan")
        note = notes[method]
        if isinstance(memory_mb, str):
            memory_mb, note = float("nan"), f"{note} {memory_mb}"
        print(f"{label(method):40s} {throughput[method]:10.1f} {slowest:15.1f} {min(timings) * 1e3:8.2f} "
              f"{min(timings) / bound:7.2f}x {memory_mb:14.1f}  {agreement:>6s}  {note}")
    ratios = [("minisbert-dot", "faiss"), ("minisbert-cosine", "faiss"), ("minisbert-dot", "plain"),
              ("minisbert-cosine", "plain"), ("minisbert-cosine", "plain-cosine"), ("minisbert-prepared", "plain"),
              ("minisbert-prepared", "faiss"), ("floor", "faiss"), ("floor", "plain"),
              ("minisbert-cosine", "semantic_search"), ("minisbert-util", "minisbert-cosine"),
              ("minisbert-dot", "minisbert-float32"), ("minisbert-dot", "minisbert-plain"),
              ("floor-norms", "plain"), ("minisbert-cosine", "floor-norms"), ("minisbert-dot", "floor-norms")]
    shown = [(a, b) for a, b in ratios if a in throughput and b in throughput]
    if shown:
        print("throughput ratios, best round over best round (range of the same-round ratios):")
    for a, b in shown:
        paired = [seconds[b][i] / seconds[a][i] for i in range(args.repeats)]
        print(f"  {a} / {b}: {throughput[a] / throughput[b]:.2f}x ({min(paired):.2f}x to {max(paired):.2f}x)")
    print(f"CPU: {cpu_summary()}")


def read_once_seconds(corpus: torch.Tensor) -> float:
    """The fastest of a few full reductions over the corpus: the time to read its rows once."""
    best = float("inf")
    for reduce in (torch.sum, torch.amax, torch.sum):
        _synchronize(corpus.device)
        start = time.perf_counter()
        reduce(corpus)
        _synchronize(corpus.device)
        best = min(best, time.perf_counter() - start)
    return best


class Peer:
    """faiss and sentence-transformers, served by a child process of the peer environment's Python
    (see serve_peer), on the same data, written once to shared memory."""

    def __init__(self, args, queries: torch.Tensor, corpus: torch.Tensor, methods: list):
        self.folder = Path(tempfile.mkdtemp(prefix="minisbert-bench-", dir=_shared_memory_folder()))
        np.save(self.folder / "queries.npy", queries.numpy())
        np.save(self.folder / "corpus.npy", corpus.numpy())
        arguments = ["--serve-peer", str(self.folder), "--k", str(args.k), "--methods", *methods]
        self.process = subprocess.Popen([str(args.peer_python), __file__, *arguments], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        started = self.answer()
        self.notes, self.skipped = started["notes"], started["skipped"]

    def answer(self) -> dict:
        for line in self.process.stdout:
            if line.startswith("peer: "):
                return json.loads(line[len("peer: "):])
        raise SystemExit(f"the peer process ended (exit status {self.process.wait()}); its error is "
                         "printed above")

    def searcher(self, method: str, calls: int):
        """A function queries -> ((Q, k) indices, seconds per call the peer's `calls` searches took)."""
        def search_fn(queries):
            self.process.stdin.write(f"{method} {calls}\n")
            self.process.stdin.flush()
            seconds = self.answer()["seconds"]
            return np.load(self.folder / "indices.npy"), seconds
        return search_fn

    def close(self):
        self.process.stdin.close()
        self.process.wait()
        shutil.rmtree(self.folder)


def serve_peer(args) -> None:
    """The peer's side, run by the peer environment's Python: load the data, prepare each method
    once, then for each method named on stdin search all queries, save the indices and answer
    with the time on a line of its own ("peer: {...}"; libraries may print other lines)."""
    folder = Path(args.serve_peer)
    queries = torch.from_numpy(np.load(folder / "queries.npy"))
    corpus = torch.from_numpy(np.load(folder / "corpus.npy"))
    prepared, notes, skipped = {}, {}, {}
    for method in args.methods:
        try:
            prepared[method], notes[method], _ = prepare(method, queries, corpus, args)
        except ImportError as error:
            skipped[method] = f"not importable in the peer environment: {error}"
            continue
        prepared[method](queries[:10])  # warm up
    print("peer: " + json.dumps({"notes": notes, "skipped": skipped}), flush=True)
    for line in sys.stdin:
        method, calls = line.split()
        found, seconds = take_turn(prepared[method], queries, int(calls), queries.device)
        np.save(folder / "indices.npy", np.asarray(found))
        print("peer: " + json.dumps({"seconds": seconds}), flush=True)


def take_turn(search_fn, queries, calls: int, device: torch.device):
    """A method's turn in a round: `calls` searches, and on a CPU more until the turn has lasted
    MIN_TURN_SECONDS. Returns the last result and the seconds per call."""
    _synchronize(device)
    start, made = time.perf_counter(), 0
    while made < calls or (device.type == "cpu" and time.perf_counter() - start < MIN_TURN_SECONDS):
        found = search_fn(queries)
        made += 1
    _synchronize(device)
    return found, (time.perf_counter() - start) / made


def _shared_memory_folder() -> str | None:
    """/dev/shm where it exists, so that handing the data over writes nothing to disk."""
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


def peak_memory_in_subprocess(args, method: str, size: int, num_queries: int, device: str) -> float | str:
    """Extra peak memory (MB) of one search in a fresh process, or the reason it failed."""
    python = args.peer_python if method in PEER_METHODS else sys.executable
    command = [str(python), __file__, "--worker", method, "--size", str(size), "--device", device,
               "--dim", str(args.dim), "--num-queries", str(num_queries), "--k", str(args.k),
               "--plain-budget-gb", str(args.plain_budget_gb)]
    finished = subprocess.run(command, capture_output=True, text=True)
    if finished.returncode != 0:
        lines = finished.stderr.strip().splitlines()
        return f"memory run failed: {lines[-1] if lines else 'no output'}"
    return json.loads(finished.stdout.strip().splitlines()[-1])["peak_extra_mb"]


def run_one(args) -> dict:
    """Peak memory of one method, one size, in this (fresh) process."""
    device = torch.device(args.device)
    queries, corpus = make_data(args.size, args.dim, args.num_queries, device)
    search_fn, _, setup_mb = prepare(args.worker, queries, corpus, args)
    search_fn(queries[:10])  # load libraries and warm up before the memory baseline
    baseline = _memory_baseline_mb(device)
    search_fn(queries)
    _synchronize(device)
    return {"peak_extra_mb": _peak_memory_mb(device) - baseline + setup_mb}


def prepare(method: str, queries: torch.Tensor, corpus: torch.Tensor, args):
    """Return (function queries -> (Q, k) indices, note, MB its setup took)."""
    k = args.k
    if method.startswith("minisbert"):
        from minisbert.porting import util as minisbert_util
        from minisbert.search import prepare_corpus, recorded_ways, search

        def way(searched, **kwargs):
            """The way a search of these queries over `searched` takes and the facts it chose by, from
            one search before the timing (minisbert/search/ways.py's `WayChoice`)."""
            with recorded_ways() as choices:
                search(queries, searched, k, **kwargs)
            return str(choices[-1])

        if method == "minisbert-prepared":
            before = _memory_baseline_mb(corpus.device)
            prepared_corpus = prepare_corpus(corpus)
            setup_mb = _peak_memory_mb(corpus.device) - before
            note = f"{way(prepared_corpus)}; memory includes the prepared copy"
            return (lambda q: search(q, prepared_corpus, k)[1]), note, setup_mb
        if method == "minisbert-util":
            # Its hits, as a porting user gets them; turned into indices after the timing.
            return (lambda q: minisbert_util.semantic_search(q, corpus, top_k=k)), "", 0.0
        if method == "minisbert-float32":
            from minisbert.search.fast.tuning import FEW_QUERIES
            unscreened = "spans" if queries.shape[0] <= FEW_QUERIES else "blocks"
            note = way(corpus, score="dot", way=unscreened)
            return (lambda q: search(q, corpus, k, score="dot", way=unscreened)[1]), note, 0.0
        if method.startswith("minisbert-way:"):
            _, forced, *prepared = method.split(":")
            searched = prepare_corpus(corpus) if prepared else corpus
            score = "cosine" if prepared else "dot"
            note = way(searched, score=score, way=forced)
            return (lambda q: search(q, searched, k, score=score, way=forced)[1]), note, 0.0
        if method == "minisbert-plain":
            return (lambda q: search(q, corpus, k, score="dot", way="plain")[1]), "way 'plain' (forced)", 0.0
        score = method.split("-")[1]
        return (lambda q: search(q, corpus, k, score=score)[1]), way(corpus, score=score), 0.0
    if method in ("floor", "floor-norms"):
        search_fn, kernel = floor(queries, corpus, k, norms=method == "floor-norms")
        return search_fn, f"each query's k rows chosen before the timing; product: {kernel}", 0.0
    if method in ("plain", "plain-cosine"):
        if corpus.device.type == "cpu":
            budget_gb = args.plain_budget_gb
        else:
            budget_gb = torch.cuda.mem_get_info()[0] / 4 / 2**30
        rows_that_fit = max(1, int(budget_gb * 2**30 // (4 * corpus.shape[0])))

        def one_liner(q):
            # The line a user writes instead: a dot product, or sentence-transformers' cos_sim,
            # which normalises both sides on every call (the corpus here is unit rows already,
            # but a cosine search cannot know that without measuring them).
            rows = corpus
            if method == "plain-cosine":
                q, rows = torch.nn.functional.normalize(q, dim=1), torch.nn.functional.normalize(corpus, dim=1)
            return torch.cat([torch.topk(part @ rows.T, k, dim=1).indices for part in q.split(rows_that_fit)])

        note = "" if rows_that_fit >= queries.shape[0] else (
            f"chunked {rows_that_fit} queries at a time: the full score matrix would exceed {budget_gb:.1f} GB")
        return one_liner, note, 0.0
    if method == "semantic_search":
        from sentence_transformers import util

        def semantic_search(q):
            hits = util.semantic_search(q, corpus, top_k=k)
            return torch.tensor([[hit["corpus_id"] for hit in row] for row in hits])

        return semantic_search, "default chunk sizes", 0.0
    if method == "faiss":
        import faiss
        before = _memory_baseline_mb(torch.device("cpu"))
        index = faiss.IndexFlatIP(corpus.shape[1])
        index.add(corpus.numpy())
        setup_mb = _peak_memory_mb(torch.device("cpu")) - before
        search_fn = lambda q: torch.from_numpy(index.search(q.numpy(), k)[1])  # noqa: E731
        return search_fn, "memory includes the index's copy of the corpus", setup_mb
    raise ValueError(f"unknown method {method!r}")


def floor(queries: torch.Tensor, corpus: torch.Tensor, k: int, norms: bool = False):
    """A function q -> (Q, k) indices doing the two steps that a search returning minisbert's scores
    from float32 products cannot leave out: the product of q and every row, and the exact scores
    (minisbert/search/plain.py) of each query's k best rows, found before the timing; and which product
    it uses, in words. It chooses nothing and checks no row, so no way of minisbert's that multiplies
    in float32 is quicker (a screen's int8 product can be). q is `queries` or its first rows (the
    warm-up).

    The product is the machine's quickest at this size, not the search's choice: for a few queries
    each kernel torch offers here (search/fast/span_product.py's WAYS: torch's product as given, the one
    a one-liner runs; padded to two rows; oneDNN's) is timed over these rows, a span at a time, and
    the quickest kept; for many, torch's product in blocks of 8,192 rows laid out (rows, queries).

    norms: also each row's float32 norm, taken piece by piece right after the piece's product, while
    it is in the cache (NORM_PIECE_ROWS rows a piece for a few queries, as the search takes them): what
    a search over rows as given needs besides (their error bound, and cosine's q·c / |c|), so no way
    over rows as given is quicker."""
    from minisbert.search.fast import span_product
    from minisbert.search.fast.tuning import FEW_QUERIES, NORM_PIECE_ROWS, SPAN_ENTRIES
    from minisbert.search import search
    from minisbert.search.inputs import SETTLE_PIECE
    from minisbert.common.similarity import exact_scores
    best = torch.as_tensor(search(queries, corpus, k, score="dot")[1])  # (Q, k)
    few = queries.shape[0] <= FEW_QUERIES
    height = min(corpus.shape[0], SPAN_ENTRIES // queries.shape[0] if few else 8192)
    buffer = torch.empty(height * queries.shape[0], device=corpus.device)
    norm_buffer = torch.empty(height, device=corpus.device)
    piece_rows = NORM_PIECE_ROWS if norms and few else height  # rows a product (then their norms) at once

    def products(q, kernel):
        span_product_of_q = span_product.SpanProduct(q, height, forced=kernel) if few else None
        for start in range(0, corpus.shape[0], height):
            rows, out = corpus[start : start + height], buffer[: min(height, corpus.shape[0] - start) * q.shape[0]]
            scores = out.view(q.shape[0], rows.shape[0]) if few else out.view(rows.shape[0], q.shape[0]).T  # (Q, n)
            row_norms = norm_buffer[: rows.shape[0]]
            for first in range(0, rows.shape[0], piece_rows):
                piece = slice(first, first + piece_rows)
                if few:
                    span_product_of_q(rows[piece], scores[:, piece])
                else:
                    torch.mm(rows[piece], q.T, out=scores[:, piece].T)
                if norms:
                    torch.linalg.vector_norm(rows[piece], dim=1, out=row_norms[piece])

    kernel, described = None, "torch's, blocks of 8,192 rows"
    if few:  # the quickest kernel here, timed at this size: best of three passes each, in turn
        kernels = [name for name in span_product.WAYS if span_product.runs(name, corpus.device)]
        seconds = dict.fromkeys(kernels, float("inf"))
        for _ in range(3):
            for name in kernels:
                _synchronize(corpus.device)
                start = time.perf_counter()
                products(queries, name)
                _synchronize(corpus.device)
                seconds[name] = min(seconds[name], time.perf_counter() - start)
        kernel = min(seconds, key=seconds.get)
        described = f"{kernel!r}, the quickest here (" + ", ".join(
            f"{name} {value * 1e3:.1f} ms" for name, value in seconds.items()) + ")"

    def product_and_exact_scores(q):
        products(q, kernel)
        pairs = torch.arange(q.shape[0], device=q.device).repeat_interleave(best.shape[1]), best[: q.shape[0]].flatten()
        for start in range(0, pairs[0].numel(), SETTLE_PIECE):
            piece = slice(start, start + SETTLE_PIECE)
            exact_scores(q.index_select(0, pairs[0][piece]), corpus.index_select(0, pairs[1][piece]), "dot")
        return best[: q.shape[0]]
    return product_and_exact_scores, described


def make_data(size: int, dim: int, num_queries: int, device: torch.device):
    """Random unit vectors, made in place piece by piece so that making them leaves no freed
    temporaries behind for a method to reuse unseen by the peak-memory measurement."""
    generator = torch.Generator().manual_seed(0)
    corpus = torch.empty(size, dim)
    queries = torch.empty(num_queries, dim)
    for matrix in (corpus, queries):
        for piece in matrix.split(65536):
            piece.normal_(generator=generator)
            piece /= torch.linalg.vector_norm(piece, dim=1, keepdim=True)
    return queries.to(device), corpus.to(device)


def roofline(args) -> None:
    """How close one search of 200 queries over an MS MARCO-sized float16 corpus comes to the
    time it takes just to read the corpus once."""
    corpus_bytes = MSMARCO_DOCS * MSMARCO_DIM * 2
    free, _ = torch.cuda.mem_get_info()
    if corpus_bytes * 1.3 > free:
        print(f"\nroofline: skipped, the {corpus_bytes / 1e9:.1f} GB corpus does not fit in "
              f"{free / 1e9:.1f} GB free")
        return
    from minisbert.search import search

    bandwidth = args.bandwidth_gbs or _copy_bandwidth_gbs()
    corpus = torch.empty(MSMARCO_DOCS, MSMARCO_DIM, dtype=torch.float16, device="cuda").normal_()
    queries = torch.randn(MSMARCO_QUERIES, MSMARCO_DIM, device="cuda")
    search(queries, corpus, args.k)  # warm up
    timings = []
    for _ in range(args.repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        search(queries, corpus, args.k)
        torch.cuda.synchronize()
        timings.append(time.perf_counter() - start)
    best = min(timings)
    floor = corpus_bytes / (bandwidth * 1e9)
    print(f"\nroofline: {MSMARCO_QUERIES} queries over {MSMARCO_DOCS:,} x {MSMARCO_DIM} float16 "
          f"({corpus_bytes / 1e9:.1f} GB) took {best * 1e3:.1f} ms; reading the corpus once at "
          f"{bandwidth:.0f} GB/s takes {floor * 1e3:.1f} ms: {floor / best:.1%} of the roofline "
          f"(chunks are upcast to float32 and multiplied without tensor cores)")


def _copy_bandwidth_gbs() -> float:
    source = torch.empty(2**30 // 4, device="cuda")
    target = torch.empty_like(source)
    target.copy_(source)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        target.copy_(source)
    torch.cuda.synchronize()
    return 10 * 2 * source.numel() * 4 / (time.perf_counter() - start) / 1e9  # read + write


def _memory_baseline_mb(device: torch.device) -> float:
    """Reset the peak-memory counter and return the memory in use now."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**20
    # Writing 5 to clear_refs resets the process's resident-set high-water mark (VmHWM). It is
    # per process image, unlike ru_maxrss, which a child started by subprocess inherits from
    # its (large) parent.
    Path("/proc/self/clear_refs").write_text("5")
    return _proc_status_mb("VmRSS")


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return _proc_status_mb("VmHWM")


def _proc_status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"/proc/self/status has no {field}: peak memory needs Linux")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _available_memory_gb() -> float:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return 4.0


if __name__ == "__main__":
    main()
