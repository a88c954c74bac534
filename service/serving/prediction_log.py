"""Logging of predictions: /predict and v2 infer append to a bounded in-memory queue (``DataPlane.log``); a
background task writes batches to the store.

Durability ``async`` (write-behind, the default): the answer does not wait for the write. A full queue drops
rows (counted, never blocks inference); a failed write keeps the batch for the next attempt while there is
room, so a short database outage loses nothing and a long one degrades to counted drops. A process killed
before a write loses the rows queued since the last one (at most ``interval`` seconds of them while the store
is up): their ids were answered but never become known, and labels sent for them expire as pending.

Durability ``sync``: each answer waits until its rows are committed (rows queued while a write runs go
together in the next one, a group commit), so every id answered is in the store. A full queue answers 503
with Retry-After; a failed write answers 503 to the requests waiting on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Literal

import anyio

from service.background import BackgroundLoop
from service.errors import Overloaded, StorageUnavailable
from service.metrics import ServiceMetrics
from service.store import Store
from service.store.rows import PredictionRow

log = logging.getLogger("service.serving.prediction_log")


class PredictionLog(BackgroundLoop):
    name = "prediction-log"

    def __init__(
        self,
        store: Store,
        metrics: ServiceMetrics,
        max_pending: int = 100_000,
        batch_size: int = 2000,
        interval: float = 0.5,
        durability: Literal["async", "sync"] = "async",
        retry_after: int = 1,
        on_written: Callable[[], None] = lambda: None,
    ):
        self.store = store
        self.metrics = metrics
        self.max_pending = max_pending
        self.batch_size = batch_size
        self.interval = interval
        self.sync = durability == "sync"
        self.retry_after = retry_after
        self.on_written = on_written
        self._pending: deque[PredictionRow] = deque()
        self._lock = asyncio.Lock()
        self._queued = 0  # rows ever queued: the ticket of the last one
        self._done = 0  # rows ever taken off the queue in order (written, or dropped after a failed write)
        self._waiters: deque[tuple[int, asyncio.Future]] = deque()
        super().__init__()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def enqueue(self, rows: list[PredictionRow]) -> int:
        """Queue rows for writing; their ticket for ``written``. A full queue drops (and counts) them, or
        under sync durability refuses them (``Overloaded``)."""
        room = self.max_pending - len(self._pending)
        if room < len(rows):
            if self.sync:
                raise Overloaded("the prediction log is full: the store is not keeping up", self.retry_after)
            self.metrics.log_dropped.labels("queue_full").inc(len(rows) - max(room, 0))
            rows = rows[: max(room, 0)]
        self._pending.extend(rows)
        self._queued += len(rows)
        if self.sync or len(self._pending) >= self.batch_size:
            self._wakeup.set()
        return self._queued

    async def written(self, ticket: int) -> None:
        """Wait until the rows queued up to ``ticket`` are committed; raises ``StorageUnavailable`` when the
        write that held them failed."""
        if ticket <= self._done:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((ticket, future))
        self._wakeup.set()
        await future

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
        round trips and commit."""
        backoff = self.interval
        while self._running:
            full_only = await self._wait(backoff) and not self.sync
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
        except StorageUnavailable as exc:
            # sync durability keeps every row (``enqueue`` refuses more while the queue is over its size), so
            # that rows leave the queue in ticket order
            room = len(batch) if self.sync else self.max_pending - len(self._pending)
            kept = batch[: max(room, 0)]
            self._pending.extendleft(reversed(kept))
            if len(kept) < len(batch):
                self.metrics.log_dropped.labels("storage_unavailable").inc(len(batch) - len(kept))
                self._done += len(batch) - len(kept)
            while self._waiters:  # their answers cannot wait for the store to come back
                _, future = self._waiters.popleft()
                if not future.done():
                    future.set_exception(exc)
            raise
        self.metrics.log_written.inc(len(batch))
        self._done += len(batch)
        while self._waiters and self._waiters[0][0] <= self._done:
            _, future = self._waiters.popleft()
            if not future.done():
                future.set_result(None)
        self.on_written()
