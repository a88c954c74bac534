"""Sampling-based inference on binned calibration from bin sums alone (so it works on merged,
windowed statistics of any size without the raw rows).

- ``ece_interval``: a binomial (parametric) bootstrap interval for the binned ECE. Per bin the
  number correct is redrawn as Binomial(n_m, acc_m); the *basic* interval (2 ECE - q_hi,
  2 ECE - q_lo) corrects the upward bias of binned ECE on small windows.
- ``consistency_test``: the calibration test of Broecker & Smith 2007 ("Increasing the
  reliability of reliability diagrams"): under the null hypothesis that confidences are
  calibrated, outcomes are Bernoulli(confidence); consistency resampling draws outcomes from the
  null and compares the observed ECE with that null distribution. From bin sums each bin's
  correct count is drawn as Binomial(n_m, conf_m) with conf_m the bin's mean confidence; since
  sum_i c_i (1 - c_i) <= n_m conf_m (1 - conf_m), this null is at least as wide as the exact
  one, so the test is conservative (it errs towards fewer alarms).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from calibkit.binning import BinSums, calibration_error
from calibkit.validation import check_unit


class EceInterval(NamedTuple):
    """Observed binned ECE and its bias-corrected (basic) bootstrap interval."""

    ece: float
    low: float
    high: float
    level: float


def _ece_of_draws(correct_draws: np.ndarray, sums: BinSums) -> np.ndarray:
    return np.abs(correct_draws - sums.confidence_sum).sum(axis=-1) / sums.count.sum()


def _observed(sums: BinSums, what: str) -> tuple[float, np.ndarray]:
    """(the observed ECE, the bin counts as integers); a ValueError names ``what`` when every bin is empty."""
    if sums.count.sum() <= 0:
        raise ValueError(f"no samples in any bin: {what} is undefined for empty input")
    return calibration_error(sums), sums.count.astype(np.int64)


def ece_interval(
    sums: BinSums, level: float = 0.90, n_resamples: int = 1000, seed: int | np.random.Generator | None = 0
) -> EceInterval:
    """A binomial (parametric) bootstrap interval of the binned ECE, from bin sums alone.

    ECE = sum_m |S_correct,m - S_conf,m| / n. Per bin the number correct is redrawn as Binomial(n_m, acc_m), and
    the basic interval (2 ECE - q_hi, 2 ECE - q_lo), cut to [0, 1], corrects the upward bias of the binned ECE on
    small windows.

    References:
        Davison & Hinkley 1997, "Bootstrap Methods and their Application", Sec. 2.2 (parametric bootstrap) and
        5.2 (basic interval).
    """
    observed, count = _observed(sums, "the ECE interval")
    level = check_unit("level", level)
    rng = np.random.default_rng(seed)
    accuracy = np.divide(sums.outcome_sum, sums.count, out=np.zeros_like(sums.count), where=sums.count > 0)
    draws = _ece_of_draws(rng.binomial(count, accuracy, size=(n_resamples, len(count))), sums)
    low, high = np.clip(2.0 * observed - np.quantile(draws, [(1.0 + level) / 2.0, (1.0 - level) / 2.0]), 0.0, 1.0)
    return EceInterval(observed, float(low), float(high), level)


def consistency_test(sums: BinSums, n_resamples: int = 1000, seed: int | np.random.Generator | None = 0) -> float:
    """The p-value of the observed ECE under "the confidences are calibrated" (consistency resampling).

    Each bin's correct count is drawn as Binomial(n_m, conf_m), conf_m its mean confidence, and
    p = (1 + #{null ECE >= observed ECE}) / (1 + n_resamples), never 0. The null is at least as wide as the
    exact one, so the test errs towards fewer rejections (see the module docstring).

    References:
        Broecker & Smith 2007, "Increasing the reliability of reliability diagrams".
    """
    observed, count = _observed(sums, "the calibration test")
    rng = np.random.default_rng(seed)
    mean_conf = np.divide(sums.confidence_sum, sums.count, out=np.zeros_like(sums.count), where=sums.count > 0)
    null = _ece_of_draws(rng.binomial(count, np.clip(mean_conf, 0.0, 1.0), size=(n_resamples, len(count))), sums)
    return float((1 + np.count_nonzero(null >= observed - 1e-12)) / (1 + n_resamples))
