"""The reference's own error: how far the validation means may lie from a reference q that averages n rows.

A reference q_k is the mean, over n validation rows, of values in [0, 1] (a class's calibrated probability), so the
validation means E_s[p_k] lie within [q_k - r_k^-, q_k + r_k^+] with probability at least 1 - epsilon over the
draw of the rows, simultaneously for all k (``reference_tolerance``: the Chernoff bound of Hoeffding 1963 for
[0, 1]-valued means, inverted exactly, with a union bound over the 2K one-sided bounds). The label-shift alarm
(``calibkit.label_shift_alarm``) widens its band by these margins, so that traffic from the validation
distribution is inside its null outside an event of probability epsilon. The margins are per class and
asymmetric: a rare class's mean is known more precisely than that of a class near 1/2.

Reference: Hoeffding 1963, "Probability inequalities for sums of bounded random variables", JASA (the Chernoff
bound of Theorem 1).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from calibkit.validation import PROB_SUM_ATOL, check_int, check_unit, expected

__all__ = ["DEFAULT_EPSILON", "check_reference", "reference_tolerance"]

#: The probability of a validation draw whose means miss the reference's margins.
DEFAULT_EPSILON = 0.01

_BISECTIONS = 64  # halvings of [0, 1]: below a double's spacing


def reference_tolerance(n: int, reference, epsilon: float = DEFAULT_EPSILON) -> tuple[np.ndarray, np.ndarray]:
    """(r^-, r^+): how far below and above the reference q the validation means may lie, simultaneously for every
    class, but with probability epsilon over the n rows that q averages.

    For i.i.d. values in [0, 1] of mean mu, P(mean of n >= mu + t) <= exp(-n kl(mu + t || mu)) and likewise below
    (Hoeffding 1963, Theorem 1; kl the Bernoulli relative entropy). Inverting it, mu lies in {mu : n kl(q_k || mu)
    <= log(2K / epsilon)} but with probability epsilon / (2K) on each side, so in all K intervals but with
    probability epsilon (a union bound). The interval is that of a Bernoulli mean, the widest law on [0, 1] for a
    given mean; it is narrow near 0 and 1 and widest at 1/2. r^- = q - its lower end, r^+ = its upper end - q, each
    (K,) and >= 0, for q of ``check_reference``.

    Examples:
        >>> below, above = reference_tolerance(359, [0.1] * 10)
        >>> round(float(below[0]), 3), round(float(above[0]), 3)
        (0.05, 0.073)
    """
    check_int("n", n, 1)
    check_unit("epsilon", epsilon)
    q = check_reference(reference)
    level = math.log(2 * len(q) / float(epsilon)) / int(n)
    return q - _kl_end(q, level, upper=False), _kl_end(q, level, upper=True) - q


def check_reference(reference) -> np.ndarray:
    """q as a float64 (K,) array: K >= 2 finite numbers in [0, 1] summing to 1 (within ``PROB_SUM_ATOL``)."""
    try:
        q = np.asarray(reference, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(expected("reference", "K >= 2 numbers in [0, 1] summing to 1", reference)) from None
    if (
        q.ndim != 1
        or len(q) < 2
        or not np.all(np.isfinite(q))
        or np.any(q < 0)
        or np.any(q > 1)
        or abs(q.sum() - 1.0) > PROB_SUM_ATOL
    ):
        shown = q.tolist() if q.ndim else reference
        raise ValueError(expected("reference", "K >= 2 numbers in [0, 1] summing to 1", shown))
    return q


def _kl_end(q: np.ndarray, level: float, upper: bool) -> np.ndarray:
    """The end of {mu : kl(q || mu) <= level} above q (``upper``) or below it, by bisection."""
    lo, hi = (q.copy(), np.ones_like(q)) if upper else (np.zeros_like(q), q.copy())
    for _ in range(_BISECTIONS):
        mid = (lo + hi) / 2
        inside = _kl(q, mid) <= level
        if upper:
            lo = np.where(inside, mid, lo)
            hi = np.where(inside, hi, mid)
        else:
            hi = np.where(inside, mid, hi)
            lo = np.where(inside, lo, mid)
    return lo if upper else hi


def _kl(q: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """kl(q || mu) of Bernoulli laws, with 0 log 0 = 0 (``scipy.special.xlogy``)."""
    mu = np.clip(mu, 1e-300, 1 - 1e-16)
    return special.xlogy(q, q) - special.xlogy(q, mu) + special.xlogy(1 - q, 1 - q) - special.xlogy(1 - q, 1 - mu)
