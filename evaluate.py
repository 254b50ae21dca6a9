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
a JSON file (--output), with each query's own values under "per_query" ({metric@k: {query id: value}},
which average to the reported numbers exactly), and each model's ranking to a TREC run file. Metric
definitions: --definitions st (sentence-transformers, binary relevance; the default) or trec
(trec_eval, graded), see minisbert/metrics.py.

--significance compares every model with the first, query by query (minisbert/significance.py): for
each metric@k the mean difference, its bootstrap 95% interval, and the p-values of Fisher's
randomization test and the paired t-test, under "significance" in the JSON. With several models the
randomization p-values of each metric@k are adjusted by Holm's method ("p_holm"), and a difference is
marked when that adjusted p is below 0.05. For STS the compared number is Spearman's correlation,
over resampled and swapped sentence pairs.

Under torchrun each process encodes and searches a contiguous shard of the corpus and rank 0 merges
the shards' top-k into the ranking one process gives (minisbert/distributed.py), then reports.
"""

import argparse
import re
import sys
from pathlib import Path

import minisbert
from minisbert import datasets, distributed, metrics, significance
from minisbert.evaluation import CACHE_DIR, LEXICAL, rank, sts_similarities
from minisbert.fileio import check_writable_folder, write_json
from minisbert.model import AMP_DTYPES, dtype_for

METRIC_ROWS = [("Precision", "precision"), ("Accuracy", "accuracy"), ("Recall", "recall"),
               ("MRR", "mrr"), ("NDCG", "ndcg"), ("MAP", "map")]


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
    p.add_argument("--amp", choices=sorted(AMP_DTYPES), default=None,
                   help="mixed precision, as --dtype: bf16 = bfloat16, fp16 = float16")
    p.add_argument("--device", default=None)
    p.add_argument("--output", type=Path, default=None, help="JSON results (default: runs/eval/<data>-<split>.json)")
    p.add_argument("--run-file", type=Path, default=None,
                   help="TREC run file of the first model (default: next to the JSON, one per model)")
    p.add_argument("--run", type=Path, default=None, help="score this TREC run file instead of a model")
    p.add_argument("--qrels", type=Path, default=None,
                   help="qrels for --run: TREC format (qid 0 docid grade) or a BEIR qrels/*.tsv")
    p.add_argument("--no-cache", action="store_true", help="encode the corpus even if cached")
    p.add_argument("--significance", action="store_true",
                   help="test each model's difference from the first, query by query (two or more --model)")
    args = p.parse_args(argv)
    try:
        args.dtype = dtype_for(args.amp, args.dtype)
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
    return args


def main(argv=None):
    args = parse_args(argv)
    if distributed.init_from_env() and (args.run is not None or args.task == "sts"
                                        or any(name in LEXICAL for name in args.model)):
        raise ValueError("several processes (torchrun) split a corpus to encode and search: run --task sts, "
                         f"--run and {', '.join(LEXICAL)} as one process (python evaluate.py ...)")
    args.device = distributed.device_for_rank(args.device)
    main_process = distributed.is_main()
    results, runs = {}, {}  # runs: {run file: (model name, ranking)}
    label = file_label(Path(args.data).name if args.run is None else args.run.stem)
    output = args.output or Path("runs") / "eval" / f"{label}-{args.split}.json"
    for folder in {output.parent, (args.run_file or output).parent}:
        check_writable_folder(folder)  # before the work, not after it

    # The work. Nothing is printed or written until all of it has succeeded, so a failure leaves
    # neither metrics on the screen nor half of the output files.
    if args.run is not None:  # score an existing run, no model involved
        results[str(args.run)] = score_run_file(args)
    elif args.task == "sts":
        results = score_sts(args)
    else:
        results, runs = score_retrieval(args, output, main_process)
    if args.significance and main_process:
        compare_with_first(results)

    if not main_process:  # rank 0 holds the merged rankings and reports
        return
    # The report: run files and the JSON (each written whole, metrics.write_trec_run and write_json),
    # then the numbers.
    for run_file, (name, run) in runs.items():
        metrics.write_trec_run(run_file, run, tag=Path(name).name)
    write_json(output, {name: {key: value for key, value in scores.items() if key != "similarities"}
                        for name, scores in results.items()})
    for name, scores in results.items():
        if args.task == "sts" and args.run is None:
            print(f"{name:40s} spearman {scores['spearman']:.4f}  pearson {scores['pearson']:.4f}")
        else:
            print_table(name, scores, args.k)
    if args.significance:
        print_significance(results)
    for run_file in runs:
        print(f"TREC run: {run_file}")
    print(f"results: {output}")


def score_run_file(args) -> dict:
    """The metrics of the TREC run file --run against --qrels (self-matches dropped with --exclude-self),
    and each query's own under "per_query"."""
    run = metrics.read_trec_run(args.run)
    if args.exclude_self:
        run = {query_id: {doc_id: s for doc_id, s in hits.items() if doc_id != query_id}
               for query_id, hits in run.items()}
    per_query = metrics.per_query_scores(run, read_qrels(args.qrels), args.k, definitions=args.definitions)
    return {**metrics.average_scores(per_query), "per_query": per_query}


def score_sts(args) -> dict:
    """{model: {"spearman", "pearson", "similarities": (each pair's cosine, the gold scores), kept out of the JSON}}."""
    pairs = sts_pairs(args.data, args.split)
    print(f"{args.data} ({args.split}): {len(pairs):,} pairs; Spearman and Pearson of cosine similarity")
    results = {}
    for name in args.model:
        cosine, gold = sts_similarities(minisbert.load(name, device=args.device), pairs, args.dtype)
        results[name] = {"spearman": metrics.spearman(cosine, gold), "pearson": metrics.pearson(cosine, gold),
                         "similarities": (cosine, gold)}
    return results


def score_retrieval(args, output: Path, main_process: bool) -> tuple:
    """({model: its metrics and "per_query"}, {run file: (model, ranking)}) on rank 0; empty elsewhere."""
    results, runs = {}, {}
    retrieval = retrieval_split(args, main_process)
    for position, name in enumerate(args.model):
        model = name if name in LEXICAL else minisbert.load(name, device=args.device)
        run = rank(model, retrieval, max(args.k), score=args.score, batch_size=args.batch_size,
                   cache_dir=None if args.no_cache else CACHE_DIR / "embeddings",
                   exclude_self=args.exclude_self, sharded=distributed.world_size() > 1, dtype=args.dtype)
        if not main_process:  # rank 0 holds the merged ranking
            continue
        per_query = metrics.per_query_scores(run, retrieval.qrels, args.k, definitions=args.definitions)
        results[name] = {**metrics.average_scores(per_query), "per_query": per_query}
        run_file = args.run_file if args.run_file and position == 0 else \
            output.with_name(f"{output.stem}-{file_label(name)}.trec")
        runs[run_file] = (name, run)
    return results, runs


def compare_with_first(results: dict) -> None:
    """Add results[name]["significance"] for every model after the first: {metric: its difference from
    the first model, tested (significance.compare; Spearman for STS: significance.spearman_difference)},
    each with "p_holm", the randomization p adjusted by Holm's method over the compared models."""
    first, *others = results
    tests = {}  # metric -> [the test of each other model]
    for name in others:
        if "similarities" in results[first]:  # STS: each model's similarity of every pair, and the gold scores
            (ours, gold), (theirs, _) = results[name]["similarities"], results[first]["similarities"]
            tests.setdefault("spearman", []).append(significance.spearman_difference(ours, theirs, gold))
            continue
        for metric, values in results[first]["per_query"].items():
            try:
                test = significance.compare(results[name]["per_query"][metric], values)
            except ValueError as error:
                raise ValueError(f"{name} and {first} were evaluated on different queries: {error}") from None
            tests.setdefault(metric, []).append(test)
    for metric, compared in tests.items():
        for test, adjusted in zip(compared, significance.holm([t["p_randomization"] for t in compared])):
            test["p_holm"] = adjusted
    for position, name in enumerate(others):
        results[name]["significance"] = {metric: compared[position] for metric, compared in tests.items()}


def retrieval_split(args, main_process: bool) -> datasets.RetrievalData:
    """The split of --data to rank: a BEIR folder's, or a question,answer CSV's (converted once)."""
    source = datasets.what_data(args.data)
    folder = source.retrieval_folder(CACHE_DIR / "qa-csv")
    if source.kind == datasets.QA_CSV:
        print(f"{args.data}: one query per question, its answer the relevant document (BEIR layout in {folder})")
    retrieval = datasets.load_beir(folder, args.split)
    if not retrieval.corpus or not retrieval.queries:
        raise ValueError(f"{folder}: nothing to evaluate: {len(retrieval.corpus)} documents in corpus.jsonl and "
                         f"{len(retrieval.queries)} queries judged against them in qrels/{args.split}.tsv")
    if main_process:
        print(f"{args.data} ({args.split}): {len(retrieval.queries):,} queries, {len(retrieval.corpus):,} "
              f"documents; score {args.score}, {args.definitions} definitions")
    return retrieval


def read_qrels(path: Path) -> dict:
    """TREC qrels, or BEIR's tab-separated qrels recognised by their `query-id` header."""
    with open(path, encoding="utf-8") as file:
        first_line = file.readline()
    if first_line.startswith("query-id"):
        return datasets.read_beir_qrels(path)
    return datasets.read_trec_qrels(path)


def file_label(text: str) -> str:
    """`text` made safe to use in a file name."""
    return re.sub(r"[^\w.-]+", "_", text).strip("_")


def sts_pairs(data: str, split: str) -> list:
    """STS-B or SICK gold pairs (by name, or from a folder holding either), or pairs.tsv (scores
    in [0, 1]) from a folder."""
    source = datasets.what_data(data)
    if source.kind == datasets.STS:
        return datasets.load_sts(data, split)
    folder = source.folder()
    if not (folder / "pairs.tsv").is_file():
        sys.exit(f"--task sts needs stsb, sick, a folder holding STS-B (sts-*.csv, stsbenchmark.tsv.gz) or SICK "
                 f"(SICK_*.txt) files, or a folder with pairs.tsv; {folder} has none of them")
    return datasets.read_pairs_tsv(folder / "pairs.tsv")


def print_significance(results: dict) -> None:
    """Each compared model's difference from the first, metric by metric, * where p_holm < 0.05."""
    first, *others = results
    sts = "similarities" in results[first]
    print(f"\nDifferences from {first}, paired over the same {'sentence pairs' if sts else 'queries'}: mean "
          "difference, bootstrap 95% interval, p of the randomization test" + ("" if sts else " and of the paired t-test")
          + (f", Holm-adjusted randomization p over the {len(others)} comparisons" if len(others) > 1 else "")
          + "; * marks p < 0.05" + (" after adjustment" if len(others) > 1 else ""))
    for name in others:
        print(f"\n{name} - {first}")
        print(f"{'':14s}{'difference':>11s}{'95% CI':>22s}{'p rand':>9s}{'p t':>9s}"
              + (f"{'p Holm':>9s}" if len(others) > 1 else ""))
        order = [key for _, key in METRIC_ROWS]  # the metric tables' order: metric, then k
        for metric, test in sorted(results[name]["significance"].items(),
                                   key=lambda item: (order.index(item[0].split("@")[0]) if "@" in item[0] else -1,
                                                     int(item[0].split("@")[1]) if "@" in item[0] else 0)):
            p_t = "-" if test["p_t_test"] is None else f"{test['p_t_test']:.4f}"
            low, high = test["ci95"]
            print(f"{metric:14s}{test['difference']:+11.4f}{f'[{low:+.4f}, {high:+.4f}]':>22s}"
                  f"{test['p_randomization']:9.4f}{p_t:>9s}"
                  + (f"{test['p_holm']:9.4f}" if len(others) > 1 else "")
                  + ("  *" if test["p_holm"] < 0.05 else ""))


def print_table(name: str, scores: dict, ks: list):
    print(f"\n{name}")
    print(f"{'':10s}" + "".join(f"{'@' + str(k):>9s}" for k in ks))
    for title, key in METRIC_ROWS:
        print(f"{title:10s}" + "".join(f"{scores[f'{key}@{k}']:9.4f}" for k in ks))


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError) as error:  # bad input, a missing file, a full disk: the message says what
        sys.exit(f"error: {error}")
    finally:
        distributed.close()
