"""Labelled feedback: each item joined with the prediction it labels and stored, pending until that is stored."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import NamedTuple, cast

import numpy as np

from calibkit import binning, metrics
from calibkit.validation import row_problems
from service.errors import ModelNotFound
from service.metrics import ServiceMetrics
from service.monitoring.calibrations import ActiveCalibrations
from service.serving.conformal import covered, set_size
from service.serving.repository import ModelRepository, ServedModel
from service.store import Store
from service.store.labels import insert_labels
from service.store.pending import ALREADY_LABELLED, Joinable, JoinPass, PendingLabel
from service.store.rows import (
    ANONYMOUS,
    OFFLINE,
    PREDICTION_ID,
    LabelRow,
    PredictionRow,
    decode_rows,
    encode_rows,
    id_time,
    prediction_ids,
)

_CLOCK_SKEW = 300.0  # seconds a replica's clock may run ahead of another's
ALREADY_PENDING = "duplicate feedback: this prediction already has a pending label"


class _Labelled(NamedTuple):
    """A pending label's prediction id and label as sent, in the shape of a feedback item."""

    prediction_id: str
    label: int | str


@dataclass
class _Candidate:
    """A feedback item joined with a logged prediction (its probabilities blob) or offline probabilities (a list)."""

    index: int
    served: ServedModel
    calibration_version: int
    prediction_id: str
    probs: bytes | list
    label: int
    offline: bool
    logits: bytes | None = None
    source: str = ANONYMOUS
    served_set: ServedSet | None = None  # the set served with it


class ServedSet(NamedTuple):
    """The set logged with a prediction and the probabilities it was computed from (None: the prediction's own)."""

    members: bytes
    coverage: float
    method: str
    randomized: bool
    probabilities: bytes | None


@dataclass(eq=False)
class LabelRecorder:
    store: Store
    repository: ModelRepository
    metrics: ServiceMetrics
    calibrations: ActiveCalibrations
    n_bins: int
    retention_seconds: float = 30 * 86400

    def __post_init__(self) -> None:
        self.edges = binning.equal_width_edges(self.n_bins)

    def export_bin_counters(self) -> None:
        """Export every model's per-bin label counters at 0 at start-up: Prometheus' ``increase()`` counts from a
        series' first scrape, so labels counted before would be missing from the recording rules' ECE."""
        for model in self.repository.all():
            for b in range(self.n_bins):
                for counter in (self.metrics.labeled, self.metrics.confidence_sum, self.metrics.correct):
                    counter.labels(model.name, model.version, str(b))

    def record_group(self, requests: list[tuple[list, str]]) -> list[dict]:
        """Store several (items, source) requests in one transaction, as if one after the other; a body per request."""
        flat = [item for items, _ in requests for item in items]
        known = self.store.predictions.fetch({i.prediction_id for i in flat if i.prediction_id is not None})
        now = time.time()
        reasons: list[str | None] = [None] * len(flat)
        candidates, pending, earlier, index = [], {}, set(), 0
        for items, source in requests:
            seen = set()
            for item in items:
                if item.prediction_id is not None and item.prediction_id in seen:
                    reasons[index] = "duplicate feedback for this prediction id in this request"
                else:
                    outcome = self._resolve(index, item, known, now, source)
                    if isinstance(outcome, str):
                        reasons[index] = outcome
                    else:
                        seen.add(item.prediction_id)
                        if item.prediction_id is not None and item.prediction_id in earlier:
                            reasons[index] = ALREADY_LABELLED
                        elif isinstance(outcome, PendingLabel):
                            pending[index] = outcome
                        else:
                            candidates.append(outcome)
                index += 1
            earlier |= seen
        label_rows, new_predictions = self._label_rows(candidates, reasons, now)
        labelled, waiting = self.store.labels.insert(list(label_rows.values()), new_predictions, list(pending.values()))
        bodies: list[dict] = []
        accepted: list[LabelRow] = []
        index = 0
        for items, _ in requests:
            rejected, waits, taken = [], [], 0
            for position, item in enumerate(items):
                reason = reasons[index] or _duplicate(item.prediction_id, labelled, waiting)
                if reason:
                    rejected.append({"index": position, "prediction_id": item.prediction_id, "reason": reason})
                elif index in pending:
                    waits.append({"index": position, "prediction_id": item.prediction_id})
                else:  # neither rejected nor pending: joined, so it has its label row
                    accepted.append(label_rows[index])
                    taken += 1
                index += 1
            bodies.append({"accepted": taken, "pending": waits, "rejected": rejected})
        self._count(accepted)
        waited = sum(len(b["pending"]) for b in bodies)
        self.metrics.feedback_items.labels("accepted").inc(len(accepted))
        self.metrics.feedback_items.labels("pending").inc(waited)
        self.metrics.feedback_items.labels("rejected").inc(len(flat) - len(accepted) - waited)
        return bodies

    def join_pending(self, horizon: float) -> JoinPass | None:
        """Join the pending labels whose prediction is now stored and expire those older than ``horizon`` seconds
        (``PendingLabels.join``); None when another replica is joining."""
        now = time.time()

        def resolve(rows: list[Joinable]) -> tuple[dict[int, LabelRow], dict[int, str]]:
            reasons: list[str | None] = [None] * len(rows)
            candidates: list[_Candidate] = []
            for index, row in enumerate(rows):
                pid = row.prediction.id
                outcome = self._resolve(
                    index, _Labelled(pid, json.loads(row.label)), {pid: row.prediction}, now, row.source or ANONYMOUS
                )
                if isinstance(outcome, str):
                    reasons[index] = outcome
                else:
                    assert isinstance(outcome, _Candidate)  # its prediction is known: never pending again
                    candidates.append(outcome)
            label_rows, _ = self._label_rows(candidates, reasons, now)
            return (
                {rows[i].seq: r for i, r in label_rows.items()},
                {rows[i].seq: reason for i, reason in enumerate(reasons) if reason},
            )

        done = self.store.pending.join(resolve, insert_labels, now=now, horizon=horizon)
        if done is not None:
            self._count(done.joined)
            self.metrics.pending_labels.set(done.pending)
            for outcome, n in (("joined", len(done.joined)), ("expired", done.expired), ("rejected", done.rejected)):
                self.metrics.pending_resolved.labels(outcome).inc(n)
        return done

    def _resolve(self, index: int, item, known: dict, now: float, source: str) -> _Candidate | PendingLabel | str:
        """The item joined with its prediction (or its own probabilities, checked later per model), the pending
        label it becomes without one, or why it is rejected."""
        if item.prediction_id is not None:
            row = known.get(item.prediction_id)
            if row is None:
                return self._pending(item, now, source)
            try:
                served = self.repository.get(row.model, row.version)
            except ModelNotFound:
                return f"model {row.model} version {row.version} is no longer served"
            label = _label_index(item.label, served)
            if isinstance(label, str):
                return label
            served_set = None
            if row.set_members is not None:  # a set logged before floor sets (randomized NULL) was the exact one
                randomized = True if row.set_randomized is None else bool(row.set_randomized)
                served_set = ServedSet(
                    row.set_members, row.set_coverage, row.set_method, randomized, row.set_probabilities
                )
            return _Candidate(
                index,
                served,
                row.calibration_version,
                row.id,
                row.probabilities,
                label,
                False,
                row.logits,
                source,
                served_set,
            )
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
        return _Candidate(index, served, calibration_version, "", item.probabilities, label, True, None, source)

    def _pending(self, item, now: float, source: str) -> PendingLabel | str:
        """The pending label of an item whose prediction is not stored, or why it can never join: an id this service
        cannot have made (``prediction_ids``), one past retention, a label of no served model."""
        prediction_id = item.prediction_id
        if not PREDICTION_ID.fullmatch(prediction_id):
            return f"unknown prediction id {prediction_id!r}: not a prediction id (32 hex digits)"
        made = id_time(prediction_id)
        if made > now + _CLOCK_SKEW:
            return f"unknown prediction id {prediction_id!r}: its time is in the future"
        if made < now - self.retention_seconds:
            return (
                f"unknown prediction id {prediction_id!r}: made {(now - made) / 86400:.0f} days ago, "
                "beyond the retention period"
            )
        models = self.repository.all()
        if not any(isinstance(_label_index(item.label, served), int) for served in models):
            return f"label {item.label!r} is not a class of any served model"
        return PendingLabel(prediction_id, json.dumps(item.label), now, source)

    def _label_rows(
        self, candidates: list[_Candidate], reasons: list, now: float
    ) -> tuple[dict[int, LabelRow], list[PredictionRow]]:
        """Label rows (by item index) and offline prediction rows, per model in a few array operations; offline rows
        that are not probability vectors get their reason."""
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
            else:  # online candidates hold their stored blob
                probs = decode_rows([cast(bytes, c.probs) for c in group])
            if not group:
                continue
            y = np.array([c.label for c in group])
            predicted = probs.argmax(axis=1)
            confidence = probs[np.arange(len(y)), predicted]
            bins = binning.bin_index(confidence, self.edges).tolist()
            nll, brier = metrics.nll_terms(probs, y).tolist(), metrics.brier_terms(probs, y).tolist()
            correct = (predicted == y).astype(int).tolist()
            predicted, confidence = predicted.tolist(), confidence.tolist()
            blobs = encode_rows(probs) if offline else [cast(bytes, c.probs) for c in group]
            scores = _set_scores(group, probs)
            for i, (c, blob) in enumerate(zip(group, blobs)):
                sets: tuple = (None,) * 6
                if c.served_set is not None:
                    members, set_coverage, set_method, randomized, _ = c.served_set
                    sets = (
                        int(covered(members, c.label)),
                        set_size(members),
                        set_coverage,
                        set_method,
                        randomized,
                        scores.get(i),
                    )
                label_rows[c.index] = LabelRow(
                    c.prediction_id,
                    c.served.name,
                    c.served.version,
                    c.calibration_version,
                    c.label,
                    correct[i],
                    confidence[i],
                    bins[i],
                    nll[i],
                    brier[i],
                    now,
                    blob,
                    c.logits,
                    c.source,
                    *sets,
                )
                if offline:
                    new_predictions.append(
                        PredictionRow(
                            c.prediction_id,
                            c.served.name,
                            c.served.version,
                            c.calibration_version,
                            now,
                            predicted[i],
                            confidence[i],
                            None,
                            blob,
                            None,
                            OFFLINE,
                        )
                    )
        return dict(sorted(label_rows.items())), new_predictions

    def _count(self, rows: list[LabelRow]) -> None:
        for r in rows:
            labels = (r.model, r.version, str(r.conf_bin))
            self.metrics.labeled.labels(*labels).inc()
            self.metrics.confidence_sum.labels(*labels).inc(r.confidence)
            self.metrics.correct.labels(*labels).inc(r.correct)


def _set_scores(group: list[_Candidate], probs: np.ndarray) -> dict[int, float]:
    """Each label's conformity score (by position in ``group``, one model version) under the rule of its served set,
    from that set's probabilities: what ``service.monitoring.coverage`` folds."""
    sets = group[0].served.sets
    by_rule: dict[tuple[str, bool], list[int]] = {}
    for i, c in enumerate(group):
        if c.served_set is not None and sets.available and c.served_set.method in sets.calibrators:
            by_rule.setdefault((c.served_set.method, c.served_set.randomized), []).append(i)
    out: dict[int, float] = {}
    for (method, randomized), rows in by_rule.items():
        own = [group[i].served_set.probabilities for i in rows]  # type: ignore[union-attr]
        p = (
            probs[rows]
            if all(b is None for b in own)
            else decode_rows([b or cast(bytes, group[i].probs) for i, b in zip(rows, own)])
        )
        labels = np.array([group[i].label for i in rows])
        scores = sets.label_scores(p, labels, [group[i].prediction_id for i in rows], method, randomized)
        out.update(zip(rows, scores.tolist()))
    return out


def _duplicate(prediction_id: str | None, labelled: set[str], pending: set[str]) -> str | None:
    """Why a label the store refused is a duplicate, if it is one."""
    if prediction_id in labelled:
        return ALREADY_LABELLED
    return ALREADY_PENDING if prediction_id in pending else None


def _label_index(label, served: ServedModel) -> int | str:
    """The class index of ``label`` (an index or a class name), or why it is not one."""
    classes = served.manifest.class_names
    if isinstance(label, bool):
        return f"label {label!r} is not a class of model {served.name}"
    if isinstance(label, str):
        return (
            classes.index(label)
            if label in classes
            else (f"label {label!r} is not a class of model {served.name} (classes: {', '.join(classes[:20])})")
        )
    if isinstance(label, int) and 0 <= label < len(classes):
        return label
    return f"label {label!r} is not a class index of model {served.name} (0..{len(classes) - 1})"
