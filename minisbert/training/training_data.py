"""Training examples from a dataset, in the shape a loss reads, with hard negatives mined for it.

Training data comes in three shapes, one per family of objectives (training/losses.py):
- scored pairs (sentence1, sentence2, score in [0, 1]) for the Siamese regression losses;
- triplets (anchor, positive, negative) for the triplet losses and MNRL with hard negatives;
- labelled pairs (sentence1, sentence2, class id) for SBERT's classification objective.
`training_examples` builds them from what `--data` names (datasets.what_data); retrieval datasets
(BEIR layout) give triplets whose negatives are mined with minisbert's own retriever
(`mine_hard_negatives`), MS MARCO folders triplets filtered by a cross-encoder (`msmarco_examples`).
The readers of the files are in datasets/; this module turns what they read into examples.
Checked in tests/training/test_training.py.
"""

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import datasets
from ..evaluation.benchmark import CACHE_DIR, encode_cached
from ..porting.prompts import encode_as
from ..search.ways import search

SCORED, TRIPLETS, LABELLED = "scored pairs", "triplets", "labelled pairs"
POSITIVE_PAIRS = "positive pairs"  # (query, relevant text): what MNRL without hard negatives reads


@dataclass(frozen=True)
class Example:
    texts: tuple  # 2 texts (a pair) or 3 (anchor, positive, negative)
    label: float = None  # score in [0, 1], class id, or None


def judged_pairs(retrieval: datasets.RetrievalData) -> list:
    """(query id, document id) of every judgment with relevance > 0 whose document is in the corpus,
    query by query: the pairs a BEIR layout's training examples are made of."""
    return [(query_id, doc_id) for query_id in retrieval.queries
            for doc_id, relevance in retrieval.qrels.get(query_id, {}).items()
            if relevance > 0 and doc_id in retrieval.corpus]


def mine_hard_negatives(model, retrieval: datasets.RetrievalData, top_k: int = 10, batch_size: int = 32,
                        seed: int = 0, cache_dir: Path = None) -> list:
    """One triplet per judged (query, relevant document) of `judged_pairs`: the negative is drawn
    from the query's top_k retrieved documents that are not judged relevant (the hard negatives
    Rygaard et al. train on, "Distance Dilemma", section 2.1, were mined from retrievers' top results
    the same way). Uses cosine similarity with `model`; the corpus embeddings are read from / written
    to `cache_dir` (evaluation.encode_cached) when it is given, so evaluating the same model encodes
    nothing again."""
    pairs = judged_pairs(retrieval)
    if not pairs:  # nothing judged relevant: no triplets (train.py then says there is no data)
        return []
    doc_ids = list(retrieval.corpus)
    query_ids = list(dict.fromkeys(query_id for query_id, _ in pairs))  # each once, in order
    corpus = encode_cached(model, [retrieval.corpus[d] for d in doc_ids], batch_size, cache_dir)
    queries = encode_as(model, [retrieval.queries[q] for q in query_ids], "query", batch_size=batch_size)
    k = min(top_k + max(len(retrieval.qrels[q]) for q in query_ids), len(doc_ids))
    _, indices = search(queries, corpus, k, score="cosine")  # (Q, k)
    negatives = {query_id: [doc_ids[i] for i in indices[row] if doc_ids[i] not in retrieval.qrels[query_id]][:top_k]
                 for row, query_id in enumerate(query_ids)}
    rng = random.Random(seed)
    return [Example((retrieval.queries[query_id], retrieval.corpus[doc_id],
                     retrieval.corpus[rng.choice(negatives[query_id])]))
            for query_id, doc_id in pairs if negatives[query_id]]


def example_shape(spec) -> str:
    """The examples a loss (losses.LossSpec) reads: scored pairs, labelled pairs, triplets, or
    positive pairs for MNRL without hard negatives (so that nothing is mined for it)."""
    if spec.label_kind is not None:
        return {"score": SCORED, "class": LABELLED}[spec.label_kind]
    return POSITIVE_PAIRS if spec.n_texts == 2 else TRIPLETS


def training_examples(data: str, shape: str, model=None, seed: int = 0, mine: bool = True) -> list:
    """Examples of `shape` from a dataset: `stsb`, `sick`, `scifact`, `example`, or a folder.

    Folders may hold STS-B or SICK (themselves or as stsb/, sick/), pairs.tsv (scored pairs),
    triplets.tsv, MS MARCO files (`msmarco_examples`), or a BEIR layout (triplets mined from
    qrels/train.tsv with `model`). STS-B and SICK give scored pairs scaled to [0, 1]; SICK also
    gives labelled pairs from its entailment judgments. Positive pairs are the triplets' first two
    texts; a BEIR layout gives them straight from its judgments (mine=False: nothing is mined).
    """
    source = datasets.what_data(data)
    sts = source.sts
    if shape == POSITIVE_PAIRS:
        return [Example(example.texts[:2]) for example in training_examples(data, TRIPLETS, model, seed, mine=False)]
    if sts:
        pairs = datasets.load_sts(data, "train")
        if shape == SCORED:
            return [Example((p.sentence1, p.sentence2), datasets.to_unit_score(sts, p.score)) for p in pairs]
        if shape == LABELLED and sts == "sick":
            return [Example((p.sentence1, p.sentence2), datasets.ENTAILMENT_LABELS.index(p.label))
                    for p in pairs]
        raise ValueError(f"dataset {data!r} has no {shape}; it has scored pairs"
                         + (" and labelled pairs (--loss softmax)" if sts == "sick" else ""))
    folder = source.folder()
    if shape in (TRIPLETS, SCORED) and (folder / "collection.tsv").is_file():
        return msmarco_examples(folder, shape, seed=seed)
    if shape == SCORED and (folder / "pairs.tsv").is_file():
        return [Example((p.sentence1, p.sentence2), p.score) for p in datasets.read_pairs_tsv(folder / "pairs.tsv")]
    if shape == TRIPLETS and (folder / "triplets.tsv").is_file():
        return [Example((t.anchor, t.positive, t.negative)) for t in datasets.read_triplets_tsv(folder / "triplets.tsv")]
    if shape in (TRIPLETS, SCORED) and (folder / "qrels" / "train.tsv").is_file():
        retrieval = datasets.load_beir(folder, "train")
        if not mine:  # only the pairs are wanted, and the judgments are all they need
            return [Example((retrieval.queries[q], retrieval.corpus[d])) for q, d in judged_pairs(retrieval)]
        # The corpus embeddings are shared with evaluate.py's cache: the start model's are often there.
        triplets = mine_hard_negatives(model, retrieval, seed=seed, cache_dir=CACHE_DIR / "embeddings")
        if shape == TRIPLETS:
            return triplets
        return [Example((e.texts[0], e.texts[1]), 1.0) for e in triplets] + \
               [Example((e.texts[0], e.texts[2]), 0.0) for e in triplets]
    raise ValueError(f"no {shape} in {folder}: expected "
                     + {SCORED: "pairs.tsv or a BEIR layout with qrels/train.tsv",
                        TRIPLETS: "triplets.tsv or a BEIR layout with qrels/train.tsv",
                        LABELLED: "SICK (--data sick)"}[shape])


MSMARCO_HARD_NEGATIVES = "msmarco-hard-negatives.jsonl*"
MSMARCO_CE_SCORES = "cross-encoder-ms-marco-*-scores.*"


def msmarco_examples(folder: Path, shape: str, ce_margin: float = 3.0, seed: int = 0) -> list:
    """Rygaard et al.'s training data from an MS MARCO folder: collection.tsv, queries.train.tsv, the
    hard-negatives file (msmarco-hard-negatives.jsonl[.gz]) and cross-encoder scores
    (cross-encoder-ms-marco-*-scores.{pkl.gz,json,tsv}).

    Negatives are kept only when the cross-encoder scores them at least `ce_margin` logits below the
    query's positives (data.filter_hard_negatives). Each query gives its first positive and one
    kept negative drawn with `seed`: as a triplet, or as two scored pairs whose labels are the
    cross-encoder logits squashed into [0, 1] by a sigmoid (the Siamese regression targets).
    """
    hard_negatives = sorted(folder.glob(MSMARCO_HARD_NEGATIVES))
    ce_scores = sorted(folder.glob(MSMARCO_CE_SCORES))
    if not hard_negatives or not ce_scores or not (folder / "queries.train.tsv").is_file():
        raise ValueError(f"{folder} holds collection.tsv but not all of queries.train.tsv, "
                         f"{MSMARCO_HARD_NEGATIVES} and {MSMARCO_CE_SCORES}: the MS MARCO training files")
    passages = datasets.read_id_text_tsv(folder / "collection.tsv")
    queries = datasets.read_id_text_tsv(folder / "queries.train.tsv")
    scores = datasets.read_cross_encoder_scores(ce_scores[0])
    entries = datasets.filter_hard_negatives(datasets.read_hard_negatives(hard_negatives[0]), scores, ce_margin)
    rng = random.Random(seed)
    examples = []
    for entry in entries:
        negatives = sorted({pid for pids in entry.negatives.values() for pid in pids})
        if entry.qid not in queries or not negatives:
            continue
        query, positive, negative = entry.qid, entry.positives[0], rng.choice(negatives)
        if shape == TRIPLETS:
            examples.append(Example((queries[query], passages[positive], passages[negative])))
        else:
            for pid in (positive, negative):
                label = float(torch.sigmoid(torch.tensor(scores[query][pid], dtype=torch.float64)))
                examples.append(Example((queries[query], passages[pid]), label))
    return examples
