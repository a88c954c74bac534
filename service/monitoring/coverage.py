"""The coverage of served prediction sets, from labels: per set choice (method and coverage) of a model version,
the adaptive threshold and the anytime-valid "coverage below target" alarm, and the coverage report.

Both states are folded from the stored labels in label order under the version's state row lock
(``service.store.coverage``), so every replica and every restart derives the same states bit for bit, as the
calibration alarm's are. A label counts as a miss when the set served with its prediction did not hold it.

- **Adaptive threshold** (``adaptation``): the quantile tracker of conformal PID control (Angelopoulos, Candès &
  Tibshirani 2023) moves the threshold by eta (err_t - alpha) per label, on the log scale of the score's distance
  to the top of its range (``log-quantile``, the default) or on the score scale (``quantile``); adaptive conformal
  inference (Gibbs & Candès 2021) moves the level alpha_t of the static quantile by gamma (alpha - err_t). Each
  keeps the long-run miss rate of the served sets within a deterministic bound of alpha over T labels, (U + eta) /
  (eta T) for the log scale truncated at U, (B + eta) / (eta T) for scores in [0, B] and (max(alpha, 1 - alpha) +
  gamma) / (gamma T), for every sequence of labels, shift or not (``calibkit.adaptive_conformal``, whose
  benchmark chose the log-scale tracker). Off, sets use the static threshold, whose guarantee needs serving data
  exchangeable with the calibration split.
- **Coverage alarm**: the mixture of e-CUSUM detectors of ``calibkit.coverage_alarm``: while the served sets cover
  at least their target, P(a false alarm within n labels) <= n / A (Shin, Ramdas & Rinaldo 2023). A raised alarm
  clears once its evidence is spent (the mixture back below 1), and re-arms.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass

import numpy as np
from scipy.stats import binomtest

from calibkit.adaptive_conformal import (
    DEFAULT_METHOD,
    ACIState,
    LogQuantileTracker,
    QuantileTracker,
    score_range,
    start,
)
from calibkit.coverage_alarm import CoverageAlarmConfig, CoverageAlarmState
from service.metrics import ServiceMetrics
from service.monitoring.windows import Window
from service.serving.repository import ModelRepository, ServedModel
from service.store import Store

log = logging.getLogger("service.monitoring")


def choice_key(method: str, coverage: float) -> str:
    """The state's key of a set choice (the coverage as Python writes it, exact)."""
    return f"{method}@{coverage!r}"


Adaptive = ACIState | QuantileTracker | LogQuantileTracker


@dataclass(frozen=True)
class ChoiceState:
    """One set choice's adaptive threshold, alarm and the time the alarm was raised (None: not raised)."""

    method: str
    coverage: float
    adaptive: Adaptive
    alarm: CoverageAlarmState
    since: float | None = None

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "coverage": self.coverage,
            "adaptive": self.adaptive.to_dict(),
            "alarm": self.alarm.to_dict(),
            "since": self.since,
        }


class CoverageMonitor:
    def __init__(
        self,
        store: Store,
        repository: ModelRepository,
        metrics: ServiceMetrics,
        *,
        adaptation: str,
        step: float | None,
        alarm_threshold: float,
        trusted: frozenset[str] | None = None,
    ):
        self.store = store
        self.repository = repository
        self.metrics = metrics
        self.adaptation = adaptation
        self.step = step
        self.alarm_threshold = alarm_threshold
        self.trusted = trusted

    @property
    def adaptive(self) -> bool:
        return self.adaptation != "off"

    def fresh(self, served: ServedModel, method: str, coverage: float) -> ChoiceState:
        """A choice's state before any label: the adaptive threshold at the static quantile, the alarm armed."""
        alpha = 1.0 - coverage
        rule = self.adaptation if self.adaptive else DEFAULT_METHOD
        adaptive = start(served.sets.calibrators[method], alpha, rule, self.step)
        config = CoverageAlarmConfig(alpha=alpha, threshold=self.alarm_threshold)
        return ChoiceState(method, coverage, adaptive, CoverageAlarmState.fresh(config))

    def decode(self, served: ServedModel, saved: str) -> dict[str, ChoiceState]:
        """The states saved as JSON; a choice saved under other settings (rule, step, alarm threshold) or for a
        method the version no longer has starts afresh."""
        states = {}
        for key, data in json.loads(saved).items():
            if data["method"] not in served.sets.calibrators:
                continue
            fresh = self.fresh(served, data["method"], data["coverage"])
            kind = type(fresh.adaptive)
            adaptive = (
                kind.from_dict(data["adaptive"])
                if data["adaptive"].get("method") == fresh.adaptive.to_dict()["method"]
                else None
            )
            if adaptive is None or _step(adaptive) != _step(fresh.adaptive):
                states[key] = fresh
                continue
            # an alarm saved under other settings restarts (``CoverageAlarmState.from_dict``)
            alarm = CoverageAlarmState.from_dict(data["alarm"], fresh.alarm.config)
            since = data.get("since") if alarm.labels == data["alarm"].get("labels") else None
            states[key] = ChoiceState(fresh.method, fresh.coverage, adaptive, alarm, since)
        return states

    def assess(self, served: ServedModel) -> list[dict]:
        """Fold the version's new labels into its states under the row lock, publish them to the served model
        and the metrics; the alarm transitions (raised or cleared)."""
        if not served.sets.available:
            return []
        transitions: list[dict] = []
        with self.store.coverage.locked(served.name, served.version) as state:
            states = self.decode(served, state.row.states)
            new = self.store.coverage.labels_after(
                served.name, served.version, state.row.last_seq, state.connection, self.trusted
            )
            groups: dict[str, list[int]] = {}
            for row in new:
                key = choice_key(row.set_method, row.set_coverage)
                if key not in states:
                    states[key] = self.fresh(served, row.set_method, row.set_coverage)
                groups.setdefault(key, []).append(1 - int(row.covered))
            now = time.time()
            for key, misses in groups.items():
                states[key], transition = _fold(states[key], misses, now)
                if transition is not None:
                    transitions.append({"model": served.name, "version": served.version} | transition)
            if new:
                state.save(new[-1].seq, json.dumps({k: v.to_dict() for k, v in states.items()}))
        self.publish(served, states)
        for t in transitions:
            log.warning("coverage of %s version %s, %s: %s", t["model"], t["version"], t["choice"], t["to"])
        return transitions

    def load(self) -> None:
        """Publish every stored state to the served models (at start, and what other replicas folded)."""
        for row in self.store.coverage.all():
            if row.version in self.repository.models.get(row.model, {}):
                served = self.repository.get(row.model, row.version)
                if served.sets.available:
                    self.publish(served, self.decode(served, row.states))

    def publish(self, served: ServedModel, states: dict[str, ChoiceState]) -> None:
        """Serve the adapted levels (when adaptive) and set the coverage gauges."""
        if self.adaptive:
            served.sets.adapt({(s.method, s.coverage): s.adaptive for s in states.values()})
        for s in states.values():
            labels = (served.name, served.version, s.method, f"{s.coverage:g}")
            _, served_threshold = self._thresholds(served, s.method, s.coverage, s)
            self.metrics.coverage_alarm.labels(*labels).set(1 if s.since is not None else 0)
            self.metrics.coverage_statistic.labels(*labels).set(float(s.alarm.statistic[0]))
            self.metrics.coverage_threshold.labels(*labels).set(served_threshold)
            if s.adaptive.labels:
                self.metrics.coverage_observed.labels(*labels).set(1 - s.adaptive.misses / s.adaptive.labels)

    def report(self, served: ServedModel, window: Window) -> dict:
        """The coverage block of GET /calibration: per set choice served, over the window's labels, the observed
        coverage with its Wilson interval, the mean set size, coverage per class and by set size; and the
        adaptive threshold against the static one, and the alarm."""
        if not served.sets.available:
            return {"available": False, "reason": served.sets.reason, "choices": []}
        rows = self.store.coverage.window(served.name, served.version, window.count, window.seconds)
        saved = self.store.coverage.get(served.name, served.version)
        states = self.decode(served, saved.states) if saved else {}
        classes = served.manifest.class_names
        groups: dict[str, list] = {}
        for r in rows:
            groups.setdefault(choice_key(r.set_method, r.set_coverage), []).append(r)
        choices = []
        for key in sorted(set(groups) | set(states)):
            state = states.get(key)
            group = groups.get(key, [])
            method, coverage = (state.method, state.coverage) if state else (group[0].set_method, group[0].set_coverage)
            choices.append(
                {"method": method, "coverage": coverage}
                | _observed(group, coverage, classes)
                | self._threshold(served, method, coverage, state)
            )
        return {
            "available": True,
            "adaptation": self.adaptation,
            "alarm_threshold": self.alarm_threshold,
            "choices": choices,
        }

    def _thresholds(
        self, served: ServedModel, method: str, coverage: float, state: ChoiceState | None
    ) -> tuple[float, float]:
        """(static, served) thresholds of a set choice: the split-conformal quantile, and the adapted one when
        adaptation is on and the choice has a state."""
        calibrator = served.sets.calibrators[method]
        static = float(calibrator.quantile(1 - coverage))
        if state is None or not self.adaptive:
            return static, static
        return static, state.adaptive.threshold(calibrator)

    def _threshold(self, served: ServedModel, method: str, coverage: float, state: ChoiceState | None) -> dict:
        calibrator = served.sets.calibrators[method]
        static, threshold = self._thresholds(served, method, coverage, state)
        adaptive = state.adaptive if state is not None else None
        folded = adaptive.labels if adaptive is not None and self.adaptive else 0
        return {
            "static_threshold": _finite(static),
            "threshold": _finite(threshold),
            "labels_folded": adaptive.labels if adaptive is not None else 0,
            "threshold_version": served.sets.version(folded),
            "long_run_bound": _finite(_bound(adaptive, calibrator)) if adaptive is not None else None,
            "alarm": {
                "state": "alarm" if state is not None and state.since is not None else "ok",
                "since": state.since if state is not None else None,
                "statistic": float(state.alarm.statistic[0]) if state is not None else 1.0,
            },
        }


def _step(adaptive: Adaptive) -> float:
    return adaptive.gamma if isinstance(adaptive, ACIState) else adaptive.eta


def _bound(adaptive: Adaptive, calibrator) -> float:
    """The deterministic bound on |misses / labels - alpha| so far: for the tracker, with B the largest score the
    method can give (1 for LAC and APS, 1 + lambda (K - k_reg) for RAPS); the log-scale tracker's does not depend
    on B."""
    if isinstance(adaptive, (ACIState, LogQuantileTracker)):
        return adaptive.bound
    return adaptive.bound(score_range(calibrator))


def _fold(state: ChoiceState, misses: list[int], now: float) -> tuple[ChoiceState, dict | None]:
    """The state after the misses, and the alarm's transition if it changed; a raised alarm whose mixture is
    back below 1 (its evidence spent) clears and re-arms."""
    alarm = state.alarm.fold(misses)
    since, transition = state.since, None
    if alarm.alarmed[0] and since is None:
        since, transition = now, "alarm"
    if alarm.alarmed[0] and float(alarm.log_mixture[0]) < 0:
        alarm = CoverageAlarmState(alarm.config, alarm.log_statistic, alarm.labels, np.full(1, -1))
        since, transition = None, None if transition == "alarm" else "ok"
    folded = ChoiceState(state.method, state.coverage, state.adaptive.fold(misses), alarm, since)
    if transition is None:
        return folded, None
    return folded, {
        "event": "coverage_alarm_transition",
        "choice": choice_key(state.method, state.coverage),
        "method": state.method,
        "coverage": state.coverage,
        "from": "ok" if transition == "alarm" else "alarm",
        "to": transition,
        "since": since,
    }


def _observed(rows: list, coverage: float, classes: list[str]) -> dict:
    """Coverage over the window's rows of one choice: overall (Wilson 95% interval), per class, by set size."""
    n = len(rows)
    if not n:
        return {"n": 0, "observed": None, "interval": None, "mean_set_size": None, "by_class": [], "by_set_size": []}
    covered = np.array([r.covered for r in rows])
    sizes = np.array([r.set_size for r in rows])
    labels = np.array([r.label for r in rows])
    ci = binomtest(int(covered.sum()), n).proportion_ci(0.95, method="wilson")
    low, high = float(ci.low), float(ci.high)
    by_class = [
        {"label": classes[k], "n": int(m.sum()), "observed": float(covered[m].mean())}
        for k in range(len(classes))
        if (m := labels == k).any()
    ]
    by_size = [
        {"set_size": int(s), "n": int(m.sum()), "observed": float(covered[m].mean())}
        for s in np.unique(sizes)
        if (m := sizes == s).any()
    ]
    return {
        "n": n,
        "observed": float(covered.mean()),
        "interval": [low, high],
        "below_target": bool(high < coverage),
        "mean_set_size": float(sizes.mean()),
        "by_class": by_class,
        "by_set_size": by_size,
    }


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
