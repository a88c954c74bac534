"""The miscalibration alarm as a pure state machine: (previous status, evidence) -> new status.

``alarm`` is the state of the detector of ``calibkit.detector``: raised when its e-detector reaches
``threshold`` (P(false alarm within n labels) <= n / threshold whenever calibration is within
``tolerance`` at every confidence level), cleared when its evidence that calibration has returned
reaches ``clear_threshold``. No other gate: the tolerance is the materiality criterion, inside the
hypothesis the guarantee is about, so no plug-in ECE (biased upwards on small windows) decides.
``warning`` needs no guarantee and no labels: recent confidences drifting from the reference (a KS
test both significant and of a material size: a large sample makes any difference significant, so the
distance D itself must reach ``shift_distance``), or an e-detector at ``warn_threshold`` or more,
evidence building towards an alarm.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from calibkit.detector import DetectorConfig
from calibkit.drift import ShiftTest

OK, WARNING, ALARM = "ok", "warning", "alarm"
LEVELS = {OK: 0, WARNING: 1, ALARM: 2}


@dataclass(frozen=True)
class AlarmPolicy:
    """Settings of the alarm (``CALIB_ALARM__<NAME>``); ``tolerance`` and ``threshold`` carry the guarantee
    (docs/monitoring.md).

    Attributes:
        tolerance: eps of ``calibkit.detector``, the null hypothesis: |P(correct | confidence) - confidence| <= eps
            at every confidence level; a gap up to eps is calibrated enough.
        threshold: A: the alarm is raised when the e-detector reaches A; the mean number of labels to a false
            alarm is at least A, and P(false alarm within n labels) <= n / A.
        clear_threshold: B: the alarm clears when the evidence that calibration has returned reaches B.
        warn_threshold: A warning when the e-detector reaches this, evidence building towards an alarm (no
            guarantee).
        min_labels: Window figures of fewer labels are marked provisional in reports; no effect on the alarm.
        shift_p_value: The drift test (KS, recent against reference confidences) warns only below this p-value.
        shift_distance: The drift test warns only when its distance D, the largest gap between the recent and the
            reference confidence distributions, is at least this: on a large sample a tiny, immaterial difference
            is significant.
        min_unlabelled: The drift test warns only with at least this many recent predictions.
    """

    tolerance: float = 0.01
    threshold: float = 1.25e4
    clear_threshold: float = 3e4
    warn_threshold: float = 1000.0
    min_labels: int = 200
    shift_p_value: float = 0.001
    shift_distance: float = 0.1
    min_unlabelled: int = 200

    def detector(self) -> DetectorConfig:
        """The configuration of the detector these settings ask for (its other parameters at their defaults)."""
        return DetectorConfig(tolerance=self.tolerance, threshold=self.threshold, clear_threshold=self.clear_threshold)


@dataclass(frozen=True)
class Evidence:
    """What one evaluation knows: the detector's state and the label-free drift test.

    Attributes:
        n: Labels folded into the detector.
        alarmed: Whether the detector's alarm is raised.
        statistic: The e-detector (``DetectorState.statistic``).
        clear_statistic: The evidence that calibration has returned (``DetectorState.clear_statistic``).
        worst_gap: The estimated gap accuracy - confidence of the worst region.
        worst_confidence: That region's confidence range.
        shift: The KS test of recent against reference confidences, None when there is none.
    """

    n: int
    alarmed: bool = False
    statistic: float = 1.0
    clear_statistic: float = 1.0
    worst_gap: float = 0.0
    worst_confidence: tuple[float, float] = (0.0, 1.0)
    shift: ShiftTest | None = None


@dataclass(frozen=True)
class AlarmStatus:
    """The alarm's state (``ok``, ``warning`` or ``alarm``), the reasons for it and since when it holds."""

    state: str = OK
    reasons: tuple[str, ...] = field(default_factory=tuple)
    since: float | None = None

    def to_dict(self) -> dict:
        """The JSON form: ``{"state": ..., "reasons": [...], "since": ...}``."""
        return {"state": self.state, "reasons": list(self.reasons), "since": self.since}


def assess(previous: AlarmStatus, evidence: Evidence, policy: AlarmPolicy, now: float) -> AlarmStatus:
    """The next status of the alarm, from the previous one and what the evaluation knows.

    ``alarm`` while the detector's alarm is raised; otherwise ``warning`` when the e-detector has reached
    ``warn_threshold`` or the confidences have shifted materially (:func:`shift_is_material`); else ``ok``. The new
    status's ``since`` is kept while the state does not change, else ``now`` (seconds since the epoch).

    Examples:
        >>> policy = AlarmPolicy()
        >>> assess(AlarmStatus(), Evidence(n=900, alarmed=True, statistic=2e6, worst_gap=-0.08), policy, 5.0).state
        'alarm'
        >>> assess(AlarmStatus(), Evidence(n=900, statistic=3.0), policy, 5.0).state
        'ok'
    """
    low, high = evidence.worst_confidence
    where = (
        f"estimated gap accuracy - confidence {evidence.worst_gap:+.3f} at confidence {low:.3f}-{high:.3f} "
        f"(tolerance {policy.tolerance})"
    )
    if evidence.alarmed:
        alarm_reasons = (
            f"miscalibration beyond the tolerance: the e-detector reached {policy.threshold:.3g} "
            f"(now {evidence.statistic:.3g}; false alarms <= n / {policy.threshold:.3g})",
            where,
            f"clears when the evidence of calibration reaches {policy.clear_threshold:.3g} "
            f"(now {evidence.clear_statistic:.3g})",
        )
        return _next(previous, ALARM, alarm_reasons, now)
    reasons: list[str] = []
    if evidence.statistic >= policy.warn_threshold:
        reasons.append(
            f"evidence of miscalibration building: e-detector {evidence.statistic:.3g} of "
            f"{policy.threshold:.3g}; {where}"
        )
    shift = evidence.shift
    if shift is not None and shift_is_material(shift, policy):
        reasons.append(
            f"confidence distribution shifted from the reference (KS D = {shift.statistic:.3f} >= "
            f"{policy.shift_distance:g}, p = {shift.p_value:.2g}; mean {shift.recent_mean:.3f} vs "
            f"{shift.reference_mean:.3f})"
        )
    return _next(previous, WARNING if reasons else OK, tuple(reasons), now)


def shift_is_material(shift: ShiftTest, policy: AlarmPolicy) -> bool:
    """Whether the label-free drift test warns: a shift that is both significant and material.

    True when there are at least ``min_unlabelled`` recent predictions, p < ``shift_p_value`` and D >=
    ``shift_distance``: a large sample makes any difference significant, so the KS distance D (the largest gap
    between the two confidence CDFs) must reach ``shift_distance`` too.

    Examples:
        >>> policy = AlarmPolicy()
        >>> shift_is_material(ShiftTest(0.03, 1e-6, 50_000, 359, 0.95, 0.96), policy)  # significant, but tiny
        False
        >>> shift_is_material(ShiftTest(0.25, 1e-9, 500, 359, 0.80, 0.96), policy)
        True
    """
    return (
        shift.n_recent >= policy.min_unlabelled
        and shift.p_value < policy.shift_p_value
        and shift.statistic >= policy.shift_distance
    )


def _next(previous: AlarmStatus, state: str, reasons: tuple[str, ...], now: float) -> AlarmStatus:
    return AlarmStatus(state, reasons, previous.since if previous.state == state else now)
