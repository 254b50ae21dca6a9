"""Evaluate sentence encoders (and lexical baselines) on retrieval or STS, side by side.

    python evaluate.py --k 1 5 10                                  # all-MiniLM-L6-v2 on data/example
    python evaluate.py --data scifact --split test                 # NDCG@10 0.6451 published by MTEB
    python evaluate.py --model all-MiniLM-L6-v2 bm25 runs/x/final --data scifact
    python evaluate.py --task sts --data stsb                      # Spearman 0.8203
    python evaluate.py --task sts --data ~/stsbenchmark            # your own copy: sts-*.csv or SICK_*.txt
    python evaluate.py --model all-MiniLM-L6-v2 bm25 --data questions.csv   # your question,answer rows
    python evaluate.py --data scifact --dtype bfloat16             # on a GPU or a CPU with native bfloat16
    python evaluate.py --run run.trec --qrels qrels.txt --k 10     # score a TREC run, as trec_eval does
    python evaluate.py --model all-MiniLM-L6-v2 bm25 --data scifact --significance   # is the difference real?
    torchrun --nproc_per_node 8 evaluate.py --data DIR             # each process encodes and searches 1/8

Prints Precision, Accuracy, Recall, MRR, NDCG and MAP at each k for every model; writes the numbers to
runs/eval/<data>-<split>-<models>.json (models joined by "+"; or --output), with each query's own
values under "per_query" ({metric@k: {query id: value}}, which average to the reported numbers
exactly), and each model's ranking to a TREC run file. Metric definitions: --definitions st
(sentence-transformers, binary relevance; the default) or trec (trec_eval, graded), see minisbert/evaluation/metrics.py.

--significance compares every model with the first, query by query (minisbert/evaluation/significance.py): for
each metric@k the mean difference, its bootstrap 95% interval, and the p-values of Fisher's
randomization test and the paired t-test, under "significance" in the JSON. With several models the
randomization p-values of each metric@k are adjusted by Holm's method ("p_holm"), and a difference is
marked when that adjusted p is below 0.05. For STS the compared number is Spearman's correlation,
over resampled and swapped sentence pairs.

Under torchrun each process encodes and searches a contiguous shard of the corpus and rank 0 merges
the shards' top-k into the ranking one process gives (minisbert/training/distributed.py), then reports.
"""

import argparse
import sys
from pathlib import Path

import minisbert
from minisbert import datasets
from minisbert.training import distributed
from minisbert.evaluation.correlation import pearson, spearman
from minisbert.evaluation.benchmark import (CACHE_DIR, LEXICAL, rank, results_file, retrieval_split, score_run,
                                            sts_pairs, sts_similarities)
from minisbert.common import machine
from minisbert.common.flags import given_flags
from minisbert.common.fileio import check_writable_folder, file_label, write_json
from minisbert.common.precision import AMP_SPELLINGS, dtype_from_flags
from minisbert.search import recorded_ways
from minisbert.evaluation.significance import compare_with_first
from minisbert.evaluation.tables import print_significance, print_table


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", nargs="+", default=["all-MiniLM-L6-v2"],
                   help="model names or directories (a train.py output such as runs/x/final), or bm25 / jaccard")
    p.add_argument("--data", default="example",
                   help="example, scifact, stsb, sick, a folder holding one of their layouts (itself or as "
                        "<name>/), a folder with pairs.tsv, or a CSV file with columns question and answer")
    p.add_argument("--split", default=None, help="default: test (SICK: all 9,927 pairs)")
    p.add_argument("--k", nargs="+", type=int, default=[1, 5, 10])
    p.add_argument("--score", choices=["cosine", "dot", "euclidean"], default="cosine")
    p.add_argument("--definitions", choices=["st", "trec"], default="st")
    p.add_argument("--task", choices=["retrieval", "sts"], default=None,
                   help="default: sts for STS-B and SICK (by name or folder), else retrieval")
    p.add_argument("--exclude-self", action="store_true", help="drop hits whose document id equals the query id")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="precision the models encode in: bfloat16 on a GPU or a CPU with native bfloat16 "
                        "(avx512_bf16, amx_bf16), float16 on a GPU")
    p.add_argument("--amp", choices=sorted(AMP_SPELLINGS), default=None,
                   help="mixed precision, as --dtype: bf16 = bfloat16, fp16 = float16")
    p.add_argument("--device", default=None)
    p.add_argument("--output", type=Path, default=None, help="JSON (default: runs/eval/<data>-<split>-<models>.json)")
    p.add_argument("--run-file", type=Path, default=None, help="TREC run file of the first model (default: next "
                   "to the JSON, one per model: runs/eval/<data>-<split>-<model>.trec, or <output>-<model>.trec)")
    p.add_argument("--run", type=Path, default=None, help="score this TREC run file instead of a model")
    p.add_argument("--qrels", type=Path, default=None,
                   help="qrels for --run: TREC format (qid 0 docid grade) or a BEIR qrels/*.tsv")
    p.add_argument("--no-cache", action="store_true", help="encode the corpus even if cached")
    p.add_argument("--verbose", action="store_true",
                   help="also print the way each search took and the facts it chose it by "
                        "(minisbert/search/ways.py), and the machine and the facts kept about it that the fast "
                        "path's kernels were chosen by (minisbert/common/machine.py)")
    p.add_argument("--significance", action="store_true",
                   help="test each model's difference from the first, query by query (two or more --model)")
    args = p.parse_args(argv)
    try:
        args.dtype = dtype_from_flags(args.amp, args.dtype)
    except ValueError as disagreement:
        p.error(str(disagreement))
    if any(k <= 0 for k in args.k):
        p.error(f"--k values must be positive, got {args.k}")
    if args.batch_size <= 0:
        p.error(f"--batch-size must be positive, got {args.batch_size}")
    if (args.run is None) != (args.qrels is None):
        p.error("--run and --qrels go together")
    source = datasets.what_data(args.data)
    if args.task is None:
        args.task = "sts" if source.kind == datasets.STS else "retrieval"
    if args.task == "sts" and args.run is None and any(name in LEXICAL for name in args.model):
        p.error(f"{', '.join(LEXICAL)} are retrieval baselines; --task sts needs sentence-embedding models")
    if args.split is None:
        args.split = "all" if args.task == "sts" and source.sts == "sick" else "test"
    if args.significance and (args.run is not None or len(args.model) < 2):
        p.error("--significance compares each --model with the first, query by query: give two or more "
                f"models (got {'a --run file' if args.run is not None else ' '.join(args.model)})")
    for flag, path in (("--run", args.run), ("--qrels", args.qrels)):
        if path is not None and not path.is_file():
            p.error(f"{flag} {path}: no such file; give the path of an existing file")
    given = given_flags(p, argv)
    unused = (MODEL_FLAGS + ("--score", "--run-file") if args.run is not None
              else RETRIEVAL_FLAGS if args.task == "sts" else ())
    if ignored := [flag for flag in unused if flag.removeprefix("--").replace("-", "_") in given]:
        what = "scoring a --run file (no model runs)" if args.run is not None else "--task sts (no ranking)"
        p.error(f"{' '.join(ignored)} would change nothing when {what}: leave {'it' if len(ignored) == 1 else 'them'} out")
    return args


# Flags that only a model's encoding or a ranking reads: given where nothing reads them, they are refused.
MODEL_FLAGS = ("--model", "--data", "--batch-size", "--dtype", "--amp", "--device", "--no-cache")
RETRIEVAL_FLAGS = ("--k", "--score", "--definitions", "--exclude-self", "--run-file")


def main(argv=None):
    args = parse_args(argv)
    if distributed.init_from_env() and (args.run is not None or args.task == "sts"
                                        or any(name in LEXICAL for name in args.model)):
        raise ValueError("several processes (torchrun) split a corpus to encode and search: run --task sts, "
                         f"--run and {', '.join(LEXICAL)} as one process (python evaluate.py ...)")
    args.device = distributed.device_for_rank(args.device)
    main_process = distributed.is_main()
    results, runs = {}, {}  # results: {name: evaluation.score_run's shape}; runs: {run file: (model name, ranking)}
    label = file_label(Path(args.data).name if args.run is None else args.run.stem)
    output = args.output or results_file(label, args.split, [] if args.run else args.model)
    run_files = output.with_name(output.stem if args.output else f"{label}-{args.split}")  # then -<model>.trec
    for folder in {output.parent, (args.run_file or output).parent}:
        check_writable_folder(folder)  # before the work, not after it

    # The data, the models and their evaluation. Nothing is printed or written until all of it has
    # succeeded, so a failure leaves neither metrics on the screen nor half of the output files.
    with recorded_ways() as ways:  # the way each search took, printed with --verbose
        if args.run is not None:  # score an existing run, no model involved
            results[str(args.run)] = score_run_file(args)
        elif args.task == "sts":
            results = score_sts(args)
        else:
            results, runs = score_retrieval(args, run_files, main_process)
    if args.significance and main_process:
        compare_with_first(results)

    if not main_process:  # rank 0 holds the merged rankings and reports
        return
    # The report: run files and the JSON, each written whole (write_trec_run, write_json), then the numbers.
    for run_file, (name, run) in runs.items():
        datasets.write_trec_run(run_file, run, tag=Path(name).name)
    write_json(output, {name: {**result["scores"], **{key: value for key, value in result.items()
                                                      if key in ("per_query", "significance")}}
                        for name, result in results.items()})
    for name, result in results.items():
        if args.task == "sts" and args.run is None:
            print(f"{name:40s} spearman {result['scores']['spearman']:.4f}  pearson {result['scores']['pearson']:.4f}")
        else:
            print_table(name, result["scores"], args.k)
    if args.significance:
        print_significance(results)
    for run_file in runs:
        print(f"TREC run: {run_file}")
    print(f"results: {output}")
    if args.verbose:  # what the fast path's choices were made by (minisbert/common/machine.py)
        for choice in ways:
            print(f"search: {choice}")
        print(machine.report())


def score_run_file(args) -> dict:
    """The metrics of the TREC run file --run against --qrels (self-matches dropped with --exclude-self)."""
    run = datasets.read_trec_run(args.run)
    if args.exclude_self:
        run = {query_id: {doc_id: s for doc_id, s in hits.items() if doc_id != query_id}
               for query_id, hits in run.items()}
    return score_run(run, datasets.read_qrels(args.qrels), args.k, args.definitions)


def score_sts(args) -> dict:
    """{model: {"scores": {"spearman", "pearson"}, "similarities": (each pair's cosine, the gold scores)}}."""
    try:
        pairs = sts_pairs(args.data, args.split)
    except FileNotFoundError as missing:  # a --data that is no STS benchmark is a usage error
        sys.exit(str(missing))
    print(f"{args.data} ({args.split}): {len(pairs):,} pairs; Spearman and Pearson of cosine similarity")
    results = {}
    for name in args.model:
        cosine, gold = sts_similarities(minisbert.load(name, device=args.device), pairs, args.dtype)
        results[name] = {"scores": {"spearman": spearman(cosine, gold), "pearson": pearson(cosine, gold)},
                         "similarities": (cosine, gold)}
    return results


def score_retrieval(args, run_files: Path, main_process: bool) -> tuple:
    """({model: its metrics}, {run file: (model, ranking)}) on rank 0; empty elsewhere."""
    results, runs = {}, {}
    retrieval = retrieval_split(args.data, args.split, CACHE_DIR)
    if main_process:
        print(f"{args.data} ({args.split}): {len(retrieval.queries):,} queries, {len(retrieval.corpus):,} "
              f"documents; score {args.score}, {args.definitions} definitions")
    for position, name in enumerate(args.model):
        model = name if name in LEXICAL else minisbert.load(name, device=args.device)
        run = rank(model, retrieval, max(args.k), score=args.score, batch_size=args.batch_size,
                   cache_dir=None if args.no_cache else CACHE_DIR / "embeddings",
                   exclude_self=args.exclude_self, sharded=distributed.world_size() > 1, dtype=args.dtype)
        if not main_process:  # rank 0 holds the merged ranking
            continue
        results[name] = score_run(run, retrieval.qrels, args.k, args.definitions)
        run_file = args.run_file if args.run_file and position == 0 else \
            run_files.with_name(f"{run_files.name}-{file_label(name)}.trec")
        runs[run_file] = (name, run)
    return results, runs


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError) as error:  # bad input, a missing file, a full disk: the message says what
        sys.exit(f"error: {error}")
    finally:
        distributed.close()
