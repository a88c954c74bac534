"""An anytime-valid alarm for label shift, from the calibrated probabilities of UNLABELLED served predictions.

Each served prediction gives its calibrated probability vector p_t (K classes). The reference q is the mean
calibrated probability of each class on n validation rows (the manifest's ``label_shift.mean_probabilities``). The
null hypothesis is that every class's mean stays inside a band around the reference, at every time, given the past:

    H0:  lower_k <= E[p_tk | past] <= upper_k   for every class k and every t,
    lower_k = q_k - r_k^- - tolerance,   upper_k = q_k + r_k^+ + tolerance   (clipped to [0, 1]).

Why this tests the priors. Under label shift alone (p(x | y) kept, the priors pi moved), E_t[p_k] = sum_y M_ky
pi_t(y) with M_ky = E_s[p_k | y] in [0, 1], so E_t[p_k] - E_s[p_k] = sum_y M_ky (pi_t(y) - pi_s(y)), a sum whose
weights lie in [0, 1] over differences summing to 0: |E_t p_k - E_s p_k| <= TV(pi_t, pi_s). A change of the priors of
total variation at most ``tolerance`` is inside H0; the alarm reports one that moves some class's mean further. A
covariate shift that moves the predictions moves these means too, and can raise the alarm: without labels it cannot
always be told from a label shift (the benchmark reports the firing rate under covariate shift). And a shift of the
priors that leaves every class's mean inside the band (a model that cannot tell the classes apart) is not seen.

The reference's own error. q averages n rows, so the validation means E_s[p_k] lie within [q_k - r_k^-, q_k + r_k^+]
with probability at least 1 - epsilon, simultaneously for all k (``reference_tolerance``: the Chernoff bound of
Hoeffding 1963 for [0, 1]-valued means, inverted exactly, with a union bound over the 2K one-sided bounds). Traffic
from the validation distribution, or label-shifted by at most ``tolerance``, is therefore inside H0 outside an event
of probability epsilon over the validation draw; without these margins a reference of a few hundred rows would
raise the alarm on unshifted traffic in the end. The margins are per class and asymmetric: a rare class's mean is
known more precisely than that of a class near 1/2.

The statistic (Shin, Ramdas & Rinaldo 2023). For each class k and side, a CUSUM e-detector per bet
lambda_j, log S_t = max(log S_{t-1}, 0) + log e_t, of the betting e-values (Waudby-Smith & Ramdas 2023)

    up:    e_t = 1 + lambda_j (p_tk - upper_k),  lambda_j = f_j / upper_k,
    down:  e_t = 1 + lambda_j (lower_k - p_tk),  lambda_j = f_j / (1 - lower_k),

with fractions f_j in (0, 1) (``fractions``) of the largest bet that keeps e_t >= 0 for every p_tk in [0, 1]; under
H0 E[e_t | past] = 1 + lambda_j (E[p_tk | past] - upper_k) <= 1 (down: likewise). A side whose edge is trivial
(upper_k = 1, lower_k = 0) carries no detector. The statistic M_t is the average over the live sides of the average
over their bets of S_t, itself an e-detector; the alarm is raised when M_t reaches A (``threshold``).

Guarantee under H0 (outside the epsilon of the reference): E[predictions to a false alarm] >= A, and
P(a false alarm within n predictions) <= n / A. Over the validation draw too: at most epsilon + n / A. The least
favourable nulls have some class's mean on an edge of its band; the bound holds for all of them, and no coupling
reduces them to one law (the probability vectors' law is arbitrary), so the default threshold rests on the bound:
A = ``DEFAULT_THRESHOLD`` = ``threshold_for()`` = 10^6 / 0.01, at most 1% false alarms per million predictions,
with no simulation. Predictions, unlike labels, are plentiful (a busy service serves millions a day), so the bound
is set per million; it costs a delay of log(A) / KL predictions, which at the rate predictions come is short.

Hysteresis. A raised alarm clears when the evidence that the traffic is back inside the band is strong: the reverse
null, "some class's mean stays beyond its edge on one side" (E[p_tk | past] >= upper_k, or <= lower_k), is tested by
the mirrored e-values (up: e_t = 1 + lambda_j (upper_k - p_tk), lambda_j = f_j / (1 - upper_k); down: e_t = 1 +
lambda_j (p_tk - lower_k), lambda_j = f_j / lower_k) in CUSUM e-detectors started afresh at the raise. The alarm
clears when, for every live side, the average over its bets reaches B (``clear_threshold``), and at least
``min_clear`` predictions have followed the raise. While one class's mean stays beyond one edge, that side's
detector is an e-detector, so P(a clear within n predictions of the raise) <= n / B. A clear resets the raising
detectors, so the next alarm is again a fresh test with its bound n / A. A stream whose mean sits exactly on an edge
is under both nulls: it raises and clears rarely, rather than flapping as a statistic compared with one level would.

The state holds the log S of both detectors, the predictions folded, the index of the latest raise and clear, the
count of raises, and two means per class for reports (``summary``): since the latest raise or clear, and an
exponentially weighted one of half-life ``half_life`` predictions. It has a leading axis of independent streams
(for simulations), folded row by row; a single stream's stretch of predictions without an alarm is folded at once,
by cumulative sums and minima (U_i = C_i + max(U_0, -min(0, C_1..C_{i-1})): a service folds thousands a second).
Folding in one call or in many gives the same raises and clears at the same predictions and the same statistics to
rounding (a stretch's sums round by where it starts). A service keeps one state per model, folded under a lock, so
its replicas read the same bits.
``to_dict`` / ``from_dict`` carry a single-stream state through JSON exactly.

References: Shin, Ramdas & Rinaldo 2023, "E-detectors: a nonparametric framework for sequential change
detection", New England Journal of Statistics in Data Science; Waudby-Smith & Ramdas 2023, "Estimating means of
bounded random variables by betting", JRSS-B; Hoeffding 1963, "Probability inequalities for sums of bounded random
variables", JASA (the Chernoff bound of Theorem 1); Saerens, Latinne & Decaestecker 2002 and Lipton, Wang & Smola
2018 (label shift: p(x | y) kept, the priors moved).

>>> config = LabelShiftAlarmConfig(reference=(0.5, 0.3, 0.2), tolerance=0.05, threshold=100.0, clear_threshold=100.0)
>>> state = LabelShiftAlarmState.fresh(config).fold([[0.1, 0.1, 0.8]] * 20)  # class 2 far above its 0.2
>>> bool(state.alarmed[0]), int(state.raised_at[0]), state.summary()["driver"]
(True, 10, {'class': 2, 'side': 'up'})
>>> state = state.fold([[0.5, 0.3, 0.2]] * 300)  # the reference's traffic again
>>> bool(state.alarmed[0]), int(state.cleared_at[0])
(False, 213)
>>> LabelShiftAlarmState.from_dict(json.loads(json.dumps(state.to_dict())), config) == state
True
"""

from __future__ import annotations

import json  # noqa: F401  (the doctest uses it)
import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
from scipy import signal, special

from calibkit.mixture import crosses, log_mixture
from calibkit.validation import PROB_SUM_ATOL, expected

if TYPE_CHECKING:
    from calibkit.manifest import LabelShiftReference

__all__ = [
    "DEFAULT_CLEAR_THRESHOLD",
    "DEFAULT_EPSILON",
    "DEFAULT_FRACTIONS",
    "DEFAULT_HALF_LIFE",
    "DEFAULT_PREDICTIONS",
    "DEFAULT_RATE",
    "DEFAULT_THRESHOLD",
    "DEFAULT_TOLERANCE",
    "STATE_FORMAT",
    "LabelShiftAlarmConfig",
    "LabelShiftAlarmState",
    "reference_tolerance",
    "threshold_for",
]

#: The false-alarm budget the default threshold is for: at most DEFAULT_RATE per DEFAULT_PREDICTIONS predictions.
DEFAULT_PREDICTIONS, DEFAULT_RATE = 1_000_000, 0.01
#: A, the default threshold: DEFAULT_PREDICTIONS / DEFAULT_RATE (the module docstring says why).
DEFAULT_THRESHOLD = 1e8
#: B, the default clearing threshold: a shift that persists is dropped as rarely as a false alarm is raised.
DEFAULT_CLEAR_THRESHOLD = 1e8
#: The material change: a prior change of total variation up to this is inside the null. It bounds the change of
#: every class's mean and of the accuracy (sum_y acc_y (pi_t(y) - pi_s(y)), acc_y in [0, 1]) to two points, the
#: accuracy estimate's own error goal.
DEFAULT_TOLERANCE = 0.02
#: The probability of a validation draw whose means miss the reference's margins.
DEFAULT_EPSILON = 0.01
#: The bets, as fractions of the largest bet that keeps the e-value >= 0: a geometric grid from bold to cautious.
DEFAULT_FRACTIONS = (0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625)
#: The half-life, in predictions, of the exponentially weighted class means that ``summary`` reports.
DEFAULT_HALF_LIFE = 1000.0
#: The layout of ``to_dict``.
STATE_FORMAT = 1

_EDGE = 1e-6  # bets keep their centre this far inside (0, 1); moving a centre outwards only widens the null tested
_CHUNK = 128  # predictions whose e-values are computed at once (bounds the memory of a long fold)
_BISECTIONS = 64  # halvings of [0, 1]: below a double's spacing


def reference_tolerance(n: int, reference, epsilon: float = DEFAULT_EPSILON) -> tuple[np.ndarray, np.ndarray]:
    """(r^-, r^+): how far below and above the reference q the validation means may lie, simultaneously for every
    class, but with probability epsilon over the n rows that q averages.

    For i.i.d. values in [0, 1] of mean mu, P(mean of n >= mu + t) <= exp(-n kl(mu + t || mu)) and likewise below
    (Hoeffding 1963, Theorem 1; kl the Bernoulli relative entropy). Inverting it, mu lies in {mu : n kl(q_k || mu)
    <= log(2K / epsilon)} but with probability epsilon / (2K) on each side, so in all K intervals but with
    probability epsilon (a union bound). The interval is that of a Bernoulli mean, the widest law on [0, 1] for a
    given mean; it is narrow near 0 and 1 and widest at 1/2. r^- = q - its lower end, r^+ = its upper end - q.

    Args:
        n: The number of validation rows q averages, an integer >= 1.
        reference: q, K >= 2 numbers in [0, 1] summing to 1.
        epsilon: The probability of a draw outside the margins, in (0, 1).

    Returns:
        Two (K,) arrays of margins >= 0.

    Raises:
        ValueError: Naming ``n``, ``reference`` or ``epsilon`` when one is out of range.

    Examples:
        >>> below, above = reference_tolerance(359, [0.1] * 10)
        >>> round(float(below[0]), 3), round(float(above[0]), 3)
        (0.05, 0.073)
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(expected("n", "an integer >= 1", n))
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.floating)) or not 0 < epsilon < 1:
        raise ValueError(expected("epsilon", "in (0, 1)", epsilon))
    q = _check_reference(reference)
    level = math.log(2 * len(q) / float(epsilon)) / int(n)
    return q - _kl_end(q, level, upper=False), _kl_end(q, level, upper=True) - q


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


def threshold_for(predictions: int = DEFAULT_PREDICTIONS, rate: float = DEFAULT_RATE) -> float:
    """A = predictions / rate: the level at which P(a false alarm within ``predictions`` predictions) <= ``rate``
    under H0.

    Raises:
        ValueError: Naming ``predictions`` or ``rate`` when one is out of range.

    Examples:
        >>> threshold_for(1_000_000, 0.01) == DEFAULT_THRESHOLD
        True
    """
    if isinstance(predictions, bool) or not isinstance(predictions, (int, np.integer)) or predictions < 1:
        raise ValueError(expected("predictions", "an integer >= 1", predictions))
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.floating)) or not 0 < rate < 1:
        raise ValueError(expected("rate", "in (0, 1)", rate))
    return float(predictions) / float(rate)


def _check_reference(reference) -> np.ndarray:
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


def _is_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))


@dataclass(frozen=True)
class LabelShiftAlarmConfig:
    """The alarm's settings: ``reference``, ``n_reference``, ``tolerance``, ``epsilon`` and ``threshold`` make the
    guarantee, ``clear_threshold`` and ``min_clear`` the clearing, ``fractions`` the speed.

    Attributes:
        reference: q, the mean calibrated probability of each class on the validation rows (K >= 2, summing to 1).
        n_reference: The rows q averages, for its margins (``reference_tolerance``); None when q is the exact mean
            (a simulation, or a reference of so many rows that its error is negligible).
        tolerance: The material change, in [0, 1): a prior change of total variation up to it is inside the null.
        epsilon: The probability of a validation draw outside the reference's margins, in (0, 1).
        threshold: A > 1: the alarm is raised when the statistic reaches A (``threshold_for``).
        clear_threshold: B > 1: a raised alarm clears when the evidence that every class is back inside reaches B.
        min_clear: The predictions after a raise before the alarm may clear, an integer >= 0.
        fractions: f_j in (0, 1): each side bets these fractions of its largest bet.
        half_life: The half-life, in predictions (> 0), of the weighted means of ``summary``.

    Raises:
        ValueError: Naming the field and the value when one is out of range, or when the band leaves no side a
            detector.
    """

    reference: tuple[float, ...]
    n_reference: int | None = None
    tolerance: float = DEFAULT_TOLERANCE
    epsilon: float = DEFAULT_EPSILON
    threshold: float = DEFAULT_THRESHOLD
    clear_threshold: float = DEFAULT_CLEAR_THRESHOLD
    min_clear: int = 0
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    half_life: float = DEFAULT_HALF_LIFE

    def __post_init__(self) -> None:
        object.__setattr__(self, "reference", tuple(float(x) for x in _check_reference(self.reference)))
        if self.n_reference is not None and (
            isinstance(self.n_reference, bool)
            or not isinstance(self.n_reference, (int, np.integer))
            or self.n_reference < 1
        ):
            raise ValueError(expected("n_reference", "an integer >= 1, or None", self.n_reference))
        if not _is_number(self.tolerance) or not 0 <= self.tolerance < 1:
            raise ValueError(expected("tolerance", "in [0, 1)", self.tolerance))
        if not _is_number(self.epsilon) or not 0 < self.epsilon < 1:
            raise ValueError(expected("epsilon", "in (0, 1)", self.epsilon))
        for name in ("threshold", "clear_threshold"):
            value = getattr(self, name)
            if not _is_number(value) or not (math.isfinite(value) and value > 1):
                raise ValueError(expected(name, "a finite number > 1", value))
            object.__setattr__(self, name, float(value))
        if isinstance(self.min_clear, bool) or not isinstance(self.min_clear, (int, np.integer)) or self.min_clear < 0:
            raise ValueError(expected("min_clear", "an integer >= 0", self.min_clear))
        fractions = tuple(self.fractions) if isinstance(self.fractions, (tuple, list)) else None
        if not fractions or not all(_is_number(f) and 0 < f < 1 for f in fractions):
            raise ValueError(expected("fractions", "a non-empty sequence of numbers in (0, 1)", self.fractions))
        if not _is_number(self.half_life) or not (math.isfinite(self.half_life) and self.half_life > 0):
            raise ValueError(expected("half_life", "a finite number > 0", self.half_life))
        object.__setattr__(self, "fractions", tuple(float(f) for f in fractions))
        object.__setattr__(self, "tolerance", float(self.tolerance))
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "half_life", float(self.half_life))
        if self.n_reference is not None:
            object.__setattr__(self, "n_reference", int(self.n_reference))
        object.__setattr__(self, "min_clear", int(self.min_clear))
        if not self.live.any():
            raise ValueError(
                expected("tolerance", "small enough that some class's band has an edge inside (0, 1)", self.tolerance)
            )

    @classmethod
    def for_reference(cls, label_shift: LabelShiftReference, **settings) -> LabelShiftAlarmConfig:
        """The settings for a manifest's ``label_shift`` entry: its mean probabilities and row count, and
        ``settings`` (the other fields)."""
        return cls(reference=tuple(label_shift.mean_probabilities), n_reference=label_shift.n_samples, **settings)

    @property
    def classes(self) -> int:
        """K."""
        return len(self.reference)

    @cached_property
    def margins(self) -> tuple[np.ndarray, np.ndarray]:
        """(r^-, r^+) of ``reference_tolerance``, zeros without ``n_reference``."""
        q = np.asarray(self.reference)
        if self.n_reference is None:
            return np.zeros_like(q), np.zeros_like(q)
        return reference_tolerance(self.n_reference, q, self.epsilon)

    @cached_property
    def lower(self) -> np.ndarray:
        """lower_k = max(0, q_k - r_k^- - tolerance)."""
        return np.maximum(0.0, np.asarray(self.reference) - self.margins[0] - self.tolerance)

    @cached_property
    def upper(self) -> np.ndarray:
        """upper_k = min(1, q_k + r_k^+ + tolerance)."""
        return np.minimum(1.0, np.asarray(self.reference) + self.margins[1] + self.tolerance)

    @cached_property
    def live(self) -> np.ndarray:
        """(2, K): whether each side (row 0 up, row 1 down) of each class has a detector (its edge is not 1 or 0)."""
        return np.stack([self.upper < 1.0, self.lower > 0.0])

    @cached_property
    def _sides(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(centre (2K,), sign (2K,), raising bets (2K, J), clearing bets (2K, J)) of the sides, up then down: the
        raising e-value is 1 + lambda sign (p - centre), the clearing one 1 - lambda' sign (p - centre)."""
        live = self.live.ravel()
        centre = np.clip(np.concatenate([self.upper, self.lower]), _EDGE, 1 - _EDGE)
        sign = np.repeat([1.0, -1.0], self.classes)
        largest = np.where(sign > 0, 1.0 / centre, 1.0 / (1.0 - centre))  # the raising bet that keeps e >= 0
        largest_clear = np.where(sign > 0, 1.0 / (1.0 - centre), 1.0 / centre)
        f = np.asarray(self.fractions)
        raising = np.where(live[:, None], largest[:, None] * f, 0.0)
        clearing = np.where(live[:, None], largest_clear[:, None] * f, 0.0)
        return centre, sign, raising, clearing

    def log_e_values(self, probs: np.ndarray, clearing: bool = False) -> np.ndarray:
        """log e of each (side, class, bet) for probability vectors ``probs`` (..., K): the raising e-values, or with
        ``clearing`` the clearing ones; (..., 2K J), sides up then down, classes, bets innermost; 0 on sides without
        a detector."""
        centre, sign, raising, clear = self._sides
        gap = (np.concatenate([probs, probs], axis=-1) - centre) * sign  # (..., 2K): > 0 beyond the edge
        shape = (*gap.shape[:-1], raising.size)
        return (np.log1p(-gap[..., None] * clear) if clearing else np.log1p(gap[..., None] * raising)).reshape(shape)

    @cached_property
    def log_weights(self) -> np.ndarray:
        """(2K J,): log w of the raising mixture: equal over live sides and over their bets, -inf elsewhere."""
        live = self.live.ravel()
        w = np.where(live, 1.0 / (live.sum() * len(self.fractions)), 0.0)
        with np.errstate(divide="ignore"):
            return np.log(np.repeat(w, len(self.fractions)))

    @cached_property
    def log_threshold(self) -> float:
        """log A."""
        return math.log(self.threshold)

    @cached_property
    def log_clear_threshold(self) -> float:
        """log B."""
        return math.log(self.clear_threshold)

    @cached_property
    def decay(self) -> float:
        """The weight a prediction keeps per later prediction in the weighted means: 0.5 ** (1 / half_life)."""
        return 0.5 ** (1.0 / self.half_life)

    def to_dict(self) -> dict:
        """The settings as JSON data."""
        return {
            "reference": list(self.reference),
            "n_reference": self.n_reference,
            "tolerance": self.tolerance,
            "epsilon": self.epsilon,
            "threshold": self.threshold,
            "clear_threshold": self.clear_threshold,
            "min_clear": self.min_clear,
            "fractions": list(self.fractions),
            "half_life": self.half_life,
        }


def _cusum(start: np.ndarray, log_e: np.ndarray) -> np.ndarray:
    """The trajectory (T, ...) of CUSUMs U_i = max(U_{i-1}, 0) + x_i from U_0 = ``start`` over the rows of ``log_e``:
    U_i = C_i + max(U_0, -min(0, C_1, ..., C_{i-1})) with C_i = x_1 + ... + x_i."""
    c = np.cumsum(log_e, axis=0)
    low = np.minimum.accumulate(np.concatenate([np.zeros_like(c[:1]), c[:-1]]), axis=0)
    return c + np.maximum(start[None], -np.minimum(low, 0.0))


def _side_mixtures(log_s: np.ndarray, classes: int, bets: int) -> np.ndarray:
    """log of the mean over bets of S, per side: (streams, 2K J) -> (streams, 2, K)."""
    grouped = log_s.reshape(log_s.shape[0], 2, classes, bets)
    return special.logsumexp(grouped, axis=3) - math.log(bets)


@dataclass(frozen=True, eq=False)
class LabelShiftAlarmState:
    """The alarm's state for ``streams`` independent streams; frozen: ``fold`` returns a new state.

    Attributes:
        config: The settings.
        log_statistic: log S of the raising detectors, (streams, 2K J): sides up then down, classes, bets.
        log_clear: log S of the clearing detectors, of the same shape; 0 while a stream is not alarmed.
        predictions: The predictions folded into every stream.
        raised_at: Per stream, the index (from 0) of the prediction of the latest raise; -1 while none.
        cleared_at: Per stream, the index of the prediction of the latest clear; -1 while none.
        raises: Per stream, the alarms raised so far.
        since_sum: (streams, K) sums of the probabilities since the latest raise or clear (or the start).
        recent_sum: (streams, K) exponentially weighted sums of the probabilities (``half_life``).
        recent_weight: The weight those sums hold, the same for every stream.
    """

    config: LabelShiftAlarmConfig
    log_statistic: np.ndarray
    log_clear: np.ndarray
    predictions: int
    raised_at: np.ndarray
    cleared_at: np.ndarray
    raises: np.ndarray
    since_sum: np.ndarray
    recent_sum: np.ndarray
    recent_weight: float

    def __post_init__(self) -> None:
        cfg = self.config
        if not isinstance(cfg, LabelShiftAlarmConfig):
            raise ValueError(expected("config", "a LabelShiftAlarmConfig", cfg))
        d, k = 2 * cfg.classes * len(cfg.fractions), cfg.classes
        arrays = {}
        for name in ("log_statistic", "log_clear"):
            a = np.array(getattr(self, name), dtype=np.float64)
            if a.ndim != 2 or a.shape[1] != d or not np.all(np.isfinite(a)):
                raise ValueError(expected(name, f"finite, of shape (streams, {d})", a.shape))
            arrays[name] = a
        s = arrays["log_statistic"].shape[0]
        if arrays["log_clear"].shape[0] != s:
            raise ValueError(expected("log_clear", f"of shape ({s}, {d})", arrays["log_clear"].shape))
        n = self.predictions
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(expected("predictions", "an integer >= 0", n))
        for name in ("raised_at", "cleared_at", "raises"):
            a = np.array(getattr(self, name), dtype=np.int64)
            low = 0 if name == "raises" else -1
            high = int(n) + 1 if name == "raises" else max(int(n), 0)
            if a.shape != (s,) or np.any((a < low) | (a >= high)):
                raise ValueError(expected(name, f"{s} integers in [{low}, {high})", getattr(self, name)))
            arrays[name] = a
        raised, cleared = arrays["raised_at"], arrays["cleared_at"]
        if np.any((cleared >= 0) & ((raised < 0) | (cleared == raised))):
            raise ValueError(expected("cleared_at", "-1, or the index of a clear after a raise", self.cleared_at))
        for name in ("since_sum", "recent_sum"):
            a = np.array(getattr(self, name), dtype=np.float64)
            if a.shape != (s, k) or not np.all(np.isfinite(a)):
                raise ValueError(expected(name, f"finite, of shape ({s}, {k})", a.shape))
            arrays[name] = a
        w = self.recent_weight
        if not _is_number(w) or not (math.isfinite(w) and w >= 0):
            raise ValueError(expected("recent_weight", "a finite number >= 0", w))
        for name, array in arrays.items():
            array.setflags(write=False)
            object.__setattr__(self, name, array)
        object.__setattr__(self, "predictions", int(n))
        object.__setattr__(self, "recent_weight", float(w))

    @classmethod
    def fresh(cls, config: LabelShiftAlarmConfig, streams: int = 1) -> LabelShiftAlarmState:
        """The state before any prediction: every log S = 0 (S = 1), not raised."""
        if not isinstance(config, LabelShiftAlarmConfig):
            raise ValueError(expected("config", "a LabelShiftAlarmConfig", config))
        if isinstance(streams, bool) or not isinstance(streams, (int, np.integer)) or streams < 1:
            raise ValueError(expected("streams", "an integer >= 1", streams))
        s, d, k = int(streams), 2 * config.classes * len(config.fractions), config.classes
        never = np.full(s, -1)
        return cls(
            config,
            np.zeros((s, d)),
            np.zeros((s, d)),
            0,
            never,
            never,
            np.zeros(s),
            np.zeros((s, k)),
            np.zeros((s, k)),
            0.0,
        )

    @property
    def streams(self) -> int:
        return self.log_statistic.shape[0]

    @property
    def log_mixture(self) -> np.ndarray:
        """log M_t per stream."""
        return log_mixture(self.log_statistic, self.config.log_weights)

    @property
    def statistic(self) -> np.ndarray:
        """M_t per stream: the alarm is raised when it reaches ``threshold``."""
        return np.exp(np.minimum(self.log_mixture, 700.0))

    @property
    def alarmed(self) -> np.ndarray:
        """Per stream, whether the alarm is raised now."""
        return self.raised_at > self.cleared_at

    @property
    def side_statistics(self) -> np.ndarray:
        """(streams, 2, K): per side (up, down) and class, the mean over its bets of the raising S (1 on a side
        without a detector)."""
        cfg = self.config
        return np.exp(np.minimum(_side_mixtures(self.log_statistic, cfg.classes, len(cfg.fractions)), 700.0))

    @property
    def clear_statistic(self) -> np.ndarray:
        """Per stream, the evidence that every class is back inside its band: the least, over the live sides, of the
        mean over bets of the clearing S (meaningful while alarmed; the alarm clears when it reaches B)."""
        cfg = self.config
        log_c = _side_mixtures(self.log_clear, cfg.classes, len(cfg.fractions))
        return np.exp(np.minimum(np.where(cfg.live, log_c, np.inf).min(axis=(1, 2)), 700.0))

    @property
    def since(self) -> np.ndarray:
        """Per stream, the predictions since the latest raise or clear (or the start)."""
        return self.predictions - 1 - np.maximum(self.raised_at, self.cleared_at)

    def fold(self, probs) -> LabelShiftAlarmState:
        """The state after the calibrated probability vectors ``probs``, in order: (n, K) (or (K,) for one) for a
        single stream, (streams, n, K) otherwise. Any split into chunks gives the same raises and clears, and the
        same statistics to rounding.

        Raises:
            ValueError: Naming ``probs`` when its shape does not match the streams and classes, or a row is not a
                probability vector (NaN or infinite values, values outside [0, 1], a sum other than 1).
        """
        p = self._check(probs)
        cfg = self.config
        classes, bets = cfg.classes, len(cfg.fractions)
        live = cfg.live.ravel()
        log_s, log_c = self.log_statistic.copy(), self.log_clear.copy()
        raised, cleared, raises = self.raised_at.copy(), self.cleared_at.copy(), self.raises.copy()
        since, recent, weight = self.since_sum.copy(), self.recent_sum.copy(), self.recent_weight
        for start in range(0, p.shape[1], _CHUNK):
            part = np.ascontiguousarray(p[:, start : start + _CHUNK].transpose(1, 0, 2))  # (T, streams, K)
            log_up, log_down = cfg.log_e_values(part), None  # the clearing e-values once a stream is alarmed
            i = 0
            while i < part.shape[0]:
                index = self.predictions + start + i
                alarmed = raised > cleared
                if len(log_s) == 1:  # a service's stream: the rows up to its next raise or clear at once
                    if alarmed[0] and log_down is None:
                        log_down = cfg.log_e_values(part, clearing=True)
                    log_s, log_c, taken, event = self._stretch(
                        log_s,
                        log_c,
                        log_up[i:],
                        None if log_down is None else log_down[i:],
                        bool(alarmed[0]),
                        index - int(raised[0]),
                    )
                    since = np.cumsum(np.concatenate([since[None], part[i : i + taken]]), axis=0)[-1]
                    recent = signal.lfilter(
                        [1.0], [1.0, -cfg.decay], part[i : i + taken], axis=0, zi=recent[None] * cfg.decay
                    )[0][-1]
                    for _ in range(taken):
                        weight = weight * cfg.decay + 1.0
                    if event:
                        index += taken - 1
                        since[0] = 0.0
                        if alarmed[0]:
                            cleared[0] = index
                        else:
                            raised[0] = index
                            raises[0] += 1
                    i += taken
                    continue
                log_s = np.maximum(log_s, 0.0) + log_up[i]
                up = crosses(log_s, cfg.log_weights, cfg.log_threshold, ~alarmed)
                since += part[i]
                recent = recent * cfg.decay + part[i]
                weight = weight * cfg.decay + 1.0
                if alarmed.any():
                    if log_down is None:
                        log_down = cfg.log_e_values(part, clearing=True)
                    log_c = np.where(alarmed[:, None], np.maximum(log_c, 0.0) + log_down[i], 0.0)
                    down = self._clears(log_c, alarmed & (index - raised >= cfg.min_clear), live, classes, bets)
                    if down.any():
                        cleared[down] = index
                        log_s[down] = 0.0
                        log_c[down] = 0.0
                        since[down] = 0.0
                if up.any():
                    raised[up] = index
                    raises[up] += 1
                    since[up] = 0.0
                i += 1
        return LabelShiftAlarmState(
            cfg, log_s, log_c, self.predictions + p.shape[1], raised, cleared, raises, since, recent, weight
        )

    def _stretch(
        self, log_s: np.ndarray, log_c: np.ndarray, log_up: np.ndarray, log_down, alarmed: bool, after_raise: int
    ) -> tuple[np.ndarray, np.ndarray, int, bool]:
        """One stream's detectors over the rows of ``log_up`` (T, 1, 2K J) (and, while ``alarmed``, the clearing
        e-values ``log_down``), up to and including the first row where the alarm is raised, or cleared: (log S and
        log S of the clearing detectors after it, the rows taken, whether the alarm changed there). ``after_raise``
        is the first row's index less the latest raise's. Each CUSUM U_i = max(U_{i-1}, 0) + x_i is, with
        C_i = x_1 + ... + x_i, U_i = C_i + max(U_0, -min(0, C_1, ..., C_{i-1})): cumulative sums and minima."""
        cfg = self.config
        u = _cusum(log_s, log_up)
        if not alarmed:
            rows = np.flatnonzero(u[:, 0].max(axis=1) >= cfg.log_threshold)  # M <= max_j S^(j): only these
            rows = rows[log_mixture(u[rows, 0], cfg.log_weights) >= cfg.log_threshold] if len(rows) else rows
            last = int(rows[0]) if len(rows) else len(u) - 1
            return u[last], log_c, last + 1, bool(len(rows))
        c = _cusum(log_c, log_down)
        classes, bets = cfg.classes, len(cfg.fractions)
        live = cfg.live.ravel()
        eligible = after_raise + np.arange(len(c)) >= cfg.min_clear
        grouped = c[:, 0].reshape(len(c), 2 * classes, bets)
        rows = np.flatnonzero(eligible & (grouped.max(axis=2)[:, live].min(axis=1) >= cfg.log_clear_threshold))
        if len(rows):  # a mean over bets is at most their largest: only these rows can clear
            mixed = special.logsumexp(grouped[rows], axis=2) - math.log(bets)
            rows = rows[mixed[:, live].min(axis=1) >= cfg.log_clear_threshold]
        if not len(rows):
            return u[-1], c[-1], len(u), False
        last = int(rows[0])
        return np.zeros_like(u[last]), np.zeros_like(c[last]), last + 1, True

    def _clears(self, log_c: np.ndarray, among: np.ndarray, live: np.ndarray, classes: int, bets: int) -> np.ndarray:
        """Per stream, ``among`` and every live side's mean over bets of the clearing S at B or more. A mean over bets
        is at most their largest, so only the streams whose every live side has a bet at B are summed."""
        level = self.config.log_clear_threshold
        grouped = log_c.reshape(len(log_c), 2 * classes, bets)
        candidates = among & (grouped.max(axis=2)[:, live].min(axis=1) >= level)
        if not candidates.any():
            return candidates
        out = np.zeros_like(candidates)
        mixed = special.logsumexp(grouped[candidates], axis=2) - math.log(bets)
        out[candidates] = mixed[:, live].min(axis=1) >= level
        return out

    def _check(self, probs) -> np.ndarray:
        """``probs`` as (streams, n, K) float64, checked."""
        k = self.config.classes
        try:
            p = np.asarray(probs, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(
                expected("probs", "a numeric array of probability vectors", type(probs).__name__)
            ) from None
        if p.ndim == 1:
            p = p[None, :]
        if p.ndim == 2:
            p = p[None]
        if p.ndim != 3 or p.shape[0] != self.streams or p.shape[2] != k:
            shape = f"(n, {k}) or (1, n, {k})" if self.streams == 1 else f"({self.streams}, n, {k})"
            raise ValueError(expected("probs", f"of shape {shape}", np.shape(probs)))
        if p.size:
            if not np.all(np.isfinite(p)):
                raise ValueError(expected("probs", "finite", f"{int((~np.isfinite(p)).sum())} NaN or infinite values"))
            if p.min() < -PROB_SUM_ATOL or p.max() > 1 + PROB_SUM_ATOL:
                raise ValueError(expected("probs", "in [0, 1]", f"values in [{p.min():.6g}, {p.max():.6g}]"))
            err = np.abs(p.sum(axis=2) - 1.0)
            if err.max() > PROB_SUM_ATOL:
                worst = np.unravel_index(int(np.argmax(err)), err.shape)
                raise ValueError(
                    expected(
                        "probs",
                        f"rows summing to 1 (tolerance {PROB_SUM_ATOL})",
                        f"{int((err > PROB_SUM_ATOL).sum())} rows that do not (one sums to {p[worst].sum():.6g})",
                    )
                )
        return np.clip(p, 0.0, 1.0)

    def summary(self) -> dict:
        """What a report shows of a single-stream state: the statistic and the clearing evidence with their
        thresholds, the side that drives the statistic, and per class the reference, its band, the mean since the
        latest raise or clear, the weighted recent mean and the statistic of each side.

        Raises:
            ValueError: When the state has more than one stream.
        """
        if self.streams != 1:
            raise ValueError(expected("streams", "1 (a summary is of a single stream)", self.streams))
        cfg = self.config
        sides = self.side_statistics[0]
        log_sides = np.where(cfg.live, _side_mixtures(self.log_statistic, cfg.classes, len(cfg.fractions))[0], -np.inf)
        side, k = np.unravel_index(int(np.argmax(log_sides)), log_sides.shape)
        count = int(self.since[0])
        since = self.since_sum[0] / count if count else np.full(cfg.classes, np.nan)
        recent = self.recent_sum[0] / self.recent_weight if self.recent_weight else np.full(cfg.classes, np.nan)
        return {
            "predictions": self.predictions,
            "alarmed": bool(self.alarmed[0]),
            "statistic": float(self.statistic[0]),
            "threshold": cfg.threshold,
            "clear_statistic": float(self.clear_statistic[0]) if self.alarmed[0] else None,
            "clear_threshold": cfg.clear_threshold,
            "driver": {"class": int(k), "side": ("up", "down")[int(side)]},
            "since": count,
            "classes": [
                {
                    "class": j,
                    "reference": cfg.reference[j],
                    "lower": float(cfg.lower[j]),
                    "upper": float(cfg.upper[j]),
                    "mean_since": None if not count else float(since[j]),
                    "recent_mean": None if not self.recent_weight else float(recent[j]),
                    "up": float(sides[0, j]) if cfg.live[0, j] else None,
                    "down": float(sides[1, j]) if cfg.live[1, j] else None,
                }
                for j in range(cfg.classes)
            ],
        }

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, LabelShiftAlarmState)
            and self.config == other.config
            and self.predictions == other.predictions
            and self.recent_weight == other.recent_weight
            and all(
                np.array_equal(getattr(self, name), getattr(other, name))
                for name in (
                    "log_statistic",
                    "log_clear",
                    "raised_at",
                    "cleared_at",
                    "raises",
                    "since_sum",
                    "recent_sum",
                )
            )
        )

    __hash__ = None  # type: ignore[assignment]

    def to_dict(self) -> dict:
        """A single-stream state as JSON data (Python's JSON writes floats so that they read back bit for bit).

        Raises:
            ValueError: When the state has more than one stream.
        """
        if self.streams != 1:
            raise ValueError(expected("streams", "1 (only a single-stream state is persisted)", self.streams))
        return {
            "format": STATE_FORMAT,
            **self.config.to_dict(),
            "log_statistic": self.log_statistic[0].tolist(),
            "log_clear": self.log_clear[0].tolist(),
            "predictions": self.predictions,
            "raised_at": int(self.raised_at[0]),
            "cleared_at": int(self.cleared_at[0]),
            "raises": int(self.raises[0]),
            "since_sum": self.since_sum[0].tolist(),
            "recent_sum": self.recent_sum[0].tolist(),
            "recent_weight": self.recent_weight,
        }

    @classmethod
    def from_dict(cls, data: dict, config: LabelShiftAlarmConfig) -> LabelShiftAlarmState:
        """Rebuild a single-stream state from ``to_dict`` output, for ``config``.

        A state saved under another format or other settings (another reference, tolerance or threshold) is not
        this alarm's evidence: a fresh state is returned for it.

        Raises:
            ValueError: Naming ``data`` when it has this format and settings but malformed fields.
        """
        if (
            not isinstance(data, dict)
            or data.get("format") != STATE_FORMAT
            or any(data.get(k) != v for k, v in config.to_dict().items())
        ):
            return cls.fresh(config)
        try:
            return cls(
                config,
                np.array([data["log_statistic"]]),
                np.array([data["log_clear"]]),
                data["predictions"],
                np.array([data["raised_at"]]),
                np.array([data["cleared_at"]]),
                np.array([data["raises"]]),
                np.array([data["since_sum"]]),
                np.array([data["recent_sum"]]),
                data["recent_weight"],
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(expected("data", "to_dict's output", f"missing or malformed {exc}")) from None
