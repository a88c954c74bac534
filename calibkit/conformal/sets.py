"""Prediction sets C(x) = {k : s(x, k) <= q} and the conformal p-values whose level sets they are.

As boolean masks (``prediction_sets``, one threshold or one per class), as each row's ranking and set size
(``ranked_sets``), and as p-values per class (``_p_values_from_scores``, public as ``SplitConformal.p_values``).
Vovk, Gammerman & Shafer 2005; Romano, Sesia & Candès 2020 (APS); Angelopoulos, Bates, Malik & Jordan 2021 (RAPS).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from calibkit.conformal import _ranking
from calibkit.conformal._checks import (
    SCORE_ATOL,
    _check_floor,
    _check_method,
    _check_probs,
    _check_scores,
    _check_threshold,
    _check_u,
    _floor_draws,
    _top_labels,
)
from calibkit.conformal._ranking import _block_sizes, _KeyRanking, _position_penalty, _Ranked
from calibkit.conformal.quantile import _sort_by_class
from calibkit.validation import expected

#: The one-threshold sets look at this many top labels first (a partition instead of a sort, and a cumulative sum
#: over a few columns); the rows whose set reaches further, or whose last tie group may, are then sorted whole.
PREFIX_WIDTH = 32


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
    - APS and RAPS with draws ``u``: C(x) = {k : s(x, k, u) <= q}, the randomized score of ``conformity_scores``
      with the row's draw, so the label at which the scores cross q is in with probability (q - s(x, k, 1)) / p_k;
      sets can be empty. Exact coverage, as MAPIE's ``include_last_label="randomized"`` for APS.
    - ``floor=True``: C(x) = {k : s(x, k) <= q} for the scores of ``floor_scores``: never empty at q >= 0, the
      same for the same input, coverage at least 1 - alpha with that function's scores.

    Scores within ``SCORE_ATOL`` of q count as equal to it. A +inf threshold gives every class. With one threshold
    and at least ``RANK_MIN_CLASSES`` classes the rows are ranked by integer keys and sized by block sums
    (``_KeyRanking``, ``_block_sizes``); otherwise, and for the rows those do not settle, by a partition or a sort.

    ``threshold`` is q (possibly +inf), or one per class (K,) from ``classwise_quantiles``; ``k_reg``, ``lam`` and
    ``u`` are as in ``conformity_scores``. Returns the sets (N, K): True where the class is in the set of the row.

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
    of the ranking and its size says which. The sizes come from the same floating-point expressions, key ranking
    and block sums as ``prediction_sets``'s, hence the same sets bit for bit. A threshold per class is refused:
    Mondrian sets need not be prefixes.

    ``check_input=False`` skips the checks of ``probs``, ``threshold`` and ``u`` (scikit-learn's ``check_input``),
    for a caller that passes what it made itself: a float array (N, K) of rows in [0, 1] summing to 1, one number,
    None or N draws in [0, 1] as a float64 array. What it passes otherwise is not refused, and the sets are undefined.

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


def _p_values_from_scores(
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
    thresholds of ``classwise_quantiles``. ``scores`` (n,) are computed with the same method, ``k_reg`` and ``lam``;
    the other arguments are those of ``prediction_sets`` (``floor``: p_k = 1 for the most probable labels). Returns
    the p-values (N, K), in [1 / (n + 1), 1].

    References:
        Vovk, Gammerman & Shafer 2005, "Algorithmic Learning in a Random World" (conformal p-values, Mondrian
        conformal prediction); Angelopoulos & Bates 2021, "A Gentle Introduction to Conformal Prediction and
        Distribution-Free Uncertainty Quantification".

    Examples:
        >>> from calibkit.conformal import conformal_quantile
        >>> probs, scores = np.array([[0.6, 0.3, 0.1]]), [0.2, 0.4, 0.5, 0.8]
        >>> _p_values_from_scores(probs, scores, "lac").tolist()  # t = 0.4, 0.7, 0.9
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


def _sets(p: np.ndarray, q: float | np.ndarray, method: str, k_reg: int, lam: float, draws) -> np.ndarray:
    if method == "lac":
        return (1.0 - p) - q <= SCORE_ATOL
    if isinstance(q, np.ndarray):
        # one threshold per class: compare each label's statistic with its class's threshold
        stat, top, strict = _statistic(p, method, k_reg, lam, draws)
        if strict:
            return top | (stat - q < -SCORE_ATOL)
        return stat - q <= SCORE_ATOL
    if p.shape[1] >= _ranking.RANK_MIN_CLASSES and math.isfinite(q):
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
    if n_classes >= _ranking.RANK_MIN_CLASSES:
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
