"""Split conformal sets under label shift: the weighted conformal quantile, one threshold per candidate label.

Under label shift the class priors move from pi_s (calibration) to pi_t (serving) while p(x | y) stays. The
calibration rows are then no longer exchangeable with the served ones, but they are weighted exchangeable, with
the likelihood ratio dP_t / dP_s (x, y) = w_y = pi_t(y) / pi_s(y), a function of the label alone (Tibshirani, Foygel
Barber, Candès & Ramdas 2019). For a test input and a candidate label y, the threshold is the (1 - alpha) quantile
of the weighted distribution

    sum_i w_{y_i} / (W + w_y) delta_{s_i} + w_y / (W + w_y) delta_{+inf},    W = sum_i w_{y_i},

over the n calibration scores s_i = s(x_i, y_i), and the set is C(x) = {y : s(x, y) <= q_y}. With the true ratios,
P_t(y in C(x)) >= 1 - alpha (Podkopaev & Ramdas 2021). The threshold depends on the candidate only through w_y, so
there is one per class (``label_shift_thresholds``), and the sets are those of ``prediction_sets`` with per-class
thresholds, as Mondrian sets are: LAC, APS and RAPS, randomized with draws ``u`` or not, and the floor sets.

**The quantile.** q_y = s_(k) for the smallest k whose weighted mass above, (w_y + sum_{j > k} w_(j)) / (W + w_y),
is at most alpha (the s_(j) ascending, w_(j) their rows' weights); +inf when no k qualifies, that is when the atom
at +inf alone weighs more than alpha. That is the comparison ``quantile_rank`` makes, j / (n + 1) <= alpha, so with
every weight 1 the thresholds are ``conformal_quantile`` of the scores, bit for bit. Rows of weight 0 carry no mass
(a class absent from serving); a class without calibration rows only adds its weight to the atom at +inf; when
W + w_y = 0 there is nothing to go on and q_y = +inf. Scaling every weight by one factor changes nothing, so the
ratios may come unnormalised.

**Estimated weights.** The ratios are rarely known: ``calibkit.label_shift.em_priors`` estimates pi_t from unlabelled
traffic, and its ``weights`` are the ratios to the source priors. The guarantee then holds up to the estimate's
error (Podkopaev & Ramdas 2021 bound the loss by the total variation between the true and estimated weighted
distributions).

**With the adaptive threshold** (``calibkit.conformal.adaptive``). The weights correct, before any label, the part of
a shift that the priors explain; an adaptive rule corrects, from the labels, what is left. Adaptive conformal
inference (Gibbs & Candès 2021) composes directly: its level alpha_t feeds ``label_shift_thresholds`` in place of
alpha (full at alpha_t <= 0, empty at alpha_t >= 1, as ``aci_thresholds``) and it folds the weighted set's miss
err_t = 1[s_t > q_{y_t}(alpha_t)]; its bound holds for any sets nested in the level and full and empty at those ends.
The served ``LogQuantileTracker`` folds the misses of its own marginal threshold: its bound is not about weighted sets.

References:
    Tibshirani, Foygel Barber, Candès & Ramdas 2019, "Conformal Prediction Under Covariate Shift", NeurIPS (weighted
    exchangeability, the weighted quantile); Podkopaev & Ramdas 2021, "Distribution-free uncertainty quantification
    for classification under label shift", UAI; Gibbs & Candès 2021, "Adaptive Conformal Inference Under
    Distribution Shift", NeurIPS.

>>> scores, labels = [0.1, 0.2, 0.3, 0.6, 0.7], [0, 0, 0, 1, 1]
>>> label_shift_quantiles(scores, labels, [1.0, 1.0], alpha=0.4, n_classes=2).tolist()  # conformal_quantile: 0.6
[0.6, 0.6]
>>> label_shift_quantiles(scores, labels, [1.0, 3.0], alpha=0.4, n_classes=2).tolist()  # class 1 more common
[0.6, 0.7]
"""

from __future__ import annotations

import numpy as np

from calibkit.conformal._checks import _check_alpha, _check_scores
from calibkit.conformal.quantile import _sort_by_class
from calibkit.validation import expected

__all__ = ["label_shift_quantiles", "label_shift_thresholds"]


def label_shift_quantiles(scores, labels, weights, alpha: float, n_classes: int) -> np.ndarray:
    """The weighted conformal thresholds under label shift (K,), from labelled calibration scores.

    ``label_shift_thresholds`` of the scores sorted within each class, as ``classwise_quantiles`` is to
    ``SplitConformal.fit(..., classwise=True)``: q_y for every candidate class y, +inf where the set always holds y.

    References:
        Podkopaev & Ramdas 2021, "Distribution-free uncertainty quantification for classification under label
        shift", UAI.
    """
    sorted_scores, counts = _sort_by_class(scores, labels, n_classes)
    return label_shift_thresholds(sorted_scores, counts, weights, alpha)


def label_shift_thresholds(sorted_scores, class_counts, weights, alpha: float) -> np.ndarray:
    """The weighted conformal thresholds under label shift (K,): q_y, the (1 - alpha) quantile of the calibration
    scores weighted by their labels' w, with an atom w_y at +inf (the module docstring gives the formula).

    Takes the scores as a classwise ``SplitConformal`` keeps them: sorted within each class, class by class, with
    the count of each class (``calibrator.scores``, ``calibrator.class_counts``). Vectorized over the classes: one
    stable sort of the scores, one running sum of their weights, and a binary search per class on the weighted mass
    above each score, which falls along the sorted scores (in floating point too: sums of terms >= 0 and a division
    by a positive number keep their order). ``weights`` are the ratios w_y = pi_t(y) / pi_s(y) (K,), finite, >= 0,
    not all 0. Each threshold is a calibration score or +inf.

    References:
        Podkopaev & Ramdas 2021, "Distribution-free uncertainty quantification for classification under label
        shift", UAI; Tibshirani, Foygel Barber, Candès & Ramdas 2019, "Conformal Prediction Under Covariate
        Shift", NeurIPS.

    Examples:
        >>> label_shift_thresholds([0.1, 0.2, 0.3, 0.6, 0.7], [3, 2], [1.0, 0.0], alpha=0.4).tolist()
        [0.3, 0.2]
    """
    s = _check_scores(sorted_scores)
    counts = _check_counts(class_counts, len(s))
    w = _check_weights(weights, len(counts))
    a = _check_alpha(alpha)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    if any(np.any(np.diff(s[lo:hi]) < 0) for lo, hi in zip(bounds[:-1], bounds[1:])):
        raise ValueError(
            expected("sorted_scores", "sorted in increasing order within each class", "scores out of order")
        )
    order = np.argsort(s, kind="stable")
    ascending = s[order]
    row_weights = np.repeat(w, counts)[order]
    # above[k] = the weight of the rows after the k smallest (above[0] = W, above[n] = 0)
    above = np.zeros(len(s) + 1)
    above[:-1] = np.cumsum(row_weights[::-1])[::-1]
    total = above[0] + w
    # the smallest k in 1..n with (w_y + above[k]) / total <= alpha (k = n + 1: none, +inf), per class
    low = np.ones(len(w), dtype=np.int64)
    high = np.full(len(w), len(s) + 1, dtype=np.int64)
    live = total > 0
    positive = np.where(live, total, 1.0)
    while True:
        searching = live & (low < high)
        if not searching.any():
            break
        mid = (low + high) // 2
        inside = (w + above[np.minimum(mid, len(s))]) / positive <= a
        high = np.where(searching & inside, mid, high)
        low = np.where(searching & ~inside, mid + 1, low)
    table = np.concatenate([ascending, [np.inf]])
    return np.where(live, table[low - 1], np.inf)


def _check_counts(class_counts, n: int) -> np.ndarray:
    try:
        counts = np.asarray(class_counts)
    except (TypeError, ValueError):
        counts = None
    if (
        counts is None
        or counts.ndim != 1
        or len(counts) < 2
        or not np.issubdtype(counts.dtype, np.integer)
        or counts.min() < 0
        or counts.sum() != n
    ):
        shown = class_counts if counts is None else counts.tolist()
        raise ValueError(expected("class_counts", f"K >= 2 non-negative integers summing to the {n} scores", shown))
    return counts.astype(np.int64)


def _check_weights(weights, n_classes: int) -> np.ndarray:
    try:
        w = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(expected("weights", f"{n_classes} finite numbers >= 0, not all 0", weights)) from None
    if w.shape != (n_classes,) or not np.all(np.isfinite(w)) or np.any(w < 0) or not np.any(w > 0):
        raise ValueError(expected("weights", f"{n_classes} finite numbers >= 0, not all 0", w.tolist()))
    return w
