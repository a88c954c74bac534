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

    count: np.ndarray
    confidence_sum: np.ndarray
    outcome_sum: np.ndarray


def equal_width_edges(n_bins: int) -> np.ndarray:
    """Edges e_m = m / M, each the correctly rounded float of m/M (so 0.6 is an edge, not 0.6000000000000001).

    >>> equal_width_edges(5).tolist()
    [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    """
    return np.arange(n_bins + 1) / n_bins


def bin_index(confidence: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Index m of the bin (e_m, e_{m+1}] holding each confidence; values <= e_0 go to bin 0.

    >>> bin_index(np.array([0.0, 0.1, 0.5, 0.51, 1.0]), equal_width_edges(2)).tolist()
    [0, 0, 0, 1, 1]
    """
    idx = np.searchsorted(edges, confidence, side="left") - 1
    return np.clip(idx, 0, len(edges) - 2)


def bin_sums(confidence: np.ndarray, outcome: np.ndarray, edges: np.ndarray) -> BinSums:
    """Sums per bin of a confidence vector and its 0/1 outcome vector (e.g. correctness)."""
    idx = bin_index(confidence, edges)
    n_bins = len(edges) - 1
    return BinSums(
        count=np.bincount(idx, minlength=n_bins).astype(np.float64),
        confidence_sum=np.bincount(idx, weights=confidence, minlength=n_bins),
        outcome_sum=np.bincount(idx, weights=outcome, minlength=n_bins),
    )


def classwise_bin_sums(probs: np.ndarray, labels: np.ndarray, edges: np.ndarray) -> BinSums:
    """Bin sums of p_k against 1[y = k] for every class k at once: arrays of shape (K, M)."""
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
    """Mean over classes of the per-class l1 calibration error, from (K, M) class-wise bin sums."""
    return float(np.mean([calibration_error(BinSums(*(a[k] for a in sums))) for k in range(sums.count.shape[0])]))


def calibration_error(sums: BinSums, norm: str = "l1") -> float:
    """Binned calibration error from bin sums (Guo et al. 2017, Eqs. 2 and 3).

    ``l1``:  ECE = sum_m |B_m|/n * |acc(B_m) - conf(B_m)| = sum_m |S_acc,m - S_conf,m| / n
    ``max``: MCE = max over non-empty bins of |acc(B_m) - conf(B_m)|

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
    """Overconfidence error (Thulasidasan et al. 2019, Eq. 4).

    OE = sum_m |B_m|/n * conf(B_m) * max(conf(B_m) - acc(B_m), 0)
    """
    filled = sums.count > 0
    conf = sums.confidence_sum[filled] / sums.count[filled]
    acc = sums.outcome_sum[filled] / sums.count[filled]
    weight = sums.count[filled] / sums.count.sum()
    return float(np.sum(weight * conf * np.maximum(conf - acc, 0.0)))


def debiased_l2_error(sums: BinSums) -> float:
    """Debiased estimate of the binned l2 calibration error (Kumar et al. 2019, Sec. 5).

    The plug-in (acc_m - conf_m)^2 is biased upwards by the sampling variance of acc_m; the
    estimator subtracts it per bin:
        CE^2 = sum_m |B_m|/n * [(acc_m - conf_m)^2 - acc_m (1 - acc_m) / (|B_m| - 1)]
    Bins with fewer than two samples contribute 0; the result is sqrt(max(CE^2, 0)).
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
    count: np.ndarray
    mean_confidence: np.ndarray
    accuracy: np.ndarray

    def to_records(self) -> list[dict]:
        """One JSON-ready dict per bin, with ``None`` where a bin is empty."""
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
    """Per-bin mean confidence and accuracy from bin sums."""
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.where(sums.count > 0, sums.confidence_sum / sums.count, np.nan)
        acc = np.where(sums.count > 0, sums.outcome_sum / sums.count, np.nan)
    return Reliability(edges[:-1].copy(), edges[1:].copy(), sums.count.astype(np.int64), mean_conf, acc)
