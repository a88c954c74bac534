"""Logging of predictions: a bounded queue that a background task writes to the store in batches. Durability
``async`` (the default): answers do not wait, a full queue drops rows (counted) and a killed process loses the last
``interval`` seconds' worth. ``sync``: each answer waits for its rows' group commit; a failed write answers 503.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import anyio

from service.background import BackgroundLoop
from service.errors import Overloaded, StorageUnavailable
from service.metrics import ServiceMetrics
from service.store import Store
from service.store.rows import PredictionRow

log = logging.getLogger("service.serving.prediction_log")


@dataclass(eq=False)
class PredictionLog(BackgroundLoop):
    name = "prediction-log"

    store: Store
    metrics: ServiceMetrics
    max_pending: int = 100_000
    batch_size: int = 2000
    interval: float = 0.5
    durability: Literal["async", "sync"] = "async"
    retry_after: int = 1
    on_written: Callable[[], None] = lambda: None

    def __post_init__(self) -> None:
        self.sync = self.durability == "sync"
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
        """Queue rows; their ticket for ``written``. A full queue drops them, or under sync durability refuses them."""
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
        """Wait until the rows queued up to ``ticket`` are committed (``StorageUnavailable`` if their write failed)."""
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
        """Write queued rows in batches while at least ``min_rows`` are queued, after any batch being written (the
        lock comes first); feedback awaits this so every prediction it refers to is stored."""
        while True:
            async with self._lock:
                if len(self._pending) < max(min_rows, 1):
                    return
                await self._write_batch()

    async def _loop(self) -> None:
        """Write full batches as they fill, and whatever is queued after ``interval`` without one (never the rest
        right after a full batch, which under load would become a stream of small ones)."""
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
            # sync durability keeps every row (``enqueue`` refuses past the size), so rows leave in ticket order
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
