"""The monitoring side assembled over one store, and the operations that span its parts (all blocking)."""

from __future__ import annotations

from calibkit.alarms import AlarmPolicy, AlarmStatus
from calibkit.conformal.adaptive import DEFAULT_METHOD
from calibkit.coverage_alarm import DEFAULT_THRESHOLD
from service.errors import InvalidInput
from service.metrics import ServiceMetrics
from service.monitoring.alarm import Alarm
from service.monitoring.calibrations import ActiveCalibrations
from service.monitoring.coverage import CoverageMonitor
from service.monitoring.estimates import Estimates
from service.monitoring.labels import LabelRecorder
from service.monitoring.reports import MIN_REFIT_LABELS, Reports
from service.monitoring.shift_alarm import ShiftAlarm
from service.monitoring.windows import Window
from service.schemas import ActivateResponse, HistoryResponse, RecalibrateResponse
from service.serving.repository import ModelRepository
from service.settings import ShiftSettings
from service.store import Store


class Monitor:
    def __init__(
        self,
        store: Store,
        repository: ModelRepository,
        metrics: ServiceMetrics,
        *,
        n_bins: int,
        policy: AlarmPolicy,
        alarm_window: str,
        detail_rows: int,
        drift_rows: int,
        n_resamples: int,
        retention_seconds: float = 30 * 86400,
        trusted: frozenset[str] | None = None,
        set_adaptation: str = DEFAULT_METHOD,
        set_step: float | None = None,
        coverage_alarm_threshold: float = DEFAULT_THRESHOLD,
        shift: ShiftSettings | None = None,
    ):
        shift = shift or ShiftSettings()
        self.repository = repository
        self.calibrations = ActiveCalibrations(store, repository)
        self.labels = LabelRecorder(store, repository, metrics, self.calibrations, n_bins, retention_seconds)
        self.alarm = Alarm(
            store,
            metrics,
            self.calibrations,
            policy,
            drift_rows,
            trusted,
            check_labels=shift.check_labels,
            check_level=shift.interval_level,
        )
        self.estimates = Estimates(store, metrics, rows=drift_rows, settings=shift)
        self.shift_alarm = ShiftAlarm(store, metrics, shift)
        self.coverage = CoverageMonitor(
            store,
            repository,
            metrics,
            adaptation=set_adaptation,
            step=set_step,
            alarm_threshold=coverage_alarm_threshold,
            trusted=trusted,
        )
        self.reports = Reports(
            store,
            repository,
            metrics,
            self.calibrations,
            n_bins=n_bins,
            policy=policy,
            alarm_window=Window.parse(alarm_window),
            detail_rows=detail_rows,
            drift_rows=drift_rows,
            n_resamples=n_resamples,
            trusted=trusted,
            estimates=self.estimates,
        )

    def sync(self) -> None:
        """Record the manifests' calibrations and load the active versions and alarm gauges."""
        self.calibrations.sync()
        self.alarm.export_states()
        self.coverage.load()
        for served in self.repository.all():
            self.shift_alarm.load(served, self.calibrations.key(served))

    def assess(self, name: str, version: str) -> tuple[AlarmStatus, dict | None]:
        """Re-assess a model version's alarm (``Alarm.assess``) and its window gauges: (status, transition or None)."""
        served = self.repository.get(name, version)
        key = self.calibrations.key(served)
        status, transition, folded = self.alarm.assess(served, key)
        if folded:
            self.reports.export_window(served, key)
        return status, transition

    def assess_shift(self, name: str, version: str) -> dict | None:
        """Refresh the label-free estimate's gauges and fold the label-shift alarm: the transition or None."""
        served = self.repository.get(name, version)
        key = self.calibrations.key(served)
        return self.shift_alarm.assess(served, key, self.estimates.export(served, key))

    def report(self, name: str | None, version: str | None, window: str | None, by_source: bool = False) -> dict:
        """The body of GET /calibration, with the served sets' coverage and the label-shift alarm."""
        body = self.reports.report(name, version, window, by_source)
        served = self.repository.get(name, version)
        win = Window.parse(window) if window is not None else self.reports.alarm_window
        body["coverage"] = self.coverage.report(served, win)
        body["label_shift"] = self.shift_alarm.report(served, self.calibrations.key(served))
        return body

    def recalibrate(self, name: str | None, version: str | None, window: str | None) -> RecalibrateResponse:
        """Refit the temperature on the window's labelled logits and make it the active calibration."""
        served, win, key, sums = self.reports.window(name, version, window)
        y, probs, logits = self.reports.refit_rows(key, win, sums.n)
        refit = self.reports.refit(y, probs, logits)
        if refit is None:
            raise InvalidInput(
                f"need at least {MIN_REFIT_LABELS} labelled online predictions with logits in "
                f"window {win.spec} (have {len(y)})",
                field="window",
            )
        new_version = self.calibrations.record_refit(key, refit.temperature, {"window": win.spec} | refit.model_dump())
        self.alarm.export_states()
        return RecalibrateResponse(
            model=served.name, version=served.version, calibration_version=new_version, **refit.model_dump()
        )

    def activate(self, name: str | None, version: str | None, calibration_version: int) -> ActivateResponse:
        """Serve a recorded calibration version again (0 = the manifest's)."""
        body = self.calibrations.activate(self.repository.get(name, version), calibration_version)
        self.alarm.export_states()
        return body

    def history(self, name: str | None, version: str | None) -> HistoryResponse:
        """Calibration versions and alarm transitions of a model version."""
        return self.calibrations.history(self.repository.get(name, version))
