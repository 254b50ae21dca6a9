"""Encoding speed: sentences per second over the SciFact corpus, minisbert beside sentence-transformers.

    python bench/encode.py --peer-python /path/to/peer-env/bin/python     # all 5,183 documents
    MINISBERT_PEER_PYTHON=/path/to/peer-env/bin/python python bench/encode.py --limit 320 --rounds 3
    python bench/encode.py --limit 320 --plain --gemm-variants     # minisbert's paths and kernels, no peer
    python bench/encode.py --limit 320 --before ../minisbert-2874f26  # this code beside another commit's

Documents are title + " " + text, truncated at max_seq_length 256, as in the retrieval evaluation;
batch 32. The contenders:
- minisbert float32 (its fast path, products on the kernel it measures as quickest); with
  --gemm-variants also with each kernel forced (MINISBERT_GEMM); with --plain its plain path;
  minisbert bfloat16 where it runs (a GPU, or a CPU with native bfloat16);
- with --before CHECKOUT..., the minisbert of other checkouts (the code before a change), each named
  by its folder, float32 and bfloat16 where it runs, each in a child process of this Python that
  imports that checkout's package and keeps its own machine facts (its clone's .cache);
- sentence-transformers, as a new user would try it: torch float32, torch bfloat16 (`model.bfloat16()`),
  ONNX float32 (`backend="onnx"`) and ONNX int8 (`export_dynamic_quantized_onnx_model` with the
  configuration for this CPU: avx512_vnni, avx512 or avx2), the ONNX ones where the peer environment
  has sentence-transformers[onnx]. The ONNX models are exported from the local weights once, into
  --onnx-dir.

Then one short query's latency (--query-rounds rounds of 20 calls a contender, in turn): the call a
search service makes for each query, best and median call.

sentence-transformers (never a dependency of minisbert) runs in a child process of the peer
environment's Python (bench/peer.py), which loads each of its variants once and encodes the same
texts each time it is asked. Rounds go through all contenders in turn, so load from elsewhere hits
all of them; each encodes 64 texts untimed first (first allocations, kernel selection). Printed: the
CPU and its flags, each round's rate, and per contender the mean rate, its ratio to
sentence-transformers torch float32 (the ratio of means, and the range from the worst pairing of
rounds to the best), the lowest cosine between a document's embedding and its float32 one, and the
facts kept about this machine that minisbert's kernels were chosen by (minisbert/common/machine.py).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

# The package this script times: its own clone's, or, in the child that serves --before, that checkout's.
CODE = sys.argv[sys.argv.index("--serve-checkout") + 1] if "--serve-checkout" in sys.argv else Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CODE))
import minisbert  # noqa: E402
from bench.peer import add_peer_python_option, check_peer_python, cpu_summary  # noqa: E402
from minisbert.common import cpu  # noqa: E402
from minisbert.encoding.fast import tiled_linear as fast_linear  # noqa: E402
from minisbert.common import machine  # noqa: E402
from minisbert.common.fileio import write_dir  # noqa: E402
from minisbert.common.hub import resolve  # noqa: E402
from minisbert.common.precision import autocast_dtype  # noqa: E402

WARM_UP_TEXTS = 64
QUERY = "how do vaccines train the immune system"  # one short query: 9 tokens with [CLS] and [SEP]
QUERY_CALLS = 20  # each round times one query this many times a contender, in turn
PEER_VARIANTS = ("torch float32", "torch bfloat16", "ONNX float32", "ONNX int8")
REFERENCE = "ST torch float32"  # what ratios and cosines are taken against, when the peer runs


def scifact_documents(folder: Path, limit: int) -> list:
    texts = []
    with open(folder / "corpus.jsonl", encoding="utf-8") as corpus:
        for line in corpus:
            doc = json.loads(line)
            texts.append((doc.get("title", "") + " " + doc["text"]).strip())
    return texts[:limit] if limit else texts


def rate(encode, texts):
    """(texts per second, embeddings) of one call of encode(texts)."""
    start = time.perf_counter()
    embeddings = encode(texts)
    return len(texts) / (time.perf_counter() - start), embeddings


def query_seconds(encode) -> float:
    """The time of one call of encode(QUERY): the call a search service makes for each query."""
    start = time.perf_counter()
    encode(QUERY)
    return time.perf_counter() - start


def onnx_quantization_config() -> str:
    """sentence-transformers' int8 configuration for this CPU's widest integer dot products."""
    flags = cpu.flags()
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    return "avx512" if "avx512bw" in flags else "avx2"


def onnx_exports(args) -> tuple:
    """(folder, int8 file name): model.onnx and the int8 model for this CPU, exported from the local
    weights on first use (into a staging folder moved in place once complete) and kept in --onnx-dir."""
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    config = onnx_quantization_config()
    pattern = f"model_*int8_{config}.onnx"  # model_qint8_<config>.onnx or model_quint8_<config>.onnx
    def export(folder: Path):
        # Loading with backend="onnx" from a folder without model.onnx exports one.
        SentenceTransformer(str(args.model), backend="onnx", device=args.device).save(str(folder))
        float32 = SentenceTransformer(str(folder), backend="onnx", device=args.device,
                                      model_kwargs={"file_name": "onnx/model.onnx"})
        export_dynamic_quantized_onnx_model(float32, config, str(folder))

    if not any((args.onnx_dir / "onnx").glob(pattern)):
        write_dir(args.onnx_dir, export)
    return args.onnx_dir, next((args.onnx_dir / "onnx").glob(pattern)).name


def load_peer_variant(variant: str, args):
    """One sentence-transformers variant, loaded as a new user would load it; None if this
    environment lacks what it needs (the ONNX ones need sentence-transformers[onnx])."""
    from sentence_transformers import SentenceTransformer

    if variant.startswith("torch"):
        model = SentenceTransformer(str(args.model), device=args.device)
        return model.bfloat16() if variant == "torch bfloat16" else model
    try:
        import onnxruntime  # noqa: F401
        import optimum.onnxruntime  # noqa: F401
    except ImportError as error:
        print(f"no sentence-transformers {variant} in this environment: {error}", file=sys.stderr)
        return None
    folder, int8_file = onnx_exports(args)
    file_name = "model.onnx" if variant == "ONNX float32" else int8_file
    return SentenceTransformer(str(folder), backend="onnx", device=args.device,
                               model_kwargs={"file_name": f"onnx/{file_name}"})


def serve_peer(args):
    """The peer's side, run by the peer environment's Python: load each variant once, then for each
    line on stdin ("variant<TAB>.npy path") encode the texts with that variant, save the embeddings
    there and answer with the rate on a line of its own ("peer: {...}"; libraries print other lines)."""
    texts = scifact_documents(args.data, args.limit)
    models = {}
    for variant in args.peer_variants:
        model = load_peer_variant(variant, args)
        if model is not None:
            model.max_seq_length = args.max_seq_length
            model.encode(texts[:WARM_UP_TEXTS], batch_size=args.batch_size)
            models[variant] = model
    print("peer: " + json.dumps({"variants": list(models), "torch_threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        variant, path = line.rstrip("\n").split("\t")
        if path == "query":
            print("peer: " + json.dumps({"seconds": query_seconds(models[variant].encode)}), flush=True)
            continue
        value, embeddings = rate(lambda t: models[variant].encode(t, batch_size=args.batch_size), texts)
        np.save(path, embeddings.astype(np.float32))
        print("peer: " + json.dumps({"rate": value}), flush=True)


def serve_checkout(args):
    """The --before side, run by a child of this Python that imports the checkout's package: load the
    model once, then for each line on stdin ("dtype<TAB>.npy path") encode the texts in that dtype,
    save the embeddings there and answer with the rate ("peer: {...}", as serve_peer does)."""
    texts = scifact_documents(args.data, args.limit)
    model = minisbert.load(args.model, device=args.device)
    model.max_seq_length = args.max_seq_length
    dtypes = ["float32"]
    try:
        autocast_dtype("bfloat16", model.device)
        dtypes.append("bfloat16")
    except ValueError:
        pass
    for dtype in dtypes:
        model.encode(texts[:WARM_UP_TEXTS], batch_size=args.batch_size, show_progress_bar=False, dtype=dtype)
    print("peer: " + json.dumps({"variants": dtypes, "torch_threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        dtype, path = line.rstrip("\n").split("\t")
        if path == "query":
            seconds = query_seconds(lambda text: model.encode(text, show_progress_bar=False, dtype=dtype))
            print("peer: " + json.dumps({"seconds": seconds}), flush=True)
            continue
        value, embeddings = rate(lambda t: model.encode(t, batch_size=args.batch_size, show_progress_bar=False,
                                                         dtype=dtype), texts)
        np.save(path, embeddings.astype(np.float32))
        print("peer: " + json.dumps({"rate": value}), flush=True)


class Peer:
    """A contender served by a child process: sentence-transformers in the peer environment (see
    serve_peer), or with `checkout` another checkout's minisbert (see serve_checkout)."""

    def __init__(self, args, model_dir: Path, checkout: Path = None):
        arguments = ["--model", str(model_dir), "--data", str(args.data), "--limit", str(args.limit),
                     "--batch-size", str(args.batch_size), "--max-seq-length", str(args.max_seq_length),
                     "--device", args.device]
        if checkout is None:
            command = [str(args.peer_python), __file__, "--serve-peer", *arguments, "--onnx-dir", str(args.onnx_dir),
                       "--peer-variants", *args.peer_variants]
        else:
            command = [sys.executable, __file__, "--serve-checkout", str(checkout), *arguments]
        self.folder = Path(tempfile.mkdtemp(prefix="minisbert-bench-"))
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.started = self.answer()

    def answer(self) -> dict:
        for line in self.process.stdout:
            if line.startswith("peer: "):
                return json.loads(line[len("peer: "):])
        raise SystemExit(f"the child process ended (exit status {self.process.wait()}); its error is printed above")

    def encoder(self, variant: str):
        """encode_and_time(texts) for one of the variants the child loaded; encode_and_time(None) times
        one query (seconds)."""
        def encode_and_time(texts):
            if texts is None:
                self.process.stdin.write(f"{variant}\tquery\n")
                self.process.stdin.flush()
                return self.answer()["seconds"]
            path = self.folder / "embeddings.npy"
            self.process.stdin.write(f"{variant}\t{path}\n")
            self.process.stdin.flush()
            value = self.answer()["rate"]
            return value, np.load(path)

        return encode_and_time

    def close(self):
        self.process.stdin.close()
        self.process.wait()
        (self.folder / "embeddings.npy").unlink(missing_ok=True)
        self.folder.rmdir()


def minisbert_contenders(model, args) -> dict:
    """name -> encode_and_time(texts) for each way of running minisbert this run compares."""
    def contender(dtype="float32", fast=True, gemm="auto"):
        def encode(texts):
            os.environ[fast_linear.BACKEND_VARIABLE] = gemm
            return model.encode(texts, batch_size=args.batch_size, show_progress_bar=False, dtype=dtype, fast=fast)

        return lambda texts: query_seconds(encode) if texts is None else rate(encode, texts)

    contenders = {"minisbert float32": contender()}
    if args.gemm_variants:
        for backend in fast_linear.BACKENDS:
            if fast_linear.runs(backend, torch.float32):
                contenders[f"minisbert float32, {backend} kernel"] = contender(gemm=backend)
    if args.plain:
        contenders["minisbert float32 plain path"] = contender(fast=False)
    try:
        autocast_dtype("bfloat16", model.device)
        contenders["minisbert bfloat16"] = contender("bfloat16")
    except ValueError as refusal:
        print(f"no minisbert bfloat16 here: {refusal}")
    return contenders


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="all-MiniLM-L6-v2", help="a known name or a model directory")
    parser.add_argument("--data", type=Path,
                        default=Path(os.environ.get("MINISBERT_DATA_MIRROR",
                                                    Path(__file__).resolve().parents[2] / "shared" / "data")) / "scifact")
    parser.add_argument("--limit", type=int, default=0, help="encode only the first N documents (0: all)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2,
                        help="each round encodes the texts once with each contender, in turn")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--query-rounds", type=int, default=3,
                        help=f"rounds of one query's latency, {QUERY_CALLS} calls a contender each (0: none)")
    parser.add_argument("--plain", action="store_true",
                        help="also time minisbert's plain path (encode(..., fast=False)), the reference the "
                             "fast path is tested against")
    parser.add_argument("--gemm-variants", action="store_true",
                        help="also time minisbert float32 with each matrix-product kernel forced")
    parser.add_argument("--peer-variants", nargs="*", default=list(PEER_VARIANTS), choices=PEER_VARIANTS,
                        metavar="VARIANT",
                        help=f"sentence-transformers variants to run (default: all of {PEER_VARIANTS})")
    parser.add_argument("--onnx-dir", type=Path, default=None,
                        help="where the ONNX exports are made and kept "
                             "(default: .cache/onnx/<model> in the repository)")
    parser.add_argument("--before", type=Path, nargs="+", default=[], metavar="CHECKOUT",
                        help="also time the minisbert of each of these checkouts (other commits), each in a "
                             "child process")
    add_peer_python_option(parser)
    parser.add_argument("--serve-peer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-checkout", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_peer:
        return serve_peer(args)
    if args.serve_checkout:
        return serve_checkout(args)
    check_peer_python(parser, args.peer_python)
    for checkout in args.before:
        if not (checkout / "minisbert" / "__init__.py").is_file():
            parser.error(f"--before {checkout} is not a minisbert checkout (no minisbert/__init__.py in it)")
    for name in ("limit", "batch_size", "max_seq_length", "rounds", "query_rounds"):
        if getattr(args, name) < (0 if name in ("limit", "query_rounds") else 1):
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not (args.data / "corpus.jsonl").is_file():
        parser.error(f"no corpus.jsonl in {args.data}: pass --data FOLDER (SciFact in BEIR layout), or set "
                     "MINISBERT_DATA_MIRROR to the folder that holds scifact/")

    texts = scifact_documents(args.data, args.limit)
    model_dir = resolve(args.model)
    args.onnx_dir = args.onnx_dir or Path(__file__).resolve().parent.parent / ".cache" / "onnx" / model_dir.name
    print(f"{len(texts):,} SciFact documents, batch {args.batch_size}, max_seq_length {args.max_seq_length}, "
          f"device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"CPU: {cpu_summary()}")

    ours = minisbert.load(model_dir, device=args.device)
    ours.max_seq_length = args.max_seq_length
    contenders = minisbert_contenders(ours, args)
    for encode_and_time in contenders.values():
        encode_and_time(texts[:WARM_UP_TEXTS])
    children = []
    for checkout in args.before:
        children.append(Peer(args, model_dir, checkout=checkout))
        for dtype in children[-1].started["variants"]:
            contenders[f"{checkout.resolve().name} {dtype}"] = children[-1].encoder(dtype)
        print(f"{checkout.resolve().name}: the minisbert of {checkout}")
    if args.peer_python is None:
        print("no peer environment (--peer-python or $MINISBERT_PEER_PYTHON): no side-by-side figure")
    elif args.peer_variants:
        peer = Peer(args, model_dir)
        children.append(peer)
        for variant in peer.started["variants"]:
            contenders[f"ST {variant}"] = peer.encoder(variant)
        print(f"sentence-transformers in {args.peer_python}, {peer.started['torch_threads']} threads, "
              f"variants {peer.started['variants']}")

    rates, embeddings = {name: [] for name in contenders}, {}
    try:
        for round_number in range(1, args.rounds + 1):  # in turn, so load from elsewhere hits every contender
            for name, encode_and_time in contenders.items():
                value, embeddings[name] = encode_and_time(texts)
                rates[name].append(value)
                print(f"round {round_number}  {name:36s} {value:8.1f} sentences/s  (load {os.getloadavg()[0]:.2f})",
                      flush=True)
        report(rates, embeddings, REFERENCE if REFERENCE in rates else "minisbert float32")
        if args.query_rounds:
            report_query(contenders, args.query_rounds, REFERENCE if REFERENCE in rates else "minisbert float32")
    finally:
        for child in children:
            child.close()
    print(f"\n{machine.report()}")


def report_query(contenders: dict, rounds: int, reference: str):
    """One query's latency: QUERY_CALLS calls a contender a round, contenders in turn; per contender the
    best and the median call, and the best's ratio to the reference's (below 1: quicker)."""
    times = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, encode_and_time in contenders.items():
            times[name] += [encode_and_time(None) for _ in range(QUERY_CALLS)]
    print(f"\none query ({QUERY!r}), {rounds} x {QUERY_CALLS} calls each, in turn:")
    print(f"{'contender':36s} {'best ms':>8s} {'median ms':>10s}  {'best vs ' + reference:>28s}")
    for name, values in times.items():
        ratio = min(values) / min(times[reference])
        print(f"{name:36s} {1e3 * min(values):8.2f} {1e3 * float(np.median(values)):10.2f}  {ratio:27.2f}x")


def report(rates: dict, embeddings: dict, reference: str):
    """Per contender: mean rate, ratio to `reference` (means; worst and best pairing of rounds), and
    the lowest cosine of a document's embedding to the reference's."""
    mean = {name: sum(values) / len(values) for name, values in rates.items()}
    unit = {name: e / np.linalg.norm(e, axis=1, keepdims=True).clip(1e-12) for name, e in embeddings.items()}
    print(f"\n{'contender':36s} {'texts/s':>8s}  {'vs ' + reference:>28s}  {'min cosine to it':>16s}")
    for name in rates:
        ratio = (f"{mean[name] / mean[reference]:.2f}x ({min(rates[name]) / max(rates[reference]):.2f}-"
                 f"{max(rates[name]) / min(rates[reference]):.2f})")
        cosine = float((unit[name] * unit[reference]).sum(axis=1).min())
        print(f"{name:36s} {mean[name]:8.1f}  {ratio:>28s}  {cosine:16.5f}")


if __name__ == "__main__":
    main()
