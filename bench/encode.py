"""Encoding speed: sentences per second over the SciFact corpus, minisbert beside sentence-transformers.

    python bench/encode.py --peer-python /path/to/peer-env/bin/python     # all 5,183 documents
    MINISBERT_PEER_PYTHON=/path/to/peer-env/bin/python python bench/encode.py --limit 320 --rounds 3
    python bench/encode.py --limit 320 --plain      # minisbert's fast and plain paths, no peer

Documents are title + " " + text, truncated at max_seq_length 256, as in the retrieval evaluation;
CPU, float32, batch 32. sentence-transformers (never a dependency of minisbert) runs in a child
process of the peer environment's Python (bench/peer.py), which loads the model once and encodes
the same texts each time it is asked. Rounds alternate between the contenders, so load from
elsewhere hits all of them; each contender encodes 64 texts untimed first (first allocations,
kernel selection). Printed: the CPU and its flags, each round's rate, the ratio of the mean rates,
and the largest difference between the embeddings.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import minisbert  # noqa: E402
from bench.peer import add_peer_python_option, check_peer_python, cpu_summary  # noqa: E402
from minisbert.hub import resolve  # noqa: E402

WARM_UP_TEXTS = 64


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


def serve_peer(args):
    """The peer's side, run by the peer environment's Python: load sentence-transformers once, then
    for each line on stdin (a .npy path) encode the texts, save the embeddings there and answer
    with the rate on a line of its own ("peer: {...}"; libraries may print other lines)."""
    from sentence_transformers import SentenceTransformer

    texts = scifact_documents(args.data, args.limit)
    peer = SentenceTransformer(str(args.model), device=args.device)
    peer.max_seq_length = args.max_seq_length

    def encode(t):
        return peer.encode(t, batch_size=args.batch_size)

    encode(texts[:WARM_UP_TEXTS])
    print("peer: " + json.dumps({"ready": True, "torch_threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        value, embeddings = rate(encode, texts)
        np.save(line.strip(), embeddings)
        print("peer: " + json.dumps({"rate": value}), flush=True)


class Peer:
    """sentence-transformers served by a child process of the peer environment (see serve_peer)."""

    def __init__(self, args, model_dir: Path):
        arguments = ["--serve-peer", "--model", str(model_dir), "--data", str(args.data), "--limit", str(args.limit),
                     "--batch-size", str(args.batch_size), "--max-seq-length", str(args.max_seq_length),
                     "--device", args.device]
        self.folder = Path(tempfile.mkdtemp(prefix="minisbert-bench-"))
        self.process = subprocess.Popen([str(args.peer_python), __file__, *arguments], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.started = self.answer()

    def answer(self) -> dict:
        for line in self.process.stdout:
            if line.startswith("peer: "):
                return json.loads(line[len("peer: "):])
        raise SystemExit(f"the sentence-transformers process ended (exit status {self.process.wait()}); "
                         "its error is printed above")

    def encode_and_time(self, texts):
        path = self.folder / "embeddings.npy"
        self.process.stdin.write(f"{path}\n")
        self.process.stdin.flush()
        value = self.answer()["rate"]
        return value, np.load(path)

    def close(self):
        self.process.stdin.close()
        self.process.wait()
        (self.folder / "embeddings.npy").unlink(missing_ok=True)
        self.folder.rmdir()


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
    parser.add_argument("--plain", action="store_true",
                        help="also time minisbert's plain path (encode(..., fast=False)), the reference the "
                             "fast path is tested against")
    add_peer_python_option(parser)
    parser.add_argument("--serve-peer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_peer:
        return serve_peer(args)
    check_peer_python(parser, args.peer_python)
    for name in ("limit", "batch_size", "max_seq_length", "rounds"):
        if getattr(args, name) < (0 if name == "limit" else 1):
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not (args.data / "corpus.jsonl").is_file():
        parser.error(f"no corpus.jsonl in {args.data}: pass --data FOLDER (SciFact in BEIR layout), or set "
                     "MINISBERT_DATA_MIRROR to the folder that holds scifact/")

    texts = scifact_documents(args.data, args.limit)
    model_dir = resolve(args.model)
    print(f"{len(texts):,} SciFact documents, batch {args.batch_size}, max_seq_length {args.max_seq_length}, "
          f"fp32, device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"CPU: {cpu_summary()}")

    ours = minisbert.load(model_dir, device=args.device)
    ours.tokenizer.max_seq_length = args.max_seq_length
    contenders = {"minisbert": lambda t: rate(lambda u: ours.encode(u, batch_size=args.batch_size,
                                                                    show_progress=False), t)}
    if args.plain:
        contenders["minisbert plain"] = lambda t: rate(lambda u: ours.encode(u, batch_size=args.batch_size,
                                                                            show_progress=False, fast=False), t)
    for encode_and_time in contenders.values():
        encode_and_time(texts[:WARM_UP_TEXTS])
    peer = None
    if args.peer_python is None:
        print("no peer environment (--peer-python or $MINISBERT_PEER_PYTHON): no side-by-side figure")
    else:
        peer = Peer(args, model_dir)
        contenders["sentence-transformers"] = peer.encode_and_time
        print(f"sentence-transformers in {args.peer_python}, {peer.started['torch_threads']} threads")

    rates, embeddings = {name: [] for name in contenders}, {}
    try:
        for round_number in range(1, args.rounds + 1):  # in turn, so load from elsewhere hits every contender
            for name, encode_and_time in contenders.items():
                value, embeddings[name] = encode_and_time(texts)
                rates[name].append(value)
                print(f"round {round_number}  {name:22s} {value:8.1f} sentences/s  (load {os.getloadavg()[0]:.2f})",
                      flush=True)
    finally:
        if peer is not None:
            peer.close()
    means = {name: sum(values) / len(values) for name, values in rates.items()}
    for name in means:
        if name == "minisbert":
            continue
        print(f"ratio minisbert / {name}: {means['minisbert'] / means[name]:.2f}x (means of {args.rounds} runs "
              f"each; min/max {min(rates['minisbert']) / max(rates[name]):.2f}-"
              f"{max(rates['minisbert']) / min(rates[name]):.2f}x)")
        difference = np.abs(embeddings["minisbert"] - embeddings[name]).max()
        print(f"max |embedding difference| minisbert vs {name}: {difference:.2e}")


if __name__ == "__main__":
    main()
