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
with probability at least 1 - epsilon, simultaneously for all k (``calibkit.reference_margins``: the Chernoff bound of
Hoeffding 1963 for [0, 1]-valued means, inverted exactly, with a union bound over the 2K one-sided bounds). Traffic
from the validation distribution, or label-shifted by at most ``tolerance``, is therefore inside H0 outside an event
of probability epsilon over the validation draw; without these margins a small reference would raise the alarm on
unshifted traffic in the end. The margins are per class and asymmetric (a rare class's mean is known better).

The statistic (Shin, Ramdas & Rinaldo 2023). For each class k and side, a CUSUM e-detector of ``calibkit.eprocess``
per bet lambda_j, log S_t = max(log S_{t-1}, 0) + log e_t, of the betting e-values (Waudby-Smith & Ramdas 2023)

    up:    e_t = 1 + lambda_j (p_tk - upper_k),  lambda_j = f_j / upper_k,
    down:  e_t = 1 + lambda_j (lower_k - p_tk),  lambda_j = f_j / (1 - lower_k),

with fractions f_j in (0, 1) (``fractions``) of the largest bet that keeps e_t >= 0 for every p_tk in [0, 1]; under
H0 E[e_t | past] = 1 + lambda_j (E[p_tk | past] - upper_k) <= 1 (down: likewise). A side whose edge is trivial
(upper_k = 1, lower_k = 0) carries no detector. The statistic M_t is the average over the live sides of the average
over their bets of S_t, itself an e-detector; the alarm is raised when M_t reaches A (``threshold``).

Guarantee under H0 (outside the epsilon of the reference; ``calibkit.eprocess`` derives it): E[predictions to a false
alarm] >= A and P(a false alarm within n predictions) <= n / A; over the validation draw too, at most epsilon + n / A.
The least favourable nulls have some class's mean on an edge of its band, and no coupling reduces them to one law
(the probability vectors' law is arbitrary), so the default A = ``DEFAULT_THRESHOLD`` =
``eprocess.threshold_for(DEFAULT_PREDICTIONS, DEFAULT_RATE)`` = 10^6 / 0.01 rests on the bound: at most 1% false
alarms per million predictions, with no simulation. Predictions, unlike labels, are plentiful, so the bound is set
per million; it delays an alarm by log(A) / KL predictions.

Hysteresis (``calibkit.eprocess``). The reverse null, "some class's mean stays beyond its edge on one side", is
tested by the mirrored e-values (up: e_t = 1 + lambda_j (upper_k - p_tk), lambda_j = f_j / (1 - upper_k); down:
e_t = 1 + lambda_j (p_tk - lower_k), lambda_j = f_j / lower_k) in CUSUMs started at the raise. The alarm clears when,
for every live side, the mean over its bets reaches B (``clear_threshold``), at least ``min_clear`` predictions after
the raise: while one side's mean stays beyond its edge, P(a clear within n predictions) <= n / B. A stream whose
mean sits on an edge is under both nulls: it raises and clears rarely, rather than flapping.

The state holds the e-process (``calibkit.eprocess.EState``: folds in one call or in many agree) and, for reports
(``summary``, ``calibkit.label_shift_report``), each class's mean since the latest raise or clear and an
exponentially weighted one of half-life ``half_life`` predictions.

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
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import scipy  # its submodules load on first use (scipy.signal, which imports .stats): serving starts without them

from calibkit import eprocess, label_shift_report
from calibkit.eprocess import EProcess, EState, Readings, capped_exp
from calibkit.reference_margins import DEFAULT_EPSILON, check_reference, reference_tolerance
from calibkit.validation import PROB_SUM_ATOL, check_int, check_threshold, check_unit, expected, is_number

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
#: The bets, as fractions of the largest bet that keeps the e-value >= 0: a geometric grid from bold to cautious.
DEFAULT_FRACTIONS = (0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625)
#: The half-life, in predictions, of the exponentially weighted class means that ``summary`` reports.
DEFAULT_HALF_LIFE = 1000.0
#: The layout of ``to_dict``.
STATE_FORMAT = 1

_EDGE = 1e-6  # bets keep their centre this far inside (0, 1); moving a centre outwards only widens the null tested
_CHUNK = 128  # predictions whose e-values are computed at once (bounds the memory of a long fold)


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
        threshold: A > 1: the alarm is raised when the statistic reaches A (``eprocess.threshold_for``).
        clear_threshold: B > 1: a raised alarm clears when the evidence that every class is back inside reaches B.
        min_clear: The predictions after a raise before the alarm may clear, an integer >= 0.
        fractions: f_j in (0, 1): each side bets these fractions of its largest bet.
        half_life: The half-life, in predictions (> 0), of the weighted means of ``summary``.
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
        object.__setattr__(self, "reference", tuple(float(x) for x in check_reference(self.reference)))
        if self.n_reference is not None:
            object.__setattr__(self, "n_reference", check_int("n_reference", self.n_reference, 1))
        if not is_number(self.tolerance) or not 0 <= self.tolerance < 1:
            raise ValueError(expected("tolerance", "in [0, 1)", self.tolerance))
        object.__setattr__(self, "epsilon", check_unit("epsilon", self.epsilon))
        for name in ("threshold", "clear_threshold"):
            object.__setattr__(self, name, check_threshold(name, getattr(self, name)))
        object.__setattr__(self, "min_clear", check_int("min_clear", self.min_clear, 0))
        fractions = tuple(self.fractions) if isinstance(self.fractions, (tuple, list)) else None
        if not fractions or not all(is_number(f) and 0 < f < 1 for f in fractions):
            raise ValueError(expected("fractions", "a non-empty sequence of numbers in (0, 1)", self.fractions))
        if not is_number(self.half_life) or not (math.isfinite(self.half_life) and self.half_life > 0):
            raise ValueError(expected("half_life", "a finite number > 0", self.half_life))
        object.__setattr__(self, "fractions", tuple(float(f) for f in fractions))
        object.__setattr__(self, "tolerance", float(self.tolerance))
        object.__setattr__(self, "half_life", float(self.half_life))
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
    def process(self) -> EProcess:
        """The e-process: the raising mixture of ``log_weights`` at A; cleared at B when every live side's mean over
        its bets of the clearing S reaches it (one group per live side, its bets the members)."""
        bets = len(self.fractions)
        groups = np.flatnonzero(self.live.ravel())[:, None] * bets + np.arange(bets)
        width = 2 * self.classes * bets
        return EProcess(self.log_weights, self.threshold, groups, width, self.clear_threshold, self.min_clear)

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


@dataclass(frozen=True, eq=False)
class LabelShiftAlarmState(Readings):
    """The alarm's state for ``streams`` independent streams; frozen: ``fold`` returns a new state. It reads
    ``streams``, ``log_mixture``, ``statistic`` (M_t) and ``alarmed`` off its e-process (``eprocess.Readings``).

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

    core: EState = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cfg = self.config
        if not isinstance(cfg, LabelShiftAlarmConfig):
            raise ValueError(expected("config", "a LabelShiftAlarmConfig", cfg))
        n, k = self.predictions, cfg.classes
        core = cfg.process.state(
            self.log_statistic, self.log_clear, n, self.raised_at, self.cleared_at, self.raises, "predictions"
        )
        s = core.streams
        arrays = {}
        for name in ("since_sum", "recent_sum"):
            a = np.array(getattr(self, name), dtype=np.float64)
            if a.shape != (s, k) or not np.all(np.isfinite(a)):
                raise ValueError(expected(name, f"finite, of shape ({s}, {k})", a.shape))
            a.setflags(write=False)
            arrays[name] = a
        w = self.recent_weight
        if not is_number(w) or not (math.isfinite(w) and w >= 0):
            raise ValueError(expected("recent_weight", "a finite number >= 0", w))
        for name in ("log_statistic", "log_clear", "raised_at", "cleared_at", "raises"):
            object.__setattr__(self, name, getattr(core, name))
        for name, array in arrays.items():
            object.__setattr__(self, name, array)
        object.__setattr__(self, "core", core)
        object.__setattr__(self, "predictions", int(n))
        object.__setattr__(self, "recent_weight", float(w))

    @classmethod
    def fresh(cls, config: LabelShiftAlarmConfig, streams: int = 1) -> LabelShiftAlarmState:
        """The state before any prediction: every log S = 0 (S = 1), not raised."""
        if not isinstance(config, LabelShiftAlarmConfig):
            raise ValueError(expected("config", "a LabelShiftAlarmConfig", config))
        means = np.zeros((check_int("streams", streams, 1), config.classes))
        return cls._of(config, config.process.fresh(streams), means, means, 0.0)

    @classmethod
    def _of(cls, config, core: EState, since, recent, weight: float) -> LabelShiftAlarmState:
        c = core
        return cls(
            config, c.log_statistic, c.log_clear, c.count, c.raised_at, c.cleared_at, c.raises, since, recent, weight
        )

    @property
    def side_statistics(self) -> np.ndarray:
        """(streams, 2, K): per side (up, down) and class, the mean over its bets of the raising S (1 on a side
        without a detector)."""
        cfg = self.config
        return capped_exp(label_shift_report.side_mixtures(self.log_statistic, cfg.classes, len(cfg.fractions)))

    @property
    def clear_statistic(self) -> np.ndarray:
        """Per stream, the evidence that every class is back inside its band: the least, over the live sides, of the
        mean over bets of the clearing S (meaningful while alarmed; the alarm clears when it reaches B)."""
        return capped_exp(self.config.process.log_clear_statistic(self.log_clear))

    @property
    def since(self) -> np.ndarray:
        """Per stream, the predictions since the latest raise or clear (or the start)."""
        return self.predictions - 1 - np.maximum(self.raised_at, self.cleared_at)

    def fold(self, probs) -> LabelShiftAlarmState:
        """The state after the calibrated probability vectors ``probs``, in order: (n, K) (or (K,) for one) for a
        single stream, (streams, n, K) otherwise. Any split into chunks gives the same raises and clears, and the
        same statistics to rounding.
        """
        p = self._check(probs)
        cfg, core = self.config, self.core
        since, recent, weight = self.since_sum, self.recent_sum, self.recent_weight
        for start in range(0, p.shape[1], _CHUNK):
            part = np.ascontiguousarray(p[:, start : start + _CHUNK].transpose(1, 0, 2))  # (T, streams, K)
            log_up, log_down = cfg.log_e_values(part), None  # the clearing e-values once a stream is alarmed
            i = 0
            while i < len(part):
                if log_down is None and core.alarmed.any():
                    log_down = cfg.log_e_values(part, clearing=True)
                step = eprocess.advance(cfg.process, core, log_up[i:], None if log_down is None else log_down[i:])
                rows = part[i : i + step.taken]
                since = np.cumsum(np.concatenate([since[None], rows]), axis=0)[-1]
                decayed = scipy.signal.lfilter([1.0], [1.0, -cfg.decay], rows, axis=0, zi=recent[None] * cfg.decay)[0]
                recent = decayed[-1]
                for _ in range(step.taken):
                    weight = weight * cfg.decay + 1.0
                since = np.where((step.raised | step.cleared)[:, None], 0.0, since)
                core, i = step.state, i + step.taken
        return self._of(cfg, core, since, recent, weight)

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
        """What a report shows of a single-stream state (``calibkit.label_shift_report.summary``)."""
        return label_shift_report.summary(self)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, LabelShiftAlarmState)
            and self.config == other.config
            and self.core == other.core
            and self.recent_weight == other.recent_weight
            and np.array_equal(self.since_sum, other.since_sum)
            and np.array_equal(self.recent_sum, other.recent_sum)
        )

    __hash__ = None  # type: ignore[assignment]

    def to_dict(self) -> dict:
        """A single-stream state as JSON data (Python's JSON writes floats so that they read back bit for bit)."""
        out = eprocess.state_dict(self.core, self.config.to_dict(), STATE_FORMAT, "predictions")
        out.update(since_sum=self.since_sum[0].tolist(), recent_sum=self.recent_sum[0].tolist())
        return {**out, "recent_weight": self.recent_weight}

    @classmethod
    def from_dict(cls, data: dict, config: LabelShiftAlarmConfig) -> LabelShiftAlarmState:
        """Rebuild a single-stream state from ``to_dict`` output, for ``config``.

        A state saved under another format or other settings (another reference, tolerance or threshold) is not
        this alarm's evidence: a fresh state is returned for it. A ValueError names ``data`` when it has this format
        and settings but malformed fields.
        """
        width = config.process.clear_width
        core = eprocess.read_state(data, config.to_dict(), STATE_FORMAT, "predictions", width)
        if core is None:
            return cls.fresh(config)
        try:
            means = np.array([data["since_sum"]]), np.array([data["recent_sum"]])
            return cls._of(config, core, *means, data["recent_weight"])
        except (KeyError, TypeError) as exc:
            raise ValueError(expected("data", "to_dict's output", f"missing or malformed {exc}")) from None
