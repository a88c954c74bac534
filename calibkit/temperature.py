"""Temperature scaling (Guo et al. 2017, Sec. 4.2).

One scalar T > 0 divides every logit before the softmax: q = softmax(z / T). T = 1 is the
identity, T > 1 softens over-confident predictions, and the argmax never changes. T is fitted
on a held-out validation split, by NLL (Guo et al.) or by a grid search on ECE (Mukhoti et
al. 2020, Sec. 5: "the temperature ... that gives the lowest ECE on the validation set").
"""

from __future__ import annotations

import numpy as np
import scipy  # its submodules load on first use (scipy.optimize): serving starts without it, a refit loads it

from calibkit import binning
from calibkit.validation import check_logits, check_logits_labels, expected

#: Search range of the NLL fit; a fit that lands on a bound means the data want a more extreme T.
T_MIN, T_MAX = 1e-2, 1e2
#: Mukhoti et al.'s grid for the ECE objective: 0.05, 0.10, ..., 10.0.
ECE_GRID = np.round(np.arange(1, 201) * 0.05, 10)


def softmax(logits) -> np.ndarray:
    """Softmax over the last axis, softmax(z)_k = exp(z_k) / sum_j exp(z_j), computed stably (scipy.special)."""
    return scipy.special.softmax(np.asarray(logits, dtype=np.float64), axis=-1)


def apply_temperature(logits, temperature: float) -> np.ndarray:
    """Calibrated probabilities by temperature scaling, T > 0: q = softmax(z / T) for logits (N, K), and the
    positive-class q = sigmoid(z / T) for (N,) single binary logits.

    References:
        Guo et al. 2017, "On Calibration of Modern Neural Networks", Sec. 4.2.

    Examples:
        >>> apply_temperature(np.array([[2.0, 0.0]]), 2.0).round(6).tolist()
        [[0.731059, 0.268941]]
        >>> apply_temperature(np.array([0.0, 4.0]), 2.0).round(6).tolist()
        [0.5, 0.880797]
    """
    z = check_logits(logits)
    t = _check_temperature(temperature)
    if z.ndim == 1:
        return scipy.special.expit(z / t)
    return softmax(z / t)


def logits_from_probabilities(probs, temperature: float) -> np.ndarray:
    """The logits that temperature scaling turned into ``probs``, up to a constant per row: q = softmax(z / T)
    gives log q = z / T - logsumexp(z / T), so z = T * log q + c, and softmax(z / T') is the same for every c.
    Returns T * log q (N, K), each row shifted to a maximum of 0; every probability must be positive.

    References:
        Guo et al. 2017, Sec. 4.2.
    """
    logq = np.log(np.asarray(probs, dtype=np.float64))
    return temperature * (logq - logq.max(axis=-1, keepdims=True))


def recovered_by_temperature(logits, probs, temperature: float, rtol: float = 1e-5) -> np.ndarray:
    """Which rows' logits ``logits_from_probabilities(probs, T)`` gives back up to a constant: every difference
    z_k - z_j within ``rtol * (1 + max |z|)`` of the recovered one's. Rows with a zero or non-finite probability
    (float32 underflow) or non-finite logits are not recovered. A boolean mask (N,).
    """
    z = np.asarray(logits, dtype=np.float64)
    p = np.asarray(probs, dtype=np.float64)
    usable = np.all(p > 0, axis=-1) & np.all(np.isfinite(p), axis=-1) & np.all(np.isfinite(z), axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        back = logits_from_probabilities(np.where(usable[:, None], p, 1.0), temperature)
    shifted = z - z.max(axis=-1, keepdims=True)
    scale = 1.0 + np.abs(np.where(np.isfinite(z), z, 0.0)).max(axis=-1)
    return usable & (np.abs(shifted - back).max(axis=-1) <= rtol * scale)


def fit_temperature(logits, labels, objective: str = "nll") -> float:
    """Fit the temperature T > 0 of temperature scaling on held-out (validation) logits and labels.

    ``objective="nll"``: T* = argmin_T -1/N sum_i log softmax(z_i / T)_{y_i}, minimised over log T in
    [log T_MIN, log T_MAX] with scipy's bounded Brent method. NLL is convex in 1/T, hence unimodal in log T, so
    the 1-D search finds the global minimum. ``objective="ece"``: the T of ``ECE_GRID`` with the lowest 15-bin
    ECE; ties go to the smallest T. Logits are (N, K), or (N,) for a single-logit binary model.

    References:
        Guo et al. 2017, "On Calibration of Modern Neural Networks", Sec. 4.2 (NLL);
        Mukhoti et al. 2020, "Calibrating Deep Neural Networks using Focal Loss", Sec. 5 (ECE grid).
    """
    z, y = check_logits_labels(logits, labels)
    if z.ndim == 1:
        z = np.stack([np.zeros_like(z), z], axis=1)
    # d = z - max_k z <= 0, so no exp below overflows; the argmax, hence correctness, is fixed.
    d = z - z.max(axis=1, keepdims=True)
    if objective == "nll":
        return _fit_nll(d, y)
    if objective == "ece":
        return _fit_ece(d, (z.argmax(axis=1) == y).astype(np.float64))
    raise ValueError(expected("objective", "'nll' or 'ece'", objective))


def _fit_ece(d: np.ndarray, correct: np.ndarray) -> float:
    # Top-label confidence of softmax(z / T) is 1 / sum_k exp(d_k / T); the ECE is the same
    # binned error as metrics.ece, without recomputing the full softmax for each grid point.
    edges = binning.equal_width_edges(15)
    scores = [
        binning.calibration_error(binning.bin_sums(1.0 / np.exp(d / t).sum(axis=1), correct, edges)) for t in ECE_GRID
    ]
    return float(ECE_GRID[int(np.argmin(scores))])


def _fit_nll(d: np.ndarray, y: np.ndarray) -> float:
    # With beta = 1/T: NLL(beta) = mean_i log sum_k exp(beta d_ik) - beta mean_i d_{i, y_i}.
    d_true_mean = float(np.mean(d[np.arange(len(y)), y]))

    def nll_of_log_t(log_t: float) -> float:
        beta = np.exp(-log_t)
        return float(np.mean(np.log(np.exp(beta * d).sum(axis=1)))) - beta * d_true_mean

    result = scipy.optimize.minimize_scalar(
        nll_of_log_t, bounds=(np.log(T_MIN), np.log(T_MAX)), method="bounded", options={"xatol": 1e-6}
    )
    return float(np.exp(result.x))


def _check_temperature(temperature) -> float:
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        raise ValueError(expected("temperature", "a positive finite number", temperature)) from None
    if not np.isfinite(t) or t <= 0:
        raise ValueError(expected("temperature", "a positive finite number", temperature))
    return t
