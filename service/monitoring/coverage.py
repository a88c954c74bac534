"""The coverage of served prediction sets from labels: per set choice of a model version, the adaptive threshold, the
anytime-valid coverage alarm and the coverage report, folded in label order under the version's state row lock
(``service.store.coverage``), so every replica and restart derives the same states.

- **Adaptive threshold**: the quantile tracker of conformal PID control (Angelopoulos, Candès & Tibshirani 2023) on a
  log scale (``calibkit.conformal.adaptive.LogQuantileTracker``), bound (U + eta) / (eta T) on its long-run misses.
- **Coverage alarm**: the mixture of e-CUSUM detectors (``calibkit.coverage_alarm``) on misses at the *static*
  threshold; P(a false alarm within n labels) <= n / A + 0.01 (Shin, Ramdas & Rinaldo 2023). Clears, then re-arms.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import KW_ONLY, dataclass, replace

import numpy as np
import scipy  # its submodules load on first use (scipy.stats): serving starts without them

from calibkit.conformal.adaptive import DEFAULT_STEP, LogQuantileTracker, misses_of
from calibkit.coverage_alarm import CoverageAlarmConfig, CoverageAlarmState, calibration_tolerance
from service.metrics import ServiceMetrics
from service.monitoring.windows import Window
from service.serving.repository import ModelRepository, ServedModel
from service.store import Store

log = logging.getLogger("service.monitoring")


def choice_key(method: str, coverage: float, randomized: bool) -> str:
    """The state's key of a set choice (the coverage as Python writes it, exact)."""
    return f"{method}@{coverage!r}" + ("/exact" if randomized else "")


@dataclass(frozen=True)
class ChoiceState:
    """One set choice's adaptive threshold, alarm, when it was raised (None: not), and the labels its sets missed."""

    method: str
    coverage: float
    randomized: bool
    adaptive: LogQuantileTracker
    alarm: CoverageAlarmState
    since: float | None = None
    labels: int = 0
    missed: int = 0

    def to_dict(self) -> dict:
        return vars(self) | {"adaptive": self.adaptive.to_dict(), "alarm": self.alarm.to_dict()}


@dataclass(eq=False)
class CoverageMonitor:
    store: Store
    repository: ModelRepository
    metrics: ServiceMetrics
    _: KW_ONLY
    adaptation: str
    step: float | None  # None: ``DEFAULT_STEP``
    alarm_threshold: float
    trusted: frozenset[str] | None = None

    @property
    def adaptive(self) -> bool:
        return self.adaptation != "off"

    def fresh(self, served: ServedModel, method: str, coverage: float, randomized: bool) -> ChoiceState:
        """A choice's state before any label: the adaptive threshold at the static quantile, the alarm armed at the
        static sets' miss rate its calibration split allows."""
        calibrator = served.sets.calibrator(method, randomized)
        alpha = 1.0 - coverage
        adaptive = LogQuantileTracker.started(calibrator, alpha, DEFAULT_STEP if self.step is None else self.step)
        null = min(alpha + calibration_tolerance(len(calibrator.scores), alpha), (1.0 + alpha) / 2.0)
        config = CoverageAlarmConfig(alpha=null, threshold=self.alarm_threshold)
        return ChoiceState(method, coverage, randomized, adaptive, CoverageAlarmState.fresh(config))

    @staticmethod
    def served_choice(served: ServedModel, method: str, coverage: float) -> bool:
        """Whether the version keeps state for this method and level: one it has, at a level it serves."""
        return method in served.sets.calibrators and coverage in served.sets.levels

    def decode(self, served: ServedModel, saved: str) -> dict[str, ChoiceState]:
        """The states saved as JSON; one saved under other settings starts afresh, one not served is dropped."""
        states = {}
        for key, data in json.loads(saved).items():
            randomized = data.get("randomized")
            if not isinstance(randomized, bool) or not self.served_choice(served, data["method"], data["coverage"]):
                continue
            fresh = self.fresh(served, data["method"], data["coverage"], randomized)
            try:
                adaptive = LogQuantileTracker.from_dict(data["adaptive"])
            except ValueError:  # another rule or format
                adaptive = None
            if adaptive is None or _settings(adaptive) != _settings(fresh.adaptive):
                states[key] = fresh
                continue
            # an alarm saved under other settings restarts (``CoverageAlarmState.from_dict``)
            alarm = CoverageAlarmState.from_dict(data["alarm"], fresh.alarm.config)
            since = data.get("since") if alarm.labels == data["alarm"].get("labels") else None
            states[key] = ChoiceState(
                fresh.method, fresh.coverage, randomized, adaptive, alarm, since, data["labels"], data["missed"]
            )
        return states

    def assess(self, served: ServedModel) -> list[dict]:
        """Fold the version's new labels into its states under the row lock and publish them; the alarm transitions."""
        if not served.sets.available:
            return []
        transitions: list[dict] = []
        with self.store.coverage.locked(served.name, served.version) as state:
            states = self.decode(served, state.row.states)
            new = self.store.coverage.labels_after(
                served.name, served.version, state.row.last_seq, state.connection, self.trusted
            )
            groups: dict[str, tuple[list[float], list[int]]] = {}
            for row in new:
                # labels of a level the version does not serve, or from before scores were kept, fold nowhere
                if row.set_score is None or not self.served_choice(served, row.set_method, row.set_coverage):
                    continue
                key = choice_key(row.set_method, row.set_coverage, _randomized(row))
                if key not in states:
                    states[key] = self.fresh(served, row.set_method, row.set_coverage, _randomized(row))
                scores, covered = groups.setdefault(key, ([], []))
                scores.append(row.set_score)
                covered.append(int(row.covered))
            now = time.time()
            for key, (scores, covered) in groups.items():
                static = self._static(served, states[key])
                states[key], transition = _fold(states[key], scores, covered, static, now)
                if transition is not None:
                    transitions.append({"model": served.name, "version": served.version} | transition)
            if new:
                state.update(last_seq=new[-1].seq, states=json.dumps({k: v.to_dict() for k, v in states.items()}))
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
            served.sets.adapt({(s.method, s.coverage, s.randomized): s.adaptive for s in states.values()})
        for s in states.values():
            labels = (served.name, served.version, s.method, f"{s.coverage:g}", str(s.randomized).lower())
            self.metrics.coverage_alarm.labels(*labels).set(1 if s.since is not None else 0)
            self.metrics.coverage_statistic.labels(*labels).set(float(s.alarm.statistic[0]))
            self.metrics.coverage_threshold.labels(*labels).set(self._served_threshold(served, s))
            if s.labels:
                self.metrics.coverage_observed.labels(*labels).set(1 - s.missed / s.labels)

    def report(self, served: ServedModel, window: Window) -> dict:
        """The coverage block of GET /calibration: per set choice, the window's observed coverage (Wilson interval),
        mean set size, coverage per class and by set size, the adaptive threshold against the static one, the alarm."""
        if not served.sets.available:
            return {"available": False, "reason": served.sets.reason, "choices": []}
        rows = self.store.coverage.window(served.name, served.version, window.count, window.seconds)
        saved = self.store.coverage.get(served.name, served.version)
        states = self.decode(served, saved.states) if saved else {}
        classes = served.manifest.class_names
        groups: dict[str, list] = {}
        for r in rows:
            groups.setdefault(choice_key(r.set_method, r.set_coverage, _randomized(r)), []).append(r)
        choices = []
        for key in sorted(set(groups) | set(states)):
            state = states.get(key)
            group = groups.get(key, [])
            if state is not None:
                method, coverage, randomized = state.method, state.coverage, state.randomized
            else:
                method, coverage, randomized = group[0].set_method, group[0].set_coverage, _randomized(group[0])
            threshold = self._threshold(served, state) if state is not None else _UNTRACKED
            choices.append(
                {"method": method, "coverage": coverage, "randomized": randomized}
                | _observed(group, coverage, classes)
                | threshold
            )
        return {
            "available": True,
            "adaptation": self.adaptation,
            "alarm_threshold": self.alarm_threshold,
            "choices": choices,
        }

    @staticmethod
    def _static(served: ServedModel, state: ChoiceState) -> float:
        """The static split-conformal threshold of a choice."""
        return float(served.sets.calibrator(state.method, state.randomized).quantile(1.0 - state.coverage))

    def _served_threshold(self, served: ServedModel, state: ChoiceState) -> float:
        """The threshold the choice's sets are served at: the adapted one when adaptation is on, else the static."""
        return state.adaptive.threshold() if self.adaptive else self._static(served, state)

    def _threshold(self, served: ServedModel, state: ChoiceState) -> dict:
        folded = state.adaptive.labels if self.adaptive else 0
        return {
            "static_threshold": _finite(self._static(served, state)),
            "threshold": _finite(self._served_threshold(served, state)),
            "labels_folded": state.adaptive.labels,
            "threshold_version": served.sets.version(folded),
            "long_run_bound": _finite(state.adaptive.bound),
            "alarm": {
                "state": "alarm" if state.since is not None else "ok",
                "since": state.since,
                "statistic": float(state.alarm.statistic[0]),
                "null_miss_rate": state.alarm.config.alpha,
            },
        }


#: The threshold part of a choice with labels but no state (no longer served, or before scores were kept).
_UNTRACKED = {
    "static_threshold": None,
    "threshold": None,
    "labels_folded": 0,
    "threshold_version": None,
    "long_run_bound": None,
    "alarm": {"state": "ok", "since": None, "statistic": 1.0, "null_miss_rate": None},
}


def _settings(tracker: LogQuantileTracker) -> tuple:
    """What a saved tracker must share with a fresh one to be carried on."""
    return tracker.alpha, tracker.eta, tracker.span, tracker.score_range, tracker.release


def _randomized(row) -> bool:
    """Whether a label's set was the exact one (NULL: labelled before floor sets, when every set was)."""
    return True if row.set_randomized is None else bool(row.set_randomized)


def _fold(
    state: ChoiceState, scores: list[float], covered: list[int], static: float, now: float
) -> tuple[ChoiceState, dict | None]:
    """The state after labels with these scores (and whether their served sets held them), and the alarm's
    transition if any; a raised alarm whose mixture is back below 1 clears and re-arms."""
    alarm = state.alarm.fold(misses_of(scores, static))
    since, transition = state.since, None
    if alarm.alarmed[0] and since is None:
        since, transition = now, "alarm"
    if alarm.alarmed[0] and float(alarm.log_mixture[0]) < 0:
        alarm = CoverageAlarmState(alarm.config, alarm.log_statistic, alarm.labels, np.full(1, -1))
        since, transition = None, None if transition == "alarm" else "ok"
    missed = state.missed + len(covered) - sum(covered)
    adaptive = state.adaptive.fold(scores)
    folded = replace(
        state, adaptive=adaptive, alarm=alarm, since=since, labels=state.labels + len(covered), missed=missed
    )
    if transition is None:
        return folded, None
    return folded, {
        "event": "coverage_alarm_transition",
        "choice": choice_key(state.method, state.coverage, state.randomized),
        "method": state.method,
        "coverage": state.coverage,
        "randomized": state.randomized,
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
    ci = scipy.stats.binomtest(int(covered.sum()), n).proportion_ci(0.95, method="wilson")
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
