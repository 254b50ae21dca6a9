"""Training objectives of Sentence-BERT, written as plain functions of sentence embeddings.

A loss here never runs the encoder: it takes the pooled embeddings of a batch (and labels where the
objective has them) and returns a scalar. That keeps each objective testable with small hand-made
tensors. Every embedding batch is (B, d): B examples, d dimensions.

Objectives and where they come from:

- Siamese regression (Rygaard, Bramsløw, Jensen and Bagger, "Distance Dilemma: Siamese vs.
  Triplet SBERT Networks for Information Retrieval", DTU, section 2.3.1, eqs. 1 and 2): mean
  squared error between a relevance score y in [0, 1] and the cosine similarity clamped at 0, or
  between 1 - y and the euclidean distance.
- Triplet (the same paper, section 2.3.2, eqs. 3 and 4; SBERT paper section 3): hinge on the gap
  between the anchor-positive and anchor-negative distances, with a margin.
- Classification (SBERT paper section 3, "Classification Objective Function"): softmax over
  W [u; v; |u - v|] with cross-entropy.
- Multiple-negatives ranking (Henderson et al. 2017, "Efficient Natural Language Response
  Suggestion for Smart Reply", as used by sentence-transformers): cross-entropy over scaled cosine
  similarities where the other positives in the batch serve as negatives.

`select_loss(arch, metric, loss)` maps the trainer's three choices to one of these functions. The
cosine similarities and euclidean distances they use are common/similarity.py's, computed there for every
part of minisbert.

The numbers were cross-checked once against sentence-transformers 6.2 (CosineSimilarityLoss,
TripletLoss, SoftmaxLoss, MultipleNegativesRankingLoss) on random embeddings; the tests check
hand-computed values and gradients (torch.autograd.gradcheck) in tests/training/test_losses.py.
"""

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.similarity import cosine_matrix, pairwise_cosine, pairwise_distance

# ---------------------------------------------------------------------------------------------
# Siamese regression (Rygaard et al., section 2.3.1)


def siamese_cosine_mse_loss(u: Tensor, v: Tensor, labels: Tensor) -> Tensor:
    """Rygaard et al. eq. 1: L = 1/N sum_i (y_i - max(cos(u_i, v_i), 0))^2.

    The paper clamps the cosine at 0 with a ReLU (the note under eq. 1): its labels are
    cross-encoder scores in [0, 1], and a pair pointing in opposite directions is no less
    "unrelated" than an orthogonal one, so negative similarities are not pushed further.
    A pair whose cosine is already below 0 therefore contributes y_i^2 and no gradient.
    SBERT's regression objective (CosineSimilarityLoss) is the same without the clamp.

    u, v: (B, d) embeddings of the two texts of each pair. labels: (B,) floats in [0, 1].
    """
    _check_same_shape(u=u, v=v)
    _check_scores(labels, batch_size=u.shape[0])
    similarity = torch.relu(pairwise_cosine(u, v))  # (B,)
    return ((labels - similarity) ** 2).mean()


def siamese_euclidean_mse_loss(u: Tensor, v: Tensor, labels: Tensor) -> Tensor:
    """Rygaard et al. eq. 2: L = 1/N sum_i (1 - y_i - ||u_i - v_i||_2)^2.

    A distance is small for related texts, so the target is 1 - y: a fully relevant pair (y = 1)
    is pulled to distance 0 and an unrelated one (y = 0) pushed to distance 1. The distance itself
    is not clamped or rescaled.

    u, v: (B, d) embeddings of the two texts of each pair. labels: (B,) floats in [0, 1].
    """
    _check_same_shape(u=u, v=v)
    _check_scores(labels, batch_size=u.shape[0])
    distance = pairwise_distance(u, v)  # (B,)
    return ((1 - labels - distance) ** 2).mean()


# ---------------------------------------------------------------------------------------------
# Triplet (Rygaard et al., section 2.3.2; SBERT section 3; Bagge et al.)


def triplet_euclidean_loss(anchors: Tensor, positives: Tensor, negatives: Tensor, *, margin: float) -> Tensor:
    """Rygaard et al. eq. 3: L = 1/N sum_i max(||a_i - p_i|| - ||a_i - n_i|| + margin, 0).

    The loss is zero once every negative is at least `margin` further from its anchor than the
    positive. The margin sets the scale the embeddings are pushed to: the SBERT paper used 1,
    Rygaard et al. used 5 (sentence-transformers' TripletLoss default), Bagge et al.
    ("SRoBERTa yields similar performance ... using reduced embedding sizes") used 0.05.

    anchors, positives, negatives: (B, d). margin: >= 0, keyword-only because papers disagree.
    """
    _check_same_shape(anchors=anchors, positives=positives, negatives=negatives)
    _check_margin(margin)
    distance_positive = pairwise_distance(anchors, positives)  # (B,)
    distance_negative = pairwise_distance(anchors, negatives)  # (B,)
    return torch.relu(distance_positive - distance_negative + margin).mean()


def triplet_cosine_loss(anchors: Tensor, positives: Tensor, negatives: Tensor, *, margin: float) -> Tensor:
    """Rygaard et al. eq. 4: L = 1/N sum_i max((1 - c(a_i, p_i)) - (1 - c(a_i, n_i)) + margin, 0),
    with c(x, y) = max(cos(x, y), 0).

    The cosine "distance" 1 - c is 0 for identical directions and 1 for orthogonal ones.
    Rygaard et al. state (note under eq. 1) that eqs. 1 and 4 both clamp the cosine at 0, so the
    distance never exceeds 1: a negative that is already orthogonal or opposite to its anchor gets
    no further push. With distances in [0, 1], a margin above 1 (Rygaard et al. used 5) is never
    reached and the loss is always d_ap - d_an + margin.

    anchors, positives, negatives: (B, d). margin: >= 0, keyword-only because papers disagree.
    """
    _check_same_shape(anchors=anchors, positives=positives, negatives=negatives)
    _check_margin(margin)
    distance_positive = 1 - torch.relu(pairwise_cosine(anchors, positives))  # (B,)
    distance_negative = 1 - torch.relu(pairwise_cosine(anchors, negatives))  # (B,)
    return torch.relu(distance_positive - distance_negative + margin).mean()


# ---------------------------------------------------------------------------------------------
# Classification (SBERT section 3)


class SoftmaxClassifier(nn.Module):
    """The trainable W of SBERT's classification objective: o = softmax(W [u; v; |u - v|]).

    W maps the concatenation (3·d features) to one logit per label. Like sentence-transformers'
    SoftmaxLoss it is an nn.Linear, so it carries a bias as well. It is used only during training
    (e.g. on NLI with labels entailment/neutral/contradiction) and thrown away afterwards; it is a
    module so that it can be optimized and checkpointed with the encoder.
    """

    def __init__(self, embedding_dim: int, n_labels: int):
        super().__init__()
        if embedding_dim < 1 or n_labels < 2:
            raise ValueError(
                f"SoftmaxClassifier needs embedding_dim >= 1 and n_labels >= 2, "
                f"got embedding_dim={embedding_dim}, n_labels={n_labels}"
            )
        self.embedding_dim = embedding_dim
        self.n_labels = n_labels
        self.linear = nn.Linear(3 * embedding_dim, n_labels)

    def forward(self, u: Tensor, v: Tensor) -> Tensor:
        features = torch.cat([u, v, (u - v).abs()], dim=-1)  # (B, 3d)
        return self.linear(features)  # (B, n_labels)


def softmax_loss(u: Tensor, v: Tensor, labels: Tensor, classifier: SoftmaxClassifier) -> Tensor:
    """SBERT section 3: L = 1/N sum_i -log softmax(W [u_i; v_i; |u_i - v_i|])[y_i].

    u, v: (B, d) with d = classifier.embedding_dim. labels: (B,) integers in [0, n_labels).
    """
    _check_same_shape(u=u, v=v)
    if u.shape[1] != classifier.embedding_dim:
        raise ValueError(
            f"embeddings have dimension {u.shape[1]} but the classifier was built for "
            f"embedding_dim={classifier.embedding_dim}; build SoftmaxClassifier with the encoder's output size"
        )
    _check_class_labels(labels, batch_size=u.shape[0], n_labels=classifier.n_labels)
    logits = classifier(u, v)  # (B, n_labels)
    return F.cross_entropy(logits, labels)


# ---------------------------------------------------------------------------------------------
# Multiple-negatives ranking (Henderson et al. 2017; sentence-transformers)


def multiple_negatives_ranking_loss(
    anchors: Tensor, positives: Tensor, hard_negatives: Tensor | None = None, *, scale: float = 20.0
) -> Tensor:
    """In-batch softmax: every anchor must pick out its own positive among all candidates.

    Candidates C = [positives; hard_negatives] (B + M rows). With s_ij = scale · cos(a_i, c_j),
    L = 1/B sum_i -log( exp(s_ii) / sum_j exp(s_ij) ).
    The positives of the other anchors act as negatives for free; each hard-negative row is one
    more negative for every anchor (typically M = B, one mined negative per anchor). `scale` is an
    inverse temperature: cosines live in [-1, 1], which is too flat for a softmax, and 20 is
    sentence-transformers' default.

    anchors, positives: (B, d). hard_negatives: (M, d) or None.
    """
    _check_same_shape(anchors=anchors, positives=positives)
    candidates = positives
    if hard_negatives is not None:
        if hard_negatives.dim() != 2 or hard_negatives.shape[0] == 0 or hard_negatives.shape[1] != anchors.shape[1]:
            raise ValueError(
                f"hard_negatives has shape {tuple(hard_negatives.shape)}; expected (M, {anchors.shape[1]}) "
                f"with M >= 1, or pass None"
            )
        candidates = torch.cat([positives, hard_negatives], dim=0)  # (B + M, d)
    scores = cosine_matrix(anchors, candidates, scale)  # (B, B + M)
    own_positive = torch.arange(anchors.shape[0], device=anchors.device)  # (B,)
    return F.cross_entropy(scores, own_positive)


# ---------------------------------------------------------------------------------------------
# Choosing a loss


@dataclass(frozen=True)
class LossSpec:
    name: str  # e.g. "triplet-euclidean", for logs and saved training configs
    function: Callable[..., Tensor]  # one of the loss functions above
    n_texts: int  # embedding batches per example, passed first and in order: 2 (pair) or 3 (triplet)
    label_kind: str | None  # "score" (float in [0, 1]), "class" (int label), or None (no labels)
    takes_margin: bool = False  # the function needs margin=... (the triplet losses)
    whole_batch: bool = False  # each anchor is ranked against every example of the batch (MNRL), not its own alone

    def __call__(self, embeddings: list, examples: list, *, margin: float, classifier=None) -> Tensor:
        """The loss of `examples` from their embeddings, one (B, d) tensor per text column: the
        function called with the labels the examples carry (label_kind), the margin where it takes
        one and SBERT's classifier for the softmax objective."""
        options = {"margin": margin} if self.takes_margin else {}
        if classifier is not None:
            options["classifier"] = classifier
        if self.label_kind is None:
            return self.function(*embeddings, **options)
        dtype = torch.float32 if self.label_kind == "score" else torch.long
        labels = torch.tensor([e.label for e in examples], dtype=dtype, device=embeddings[0].device)  # (B,)
        return self.function(*embeddings, labels, **options)


ARCHS = ("siamese", "triplet")
METRICS = ("cosine", "euclidean")
LOSS_NAMES = (None, "softmax", "mnrl")

# (arch, metric, loss) -> spec. Softmax and MNRL are defined on cosine similarity only
# (SBERT evaluates softmax-trained models with cosine; MNRL scores are scaled cosines).
_LOSS_TABLE = {
    ("siamese", "cosine", None): LossSpec("siamese-cosine", siamese_cosine_mse_loss, 2, "score"),
    ("siamese", "euclidean", None): LossSpec("siamese-euclidean", siamese_euclidean_mse_loss, 2, "score"),
    ("triplet", "cosine", None): LossSpec("triplet-cosine", triplet_cosine_loss, 3, None, takes_margin=True),
    ("triplet", "euclidean", None): LossSpec("triplet-euclidean", triplet_euclidean_loss, 3, None, takes_margin=True),
    ("siamese", "cosine", "softmax"): LossSpec("softmax", softmax_loss, 2, "class"),
    ("siamese", "cosine", "mnrl"): LossSpec("mnrl", multiple_negatives_ranking_loss, 2, None, whole_batch=True),
    ("triplet", "cosine", "mnrl"): LossSpec("mnrl-hard-negatives", multiple_negatives_ranking_loss, 3, None,
                                            whole_batch=True),
}


def select_loss(arch: str, metric: str, loss: str | None = None) -> LossSpec:
    """The loss for a training setup. arch: "siamese" (pairs) or "triplet" (anchor, positive,
    negative); metric: "cosine" or "euclidean"; loss: None (the arch's own MSE/triplet loss),
    "softmax" or "mnrl".

    Call it as spec(embeddings, examples, margin=..., classifier=...) (LossSpec.__call__), or its
    function directly: spec.function(*embeddings, labels) when spec.label_kind is set, else
    spec.function(*embeddings); spec.takes_margin says it needs margin=...; softmax needs
    classifier=..., and MNRL takes an optional scale=....
    """
    for value, valid, what in ((arch, ARCHS, "arch"), (metric, METRICS, "metric"), (loss, LOSS_NAMES, "loss")):
        if value not in valid:
            raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(map(repr, valid))}")
    spec = _LOSS_TABLE.get((arch, metric, loss))
    if spec is None:
        combinations = "; ".join(f"arch={a!r} metric={m!r} loss={l!r}" for a, m, l in _LOSS_TABLE)
        raise ValueError(f"no loss for arch={arch!r} metric={metric!r} loss={loss!r}; supported: {combinations}")
    return spec


# ---------------------------------------------------------------------------------------------
# Input checks: a wrong shape would otherwise broadcast silently into a wrong loss.


def _check_same_shape(**embeddings: Tensor) -> None:
    (first_name, first), *others = embeddings.items()
    if first.dim() != 2 or first.shape[0] == 0 or first.shape[1] == 0:
        raise ValueError(f"{first_name} has shape {tuple(first.shape)}; expected a non-empty (batch_size, dim) batch")
    for name, tensor in others:
        if tensor.shape != first.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} but {first_name} has shape {tuple(first.shape)}; "
                f"each example needs one embedding of each kind"
            )


def _check_scores(labels: Tensor, batch_size: int) -> None:
    if labels.shape != (batch_size,) or not labels.is_floating_point():
        raise ValueError(
            f"labels must be a float tensor of shape ({batch_size},), got {labels.dtype} {tuple(labels.shape)}"
        )
    outside = ~((labels >= 0) & (labels <= 1))  # also true for NaN
    if outside.any():
        index = int(outside.nonzero()[0, 0])
        raise ValueError(
            f"label {labels[index].item()} at position {index} is outside [0, 1]; "
            f"rescale the scores (e.g. STS-B 0..5 -> divide by 5)"
        )


def _check_class_labels(labels: Tensor, batch_size: int, n_labels: int) -> None:
    if labels.shape != (batch_size,) or labels.dtype != torch.int64:
        raise ValueError(
            f"labels must be an int64 tensor of shape ({batch_size},), got {labels.dtype} {tuple(labels.shape)}"
        )
    outside = (labels < 0) | (labels >= n_labels)
    if outside.any():
        index = int(outside.nonzero()[0, 0])
        raise ValueError(f"label {labels[index].item()} at position {index} is outside [0, {n_labels})")


def _check_margin(margin: float) -> None:
    if not margin >= 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
