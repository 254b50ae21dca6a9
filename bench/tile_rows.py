"""Encoding time at each tile size of encoding/fast/tiled_linear.py: the measurement behind its TILE_SIZES.

    python bench/tile_rows.py                  # tiles of 16 to 256 rows, oneDNN's kernel, 3 rounds
    python bench/tile_rows.py --tiles 32 64 --kernels onednn torch --threads 1

Without autograd every product of the fast encoder gets whole tiles of rows, so that no kernel ever
sees a shape the batch decides (in stacks, where the machine's kernel keeps a tile's bits in them;
else a tile a call). A small tile pads a short text little; a tile a call pays each call's fixed
cost. This times all-MiniLM-L6-v2's encode() in
float32 and (where the CPU has it) bfloat16 on three loads: 1,000 STS-B sentences (both columns of
sts-dev, in order), one short query (30 calls, the mean) and 32 SciFact documents (256 tokens).

Each variant (a tile size and a kernel, forced with MINISBERT_GEMM; with --before also the code of
another checkout, as it is, for each kernel) runs in a process of its own, started once; rounds go
through them in turn, so that load from elsewhere meets all of them alike. Printed per variant and
load: the best round's wall time, its process CPU time and the worst round's wall time. On a busy
machine run one thread (--threads 1): then the CPU time hardly moves with the load.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUERY = "how do vaccines train the immune system"
LOADS = ("sentences", "query", "documents")


def texts(mirror: Path) -> dict:
    """The three loads' inputs: 1,000 sentences, one query, 32 documents."""
    sentences = []
    with open(mirror / "stsb" / "sts-dev.csv", encoding="utf-8") as rows:
        for row in rows:
            sentences += row.rstrip("\n").split("\t")[5:7]
    documents = []
    with open(mirror / "scifact" / "corpus.jsonl", encoding="utf-8") as corpus:
        for line in corpus:
            document = json.loads(line)
            documents.append((document.get("title", "") + " " + document["text"]).strip())
            if len(documents) == 32:
                break
    return {"sentences": sentences[:1000], "query": QUERY, "documents": documents}


def serve(tile: str, mirror: Path, dtypes: list):
    """A variant's process: load the model, warm up, then time the loads once per line on stdin."""
    import minisbert
    from minisbert.encoding.fast import tiled_linear as linear

    if tile != "as-is":
        linear.TILE_SIZES = (int(tile),)
    model = minisbert.load("all-MiniLM-L6-v2", device="cpu")
    inputs = texts(mirror)
    for dtype in dtypes:
        for load in LOADS:
            model.encode(inputs[load][:64] if load != "query" else QUERY, dtype=dtype, show_progress_bar=False)
    print("ready", flush=True)
    for _ in sys.stdin:
        times = {}
        for dtype in dtypes:
            for load in LOADS:
                calls = 30 if load == "query" else 1
                start, cpu_start = time.perf_counter(), time.process_time()
                for _ in range(calls):
                    model.encode(inputs[load], dtype=dtype, show_progress_bar=False)
                times[f"{dtype} {load}"] = ((time.perf_counter() - start) / calls, (time.process_time() - cpu_start) / calls)
        print(json.dumps(times), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiles", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--kernels", nargs="+", default=["onednn"], choices=["torch", "onednn"])
    parser.add_argument("--before", type=Path, help="a checkout of another commit, timed as it is, beside the tiles")
    parser.add_argument("--threads", type=int, help="torch's threads (default: torch's own choice)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("MINISBERT_DATA_MIRROR", REPO.parent / "shared" / "data")),
                        help="a folder with stsb/ and scifact/")
    parser.add_argument("--serve", nargs="+", help=argparse.SUPPRESS)  # a variant's process: tile, dtypes
    args = parser.parse_args()
    if args.serve:  # minisbert from PYTHONPATH: this checkout's or --before's
        return serve(args.serve[0], args.data, args.serve[1:])
    sys.path.insert(0, str(REPO))
    from bench.peer import cpu_summary
    from minisbert.common import cpu

    dtypes = ["float32"] + (["bfloat16"] if cpu.native_bfloat16() else [])
    variants = [(str(tile), kernel, REPO) for kernel in args.kernels for tile in args.tiles]
    variants += [("as-is", kernel, args.before.resolve()) for kernel in args.kernels] if args.before else []
    processes = {}
    for tile, kernel, repo in variants:
        env = {**os.environ, "MINISBERT_GEMM": kernel, "PYTHONPATH": str(repo)}
        env.update({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})
        name = f"{kernel}, {'tiles of ' + tile if tile != 'as-is' else repo.name}"
        processes[name] = subprocess.Popen([sys.executable, __file__, "--data", str(args.data), "--serve", tile, *dtypes],
                                           cwd=repo, env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert processes[name].stdout.readline().strip() == "ready", name
    rounds = {name: [] for name in processes}
    for _ in range(args.rounds):
        for name, process in processes.items():
            process.stdin.write("go\n")
            process.stdin.flush()
            rounds[name].append(json.loads(process.stdout.readline()))
    for process in processes.values():
        process.stdin.close()
        process.wait()
    print(cpu_summary())
    print(f"torch threads: {args.threads or 'default'}; {args.rounds} rounds; best wall / its CPU time / worst wall")
    for key in rounds[next(iter(rounds))][0]:
        unit, scale = ("ms", 1000) if key.endswith("query") else ("s", 1)
        print(key)
        for name, results in rounds.items():
            best = min((result[key] for result in results), key=lambda times: times[0])
            worst = max(result[key][0] for result in results)
            print(f"  {name:30} {best[0] * scale:7.2f} / {best[1] * scale:7.2f} / {worst * scale:7.2f} {unit}")


if __name__ == "__main__":
    main()
