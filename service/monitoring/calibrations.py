"""Calibration versions in force: version 0 is the manifest's (baked into the ONNX graph), refits by ``POST
/admin/recalibrate`` count up, ``POST /admin/calibration/activate`` switches; cached per replica."""

from __future__ import annotations

import json

from service.errors import ModelNotFound
from service.schemas import ActivateResponse, AlarmEvent, CalibrationVersionInfo, HistoryResponse
from service.serving.repository import ModelRepository, ServedModel
from service.store import Store
from service.store.rows import CalibrationKey


class ActiveCalibrations:
    def __init__(self, store: Store, repository: ModelRepository):
        self.store = store
        self.repository = repository
        self._active: dict[tuple[str, str], tuple[int, float | None]] = {}

    def sync(self) -> None:
        """Record every model's manifest calibration (version 0) and load the active versions."""
        for model in self.repository.all():
            cal = model.manifest.calibration
            self.store.calibrations.ensure_manifest(model.name, model.version, cal.method, cal.temperature)
        self.refresh()

    def refresh(self) -> None:
        """Reload the active versions from the shared store (recalibrations made through other replicas)."""
        self._active = {
            (r.model, r.version): (r.calibration_version, r.temperature) for r in self.store.calibrations.active()
        }

    def active(self, model: ServedModel) -> tuple[int, float | None]:
        """(calibration version, temperature) in force; version 0 is the manifest's."""
        return self._active.get((model.name, model.version), (0, model.manifest.calibration.temperature))

    def is_active(self, key: CalibrationKey) -> bool:
        """Whether ``key``'s calibration version is the one in force for its model version."""
        return self._active.get((key.model, key.version), (0, None))[0] == key.calibration_version

    def key(self, model: ServedModel) -> CalibrationKey:
        """The key of ``model`` under its active calibration version."""
        return CalibrationKey(model.name, model.version, self.active(model)[0])

    def record_refit(self, key: CalibrationKey, temperature: float, details: dict) -> int:
        """Record a refitted temperature (fitted under ``key``) as the new active version; its number."""
        version = self.store.calibrations.add(
            key.model, key.version, temperature, details | {"fitted_from_calibration_version": key.calibration_version}
        )
        self.refresh()
        return version

    def activate(self, model: ServedModel, calibration_version: int) -> ActivateResponse:
        """Serve a recorded calibration version again."""
        if not self.store.calibrations.activate(model.name, model.version, calibration_version):
            raise ModelNotFound(
                f"model {model.name} version {model.version} has no calibration version {calibration_version}",
                field="calibration_version",
            )
        self.refresh()
        active, temperature = self.active(model)
        return ActivateResponse(
            model=model.name, version=model.version, calibration_version=active, temperature=temperature
        )

    def history(self, model: ServedModel) -> HistoryResponse:
        """Every calibration version of ``model`` and its alarm transitions."""
        return HistoryResponse(
            model=model.name,
            version=model.version,
            active_calibration_version=self.active(model)[0],
            calibrations=[
                CalibrationVersionInfo(
                    calibration_version=r.calibration_version,
                    method=r.method,
                    temperature=r.temperature,
                    source=r.source,
                    active=r.active,
                    created_at=r.created_at,
                    details=json.loads(r.details or "{}"),
                )
                for r in self.store.calibrations.of(model.name, model.version)
            ],
            alarm_events=[
                # the field names, not the aliases "from"/"to": mypy cannot see populate_by_name without the plugin
                AlarmEvent(  # type: ignore[call-arg]
                    at=r.at,
                    calibration_version=r.calibration_version,
                    from_state=r.from_state,
                    to_state=r.to_state,
                    reasons=json.loads(r.reasons),
                )
                for r in self.store.alarm_states.history(model.name, model.version)
            ],
        )
