"""Confidence binning and the per-bin sums every binned calibration error is built from.

Bins follow Guo et al. 2017 (Sec. 2): M equal-width intervals I_m = ((m-1)/M, m/M]; a
confidence of exactly 0 is counted in the first bin (so every value in [0, 1] has a bin).
Per bin only three sums are kept -- count |B_m|, sum of confidences, sum of correct -- which is
what makes the statistics mergeable across batches, windows and replicas (see ``calibkit.stats``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from calibkit.validation import expected


class BinSums(NamedTuple):
    """Per-bin sufficient statistics: count |B_m|, sum of confidences, sum of outcomes."""

    count: np.ndarray  # type: ignore[assignment]  # a field named count shadows tuple.count, deliberately
    confidence_sum: np.ndarray
    outcome_sum: np.ndarray


def equal_width_edges(n_bins: int) -> np.ndarray:
    """The M + 1 edges e_m = m / M of M equal-width bins of [0, 1], each the correctly rounded float of m/M (so 0.6
    is an edge, not 0.6000000000000001).

    References:
        Guo et al. 2017, "On Calibration of Modern Neural Networks", Sec. 2.

    Examples:
        >>> equal_width_edges(5).tolist()
        [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    """
    return np.arange(n_bins + 1) / n_bins


def bin_index(confidence: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The bin of each confidence (any shape): index m in [0, M) of the bin (e_m, e_{m+1}] of the increasing
    ``edges`` that holds it; values <= e_0 go to bin 0.

    Examples:
        >>> bin_index(np.array([0.0, 0.1, 0.5, 0.51, 1.0]), equal_width_edges(2)).tolist()
        [0, 0, 0, 1, 1]
    """
    idx = np.searchsorted(edges, confidence, side="left") - 1
    return np.clip(idx, 0, len(edges) - 2)


def bin_sums(confidence: np.ndarray, outcome: np.ndarray, edges: np.ndarray) -> BinSums:
    """Per bin of ``edges`` the count |B_m|, the sum of confidences (N,) and the sum of their 0/1 outcomes (N,) (1
    for an event, e.g. a correct prediction), each (M,)."""
    idx = bin_index(confidence, edges)
    n_bins = len(edges) - 1
    return BinSums(
        count=np.bincount(idx, minlength=n_bins).astype(np.float64),
        confidence_sum=np.bincount(idx, weights=confidence, minlength=n_bins),
        outcome_sum=np.bincount(idx, weights=outcome, minlength=n_bins),
    )


def classwise_bin_sums(probs: np.ndarray, labels: np.ndarray, edges: np.ndarray) -> BinSums:
    """The bin sums of p_k against 1[y = k] for every class k at once: per class and bin the count, the sum of p_k
    and the number of labels k, each (K, M)."""
    n_classes, n_bins = probs.shape[1], len(edges) - 1
    flat = (bin_index(probs, edges) + n_bins * np.arange(n_classes)).ravel()
    one_hot = (labels[:, None] == np.arange(n_classes)).astype(np.float64).ravel()
    size = n_classes * n_bins
    return BinSums(
        count=np.bincount(flat, minlength=size).astype(np.float64).reshape(n_classes, n_bins),
        confidence_sum=np.bincount(flat, weights=probs.ravel(), minlength=size).reshape(n_classes, n_bins),
        outcome_sum=np.bincount(flat, weights=one_hot, minlength=size).reshape(n_classes, n_bins),
    )


def classwise_error(sums: BinSums) -> float:
    """The classwise calibration error: the mean over classes of each class's l1 calibration error.

    CW-ECE = 1/K sum_k sum_m |B_mk| / N * |freq_k(B_mk) - mean p_k(B_mk)|, from class-wise bin sums (K, M) as
    :func:`classwise_bin_sums` gives them.

    References:
        Kull et al. 2019, "Beyond temperature scaling: Obtaining well-calibrated multi-class probabilities with
        Dirichlet calibration"; Mukhoti et al. 2020, "Calibrating Deep Neural Networks using Focal Loss", Sec. 5.
    """
    return float(np.mean([calibration_error(BinSums(*(a[k] for a in sums))) for k in range(sums.count.shape[0])]))


def calibration_error(sums: BinSums, norm: str = "l1") -> float:
    """The binned calibration error (ECE or MCE) from bin sums, in [0, 1]; ValueError when every bin is empty.

    ``l1``:  ECE = sum_m |B_m| / n * |acc(B_m) - conf(B_m)| = sum_m |S_acc,m - S_conf,m| / n
    ``max``: MCE = max over non-empty bins of |acc(B_m) - conf(B_m)|

    References:
        Naeini, Cooper & Hauskrecht 2015, "Obtaining Well Calibrated Probabilities Using Bayesian Binning";
        Guo et al. 2017, "On Calibration of Modern Neural Networks", Eqs. 3 and 4.

    Examples:
        >>> s = BinSums(np.array([2.0, 2.0]), np.array([0.6, 1.8]), np.array([1.0, 1.0]))
        >>> round(calibration_error(s), 6), round(calibration_error(s, "max"), 6)
        (0.3, 0.4)
    """
    n = sums.count.sum()
    if n <= 0:
        raise ValueError("no samples in any bin: calibration error is undefined for empty input")
    gap = np.abs(sums.outcome_sum - sums.confidence_sum)
    if norm == "l1":
        return float(gap.sum() / n)
    if norm == "max":
        filled = sums.count > 0
        return float(np.max(gap[filled] / sums.count[filled]))
    raise ValueError(expected("norm", "'l1' or 'max'", norm))


def overconfidence(sums: BinSums) -> float:
    """The overconfidence error from bin sums: the ECE of over-confident bins, weighted by confidence, in [0, 1].

    OE = sum_m |B_m| / n * conf(B_m) * max(conf(B_m) - acc(B_m), 0)

    References:
        Thulasidasan et al. 2019, "On Mixup Training: Improved Calibration and Predictive Uncertainty for Deep
        Neural Networks", Eq. 4.
    """
    filled = sums.count > 0
    conf = sums.confidence_sum[filled] / sums.count[filled]
    acc = sums.outcome_sum[filled] / sums.count[filled]
    weight = sums.count[filled] / sums.count.sum()
    return float(np.sum(weight * conf * np.maximum(conf - acc, 0.0)))


def debiased_l2_error(sums: BinSums) -> float:
    """A debiased estimate of the binned l2 calibration error, from bin sums.

    The plug-in (acc_m - conf_m)^2 is biased upwards by the sampling variance of acc_m; the estimator
    subtracts it per bin:

        CE^2 = sum_m |B_m| / n * [(acc_m - conf_m)^2 - acc_m (1 - acc_m) / (|B_m| - 1)]

    Bins with fewer than two samples contribute 0; the result is sqrt(max(CE^2, 0)), in [0, 1]. ValueError when every
    bin is empty.

    References:
        Kumar, Liang & Ma 2019, "Verified Uncertainty Calibration", Sec. 5.
    """
    n = sums.count.sum()
    if n <= 0:
        raise ValueError("no samples in any bin: calibration error is undefined for empty input")
    usable = sums.count >= 2
    count = sums.count[usable]
    acc = sums.outcome_sum[usable] / count
    conf = sums.confidence_sum[usable] / count
    per_bin = (acc - conf) ** 2 - acc * (1.0 - acc) / (count - 1.0)
    return float(np.sqrt(max(np.sum(count / n * per_bin), 0.0)))


class Reliability(NamedTuple):
    """A reliability diagram's data: per bin edges, count, mean confidence and accuracy.

    Empty bins have NaN mean confidence and accuracy (there is nothing to average).
    """

    lower: np.ndarray
    upper: np.ndarray
    count: np.ndarray  # type: ignore[assignment]  # a field named count shadows tuple.count, deliberately
    mean_confidence: np.ndarray
    accuracy: np.ndarray

    def to_records(self) -> list[dict]:
        """One JSON-ready dict per bin (``lo``, ``hi``, ``count``, ``mean_confidence``, ``accuracy``), with None for
        the mean confidence and accuracy of an empty bin."""
        return [
            {
                "lo": float(lo),
                "hi": float(hi),
                "count": int(c),
                "mean_confidence": None if c == 0 else float(mc),
                "accuracy": None if c == 0 else float(acc),
            }
            for lo, hi, c, mc, acc in zip(self.lower, self.upper, self.count, self.mean_confidence, self.accuracy)
        ]


def reliability(sums: BinSums, edges: np.ndarray) -> Reliability:
    """The data of a reliability diagram from bin sums over ``edges``: per bin its edges, count, mean confidence and
    accuracy (NaN for empty bins).

    References:
        Guo et al. 2017, "On Calibration of Modern Neural Networks", Fig. 1.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.where(sums.count > 0, sums.confidence_sum / sums.count, np.nan)
        acc = np.where(sums.count > 0, sums.outcome_sum / sums.count, np.nan)
    return Reliability(edges[:-1].copy(), edges[1:].copy(), sums.count.astype(np.int64), mean_conf, acc)
