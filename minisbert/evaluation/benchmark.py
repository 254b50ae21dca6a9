"""Evaluating a model: retrieval (rank a corpus for each query, score the ranking) and STS.

Retrieval follows BEIR / MTEB: embed documents (title + " " + text) and queries, rank documents by
the score function with the exact retriever (search/ways.py), keep the top `max(ks)` as a run
(`run_from_search`), and compute the metrics (evaluation/metrics.py) against the split's qrels (`score_run`:
each query's values and their means, the one shape evaluate.py and the studies keep). STS follows
SBERT section 4.1 and MTEB: the Spearman (and Pearson) correlation (evaluation/correlation.py) between the
cosine similarity (common/similarity.py) of each pair's embeddings and the gold score.

Corpus embeddings are cached on disk under a key made of the model's tokenizer, weights, pooling and
length settings, the compute precision (`dtype`, see SentenceModel.encode) and the corpus texts, so a
second evaluation of the same model on the same data does not encode the corpus again. An entry is checked before use (one finite float32 row per text, of the
model's dimension) and encoded again, with a warning, when it does not fit. Checked in
tests/evaluation/test_evaluate.py (and against published numbers in tests/test_published.py).
"""

import hashlib
import os
import warnings
from collections.abc import Hashable, Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from .. import datasets
from ..training import distributed
from . import metrics
from .lexical import BM25, Jaccard
from .correlation import pearson, spearman
from ..search.ways import search
from ..common.fileio import DIGEST_KEY, file_label, home_folder, tensors_digest, write_safetensors
from ..common.similarity import pairwise_cosine
from ..porting.prompts import encode_as, role_prompt

CACHE_DIR = Path(os.environ.get("MINISBERT_CACHE") or home_folder(".cache"))
LEXICAL = {"bm25": BM25, "jaccard": Jaccard}
MODELS_IN_A_FILE_NAME = 120  # characters: a file name may have 255 bytes, and data and split come first


def model_fingerprint(model) -> str:
    """A digest of everything that decides a model's embeddings: tokenizer, weights and settings."""
    digest = hashlib.sha256()
    digest.update(model.tokenizer.rust.to_str().encode())  # vocabulary, lowercasing, truncation
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    digest.update(f"{model.pooling}|{model.normalize_embeddings}|{model.tokenizer.max_seq_length}".encode())
    # sentence-transformers' settings that change embeddings (porting/sentence_transformer.py; a plain
    # SentenceModel has none), added only when set: older caches keep their names.
    truncate_dim, default_prompt = getattr(model, "truncate_dim", None), role_prompt(model, None)
    if truncate_dim is not None or default_prompt:
        digest.update(f"|{truncate_dim}|{default_prompt}".encode())
    return digest.hexdigest()[:16]


def texts_fingerprint(texts) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8", "surrogatepass"))  # invalid text is encode()'s to refuse, by name
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def encode_cached(model, texts, batch_size: int = 32, cache_dir: Path = None, dtype: str = "float32") -> np.ndarray:
    """The texts encoded as documents (`encode_as`), read from / written to the cache when cache_dir is not None."""
    if cache_dir is None:
        return encode_as(model, texts, "document", batch_size=batch_size, dtype=dtype)
    texts = list(texts)
    # Where the document prompt is the one encode() puts first anyway (none, for most models), the texts
    # are encoded as before and older caches keep their names; any other prompt is in the name.
    prompt, plain = role_prompt(model, "document"), role_prompt(model, None)
    key = model_fingerprint(model) + ("" if prompt == plain else f"-{texts_fingerprint(['document', prompt])}")
    path = Path(cache_dir) / f"{key}-{dtype}-{texts_fingerprint(texts)}.safetensors"
    if path.is_file():
        cached, problem = read_cache_entry(path, len(texts), model.dimension)
        if problem is None:
            return cached
        warnings.warn(f"cached embeddings {path} {problem}; encoding the texts again")
    embeddings = encode_as(model, texts, "document", batch_size=batch_size, dtype=dtype)
    write_safetensors(path, {"embeddings": torch.from_numpy(np.ascontiguousarray(embeddings))}, {})
    return embeddings


def read_cache_entry(path: Path, rows: int, dimension: int):
    """(the cached embeddings, None), or (None, why they cannot be used): an entry is used only if it
    is the bytes that were written (its SHA-256, kept in its metadata), one float32 row per text, of
    the model's dimension, all finite. A file cut short, damaged or written by something else would
    otherwise give metrics over a misaligned corpus, or over wrong values."""
    try:
        with safe_open(str(path), framework="pt") as opened:
            metadata, tensors = opened.metadata() or {}, {name: opened.get_tensor(name) for name in opened.keys()}
    except (OSError, SafetensorError) as error:
        return None, f"cannot be read ({error})"
    embeddings = tensors.get("embeddings")
    if embeddings is None or tuple(embeddings.shape) != (rows, dimension):
        return None, f"have shape {None if embeddings is None else tuple(embeddings.shape)}, not ({rows}, {dimension})"
    if embeddings.dtype != torch.float32:
        return None, f"are {str(embeddings.dtype).removeprefix('torch.')}, not float32"
    if metadata.get(DIGEST_KEY) != tensors_digest(tensors):
        return None, "are not the ones written (their SHA-256 differs from the one saved with them, or none was)"
    if not torch.isfinite(embeddings).all():
        return None, "hold values that are not finite"
    return embeddings.numpy(), None


def rank(model, retrieval: datasets.RetrievalData, k: int, score: str = "cosine", batch_size: int = 32,
         cache_dir: Path = None, exclude_self: bool = False, sharded: bool = False, dtype: str = "float32") -> dict:
    """The top-k documents of every query: {query id: {document id: score}}, best first.

    `model` is a SentenceModel or the name of a lexical baseline ("bm25", "jaccard"). Scores are
    larger-is-better: euclidean distances are negated. exclude_self drops a document whose id
    equals the query id (BEIR's convention). sharded=True (every rank of a torchrun job calls
    it): each process encodes and searches its shard of the corpus (distributed.sharded_search,
    no cache); rank 0 returns the ranking, the other ranks None. dtype: the precision the model encodes in.
    """
    doc_ids = list(retrieval.corpus)
    query_ids = list(retrieval.queries)
    doc_texts = [retrieval.corpus[d] for d in doc_ids]
    query_texts = [retrieval.queries[q] for q in query_ids]
    if isinstance(model, str):
        if model not in LEXICAL:
            raise ValueError(f"unknown baseline {model!r}; choose one of {list(LEXICAL)}")
        scores, indices = LEXICAL[model](doc_texts).search(query_texts, k + int(exclude_self))
        if exclude_self:
            self_hits = np.array([[doc_ids[i] == q for i in row] for q, row in zip(query_ids, indices)])
            indices = np.where(self_hits, -1, indices)
    elif sharded:
        scores, indices = distributed.sharded_search(model, doc_texts, query_texts, k, score, batch_size,
                                                     query_ids=query_ids if exclude_self else None,
                                                     corpus_ids=doc_ids if exclude_self else None, dtype=dtype)
        if scores is None:
            return None
    else:
        corpus = encode_cached(model, doc_texts, batch_size, cache_dir, dtype)
        queries = encode_as(model, query_texts, "query", batch_size=batch_size, dtype=dtype)
        return rank_embeddings(queries, corpus, retrieval, k, score, exclude_self)
    run = run_from_search(scores, indices, query_ids, doc_ids, distances=score == "euclidean" and not isinstance(model, str))
    return {query_id: dict(list(hits.items())[:k]) for query_id, hits in run.items()}


def rank_embeddings(queries, corpus, retrieval: datasets.RetrievalData, k: int, score: str = "cosine",
                    exclude_self: bool = False) -> dict:
    """rank() for embeddings already computed: queries (Q, D) and corpus (N, D), in the order of
    retrieval.queries and retrieval.corpus (a projection of a model's embeddings, say)."""
    query_ids, doc_ids = list(retrieval.queries), list(retrieval.corpus)
    for name, rows, ids in (("queries", queries, query_ids), ("corpus", corpus, doc_ids)):
        if len(rows) != len(ids):  # fewer corpus rows would leave the last documents unfindable
            raise ValueError(f"{len(rows)} {name} embeddings for the {len(ids)} {name} of the retrieval data; "
                             "embed them all, in the data's order")
    scores, indices = search(np.ascontiguousarray(queries, dtype=np.float32),
                             np.ascontiguousarray(corpus, dtype=np.float32), k, score=score,
                             query_ids=query_ids if exclude_self else None,
                             corpus_ids=doc_ids if exclude_self else None)
    return run_from_search(scores, indices, query_ids, doc_ids, distances=score == "euclidean")


def run_from_search(
    scores: np.ndarray,
    indices: np.ndarray,
    query_ids: Sequence[Hashable],
    corpus_ids: Sequence[Hashable],
    distances: bool = False,
) -> dict[Hashable, dict[Hashable, float]]:
    """Turn `retrieval.search` output (Q, k) into {query id: {doc id: score}}, best first.

    Padding (index -1) is dropped. A run's scores are larger-is-better: distances (euclidean
    search, distances=True) are negated, here and nowhere else.
    """
    scores, indices = np.asarray(scores), np.asarray(indices)
    scores = -scores if distances else scores
    if scores.shape != indices.shape or scores.shape[0] != len(query_ids):
        raise ValueError(
            f"scores {scores.shape} and indices {indices.shape} must both be (Q, k) with "
            f"Q = {len(query_ids)} query ids"
        )
    if indices.size and indices.max() >= len(corpus_ids):
        raise ValueError(f"row {indices.max()} found, past the {len(corpus_ids)} corpus ids")
    return {
        query_id: {corpus_ids[i]: float(s) for s, i in zip(row_scores, row_indices) if i >= 0}
        for query_id, row_scores, row_indices in zip(query_ids, scores.tolist(), indices.tolist())
    }




def sts_correlations(model, pairs: list, dtype: str = "float32") -> dict:
    """Spearman and Pearson correlation of cosine similarity with the gold scores."""
    cosine, gold = sts_similarities(model, pairs, dtype)
    return {"spearman": spearman(cosine, gold), "pearson": pearson(cosine, gold)}


def sts_similarities(model, pairs: list, dtype: str = "float32") -> tuple:
    """(the cosine similarity of each pair's two embeddings, the gold scores), two (P,) arrays."""
    if not pairs:
        raise ValueError("no sentence pairs to evaluate")
    first = model.encode([p.sentence1 for p in pairs], dtype=dtype)
    second = model.encode([p.sentence2 for p in pairs], dtype=dtype)
    cosine = pairwise_cosine(torch.from_numpy(first), torch.from_numpy(second)).numpy()
    return cosine, np.array([p.score for p in pairs], dtype=np.float64)


def evaluate_dev(model, data: str):
    """The score train.py maximises on the dev split: {"spearman": ...} for STS-B and SICK,
    {"ndcg@10": ..., ...} for a retrieval folder with qrels/dev.tsv; None when there is no dev split."""
    source = datasets.what_data(data)
    if source.kind == datasets.STS:
        return sts_correlations(model, datasets.load_sts(data, "dev"))  # SICK's dev split is "trial"
    folder = source.retrieval_folder(CACHE_DIR / "qa-csv")
    if not (folder / "qrels" / "dev.tsv").is_file():
        return None
    retrieval = datasets.load_beir(folder, "dev")
    results = metrics.evaluate_run(rank(model, retrieval, 10), retrieval.qrels, [10])
    return {"ndcg@10": results["ndcg@10"], "mrr@10": results["mrr@10"]}


def score_run(run: dict, qrels: dict, ks, definitions: str = "st") -> dict:
    """A ranking's metrics, in the one shape evaluate.py and the studies keep them: {"scores":
    {metric@k: mean over the queries}, "per_query": {metric@k: {query id: value}}}, the per-query
    values averaging to the scores exactly (metrics.per_query_scores, metrics.average_scores)."""
    per_query = metrics.per_query_scores(run, qrels, ks, definitions)
    return {"scores": metrics.average_scores(per_query), "per_query": per_query}


def results_file(data_label: str, split: str, models: Sequence[str]) -> Path:
    """evaluate.py's JSON when no --output is given: runs/eval/<data>-<split>-<models>.json, so that
    another model evaluated on the same data writes a file of its own instead of replacing this one.
    The models are named as their TREC run files are (fileio.file_label) and joined by "+", which
    file_label never leaves in a name: scifact-test-all-MiniLM-L6-v2+bm25.json. Several models whose
    names together would make too long a file name are written as the first, how many more, and a
    digest of all the names, which tells one list from another: scifact-test-runs_a_final+7-more-1f2e3d4c.json.
    A scored --run file has no model (models empty): <run file>-<split>.json."""
    labels = [file_label(name) for name in models]
    name = "+".join(labels)
    if len(labels) > 1 and len(name) > MODELS_IN_A_FILE_NAME:
        digest = hashlib.sha256("\n".join(models).encode("utf-8")).hexdigest()[:8]
        name = f"{labels[0]}+{len(labels) - 1}-more-{digest}"
    parts = [data_label, split, name] if labels else [data_label, split]
    return Path("runs") / "eval" / ("-".join(parts) + ".json")


def retrieval_split(data: str, split: str, cache_dir: Path = CACHE_DIR) -> datasets.RetrievalData:
    """The split of `data` to rank (evaluate.py's --data): a BEIR folder's, or a question,answer
    CSV's, converted once into cache_dir/qa-csv."""
    source = datasets.what_data(data)
    folder = source.retrieval_folder(cache_dir / "qa-csv")
    if source.kind == datasets.QA_CSV:
        print(f"{data}: one query per question, its answer the relevant document (BEIR layout in {folder})")
    retrieval = datasets.load_beir(folder, split)
    if not retrieval.corpus or not retrieval.queries:
        raise ValueError(f"{folder}: nothing to evaluate: {len(retrieval.corpus)} documents in corpus.jsonl and "
                         f"{len(retrieval.queries)} queries judged against them in qrels/{split}.tsv")
    return retrieval


def sts_pairs(data: str, split: str) -> list:
    """STS-B or SICK gold pairs (by name, or from a folder holding either), or pairs.tsv (scores
    in [0, 1]) from a folder."""
    source = datasets.what_data(data)
    if source.kind == datasets.STS:
        return datasets.load_sts(data, split)
    folder = source.folder()
    if not (folder / "pairs.tsv").is_file():
        raise FileNotFoundError(f"--task sts needs stsb, sick, a folder holding STS-B (sts-*.csv, stsbenchmark.tsv.gz) or SICK "
                 f"(SICK_*.txt) files, or a folder with pairs.tsv; {folder} has none of them")
    return datasets.read_pairs_tsv(folder / "pairs.tsv")
