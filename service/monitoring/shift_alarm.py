"""The label-shift alarm (``calibkit.label_shift_alarm``) over the served predictions, folded in id order from a
stored cursor under the state row's lock; only rows served ``settle_seconds`` ago, once every replica logged them.
"""

from __future__ import annotations

import json
import logging
import time

from calibkit.label_shift_alarm import LabelShiftAlarmConfig, LabelShiftAlarmState
from calibkit.manifest import LabelShiftReference
from service.metrics import ServiceMetrics
from service.serving.adaptation import Adaptation
from service.serving.repository import ServedModel
from service.settings import ShiftSettings
from service.store import Store
from service.store.predictions import SHARES
from service.store.rows import CalibrationKey, id_time

log = logging.getLogger("service.monitoring")

#: The most predictions one evaluation folds per model version: a backlog goes in steps, so the row lock is short.
MAX_FOLD = 20_000


class ShiftAlarm:
    def __init__(self, store: Store, metrics: ServiceMetrics, settings: ShiftSettings):
        self.store = store
        self.metrics = metrics
        self.settings = settings
        self._configs: dict[tuple[str, str], LabelShiftAlarmConfig] = {}

    def config(self, served: ServedModel) -> LabelShiftAlarmConfig | None:
        """The alarm's settings for a model version; None without the manifest's ``label_shift`` entry."""
        reference = served.manifest.label_shift
        if reference is None:
            return None
        found = self._configs.get((served.name, served.version))
        if found is None:
            found = self._configs[(served.name, served.version)] = alarm_config(reference, self.settings)
        return found

    def assess(self, served: ServedModel, key: CalibrationKey, estimated: dict | None) -> dict | None:
        """Fold the predictions served since the cursor, store the drift window's priors ``estimated`` and serve
        them; the transition (raised or cleared) or None."""
        config = self.config(served)
        if config is None:
            return None
        fresh = json.dumps(LabelShiftAlarmState.fresh(config).to_dict())
        until = time.time() - self.settings.settle_seconds
        with self.store.shift_states.locked(key, fresh) as locked:
            row = locked.row
            state = _load(row.state, config)
            was = bool(state.alarmed[0])
            cursor = row.cursor_id
            # at most ``fold_rate`` predictions a second, sampled by their ids' random bits when more came
            seconds = until - id_time(cursor) if cursor is not None else self.settings.settle_seconds + 1.0
            budget = self.settings.fold_rate * max(seconds, 1.0)
            cap = int(budget * SHARES) + 1
            waiting = self.store.predictions.count_served(key, cursor, until, locked.connection, cap)
            if waiting:
                share = SHARES if waiting <= budget else max(1, int(SHARES * budget / waiting))
                new = self.store.predictions.served_after(key, cursor, until, MAX_FOLD, locked.connection, share)
                state, cursor = (state.fold(new.probs) if len(new.probs) else state), new.last
            now = bool(state.alarmed[0])
            since = time.time() if now != was else row.since
            priors = row.priors if estimated is None else _served_priors(estimated)
            if waiting or priors != row.priors:
                locked.save(cursor=cursor, state=json.dumps(state.to_dict()), alarmed=now, since=since, priors=priors)
        _serve(served, priors, now)
        self._export(served, state)
        if now == was:
            return None
        summary = state.summary()
        driver = summary["driver"]
        name = served.manifest.class_names[driver["class"]]
        reason = (
            f"class {name!r} is {'above' if driver['side'] == 'up' else 'below'} its band: the label-shift "
            f"e-detector reached its threshold {config.threshold:.3g}"
            if now
            else f"every class is back inside its band (clearing evidence {config.clear_threshold:.3g} reached)"
        )
        log.warning(
            "label shift of %s version %s: %s: %s", key.model, key.version, "raised" if now else "cleared", reason
        )
        self.metrics.label_shift_transitions.labels(key.model, key.version, "alarm" if now else "ok").inc()
        return {
            "alarm": "label_shift",
            "model": key.model,
            "version": key.version,
            "calibration_version": key.calibration_version,
            "from": "alarm" if was else "ok",
            "to": "alarm" if now else "ok",
            "reasons": [reason],
            "since": since,
        }

    def load(self, served: ServedModel, key: CalibrationKey) -> None:
        """Serve the priors stored with the state (what the evaluating replica or front-end stored)."""
        row = self.store.shift_states.get(key)
        if row is not None and self.config(served) is not None:
            _serve(served, row.priors, bool(row.alarmed))

    def report(self, served: ServedModel, key: CalibrationKey) -> dict:
        """The ``label_shift`` block of GET /calibration."""
        config = self.config(served)
        if config is None:
            return {
                "available": False,
                "reason": "the manifest has no label_shift entry (artifacts exported before it; see "
                "scripts/upgrade_artifact.py)",
            }
        row = self.store.shift_states.get(key)
        state = _load(row.state if row else None, config)
        summary = state.summary()
        names = served.manifest.class_names
        for entry in summary["classes"]:
            entry["class"] = names[entry["class"]]
        summary["driver"]["class"] = names[summary["driver"]["class"]]
        adaptation = Adaptation.from_json(row.priors if row else None, False)
        return {
            "available": True,
            "state": "alarm" if summary.pop("alarmed") else "ok",
            "adapt": self.settings.adapt,
            "served_priors": None
            if adaptation is None
            else {
                "version": adaptation.version,
                "priors": dict(zip(names, adaptation.priors, strict=True)),
                "weights": dict(zip(names, adaptation.weights.tolist(), strict=True)),
            },
            "changed_at": row.since if row else None,
            "folded_through": row.cursor_at if row else None,
            "tolerance": config.tolerance,
            "reference_rows": config.n_reference,
            "raises": int(state.raises[0]),
        } | summary

    def _export(self, served: ServedModel, state: LabelShiftAlarmState) -> None:
        self.metrics.label_shift_alarm.labels(served.name, served.version).set(int(state.alarmed[0]))
        self.metrics.label_shift_e_detector.labels(served.name, served.version).set(float(state.statistic[0]))


def _serve(served: ServedModel, priors: str | None, alarmed: bool) -> None:
    """Hand a model version the stored priors, keeping its ``Adaptation`` while they and the alarm are unchanged
    (batches adapted under it are matched to requests by identity)."""
    current = served.adaptation
    if (
        current is None
        or current.alarmed != alarmed
        or priors is None
        or current.version != json.loads(priors)["version"]
    ):
        served.adaptation = Adaptation.from_json(priors, alarmed)


def _served_priors(estimated: dict) -> str:
    """The JSON the state row keeps of an EM estimate: its version, weights and priors in class order."""
    em = estimated["em"]
    return json.dumps(
        {
            "version": estimated["version"],
            "weights": list(em["weights"].values()),
            "priors": list(em["priors"].values()),
        }
    )


def _load(saved: str | None, config: LabelShiftAlarmConfig) -> LabelShiftAlarmState:
    """The state saved as JSON; a fresh one for None or one saved under other settings."""
    return (
        LabelShiftAlarmState.fresh(config)
        if saved is None
        else LabelShiftAlarmState.from_dict(json.loads(saved), config)
    )


def alarm_config(reference: LabelShiftReference, settings: ShiftSettings) -> LabelShiftAlarmConfig:
    """The alarm's configuration for a manifest's ``label_shift`` reference under ``settings``."""
    return LabelShiftAlarmConfig.for_reference(
        reference,
        tolerance=settings.alarm_tolerance,
        threshold=settings.alarm_threshold,
        clear_threshold=settings.alarm_clear_threshold,
    )
