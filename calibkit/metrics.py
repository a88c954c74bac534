"""Calibration and proper-scoring metrics on a batch of predictions.

Every function takes ``probs`` (N, K) -- or (N,) positive-class probabilities for a binary
problem -- and integer ``labels`` (N,). Top-label confidence is max_k p_k and a prediction is
correct when argmax_k p_k equals the label (Guo et al. 2017, Sec. 2). Binned metrics use
``n_bins`` = 15 equal-width bins by default, as in Mukhoti et al. 2020.

>>> probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.4, 0.6]])
>>> labels = np.array([0, 1, 1, 1])
>>> # bins (.4,.6]: conf .6 right; (.6,.8]: .8 wrong, .7 right; (.8,1]: .9 right
>>> round(ece(probs, labels, n_bins=5), 6)    # (|1 - .6| + |1 - 1.5| + |1 - .9|) / 4
0.25
"""

from __future__ import annotations

import numpy as np

from calibkit import binning
from calibkit.validation import check_n_bins, check_probs_labels

__all__ = [
    "accuracy",
    "adaptive_ece",
    "brier",
    "classwise_ece",
    "debiased_ece",
    "ece",
    "mce",
    "nll",
    "overconfidence_error",
    "reliability_bins",
    "top_label",
]


def top_label(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Confidence max_k p_k and predicted class argmax_k p_k (ties go to the lowest index)."""
    return probs.max(axis=1), probs.argmax(axis=1)


def _top_label_sums(probs, labels, n_bins: int) -> tuple[binning.BinSums, np.ndarray]:
    p, y = check_probs_labels(probs, labels)
    edges = binning.equal_width_edges(check_n_bins(n_bins))
    confidence, predicted = top_label(p)
    return binning.bin_sums(confidence, (predicted == y).astype(np.float64), edges), edges


def ece(probs, labels, n_bins: int = 15) -> float:
    """Expected calibration error (Guo et al. 2017, Eq. 3).

    ECE = sum_m |B_m|/N * |acc(B_m) - conf(B_m)| over M equal-width bins of top-label confidence.
    """
    return binning.calibration_error(_top_label_sums(probs, labels, n_bins)[0], "l1")


def mce(probs, labels, n_bins: int = 15) -> float:
    """Maximum calibration error (Guo et al. 2017, Eq. 4): max over non-empty bins of |acc - conf|."""
    return binning.calibration_error(_top_label_sums(probs, labels, n_bins)[0], "max")


def adaptive_ece(probs, labels, n_bins: int = 15) -> float:
    """Adaptive ECE (Mukhoti et al. 2020, Sec. 5): ECE over equal-mass bins.

    Samples sorted by confidence are split into ``n_bins`` consecutive groups whose sizes differ
    by at most one; AdaECE = sum_m |B_m|/N * |acc(B_m) - conf(B_m)|. Ties in confidence are
    ordered incorrect-before-correct so the result does not depend on the order of the input.
    """
    p, y = check_probs_labels(probs, labels)
    n_bins = check_n_bins(n_bins)
    confidence, predicted = top_label(p)
    correct = (predicted == y).astype(np.float64)
    order = np.lexsort((correct, confidence))
    gap = sum(abs(correct[chunk].sum() - confidence[chunk].sum()) for chunk in np.array_split(order, n_bins))
    return float(gap / len(y))


def classwise_ece(probs, labels, n_bins: int = 15) -> float:
    """Classwise ECE (Kull et al. 2019; Mukhoti et al. 2020, Sec. 5).

    CW-ECE = 1/K sum_k sum_m |B_mk|/N * |freq_k(B_mk) - mean p_k(B_mk)|, with bins B_mk over
    p_k for every sample. K is the width of ``probs``, not the number of labels seen.
    """
    p, y = check_probs_labels(probs, labels)
    edges = binning.equal_width_edges(check_n_bins(n_bins))
    return binning.classwise_error(binning.classwise_bin_sums(p, y, edges))


def debiased_ece(probs, labels, n_bins: int = 15) -> float:
    """Debiased top-label l2 calibration error (Kumar et al. 2019); see ``binning.debiased_l2_error``."""
    return binning.debiased_l2_error(_top_label_sums(probs, labels, n_bins)[0])


def overconfidence_error(probs, labels, n_bins: int = 15) -> float:
    """Overconfidence error (Thulasidasan et al. 2019): ECE restricted to over-confident bins,
    weighted by confidence; see ``binning.overconfidence``."""
    return binning.overconfidence(_top_label_sums(probs, labels, n_bins)[0])


def reliability_bins(probs, labels, n_bins: int = 15) -> binning.Reliability:
    """Per-bin lower/upper edge, count, mean confidence and accuracy (a reliability diagram)."""
    sums, edges = _top_label_sums(probs, labels, n_bins)
    return binning.reliability(sums, edges)


def accuracy(probs, labels) -> float:
    """Fraction of samples whose argmax class equals the label."""
    p, y = check_probs_labels(probs, labels)
    return float(np.mean(p.argmax(axis=1) == y))


def nll(probs, labels) -> float:
    """Negative log-likelihood -1/N sum_i log p_{i, y_i}.

    Probabilities are clipped below at machine epsilon (as scikit-learn's log_loss does), so a
    confident mistake costs at most -log(eps) ~ 36 instead of an infinite score.
    """
    return float(np.mean(nll_terms(probs, labels)))


def nll_terms(probs, labels) -> np.ndarray:
    """Per-sample terms -log p_{i, y_i} of :func:`nll` (clipped the same way), e.g. to store with each label."""
    p, y = check_probs_labels(probs, labels)
    return -np.log(np.clip(p[np.arange(len(y)), y], np.finfo(np.float64).eps, 1.0))


def brier(probs, labels) -> float:
    """Brier score as Brier 1950 defines it: 1/N sum_i sum_k (p_ik - 1[y_i = k])^2, in [0, 2].

    A binary (N,) input is the two columns [1 - p, p] like everywhere in calibkit, so its score is
    twice the one-column (p - y)^2 that scikit-learn's ``brier_score_loss`` reports.
    """
    return float(np.mean(brier_terms(probs, labels)))


def brier_terms(probs, labels) -> np.ndarray:
    """Per-sample terms sum_k (p_ik - 1[y_i = k])^2 of :func:`brier`."""
    p, y = check_probs_labels(probs, labels)
    p[np.arange(len(y)), y] -= 1.0
    return np.sum(p**2, axis=1)
