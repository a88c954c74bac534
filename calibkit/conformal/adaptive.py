"""Conformal prediction sets that adapt to shift: the threshold moves with the labels that come back.

Split conformal (``calibkit.conformal``) covers 1 - alpha only while serving stays exchangeable with the
calibration split. Under a shift of the inputs, the labels or the model it can fall far below, and it never
recovers. The rule here, the one the service serves, uses the labels that come back, in order, to move the
threshold so that the long-run share of misses goes back to alpha whatever the sequence, with no assumption on
the data at all.

It is the quantile tracker of conformal PID control (Angelopoulos, Candès & Tibshirani 2023, the P part),
q_{t+1} = q_t + eta (err_t - alpha), run on the log scale of the score's distance to the top of its range,
u = min(-log(1 - s / B), U) (for LAC, -log p_y), so that its steps shrink as the threshold nears the top of the
range (``LogQuantileTracker``, whose docstring says how it is fed and served, and what it guarantees). Folding the
stored labels in any chunks gives the same state, so replicas and restarts serve the same threshold bit for bit.

No rule promises coverage over a short window, or for one input: the bound is on the long-run average, and it says
the average comes back to alpha after a shift at a speed of about U / eta labels. A small step is slow to follow a
shift; a large one makes the threshold, and the set sizes, jitter from label to label.

Adaptive conformal inference (Gibbs & Candès 2021) and the tracker on the score scale, served before, lost on set
size under shift and failed under label delay; they remain in ``bench/conformal/shift.py``. Why:
``docs/decisions/0022-served-sets-and-coverage.md`` and ``0024-sets-under-label-delay.md``.

>>> from calibkit.conformal import SplitConformal
>>> probs = np.array([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25], [0.1, 0.6, 0.3], [0.5, 0.3, 0.2]])
>>> calibrator = SplitConformal.fit(probs, [0, 1, 1, 2], "lac")
>>> state = LogQuantileTracker.started(calibrator, alpha=0.4, eta=0.5)
>>> round(state.threshold(), 12)  # the static quantile at alpha
0.65
>>> state = state.fold([0.9, 0.0])  # a miss (0.9 > 0.65) raises the level; a hit lowers it by eta alpha
>>> state.labels, state.misses, state.threshold() > 0.65
(2, 1, True)
"""

from __future__ import annotations

import json  # noqa: F401  (the doctest uses it)
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from calibkit.conformal._checks import SCORE_ATOL
from calibkit.conformal.calibrator import SplitConformal
from calibkit.conformal.sets import prediction_sets, ranked_sets
from calibkit.validation import check_int, expected

__all__ = [
    "DEFAULT_METHOD",
    "DEFAULT_RELEASE",
    "DEFAULT_STEP",
    "STATE_FORMAT",
    "DEFAULT_SPAN",
    "LogQuantileTracker",
    "aci_thresholds",
    "check_misses",
    "log_scores",
    "log_thresholds",
    "misses_of",
    "score_range",
    "served_ranked_sets",
    "track",
]

#: The one adaptive rule the service serves (``CALIB_CONFORMAL__ADAPTATION``; the module docstring says why).
DEFAULT_METHOD = "log-quantile"
#: The log-scale tracker's eta the benchmark chose: at ``DEFAULT_SPAN`` its bound (U + eta) / (eta T) is within one
#: point at T = 10,000.
DEFAULT_STEP = 0.1
#: The log-scale tracker's U: the full set is served for labels whose score's distance to the top of the range, as
#: a share of that range, is below exp(-U) = 1e-4 (for LAC: a probability below 1e-4).
DEFAULT_SPAN = 4 * math.log(10)
#: The labels over which the log-scale tracker's served level comes down (its envelope's release).
DEFAULT_RELEASE = 50.0
#: The layout of ``to_dict``.
STATE_FORMAT = 2


# --- the ACI threshold -----------------------------------------------------------------------------------------


def aci_thresholds(sorted_scores, levels) -> np.ndarray:
    """The thresholds ACI serves at levels alpha_t, vectorized: the static split-conformal quantile at each level.

    For a level a in (0, 1), the ceil((n + 1)(1 - a))-th smallest score (``calibkit.conformal.quantile_rank``,
    +inf when that rank is n + 1); for a <= 0, +inf (the full set); for a >= 1, -inf (the empty set). Equal to
    ``SplitConformal.quantile(a)`` for every a in (0, 1). ``sorted_scores`` ascend (``SplitConformal.scores``);
    ``levels`` may have any shape, which the thresholds keep.

    Examples:
        >>> aci_thresholds([0.1, 0.3, 0.5, 0.9], [-0.1, 0.1, 0.4, 1.0]).tolist()
        [inf, inf, 0.5, -inf]
    """
    ascending = "a non-empty ascending 1-D array of finite numbers"
    s = _array("sorted_scores", sorted_scores, ascending, np.float64)
    if s.ndim != 1 or not len(s) or not np.all(np.isfinite(s)) or np.any(np.diff(s) < 0):
        raise ValueError(expected("sorted_scores", ascending, _shown(s)))
    a = _array("levels", levels, "finite numbers", np.float64)
    if not np.all(np.isfinite(a)):
        raise ValueError(expected("levels", "finite numbers", _shown(a)))
    m = len(s) + 1
    # l = #{j in 1..n+1 : j / (n + 1) <= a}, compared in floating point as calibkit.conformal's rank is
    below = np.searchsorted(np.arange(1, m + 1) / m, a, side="right")
    table = np.concatenate([[-math.inf], s, [math.inf]])
    return table[m - below]


def misses_of(scores, thresholds) -> np.ndarray:
    """err_t = 1[the set at threshold q_t missed the label], from the true labels' scores s_t: s_t - q_t > 1e-8.

    The sets of ``calibkit.conformal`` hold a label whose score is within ``SCORE_ATOL`` of the threshold, so this
    is exactly "the label is not in the served set" for LAC and the randomized APS and RAPS sets (the
    non-randomized APS and RAPS sets also always hold the top label). Any shapes that broadcast; err as int64 0 / 1.

    Examples:
        >>> misses_of([0.2, 0.7, 0.5], [0.5, 0.5, -math.inf]).tolist()
        [0, 1, 1]
    """
    s, q = np.asarray(scores, dtype=np.float64), np.asarray(thresholds, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return (s - q > SCORE_ATOL).astype(np.int64)


def check_misses(errs) -> np.ndarray:
    """Miss indicators, one or a 1-D sequence (booleans, integers or whole floats 0 and 1), as an int64 vector (T,)
    of 0 / 1."""
    e = np.atleast_1d(_array("errs", errs, "0 / 1 miss indicators"))
    if e.ndim != 1 or not (e.dtype == bool or np.issubdtype(e.dtype, np.number)):
        raise ValueError(expected("errs", "a 1-D sequence of 0 / 1 miss indicators", _shown(e)))
    with np.errstate(invalid="ignore"):
        ok = (e == 0) | (e == 1)
    if not np.all(ok):
        raise ValueError(expected("errs", "0 / 1 miss indicators", _shown(e[~ok])))
    return e.astype(np.int64)


# --- the log-scale tracker -------------------------------------------------------------------------------------


def score_range(calibrator: SplitConformal) -> float:
    """B, the largest score a marginal ``calibrator``'s method can give: 1 for LAC and APS, 1 + lam (K - k_reg)^+ for
    RAPS."""
    cal = _marginal(calibrator)
    return 1.0 + float(cal.lam) * max(0, int(cal.n_classes) - int(cal.k_reg))


def log_thresholds(levels, span: float, score_range: float) -> np.ndarray:
    """The thresholds the log-scale tracker serves at levels x_t, vectorized: B (1 - exp(-x)) for x in [0, U), +inf
    (the full set) for x >= U, -inf (the empty set) for x < 0; ``span`` is U > 0, ``score_range`` B > 0.

    Examples:
        >>> log_thresholds([-0.1, 0.0, math.log(2), 9.0], 9.0, 1.0).tolist()
        [-inf, 0.0, 0.5, inf]
    """
    x = np.asarray(levels, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        inside = score_range * -np.expm1(-np.clip(x, 0.0, span))
    return np.where(x >= span, math.inf, np.where(x < 0, -math.inf, inside))


def log_scores(scores, span: float, score_range: float) -> np.ndarray:
    """u = min(-log(1 - s / B), U) for scores s in [0, B]: the log-scale tracker's score, 0 at s = 0 and U from
    the top of the range (a score at or above B, or within B exp(-U) of it).

    Examples:
        >>> log_scores([0.0, 0.5, 1.0], 9.0, 1.0).round(4).tolist()
        [0.0, 0.6931, 9.0]
    """
    share = np.clip(np.asarray(scores, dtype=np.float64) / score_range, 0.0, 1.0)
    with np.errstate(divide="ignore"):
        return np.minimum(-np.log1p(-share), span)


def track(
    levels, smooth, scores, alpha: float, eta: float, span: float, score_range: float, release: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The log-scale tracker over labelled scores in order: x_{t+1} = max(x_t + eta (err_t - alpha), 0), err_t =
    1[u_t > x_t] the miss of the set the tracker holds when it folds the label, u_t = ``log_scores(s_t)``; and its
    envelope xbar_{t+1} = x_{t+1} if x_{t+1} >= xbar_t, else xbar_t + (x_{t+1} - xbar_t) / release: it follows x up at
    once and down over about ``release`` labels.

    Vectorized over leading axes (independent streams, for simulations); the same floating-point operations in
    the same order for one stream or many, so both give the same levels bit for bit. From x (``levels``) and xbar
    (``smooth``) of the leading shape and the labelled scores (leading shape plus (T,), in label order), returns (x,
    xbar, the number of misses among the T labels) after; the parameters are ``LogQuantileTracker``'s.
    """
    x = np.array(levels, dtype=np.float64)
    xbar = np.array(smooth, dtype=np.float64)
    u = log_scores(scores, span, score_range)
    misses = np.zeros(x.shape, dtype=np.int64)
    for t in range(u.shape[-1]):
        err = u[..., t] > x
        x = np.maximum(x + eta * (err - alpha), 0.0)
        xbar = np.where(x >= xbar, x, xbar + (x - xbar) / release)
        misses += err
    return x, xbar, misses


@dataclass(frozen=True)
class LogQuantileTracker:
    """The quantile tracker of conformal PID control (Angelopoulos, Candès & Tibshirani 2023) on the log scale of
    the score's distance to the top of its range, fed each label's own score, with the level kept at or above 0.

    The tracker holds a level x_t and serves the threshold B (1 - exp(-x_t)) on the score scale (``log_thresholds``;
    the full set from x_t >= U). Each label, in label order, comes with its conformity score s_t, computed when it
    arrives from the logged prediction; err_t = 1[u_t > x_t] says whether the set at the tracker's *current* level
    misses it (u_t = min(-log(1 - s_t / B), U)), and

        x_{t+1} = max(x_t + eta (err_t - alpha), 0).

    **Delay.** A label comes back long after its set was served, under an older threshold. Fed the misses of those
    served sets, the tracker is a high-gain loop with delay that winds up at either end. Fed each label's miss at its
    current level, x_t is a function of the scores alone, whatever the delay and batching: the delay only shifts
    which x_t a prediction is served with (the one of d labels earlier).

    **Served level: fast up, slow down.** The sets are served at the envelope xbar_t of the level: it follows x up at
    once and comes down over about ``release`` labels (``DEFAULT_RELEASE``), as a compressor's attack and release,
    so the level's jitter behind the labels does not under-cover on each downward swing, at the price of some
    coverage above target. The served set holds the tracker's own (xbar_t >= x_t), so every bound below holds for it.

    **Anti-windup.** At x = 0 the threshold is 0: the floor sets (``calibkit.conformal.floor_scores``) are at their
    smallest, the top label, and cannot shrink; misses below the rate alpha there would only wind the level down, so
    it stops at 0. From x >= U every set holds every class and nothing misses, so the level only comes down.

    **Guarantee.** For EVERY sequence of scores and every T, as their Proposition 1 (the floor at 0 only adds to
    x, so it keeps the one side that matters), the tracker's own misses satisfy

        (1/T) sum_{t<=T} err_t - alpha <= (U + eta) / (eta T),

    whatever the score range B, and so do the misses of sets served at max(x_t, xbar_t) with each label folded
    before the next prediction (no delay). A set served to a prediction whose label came d labels later is the
    tracker's set of d labels before, whose level differs from x_t by at most d eta max(alpha, 1 - alpha). When the
    labelled scores are i.i.d. the tracker's levels do not depend on the delay, and each served level is
    independent of the label it is judged on, so the served sets cover as the tracker's own do, at every delay;
    after a shift the served sets follow the same path as with no delay, d labels later. No rule promises coverage
    for one input or a short window; coverage above 1 - alpha is expected where the floor holds the level at 0
    (sets of one label that cover the model's top-1 accuracy).

    Attributes:
        alpha: The target miscoverage, in (0, 1).
        eta: The step on the log scale, > 0.
        start: x_1, in [0, span]; ``started`` takes the static calibrator's quantile at alpha.
        span: U, > 0.
        score_range: B, > 0: the largest score of the method (``score_range``).
        level: x_t, >= 0; None for ``start``.
        smooth: xbar_t, >= 0; None for ``start``.
        release: The labels over which the envelope comes down, >= 1.
        labels: T, the labels folded so far.
        misses: The tracker's own misses among them.

    References:
        Angelopoulos, Candès & Tibshirani 2023, "Conformal PID Control for Time Series Prediction", NeurIPS
        (Proposition 1).

    Examples:
        >>> state = LogQuantileTracker(alpha=0.1, eta=0.5, start=1.0, span=9.0)
        >>> state = state.fold([0.9, 0.0, 0.0])  # u = 2.3 > 1: a miss, the level rises by 0.45; two hits
        >>> round(state.level, 6), state.misses
        (1.35, 1)
        >>> LogQuantileTracker.from_dict(json.loads(json.dumps(state.to_dict()))) == state
        True
    """

    alpha: float
    eta: float
    start: float
    span: float = DEFAULT_SPAN
    score_range: float = 1.0
    level: float | None = None
    smooth: float | None = None
    release: float = DEFAULT_RELEASE
    labels: int = 0
    misses: int = 0

    def __post_init__(self) -> None:
        checked = {"alpha": _number("alpha", self.alpha, *_OPEN_UNIT)}
        for name in ("eta", "span", "score_range"):
            checked[name] = _number(name, getattr(self, name), *_POSITIVE)
        span = checked["span"]
        start = checked["start"] = _number("start", self.start, f"in [0, span = {span!r}]", lambda v: 0 <= v <= span)
        for name in ("level", "smooth"):
            value = getattr(self, name)
            checked[name] = start if value is None else _number(name, value, *_NON_NEGATIVE)
        checked["release"] = _number("release", self.release, *_AT_LEAST_ONE)
        checked["labels"], checked["misses"] = _check_counts(self.labels, self.misses)
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @classmethod
    def started(
        cls,
        calibrator: SplitConformal,
        alpha: float,
        eta: float,
        span: float = DEFAULT_SPAN,
        release: float = DEFAULT_RELEASE,
    ) -> LogQuantileTracker:
        """A fresh tracker started at ``calibrator``'s quantile at ``alpha`` (capped at its largest score, so that the
        start is a score of the range), on the log scale: x_1 = -log(1 - q / B), capped at ``span``."""
        cal = _marginal(calibrator)
        b = score_range(cal)
        q = min(float(aci_thresholds(cal.scores, _number("alpha", alpha, *_OPEN_UNIT))), float(cal.scores[-1]))
        span = _number("span", span, *_POSITIVE)
        return cls(alpha, eta, float(log_scores(q, span, b)), span, b, release=release)

    @property
    def bound(self) -> float:
        """(U + eta) / (eta T): the most the tracker's miss rate can exceed alpha (inf at T = 0)."""
        return math.inf if not self.labels else (self.span + self.eta) / (self.eta * self.labels)

    @property
    def served(self) -> float:
        """max(x_t, xbar_t): the level the sets are served at."""
        assert self.level is not None and self.smooth is not None  # set by __post_init__
        return max(self.level, self.smooth)

    def threshold(self, calibrator: SplitConformal | None = None) -> float:
        """The threshold to serve on the score scale: B (1 - exp(-y)) at the served level y, +inf (the full set)
        from y >= U. ``calibrator`` is not needed (B is part of the state); callers may pass one."""
        return float(log_thresholds(self.served, self.span, self.score_range))

    def sets(self, calibrator: SplitConformal, probs, *, u=None) -> np.ndarray:
        """The sets (N, K) to serve: ``prediction_sets`` at ``threshold``, all labels from x_t >= U."""
        cal, q = _marginal(calibrator), self.threshold()
        out = prediction_sets(probs, q, cal.method, k_reg=cal.k_reg, lam=cal.lam, u=u, floor=cal.floor)
        if q == math.inf or (q == -math.inf and not cal.floor):
            out[:] = q > 0
        return out

    def fold(self, scores) -> LogQuantileTracker:
        """The state after the labels with conformity scores ``scores`` (finite, >= 0, in label order; ``track``): the
        same for any split into chunks."""
        s = _check_label_scores(scores)
        level, smooth, misses = track(
            self.level, self.smooth, s, self.alpha, self.eta, self.span, self.score_range, self.release
        )
        counts = {"labels": self.labels + len(s), "misses": self.misses + int(misses)}
        return replace(self, level=float(level), smooth=float(smooth), **counts)

    def to_dict(self) -> dict:
        """The state as JSON data, which ``from_dict`` restores exactly."""
        return {"format": STATE_FORMAT, "method": "log-quantile", **{name: getattr(self, name) for name in _FIELDS}}

    @classmethod
    def from_dict(cls, data: dict) -> LogQuantileTracker:
        """The state ``to_dict`` wrote; a ValueError names ``data`` when it is not a log-scale tracker state of this
        format."""
        keys = {"format", "method", *_FIELDS}
        kind = f"a 'log-quantile' state of format {STATE_FORMAT} (to_dict's output)"
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT or data.get("method") != "log-quantile":
            raise ValueError(expected("data", kind, data))
        if set(data) != keys:
            raise ValueError(expected("data", f"the keys {sorted(keys)}", sorted(data)))
        return cls(**{name: data[name] for name in _FIELDS})


def _check_label_scores(scores) -> np.ndarray:
    s = np.atleast_1d(_array("scores", scores, "finite conformity scores >= 0", np.float64))
    if s.ndim != 1 or not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError(expected("scores", "a 1-D sequence of finite conformity scores >= 0", _shown(s)))
    return s


_FIELDS = ("alpha", "eta", "start", "span", "score_range", "level", "smooth", "release", "labels", "misses")


# --- helpers ---------------------------------------------------------------------------------------------------


def served_ranked_sets(
    calibrator: SplitConformal, probs, q: float, *, u=None, check_input: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """The sets a state serves at its threshold ``q``, as ``calibkit.conformal.ranked_sets`` lists them: (order,
    sizes), row i's set being ``order[i, :sizes[i]]``; every label at q = +inf and none at q = -inf, as the states'
    ``sets`` (a static threshold is never -inf), but the most probable labels for a floor calibrator, whose sets
    are never empty. ``calibrator`` is a marginal ``SplitConformal``; ``check_input`` as for ``ranked_sets``.
    """
    cal = _marginal(calibrator)
    order, sizes = ranked_sets(
        probs, q, cal.method, k_reg=cal.k_reg, lam=cal.lam, u=u, floor=cal.floor, check_input=check_input
    )
    if q == math.inf or (q == -math.inf and not cal.floor):
        sizes[:] = order.shape[1] if q > 0 else 0
    return order, sizes


def _marginal(calibrator) -> SplitConformal:
    if not isinstance(calibrator, SplitConformal) or calibrator.classwise:
        raise ValueError(expected("calibrator", "a marginal (not classwise) SplitConformal", calibrator))
    return calibrator


#: (requirement, test) pairs for ``_number``.
_OPEN_UNIT = ("in (0, 1)", lambda v: 0.0 < v < 1.0)
_POSITIVE = ("a finite number > 0", lambda v: math.isfinite(v) and v > 0)
_NON_NEGATIVE = ("a finite number >= 0", lambda v: math.isfinite(v) and v >= 0)
_AT_LEAST_ONE = ("a finite number >= 1", lambda v: math.isfinite(v) and v >= 1)


def _number(name: str, value, requirement: str, ok: Callable[[float], bool]) -> float:
    """``value`` as a float, if it is a number (not a boolean or a string) that passes ``ok``; else an error naming
    ``name``, ``requirement`` and the value."""
    try:
        v = float(value) if not isinstance(value, (bool, np.bool_, str, bytes)) else math.nan
    except (TypeError, ValueError):
        v = math.nan
    if not ok(v):
        raise ValueError(expected(name, requirement, value))
    return v


def _check_counts(labels, misses) -> tuple[int, int]:
    labels, misses = check_int("labels", labels, 0), check_int("misses", misses, 0)
    if misses > labels:
        raise ValueError(expected("misses", f"at most labels ({labels})", misses))
    return labels, misses


def _array(name: str, values, requirement: str, dtype=None) -> np.ndarray:
    try:
        return np.asarray(values, dtype=dtype)
    except (TypeError, ValueError):
        raise ValueError(expected(name, requirement, values)) from None


def _shown(value: Any) -> str:
    arr = np.asarray(value, dtype=object)
    return f"shape {arr.shape}, starting {arr.ravel()[:4].tolist()}"
