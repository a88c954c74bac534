"""The alarm: new labels folded in order into the e-detector (``calibkit.detector``) and the state re-assessed
(``calibkit.alarms.assess``) under the state row's lock, so replicas and restarts reach the same decision."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass

from calibkit.alarms import LEVELS, AlarmPolicy, AlarmStatus, Evidence, assess
from calibkit.detector import DetectorState
from calibkit.drift import confidence_shift
from calibkit.estimated_accuracy import IntervalChecks
from service.metrics import ServiceMetrics
from service.monitoring.calibrations import ActiveCalibrations
from service.serving.repository import ServedModel
from service.store import Store
from service.store.rows import CalibrationKey

log = logging.getLogger("service.monitoring")

# the newest labels folded into a detector that holds none (restarted by new settings, or new beside stored labels)
REPLAY_LABELS = 5000


def load_detector(saved: str | None, policy: AlarmPolicy) -> DetectorState:
    """The detector saved as JSON; a fresh one for None or state saved under other settings."""
    config = policy.detector()
    return DetectorState(config) if saved is None else DetectorState.from_dict(json.loads(saved), config)


def load_checks(saved: str | None, block: int, level: float) -> IntervalChecks:
    """The interval checks saved as JSON; fresh ones for None or checks saved with another block or level."""
    return (
        IntervalChecks.fresh(block, level)
        if saved is None
        else IntervalChecks.from_dict(json.loads(saved), block, level)
    )


def saved_status(row) -> AlarmStatus:
    """The alarm status of a stored state row (ok when there is none)."""
    return AlarmStatus(row.state, tuple(json.loads(row.reasons)), row.since) if row else AlarmStatus()


@dataclass(eq=False)
class Alarm:
    store: Store
    metrics: ServiceMetrics
    calibrations: ActiveCalibrations
    policy: AlarmPolicy
    drift_rows: int
    trusted: frozenset[str] | None = None
    _: KW_ONLY
    check_labels: int = 500
    check_level: float = 0.95

    def export_states(self) -> None:
        """Set the alarm gauges of every active calibration from the shared store."""
        for row in self.store.alarm_states.all():
            key = CalibrationKey(row.model, row.version, row.calibration_version)
            if self.calibrations.is_active(key):
                self._export(key, row.state, load_detector(row.detector, self.policy))

    def assess(self, served: ServedModel, key: CalibrationKey) -> tuple[AlarmStatus, dict | None, bool]:
        """Fold ``key``'s new labels and re-assess: (status, transition or None, whether any was folded); the fold is
        redone under the row lock when the row changed meanwhile."""
        seen = self.store.alarm_states.get(key)
        fresh = json.dumps(load_detector(None, self.policy).to_dict())
        base: tuple[int, str, str | None] = (
            (seen.last_seq, seen.detector, seen.estimate_checks) if seen else (0, fresh, None)
        )
        prefolded = self._fold(key, *base, lambda seq, newest: self.store.labels.after(key, seq, newest=newest))

        with self.store.alarm_states.locked(key, fresh) as state:
            row = state.row
            detector, checks, last_seq, folded = (
                prefolded
                if (row.last_seq, row.detector, row.estimate_checks) == base
                else self._fold(
                    key,
                    row.last_seq,
                    row.detector,
                    row.estimate_checks,
                    lambda seq, newest: self.store.labels.after(key, seq, state.connection, newest),
                )
            )
            previous = saved_status(row)
            status = assess(previous, self._evidence(served, key, detector, state.connection), self.policy, time.time())
            state.save(
                last_seq=max(last_seq, row.last_seq),
                detector=json.dumps(detector.to_dict()),
                estimate_checks=json.dumps(checks.to_dict()),
                state=status.state,
                since=status.since,
                reasons=json.dumps(list(status.reasons)),
            )
        self._export(key, status.state, detector)
        if status.state == previous.state:
            return status, None, folded
        self.metrics.transitions.labels(key.model, key.version, status.state).inc()
        log.warning(
            "calibration of %s version %s: %s -> %s: %s",
            key.model,
            key.version,
            previous.state,
            status.state,
            "; ".join(status.reasons) or "no reasons",
        )
        return (
            status,
            {
                "model": key.model,
                "version": key.version,
                "calibration_version": key.calibration_version,
                "from": previous.state,
                "to": status.state,
                "reasons": list(status.reasons),
                "since": status.since,
            },
            folded,
        )

    def _fold(
        self,
        key: CalibrationKey,
        last_seq: int,
        saved: str,
        saved_checks: str | None,
        labels_after: Callable[[int, int | None], Sequence],
    ) -> tuple[DetectorState, IntervalChecks, int, bool]:
        """(detector, interval checks, last label looked at, whether any was) after the labels after ``last_seq``."""
        detector = load_detector(saved, self.policy)
        checks = load_checks(saved_checks, self.check_labels, self.check_level)
        if detector.n[0] == 0 and last_seq > 0:
            log.warning("detector state of %s/%s/%s restarted: replaying its recent labels", *key)
        new = labels_after(0, REPLAY_LABELS) if detector.n[0] == 0 else labels_after(last_seq, None)
        counted = new if self.trusted is None else [label for label in new if label.source in self.trusted]
        if counted:
            detector = detector.fold([[label.confidence for label in counted]], [[label.correct for label in counted]])
        unchecked = [label for label in counted if label.seq > last_seq]  # the saved checks hold the others
        if unchecked:
            checks = checks.fold([label.confidence for label in unchecked], [label.correct for label in unchecked])
        return detector, checks, new[-1].seq if new else last_seq, bool(new)

    def _evidence(self, served: ServedModel, key: CalibrationKey, detector: DetectorState, connection) -> Evidence:
        recent = self.store.predictions.recent_confidences(key, self.drift_rows, connection)
        shift = confidence_shift(recent, served.manifest.reference.confidences) if len(recent) else None
        gap, region = detector.worst_region()
        return Evidence(
            n=int(detector.n[0]),
            alarmed=bool(detector.alarmed[0]),
            statistic=float(detector.statistic[0]),
            clear_statistic=float(detector.clear_statistic[0]),
            worst_gap=gap,
            worst_confidence=region,
            shift=shift,
        )

    def _export(self, key: CalibrationKey, state: str, detector: DetectorState) -> None:
        self.metrics.alarm_state.labels(key.model, key.version).set(LEVELS[state])
        self.metrics.e_detector.labels(key.model, key.version).set(detector.statistic[0])
