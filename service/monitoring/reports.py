"""What ``GET /calibration`` shows, from the store; bootstrap seeds derive from the data."""

from __future__ import annotations

import threading
import zlib
from dataclasses import KW_ONLY, dataclass

import numpy as np

from calibkit import binning, metrics
from calibkit.alarms import AlarmPolicy
from calibkit.drift import accuracy_gap, confidence_shift
from calibkit.plotting import figure_png, reliability_figure
from calibkit.significance import consistency_test, ece_interval
from calibkit.temperature import apply_temperature, fit_temperature
from service.metrics import ServiceMetrics
from service.monitoring.alarm import load_checks, load_detector, saved_status
from service.monitoring.calibrations import ActiveCalibrations
from service.monitoring.estimates import Estimates
from service.monitoring.windows import Window
from service.schemas import Refit, TimelinePoint, TimelineResponse
from service.serving.repository import ModelRepository, ServedModel
from service.store import Store
from service.store.labels import WindowSums
from service.store.rows import CalibrationKey, NewestRows

DETAIL_CACHE_SIZE = 64
NEWEST_CACHE_SIZE = 16  # calibration keys whose newest labelled rows are held
MIN_REFIT_LABELS = 50


@dataclass(eq=False)
class Reports:
    store: Store
    repository: ModelRepository
    metrics: ServiceMetrics
    calibrations: ActiveCalibrations
    _: KW_ONLY
    n_bins: int
    policy: AlarmPolicy
    alarm_window: Window
    detail_rows: int
    drift_rows: int
    n_resamples: int
    estimates: Estimates
    trusted: frozenset[str] | None = None

    def __post_init__(self) -> None:
        self.edges = binning.equal_width_edges(self.n_bins)
        self._detail_cache: dict[tuple, dict] = {}
        self._newest: dict[CalibrationKey, NewestRows] = {}
        self._lock = threading.Lock()

    def window(
        self, name: str | None, version: str | None, window: str | None
    ) -> tuple[ServedModel, Window, CalibrationKey, WindowSums]:
        """(model, window, calibration key in force, the window's sums)."""
        served = self.repository.get(name, version)
        win = Window.parse(window) if window is not None else self.alarm_window
        key = self.calibrations.key(served)
        return served, win, key, self._sums(key, win)

    def _sums(self, key: CalibrationKey, win: Window) -> WindowSums:
        return self.store.labels.window(key, self.n_bins, last=win.count, seconds=win.seconds)

    def report(self, name: str | None, version: str | None, window: str | None, by_source: bool = False) -> dict:
        """The body of GET /calibration (with the window per source when ``by_source``)."""
        served, win, key, sums = self.window(name, version, window)
        state_row = self.store.alarm_states.get(key)
        detector = load_detector(state_row.detector if state_row else None, self.policy)
        reference = served.manifest.reference
        body = {
            "model": served.name,
            "version": served.version,
            "calibration_version": key.calibration_version,
            "temperature": self.calibrations.active(served)[1],
            "window": win.to_dict(),
            "n": sums.n,
            "first_labelled_at": sums.first_labelled_at,
            "last_labelled_at": sums.last_labelled_at,
            "reference": {
                "split": reference.split,
                "n": len(reference.confidences),
                "ece": reference.ece,
                "accuracy": reference.accuracy,
                "mean_confidence": float(np.mean(reference.confidences)),
            },
            "alarm": saved_status(state_row).to_dict(),
            "e_detector": {
                "statistic": float(detector.statistic[0]),
                "threshold": self.policy.threshold,
                "clear_statistic": float(detector.clear_statistic[0]),
                "clear_threshold": self.policy.clear_threshold,
                "labels_seen": int(detector.n[0]),
                "tolerance": self.policy.tolerance,
                "regions": detector.regions(),
            }
            | self._evaluation(key, state_row),
            "thresholds": {
                "tolerance": self.policy.tolerance,
                "e_detector": self.policy.threshold,
                "clear": self.policy.clear_threshold,
                "warning": self.policy.warn_threshold,
                "min_labels": self.policy.min_labels,
            },
        }
        body.update(self._window_metrics(served, key, sums, win))
        body["drift"] = self._drift(served, key, sums) | {
            "estimated": self.estimates.block(
                served,
                key,
                load_checks(
                    state_row.estimate_checks if state_row else None,
                    self.estimates.settings.check_labels,
                    self.estimates.settings.interval_level,
                ),
            )
        }
        body["unmatched_labels"] = self.store.pending.counts()
        if by_source:
            body["by_source"] = self._by_source(key, win)
        return body

    def _evaluation(self, key: CalibrationKey, state_row) -> dict:
        """How far the alarm state lags the store: the labels committed since the evaluator's last pass."""
        folded_seq = int(state_row.last_seq) if state_row else 0
        stored, pending, folded_at = self.store.labels.progress(key, folded_seq)
        return {"labels_stored": stored, "labels_pending": pending, "newest_folded_labelled_at": folded_at}

    def export_window(self, served: ServedModel, key: CalibrationKey) -> None:
        """The default window's ECE and interval as gauges (dashboards), after new labels were folded."""
        sums = self._sums(key, self.alarm_window)
        self.metrics.window_labels.labels(served.name, served.version).set(sums.n)
        if sums.n:
            ci = ece_interval(sums.stats.sums, n_resamples=self.n_resamples, seed=_seed(key, sums.last_seq))
            self.metrics.window_ece.labels(served.name, served.version).set(ci.ece)
            self.metrics.window_ece_low.labels(served.name, served.version).set(ci.low)
            self.metrics.window_ece_high.labels(served.name, served.version).set(ci.high)

    def _window_metrics(self, served: ServedModel, key: CalibrationKey, sums: WindowSums, win: Window) -> dict:
        stats = sums.stats
        if sums.n == 0:
            empty = {
                k: None
                for k in (
                    "accuracy",
                    "mean_confidence",
                    "ece",
                    "ece_ci",
                    "ece_ci_level",
                    "mce",
                    "debiased_ece",
                    "adaptive_ece",
                    "classwise_ece",
                    "brier",
                    "nll",
                    "calibration_test_p_value",
                    "recalibration",
                )
            }
            return empty | {"bins": stats.reliability().to_records(), "detail_rows": 0}
        seed = _seed(key, sums.last_seq)
        ci = ece_interval(stats.sums, n_resamples=self.n_resamples, seed=seed)
        return {
            "accuracy": stats.accuracy(),
            "mean_confidence": stats.mean_confidence(),
            "ece": ci.ece,
            "ece_ci": [ci.low, ci.high],
            "ece_ci_level": ci.level,
            "mce": stats.mce(),
            "debiased_ece": stats.debiased_ece(),
            "brier": stats.brier(),
            "nll": stats.nll(),
            "calibration_test_p_value": consistency_test(stats.sums, n_resamples=self.n_resamples, seed=seed + 1),
            "bins": stats.reliability().to_records(),
        } | self._details(served, key, sums, win)

    def _details(self, served: ServedModel, key: CalibrationKey, sums: WindowSums, win: Window) -> dict:
        """AdaECE, classwise ECE and the refit on the window's ``detail_rows`` newest labels, cached by (key, last
        label, count), the same label set for count and time windows alike."""
        cache_key = (key, sums.last_seq, sums.n)
        with self._lock:
            found = self._detail_cache.get(cache_key)
        if found is not None:
            return found
        y, probs, logits = self.window_rows(key, win, sums.n)
        refit = self.refit(*((y, probs, logits) if self.trusted is None else self.refit_rows(key, win, sums.n)))
        found = {
            "adaptive_ece": metrics.adaptive_ece(probs, y, self.n_bins),
            "classwise_ece": metrics.classwise_ece(probs, y, self.n_bins),
            "detail_rows": len(y),
            "recalibration": refit,
        }
        with self._lock:
            self._detail_cache[cache_key] = found
            while len(self._detail_cache) > DETAIL_CACHE_SIZE:
                self._detail_cache.pop(next(iter(self._detail_cache)))
        return found

    def window_rows(self, key: CalibrationKey, win: Window, n: int):
        """(labels, calibrated probabilities, logits or None) of the window's ``min(detail_rows, n)`` newest labels."""
        if win.seconds is None:
            rows = self._newest_rows(key)
        else:
            rows, _ = self.store.labels.newest(key, self.detail_rows, seconds=win.seconds)
        rows = rows.head(min(self.detail_rows, n))
        return rows.y, rows.probs, None if np.isnan(rows.logits).any() else rows.logits

    def refit_rows(self, key: CalibrationKey, win: Window, n: int):
        """The rows a refit uses: ``window_rows``, or those of the trusted sources when they are set."""
        if self.trusted is None:
            return self.window_rows(key, win, n)
        rows, _ = self.store.labels.newest(key, min(self.detail_rows, n), seconds=win.seconds, sources=self.trusted)
        return rows.y, rows.probs, None if np.isnan(rows.logits).any() else rows.logits

    def _by_source(self, key: CalibrationKey, win: Window) -> dict:
        """The window's labels per source, and whether they count for the alarm and the refit."""
        found = self.store.labels.by_source(key, self.n_bins, last=win.count, seconds=win.seconds)
        return {
            source: {
                "n": stats.n,
                "accuracy": stats.accuracy(),
                "mean_confidence": stats.mean_confidence(),
                "ece": stats.ece(),
                "trusted": self.trusted is None or source in self.trusted,
            }
            for source, stats in sorted(found.items())
        }

    def _newest_rows(self, key: CalibrationKey) -> NewestRows:
        """The ``detail_rows`` newest labelled rows, kept in memory: only newer labels are read, and the rows are
        refetched whole when the store no longer has exactly them (retention, a label committed late)."""
        with self._lock:
            held = self._newest.get(key)
        limit = self.detail_rows
        if held is None or not len(held.seq):
            rows, _ = self.store.labels.newest(key, limit)
        else:
            new, count = self.store.labels.newest(key, limit, after_seq=int(held.seq[0]), count_from=int(held.seq[-1]))
            if len(new.seq) < limit and count != len(held.seq) + len(new.seq):
                rows, _ = self.store.labels.newest(key, limit)
            else:
                rows = new.then(held, limit)
        with self._lock:
            self._newest[key] = rows
            while len(self._newest) > NEWEST_CACHE_SIZE:
                self._newest.pop(next(iter(self._newest)))
        return rows

    def refit(self, y, probs, logits) -> Refit | None:
        """The temperature refitted on the window's labelled logits and what it would do (in-sample)."""
        if logits is None or len(y) < MIN_REFIT_LABELS:
            return None
        t = fit_temperature(logits, y)
        refit = apply_temperature(logits, t)
        return Refit(
            temperature=t,
            n=len(y),
            ece_current=metrics.ece(probs, y, self.n_bins),
            ece_after=metrics.ece(refit, y, self.n_bins),
            nll_current=metrics.nll(probs, y),
            nll_after=metrics.nll(refit, y),
        )

    def _drift(self, served: ServedModel, key: CalibrationKey, sums: WindowSums) -> dict:
        recent = self.store.predictions.recent_confidences(key, self.drift_rows)
        out: dict[str, float] = {"recent_predictions": len(recent)}
        if len(recent):
            shift = confidence_shift(recent, served.manifest.reference.confidences)
            out.update(
                {
                    "ks_statistic": shift.statistic,
                    "ks_p_value": shift.p_value,
                    "recent_mean_confidence": shift.recent_mean,
                    "reference_mean_confidence": shift.reference_mean,
                    "estimated_accuracy": shift.recent_mean,
                }
            )
        if sums.n:
            gap = accuracy_gap(sums.n, sums.stats.confidence_sum.sum(), sums.stats.correct_sum.sum())
            out.update({"observed_accuracy": gap.observed, "expected_accuracy": gap.expected, "accuracy_gap_z": gap.z})
        return out

    def timeline(self, name: str | None, version: str | None, window: int, step: int, points: int) -> TimelineResponse:
        """Rolling ECE: of the last ``window`` labels after every ``step`` labels, for the ``points`` newest steps."""
        served = self.repository.get(name, version)
        key = self.calibrations.key(served)
        rows = self.store.labels.recent(key, window + step * points)
        out = []
        if rows:
            conf = np.array([r.confidence for r in rows])
            correct = np.array([r.correct for r in rows], dtype=np.float64)
            for end in range(len(rows), 0, -step):
                start = max(0, end - window)
                sums = binning.bin_sums(conf[start:end], correct[start:end], self.edges)
                ci = ece_interval(sums, n_resamples=200, seed=int(rows[end - 1].seq))
                out.append(
                    TimelinePoint(
                        seq=int(rows[end - 1].seq),
                        labelled_at=float(rows[end - 1].labelled_at),
                        n=end - start,
                        ece=ci.ece,
                        ece_ci=[ci.low, ci.high],
                    )
                )
                if len(out) == points:
                    break
        return TimelineResponse(
            model=served.name,
            version=served.version,
            calibration_version=key.calibration_version,
            window=window,
            step=step,
            points=out[::-1],
        )

    def reliability_png(self, name: str | None, version: str | None, window: str | None) -> bytes:
        """The window's reliability diagram with confidence histogram, as PNG."""
        served, win, key, sums = self.window(name, version, window)
        title = f"{served.name} v{served.version} (calibration {key.calibration_version}), window {win.spec}"
        return figure_png(reliability_figure({"live traffic": sums.stats.reliability()}, title=title))


def _seed(key: CalibrationKey, last_seq: int) -> int:
    """A bootstrap seed from the data (every replica draws the same resamples)."""
    return zlib.crc32(f"{key.model}/{key.version}/{key.calibration_version}/{last_seq}".encode())
