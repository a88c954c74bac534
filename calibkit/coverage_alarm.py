"""An anytime-valid alarm for "the prediction sets cover less than their target", from the misses of served sets.

Each label gives err_t = 1 when the set served for it missed the label (``calibkit.conformal.adaptive.misses_of``).
The null hypothesis is that the sets cover at least 1 - alpha at every time, given the past:

    H0(alpha):  P(err_t = 1 | past) <= alpha   for every t.

The statistic is a weighted mixture M_t = sum_j w_j S_t^(j) of CUSUM e-detectors of ``calibkit.eprocess`` (Shin,
Ramdas & Rinaldo 2023), each built from the betting e-value

    e_t^(j) = 1 + lambda_j (err_t - alpha),   lambda_j = (p_j - alpha) / (alpha (1 - alpha)),

which is >= 0 for lambda_j in [0, 1 / alpha] and has E[e_t | past] <= 1 under H0 (Waudby-Smith & Ramdas 2023).
lambda_j is the Kelly bet against the miss rate p_j, where e_t^(j) equals the likelihood ratio Bern(err; p_j) /
Bern(err; alpha): the detector of alternative j is the CUSUM of an oracle told the rate p_j, and the mixture over
rates p_j = alpha (1 + r_j) (``rises``; capped half-way from alpha to 1) pays log(1 / w_j) for not knowing which.
The alarm is raised when M_t reaches A (``threshold``); it does not clear.

Guarantees under H0(alpha), for every sequence of conditional miss rates at most alpha:

- ``calibkit.eprocess`` derives E[labels to a false alarm] >= A and P(a false alarm within n labels) <= n / A;
  ``eprocess.threshold_for(n, rate)`` = n / rate is the A that makes this bound ``rate`` (10^6 for 1% per 10,000
  labels).
- Every e-value rises with err_t (lambda_j >= 0), and the recursion and the mixture are nondecreasing in each
  e-value. Coupling err_t = 1[U_t < p_t] with 1[U_t < alpha] through the same uniforms shows that independent
  misses at exactly rate alpha are the least favourable null: the false-alarm probability within n labels at
  any null is at most the one at i.i.d. Bernoulli(alpha) misses, which a seeded simulation measures (the
  conformal benchmark does, and ``tests/calibkit/test_coverage_alarm.py``).

The default A = ``DEFAULT_THRESHOLD`` = 10^5 rests on both: the bound n / A proves an average run length of at
least 10^5 labels and at most 1% false alarms per 1,000 labels at every null, and the least favourable null,
simulated, keeps the rate per 10,000 labels under 1% for alpha from 0.02 to 0.5 (the benchmark's figures). The
bound is loose for e-values this close to 1: a CUSUM of small increments runs at the null many times A before it
reaches A (Siegmund's approximation puts the factor near 1 / KL(alpha || p)). A = 10^6, which proves 1% per
10,000 with no simulation, would delay every alarm by about log(10) / KL(p || alpha) labels more.

The state is the log S^(j), the labels folded and the label at which each stream raised, with a leading axis of
independent streams; folding in one call or in many gives the same raise (``calibkit.eprocess``), so replicas and
restarts that fold the stored labels in order agree.

Miss indicators of ACI-served sets (``calibkit.conformal.adaptive``) are not under H0 at every instant: after a run
of covered labels ACI misses more often than alpha for a while, by design. The alarm answers "is the served
coverage below target now", the question to ask of static sets, or of adaptive ones that stopped keeping up.

References: Shin, Ramdas & Rinaldo 2023, "E-detectors: a nonparametric framework for sequential change
detection", New England Journal of Statistics in Data Science; Waudby-Smith & Ramdas 2023, "Estimating means of
bounded random variables by betting", JRSS-B; Page 1954, "Continuous inspection schemes", Biometrika (CUSUM).

>>> state = CoverageAlarmState.fresh(CoverageAlarmConfig(alpha=0.1, threshold=100.0))
>>> state = state.fold([0] * 20 + [1] * 15)  # fifteen misses in a row
>>> bool(state.alarmed[0]), int(state.raised_at[0])
(True, 25)
>>> CoverageAlarmState.from_dict(json.loads(json.dumps(state.to_dict())), state.config) == state
True
"""

from __future__ import annotations

import functools
import json  # noqa: F401  (the doctest uses it)
import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from calibkit import eprocess
from calibkit.conformal.adaptive import check_misses
from calibkit.eprocess import EProcess, EState, Readings
from calibkit.validation import check_int, check_threshold, check_unit, expected

__all__ = [
    "DEFAULT_EPSILON",
    "DEFAULT_LABELS",
    "DEFAULT_RATE",
    "DEFAULT_THRESHOLD",
    "STATE_FORMAT",
    "CoverageAlarmConfig",
    "CoverageAlarmState",
    "calibration_tolerance",
]

#: The false-alarm budget the default threshold is for: at most DEFAULT_RATE per DEFAULT_LABELS labels.
DEFAULT_LABELS, DEFAULT_RATE = 10_000, 0.01
#: A, the default threshold (the module docstring says why).
DEFAULT_THRESHOLD = 1e5
#: The probability of a calibration split whose static sets miss more than the alarm's tolerance allows.
DEFAULT_EPSILON = 0.01
#: The layout of ``to_dict``.
STATE_FORMAT = 1

_CHUNK = 1024  # labels whose e-values are taken at once (bounds the memory of a long fold)


@functools.lru_cache(maxsize=256)
def calibration_tolerance(n: int, alpha: float, epsilon: float = DEFAULT_EPSILON) -> float:
    """delta: the most a static split-conformal set's miss rate exceeds alpha, but with probability epsilon over
    the n calibration scores.

    Given the calibration split, the static set at q = the k-th smallest score, k = ceil((n + 1)(1 - alpha)),
    misses each exchangeable label with a fixed probability, which is Beta(n + 1 - k, k) distributed over splits
    for scores without ties and stochastically smaller with ties or the floor (Vovk 2012, "Conditional validity
    of inductive conformal predictors"). So P(miss rate > alpha + delta) <= epsilon for delta = the (1 - epsilon)
    quantile of that law less alpha (0 when k > n: the full set misses nothing). An alarm on the static sets'
    misses that tests the rate alpha + delta keeps its bound n / A given the split, outside that epsilon. Cached:
    the service derives each set choice's alarm settings whenever it reads its stored state.

    Examples:
        >>> round(calibration_tolerance(180, 0.1), 3), round(calibration_tolerance(10_000, 0.1), 3)
        (0.057, 0.007)
    """
    from scipy.stats import beta

    from calibkit.conformal import quantile_rank

    k = quantile_rank(n, alpha)
    if k > n:
        return 0.0
    if not 0 < epsilon < 1:
        raise ValueError(expected("epsilon", "in (0, 1)", epsilon))
    return max(0.0, float(beta.ppf(1.0 - epsilon, n + 1 - k, k)) - alpha)


@dataclass(frozen=True)
class CoverageAlarmConfig:
    """The alarm's settings; ``alpha`` and ``threshold`` make the guarantee, ``rises`` and ``weights`` its speed.

    Attributes:
        alpha: The target miscoverage (the sets' target coverage is 1 - alpha), in (0, 1).
        threshold: A > 1: the alarm is raised when the mixture reaches A (``DEFAULT_THRESHOLD``, or
            ``eprocess.threshold_for`` for the bound alone).
        rises: r_j > 0: the mixture bets on miss rates p_j = alpha (1 + r_j), each capped at (1 + alpha) / 2.
        weights: w_j, positive, one per rise, normalised to sum to 1; None for equal weights.
    """

    alpha: float = 0.1
    threshold: float = DEFAULT_THRESHOLD
    rises: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
    weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", check_unit("alpha", self.alpha))
        object.__setattr__(self, "threshold", check_threshold("threshold", self.threshold))
        rises = _positive(self.rises)
        if not rises:
            raise ValueError(expected("rises", "a non-empty sequence of finite numbers > 0", self.rises))
        object.__setattr__(self, "rises", rises)
        if self.weights is not None:
            w = _positive(self.weights)
            if w is None or len(w) != len(rises):
                raise ValueError(expected("weights", f"{len(rises)} finite numbers > 0 (one per rise)", self.weights))
            object.__setattr__(self, "weights", w)

    @cached_property
    def rates(self) -> np.ndarray:
        """p_j: the miss rates the mixture bets on."""
        return np.minimum(self.alpha * (1.0 + np.asarray(self.rises)), (1.0 + self.alpha) / 2.0)

    @cached_property
    def bets(self) -> np.ndarray:
        """lambda_j = (p_j - alpha) / (alpha (1 - alpha)), in (0, 1 / alpha)."""
        return (self.rates - self.alpha) / (self.alpha * (1.0 - self.alpha))

    @cached_property
    def log_e(self) -> np.ndarray:
        """(2, J): log e^(j) after a covered label (row 0) and after a miss (row 1)."""
        return np.stack([np.log1p(-self.bets * self.alpha), np.log1p(self.bets * (1.0 - self.alpha))])

    @cached_property
    def log_weights(self) -> np.ndarray:
        """log w_j."""
        w = np.ones(len(self.rises)) if self.weights is None else np.asarray(self.weights)
        return np.log(w / w.sum())

    @cached_property
    def process(self) -> EProcess:
        """The e-process: the mixture of ``log_weights`` raised at A, never cleared."""
        return EProcess(self.log_weights, self.threshold)

    def to_dict(self) -> dict:
        """The settings as JSON data."""
        weights = None if self.weights is None else list(self.weights)
        return {"alpha": self.alpha, "threshold": self.threshold, "rises": list(self.rises), "weights": weights}


def _positive(values) -> tuple[float, ...] | None:
    """``values`` as floats when it is a tuple or list of finite numbers > 0; None otherwise."""
    if not isinstance(values, (tuple, list)) or not all(
        isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in values
    ):
        return None
    return tuple(float(x) for x in values)


@dataclass(frozen=True, eq=False)
class CoverageAlarmState(Readings):
    """The alarm's state for ``streams`` independent streams; frozen: ``fold`` returns a new state. It reads
    ``streams``, ``log_mixture``, ``statistic`` (M_t) and ``alarmed`` (raised, as it never clears) off its e-process
    (``eprocess.Readings``).

    Attributes:
        config: The settings.
        log_statistic: log S^(j), (streams, J).
        labels: The labels folded into every stream.
        raised_at: Per stream, the index (from 0) of the label at which the alarm was raised; -1 while it was not.
    """

    config: CoverageAlarmConfig
    log_statistic: np.ndarray
    labels: int
    raised_at: np.ndarray
    core: EState = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.config, CoverageAlarmConfig):
            raise ValueError(expected("config", "a CoverageAlarmConfig", self.config))
        log_s, raised = np.array(self.log_statistic, dtype=np.float64), np.array(self.raised_at, dtype=np.int64)
        empty, never = np.zeros((len(np.atleast_1d(log_s)), 0)), np.full(raised.shape, -1)
        core = self.config.process.state(log_s, empty, self.labels, raised, never, raised >= 0, "labels")
        object.__setattr__(self, "core", core)
        object.__setattr__(self, "log_statistic", core.log_statistic)
        object.__setattr__(self, "raised_at", core.raised_at)
        object.__setattr__(self, "labels", int(self.labels))

    @classmethod
    def fresh(cls, config: CoverageAlarmConfig | None = None, streams: int = 1) -> CoverageAlarmState:
        """The state before any label: log S = 0 (S = 1), not raised."""
        cfg = config or CoverageAlarmConfig()
        return cls._of(cfg, cfg.process.fresh(check_int("streams", streams, 1)))

    @classmethod
    def _of(cls, config: CoverageAlarmConfig, core: EState) -> CoverageAlarmState:
        return cls(config, core.log_statistic, core.count, core.raised_at)

    def fold(self, errs) -> CoverageAlarmState:
        """The state after the 0 / 1 miss indicators ``errs``, in order: (labels,) for a single stream, (streams,
        labels) otherwise. Any split into chunks gives the same raises and the same statistics to rounding."""
        e = np.asarray(errs)
        if e.ndim <= 1:
            e = check_misses(e)[None, :]
        elif e.ndim == 2:
            e = check_misses(e.ravel()).reshape(e.shape)
        if e.ndim != 2 or e.shape[0] != self.streams:
            raise ValueError(expected("errs", f"(labels,) or ({self.streams}, labels) miss indicators", np.shape(errs)))
        cfg, core, start = self.config, self.core, 0
        while start < e.shape[1]:
            stop = min(e.shape[1], start + _CHUNK)
            step = eprocess.advance(cfg.process, core, cfg.log_e[e[:, start:stop].T])
            core, start = step.state, start + step.taken
        return self._of(cfg, core)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CoverageAlarmState) and self.config == other.config and self.core == other.core

    __hash__ = None  # type: ignore[assignment]

    def to_dict(self) -> dict:
        """A single-stream state as JSON data (Python's JSON writes floats so that they read back bit for bit)."""
        return eprocess.state_dict(self.core, self.config.to_dict(), STATE_FORMAT, "labels")

    @classmethod
    def from_dict(cls, data: dict, config: CoverageAlarmConfig) -> CoverageAlarmState:
        """Rebuild a single-stream state from ``to_dict`` output, for ``config``.

        A state saved under another format or other settings is not this alarm's evidence: a fresh state is
        returned for it. A ValueError names ``data`` when it has this format and settings but malformed fields.
        """
        core = eprocess.read_state(data, config.to_dict(), STATE_FORMAT, "labels", 0)
        return cls.fresh(config) if core is None else cls._of(config, core)
