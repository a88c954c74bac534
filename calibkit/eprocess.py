"""One e-process core for every alarm: CUSUM e-detectors, their mixture, the raise, and hysteresis with a clearing
detector. The calibration, coverage and label-shift alarms are adapters that turn their observations into
log e-values and fold them here.

The raising detector. Each alarm bets J ways; bet j gives an e-value e_t^(j) >= 0 with E[e_t^(j) | past] <= 1 under
the alarm's null H0. Its CUSUM e-detector (Shin, Ramdas & Rinaldo 2023, "E-detectors: a nonparametric framework
for sequential change detection", NEJSDS)

    log S_t^(j) = max(log S_{t-1}^(j), 0) + log e_t^(j),   S_0^(j) = 1,

is the largest of the e-processes started at each earlier time (S_t = max_k prod_{i=k..t} e_i^(j)), and the sum of
those e-processes, R_t = sum_k prod_{i=k..t} e_i, is a nonnegative process with E[R_t - R_{t-1} | past] <= 1 under
H0: R_t - t is a supermartingale. The mixture M_t = sum_j w_j S_t^(j), weights summing to 1, is at most
sum_j w_j R_t^(j) = R_t. The alarm is raised at tau_A, the first t with M_t >= A (``threshold``).

The guarantee, derived once for every alarm. By optional stopping at tau_A and n, E[R_{min(tau_A, n)}] <=
E[min(tau_A, n)], and R >= M >= A at tau_A, so A P(tau_A <= n) <= E[min(tau_A, n)] <= n: P(a false alarm within
n) <= n / A (the argument of Ville's inequality, Ville 1939, for the supermartingale R_t - t). And at tau_A itself
(when E[tau_A] is finite), A <= E[M_{tau_A}] <= E[R_{tau_A}] <= E[tau_A]: the average run length to a false alarm
is at least A (Shin et al.). ``threshold_for(n, rate)`` = n / rate is the A that makes the first bound ``rate``.

Hysteresis. At a raise, the clearing detector starts afresh: CUSUMs log K_t^(j) of the clearing e-values, which are
e-values under the reverse null "the shift persists". The clearing statistic is the least over groups of the mean
over a group's members of K_t^(j); the alarm clears when it reaches B (``clear_threshold``), at least ``min_clear``
observations after the raise. While the shift persists for some group, that group's mean is an e-detector, so the
same argument gives P(a clear within n of the raise) <= n / B. A clear restarts the raising detector at S = 1, so
the next alarm is again a fresh test with its bound n / A.

Folding. ``advance`` folds a block of log e-values up to and including the first row where any stream raises or
clears, at once: with D_i = U_0 + x_1 + ... + x_i (a cumulative sum), the CUSUM U_i = max(U_{i-1}, 0) + x_i is
U_i = D_i - min(0, D_0, ..., D_{i-1}) (a cumulative minimum). Where a CUSUM never restarts, the cumulative sum adds
in the recursion's order and the result is the same bit for bit; after a restart it differs from the step-by-step
recursion by rounding, so folding in chunks gives the same raises and clears at the same rows and the statistics to
rounding. The state is frozen; it has a leading axis of independent streams, and its JSON form (``state_dict``,
``read_state``) is keyed by the settings its evidence was gathered under.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import numpy as np
from scipy import special

from calibkit.validation import check_int, check_unit, expected

__all__ = [
    "EProcess",
    "EState",
    "Readings",
    "Step",
    "advance",
    "capped_exp",
    "cusum",
    "read_state",
    "state_dict",
    "threshold_for",
]

_NEVER = -1


def threshold_for(n: int, rate: float, name: str = "labels") -> float:
    """A = n / rate: the level at which P(a false alarm within n observations) <= ``rate`` under H0 (the module
    docstring derives it); ``name`` is what the alarm counts (labels or predictions), as errors call ``n``.

    Examples:
        >>> threshold_for(10_000, 0.01)
        1000000.0
    """
    return float(check_int(name, n, 1)) / check_unit("rate", rate)


class EProcess:
    """The settings of an e-process: the raising mixture and the clearing rule.

    Args:
        log_weights: (J,) log w_j of the raising mixture (summing to 1 in probability; -inf for a bet without weight).
        threshold: A > 1.
        clear_groups: (G, m) column indices of the clearing CUSUMs: the clearing statistic is the least over the G
            groups of the mean over a group's m members; None for an alarm that never clears.
        clear_width: J', the clearing CUSUMs per stream (0 without clearing).
        clear_threshold: B > 1, when ``clear_groups`` is given.
        min_clear: Observations after a raise before the alarm may clear.
    """

    def __init__(
        self,
        log_weights,
        threshold: float,
        clear_groups=None,
        clear_width: int = 0,
        clear_threshold: float = math.inf,
        min_clear: int = 0,
    ) -> None:
        self.log_weights = np.asarray(log_weights, dtype=np.float64)
        self.log_threshold = math.log(threshold)
        self.clear_groups = None if clear_groups is None else np.asarray(clear_groups, dtype=np.int64)
        self.clear_width = clear_width if clear_groups is not None else 0
        self.log_clear_threshold = math.log(clear_threshold)
        self.min_clear = min_clear

    @property
    def width(self) -> int:
        """J, the raising CUSUMs per stream."""
        return len(self.log_weights)

    def log_mixture(self, log_s: np.ndarray) -> np.ndarray:
        """(...) log M = log sum_j w_j S^(j), from log S (..., J)."""
        return special.logsumexp(log_s + self.log_weights, axis=-1)

    def clear_bound(self, log_c: np.ndarray) -> np.ndarray:
        """(...) an upper bound of ``log_clear_statistic``: the least over groups of the largest member."""
        assert self.clear_groups is not None
        return log_c[..., self.clear_groups].max(axis=-1).min(axis=-1)

    def log_clear_statistic(self, log_c: np.ndarray) -> np.ndarray:
        """(..., streams) log of the least over groups of the group's mean K, from log K (..., streams, J')."""
        if self.clear_groups is None:
            return np.zeros(log_c.shape[:-1])
        grouped = log_c[..., self.clear_groups]
        return (special.logsumexp(grouped, axis=-1) - math.log(self.clear_groups.shape[1])).min(axis=-1)

    def state(self, log_statistic, log_clear, count, raised_at, cleared_at, raises, name: str = "count") -> EState:
        """An ``EState`` of this process's widths, checked: errors name the field (the count as ``name``)."""
        state = EState(log_statistic, log_clear, check_int(name, count, 0), raised_at, cleared_at, raises)
        for field, width in (("log_statistic", self.width), ("log_clear", self.clear_width)):
            if getattr(state, field).shape[1] != width:
                raise ValueError(expected(field, f"finite, of shape (streams, {width})", getattr(state, field).shape))
        return state

    def fresh(self, streams: int = 1) -> EState:
        """The state before any observation: every S = K = 1, not raised."""
        s = check_int("streams", streams, 1)
        never = np.full(s, _NEVER)
        return EState(np.zeros((s, self.width)), np.zeros((s, self.clear_width)), 0, never, never, np.zeros(s))


@dataclass(frozen=True, eq=False)
class EState:
    """The state of an e-process for ``streams`` independent streams; frozen.

    Attributes:
        log_statistic: log S of the raising CUSUMs, (streams, J).
        log_clear: log K of the clearing CUSUMs, (streams, J'); 0 while a stream is not alarmed.
        count: The observations folded into every stream.
        raised_at: Per stream, the index (from 0) of the latest raise; -1 while none.
        cleared_at: Per stream, the index of the latest clear; -1 while none.
        raises: Per stream, the alarms raised so far.
    """

    log_statistic: np.ndarray
    log_clear: np.ndarray
    count: int
    raised_at: np.ndarray
    cleared_at: np.ndarray
    raises: np.ndarray

    def __post_init__(self) -> None:
        arrays = {}
        for name in ("log_statistic", "log_clear"):
            a = np.array(getattr(self, name), dtype=np.float64)
            if a.ndim != 2 or not np.all(np.isfinite(a)):
                raise ValueError(expected(name, "finite, of shape (streams, bets)", a.shape))
            arrays[name] = a
        s = arrays["log_statistic"].shape[0]
        if arrays["log_clear"].shape[0] != s:
            raise ValueError(expected("log_clear", f"of {s} rows", arrays["log_clear"].shape))
        n = check_int("count", self.count, 0)
        for name in ("raised_at", "cleared_at", "raises"):
            a = np.array(getattr(self, name), dtype=np.int64)
            low, high = (0, int(n) + 1) if name == "raises" else (_NEVER, max(int(n), 0))
            if a.shape != (s,) or np.any((a < low) | (a >= high)):
                raise ValueError(expected(name, f"{s} integers in [{low}, {high})", getattr(self, name)))
            arrays[name] = a
        raised, cleared = arrays["raised_at"], arrays["cleared_at"]
        if np.any((cleared >= 0) & ((raised < 0) | (cleared == raised))):
            raise ValueError(expected("cleared_at", "-1, or the index of a clear after a raise", self.cleared_at))
        for name, array in arrays.items():
            array.setflags(write=False)
            object.__setattr__(self, name, array)
        object.__setattr__(self, "count", int(n))

    @property
    def streams(self) -> int:
        return self.log_statistic.shape[0]

    @property
    def alarmed(self) -> np.ndarray:
        """Per stream, whether the alarm is raised now."""
        return self.raised_at > self.cleared_at

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EState) and all(
            np.array_equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)
        )

    __hash__ = None  # type: ignore[assignment]


def capped_exp(log_x: np.ndarray) -> np.ndarray:
    """exp(log x) with log x capped at 700: a statistic far past its threshold stays a finite float."""
    return np.exp(np.minimum(log_x, 700.0))


class Readings:
    """What every alarm state reads off its e-process: the state holds ``config``, whose ``process`` is the
    ``EProcess``, and ``core``, the ``EState``."""

    config: Any
    core: EState

    @property
    def streams(self) -> int:
        return self.core.streams

    @property
    def log_mixture(self) -> np.ndarray:
        """log M_t = log sum_j w_j S_t^(j), per stream."""
        return self.config.process.log_mixture(self.core.log_statistic)

    @property
    def statistic(self) -> np.ndarray:
        """M_t per stream: the alarm is raised when it reaches the threshold A."""
        return capped_exp(self.log_mixture)

    @property
    def alarmed(self) -> np.ndarray:
        """Per stream, whether the alarm is raised now."""
        return self.core.alarmed


class Step(NamedTuple):
    """What ``advance`` did: the state after, the rows taken, and per stream whether the last row taken raised or
    cleared its alarm (none of them when no row did)."""

    state: EState
    taken: int
    raised: np.ndarray
    cleared: np.ndarray


def cusum(start: np.ndarray, log_e: np.ndarray) -> np.ndarray:
    """The trajectory (T, ...) of U_i = max(U_{i-1}, 0) + x_i from U_0 = ``start`` over the rows x_i of ``log_e``:
    U_i = D_i - min(0, D_0, ..., D_{i-1}) with D_i = U_0 + x_1 + ... + x_i (module docstring)."""
    d = np.cumsum(np.concatenate([start[None], log_e]), axis=0)
    low = np.minimum.accumulate(np.minimum(d[:-1], 0.0), axis=0)
    return d[1:] - low


def _reaching(log_s: np.ndarray, level: float, among: np.ndarray, bound, statistic) -> np.ndarray:
    """(T, streams): where ``among`` and ``statistic`` of log S (T, streams, J) reach ``level``. A mixture or a mean
    of S is at most the largest S (of each group: ``bound``), so only the rows where that reaches ``level`` are
    summed: on most rows of a stream under its null, none is."""
    hits = among & (bound(log_s) >= level)
    if hits.any():
        rows, cols = np.nonzero(hits)
        hits[rows, cols] = statistic(log_s[rows, cols]) >= level
    return hits


def _first(hits: np.ndarray) -> int:
    """The first row (axis 0) with a hit in any stream; the number of rows when none."""
    rows = np.flatnonzero(hits.any(axis=1))
    return int(rows[0]) if len(rows) else len(hits)


def advance(process: EProcess, state: EState, log_e: np.ndarray, log_clear_e: np.ndarray | None = None) -> Step:
    """Fold log e-values into ``state`` up to and including the first row where some stream raises or clears (all T
    rows when none): ``log_e`` (T, streams, J) of the raising bets, ``log_clear_e`` (T, streams, J') of the clearing
    bets (rows of streams not alarmed are unused; None when no stream is alarmed or the process never clears)."""
    t = len(log_e)
    if not t:
        none = np.zeros(state.streams, bool)
        return Step(state, 0, none, none)
    alarmed = state.alarmed
    u = cusum(state.log_statistic, log_e)
    up = _reaching(u, process.log_threshold, ~alarmed, lambda x: x.max(axis=-1), process.log_mixture)
    last = min(_first(up), t - 1)
    cleared = np.zeros(state.streams, bool)
    log_c = np.zeros_like(state.log_clear)
    if process.clear_groups is not None and alarmed.any():
        if log_clear_e is None:
            raise ValueError(expected("log_clear_e", "the clearing e-values while a stream is alarmed", None))
        c = cusum(state.log_clear, log_clear_e[: last + 1])
        since_raise = state.count + np.arange(len(c))[:, None] - state.raised_at[None, :]
        among = alarmed & (since_raise >= process.min_clear)
        down = _reaching(c, process.log_clear_threshold, among, process.clear_bound, process.log_clear_statistic)
        last = min(last, _first(down))
        cleared = down[last]
        log_c = np.where((alarmed & ~cleared)[:, None], c[last], 0.0)
    raised = up[last]
    index = state.count + last
    after = EState(
        np.where(cleared[:, None], 0.0, u[last]),
        log_c,
        index + 1,
        np.where(raised, index, state.raised_at),
        np.where(cleared, index, state.cleared_at),
        state.raises + raised,
    )
    return Step(after, last + 1, raised, cleared)


def state_dict(state: EState, settings: dict, form: int, count: str) -> dict:
    """The JSON form of a single-stream state: its layout ``form``, the ``settings`` its evidence was gathered
    under, and its fields (the count named ``count``; the clearing fields only for a process that clears).
    """
    if state.streams != 1:
        raise ValueError(expected("streams", "1 (only a single-stream state is persisted)", state.streams))
    out = {"format": form, **settings, "log_statistic": state.log_statistic[0].tolist()}
    if state.log_clear.shape[1]:
        out["log_clear"] = state.log_clear[0].tolist()
    out[count] = state.count
    out["raised_at"] = int(state.raised_at[0])
    if state.log_clear.shape[1]:
        out.update(cleared_at=int(state.cleared_at[0]), raises=int(state.raises[0]))
    return out


def read_state(data, settings: dict, form: int, count: str, clear_width: int) -> EState | None:
    """The single-stream state of ``state_dict`` output, or None when ``data`` was saved under another layout or
    other settings (not this alarm's evidence). A ValueError names ``data`` when it has this layout and settings but
    misses a field, or names the malformed field.
    """
    if not isinstance(data, dict) or data.get("format") != form or any(data.get(k) != v for k, v in settings.items()):
        return None
    try:
        log_s, raised = np.array([data["log_statistic"]]), np.array([data["raised_at"]])
        if not clear_width:  # a process that never clears: raised once at most
            return EState(log_s, np.zeros((1, 0)), data[count], raised, np.full(1, _NEVER), raised >= 0)
        log_clear, cleared, raises = (np.array([data[name]]) for name in ("log_clear", "cleared_at", "raises"))
        return EState(log_s, log_clear, data[count], raised, cleared, raises)
    except (KeyError, TypeError) as exc:
        raise ValueError(expected("data", "to_dict's output", f"missing or malformed {exc}")) from None
