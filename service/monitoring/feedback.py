"""Labelled feedback: each item is joined with the prediction it labels (or carries probabilities scored
elsewhere), checked, turned into a label row and stored; the requests of one group commit go in one
transaction (``service.monitoring.feedback_writer``). Alarms are assessed elsewhere
(``service.monitoring.evaluator``), never here."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from calibkit import binning, metrics
from calibkit.validation import row_problems
from service.errors import ModelNotFound
from service.metrics import ServiceMetrics
from service.monitoring.calibrations import CalibrationVersions
from service.serving.repository import ModelRepository, ServedModel
from service.store import Store
from service.store.rows import LabelRow, PredictionRow, decode_rows, encode_rows, prediction_ids

ALREADY_LABELLED = "duplicate feedback: this prediction already has a label"


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


class FeedbackRecorder:
    def __init__(self, store: Store, repository: ModelRepository, metrics_: ServiceMetrics,
                 calibrations: CalibrationVersions, n_bins: int):
        self.store = store
        self.repository = repository
        self.metrics = metrics_
        self.calibrations = calibrations
        self.n_bins = n_bins
        self.edges = binning.equal_width_edges(n_bins)

    def export_bin_counters(self) -> None:
        """Export every model's per-bin label counters at 0 (once, at start-up, whether or not the store
        is up): Prometheus' ``increase()`` counts from a series' first scrape, so labels counted before
        a bin's series first appeared would be missing from the ECE that the recording rules compute
        from these counters."""
        for model in self.repository.all():
            for b in range(self.n_bins):
                for counter in (self.metrics.labeled, self.metrics.confidence_sum, self.metrics.correct):
                    counter.labels(model.name, model.version, str(b))

    def record_group(self, requests: list[list]) -> list[dict]:
        """Validate, join and store the feedback of several requests in one transaction (committed
        before returning); one response body per request, with item indexes relative to it. The
        requests count in order, as if stored one after the other: an id labelled by an earlier
        request of the group is already labelled for the later ones."""
        flat = [item for items in requests for item in items]
        known = self.store.predictions.fetch({i.prediction_id for i in flat if i.prediction_id is not None})
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
        duplicates = self.store.labels.insert(list(label_rows.values()), new_predictions)
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
            label = _label_index(item.label, served)
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
        label = _label_index(item.label, served)
        if isinstance(label, str):
            return label
        calibration_version, _ = self.calibrations.active(served)
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

    def _count(self, rows: list[LabelRow]) -> None:
        for r in rows:
            labels = (r.model, r.version, str(r.conf_bin))
            self.metrics.labeled.labels(*labels).inc()
            self.metrics.confidence_sum.labels(*labels).inc(r.confidence)
            self.metrics.correct.labels(*labels).inc(r.correct)


def _label_index(label, served: ServedModel) -> int | str:
    """The class index of ``label`` (an index or a class name), or why it is not one."""
    classes = served.manifest.class_names
    if isinstance(label, bool):
        return f"label {label!r} is not a class of model {served.name}"
    if isinstance(label, str):
        return classes.index(label) if label in classes else (
            f"label {label!r} is not a class of model {served.name} (classes: {', '.join(classes[:20])})")
    if isinstance(label, int) and 0 <= label < len(classes):
        return label
    return f"label {label!r} is not a class index of model {served.name} (0..{len(classes) - 1})"
