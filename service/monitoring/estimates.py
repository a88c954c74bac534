"""What the served probabilities say before any label, over the drift window: the accuracy the confidences promise
(Kivimäki et al. 2024, ``calibkit.estimated_accuracy``), expected class counts and, with ``label_shift`` priors, the
class priors by EM (Saerens et al. 2002) and BBSE (Lipton et al. 2018). Seeds derive from the store.
"""

from __future__ import annotations

import threading
import zlib

import numpy as np

from calibkit.estimated_accuracy import IntervalChecks, accuracy_interval, estimate_accuracy
from calibkit.label_shift import adapt_probabilities, bbse_priors, em_priors
from service.metrics import ServiceMetrics
from service.serving.adaptation import Adaptation
from service.serving.repository import ServedModel
from service.settings import ShiftSettings
from service.store import Store
from service.store.rows import CalibrationKey, RecentPredictions

CACHE_SIZE = 16  # calibration keys whose last label-free estimate is held


class Estimates:
    def __init__(self, store: Store, metrics: ServiceMetrics, *, rows: int, settings: ShiftSettings):
        self.store = store
        self.metrics = metrics
        self.rows = rows
        self.settings = settings
        self._cache: dict[CalibrationKey, tuple[str | None, int, dict]] = {}
        self._intervals: dict[tuple, dict] = {}
        self._lock = threading.Lock()

    def block(self, served: ServedModel, key: CalibrationKey, checks: IntervalChecks) -> dict:
        """The ``drift.estimated`` block, with the interval's running record ``checks``."""
        recent = self.store.predictions.recent(key, self.rows)
        return (
            self._with_intervals(served, key, recent)
            | {"labelled": self._labelled(recent)}
            | {"adapted": self._adapted(key, recent)}
            | {
                "interval_checks": {
                    "labels_per_check": checks.block,
                    "windows": checks.windows,
                    "held": checks.held,
                    "held_rate": checks.held / checks.windows if checks.windows else None,
                    "level": checks.level,
                }
            }
        )

    def export(self, served: ServedModel, key: CalibrationKey) -> dict | None:
        """Set the estimate's gauges (at an evaluation pass); the window's ``priors`` entry, for adaptations."""
        name, version = served.name, served.version
        if self.settings.accuracy_floor is not None:
            self.metrics.accuracy_floor.labels(name, version).set(self.settings.accuracy_floor)
        found = self._unlabelled(served, key, self.store.predictions.recent(key, self.rows))
        accuracy = found["accuracy"]
        if accuracy is None:
            return None
        self.metrics.estimated_accuracy.labels(name, version).set(accuracy["estimate"])
        self.metrics.estimated_accuracy_low.labels(name, version).set(accuracy["lower"])
        self.metrics.estimated_accuracy_high.labels(name, version).set(accuracy["upper"])
        priors = found["priors"]
        if priors is not None:
            for class_name, value in priors["em"]["priors"].items():
                self.metrics.estimated_prior.labels(name, version, class_name).set(value)
            self.metrics.prior_shift.labels(name, version).set(priors["total_variation"])
        return priors

    def _with_intervals(self, served: ServedModel, key: CalibrationKey, recent: RecentPredictions) -> dict:
        """``_unlabelled`` with the EM priors' bootstrap interval (``prior_resamples`` EM runs, for reports)."""
        body = self._unlabelled(served, key, recent)
        reference = served.manifest.label_shift
        if body["priors"] is None or reference is None or not self.settings.prior_resamples:
            return body
        window = (key, recent.newest_id, len(recent.probs))
        with self._lock:
            found = self._intervals.get(window)
        if found is None:
            seed = zlib.crc32(f"{key.model}/{key.version}/{key.calibration_version}/{recent.newest_id}".encode())
            boot = em_priors(
                recent.probs,
                reference.priors,
                resamples=self.settings.prior_resamples,
                level=self.settings.interval_level,
                seed=seed,
            )
            names = served.manifest.class_names
            found = {
                "lower": dict(zip(names, boot.lower or (), strict=True)),
                "upper": dict(zip(names, boot.upper or (), strict=True)),
            }
            with self._lock:
                self._intervals[window] = found
                while len(self._intervals) > CACHE_SIZE:
                    self._intervals.pop(next(iter(self._intervals)))
        priors = body["priors"]
        return body | {"priors": priors | {"em": priors["em"] | found}}

    def _unlabelled(self, served: ServedModel, key: CalibrationKey, recent: RecentPredictions) -> dict:
        """The estimates that need no label, cached by the window's newest prediction and size."""
        n = len(recent.probs)
        with self._lock:
            found = self._cache.get(key)
        if found is not None and found[:2] == (recent.newest_id, n):
            return found[2]
        names = served.manifest.class_names
        level = self.settings.interval_level
        if n == 0:
            body: dict = {"n": 0, "level": level, "accuracy": None, "expected_counts": None, "priors": None}
        else:
            estimate = estimate_accuracy(recent.probs, level)
            body = {
                "n": n,
                "level": level,
                "accuracy": {"estimate": estimate.estimate, "lower": estimate.lower, "upper": estimate.upper},
                "expected_counts": dict(zip(names, estimate.expected_counts, strict=True)),
                "priors": self._priors(served, key, recent),
            }
        with self._lock:
            self._cache[key] = (recent.newest_id, n, body)
            while len(self._cache) > CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))
        return body

    def _priors(self, served: ServedModel, key: CalibrationKey, recent: RecentPredictions) -> dict | None:
        """EM and BBSE priors and the EM priors' total variation distance from the validation priors; None without
        the manifest's ``label_shift``."""
        reference = served.manifest.label_shift
        if reference is None:
            return None
        names = served.manifest.class_names
        em = em_priors(recent.probs, reference.priors)
        bbse = bbse_priors(recent.probs, reference.confusion, level=self.settings.interval_level)

        def by_class(values) -> dict | None:
            return None if values is None else dict(zip(names, values, strict=True))

        def entry(estimate) -> dict:
            return {
                "priors": by_class(estimate.priors),
                "lower": by_class(estimate.lower),
                "upper": by_class(estimate.upper),
                "weights": by_class(estimate.weights),
            }

        return {
            "version": f"em:{len(recent.probs)}:{recent.newest_id}",
            "reference": by_class(reference.priors),
            "reference_rows": reference.n_samples,
            "em": entry(em) | {"iterations": em.iterations, "converged": em.converged},
            "bbse": entry(bbse),
            "total_variation": 0.5 * float(np.abs(np.subtract(em.priors, reference.priors)).sum()),
        }

    def _adapted(self, key: CalibrationKey, recent: RecentPredictions) -> dict | None:
        """The window adapted to the served priors: the accuracy it promises and, where labelled, realizes (None
        without priors or predictions)."""
        row = self.store.shift_states.get(key)
        adaptation = Adaptation.from_json(row.priors if row else None, bool(row and row.alarmed))
        if adaptation is None or not len(recent.probs):
            return None
        probs = adapt_probabilities(recent.probs, adaptation.weights)
        estimate = estimate_accuracy(probs, self.settings.interval_level)
        labelled = recent.labelled
        return {
            "priors_version": adaptation.version,
            "accuracy": {"estimate": estimate.estimate, "lower": estimate.lower, "upper": estimate.upper},
            "labelled_realized_accuracy": float((probs[labelled].argmax(axis=1) == recent.label[labelled]).mean())
            if labelled.any()
            else None,
        }

    def _labelled(self, recent: RecentPredictions) -> dict | None:
        """The labelled predictions' realized accuracy and their confidences' interval (None without labels)."""
        labelled = recent.labelled
        m = int(labelled.sum())
        if m == 0:
            return None
        confidences = recent.probs[labelled].max(axis=1)
        lower, upper = accuracy_interval(confidences, self.settings.interval_level)
        realized = float(recent.correct[labelled].mean())
        return {
            "n": m,
            "realized_accuracy": realized,
            "estimate": float(confidences.mean()),
            "lower": lower,
            "upper": upper,
            "held": lower <= realized <= upper,
        }
