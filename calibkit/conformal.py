"""Split conformal classification: prediction sets that contain the true label with a chosen probability.

Given n calibration examples (x_i, y_i), exchangeable with a test example (x, y), and a score s(x, y) that is
large when y is an unlikely label for x, the set C(x) = {k : s(x, k) <= q}, with q the ceil((n + 1)(1 - alpha))-th
smallest calibration score s_i = s(x_i, y_i), contains y with probability at least 1 - alpha (Vovk, Gammerman &
Shafer 2005; Lei et al. 2018). The probability is over the calibration and the test example together: the
guarantee is marginal, and it needs exchangeability, so it does not survive a shift between calibration and
serving. From probabilities (N, K) of a model trained on other data, this module computes:

- the LAC, APS and RAPS scores of given labels (``conformity_scores``), randomized or not;
- the finite-sample quantile (``conformal_quantile``), or one per class (``classwise_quantiles``, Mondrian);
- prediction sets (N, K) for a threshold (``prediction_sets``), vectorized over the batch, or as each row's labels
  ranked with its set size (``ranked_sets``), which is what a server lists;
- conformal p-values per class (``p_values``), whose level sets {k : p_k > alpha} are the prediction sets at
  every alpha, so the sets for different coverage levels are nested;
- ``SplitConformal``, the fitted calibrator: its sorted scores, ``quantile``, ``sets``, ``p_values``,
  ``to_dict`` / ``from_dict``.

Conventions shared by every function:

- **Probabilities** pass ``calibkit.validation.check_probs``: rows summing to 1 within 1e-4 are taken as they are,
  others are refused rather than renormalised (a row that does not sum to 1 usually means logits or the wrong
  axis, which a renormalisation would hide). A 1-D input is a binary problem, the two columns [1 - p, p].
- **Ties.** Labels of equal probability share one score, so they are in or out of a set together and no result
  depends on the order in which a sort leaves them.
- **Tolerance.** A score within ``SCORE_ATOL`` = 1e-8 of the threshold counts as equal to it, as MAPIE's
  ``EPSILON``: the same mass summed in another order (0.6 + 0.2 against 0.5 + 0.3) differs in the last bits.
- **Randomness** enters only through the argument ``u``: an array of N uniform draws, one per row, or a numpy
  ``Generator`` / ``RandomState`` to draw them from. ``u=np.random.RandomState(seed)`` draws what MAPIE draws
  with ``random_state=seed``.

>>> probs = np.array([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25], [0.1, 0.6, 0.3], [0.5, 0.3, 0.2]])
>>> scores = conformity_scores(probs, [0, 1, 1, 2], "aps")  # the mass down to the true label
>>> scores.round(2).tolist()
[0.7, 0.75, 0.6, 1.0]
>>> q = conformal_quantile(scores, alpha=0.4)  # the ceil(5 * 0.6) = 3rd smallest
>>> q
0.75
>>> prediction_sets(probs, q, "aps").astype(int).tolist()  # down to the first label whose mass reaches q
[[1, 1, 0], [1, 1, 0], [0, 1, 1], [1, 1, 0]]
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from calibkit.validation import PROB_SUM_ATOL, check_labels, check_probs, expected

__all__ = [
    "METHODS",
    "SCORE_ATOL",
    "SplitConformal",
    "aps_scores",
    "classwise_quantiles",
    "conformal_quantile",
    "conformity_scores",
    "floor_scores",
    "lac_scores",
    "pick_k_reg",
    "prediction_sets",
    "p_values",
    "quantile_rank",
    "ranked_sets",
    "raps_scores",
]

#: The scores: least ambiguous set-valued classifier, adaptive prediction sets, regularized APS.
METHODS = ("lac", "aps", "raps")
#: Scores closer than this to a threshold count as equal to it (MAPIE's ``EPSILON``).
SCORE_ATOL = 1e-8


# --- scores ------------------------------------------------------------------------------------------------


def lac_scores(probs, labels) -> np.ndarray:
    """LAC scores: one minus the probability of the label, s(x, y) = 1 - p_y.

    The sets {k : 1 - p_k <= q} of this score are the smallest on average among all sets with the same coverage
    (Sadinle et al. 2019), at the price of covering easy inputs more than hard ones.

    Args:
        probs: Probabilities (N, K), or (N,) positive-class probabilities of a binary problem.
        labels: Class indices (N,).

    Returns:
        The scores (N,), in [0, 1].

    Raises:
        ValueError: When ``probs`` or ``labels`` fails the checks of ``calibkit.validation``.

    References:
        Sadinle, Lei & Wasserman 2019, "Least Ambiguous Set-Valued Classifiers with Bounded Error Levels", JASA.
    """
    return conformity_scores(probs, labels, "lac")


def aps_scores(probs, labels, *, u=None) -> np.ndarray:
    """APS scores: the probability mass of the labels ranked at or above the label, s(x, y) = rho_x(y) + p_y.

    rho_x(y) = sum of p_k over the labels with p_k > p_y. Randomized, s(x, y, u) = rho_x(y) + p_y - u p_y with
    u ~ Uniform(0, 1), so that the scores have no ties and the coverage is exact rather than at least 1 - alpha.

    Args:
        probs: Probabilities (N, K), or (N,) positive-class probabilities of a binary problem.
        labels: Class indices (N,).
        u: None for the non-randomized score, or the draws: N numbers in [0, 1] or a numpy random generator.

    Returns:
        The scores (N,), in [0, 1].

    Raises:
        ValueError: When ``probs``, ``labels`` or ``u`` is malformed.

    References:
        Romano, Sesia & Candès 2020, "Classification with Valid and Adaptive Coverage", NeurIPS;
        Angelopoulos, Bates, Malik & Jordan 2021, "Uncertainty Sets for Image Classifiers using Conformal
        Prediction", ICLR.
    """
    return conformity_scores(probs, labels, "aps", u=u)


def raps_scores(probs, labels, *, k_reg: int, lam: float, u=None) -> np.ndarray:
    """RAPS scores: the APS score plus a penalty on the label's rank, s(x, y) = rho_x(y) + p_y + lam (o_x(y) - k_reg)^+.

    o_x(y) = #{k : p_k >= p_y} is the 1-based rank of y (tied labels share the last rank of their group). The
    penalty shrinks the sets of inputs whose tail probabilities are noise: labels beyond rank ``k_reg`` enter a
    set only when the mass above them is well below the threshold. Randomized, s(x, y, u) = rho_x(y) + p_y -
    u p_y + lam (o_x(y) - k_reg)^+ (the penalty is not randomized). ``k_reg=0, lam=0`` is APS.

    Args:
        probs: Probabilities (N, K), or (N,) positive-class probabilities of a binary problem.
        labels: Class indices (N,).
        k_reg: The number of top ranks without penalty, an integer >= 0 (``pick_k_reg`` picks it from data).
        lam: The penalty per rank beyond ``k_reg``, >= 0.
        u: None for the non-randomized score, or the draws: N numbers in [0, 1] or a numpy random generator.

    Returns:
        The scores (N,), in [0, 1 + lam (K - k_reg)^+].

    Raises:
        ValueError: When ``probs``, ``labels``, ``k_reg``, ``lam`` or ``u`` is malformed.

    References:
        Angelopoulos, Bates, Malik & Jordan 2021, "Uncertainty Sets for Image Classifiers using Conformal
        Prediction", ICLR.
    """
    return conformity_scores(probs, labels, "raps", k_reg=k_reg, lam=lam, u=u)


def conformity_scores(
    probs, labels, method: str = "lac", *, k_reg: int = 0, lam: float = 0.0, u=None, floor: bool = False
) -> np.ndarray:
    """The scores s(x_i, y_i) of labelled examples by LAC, APS or RAPS: ``lac_scores``, ``aps_scores``, ``raps_scores``.

    Args:
        probs: Probabilities (N, K), or (N,) positive-class probabilities of a binary problem.
        labels: Class indices (N,).
        method: ``"lac"``, ``"aps"`` or ``"raps"``.
        k_reg: RAPS's number of top ranks without penalty (0 for the other methods).
        lam: RAPS's penalty per rank beyond ``k_reg`` (0 for the other methods).
        u: None, or for APS and RAPS the uniform draws of the randomized score: N numbers in [0, 1] or a numpy
            random generator.
        floor: The scores of the floor sets (``floor_scores``) instead; ``u`` must then be None.

    Returns:
        The scores (N,).

    Raises:
        ValueError: Naming the argument and the value when one is malformed, including ``u`` for LAC (which has
            no randomized version) or with ``floor``, and ``k_reg`` / ``lam`` for a method other than RAPS.

    References:
        Sadinle, Lei & Wasserman 2019 (LAC); Romano, Sesia & Candès 2020 (APS); Angelopoulos, Bates, Malik &
        Jordan 2021 (RAPS).

    Examples:
        >>> probs = np.array([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]])
        >>> conformity_scores(probs, [2, 1], "lac").round(2).tolist()
        [0.8, 0.8]
        >>> conformity_scores(probs, [2, 1], "aps").round(2).tolist()  # ties share the mass above them
        [1.0, 0.8]
        >>> conformity_scores(probs, [2, 1], "raps", k_reg=1, lam=0.1).round(2).tolist()  # ranks 3 and 3
        [1.2, 1.0]
    """
    p = _check_probs(probs)
    y = check_labels(labels, p.shape[0], p.shape[1])
    method, k_reg, lam = _check_method(method, k_reg, lam)
    draws = _floor_draws(p.shape[0], method) if _check_floor(floor, u) else _check_u(u, p.shape[0], method)
    rows = np.arange(p.shape[0])
    if method == "lac":
        scores = (1.0 - p)[rows, y]
    else:
        ranked = _Ranked.sort(p, with_order=True)
        position = np.argmax(ranked.order == y[:, None], axis=1)
        scores = ranked.scores(k_reg, lam, draws)[rows, position]
    if floor:
        scores[p[rows, y] == p.max(axis=1)] = 0.0
    return scores


def floor_scores(probs, labels, method: str = "lac", *, k_reg: int = 0, lam: float = 0.0) -> np.ndarray:
    """The scores of the floor sets: deterministic sets that always hold the most probable label.

    s(x, y) = 0 when y is among the most probable labels of x, else 1 - p_y (LAC) or rho_x(y) + lam (o_x(y) -
    k_reg)^+ (APS, RAPS): the mass of the labels more probable than y, plus RAPS's penalty, which is the
    randomized score at the draw u = 1. The sets {k : s(x, k) <= q} at any q >= 0 are a top group of labels
    holding the most probable one (a prefix of the ranking, MAPIE's ``include_last_label=True`` shape), and split
    conformal on these scores keeps P(y in C(x)) >= 1 - alpha (Vovk, Gammerman & Shafer 2005): the floor only
    lowers scores, so the sets are never empty and cover at least the model's top-1 accuracy as well. Against
    MAPIE's non-randomized APS, whose calibration score counts the label's own mass and whose set also takes in
    the label that crosses q, these sets are the smaller of two sets with the same guarantee; against randomized
    APS and RAPS (Romano et al. 2020; Angelopoulos et al. 2021), they give up exact coverage for sets that are a
    function of the input alone.

    Args:
        probs, labels, method, k_reg, lam: As for ``conformity_scores``.

    Returns:
        The scores (N,), >= 0.

    Raises:
        ValueError: As ``conformity_scores``.

    Examples:
        >>> probs = np.array([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]])
        >>> floor_scores(probs, [2, 2], "aps").round(2).tolist()  # the mass above; 0 for the top label
        [0.8, 0.0]
        >>> floor_scores(probs, [1, 2], "lac").round(2).tolist()
        [0.7, 0.0]
    """
    return conformity_scores(probs, labels, method, k_reg=k_reg, lam=lam, floor=True)


def pick_k_reg(probs, labels, alpha: float) -> int:
    """RAPS's ``k_reg`` as Angelopoulos et al. pick it: the (1 - alpha) quantile of the true label's rank.

    k_reg = the ceil((n + 1)(1 - alpha))-th smallest of the ranks o_x(y_i) = #{k : p_k >= p_{y_i}}, capped at K
    (K as well when n is too small for that quantile, which leaves RAPS equal to APS). Pick it on a tuning
    split kept apart from the calibration split, or the coverage guarantee is lost. The paper's code takes the
    plain empirical quantile; this is the finite-sample one, as MAPIE's ``k_star``, one rank higher at most.

    Args:
        probs: Probabilities (N, K) of the tuning split, or (N,) positive-class probabilities.
        labels: Class indices (N,).
        alpha: The miscoverage level the sets are for, in (0, 1).

    Returns:
        k_reg, in [1, K].

    Raises:
        ValueError: When ``alpha`` is outside (0, 1) or ``probs`` / ``labels`` fail the checks.

    References:
        Angelopoulos, Bates, Malik & Jordan 2021, "Uncertainty Sets for Image Classifiers using Conformal
        Prediction", ICLR (the choice of k_reg and lambda).
    """
    p = _check_probs(probs)
    y = check_labels(labels, p.shape[0], p.shape[1])
    ranks = np.count_nonzero(p >= p[np.arange(len(y)), y][:, None], axis=1).astype(np.float64)
    return int(min(conformal_quantile(ranks, alpha), p.shape[1]))


# --- the quantile ------------------------------------------------------------------------------------------


def quantile_rank(n: int, alpha: float) -> int:
    """The rank k = ceil((n + 1)(1 - alpha)) of the split-conformal quantile among n calibration scores.

    Computed as k = n + 1 - l with l = #{j in 1..n+1 : j / (n + 1) <= alpha} in floating point, which is the
    ceiling above for alpha's decimal value (ceil(1000 * 0.941) = 941 for n = 999, alpha = 0.059, where a
    floating-point ceil((n + 1) * (1 - alpha)) gives 942) and exactly the rank at which ``p_values`` > alpha
    switches. k = n + 1 means that no calibration score is large enough: the quantile is +inf.

    Args:
        n: The number of calibration scores, an integer >= 1.
        alpha: The miscoverage level, in (0, 1).

    Returns:
        k, in [1, n + 1].

    Raises:
        ValueError: Naming ``n`` or ``alpha`` and the value when one is out of range.

    Examples:
        >>> quantile_rank(99, 0.1), quantile_rank(8, 0.1), quantile_rank(999, 0.059)
        (90, 9, 941)
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(expected("n", "a positive integer (the number of calibration scores)", n))
    return _rank(int(n), _check_alpha(alpha))


def conformal_quantile(scores, alpha: float) -> float:
    """The split-conformal quantile: the ceil((n + 1)(1 - alpha))-th smallest of n calibration scores, or +inf.

    With exchangeable calibration and test scores, P(s_test <= q) >= 1 - alpha; with scores free of ties
    (randomized APS or RAPS, or LAC on continuous probabilities) the coverage given the calibration set is
    Beta(n + 1 - l, l) distributed, l = floor((n + 1) alpha), so its mean is 1 - l / (n + 1) < 1 - alpha +
    1 / (n + 1). It is +inf when (n + 1)(1 - alpha) > n, i.e. n < 1 / alpha - 1: then every set holds all classes.

    Args:
        scores: Calibration scores (n,), n >= 1, finite.
        alpha: The miscoverage level, in (0, 1).

    Returns:
        The threshold q.

    Raises:
        ValueError: Naming ``scores`` or ``alpha`` when ``scores`` is empty or not finite or ``alpha`` is outside
            (0, 1).

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
    n_k < 1 / alpha - 1 examples (none at all included) gets q_k = +inf: it is in every set.

    Args:
        scores: Calibration scores (n,), finite.
        labels: The calibration labels (n,), class indices in [0, n_classes).
        alpha: The miscoverage level, in (0, 1).
        n_classes: K.

    Returns:
        The thresholds (K,).

    Raises:
        ValueError: Naming the argument when one is malformed.

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


# --- prediction sets and p-values ----------------------------------------------------------------------------


def prediction_sets(
    probs, threshold, method: str = "lac", *, k_reg: int = 0, lam: float = 0.0, u=None, floor: bool = False
) -> np.ndarray:
    """Prediction sets for a threshold q, as a boolean mask (N, K).

    - LAC: C(x) = {k : 1 - p_k <= q}.
    - APS and RAPS, ``u=None``: labels enter in decreasing probability until the mass (plus RAPS's penalty)
      reaches q, that label included: C(x) = {k : E(m_k) < q} with m_k = #{j : p_j > p_k} and
      E(m) = p_(1) + ... + p_(m) + lam (m - k_reg)^+, E(0) = 0; the most probable label is always in. This is
      MAPIE's ``include_last_label=True``; the paper's code also takes in the next label when E(m) equals q
      exactly. Coverage at least 1 - alpha.
    - APS and RAPS with draws ``u``: C(x) = {k : s(x, k, u) <= q}, the randomized score of ``raps_scores`` with the
      row's draw, so the label at which the scores cross q is in with probability (q - s(x, k, 1)) / p_k; sets can
      be empty. Exact coverage, as MAPIE's ``include_last_label="randomized"`` for APS.
    - ``floor=True``: C(x) = {k : s(x, k) <= q} for the scores of ``floor_scores``: never empty at q >= 0, the
      same for the same input, coverage at least 1 - alpha with that function's scores.

    Scores within ``SCORE_ATOL`` of q count as equal to it. A +inf threshold gives every class. One threshold,
    at least ``RANK_MIN_CLASSES`` classes: each row is ranked by one sort of integer keys, and the set's size found
    from block sums of the ranked probabilities (``_KeyRanking``, ``_block_sizes``). Fewer classes, or a row with
    ties or too close to the threshold to tell: the top ``PREFIX_WIDTH`` + 1 labels by a partition, then the rows
    whose set reaches further sorted whole. A threshold per class (Mondrian) needs the label ranks, an argsort.

    Args:
        probs: Probabilities (N, K), or (N,) positive-class probabilities of a binary problem.
        threshold: q, a number (possibly +inf), or one per class (K,) from ``classwise_quantiles``.
        method: ``"lac"``, ``"aps"`` or ``"raps"``.
        k_reg: RAPS's number of top ranks without penalty.
        lam: RAPS's penalty per rank beyond ``k_reg``.
        u: None for the non-randomized sets, or for APS and RAPS the draws: N numbers in [0, 1] (one per row) or
            a numpy random generator.
        floor: The floor sets (``floor_scores``); ``u`` must then be None.

    Returns:
        The sets (N, K): True where the class is in the set of the row.

    Raises:
        ValueError: Naming the argument when one is malformed.

    References:
        Sadinle, Lei & Wasserman 2019 (LAC); Romano, Sesia & Candès 2020 (APS); Angelopoulos, Bates, Malik &
        Jordan 2021 (RAPS).

    Examples:
        >>> probs = np.array([[0.6, 0.3, 0.1], [0.4, 0.4, 0.2]])
        >>> prediction_sets(probs, 0.75, "lac").astype(int).tolist()
        [[1, 1, 0], [1, 1, 0]]
        >>> prediction_sets(probs, 0.5, "aps").astype(int).tolist()  # 0.6 reaches 0.5; 0.4 does not, its tie is in
        [[1, 0, 0], [1, 1, 0]]
        >>> prediction_sets(probs, 0.3, "aps", u=[1.0, 0.0]).astype(int).tolist()  # scores 0, .6, .9; .4, .4, 1
        [[1, 0, 0], [0, 0, 0]]
    """
    p = _check_probs(probs)
    method, k_reg, lam = _check_method(method, k_reg, lam)
    return _rule_sets(p, _check_threshold(threshold, p.shape[1]), method, k_reg, lam, u, floor)


def ranked_sets(
    probs,
    threshold,
    method: str = "lac",
    *,
    k_reg: int = 0,
    lam: float = 0.0,
    u=None,
    floor: bool = False,
    check_input: bool = True,
):
    """The sets of ``prediction_sets`` for one threshold q, as (order, sizes): ``order`` (N, K) each row's labels
    in decreasing probability, ties in class order (a stable sort), and ``sizes`` (N,), so that the set of row i is
    ``order[i, :sizes[i]]``, most probable first.

    Every one-threshold set is a top group of labels: LAC's holds the labels with p_k >= 1 - q, and APS's and
    RAPS's scores grow with the rank and are shared by tied labels (see ``prediction_sets``), so a set is a prefix
    of the ranking and its size says which. With few classes and no ties, the size comes straight from the sorted
    row: the LAC count, the count of crossing values E(j) below q plus one (non-randomized), or the count of
    randomized scores at most q, the same floating-point expressions as ``prediction_sets``'s, hence the same sets
    bit for bit. With at least ``RANK_MIN_CLASSES``, the ranking and the sizes are those of ``prediction_sets``'s
    key ranking and block sums, the rows they do not settle argsorted stably; otherwise the size is the count of
    ``prediction_sets``'s.

    Args:
        probs, method, k_reg, lam, u, floor: As for ``prediction_sets``.
        threshold: q, one number (possibly +inf).
        check_input: False skips the checks of ``probs``, ``threshold`` and ``u`` (scikit-learn's
            ``check_input``), for a caller that passes what it made itself: a float array (N, K) of rows in [0, 1]
            summing to 1, one number, None or N draws in [0, 1] as a float64 array. What it passes otherwise is
            not refused, and the sets are undefined.

    Returns:
        (order, sizes): int64 arrays (N, K) and (N,).

    Raises:
        ValueError: Naming the argument when one is malformed (``threshold`` when it is one per class: Mondrian
            sets need not be prefixes).

    Examples:
        >>> order, sizes = ranked_sets(np.array([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]]), 0.75, "aps")
        >>> [row[:k] for row, k in zip(order.tolist(), sizes.tolist())]
        [[1, 2], [2]]
    """
    method, k_reg, lam = _check_method(method, k_reg, lam)
    if not check_input:
        p, q = probs.astype(np.float64, copy=False), float(threshold)
    else:
        p = _check_probs(probs)
        checked = _check_threshold(threshold, p.shape[1])
        if isinstance(checked, np.ndarray):
            raise ValueError(expected("threshold", "one number (per-class thresholds need prediction_sets)", threshold))
        q = checked
    if not _check_floor(floor, u):
        return _ranked_sets(p, q, method, k_reg, lam, _check_u(u, p.shape[0], method) if check_input else u)
    order, sizes = _ranked_sets(p, q, method, k_reg, lam, _floor_draws(p.shape[0], method))
    return order, np.maximum(sizes, np.count_nonzero(_top_labels(p), axis=1))


def p_values(
    probs,
    scores,
    method: str = "lac",
    *,
    k_reg: int = 0,
    lam: float = 0.0,
    u=None,
    calibration_labels=None,
    floor: bool = False,
) -> np.ndarray:
    """Conformal p-values per class, p_k(x) = (1 + #{i : s_i at or above t_k(x)}) / (n + 1): level sets are the sets.

    t_k(x) is the statistic the set rule of ``prediction_sets`` compares with the threshold: the score 1 - p_k
    (LAC) or s(x, k, u) (randomized), counted with s_i >= t_k; for non-randomized APS and RAPS the mass above the
    label, E(m_k), counted with s_i > t_k (strictly), and p_k = 1 for the most probable labels. Scores within
    ``SCORE_ATOL`` count as equal, as in the sets. Then for every alpha in (0, 1) and the same arguments,
    {k : p_k(x) > alpha} = ``prediction_sets(probs, conformal_quantile(scores, alpha), ...)``:

    Proof: k is in the set iff q = s_(r), r = n + 1 - l, is among the c = #{i : s_i at or above t_k} largest
    scores, iff c >= l = #{j : j / (n + 1) <= alpha}, iff (1 + c) / (n + 1) > alpha; r > n is l = 0, all in.

    Hence the sets are nested: a smaller alpha never removes a class. With ``calibration_labels`` the p-value of
    class k counts only the n_k scores of class k, over n_k + 1, and the level sets are the Mondrian sets at the
    thresholds of ``classwise_quantiles``.

    Args:
        probs: Probabilities (N, K), or (N,) positive-class probabilities of a binary problem.
        scores: The calibration scores (n,), computed with the same method, ``k_reg`` and ``lam``.
        method: ``"lac"``, ``"aps"`` or ``"raps"``.
        k_reg: RAPS's number of top ranks without penalty.
        lam: RAPS's penalty per rank beyond ``k_reg``.
        u: None, or for APS and RAPS the draws of the randomized statistic (N,) or a numpy random generator.
        calibration_labels: None for the marginal p-values, or the labels (n,) of the calibration examples for
            the class-conditional (Mondrian) ones.
        floor: The statistic of the floor sets (``floor_scores``, with p_k = 1 for the most probable labels);
            ``u`` must then be None.

    Returns:
        The p-values (N, K), in [1 / (n + 1), 1].

    Raises:
        ValueError: Naming the argument when one is malformed.

    References:
        Vovk, Gammerman & Shafer 2005, "Algorithmic Learning in a Random World" (conformal p-values, Mondrian
        conformal prediction); Angelopoulos & Bates 2021, "A Gentle Introduction to Conformal Prediction and
        Distribution-Free Uncertainty Quantification".

    Examples:
        >>> probs, scores = np.array([[0.6, 0.3, 0.1]]), [0.2, 0.4, 0.5, 0.8]
        >>> p_values(probs, scores, "lac").tolist()  # t = 0.4, 0.7, 0.9
        [[0.8, 0.4, 0.2]]
        >>> [prediction_sets(probs, conformal_quantile(scores, a), "lac").astype(int).tolist() for a in (0.3, 0.5)]
        [[[1, 1, 0]], [[1, 0, 0]]]
    """
    p = _check_probs(probs)
    method, k_reg, lam = _check_method(method, k_reg, lam)
    floor = _check_floor(floor, u)
    draws = _floor_draws(p.shape[0], method) if floor else _check_u(u, p.shape[0], method)
    if calibration_labels is None:
        sorted_scores, counts = np.sort(_check_scores(scores)), None
    else:
        sorted_scores, counts = _sort_by_class(scores, calibration_labels, p.shape[1], labels_name="calibration_labels")
    return _p_values(p, sorted_scores, counts, method, k_reg, lam, draws, floor)


# --- the fitted calibrator ----------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class SplitConformal:
    """A fitted split-conformal calibrator: the method, its parameters and the sorted calibration scores.

    ``fit`` computes the scores; ``quantile(alpha)``, ``sets(probs, alpha)`` and ``p_values(probs)`` apply them
    with the free functions of this module; ``to_dict`` / ``from_dict`` carry the sorted scores through JSON
    exactly. Classwise (Mondrian), the scores are sorted within each class and ``class_counts`` says how many
    each class has.

    Attributes:
        method: ``"lac"``, ``"aps"`` or ``"raps"``.
        scores: The calibration scores (n,), ascending (within each class when classwise).
        n_classes: K.
        k_reg: RAPS's number of top ranks without penalty (0 otherwise).
        lam: RAPS's penalty per rank beyond ``k_reg`` (0 otherwise).
        randomized: Whether the calibration scores were randomized (a record: any pairing of randomized or
            non-randomized scores and sets keeps coverage >= 1 - alpha; randomized on both sides makes it exact).
        class_counts: None for marginal sets, or the number of scores of each class (K,) for Mondrian sets.
        floor: Whether ``sets`` and ``p_values`` are the floor sets' (``floor_scores``), never randomized. Scores of
            any other rule are at least the floor scores of the same rows, so floor sets at their quantile keep
            coverage >= 1 - alpha too, conservatively.

    Raises:
        ValueError: Naming the field when one is malformed (unsorted scores included).

    Examples:
        >>> probs = np.array([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25], [0.1, 0.6, 0.3], [0.5, 0.3, 0.2]])
        >>> cal = SplitConformal.fit(probs, [0, 1, 1, 2], "lac")
        >>> cal.scores.round(2).tolist(), cal.quantile(0.4)
        ([0.3, 0.4, 0.65, 0.8], 0.65)
        >>> cal.sets(np.array([[0.5, 0.4, 0.1]]), alpha=0.4).tolist()
        [[True, True, False]]
        >>> SplitConformal.from_dict(cal.to_dict()).quantile(0.4)
        0.65
    """

    method: str
    scores: np.ndarray
    n_classes: int
    k_reg: int = 0
    lam: float = 0.0
    randomized: bool = False
    class_counts: np.ndarray | None = None
    floor: bool = False

    def __post_init__(self) -> None:
        method, k_reg, lam = _check_method(self.method, self.k_reg, self.lam)
        _check_floor(self.floor, None)
        if isinstance(self.n_classes, bool) or not isinstance(self.n_classes, (int, np.integer)) or self.n_classes < 2:
            raise ValueError(expected("n_classes", "an integer >= 2", self.n_classes))
        scores = _check_scores(self.scores)
        if not isinstance(self.randomized, (bool, np.bool_)):
            raise ValueError(expected("randomized", "a bool", self.randomized))
        counts = None
        if self.class_counts is not None:
            counts = np.asarray(self.class_counts)
            if (
                counts.shape != (self.n_classes,)
                or not np.issubdtype(counts.dtype, np.integer)
                or counts.min() < 0
                or counts.sum() != len(scores)
            ):
                raise ValueError(
                    f"Expected `class_counts` to be {self.n_classes} non-negative integers summing to the "
                    f"{len(scores)} scores, but got {counts.tolist()}"
                )
            counts = counts.astype(np.int64)
            bounds = np.concatenate([[0], np.cumsum(counts)])
            unsorted = any(np.any(np.diff(scores[a:b]) < 0) for a, b in zip(bounds[:-1], bounds[1:]))
        else:
            unsorted = bool(np.any(np.diff(scores) < 0))
        if unsorted:
            raise ValueError("Expected `scores` to be sorted in increasing order (within each class), but they are not")
        scores = scores.copy()
        scores.setflags(write=False)
        if counts is not None:
            counts.setflags(write=False)
        for name, value in (
            ("method", method),
            ("k_reg", k_reg),
            ("lam", lam),
            ("n_classes", int(self.n_classes)),
            ("randomized", bool(self.randomized)),
            ("scores", scores),
            ("class_counts", counts),
            ("floor", bool(self.floor)),
        ):
            object.__setattr__(self, name, value)

    @classmethod
    def fit(
        cls,
        probs,
        labels,
        method: str = "lac",
        *,
        k_reg: int = 0,
        lam: float = 0.0,
        u=None,
        classwise: bool = False,
        floor: bool = False,
    ) -> SplitConformal:
        """Fit on a calibration split: compute the scores of its labels and sort them.

        Args:
            probs: Probabilities (n, K) of the calibration split, kept apart from the data the model (and any
                temperature) was fitted on.
            labels: Class indices (n,).
            method: ``"lac"``, ``"aps"`` or ``"raps"``.
            k_reg: RAPS's number of top ranks without penalty.
            lam: RAPS's penalty per rank beyond ``k_reg``.
            u: None for non-randomized scores, or the draws (n,) / a numpy random generator.
            classwise: Keep the scores per class, for Mondrian (class-conditional) sets.
            floor: Fit the floor sets' scores (``floor_scores``); ``u`` must then be None.

        Returns:
            The fitted calibrator.

        Raises:
            ValueError: Naming the argument when one is malformed.
        """
        p = _check_probs(probs)
        y = check_labels(labels, p.shape[0], p.shape[1])
        scores = conformity_scores(p, y, method, k_reg=k_reg, lam=lam, u=u, floor=floor)
        if classwise:
            sorted_scores, counts = _sort_by_class(scores, y, p.shape[1])
        else:
            sorted_scores, counts = np.sort(scores), None
        return cls(method, sorted_scores, p.shape[1], k_reg, lam, u is not None, counts, floor)

    @property
    def classwise(self) -> bool:
        """Whether the quantiles, sets and p-values are class-conditional (Mondrian)."""
        return self.class_counts is not None

    def quantile(self, alpha: float) -> float | np.ndarray:
        """The threshold for miscoverage ``alpha``: ``conformal_quantile`` of the scores, or one per class.

        Args:
            alpha: The miscoverage level, in (0, 1).

        Returns:
            q, or the thresholds (K,) when classwise.

        Raises:
            ValueError: When ``alpha`` is outside (0, 1).
        """
        a = _check_alpha(alpha)
        if self.class_counts is not None:
            return _classwise_thresholds(self.scores, self.class_counts, a)
        k = _rank(len(self.scores), a)
        return math.inf if k > len(self.scores) else float(self.scores[k - 1])

    def sets(self, probs, alpha: float, *, u=None) -> np.ndarray:
        """Prediction sets (N, K) at miscoverage ``alpha``: ``prediction_sets`` at ``quantile(alpha)``.

        Args:
            probs: Probabilities (N, K).
            alpha: The miscoverage level, in (0, 1).
            u: None for the non-randomized sets, or the draws (N,) / a numpy random generator (APS and RAPS);
                None for floor sets.

        Returns:
            The sets (N, K).

        Raises:
            ValueError: Naming the argument when one is malformed or ``probs`` has another number of classes.
        """
        p = self._check_width(probs)
        return _rule_sets(p, self.quantile(alpha), self.method, self.k_reg, self.lam, u, self.floor)

    def p_values(self, probs, *, u=None) -> np.ndarray:
        """Conformal p-values (N, K): ``p_values`` with these scores, whose level sets are ``sets``.

        Args:
            probs: Probabilities (N, K).
            u: None, or the draws (N,) / a numpy random generator of the randomized statistic (APS and RAPS).

        Returns:
            The p-values (N, K).

        Raises:
            ValueError: Naming the argument when one is malformed or ``probs`` has another number of classes.
        """
        p = self._check_width(probs)
        floor = _check_floor(self.floor, u)
        draws = _floor_draws(p.shape[0], self.method) if floor else _check_u(u, p.shape[0], self.method)
        return _p_values(p, self.scores, self.class_counts, self.method, self.k_reg, self.lam, draws, floor)

    def to_dict(self) -> dict:
        """The calibrator as JSON-serialisable data, which ``from_dict`` restores exactly.

        Returns:
            ``{"method", "n_classes", "k_reg", "lambda", "randomized", "scores", "class_counts"}``, the scores a
            list of floats (Python's JSON writes floats so that they read back bit for bit), and ``"floor": true``
            for a floor calibrator (``from_dict`` reads its absence as false).
        """
        floor = {"floor": True} if self.floor else {}
        return floor | {
            "method": self.method,
            "n_classes": self.n_classes,
            "k_reg": self.k_reg,
            "lambda": self.lam,
            "randomized": self.randomized,
            "scores": self.scores.tolist(),
            "class_counts": None if self.class_counts is None else self.class_counts.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> SplitConformal:
        """Rebuild a calibrator from ``to_dict`` output.

        Args:
            data: What ``to_dict`` returned, as read back from JSON.

        Returns:
            The calibrator.

        Raises:
            ValueError: Naming the field when ``data`` is malformed.
        """
        fields = ("method", "n_classes", "k_reg", "lambda", "randomized", "scores", "class_counts")
        if not isinstance(data, dict) or not set(fields) <= data.keys():
            shown = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ValueError(expected("data", "an object with " + ", ".join(repr(f) for f in fields), shown))
        counts = data["class_counts"]
        return cls(
            method=data["method"],
            scores=np.asarray(data["scores"], dtype=np.float64),
            n_classes=data["n_classes"],
            k_reg=data["k_reg"],
            lam=data["lambda"],
            randomized=data["randomized"],
            class_counts=None if counts is None else np.asarray(counts, dtype=np.int64),
            floor=data.get("floor", False),
        )

    def _check_width(self, probs) -> np.ndarray:
        p = _check_probs(probs)
        if p.shape[1] != self.n_classes:
            raise ValueError(f"probs have {p.shape[1]} classes but the calibrator was fitted on {self.n_classes}")
        return p


# --- internals -----------------------------------------------------------------------------------------------


class _Ranked:
    """Rows of probabilities sorted in decreasing order, or their top labels, with the cumulative mass and ties.

    For sorted position j (1-based): ``values`` p_(j) and ``cumsum`` C(j) = p_(1) + ... + p_(j); ``groups()`` the
    first and last position of j's tie group, computed when needed, as C is. ``order`` is the ranking, when asked
    for.
    Built from the top labels only (``top``), C(j) is the same number as from the whole row, and only the last
    tie group, which may go on past the prefix, can have the wrong last position.
    """

    def __init__(self, values: np.ndarray, order: np.ndarray | None = None) -> None:
        self.values = values
        self.order = order
        self.positions = np.arange(1, values.shape[1] + 1)
        self._groups: tuple[np.ndarray, np.ndarray] | None = None
        self._ties: bool | None = None

    @functools.cached_property
    def cumsum(self) -> np.ndarray:
        return np.cumsum(self.values, axis=1)

    @classmethod
    def sort(cls, p: np.ndarray, *, with_order: bool = False) -> _Ranked:
        """The whole rows, sorted (with the ranking when asked: a tie's order is arbitrary and never matters; the
        key ranking for many classes, its unstable rows argsorted)."""
        if not with_order:
            return cls(np.sort(p, axis=1)[:, ::-1])
        if p.shape[1] >= RANK_MIN_CLASSES:
            order = _KeyRanking(p).stable_order()
        else:
            order = np.argsort(p, axis=1)[:, ::-1]
        return cls(np.take_along_axis(p, order, axis=1), order)

    @classmethod
    def top(cls, p: np.ndarray, width: int) -> _Ranked:
        """The ``width`` largest probabilities of each row, sorted: a partition, then a sort of the few."""
        kth = p.shape[1] - width
        return cls(np.sort(np.partition(p, kth, axis=1)[:, kth:], axis=1)[:, ::-1])

    def groups(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(first, last) position of each position's tie group, or None when no probabilities tie."""
        if self._ties is None:
            same = self.values[:, 1:] == self.values[:, :-1]
            self._ties = bool(same.any())
            if self._ties:
                width = self.values.shape[1]
                starts = np.ones(self.values.shape, dtype=bool)
                starts[:, 1:] = ~same
                first = np.maximum.accumulate(np.where(starts, self.positions, 0), axis=1)
                ends = np.ones(self.values.shape, dtype=bool)
                ends[:, :-1] = starts[:, 1:]
                last = np.minimum.accumulate(np.where(ends, self.positions, width)[:, ::-1], axis=1)[:, ::-1]
                self._groups = first, last
        return self._groups

    def penalty(self, k_reg: int, lam: float) -> np.ndarray:
        """lam (j - k_reg)^+ for positions j = 1..K."""
        return _position_penalty(self.values.shape[1], k_reg, lam)

    def mass_above(self, k_reg: int, lam: float) -> np.ndarray:
        """E(j) = C(j) + lam (j - k_reg)^+, the non-randomized crossing values, nondecreasing in j."""
        return self.cumsum if lam == 0 else self.cumsum + self.penalty(k_reg, lam)

    def scores(self, k_reg: int, lam: float, draws: np.ndarray | None) -> np.ndarray:
        """The APS / RAPS score of the label at each sorted position, nondecreasing along each row.

        s = C(first) - u p_(j) + lam (last - k_reg)^+: the mass above the tie group plus the label's own
        probability, less the randomized part. The running maximum changes nothing in exact arithmetic (the score
        grows with the position) and keeps it so in floating point, so a set is always a top group of labels.
        """
        penalty = self.penalty(k_reg, lam)
        groups = self.groups()
        if groups is None:
            own, pen = self.cumsum, penalty
        else:
            own = np.take_along_axis(self.cumsum, groups[0] - 1, axis=1)
            pen = penalty[groups[1] - 1]
        if draws is None:
            return own + pen
        return np.maximum.accumulate(own - draws[:, None] * self.values + pen, axis=1)

    def statistic(self, k_reg: int, lam: float) -> tuple[np.ndarray, np.ndarray]:
        """(E(m), m == 0) per sorted position, m = first - 1 the number of more probable labels."""
        mass = np.concatenate([np.zeros((self.values.shape[0], 1)), self.mass_above(k_reg, lam)], axis=1)
        groups = self.groups()
        first = np.broadcast_to(self.positions, self.values.shape) if groups is None else groups[0]
        return np.take_along_axis(mass, first - 1, axis=1), first == 1

    def unsort(self, sorted_values: np.ndarray) -> np.ndarray:
        """Values per sorted position back in the original class order."""
        assert self.order is not None
        out = np.empty_like(sorted_values)
        np.put_along_axis(out, self.order, sorted_values, axis=1)
        return out


#: The one-threshold sets look at this many top labels first (a partition instead of a sort, and a cumulative sum
#: over a few columns); the rows whose set reaches further, or whose last tie group may, are then sorted whole.
PREFIX_WIDTH = 32


def _sets(p: np.ndarray, q: float | np.ndarray, method: str, k_reg: int, lam: float, draws) -> np.ndarray:
    if method == "lac":
        return (1.0 - p) - q <= SCORE_ATOL
    if isinstance(q, np.ndarray):
        # one threshold per class: compare each label's statistic with its class's threshold
        stat, top, strict = _statistic(p, method, k_reg, lam, draws)
        if strict:
            return top | (stat - q < -SCORE_ATOL)
        return stat - q <= SCORE_ATOL
    if p.shape[1] >= RANK_MIN_CLASSES and math.isfinite(q):
        ranking = _KeyRanking(p)
        sizes, settled = _block_sizes(ranking.values, p.shape[1], q, k_reg, lam, draws)
        out = _top_groups(p, ranking.order, sizes)
        # non-randomized, ties take care of themselves: the set holds every label at least as probable as its last
        settled &= ranking.settles(sizes, draws is not None)
        if not settled.all():
            rest = ~settled
            out[rest] = _prefix_sets(p[rest], q, k_reg, lam, None if draws is None else draws[rest])
        return out
    return _prefix_sets(p, q, k_reg, lam, draws)


def _rule_sets(p: np.ndarray, q: float | np.ndarray, method: str, k_reg: int, lam: float, u, floor) -> np.ndarray:
    """The sets of checked probabilities and threshold under the rule ``u`` and ``floor`` ask for (both checked)."""
    if _check_floor(floor, u):
        return _sets(p, q, method, k_reg, lam, _floor_draws(p.shape[0], method)) | _top_labels(p)
    return _sets(p, q, method, k_reg, lam, _check_u(u, p.shape[0], method))


def _ranked_sets(p: np.ndarray, q: float, method: str, k_reg: int, lam: float, draws) -> tuple[np.ndarray, np.ndarray]:
    """``ranked_sets`` on checked arguments. Few classes: one stable sort, then the sizes from the sorted rows when
    no two labels tie and the row is short enough to be sorted whole (as ``_prefix_sets`` sorts it), else from the
    sets. Many: the key ranking, the sizes from its block sums (APS, RAPS) or the LAC count, and the rows it does
    not settle sorted stably, their sizes from the sets."""
    n_classes = p.shape[1]
    if n_classes >= RANK_MIN_CLASSES:
        return _key_ranked_sets(p, q, method, k_reg, lam, draws)
    order = np.argsort(-p, axis=1, kind="stable")
    if method == "lac":
        return order, np.count_nonzero((1.0 - p) - q <= SCORE_ATOL, axis=1)
    values = p[np.arange(len(p))[:, None], order]
    if n_classes > PREFIX_WIDTH + 1 or (values[:, 1:] == values[:, :-1]).any():
        return order, np.count_nonzero(_sets(p, q, method, k_reg, lam, draws), axis=1)
    mass = np.cumsum(values, axis=1)
    penalty = _position_penalty(n_classes, k_reg, lam)
    if draws is None:
        return order, np.minimum(np.count_nonzero((mass + penalty) - q < -SCORE_ATOL, axis=1) + 1, n_classes)
    scores = np.maximum.accumulate(mass - draws[:, None] * values + penalty, axis=1)
    return order, np.count_nonzero(scores - q <= SCORE_ATOL, axis=1)


def _key_ranked_sets(
    p: np.ndarray, q: float, method: str, k_reg: int, lam: float, draws
) -> tuple[np.ndarray, np.ndarray]:
    ranking = _KeyRanking(p)
    order = ranking.stable_order()
    settled = ranking.stable
    if method == "lac":
        sizes = np.count_nonzero((1.0 - p) - q <= SCORE_ATOL, axis=1)
    elif math.isfinite(q):
        sizes, decided = _block_sizes(ranking.values, p.shape[1], q, k_reg, lam, draws)
        settled = decided & ranking.settles(sizes, draws is not None)
        tied = np.flatnonzero((ranking.singles < p.shape[1]) & settled)
        if draws is None and len(tied):  # non-randomized: the labels tied with the last one in come with it
            ranked, last = ranking.values[tied, : p.shape[1]], ranking.values[tied, sizes[tied] - 1]
            sizes[tied] = np.count_nonzero(ranked >= last[:, None], axis=1)
    else:
        sizes = np.count_nonzero(_prefix_sets(p, q, k_reg, lam, draws), axis=1)
    if method != "lac" and not settled.all():  # LAC's sizes are its counts, its unsettled rows only argsorted
        rest = ~settled
        rest_draws = None if draws is None else draws[rest]
        sizes[rest] = np.count_nonzero(_prefix_sets(p[rest], q, k_reg, lam, rest_draws), axis=1)
    return order, sizes


@functools.lru_cache(maxsize=64)
def _position_penalty(width: int, k_reg: int, lam: float) -> np.ndarray:
    """RAPS's penalty of the positions 1..``width``, computed once per (width, k_reg, lam), read-only."""
    penalty = _rank_penalty(np.arange(1, width + 1), k_reg, lam)
    penalty.setflags(write=False)
    return penalty


def _rank_penalty(ranks: np.ndarray, k_reg: int, lam: float) -> np.ndarray:
    """lam (m - k_reg)^+ for integer ranks m: RAPS's penalty, one expression for every path (Angelopoulos et al.
    2021), so that the paths' sets agree to the bit."""
    return lam * np.maximum(0.0, (ranks - k_reg).astype(np.float64))


def _prefix_sets(p: np.ndarray, q: float, k_reg: int, lam: float, draws) -> np.ndarray:
    """One-threshold APS / RAPS sets from the sorted rows: the top labels first, the rows they do not settle whole."""
    width = PREFIX_WIDTH + 1
    if width >= p.shape[1]:
        return _one_threshold_sets(p, _Ranked.sort(p), q, k_reg, lam, draws)[0]
    out, settled = _one_threshold_sets(p, _Ranked.top(p, width), q, k_reg, lam, draws)
    if not settled.all():
        rest = ~settled
        rest_draws = None if draws is None else draws[rest]
        out[rest] = _one_threshold_sets(p[rest], _Ranked.sort(p[rest]), q, k_reg, lam, rest_draws)[0]
    return out


#: One-threshold sets of at least this many classes rank each row by one sort of packed integer keys
#: (``_KeyRanking``), and find an APS / RAPS set's size from block sums of the ranked probabilities
#: (``_block_sizes``); rows of fewer classes are sorted as floats, which costs less.
RANK_MIN_CLASSES = 64
#: The number of ranked positions per block sum.
BLOCK = 32


class _KeyRanking:
    """Each row's labels in decreasing probability, ties in class order, by one sort of integer keys.

    The IEEE-754 bit patterns of non-negative floats order as the floats do. Label k's key keeps the leading bits
    of p_k's pattern and puts k in the b = bit_length(K - 1) trailing ones: key = ~(bits(p_k) | (2^b - 1)) | k,
    inverted so that the ascending sort ranks the most probable first, then by class. ``values`` are the
    probabilities so truncated (each within a relative 2^(b - 52) below the true one), in ranked order, padded
    with zeros to a multiple of ``BLOCK`` columns. Per row, ``stable``: no -0.0, and no two labels whose keys
    share their leading bits but whose probabilities differ (a near-tie, which the keys may rank out of order), so
    that ``order`` is the stable ranking; ``singles``: the number of leading positions before the first tie (K
    without one). Probabilities of float32 origin lose nothing to the truncation: their only shared leading bits
    are ties.
    """

    def __init__(self, p: np.ndarray) -> None:
        self.p = p
        n, k = p.shape
        low = (1 << max(1, (k - 1).bit_length())) - 1
        keys = np.empty((n, -(-k // BLOCK) * BLOCK), dtype=np.int64)
        head = keys[:, :k]
        np.bitwise_or(p.view(np.int64), low, out=head)
        head ^= _inverted_classes(k)  # ~(x | low) | k == (x | low) ^ ~k: the low bits of ~(x | low) are zero
        keys[:, k:] = np.iinfo(np.int64).max  # padding: ranked last, read as the value -0.0
        keys.sort(axis=1)
        self.order = keys[:, :k] & low
        no_negative = keys[:, k - 1] < 0  # a -0.0 (bits with the sign set) keys as a non-negative integer
        keys |= low
        np.invert(keys, out=keys)
        self.values = keys.view(np.float64)
        ranked = self.values[:, :k]
        shared = ranked[:, 1:] == ranked[:, :-1]
        self.stable = no_negative
        self.singles = np.full(n, k)
        tied = np.flatnonzero(shared.any(axis=1))
        if len(tied):
            at, j = np.nonzero(shared[tied])
            rows = tied[at]
            near = p[rows, self.order[rows, j]] != p[rows, self.order[rows, j + 1]]
            self.stable = no_negative & (np.bincount(rows[near], minlength=n) == 0)
            self.singles[tied] = np.argmax(shared[tied], axis=1)

    def stable_order(self) -> np.ndarray:
        """``order``, with the rows that are not stable argsorted stably from the true probabilities (in place)."""
        if not self.stable.all():
            self.order[~self.stable] = np.argsort(-self.p[~self.stable], axis=1, kind="stable")
        return self.order

    def settles(self, sizes: np.ndarray, randomized: bool) -> np.ndarray:
        """Whether the sizes found from ``values`` position by position are the sets' own: the ranking is stable
        and, randomized, the set lies before the first tie. A tie group's randomized score takes the penalty of
        its last rank, at least its first position's: a first position found out is out."""
        if not randomized:
            return self.stable
        return self.stable & ((self.singles == self.order.shape[1]) | (sizes <= self.singles))


@functools.lru_cache(maxsize=8)
def _ones(n: int) -> np.ndarray:
    """n ones, read-only: a product with them sums blocks faster than ``sum`` does, in BLAS's order."""
    out = np.ones(n)
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=64)
def _inverted_classes(k: int) -> np.ndarray:
    """~k for the classes k = 0..K - 1, read-only."""
    out = ~np.arange(k, dtype=np.int64)
    out.setflags(write=False)
    return out


def _block_sizes(values: np.ndarray, k: int, q: float, k_reg: int, lam: float, draws) -> tuple[np.ndarray, np.ndarray]:
    """(sizes, settled): the one-threshold APS / RAPS set sizes of ranked rows, from block sums, and which rows
    they decide.

    The crossing values grow with the position j: E(j) = C(j) + lam (j - k_reg)^+, the set's size being
    1 + #{j : E(j) < q} (non-randomized), and the scores C(j) - u p_(j) + lam (j - k_reg)^+, the size being
    #{j : score <= q} (randomized), as in ``_one_threshold_sets``. The running total of the block sums gives C at
    the last position of every block of ``BLOCK``, so the blocks wholly in are counted from it, and only the first
    block not wholly in is summed position by position. Summed in another order than the sorted running sum, and
    from truncated values, these masses differ from it by at most gamma = 8 (K + BLOCK + 8) 2^-53 (1 + 2 |q| +
    lam K) (Higham 2002, section 4.2, for sums of non-negative terms): a comparison counts only when it clears the
    threshold by more than gamma, and a row with a position closer than that is not settled.
    """
    n, width = values.shape
    n_blocks = width // BLOCK
    blocks = values.reshape(n, n_blocks, BLOCK)
    mass = np.zeros((n, n_blocks + 1))
    np.cumsum(blocks @ _ones(BLOCK), axis=1, out=mass[:, 1:])
    penalty = _position_penalty(width, k_reg, lam)
    gap = 8.0 * (k + BLOCK + 8) * 2.0**-53 * (1.0 + 2.0 * abs(q) + lam * k)
    last = mass[:, 1:] + penalty[BLOCK - 1 :: BLOCK]  # at each block's last position
    if draws is None:
        wholly_in = np.count_nonzero(last - q < -SCORE_ATOL - gap, axis=1)
    else:
        last -= draws[:, None] * values[:, BLOCK - 1 :: BLOCK]
        wholly_in = np.count_nonzero(last - q <= SCORE_ATOL - gap, axis=1)
    b = np.minimum(wholly_in, n_blocks - 1)
    rows = np.arange(n)
    own = blocks[rows, b]
    score = np.cumsum(own, axis=1)
    score += mass[rows, b][:, None]
    score += penalty[(b * BLOCK)[:, None] + np.arange(BLOCK)]
    if draws is None:
        d = score - (q - SCORE_ATOL)  # in when below zero
        counted = np.count_nonzero(d < -gap, axis=1)
        unsure = ((d >= -gap) & (d < gap)).any(axis=1)
        sizes = b * BLOCK + counted + 1
    else:
        score -= draws[:, None] * own
        d = score - (q + SCORE_ATOL)  # in when at most zero
        counted = np.count_nonzero(d <= -gap, axis=1)
        unsure = ((d > -gap) & (d <= gap)).any(axis=1)
        sizes = b * BLOCK + counted
    # a block all in that is not the last: its end was not in by the block sums, a rounding apart
    unsure |= (counted == BLOCK) & (wholly_in < n_blocks)
    return np.minimum(sizes, k), ~unsure


def _top_groups(p: np.ndarray, order: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The sets as masks: the labels at least as probable as the last of the ``sizes`` ranked first (none at 0)."""
    rows = np.arange(len(p))
    least = p[rows, order[rows, np.clip(sizes, 1, p.shape[1]) - 1]]
    out = p >= least[:, None]
    out[sizes == 0] = False
    return out


def _one_threshold_sets(
    p: np.ndarray, ranked: _Ranked, q: float, k_reg: int, lam: float, draws
) -> tuple[np.ndarray, np.ndarray]:
    """(sets, settled): the set of a row is its labels of probability >= p_(L), L the size; ``settled`` says
    whether the top labels in ``ranked`` decide L (always, when they are the whole row)."""
    width = ranked.values.shape[1]
    whole = width == p.shape[1]
    if draws is None:
        # L = the first position whose mass above reaches q; the labels tied with p_(L) come with it
        size = np.count_nonzero(ranked.mass_above(k_reg, lam) - q < -SCORE_ATOL, axis=1) + 1
        settled = np.full(len(p), True) if whole else size <= width
    else:
        # L = the number of positions whose randomized score is <= q (a top group: the score grows with position)
        inside = ranked.scores(k_reg, lam, draws) - q <= SCORE_ATOL
        if whole:
            size, settled = np.count_nonzero(inside, axis=1), np.full(len(p), True)
        else:
            # the last tie group of the prefix may go on past it: its rank, so its penalty and score, come out too
            # low here. Leave out the last position: if that group is inside anyway, it reaches position width - 1,
            # and the row goes to the sort; if it is outside, it is outside with its true score as well.
            size = np.count_nonzero(inside[:, :-1], axis=1)
            settled = size < width - 1
    index = np.clip(size, 1, width) - 1
    out = p >= np.take_along_axis(ranked.values, index[:, None], axis=1)
    out[size > width] = True
    out[size == 0] = False
    return out, settled


def _statistic(p: np.ndarray, method: str, k_reg: int, lam: float, draws) -> tuple[np.ndarray, np.ndarray, bool]:
    """(t, top, strict): the per-label statistic the set rule compares with q, in class order.

    LAC and randomized: k in C(x) iff t_k <= q. Non-randomized APS / RAPS: iff top_k or t_k < q (strict).
    """
    if method == "lac":
        return 1.0 - p, np.zeros(p.shape, dtype=bool), False
    ranked, stat, top, strict = _ranked_statistic(p, method, k_reg, lam, draws)
    return ranked.unsort(stat), np.zeros(p.shape, dtype=bool) if top is None else ranked.unsort(top), strict


def _ranked_statistic(
    p: np.ndarray, method: str, k_reg: int, lam: float, draws
) -> tuple[_Ranked, np.ndarray, np.ndarray | None, bool]:
    """(ranked, t, top, strict): ``_statistic`` per ranked position, nondecreasing along each row (top: None when no
    label is always in), with the ranking that puts it back in class order."""
    ranked = _Ranked.sort(p, with_order=True)
    if method == "lac":
        return ranked, 1.0 - ranked.values, None, False
    if draws is not None:
        return ranked, ranked.scores(k_reg, lam, draws), None, False
    stat, top = ranked.statistic(k_reg, lam)
    return ranked, stat, top, True


def _p_values(
    p: np.ndarray,
    sorted_scores: np.ndarray,
    counts: np.ndarray | None,
    method: str,
    k_reg: int,
    lam: float,
    draws,
    floor: bool = False,
) -> np.ndarray:
    if floor:  # the floor's statistic is 0 for the most probable labels: every score is at or above it
        out = _p_values(p, sorted_scores, counts, method, k_reg, lam, draws)
        out[_top_labels(p)] = 1.0
        return out
    if counts is None:
        # counted per ranked position: each row's statistics ascend, which binary searches run through fastest
        ranked, stat, top, strict = _ranked_statistic(p, method, k_reg, lam, draws)
        out = (1 + _count_at_or_above(sorted_scores, stat, strict)) / (len(sorted_scores) + 1)
        if top is not None:
            out[top] = 1.0
        return ranked.unsort(out)
    stat, top, strict = _statistic(p, method, k_reg, lam, draws)
    out = np.empty(p.shape)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    for k in range(p.shape[1]):
        class_scores = sorted_scores[bounds[k] : bounds[k + 1]]
        out[:, k] = (1 + _count_at_or_above(class_scores, stat[:, k], strict)) / (len(class_scores) + 1)
    out[top] = 1.0
    return out


def _count_at_or_above(sorted_scores: np.ndarray, t: np.ndarray, strict: bool) -> np.ndarray:
    """Per entry of t, the number of scores s with t - s <= SCORE_ATOL, or t - s < -SCORE_ATOL when strict.

    Both sets of s are upper sets (t - s falls as s grows, and floating-point rounding keeps that order), so each
    count is n less the first index whose score is in: a binary search for t -/+ SCORE_ATOL lands within a score
    or two of it, and stepping to it by the comparison itself makes the count agree bit for bit with the
    comparisons of the sets.
    """
    if len(sorted_scores) == 0:
        return np.zeros(t.shape, dtype=np.int64)
    if strict:
        first = np.searchsorted(sorted_scores, t + SCORE_ATOL, side="right")
        first = _first_within(sorted_scores, t, first, lambda t, s: t - s < -SCORE_ATOL)
    else:
        first = np.searchsorted(sorted_scores, t - SCORE_ATOL, side="left")
        first = _first_within(sorted_scores, t, first, lambda t, s: t - s <= SCORE_ATOL)
    return len(sorted_scores) - first


def _first_within(sorted_scores: np.ndarray, t: np.ndarray, first: np.ndarray, within: Callable) -> np.ndarray:
    """Each guess ``first`` moved to the first index j at which ``within(t, s_j)`` holds (n where none does), the
    scores it holds for being an upper set: down while the score below holds, up while its own does not; each step
    works on the entries still moving only."""
    n, flat_t, flat = len(sorted_scores), t.reshape(-1), first.reshape(-1)
    moving = np.flatnonzero((flat > 0) & within(flat_t, sorted_scores[np.maximum(flat - 1, 0)]))
    while len(moving):
        flat[moving] -= 1
        moving = moving[flat[moving] > 0]
        moving = moving[within(flat_t[moving], sorted_scores[flat[moving] - 1])]
    moving = np.flatnonzero((flat < n) & ~within(flat_t, sorted_scores[np.minimum(flat, n - 1)]))
    while len(moving):
        flat[moving] += 1
        moving = moving[flat[moving] < n]
        moving = moving[~within(flat_t[moving], sorted_scores[flat[moving]])]
    return flat.reshape(first.shape)


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
    if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 2:
        raise ValueError(expected("n_classes", "an integer >= 2", n_classes))
    s = _check_scores(scores)
    try:
        y = check_labels(labels, len(s), int(n_classes))
    except ValueError as exc:
        raise ValueError(f"{labels_name}: {exc}") from None
    order = np.lexsort((s, y))
    return s[order], np.bincount(y, minlength=n_classes).astype(np.int64)


#: The bits of 1.0 as an unsigned integer.
_ONE_BITS = np.float64(1.0).view(np.uint64)


def _check_probs(probs) -> np.ndarray:
    """``check_probs``, with a short way for what serving passes: a float (N, K) array with values in [0, 1] and rows
    summing to 1 comes back as float64 after two passes (the largest bit pattern, row sums), exactly as
    ``check_probs`` would return it; anything else goes through ``check_probs``, which cleans it or refuses it with
    its message."""
    if (
        isinstance(probs, np.ndarray)
        and probs.dtype in (np.float32, np.float64)
        and probs.ndim == 2
        and probs.shape[0] > 0
        and probs.shape[1] >= 2
    ):
        p = probs.astype(np.float64, copy=False)
        # read as unsigned integers, the floats in [+0, 1] are those at most 1.0 (negative numbers, NaN and +-inf lie
        # above); -0.0 lies above as well, and passes the comparisons (which NaN fails both of, +-inf one of)
        in_range = p.view(np.uint64).max() <= _ONE_BITS or (p.min() >= 0.0 and p.max() <= 1.0)
        if in_range and np.all(np.abs(p.sum(axis=1) - 1.0) <= PROB_SUM_ATOL):
            return p
    return check_probs(probs)


def _check_alpha(alpha) -> float:
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(expected("alpha", "in (0, 1)", alpha)) from None
    if not 0.0 < a < 1.0:  # NaN fails too
        raise ValueError(expected("alpha", "in (0, 1)", alpha))
    return a


def _check_method(method, k_reg, lam) -> tuple[str, int, float]:
    if method not in METHODS:
        raise ValueError(expected("method", "'lac', 'aps' or 'raps'", method))
    if isinstance(k_reg, bool) or not isinstance(k_reg, (int, np.integer)) or k_reg < 0:
        raise ValueError(expected("k_reg", "an integer >= 0", k_reg))
    try:
        lam_ = float(lam)
    except (TypeError, ValueError):
        raise ValueError(expected("lam", "a finite number >= 0", lam)) from None
    if not (math.isfinite(lam_) and lam_ >= 0):
        raise ValueError(expected("lam", "a finite number >= 0", lam))
    if method != "raps":
        if k_reg != 0:
            raise ValueError(expected("k_reg", f"0 for the {method!r} score (only RAPS has a penalty)", k_reg))
        if lam_ != 0:
            raise ValueError(expected("lam", f"0 for the {method!r} score (only RAPS has a penalty)", lam))
    return method, int(k_reg), lam_


def _check_floor(floor, u) -> bool:
    if not isinstance(floor, (bool, np.bool_)):
        raise ValueError(expected("floor", "a bool", floor))
    if floor and u is not None:
        raise ValueError(expected("u", "None for the floor sets, which are not randomized", _shown(u)))
    return bool(floor)


def _floor_draws(n_rows: int, method: str) -> np.ndarray | None:
    """The draws u = 1 that make APS's and RAPS's randomized score the mass above the label (None for LAC)."""
    return None if method == "lac" else np.ones(n_rows)


def _top_labels(p: np.ndarray) -> np.ndarray:
    """(N, K): the most probable labels of each row (ties included), which a floor set always holds."""
    return p == p.max(axis=1, keepdims=True)


def _check_u(u, n_rows: int, method: str) -> np.ndarray | None:
    if u is None:
        return None
    if method == "lac":
        raise ValueError(
            f"Expected `u` to be None for the 'lac' score, which has no randomized version, but got {_shown(u)}"
        )
    if isinstance(u, (np.random.Generator, np.random.RandomState)):
        return u.uniform(size=n_rows)
    try:
        draws = np.asarray(u, dtype=np.float64)
    except (TypeError, ValueError):
        draws = None
    if draws is None or draws.shape != (n_rows,) or not np.all((draws >= 0) & (draws <= 1)):
        raise ValueError(
            f"Expected `u` to be {n_rows} uniform draws in [0, 1] (one per row) or a numpy random generator, "
            f"but got {_shown(u)}"
        )
    return draws


def _check_scores(scores) -> np.ndarray:
    try:
        s = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"Expected `scores` to be a 1-D array of finite numbers, but got {_shown(scores)}") from None
    if s.ndim != 1 or len(s) == 0 or not np.all(np.isfinite(s)):
        raise ValueError(
            f"Expected `scores` to be a non-empty 1-D array of finite numbers (n >= 1), but got {_shown(s)}"
        )
    return s


def _check_threshold(threshold, n_classes: int) -> float | np.ndarray:
    try:
        q = np.asarray(threshold, dtype=np.float64)
    except (TypeError, ValueError):
        q = None
    if q is None or q.shape not in ((), (n_classes,)) or np.isnan(q).any():
        raise ValueError(
            f"Expected `threshold` to be a number or one per class ({n_classes},), not NaN, but got {_shown(threshold)}"
        )
    return float(q) if q.ndim == 0 else q


def _shown(value: Any) -> str:
    """A short description of a refused value: arrays by shape (and a few values), anything else by repr."""
    if isinstance(value, (np.ndarray, list, tuple)):
        arr = np.asarray(value, dtype=object)
        head = arr.ravel()[:4].tolist()
        return f"an array of shape {arr.shape}" + (f" starting {head}" if arr.size else "")
    return repr(value.item() if isinstance(value, np.generic) else value)
