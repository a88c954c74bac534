"""Alarm evaluation off the request path.

A background task calls ``Monitor.assess`` for every served model version every
``evaluate_seconds``, and at once when this replica has stored ``evaluate_every_labels`` new labels
since the last pass. The periodic pass also folds in labels committed by other replicas sharing the
store (an update without new labels is cheap). Transitions go to the webhook. A store outage is
logged once, retried with backoff, and never ends the task.

The prediction sets' states (``service.monitoring.coverage``) are cheap to fold and their threshold is served,
so a second task (``SetsFolder``) folds them as soon as labels are stored, at most once per
``evaluate_sets_seconds``: the labels a threshold lags behind are those of the label delay, not of a full
pass's interval.
"""

from __future__ import annotations

import asyncio
import logging
import time

import anyio

from service.background import BackgroundLoop
from service.errors import StorageUnavailable
from service.metrics import ServiceMetrics
from service.monitoring import Monitor
from service.monitoring.webhook import AlarmWebhook

log = logging.getLogger("service.monitoring.evaluator")

MAX_BACKOFF_SECONDS = 5.0


class Evaluator(BackgroundLoop):
    name = "evaluator"

    def __init__(
        self,
        monitor: Monitor,
        metrics: ServiceMetrics,
        webhook: AlarmWebhook,
        *,
        every_labels: int,
        seconds: float,
        sets_seconds: float = 0.1,
    ):
        self.monitor = monitor
        self.metrics = metrics
        self.webhook = webhook
        self.every_labels = every_labels
        self.seconds = seconds
        self._new_labels = 0
        self._lock = asyncio.Lock()
        self._down = False
        self.sets = SetsFolder(monitor, webhook, sets_seconds)
        super().__init__()

    def start(self) -> None:
        super().start()
        self.sets.start()

    async def stop(self) -> None:
        await self.sets.stop()
        await super().stop()

    def labels_arrived(self, n: int) -> None:
        """Count labels this replica stored; enough of them start a pass now, and any fold into the sets' states."""
        self._new_labels += n
        if self._new_labels >= self.every_labels:
            self._wakeup.set()
        self.sets.wake()

    async def run_once(self) -> list[dict]:
        """One pass over every served model version now (after the pass under way, if any); returns
        the transitions, which are also sent to the webhook. Raises ``StorageUnavailable`` after
        notifying the transitions of the versions evaluated before the store failed."""
        async with self._lock:
            self._new_labels = 0
            start = time.perf_counter()
            transitions, error = await anyio.to_thread.run_sync(self._evaluate_all)
            self.metrics.evaluation.observe(time.perf_counter() - start)
        for transition in transitions:
            self.webhook.notify(transition)
        if error is not None:
            raise error
        return transitions

    def _evaluate_all(self) -> tuple[list[dict], StorageUnavailable | None]:
        """Update every served model version (in a worker thread); stops at the first store failure."""
        transitions: list[dict] = []
        for served in self.monitor.repository.all():
            try:
                _, transition = self.monitor.assess(served.name, served.version)
            except StorageUnavailable as exc:
                return transitions, exc
            except Exception:  # one version's failure must not stop the others' evaluation
                log.exception("evaluation of %s version %s failed", served.name, served.version)
                continue
            if transition is not None:
                transitions.append(transition)
            try:
                transitions += self.monitor.coverage.assess(served)
            except StorageUnavailable as exc:
                return transitions, exc
            except Exception:  # the sets' coverage must not stop the calibration's evaluation
                log.exception("coverage evaluation of %s version %s failed", served.name, served.version)
            try:
                shift = self.monitor.assess_shift(served.name, served.version)
            except StorageUnavailable as exc:
                return transitions, exc
            except Exception:  # nor the label-shift alarm's
                log.exception("label-shift evaluation of %s version %s failed", served.name, served.version)
                continue
            if shift is not None:
                transitions.append(shift)
        return transitions, None

    async def _loop(self) -> None:
        wait = self.seconds
        while self._running:
            await self._wait(wait)
            if not self._running:
                return
            try:
                await self.run_once()
            except StorageUnavailable as exc:
                if not self._down:
                    log.error("alarm evaluation paused: %s", exc.message)
                self._down = True
                wait = max(self.seconds, min(wait * 2, MAX_BACKOFF_SECONDS))
                continue
            except Exception:
                log.exception("alarm evaluation pass failed")
            if self._down:
                log.info("alarm evaluation resumed: the store is back")
                self._down = False
            wait = self.seconds


class SetsFolder(BackgroundLoop):
    """Folds newly stored labels into every served version's prediction-set states (``CoverageMonitor.assess``)
    when labels arrive, at most once per ``seconds``; a store outage is logged once and retried at the next
    labels or the evaluator's pass, which folds them too."""

    name = "sets-folder"

    def __init__(self, monitor: Monitor, webhook: AlarmWebhook, seconds: float):
        self.monitor = monitor
        self.webhook = webhook
        self.seconds = seconds
        self._down = False
        super().__init__()

    def wake(self) -> None:
        self._wakeup.set()

    def _fold_all(self) -> list[dict]:
        transitions: list[dict] = []
        for served in self.monitor.repository.all():
            if served.sets.available:
                transitions += self.monitor.coverage.assess(served)
        return transitions

    async def _loop(self) -> None:
        while self._running:
            if not await self._wait(3600.0) or not self._running:
                continue
            try:
                transitions = await anyio.to_thread.run_sync(self._fold_all)
            except StorageUnavailable as exc:
                if not self._down:
                    log.error("prediction set folding paused: %s", exc.message)
                self._down = True
            except Exception:
                log.exception("prediction set folding failed")
            else:
                self._down = False
                for transition in transitions:
                    self.webhook.notify(transition)
            await asyncio.sleep(self.seconds)
