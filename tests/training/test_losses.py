"""What "correct" means for each training objective: hand-computed values on tiny batches (the
arithmetic is in the comments), analytic gradients equal to finite differences (gradcheck, float64),
the regimes where a clamp or a hinge switches the gradient off, and clear errors for bad inputs.

Everything is float64. A hand value and the loss are a dozen operations each, a few ulps (1.1e-16
each near 1) apart: FLOAT64_APART (1e-12) is far outside that and far inside what a wrong formula
changes (1e-3 and more: the clamp, the margin, the mean). gradcheck keeps torch's tolerances (atol
1e-5, rtol 1e-3): a central difference with step 1e-6 errs by about step² (1e-12) from truncation and
u / step (1e-10) from rounding; measured here, gradients and differences agree within 1.1e-9."""

import math
from functools import partial

import pytest
import torch

from minisbert.training.losses import (SoftmaxClassifier, multiple_negatives_ranking_loss, select_loss,
                                       siamese_cosine_mse_loss, siamese_euclidean_mse_loss, softmax_loss,
                                       triplet_cosine_loss, triplet_euclidean_loss)

SQRT3 = math.sqrt(3.0)
INV_SQRT2 = 1 / math.sqrt(2.0)
FLOAT64_APART = 1e-12  # see the module docstring


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see conftest.py


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def random_batch(seed, *shape):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)


# --- Siamese, cosine (Rygaard et al. eq. 1) -----------------------------------------------------


def test_siamese_cosine_hand_computed():
    u = t([[3.0, 4.0], [1.0, 0.0], [1.0, 0.0]])
    v = t([[3.0, 4.0], [1.0, SQRT3], [-1.0, 0.0]])
    labels = t([0.5, 0.25, 0.2])
    # cos = 1            -> (0.5 - 1)^2    = 0.25
    # cos = 1/2          -> (0.25 - 0.5)^2 = 0.0625
    # cos = -1, ReLU -> 0 -> (0.2 - 0)^2   = 0.04   (unclamped would be (0.2 + 1)^2 = 1.44)
    # mean = 0.3525 / 3 = 0.1175
    assert siamese_cosine_mse_loss(u, v, labels).item() == pytest.approx(0.1175, abs=FLOAT64_APART)


def test_siamese_cosine_negative_similarity_is_clamped_and_gets_no_gradient():
    u = t([[1.0, 0.0]]).requires_grad_()
    v = t([[-1.0, 0.5]]).requires_grad_()  # cos < 0
    loss = siamese_cosine_mse_loss(u, v, t([0.3]))
    # ReLU(cos) = 0 -> loss = 0.3^2 = 0.09, whatever the angle beyond 90 degrees
    assert loss.item() == pytest.approx(0.09, abs=FLOAT64_APART)
    loss.backward()
    assert torch.count_nonzero(u.grad) == 0 and torch.count_nonzero(v.grad) == 0


def test_siamese_cosine_gradcheck():
    u, v = random_batch(0, 5, 4), random_batch(1, 5, 4)
    labels = torch.linspace(0, 1, 5, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: siamese_cosine_mse_loss(a, b, labels), (u, v))


# --- Siamese, euclidean (Rygaard et al. eq. 2) --------------------------------------------------


def test_siamese_euclidean_hand_computed():
    u = t([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    v = t([[3.0, 4.0], [1.0, 1.0], [0.0, 0.5]])
    labels = t([0.0, 1.0, 0.25])
    # d = 5,   y = 0    -> (1 - 0 - 5)^2      = 16
    # d = 0,   y = 1    -> (1 - 1 - 0)^2      = 0      (a fully relevant pair belongs at distance 0)
    # d = 0.5, y = 0.25 -> (1 - 0.25 - 0.5)^2 = 0.0625
    # mean = 16.0625 / 3 = 5.3541666...
    assert siamese_euclidean_mse_loss(u, v, labels).item() == pytest.approx(16.0625 / 3, abs=FLOAT64_APART)


def test_siamese_euclidean_gradcheck():
    u, v = random_batch(2, 5, 4), random_batch(3, 5, 4)
    labels = torch.linspace(0, 1, 5, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: siamese_euclidean_mse_loss(a, b, labels), (u, v))


# --- Triplet, euclidean (Rygaard et al. eq. 3) --------------------------------------------------

TRIPLET_ANCHORS = t([[0.0, 0.0], [0.0, 0.0]])
TRIPLET_POSITIVES = t([[1.0, 0.0], [0.0, 4.0]])  # d_ap = 1, 4
TRIPLET_NEGATIVES = t([[0.0, 3.0], [3.0, 0.0]])  # d_an = 3, 3


@pytest.mark.parametrize(
    "margin, expected",
    [
        (1.0, (0.0 + 2.0) / 2),  # 1 - 3 + 1 = -1 -> 0;  4 - 3 + 1 = 2        -> mean 1
        (0.05, (0.0 + 1.05) / 2),  # 1 - 3 + 0.05 -> 0;  4 - 3 + 0.05 = 1.05 -> mean 0.525 (Bagge et al.'s margin)
        (5.0, (3.0 + 6.0) / 2),  # 1 - 3 + 5 = 3;       4 - 3 + 5 = 6        -> mean 4.5 (Rygaard et al.'s margin)
    ],
)
def test_triplet_euclidean_hand_computed(margin, expected):
    loss = triplet_euclidean_loss(TRIPLET_ANCHORS, TRIPLET_POSITIVES, TRIPLET_NEGATIVES, margin=margin)
    assert loss.item() == pytest.approx(expected, abs=FLOAT64_APART)


def test_triplet_euclidean_margin_never_reached_gives_zero_loss_and_zero_gradient():
    anchors = t([[0.0, 0.0], [1.0, 1.0]]).requires_grad_()
    positives = t([[1.0, 0.0], [1.0, 2.0]]).requires_grad_()  # d_ap = 1, 1
    negatives = t([[0.0, 3.0], [5.0, 4.0]]).requires_grad_()  # d_an = 3, 5
    # 1 - 3 + 1 = -1 -> 0;  1 - 5 + 1 = -3 -> 0
    loss = triplet_euclidean_loss(anchors, positives, negatives, margin=1.0)
    assert loss.item() == 0.0
    loss.backward()
    for tensor in (anchors, positives, negatives):
        assert torch.count_nonzero(tensor.grad) == 0


def test_triplet_euclidean_margin_always_reached_is_distance_gap_plus_margin():
    anchors = TRIPLET_ANCHORS.clone().requires_grad_()
    positives = TRIPLET_POSITIVES.clone().requires_grad_()
    negatives = TRIPLET_NEGATIVES.clone()
    loss = triplet_euclidean_loss(anchors, positives, negatives, margin=5.0)
    # mean(d_ap - d_an + 5) = mean(1 - 3 + 5, 4 - 3 + 5) = 4.5
    assert loss.item() == pytest.approx(4.5, abs=FLOAT64_APART)
    loss.backward()
    # d(loss)/d(p_i) = (p_i - a_i) / ||p_i - a_i|| / B: unit vectors (1, 0) and (0, 1), halved
    torch.testing.assert_close(positives.grad, t([[0.5, 0.0], [0.0, 0.5]]), rtol=0, atol=FLOAT64_APART)


def test_triplet_euclidean_gradcheck():
    anchors, positives, negatives = (random_batch(seed, 6, 4) for seed in (4, 5, 6))
    # margin 10 keeps every hinge active, far from its kink at 0, where finite differences fail
    loss = partial(triplet_euclidean_loss, margin=10.0)
    assert torch.autograd.gradcheck(loss, (anchors, positives, negatives))


# --- Triplet, cosine (Rygaard et al. eq. 4) -----------------------------------------------------


def test_triplet_cosine_hand_computed():
    anchors = t([[1.0, 0.0]])
    positives = t([[1.0, 1.0]])  # cos = 1/sqrt2 -> d_ap = 1 - 0.70710678 = 0.29289322
    negatives = t([[0.0, 2.0]])  # cos = 0       -> d_an = 1
    # margin 5 (Rygaard et al.): 0.29289322 - 1 + 5 = 4.29289322
    loss = triplet_cosine_loss(anchors, positives, negatives, margin=5.0)
    assert loss.item() == pytest.approx(1 - INV_SQRT2 - 1 + 5, abs=FLOAT64_APART)
    # margin 0.5: 0.29289322 - 1 + 0.5 = -0.2071 -> 0 (never reached)
    assert triplet_cosine_loss(anchors, positives, negatives, margin=0.5).item() == 0.0


def test_triplet_cosine_clamps_negative_cosine_at_zero():
    anchors = t([[1.0, 0.0]])
    positives = t([[1.0, 1.0]])
    opposite = t([[-1.0, 0.0]]).requires_grad_()  # cos = -1 -> clamped to 0 -> d_an = 1, not 2
    loss = triplet_cosine_loss(anchors, positives, opposite, margin=5.0)
    # same as an orthogonal negative: 0.29289322 - 1 + 5 = 4.29289322 (unclamped: 3.29289322)
    assert loss.item() == pytest.approx(1 - INV_SQRT2 - 1 + 5, abs=FLOAT64_APART)
    loss.backward()
    assert torch.count_nonzero(opposite.grad) == 0


def test_triplet_cosine_margin_always_reached_gradient():
    anchors = t([[1.0, 0.0], [0.0, 1.0]])
    positives = t([[1.0, 1.0], [0.0, 3.0]]).requires_grad_()  # d_ap = 0.29289322, 0
    negatives = t([[1.0, 0.0], [1.0, 1.0]])  # d_an = 0, 0.29289322
    loss = triplet_cosine_loss(anchors, positives, negatives, margin=1.0)
    # mean(0.29289322 - 0 + 1, 0 - 0.29289322 + 1) = 2 / 2 = 1
    assert loss.item() == pytest.approx(1.0, abs=FLOAT64_APART)
    loss.backward()
    # d(1 - cos(a, p))/dp = -(a/|a| - cos·p/|p|) / |p|, times 1/B = 1/2:
    # row 0: a = (1,0), p = (1,1), cos = 1/sqrt2, |p| = sqrt2 -> -((1,0) - (1/2, 1/2)) / sqrt2 / 2 = (-1, 1)/(4 sqrt2)
    # row 1: p parallel to a -> 0
    torch.testing.assert_close(positives.grad, t([[-1.0, 1.0], [0.0, 0.0]]) / (4 * math.sqrt(2.0)), rtol=0,
                               atol=FLOAT64_APART)


def test_triplet_cosine_gradcheck():
    anchors, positives, negatives = (random_batch(seed, 6, 4) for seed in (7, 8, 9))
    # margin 5 > 1 = the largest possible distance gap, so every hinge is active
    loss = partial(triplet_cosine_loss, margin=5.0)
    assert torch.autograd.gradcheck(loss, (anchors, positives, negatives))


# --- Classification (SBERT section 3) ---------------------------------------------------------


def hand_set_classifier():
    classifier = SoftmaxClassifier(embedding_dim=1, n_labels=2).double()
    with torch.no_grad():
        # logit 0 reads u, logit 1 reads |u - v|
        classifier.linear.weight.copy_(t([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]))
        classifier.linear.bias.zero_()
    return classifier


def test_softmax_loss_hand_computed():
    classifier = hand_set_classifier()
    u = t([[-1.0], [-1.0]])
    v = t([[2.0], [2.0]])
    labels = torch.tensor([1, 0])
    # features [u, v, |u - v|] = [-1, 2, 3] (u - v itself would be -3) -> logits [-1, 3]
    # label 1: -log(e^3 / (e^-1 + e^3))  = log(1 + e^-4) = 0.01814993
    # label 0: -log(e^-1 / (e^-1 + e^3)) = log(1 + e^4)  = 4.01814993
    # mean = 2.01814993
    loss = softmax_loss(u, v, labels, classifier)
    assert loss.item() == pytest.approx((math.log(1 + math.exp(-4)) + math.log(1 + math.exp(4))) / 2, abs=FLOAT64_APART)


def test_softmax_classifier_shape_and_gradcheck():
    classifier = SoftmaxClassifier(embedding_dim=4, n_labels=3).double()
    assert classifier.linear.weight.shape == (3, 12)
    u, v = random_batch(10, 5, 4), random_batch(11, 5, 4)
    weight = classifier.linear.weight.detach().clone().requires_grad_()
    bias = classifier.linear.bias.detach().clone().requires_grad_()
    labels = torch.tensor([0, 1, 2, 1, 0])

    def loss_of(u, v, weight, bias):
        params = {"linear.weight": weight, "linear.bias": bias}
        logits = torch.func.functional_call(classifier, params, (u, v))
        return torch.nn.functional.cross_entropy(logits, labels)

    # the helper above is an independent statement of the objective; first check they agree
    assert softmax_loss(u, v, labels, classifier).item() == pytest.approx(loss_of(u, v, weight, bias).item(),
                                                                           abs=FLOAT64_APART)
    assert torch.autograd.gradcheck(lambda a, b: softmax_loss(a, b, labels, classifier), (u, v))
    assert torch.autograd.gradcheck(loss_of, (u, v, weight, bias))


# --- Multiple-negatives ranking ---------------------------------------------------------------

MNRL_ANCHORS = t([[1.0, 0.0], [0.0, 1.0]])
MNRL_POSITIVES = t([[2.0, 0.0], [1.0, 1.0]])
# cosine matrix (anchor i, positive j) = [[1, 1/sqrt2], [0, 1/sqrt2]]; the diagonal holds the targets


def test_mnrl_hand_computed_2x2():
    # scale 1:
    # row 0: -log(e^1 / (e^1 + e^0.70711))          = log(1 + e^(0.70711 - 1)) = 0.55738576
    # row 1: -log(e^0.70711 / (e^0 + e^0.70711))    = log(1 + e^-0.70711)      = 0.40083353
    # mean = 0.47910965
    loss = multiple_negatives_ranking_loss(MNRL_ANCHORS, MNRL_POSITIVES, scale=1.0)
    expected = (math.log(1 + math.exp(INV_SQRT2 - 1)) + math.log(1 + math.exp(-INV_SQRT2))) / 2
    assert loss.item() == pytest.approx(expected, abs=FLOAT64_APART)
    # default scale 20: log(1 + e^(20·(0.70711 - 1))) = 0.00285326 and log(1 + e^(-20·0.70711)) = 7.2135e-7
    loss = multiple_negatives_ranking_loss(MNRL_ANCHORS, MNRL_POSITIVES)
    expected = (math.log(1 + math.exp(20 * (INV_SQRT2 - 1))) + math.log(1 + math.exp(-20 * INV_SQRT2))) / 2
    # 0.00142699: the loss subtracts 20 from a log-sum-exp near 20, so its roundings (~4e-15) are 3e-12 of it
    assert loss.item() == pytest.approx(expected, rel=1e-9)


def test_mnrl_hard_negatives_extend_the_candidates():
    hard_negatives = t([[3.0, 0.0]])  # points the same way as anchor 0
    loss = multiple_negatives_ranking_loss(MNRL_ANCHORS, MNRL_POSITIVES, hard_negatives, scale=1.0)
    # candidates [p0, p1, h0]; cosines row 0 = [1, 0.70711, 1], row 1 = [0, 0.70711, 0]
    # row 0: log(e^1 + e^0.70711 + e^1) - 1        = 1.01018238
    # row 1: log(e^0 + e^0.70711 + e^0) - 0.70711  = 0.68619174
    # mean = 0.84818706 (> 0.47910965 without the hard negative)
    row0 = math.log(2 * math.e + math.exp(INV_SQRT2)) - 1
    row1 = math.log(2 + math.exp(INV_SQRT2)) - INV_SQRT2
    assert loss.item() == pytest.approx((row0 + row1) / 2, abs=FLOAT64_APART)


def test_mnrl_gradcheck_with_and_without_hard_negatives():
    anchors, positives, hard_negatives = random_batch(12, 4, 3), random_batch(13, 4, 3), random_batch(14, 6, 3)
    assert torch.autograd.gradcheck(lambda a, p: multiple_negatives_ranking_loss(a, p, scale=5.0), (anchors, positives))
    assert torch.autograd.gradcheck(
        lambda a, p, h: multiple_negatives_ranking_loss(a, p, h, scale=5.0), (anchors, positives, hard_negatives)
    )


# --- Input checks -----------------------------------------------------------------------------


@pytest.mark.parametrize("loss", [siamese_cosine_mse_loss, siamese_euclidean_mse_loss])
@pytest.mark.parametrize("bad", [1.5, -0.25, float("nan")])
def test_siamese_labels_outside_unit_interval_are_rejected(loss, bad):
    u = v = t([[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match=rf"label {bad} at position 1 is outside \[0, 1\]"):
        loss(u, v, t([0.5, bad]))


def test_shape_mismatch_and_empty_batch_are_rejected():
    with pytest.raises(ValueError, match=r"v has shape \(2, 3\) but u has shape \(2, 2\)"):
        siamese_cosine_mse_loss(t([[1.0, 0.0]] * 2), t([[1.0, 0.0, 0.0]] * 2), t([0.5, 0.5]))
    with pytest.raises(ValueError, match=r"labels must be a float tensor of shape \(2,\)"):
        siamese_cosine_mse_loss(t([[1.0, 0.0]] * 2), t([[1.0, 0.0]] * 2), t([0.5, 0.5, 0.5]))
    with pytest.raises(ValueError, match=r"negatives has shape \(1, 2\) but anchors has shape \(2, 2\)"):
        triplet_euclidean_loss(t([[1.0, 0.0]] * 2), t([[1.0, 0.0]] * 2), t([[1.0, 0.0]]), margin=1.0)
    with pytest.raises(ValueError, match=r"anchors has shape \(0, 2\); expected a non-empty"):
        multiple_negatives_ranking_loss(torch.zeros(0, 2), torch.zeros(0, 2))
    with pytest.raises(ValueError, match=r"anchors has shape \(2, 0\); expected a non-empty"):  # no dimensions
        multiple_negatives_ranking_loss(torch.zeros(2, 0), torch.zeros(2, 0))
    with pytest.raises(ValueError, match=r"hard_negatives has shape \(2, 3\); expected \(M, 2\)"):
        multiple_negatives_ranking_loss(t([[1.0, 0.0]]), t([[1.0, 0.0]]), t([[1.0, 0.0, 0.0]] * 2))
    with pytest.raises(ValueError, match=r"margin must be >= 0, got -1"):
        triplet_cosine_loss(t([[1.0, 0.0]]), t([[1.0, 0.0]]), t([[1.0, 0.0]]), margin=-1.0)


def test_softmax_rejects_bad_labels_and_dimension():
    classifier = hand_set_classifier()
    u = v = t([[1.0], [2.0]])
    with pytest.raises(ValueError, match=r"label 2 at position 1 is outside \[0, 2\)"):
        softmax_loss(u, v, torch.tensor([0, 2]), classifier)
    with pytest.raises(ValueError, match="int64"):
        softmax_loss(u, v, t([0.0, 1.0]), classifier)
    with pytest.raises(ValueError, match="embedding_dim=1"):
        softmax_loss(t([[1.0, 0.0]]), t([[1.0, 0.0]]), torch.tensor([0]), classifier)


@pytest.mark.parametrize("embedding_dim, n_labels", [(0, 3), (4, 1), (0, 1)])
def test_softmax_classifier_needs_a_dimension_and_two_labels(embedding_dim, n_labels):
    # each condition alone is enough to refuse: a classifier over no features, or with one label to pick
    with pytest.raises(ValueError, match=f"got embedding_dim={embedding_dim}, n_labels={n_labels}"):
        SoftmaxClassifier(embedding_dim, n_labels)


# --- Choosing a loss --------------------------------------------------------------------------


# takes_margin: the two triplet hinges, and only they; whole_batch: MNRL, whose anchors are ranked against
# every example of the batch (the trainer must not split its batch), and only it.
@pytest.mark.parametrize(
    "arch, metric, loss, function, n_texts, label_kind, takes_margin, whole_batch",
    [
        ("siamese", "cosine", None, siamese_cosine_mse_loss, 2, "score", False, False),
        ("siamese", "euclidean", None, siamese_euclidean_mse_loss, 2, "score", False, False),
        ("triplet", "cosine", None, triplet_cosine_loss, 3, None, True, False),
        ("triplet", "euclidean", None, triplet_euclidean_loss, 3, None, True, False),
        ("siamese", "cosine", "softmax", softmax_loss, 2, "class", False, False),
        ("siamese", "cosine", "mnrl", multiple_negatives_ranking_loss, 2, None, False, True),
        ("triplet", "cosine", "mnrl", multiple_negatives_ranking_loss, 3, None, False, True),
    ],
)
def test_select_loss(arch, metric, loss, function, n_texts, label_kind, takes_margin, whole_batch):
    spec = select_loss(arch, metric, loss)
    assert (spec.function, spec.n_texts, spec.label_kind) == (function, n_texts, label_kind)
    assert (spec.takes_margin, spec.whole_batch) == (takes_margin, whole_batch)


def test_select_loss_rejects_unknown_names_and_combinations():
    with pytest.raises(ValueError, match=r"unknown arch 'quadruplet'; valid: 'siamese', 'triplet'"):
        select_loss("quadruplet", "cosine")
    with pytest.raises(ValueError, match=r"unknown metric 'dot'; valid: 'cosine', 'euclidean'"):
        select_loss("siamese", "dot")
    with pytest.raises(ValueError, match=r"unknown loss 'contrastive'; valid: None, 'softmax', 'mnrl'"):
        select_loss("siamese", "cosine", "contrastive")
    with pytest.raises(ValueError, match=r"no loss for arch='triplet' metric='cosine' loss='softmax'; supported: "):
        select_loss("triplet", "cosine", "softmax")
