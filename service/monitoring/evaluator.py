"""Alarm evaluation off the request path: every ``evaluate_seconds``, and after ``evaluate_every_labels`` new labels,
with transitions to the webhook; ``SetsFolder`` folds the sets' states as labels arrive."""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from dataclasses import KW_ONLY, dataclass

import anyio

from service.background import BackgroundLoop
from service.errors import StorageUnavailable
from service.metrics import ServiceMetrics
from service.monitoring import Monitor
from service.monitoring.webhook import AlarmWebhook

log = logging.getLogger("service.monitoring.evaluator")

MAX_BACKOFF_SECONDS = 5.0


@dataclass(eq=False)
class Evaluator(BackgroundLoop):
    name = "evaluator"

    monitor: Monitor
    metrics: ServiceMetrics
    webhook: AlarmWebhook
    _: KW_ONLY
    every_labels: int
    seconds: float
    sets_seconds: float = 0.1

    def __post_init__(self) -> None:
        self._new_labels = 0
        self._lock = asyncio.Lock()
        self._down = False
        self.sets = SetsFolder(self.monitor, self.webhook, self.sets_seconds)
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
        """One pass over every served model version now (after any under way); its transitions, also sent to the
        webhook (those found before a ``StorageUnavailable``, too)."""
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
        await anyio.to_thread.run_sync(importlib.import_module, "scipy.signal")  # scipy, before a pass holds a lock
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
    """Folds new labels into every served version's prediction-set states when labels arrive, at most once per
    ``seconds``; an outage is logged once (the next labels or the evaluator's pass fold them)."""

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
