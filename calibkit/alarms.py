"""The miscalibration alarm as a pure state machine: (previous status, evidence) -> new status.

``alarm`` needs all of: enough labels, the bias-corrected lower bound of the window's ECE above
the threshold (absolute, or the reference ECE plus a margin, whichever is higher), the
consistency-resampling calibration test rejecting at ``test_level`` (Broecker & Smith 2007), and
the anytime-valid e-detector above ``e_threshold`` (``calibkit.sequential``), which bounds the
chance of any false alarm over n labels by n / e_threshold however often the window is looked at.
It clears only when the ECE upper bound falls below ``clear_fraction`` x threshold: by default the
whole interval must be back below the threshold, so the interval's width (about 0.02-0.04 at 500
labels) is the hysteresis band -- raised when confidently above, cleared when confidently below.
``warning`` needs no labels: recent confidences drifting from the reference (KS test), or observed
accuracy away from the accuracy the confidences promise, or window evidence not yet confirmed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from calibkit.drift import AccuracyGap, ShiftTest
from calibkit.significance import EceInterval

OK, WARNING, ALARM = "ok", "warning", "alarm"
LEVELS = {OK: 0, WARNING: 1, ALARM: 2}


@dataclass(frozen=True)
class AlarmPolicy:
    """Thresholds of the alarm. False alarms are bounded by the e-detector (n / e_threshold); the ECE
    gate says the miscalibration is material: at 500 labels a window whose true ECE is 0.05 has a
    lower bound of about 0.03, a calibrated one about 0.00 (see docs/monitoring.md)."""

    min_labels: int = 200
    ece_threshold: float = 0.025
    reference_margin: float = 0.01
    clear_fraction: float = 1.0
    test_level: float = 0.01
    e_threshold: float = 1e6
    shift_p_value: float = 0.001
    min_unlabelled: int = 200
    accuracy_gap_z: float = 3.0

    def threshold(self, reference_ece: float | None) -> float:
        """The ECE the lower bound must exceed: max(absolute threshold, reference ECE + margin)."""
        return max(self.ece_threshold, (reference_ece or 0.0) + self.reference_margin)


@dataclass(frozen=True)
class Evidence:
    """What one evaluation knows: the window's ECE interval and test, the e-detector, drift signals."""

    n: int
    ece: EceInterval | None = None
    p_value: float | None = None
    e_statistic: float = 0.0
    shift: ShiftTest | None = None
    gap: AccuracyGap | None = None
    reference_ece: float | None = None


@dataclass(frozen=True)
class AlarmStatus:
    state: str = OK
    reasons: tuple[str, ...] = field(default_factory=tuple)
    since: float | None = None

    def to_dict(self) -> dict:
        return {"state": self.state, "reasons": list(self.reasons), "since": self.since}


def assess(previous: AlarmStatus, evidence: Evidence, policy: AlarmPolicy, now: float) -> AlarmStatus:
    """The next status; ``since`` is kept while the state does not change."""
    threshold = policy.threshold(evidence.reference_ece)
    enough = evidence.n >= policy.min_labels and evidence.ece is not None and evidence.p_value is not None
    window_says_worse = enough and evidence.ece.low > threshold and evidence.p_value < policy.test_level
    sequential_says_worse = evidence.e_statistic >= policy.e_threshold

    if window_says_worse and sequential_says_worse:
        reasons = (
            f"ECE lower bound {evidence.ece.low:.4f} > threshold {threshold:.4f} (ECE {evidence.ece.ece:.4f}, n={evidence.n})",
            f"calibration test (consistency resampling) p = {evidence.p_value:.4f} < {policy.test_level}",
            f"e-detector {evidence.e_statistic:.3g} >= {policy.e_threshold:.3g}",
        )
        return _next(previous, ALARM, reasons, now)
    if previous.state == ALARM:
        clear_below = policy.clear_fraction * threshold
        if not (enough and evidence.ece.high < clear_below):
            held = f"holding: the ECE upper bound must fall below {clear_below:.4f} to clear"
            return _next(previous, ALARM, tuple(r for r in previous.reasons if not r.startswith("holding")) + (held,), now)

    reasons = []
    if window_says_worse:
        reasons.append(f"ECE lower bound {evidence.ece.low:.4f} > threshold {threshold:.4f} and calibration test "
                       f"p = {evidence.p_value:.4f}; e-detector {evidence.e_statistic:.3g} not yet >= {policy.e_threshold:.3g}")
    if evidence.shift is not None and evidence.shift.n_recent >= policy.min_unlabelled \
            and evidence.shift.p_value < policy.shift_p_value:
        reasons.append(f"confidence distribution shifted from the reference (KS D = {evidence.shift.statistic:.3f}, "
                       f"p = {evidence.shift.p_value:.2g}; mean {evidence.shift.recent_mean:.3f} vs "
                       f"{evidence.shift.reference_mean:.3f})")
    if evidence.gap is not None and evidence.n >= policy.min_labels and abs(evidence.gap.z) >= policy.accuracy_gap_z:
        reasons.append(f"observed accuracy {evidence.gap.observed:.3f} vs {evidence.gap.expected:.3f} expected from "
                       f"the confidences (z = {evidence.gap.z:.1f})")
    return _next(previous, WARNING if reasons else OK, tuple(reasons), now)


def _next(previous: AlarmStatus, state: str, reasons: tuple[str, ...], now: float) -> AlarmStatus:
    return AlarmStatus(state, reasons, previous.since if previous.state == state else now)
