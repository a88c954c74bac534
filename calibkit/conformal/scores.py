"""The conformity scores s(x, y) of split-conformal classification, large when y is an unlikely label for x.

LAC, 1 - p_y (Sadinle, Lei & Wasserman 2019); APS, the mass of the labels ranked at or above y (Romano, Sesia &
Candès 2020); RAPS, APS plus a penalty on y's rank (Angelopoulos, Bates, Malik & Jordan 2021), with ``pick_k_reg``
for its ``k_reg``; and the scores of the floor sets (``floor_scores``).
"""

from __future__ import annotations

import numpy as np

from calibkit.conformal._checks import (
    METHODS,
    SCORE_ATOL,
    _check_floor,
    _check_method,
    _check_probs,
    _check_u,
    _floor_draws,
)
from calibkit.conformal._ranking import _Ranked
from calibkit.conformal.quantile import conformal_quantile
from calibkit.validation import check_labels

__all__ = [
    "METHODS",
    "SCORE_ATOL",
    "conformity_scores",
    "floor_scores",
    "pick_k_reg",
]


def conformity_scores(
    probs, labels, method: str = "lac", *, k_reg: int = 0, lam: float = 0.0, u=None, floor: bool = False
) -> np.ndarray:
    """The scores s(x_i, y_i) of labelled examples by LAC, APS or RAPS.

    - LAC: s(x, y) = 1 - p_y. Its sets {k : 1 - p_k <= q} are the smallest on average among all sets with the same
      coverage (Sadinle et al. 2019), at the price of covering easy inputs more than hard ones.
    - APS: s(x, y) = rho_x(y) + p_y, the mass of the labels ranked at or above y, with rho_x(y) the sum of p_k over
      the labels with p_k > p_y. Randomized, rho_x(y) + p_y - u p_y with u ~ Uniform(0, 1), so that the scores have
      no ties and the coverage is exact rather than at least 1 - alpha.
    - RAPS: the APS score plus lam (o_x(y) - k_reg)^+, with o_x(y) = #{k : p_k >= p_y} the 1-based rank of y (tied
      labels share the last rank of their group); the penalty, never randomized, shrinks the sets of inputs whose
      tail probabilities are noise. ``k_reg=0, lam=0`` is APS; ``pick_k_reg`` picks ``k_reg`` from data. The
      scores lie in [0, 1 + lam (K - k_reg)^+].

    ``u`` is None, or for APS and RAPS the uniform draws of the randomized score: N numbers in [0, 1] or a numpy
    random generator (LAC has no randomized version). ``floor`` gives the scores of ``floor_scores`` instead.

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
    Returns k_reg, in [1, K].

    References:
        Angelopoulos, Bates, Malik & Jordan 2021, "Uncertainty Sets for Image Classifiers using Conformal
        Prediction", ICLR (the choice of k_reg and lambda).
    """
    p = _check_probs(probs)
    y = check_labels(labels, p.shape[0], p.shape[1])
    ranks = np.count_nonzero(p >= p[np.arange(len(y)), y][:, None], axis=1).astype(np.float64)
    return int(min(conformal_quantile(ranks, alpha), p.shape[1]))
