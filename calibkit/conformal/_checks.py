"""The input checks of the conformal package, and the conventions its modules share.

Each ``_check_*`` returns the cleaned value or raises ValueError naming the argument and the value given
(``calibkit.validation.expected``); ``_shown`` describes a refused value briefly.
``METHODS`` and ``SCORE_ATOL`` are defined here, below every module that reads them (the method check, the block
sums, the sets); ``scores`` and the package re-export them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from calibkit.validation import PROB_SUM_ATOL, check_int, check_probs, expected

#: The scores: least ambiguous set-valued classifier, adaptive prediction sets, regularized APS.
METHODS = ("lac", "aps", "raps")
#: Scores closer than this to a threshold count as equal to it (MAPIE's ``EPSILON``).
SCORE_ATOL = 1e-8


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
    k_reg = check_int("k_reg", k_reg, 0)
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
    return method, k_reg, lam_


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
