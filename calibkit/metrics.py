"""Calibration and proper-scoring metrics on a batch of predictions.

Every function takes ``probs`` (N, K) -- or (N,) positive-class probabilities for a binary
problem -- and integer ``labels`` (N,), checked by ``calibkit.validation`` (a ``ValueError`` names the argument at
fault, or ``n_bins`` when it is not a positive integer). Top-label confidence is max_k p_k and a prediction is
correct when argmax_k p_k equals the label (Guo et al. 2017, Sec. 2). Binned metrics use
``n_bins`` = M = 15 equal-width bins by default, as in Mukhoti et al. 2020.

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
    """(confidence max_k p_k, predicted class argmax_k p_k) of each row of checked ``probs``; ties go to the lowest
    index."""
    return probs.max(axis=1), probs.argmax(axis=1)


def _top_label_sums(probs, labels, n_bins: int) -> tuple[binning.BinSums, np.ndarray]:
    p, y = check_probs_labels(probs, labels)
    edges = binning.equal_width_edges(check_n_bins(n_bins))
    confidence, predicted = top_label(p)
    return binning.bin_sums(confidence, (predicted == y).astype(np.float64), edges), edges


def ece(probs, labels, n_bins: int = 15) -> float:
    """Expected calibration error of the top-label confidence, in [0, 1].

    ECE = sum_m |B_m| / N * |acc(B_m) - conf(B_m)|, over M equal-width bins B_m of top-label confidence.

    References:
        Naeini, Cooper & Hauskrecht 2015, "Obtaining Well Calibrated Probabilities Using Bayesian Binning";
        Guo et al. 2017, "On Calibration of Modern Neural Networks", Eq. 3.
    """
    return binning.calibration_error(_top_label_sums(probs, labels, n_bins)[0], "l1")


def mce(probs, labels, n_bins: int = 15) -> float:
    """Maximum calibration error of the top-label confidence, in [0, 1].

    MCE = max_m |acc(B_m) - conf(B_m)|, over the non-empty ones of M equal-width bins B_m.

    References:
        Naeini, Cooper & Hauskrecht 2015, "Obtaining Well Calibrated Probabilities Using Bayesian Binning";
        Guo et al. 2017, "On Calibration of Modern Neural Networks", Eq. 4.
    """
    return binning.calibration_error(_top_label_sums(probs, labels, n_bins)[0], "max")


def adaptive_ece(probs, labels, n_bins: int = 15) -> float:
    """Adaptive ECE: the ECE over M equal-mass bins of top-label confidence, in [0, 1].

    AdaECE = sum_m |B_m| / N * |acc(B_m) - conf(B_m)|, where the samples sorted by confidence are split into
    M consecutive groups B_m whose sizes differ by at most one. Ties in confidence are ordered
    incorrect-before-correct, so the result does not depend on the order of the input.

    References:
        Mukhoti et al. 2020, "Calibrating Deep Neural Networks using Focal Loss", Sec. 5.
    """
    p, y = check_probs_labels(probs, labels)
    n_bins = check_n_bins(n_bins)
    confidence, predicted = top_label(p)
    correct = (predicted == y).astype(np.float64)
    order = np.lexsort((correct, confidence))
    gap = sum(abs(correct[chunk].sum() - confidence[chunk].sum()) for chunk in np.array_split(order, n_bins))
    return float(gap / len(y))


def classwise_ece(probs, labels, n_bins: int = 15) -> float:
    """Classwise ECE: the ECE of every class probability, averaged over the classes, in [0, 1].

    CW-ECE = 1/K sum_k sum_m |B_mk| / N * |freq_k(B_mk) - mean p_k(B_mk)|, with M equal-width bins B_mk of
    p_k over every sample. K is the width of ``probs``, not the number of labels seen.

    References:
        Kull et al. 2019, "Beyond temperature scaling: Obtaining well-calibrated multi-class probabilities with
        Dirichlet calibration"; Mukhoti et al. 2020, "Calibrating Deep Neural Networks using Focal Loss", Sec. 5.
    """
    p, y = check_probs_labels(probs, labels)
    edges = binning.equal_width_edges(check_n_bins(n_bins))
    return binning.classwise_error(binning.classwise_bin_sums(p, y, edges))


def debiased_ece(probs, labels, n_bins: int = 15) -> float:
    """Debiased l2 calibration error of the top-label confidence, in [0, 1].

    CE^2 = sum_m |B_m| / N * [(acc_m - conf_m)^2 - acc_m (1 - acc_m) / (|B_m| - 1)], over M equal-width bins
    (those with fewer than two samples add 0); the result is sqrt(max(CE^2, 0)). See
    ``binning.debiased_l2_error``.

    References:
        Kumar, Liang & Ma 2019, "Verified Uncertainty Calibration", Sec. 5.
    """
    return binning.debiased_l2_error(_top_label_sums(probs, labels, n_bins)[0])


def overconfidence_error(probs, labels, n_bins: int = 15) -> float:
    """Overconfidence error: the ECE restricted to over-confident bins, weighted by confidence, in [0, 1].

    OE = sum_m |B_m| / N * conf(B_m) * max(conf(B_m) - acc(B_m), 0), over M equal-width bins B_m.

    References:
        Thulasidasan et al. 2019, "On Mixup Training: Improved Calibration and Predictive Uncertainty for Deep
        Neural Networks", Eq. 4.
    """
    return binning.overconfidence(_top_label_sums(probs, labels, n_bins)[0])


def reliability_bins(probs, labels, n_bins: int = 15) -> binning.Reliability:
    """The data of a reliability diagram: per equal-width bin of top-label confidence its edges, count, mean
    confidence and accuracy (NaN for empty bins).

    References:
        Guo et al. 2017, "On Calibration of Modern Neural Networks", Fig. 1.
    """
    sums, edges = _top_label_sums(probs, labels, n_bins)
    return binning.reliability(sums, edges)


def accuracy(probs, labels) -> float:
    """The fraction of samples whose argmax class is the label."""
    p, y = check_probs_labels(probs, labels)
    return float(np.mean(p.argmax(axis=1) == y))


def nll(probs, labels) -> float:
    """Negative log-likelihood of the labels, the mean of :func:`nll_terms`.

    NLL = -1/N sum_i log p_{i, y_i}. Probabilities are clipped below at machine epsilon (as scikit-learn's
    log_loss does), so a confident mistake costs at most -log(eps) ~ 36 instead of an infinite score.

    References:
        Guo et al. 2017, "On Calibration of Modern Neural Networks", Sec. 2 (NLL as a measure of calibration).
    """
    return float(np.mean(nll_terms(probs, labels)))


def nll_terms(probs, labels) -> np.ndarray:
    """Per-sample terms -log p_{i, y_i} (N,) of :func:`nll`, clipped the same way (e.g. to store with each label)."""
    p, y = check_probs_labels(probs, labels)
    return -np.log(np.clip(p[np.arange(len(y)), y], np.finfo(np.float64).eps, 1.0))


def brier(probs, labels) -> float:
    """Brier score, as Brier 1950 defines it, in [0, 2]: the mean of :func:`brier_terms`.

    BS = 1/N sum_i sum_k (p_ik - 1[y_i = k])^2. A binary (N,) input is the two columns [1 - p, p], like
    everywhere in calibkit, so its score is twice the one-column (p - y)^2 of scikit-learn's
    ``brier_score_loss``.

    References:
        Brier 1950, "Verification of Forecasts Expressed in Terms of Probability".
    """
    return float(np.mean(brier_terms(probs, labels)))


def brier_terms(probs, labels) -> np.ndarray:
    """Per-sample terms sum_k (p_ik - 1[y_i = k])^2 (N,) of :func:`brier`, each in [0, 2]."""
    p, y = check_probs_labels(probs, labels)
    p[np.arange(len(y)), y] -= 1.0
    return np.sum(p**2, axis=1)
