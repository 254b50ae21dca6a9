"""Encoding speed: sentences per second over the SciFact corpus, minisbert beside sentence-transformers.

    python bench/encode.py                       # whole corpus (5,183 documents), CPU, fp32, batch 32
    python bench/encode.py --limit 1000 --repeats 2

Documents are title + " " + text, truncated at max_seq_length 256, as in the retrieval evaluation.
When sentence-transformers is importable (it is never a dependency of minisbert), the same texts are
encoded by it in the same process, alternating with minisbert, and the ratio is printed along with
the largest difference between the two sets of embeddings.
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


def timed(encode, texts, repeats):
    encode(texts[:64])  # warm-up, untimed: first allocations and kernel selection
    best, embeddings = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        embeddings = encode(texts)
        best = min(best, time.perf_counter() - start)
    return len(texts) / best, embeddings


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--data", type=Path,
                        default=Path(os.environ.get("MINISBERT_DATA_MIRROR",
                                                    Path(__file__).resolve().parents[2] / "shared" / "data")) / "scifact")
    parser.add_argument("--limit", type=int, default=0, help="encode only the first N documents (0: all)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=1, help="best of this many runs each")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    texts = scifact_documents(args.data, args.limit)
    model_dir = resolve(args.model)
    print(f"{len(texts):,} SciFact documents, batch {args.batch_size}, max_seq_length {args.max_seq_length}, "
          f"fp32, device {args.device}, torch threads {torch.get_num_threads()}")

    ours = minisbert.load(model_dir, device=args.device)
    ours.tokenizer.rust.enable_truncation(args.max_seq_length)
    ours.tokenizer.max_seq_length = args.max_seq_length
    encode_ours = lambda t: ours.encode(t, batch_size=args.batch_size, show_progress=False)  # noqa: E731
    rate_ours, emb_ours = timed(encode_ours, texts, args.repeats)
    print(f"minisbert              {rate_ours:8.1f} sentences/s")

    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        print("sentence-transformers is not installed: no side-by-side figure")
        return
    peer = SentenceTransformer(str(model_dir), device=args.device)
    peer.max_seq_length = args.max_seq_length
    encode_peer = lambda t: peer.encode(t, batch_size=args.batch_size, convert_to_numpy=True)  # noqa: E731
    rate_peer, emb_peer = timed(encode_peer, texts, args.repeats)
    print(f"sentence-transformers  {rate_peer:8.1f} sentences/s")
    rate_ours_again, _ = timed(encode_ours, texts, args.repeats)  # again, after the peer: noise check
    print(f"minisbert (again)      {rate_ours_again:8.1f} sentences/s")
    mean_ours = (rate_ours + rate_ours_again) / 2
    print(f"ratio minisbert / sentence-transformers: {mean_ours / rate_peer:.2f}x "
          f"(minisbert's two runs averaged; {rate_ours / rate_peer:.2f}x and {rate_ours_again / rate_peer:.2f}x)")
    print(f"max |embedding difference|: {np.abs(emb_ours - emb_peer).max():.2e}")


if __name__ == "__main__":
    main()
