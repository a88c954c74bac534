"""Label-free signals that calibration may be about to break.

- ``confidence_shift``: two-sample Kolmogorov-Smirnov test (scipy) of recent calibrated
  confidences against the reference confidences of the validation split. Under dataset shift the
  distribution of confidences moves (Ovadia et al. 2019) before any label arrives.
- ``accuracy_gap``: the accuracy a calibrated model expects (its mean confidence) against the
  accuracy observed on labelled traffic, with a normal-approximation z statistic.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy  # its submodules load on first use (scipy.stats): serving starts without them

from calibkit.validation import expected


class ShiftTest(NamedTuple):
    """A two-sample KS test of recent against reference confidences: D, its p-value, sizes and means."""

    statistic: float
    p_value: float
    n_recent: int
    n_reference: int
    recent_mean: float
    reference_mean: float


def confidence_shift(recent, reference) -> ShiftTest:
    """A two-sample Kolmogorov-Smirnov test of recent confidences against the reference ones.

    D = sup_c |F_recent(c) - F_reference(c)|, the largest gap between the two empirical CDFs (scipy's ks_2samp), of
    recent calibrated top-label confidences and the reference ones (the validation split's), both non-empty.

    References:
        Ovadia et al. 2019, "Can You Trust Your Model's Uncertainty? Evaluating Predictive Uncertainty Under
        Dataset Shift" (confidences move under dataset shift).
    """
    recent, reference = np.asarray(recent, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    for name, sample in (("recent", recent), ("reference", reference)):
        if len(sample) == 0:
            raise ValueError(expected(name, "a non-empty array of confidences", sample.tolist()))
    result = scipy.stats.ks_2samp(recent, reference)
    return ShiftTest(
        float(result.statistic),
        float(result.pvalue),
        len(recent),
        len(reference),
        float(recent.mean()),
        float(reference.mean()),
    )


class AccuracyGap(NamedTuple):
    """The accuracy a calibrated model expects (its mean confidence), the accuracy observed and their z score."""

    expected: float
    observed: float
    z: float


def accuracy_gap(n: int, confidence_sum: float, correct_sum: float) -> AccuracyGap:
    """The accuracy a calibrated model expects against the accuracy observed on labelled traffic.

    z = (observed - expected) / sqrt(e (1 - e) / n), with e = expected = mean confidence (a normal approximation),
    from n >= 1 labelled predictions, the sum of their top-label confidences and the number that were right.
    """
    if n <= 0:
        raise ValueError(expected("n", "at least 1 (one labelled prediction)", n))
    mean_confidence, observed = confidence_sum / n, correct_sum / n
    spread = np.sqrt(max(mean_confidence * (1.0 - mean_confidence), 1e-12) / n)
    return AccuracyGap(float(mean_confidence), float(observed), float((observed - mean_confidence) / spread))
