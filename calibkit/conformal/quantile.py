"""The split-conformal quantile: the ceil((n + 1)(1 - alpha))-th smallest of n calibration scores.

Marginal (``conformal_quantile``, its rank ``quantile_rank``) or one per class (``classwise_quantiles``, Mondrian).
Vovk, Gammerman & Shafer 2005; Lei, G'Sell, Rinaldo, Tibshirani & Wasserman 2018.
"""

from __future__ import annotations

import math

import numpy as np

from calibkit.conformal._checks import _check_alpha, _check_scores
from calibkit.validation import check_int, check_labels, expected, is_int


def quantile_rank(n: int, alpha: float) -> int:
    """The rank k = ceil((n + 1)(1 - alpha)) of the split-conformal quantile among n calibration scores.

    Computed as k = n + 1 - l with l = #{j in 1..n+1 : j / (n + 1) <= alpha} in floating point, which is the
    ceiling above for alpha's decimal value (ceil(1000 * 0.941) = 941 for n = 999, alpha = 0.059, where a
    floating-point ceil((n + 1) * (1 - alpha)) gives 942) and exactly the rank at which ``p_values`` > alpha
    switches. k = n + 1 means that no calibration score is large enough: the quantile is +inf.

    Examples:
        >>> quantile_rank(99, 0.1), quantile_rank(8, 0.1), quantile_rank(999, 0.059)
        (90, 9, 941)
    """
    if not is_int(n) or n < 1:
        raise ValueError(expected("n", "a positive integer (the number of calibration scores)", n))
    return _rank(int(n), _check_alpha(alpha))


def conformal_quantile(scores, alpha: float) -> float:
    """The split-conformal quantile: the ceil((n + 1)(1 - alpha))-th smallest of n calibration scores, or +inf.

    With exchangeable calibration and test scores, P(s_test <= q) >= 1 - alpha; with scores free of ties
    (randomized APS or RAPS, or LAC on continuous probabilities) the coverage given the calibration set is
    Beta(n + 1 - l, l) distributed, l = floor((n + 1) alpha), so its mean is 1 - l / (n + 1) < 1 - alpha +
    1 / (n + 1). It is +inf when (n + 1)(1 - alpha) > n, i.e. n < 1 / alpha - 1: then every set holds all classes.

    References:
        Vovk, Gammerman & Shafer 2005, "Algorithmic Learning in a Random World"; Lei, G'Sell, Rinaldo, Tibshirani &
        Wasserman 2018, "Distribution-Free Predictive Inference for Regression", JASA (split conformal);
        Vovk 2012, "Conditional Validity of Inductive Conformal Predictors", ACML (the Beta law).

    Examples:
        >>> conformal_quantile([0.3, 0.1, 0.9, 0.5], alpha=0.4)  # ceil(5 * 0.6) = 3rd smallest
        0.5
        >>> conformal_quantile([0.3, 0.1, 0.9, 0.5], alpha=0.1)  # ceil(5 * 0.9) = 5 > 4
        inf
    """
    s = _check_scores(scores)
    k = _rank(len(s), _check_alpha(alpha))
    return math.inf if k > len(s) else float(np.partition(s, k - 1)[k - 1])


def classwise_quantiles(scores, labels, alpha: float, n_classes: int) -> np.ndarray:
    """Class-conditional (Mondrian) quantiles: per class, the split-conformal quantile of that class's scores.

    q_k = the ceil((n_k + 1)(1 - alpha))-th smallest of the n_k scores of the calibration examples labelled k, so
    P(y in C(x) | y = k) >= 1 - alpha for every class k, not only on average over classes. A class with
    n_k < 1 / alpha - 1 examples (none at all included) gets q_k = +inf: it is in every set. Returns (K,).

    References:
        Vovk, Gammerman & Shafer 2005, "Algorithmic Learning in a Random World" (Mondrian conformal prediction);
        Sadinle, Lei & Wasserman 2019, "Least Ambiguous Set-Valued Classifiers with Bounded Error Levels", JASA
        (class-specific coverage).

    Examples:
        >>> classwise_quantiles([0.1, 0.2, 0.3, 0.6, 0.7], [0, 0, 0, 1, 1], alpha=0.5, n_classes=3).tolist()
        [0.2, 0.7, inf]
    """
    sorted_scores, counts = _sort_by_class(scores, labels, n_classes)
    return _classwise_thresholds(sorted_scores, counts, _check_alpha(alpha))


def _rank(n: int, alpha: float) -> int:
    """k = n + 1 - l, l = #{j in 1..n+1 : j / (n + 1) <= alpha}; n may be 0 here (then k = 1: +inf)."""
    m = n + 1
    low = min(max(math.floor(m * alpha), 0), m)
    while low < m and (low + 1) / m <= alpha:
        low += 1
    while low > 0 and low / m > alpha:
        low -= 1
    return m - low


def _classwise_thresholds(sorted_scores: np.ndarray, counts: np.ndarray, alpha: float) -> np.ndarray:
    bounds = np.concatenate([[0], np.cumsum(counts)])
    out = np.full(len(counts), np.inf)
    for k, n_k in enumerate(counts):
        rank = _rank(int(n_k), alpha)
        if rank <= n_k:
            out[k] = sorted_scores[bounds[k] + rank - 1]
    return out


def _sort_by_class(scores, labels, n_classes: int, labels_name: str = "labels") -> tuple[np.ndarray, np.ndarray]:
    """Scores sorted by (class, score) and the count of each class."""
    n_classes = check_int("n_classes", n_classes, 2)
    s = _check_scores(scores)
    try:
        y = check_labels(labels, len(s), n_classes)
    except ValueError as exc:
        raise ValueError(f"{labels_name}: {exc}") from None
    order = np.lexsort((s, y))
    return s[order], np.bincount(y, minlength=n_classes).astype(np.int64)
