"""Calibration monitoring: labelled feedback, rolling windows, alarms and recalibration.

Everything a report shows is computed from the shared store (windows summed from per-block bin sums, the
e-detector and alarm status persisted per model version and calibration version), so replicas
sharing one PostgreSQL report the same numbers; bootstrap seeds derive from the data, not the
process. All methods here are blocking and run in worker threads.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import zlib
from dataclasses import dataclass

import numpy as np

from calibkit import binning, metrics
from calibkit.alarms import LEVELS, AlarmPolicy, AlarmStatus, Evidence, assess
from calibkit.detector import DetectorState
from calibkit.drift import accuracy_gap, confidence_shift
from calibkit.plotting import figure_png, reliability_figure
from calibkit.significance import consistency_test, ece_interval
from calibkit.temperature import apply_temperature, fit_temperature
from calibkit.validation import row_problems
from service.errors import InvalidInput, ModelNotFound
from service.metrics import ServiceMetrics
from service.repository import ModelRepository, ServedModel
from service.schemas import WINDOW_PATTERN
from service.storage import (
    LabelRow,
    NewestRows,
    PredictionRow,
    Storage,
    decode_rows,
    encode_rows,
    prediction_ids,
)

log = logging.getLogger("service.monitoring")

_WINDOW = re.compile(WINDOW_PATTERN)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DETAIL_CACHE_SIZE = 64
REPLAY_LABELS = 5000  # label sequence numbers replayed into a detector restarted by an upgrade or new settings
NEWEST_CACHE_SIZE = 16  # (model, version, calibration version) whose newest labelled rows are held
ALREADY_LABELLED = "duplicate feedback: this prediction already has a label"


@dataclass(frozen=True)
class Window:
    """A label window: the last ``count`` labels, or the labels of the last ``seconds``."""

    spec: str
    count: int | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, spec: str) -> "Window":
        match = _WINDOW.match(spec.strip()) if isinstance(spec, str) else None
        if match is None:
            raise InvalidInput(f"window {spec!r} is neither a label count (e.g. 1000) nor a duration (e.g. 1h, 30m)",
                               field="window")
        count_text, amount, unit = match.groups()
        if count_text:
            return cls(spec, count=int(count_text))
        return cls(spec, seconds=float(amount) * _UNIT_SECONDS[unit])

    def to_dict(self) -> dict:
        return {"spec": self.spec, "kind": "count" if self.count else "time",
                "labels": self.count, "seconds": self.seconds}


@dataclass
class _Candidate:
    """A feedback item joined with what it labels: a logged prediction (its probabilities blob) or
    probabilities scored elsewhere (offline, a list still to be checked)."""

    index: int
    served: ServedModel
    calibration_version: int
    prediction_id: str
    probs: bytes | list
    label: int
    offline: bool
    logits: bytes | None = None


class Monitor:
    def __init__(self, storage: Storage, repository: ModelRepository, metrics_: ServiceMetrics, *,
                 n_bins: int, policy: AlarmPolicy, alarm_window: str, detail_rows: int, drift_rows: int,
                 n_resamples: int):
        self.storage = storage
        self.repository = repository
        self.metrics = metrics_
        self.n_bins = n_bins
        self.edges = binning.equal_width_edges(n_bins)
        self.policy = policy
        self.alarm_window = Window.parse(alarm_window)
        self.detail_rows = detail_rows
        self.drift_rows = drift_rows
        self.n_resamples = n_resamples
        self._active: dict[tuple[str, str], tuple[int, float | None]] = {}
        self._detail_cache: dict[tuple, dict] = {}
        self._newest: dict[tuple[str, str, int], NewestRows] = {}
        self._detail_lock = threading.Lock()

    # calibration versions --------------------------------------------------------------------

    def export_bin_counters(self) -> None:
        """Export every model's per-bin label counters at 0 (once, at start-up, whether or not the store
        is up): Prometheus' ``increase()`` counts from a series' first scrape, so labels counted before
        a bin's series first appeared would be missing from the ECE that the recording rules compute
        from these counters."""
        for model in self.repository.all():
            for b in range(self.n_bins):
                for counter in (self.metrics.labeled, self.metrics.confidence_sum, self.metrics.correct):
                    counter.labels(model.name, model.version, str(b))

    def sync_calibrations(self) -> None:
        """Record every model's manifest calibration (version 0) and cache the active versions."""
        for model in self.repository.all():
            cal = model.manifest.calibration
            self.storage.ensure_manifest_calibration(model.name, model.version, cal.method, cal.temperature)
        self.refresh_active()

    def refresh_active(self) -> None:
        """Reload the active calibration versions and the alarm gauges from the shared store, so a
        replica reports recalibrations and alarms raised through the others."""
        self._active = {(r.model, r.version): (r.calibration_version, r.temperature)
                        for r in self.storage.active_calibrations()}
        for row in self.storage.monitor_rows():
            if self._active.get((row.model, row.version), (0, None))[0] == row.calibration_version:
                self.metrics.alarm_state.labels(row.model, row.version).set(LEVELS[row.state])
                self.metrics.e_detector.labels(row.model, row.version).set(self._detector(row.detector).statistic[0])

    def active(self, model: ServedModel) -> tuple[int, float | None]:
        """(calibration version, temperature) in force; version 0 is the manifest's, baked into ONNX."""
        return self._active.get((model.name, model.version), (0, model.manifest.calibration.temperature))

    # feedback --------------------------------------------------------------------------------

    def record_feedback(self, items: list) -> dict:
        """Validate, join and store one request's feedback (committed before returning); its response body."""
        return self.record_feedback_group([items])[0]

    def record_feedback_group(self, requests: list[list]) -> list[dict]:
        """Validate, join and store the feedback of several requests in one transaction (committed
        before returning); one response body per request, with item indexes relative to it. The
        requests count in order, as if stored one after the other: an id labelled by an earlier
        request of the group is already labelled for the later ones. Alarms are assessed elsewhere
        (``service.evaluator``), never here."""
        flat = [item for items in requests for item in items]
        known = self.storage.fetch_predictions({i.prediction_id for i in flat if i.prediction_id is not None})
        reasons: list[str | None] = [None] * len(flat)
        candidates, earlier, index = [], set(), 0
        for items in requests:
            seen = set()
            for item in items:
                if item.prediction_id is not None and item.prediction_id in seen:
                    reasons[index] = "duplicate feedback for this prediction id in this request"
                else:
                    outcome = self._resolve(index, item, known)
                    if isinstance(outcome, str):
                        reasons[index] = outcome
                    else:
                        seen.add(item.prediction_id)
                        if item.prediction_id is not None and item.prediction_id in earlier:
                            reasons[index] = ALREADY_LABELLED
                        else:
                            candidates.append(outcome)
                index += 1
            earlier |= seen
        label_rows, new_predictions = self._label_rows(candidates, reasons)
        duplicates = self.storage.insert_labels(list(label_rows.values()), new_predictions)
        bodies, accepted, index = [], [], 0
        for items in requests:
            rejected, taken = [], 0
            for position, item in enumerate(items):
                row = label_rows.get(index)
                reason = reasons[index] or (ALREADY_LABELLED if row.prediction_id in duplicates else None)
                if reason:
                    rejected.append({"index": position, "prediction_id": item.prediction_id, "reason": reason})
                else:
                    accepted.append(row)
                    taken += 1
                index += 1
            bodies.append({"accepted": taken, "rejected": rejected})
        self._count(accepted)
        self.metrics.feedback_items.labels("accepted").inc(len(accepted))
        self.metrics.feedback_items.labels("rejected").inc(len(flat) - len(accepted))
        return bodies

    def _resolve(self, index: int, item, known: dict) -> _Candidate | str:
        """The item joined with its prediction (or its own probabilities), or why it is rejected.
        Offline probabilities are checked later, all rows of a model at once."""
        if item.prediction_id is not None:
            row = known.get(item.prediction_id)
            if row is None:
                return f"unknown prediction id {item.prediction_id!r}"
            try:
                served = self.repository.get(row.model, row.version)
            except ModelNotFound:
                return f"model {row.model} version {row.version} is no longer served"
            label = self._label_index(item.label, served)
            if isinstance(label, str):
                return label
            return _Candidate(index, served, row.calibration_version, row.id, row.probabilities, label, False,
                              row.logits)
        try:
            served = self.repository.get(item.model, item.version)
        except ModelNotFound as exc:
            return exc.message
        k = len(served.manifest.class_names)
        if len(item.probabilities) != k:
            return f"probabilities has {len(item.probabilities)} values; model {served.name} has {k} classes"
        label = self._label_index(item.label, served)
        if isinstance(label, str):
            return label
        calibration_version, _ = self.active(served)
        return _Candidate(index, served, calibration_version, "", item.probabilities, label, True)

    def _label_rows(self, candidates: list[_Candidate],
                    reasons: list) -> tuple[dict[int, LabelRow], list[PredictionRow]]:
        """Label rows (by item index) and offline prediction rows, computed per model in a few array
        operations; offline probability rows that are not probability vectors get their reason."""
        now = time.time()
        label_rows, new_predictions = {}, []
        groups: dict[tuple, list[_Candidate]] = {}
        for c in candidates:
            groups.setdefault((c.served.name, c.served.version, c.offline), []).append(c)
        for (_, _, offline), group in groups.items():
            if offline:
                for c, new_id in zip(group, prediction_ids(len(group))):
                    c.prediction_id = new_id
                probs = np.array([c.probs for c in group], dtype=np.float64)
                problems = row_problems(probs)
                for c, problem in zip(group, problems):
                    reasons[c.index] = problem
                keep = [i for i, problem in enumerate(problems) if problem is None]
                group, probs = [group[i] for i in keep], np.clip(probs[keep], 0.0, 1.0)
            else:
                probs = decode_rows([c.probs for c in group])
            if not group:
                continue
            y = np.array([c.label for c in group])
            predicted = probs.argmax(axis=1)
            confidence = probs[np.arange(len(y)), predicted]
            bins = binning.bin_index(confidence, self.edges).tolist()
            nll, brier = metrics.nll_terms(probs, y).tolist(), metrics.brier_terms(probs, y).tolist()
            correct = (predicted == y).astype(int).tolist()
            predicted, confidence = predicted.tolist(), confidence.tolist()
            blobs = encode_rows(probs) if offline else [c.probs for c in group]
            for i, (c, blob) in enumerate(zip(group, blobs)):
                label_rows[c.index] = LabelRow(c.prediction_id, c.served.name, c.served.version, c.calibration_version,
                                               c.label, correct[i], confidence[i], bins[i], nll[i], brier[i], now,
                                               blob, c.logits)
                if offline:
                    new_predictions.append(PredictionRow(c.prediction_id, c.served.name, c.served.version,
                                                         c.calibration_version, now, predicted[i], confidence[i], None,
                                                         blob, None, "offline"))
        return dict(sorted(label_rows.items())), new_predictions

    @staticmethod
    def _label_index(label, served: ServedModel) -> int | str:
        classes = served.manifest.class_names
        if isinstance(label, bool):
            return f"label {label!r} is not a class of model {served.name}"
        if isinstance(label, str):
            return classes.index(label) if label in classes else (
                f"label {label!r} is not a class of model {served.name} (classes: {', '.join(classes[:20])})")
        if isinstance(label, int) and 0 <= label < len(classes):
            return label
        return f"label {label!r} is not a class index of model {served.name} (0..{len(classes) - 1})"

    def _count(self, rows: list[LabelRow]) -> None:
        for r in rows:
            labels = (r.model, r.version, str(r.conf_bin))
            self.metrics.labeled.labels(*labels).inc()
            self.metrics.confidence_sum.labels(*labels).inc(r.confidence)
            self.metrics.correct.labels(*labels).inc(r.correct)

    # alarm state -----------------------------------------------------------------------------

    def update(self, name: str, version: str) -> tuple[AlarmStatus, dict | None]:
        """Fold new labels, in label order, into the detector and re-assess the alarm. The decision is a
        function of the label sequence alone, so replicas and restarts reach the same one. The labels
        are folded before the row lock shared by all replicas is taken (on SQLite it is the database
        write lock, which feedback needs too); under the lock the fold is kept when the row is still
        the one it started from, and redone otherwise. A transition is recorded, logged, counted and
        returned."""
        served = self.repository.get(name, version)
        calibration_version, _ = self.active(served)
        key = (name, version, calibration_version)
        seen = self.storage.monitor_row(*key)
        fresh = json.dumps(self._detector(None).to_dict())
        base = (seen.last_seq, seen.detector) if seen else (0, fresh)
        prefolded = self._fold(key, *base, lambda seq: self.storage.labels_after(*key, seq))

        def work(c):
            row = self.storage.locked_monitor_row(c, *key, fresh)
            detector, last_seq, folded = (prefolded if (row.last_seq, row.detector) == base else
                                          self._fold(key, row.last_seq, row.detector,
                                                     lambda seq: self.storage.labels_after(*key, seq, connection=c)))
            previous = AlarmStatus(row.state, tuple(json.loads(row.reasons)), row.since)
            evidence = self._evidence(served, calibration_version, detector, c)
            status = assess(previous, evidence, self.policy, time.time())
            self.storage.save_monitor_state(c, *key, last_seq=max(last_seq, row.last_seq),
                                            detector=json.dumps(detector.to_dict()), state=status.state,
                                            since=status.since, reasons=json.dumps(list(status.reasons)),
                                            previous_state=previous.state)
            return previous, status, detector, folded

        previous, status, detector, folded = self.storage.transaction(work)
        self._export(name, version, status, detector)
        if folded:
            self._export_window(served, calibration_version)
        if status.state == previous.state:
            return status, None
        self.metrics.transitions.labels(name, version, status.state).inc()
        log.warning("calibration of %s version %s: %s -> %s: %s", name, version, previous.state, status.state,
                    "; ".join(status.reasons) or "no reasons")
        return status, {"model": name, "version": version, "calibration_version": calibration_version,
                        "from": previous.state, "to": status.state, "reasons": list(status.reasons),
                        "since": status.since}

    def _fold(self, key: tuple, last_seq: int, saved: str, labels_after) -> tuple[DetectorState, int, bool]:
        """(detector, last label folded, whether any was) after folding ``labels_after(last_seq)`` into the
        saved detector; a detector restarted by an upgrade or new settings replays the recent labels."""
        detector = self._detector(saved)
        if detector.n[0] == 0 and last_seq > 0:
            last_seq = max(0, last_seq - REPLAY_LABELS)
            log.warning("detector state of %s/%s/%s restarted: replaying its recent labels", *key)
        new = labels_after(last_seq)
        if new:
            detector.fold([[label.confidence for label in new]], [[label.correct for label in new]])
        return detector, new[-1].seq if new else last_seq, bool(new)

    def _detector(self, saved: str | None) -> DetectorState:
        """The detector saved as JSON; a fresh one for None or state saved under other settings."""
        config = self.policy.detector()
        return DetectorState(config) if saved is None else DetectorState.from_dict(json.loads(saved), config)

    def _evidence(self, served: ServedModel, calibration_version: int, detector: DetectorState, c=None) -> Evidence:
        recent = self.storage.recent_confidences(served.name, served.version, calibration_version, self.drift_rows,
                                                 connection=c)
        shift = confidence_shift(recent, served.manifest.reference.confidences) if len(recent) else None
        gap, region = detector.worst_region()
        return Evidence(n=int(detector.n[0]), alarmed=bool(detector.alarmed[0]), statistic=float(detector.statistic[0]),
                        clear_statistic=float(detector.clear_statistic[0]), worst_gap=gap, worst_confidence=region,
                        shift=shift)

    @staticmethod
    def _seed(served: ServedModel, calibration_version: int, last_seq: int) -> int:
        return zlib.crc32(f"{served.name}/{served.version}/{calibration_version}/{last_seq}".encode())

    def _export(self, name, version, status: AlarmStatus, detector: DetectorState) -> None:
        self.metrics.alarm_state.labels(name, version).set(LEVELS[status.state])
        self.metrics.e_detector.labels(name, version).set(detector.statistic[0])

    def _export_window(self, served: ServedModel, calibration_version: int) -> None:
        """The default window's ECE and interval as gauges (dashboards), after new labels were folded."""
        _, _, _, agg = self._resolve_window(served.name, served.version, None)
        self.metrics.window_labels.labels(served.name, served.version).set(agg.n)
        if agg.n:
            ci = ece_interval(agg.sums, n_resamples=self.n_resamples,
                              seed=self._seed(served, calibration_version, agg.last_seq))
            self.metrics.window_ece.labels(served.name, served.version).set(ci.ece)
            self.metrics.window_ece_low.labels(served.name, served.version).set(ci.low)
            self.metrics.window_ece_high.labels(served.name, served.version).set(ci.high)

    # reports ---------------------------------------------------------------------------------

    def _resolve_window(self, name: str | None, version: str | None, window: str | None):
        """(model, window, active calibration version, the window's sums)."""
        served = self.repository.get(name, version)
        win = Window.parse(window) if window is not None else self.alarm_window
        calibration_version, _ = self.active(served)
        agg = self.storage.window(served.name, served.version, calibration_version, self.n_bins,
                                  last=win.count, seconds=win.seconds)
        return served, win, calibration_version, agg

    def report(self, name: str | None, version: str | None, window: str | None) -> dict:
        """The body of GET /calibration."""
        served, win, calibration_version, agg = self._resolve_window(name, version, window)
        _, temperature = self.active(served)
        state_row = self.storage.monitor_row(served.name, served.version, calibration_version)
        status = (AlarmStatus(state_row.state, tuple(json.loads(state_row.reasons)), state_row.since)
                  if state_row else AlarmStatus())
        detector = self._detector(state_row.detector if state_row else None)
        manifest = served.manifest
        body = {
            "model": served.name, "version": served.version, "calibration_version": calibration_version,
            "temperature": temperature, "window": win.to_dict(), "n": agg.n,
            "first_labelled_at": agg.first_labelled_at, "last_labelled_at": agg.last_labelled_at,
            "reference": {"split": manifest.reference.split, "n": len(manifest.reference.confidences),
                          "ece": manifest.reference.ece, "accuracy": manifest.reference.accuracy,
                          "mean_confidence": float(np.mean(manifest.reference.confidences))},
            "alarm": status.to_dict(),
            "e_detector": {"statistic": float(detector.statistic[0]), "threshold": self.policy.threshold,
                           "clear_statistic": float(detector.clear_statistic[0]),
                           "clear_threshold": self.policy.clear_threshold, "labels_seen": int(detector.n[0]),
                           "tolerance": self.policy.tolerance, "regions": detector.regions()},
            "thresholds": {"tolerance": self.policy.tolerance, "e_detector": self.policy.threshold,
                           "clear": self.policy.clear_threshold, "warning": self.policy.warn_threshold,
                           "min_labels": self.policy.min_labels},
        }
        body.update(self._window_metrics(served, calibration_version, agg, win))
        body["drift"] = self._drift(served, calibration_version, agg)
        return body

    def _window_metrics(self, served, calibration_version, agg, win: Window) -> dict:
        empty = {k: None for k in ("accuracy", "mean_confidence", "ece", "ece_ci", "ece_ci_level", "mce",
                                   "debiased_ece", "adaptive_ece", "classwise_ece", "brier", "nll",
                                   "calibration_test_p_value", "recalibration")}
        if agg.n == 0:
            return empty | {"bins": binning.reliability(agg.sums, self.edges).to_records(), "detail_rows": 0}
        seed = self._seed(served, calibration_version, agg.last_seq)
        ci = ece_interval(agg.sums, n_resamples=self.n_resamples, seed=seed)
        return {
            "accuracy": float(agg.sums.outcome_sum.sum() / agg.n),
            "mean_confidence": float(agg.sums.confidence_sum.sum() / agg.n),
            "ece": ci.ece, "ece_ci": [ci.low, ci.high], "ece_ci_level": ci.level,
            "mce": binning.calibration_error(agg.sums, "max"),
            "debiased_ece": binning.debiased_l2_error(agg.sums),
            "brier": agg.brier_sum / agg.n, "nll": agg.nll_sum / agg.n,
            "calibration_test_p_value": consistency_test(agg.sums, n_resamples=self.n_resamples, seed=seed + 1),
            "bins": binning.reliability(agg.sums, self.edges).to_records(),
        } | self._details(served, calibration_version, agg, win)

    def _details(self, served, calibration_version, agg, win: Window) -> dict:
        """AdaECE, classwise ECE and the refit on the window's most recent ``detail_rows`` labels. Cached
        by (model version, calibration version, last label, label count): the same pair is the same
        label set, for count and time windows alike, so a dashboard polling a quiet window costs no
        row fetch."""
        key = (served.name, served.version, calibration_version, agg.last_seq, agg.n)
        with self._detail_lock:
            found = self._detail_cache.get(key)
        if found is not None:
            return found
        y, probs, logits = self._detail_rows(served, calibration_version, win, agg.n)
        found = {"adaptive_ece": metrics.adaptive_ece(probs, y, self.n_bins),
                 "classwise_ece": metrics.classwise_ece(probs, y, self.n_bins),
                 "detail_rows": len(y), "recalibration": self._refit(logits, y, probs)}
        with self._detail_lock:
            self._detail_cache[key] = found
            while len(self._detail_cache) > DETAIL_CACHE_SIZE:
                self._detail_cache.pop(next(iter(self._detail_cache)))
        return found

    def _detail_rows(self, served, calibration_version: int, win: Window, n: int):
        """(labels, calibrated probabilities, logits or None when some row has none) of the window's
        ``min(detail_rows, n)`` most recent labels."""
        if win.seconds is None:
            rows = self._newest_rows(served, calibration_version)
        else:
            rows, _ = self.storage.newest_rows(served.name, served.version, calibration_version, self.detail_rows,
                                               seconds=win.seconds)
        rows = rows.head(min(self.detail_rows, n))
        return rows.y, rows.probs, None if np.isnan(rows.logits).any() else rows.logits

    def _newest_rows(self, served, calibration_version: int) -> NewestRows:
        """The ``detail_rows`` most recent labelled rows, kept in memory: after the first fetch only the
        labels that arrived since are read (one index range of a few rows instead of thousands). The
        rows held are refetched whole when the store no longer has exactly them (a retention purge, a
        label committed late by another replica)."""
        key = (served.name, served.version, calibration_version)
        with self._detail_lock:
            held = self._newest.get(key)
        limit = self.detail_rows
        if held is None or not len(held.seq):
            rows, _ = self.storage.newest_rows(*key, limit)
        else:
            new, count = self.storage.newest_rows(*key, limit, after_seq=int(held.seq[0]),
                                                  count_from=int(held.seq[-1]))
            if len(new.seq) < limit and count != len(held.seq) + len(new.seq):
                rows, _ = self.storage.newest_rows(*key, limit)
            else:
                rows = new.then(held, limit)
        with self._detail_lock:
            self._newest[key] = rows
            while len(self._newest) > NEWEST_CACHE_SIZE:
                self._newest.pop(next(iter(self._newest)))
        return rows

    def _refit(self, logits, y, probs) -> dict | None:
        """The temperature refitted on the window's labelled logits and what it would do (in-sample)."""
        if logits is None or len(y) < 50:
            return None
        t = fit_temperature(logits, y)
        refit = apply_temperature(logits, t)
        return {"temperature": t, "n": len(y), "ece_current": metrics.ece(probs, y, self.n_bins),
                "ece_after": metrics.ece(refit, y, self.n_bins), "nll_current": metrics.nll(probs, y),
                "nll_after": metrics.nll(refit, y)}

    def _drift(self, served, calibration_version, agg) -> dict:
        recent = self.storage.recent_confidences(served.name, served.version, calibration_version, self.drift_rows)
        out = {"recent_predictions": len(recent)}
        if len(recent):
            shift = confidence_shift(recent, served.manifest.reference.confidences)
            out.update({"ks_statistic": shift.statistic, "ks_p_value": shift.p_value,
                        "recent_mean_confidence": shift.recent_mean, "reference_mean_confidence": shift.reference_mean,
                        "estimated_accuracy": shift.recent_mean})
        if agg.n:
            gap = accuracy_gap(agg.n, agg.sums.confidence_sum.sum(), agg.sums.outcome_sum.sum())
            out.update({"observed_accuracy": gap.observed, "expected_accuracy": gap.expected, "accuracy_gap_z": gap.z})
        return out

    def timeline(self, name: str | None, version: str | None, window: int, step: int, points: int) -> dict:
        """Rolling ECE over time: the ECE of the last ``window`` labels after every ``step`` labels,
        for the most recent ``points`` steps (the data of the dashboard's chart)."""
        served = self.repository.get(name, version)
        calibration_version, _ = self.active(served)
        rows = self.storage.recent_labels(served.name, served.version, calibration_version, window + step * points)
        out = []
        if rows:
            conf = np.array([r.confidence for r in rows])
            correct = np.array([r.correct for r in rows], dtype=np.float64)
            for end in range(len(rows), 0, -step):
                start = max(0, end - window)
                sums = binning.bin_sums(conf[start:end], correct[start:end], self.edges)
                ci = ece_interval(sums, n_resamples=200, seed=int(rows[end - 1].seq))
                out.append({"seq": int(rows[end - 1].seq), "labelled_at": float(rows[end - 1].labelled_at),
                            "n": end - start, "ece": ci.ece, "ece_ci": [ci.low, ci.high]})
                if len(out) == points:
                    break
        return {"model": served.name, "version": served.version, "calibration_version": calibration_version,
                "window": window, "step": step, "points": out[::-1]}

    def reliability_png(self, name: str | None, version: str | None, window: str | None) -> bytes:
        """The window's reliability diagram with confidence histogram, as PNG."""
        served, win, calibration_version, agg = self._resolve_window(name, version, window)
        title = f"{served.name} v{served.version} (calibration {calibration_version}), window {win.spec}"
        return figure_png(reliability_figure({"live traffic": binning.reliability(agg.sums, self.edges)}, title=title))

    # recalibration ---------------------------------------------------------------------------

    def recalibrate(self, name: str | None, version: str | None, window: str | None) -> dict:
        """Refit the temperature on the window's labelled logits and make it the active calibration."""
        served, win, calibration_version, agg = self._resolve_window(name, version, window)
        y, probs, logits = self._detail_rows(served, calibration_version, win, agg.n)
        refit = self._refit(logits, y, probs)
        if refit is None:
            raise InvalidInput(f"need at least 50 labelled online predictions with logits in window {win.spec} "
                               f"(have {len(y)})", field="window")
        new_version = self.storage.add_calibration(served.name, served.version, refit["temperature"],
                                                   {"window": win.spec, "fitted_from_calibration_version":
                                                    calibration_version} | refit)
        self.refresh_active()
        return {"model": served.name, "version": served.version, "calibration_version": new_version, **refit}

    def activate(self, name: str | None, version: str | None, calibration_version: int) -> dict:
        served = self.repository.get(name, version)
        if not self.storage.activate_calibration(served.name, served.version, calibration_version):
            raise ModelNotFound(f"model {served.name} version {served.version} has no calibration version "
                                f"{calibration_version}", field="calibration_version")
        self.refresh_active()
        active, temperature = self.active(served)
        return {"model": served.name, "version": served.version, "calibration_version": active,
                "temperature": temperature}

    def history(self, name: str | None, version: str | None) -> dict:
        served = self.repository.get(name, version)
        active, _ = self.active(served)
        return {
            "model": served.name, "version": served.version, "active_calibration_version": active,
            "calibrations": [{"calibration_version": r.calibration_version, "method": r.method,
                              "temperature": r.temperature, "source": r.source, "active": r.active,
                              "created_at": r.created_at, "details": json.loads(r.details or "{}")}
                             for r in self.storage.calibrations_of(served.name, served.version)],
            "alarm_events": [{"at": r.at, "calibration_version": r.calibration_version, "from": r.from_state,
                              "to": r.to_state, "reasons": json.loads(r.reasons)}
                             for r in self.storage.alarm_history(served.name, served.version)],
        }
