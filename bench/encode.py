"""Encoding speed: sentences per second over the SciFact corpus, minisbert beside sentence-transformers.

    python bench/encode.py                       # whole corpus (5,183 documents), CPU, fp32, batch 32
    python bench/encode.py --limit 1000 --rounds 3

Documents are title + " " + text, truncated at max_seq_length 256, as in the retrieval evaluation.
When sentence-transformers is importable (it is never a dependency of minisbert), the same texts are
encoded by it in the same process, alternating with minisbert round by round, and the ratio of the
mean rates is printed along with the largest difference between the two sets of embeddings.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import minisbert  # noqa: E402
from minisbert.hub import resolve  # noqa: E402


def scifact_documents(folder: Path, limit: int) -> list:
    texts = []
    with open(folder / "corpus.jsonl", encoding="utf-8") as corpus:
        for line in corpus:
            doc = json.loads(line)
            texts.append((doc.get("title", "") + " " + doc["text"]).strip())
    return texts[:limit] if limit else texts


def rate(encode, texts):
    start = time.perf_counter()
    embeddings = encode(texts)
    return len(texts) / (time.perf_counter() - start), embeddings


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--data", type=Path,
                        default=Path(os.environ.get("MINISBERT_DATA_MIRROR",
                                                    Path(__file__).resolve().parents[2] / "shared" / "data")) / "scifact")
    parser.add_argument("--limit", type=int, default=0, help="encode only the first N documents (0: all)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2,
                        help="each round encodes the texts once with each library, alternating")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    texts = scifact_documents(args.data, args.limit)
    model_dir = resolve(args.model)
    print(f"{len(texts):,} SciFact documents, batch {args.batch_size}, max_seq_length {args.max_seq_length}, "
          f"fp32, device {args.device}, torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}")

    ours = minisbert.load(model_dir, device=args.device)
    ours.tokenizer.rust.enable_truncation(args.max_seq_length)
    ours.tokenizer.max_seq_length = args.max_seq_length
    encoders = {"minisbert": lambda t: ours.encode(t, batch_size=args.batch_size, show_progress=False)}
    try:
        from sentence_transformers import SentenceTransformer

        peer = SentenceTransformer(str(model_dir), device=args.device)
        peer.max_seq_length = args.max_seq_length
        encoders["sentence-transformers"] = lambda t: peer.encode(t, batch_size=args.batch_size)
    except ImportError:
        print("sentence-transformers is not installed: no side-by-side figure")

    rates, embeddings = {name: [] for name in encoders}, {}
    for name, encode in encoders.items():
        encode(texts[:64])  # warm-up, untimed: first allocations and kernel selection
    for round_number in range(1, args.rounds + 1):  # alternating, so load from elsewhere hits both
        for name, encode in encoders.items():
            value, embeddings[name] = rate(encode, texts)
            rates[name].append(value)
            print(f"round {round_number}  {name:22s} {value:8.1f} sentences/s  (load {os.getloadavg()[0]:.2f})")
    means = {name: sum(values) / len(values) for name, values in rates.items()}
    if "sentence-transformers" in means:
        print(f"ratio minisbert / sentence-transformers: {means['minisbert'] / means['sentence-transformers']:.2f}x "
              f"(means of {args.rounds} runs each; target >= 1.25x)")
        difference = np.abs(embeddings["minisbert"] - embeddings["sentence-transformers"]).max()
        print(f"max |embedding difference|: {difference:.2e}")


if __name__ == "__main__":
    main()
