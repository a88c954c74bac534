"""Write-behind logging of predictions: /predict and v2 infer only append to a bounded in-memory
queue (``DataPlane.log``); a background task writes batches to the store. A full queue drops rows
(counted, never blocks inference); a failed write keeps the batch for the next attempt while there
is room, so a short database outage loses nothing and a long one degrades to counted drops.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

import anyio

from service.background import BackgroundLoop
from service.metrics import ServiceMetrics
from service.errors import StorageUnavailable
from service.store import Store
from service.store.rows import PredictionRow

log = logging.getLogger("service.serving.prediction_log")


class PredictionLog(BackgroundLoop):
    name = "prediction-log"

    def __init__(self, store: Store, metrics: ServiceMetrics, max_pending: int = 100_000,
                 batch_size: int = 2000, interval: float = 0.5):
        self.store = store
        self.metrics = metrics
        self.max_pending = max_pending
        self.batch_size = batch_size
        self.interval = interval
        self._pending: deque[PredictionRow] = deque()
        self._lock = asyncio.Lock()
        super().__init__()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def enqueue(self, rows: list[PredictionRow]) -> None:
        """Queue rows for writing; drops (and counts) them when the queue is full."""
        room = self.max_pending - len(self._pending)
        if room < len(rows):
            self.metrics.log_dropped.labels("queue_full").inc(len(rows) - max(room, 0))
            rows = rows[:max(room, 0)]
        self._pending.extend(rows)
        if len(self._pending) >= self.batch_size:
            self._wakeup.set()

    async def stop(self) -> None:
        """Stop the loop, then write what is still queued."""
        await super().stop()
        try:
            await self.flush()
        except StorageUnavailable:
            self.metrics.log_dropped.labels("storage_unavailable").inc(len(self._pending))
            log.error("dropped %d prediction log rows at shutdown: the store is unavailable", len(self._pending))

    async def flush(self, min_rows: int = 1) -> None:
        """Write queued rows in batches while at least ``min_rows`` are queued (by default: everything
        queued now), including a batch another task is writing at this moment (the lock is taken
        before the queue is looked at); raises ``StorageUnavailable`` when the store is down. Feedback
        awaits this so every prediction it refers to is stored."""
        while True:
            async with self._lock:
                if len(self._pending) < max(min_rows, 1):
                    return
                await self._write_batch()

    async def _loop(self) -> None:
        """Write full batches as soon as they fill, and whatever is queued after ``interval`` without a
        full batch. Never the remainder right after a full batch: under load, the rows queued while a
        batch was written would otherwise go out as a stream of small batches, each paying the store's
        round trips and commit (on PostgreSQL that cost up to a quarter of the light model's throughput)."""
        backoff = self.interval
        while self._running:
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=backoff)
                full_only = True
            except asyncio.TimeoutError:
                full_only = False
            self._wakeup.clear()
            try:
                await self.flush(self.batch_size if full_only and self._running else 1)
                backoff = self.interval
            except StorageUnavailable:
                backoff = min(backoff * 2, 5.0)

    async def _write_batch(self) -> None:
        """Write one batch (called with the lock held); a failed batch goes back to the front."""
        batch = [self._pending.popleft() for _ in range(min(self.batch_size, len(self._pending)))]
        try:
            await anyio.to_thread.run_sync(self.store.predictions.insert, batch)
        except StorageUnavailable:
            room = self.max_pending - len(self._pending)
            kept = batch[:max(room, 0)]
            self._pending.extendleft(reversed(kept))
            if len(kept) < len(batch):
                self.metrics.log_dropped.labels("storage_unavailable").inc(len(batch) - len(kept))
            raise
        self.metrics.log_written.inc(len(batch))
