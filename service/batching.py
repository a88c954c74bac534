"""Dynamic batching: concurrent requests to one model coalesce into one onnxruntime call.

Inference runs on one worker thread per model, off the event loop. When the worker is free the
queued requests run at once (up to ``max_batch_size`` rows), and requests arriving while a batch
runs form the next batch: batches grow with load and a lone request waits for nothing. With
``max_queue_delay_ms`` > 0 a batch additionally waits up to that long for more rows, as Triton's
``dynamic_batching`` does (useful when inference is much cheaper per row in larger batches).
Whole requests are batched (never split); a request larger than ``max_batch_size`` runs alone. The queue is bounded in rows: past ``max_queue_rows`` a request is refused with
``Overloaded`` (HTTP 503 + Retry-After) instead of growing memory without bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from service.errors import NotReady, Overloaded
from service.settings import BatchingConfig

log = logging.getLogger("service.batching")

RunFn = Callable[[np.ndarray], dict[str, np.ndarray]]


@dataclass
class Timing:
    """Where one request's time went: waiting in the queue, and the onnxruntime call of its batch."""

    queue_seconds: float
    inference_seconds: float
    batch_rows: int


@dataclass
class _Pending:
    x: np.ndarray
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


BatchObserver = Callable[[int, float], None]


class DynamicBatcher:
    """Coalesces ``submit`` calls into batched ``run`` calls; see the module docstring."""

    def __init__(self, run: RunFn, config: BatchingConfig, name: str, retry_after: int = 1,
                 on_batch: BatchObserver | None = None):
        self._run = run
        self.config = config
        self.name = name
        self._retry_after = retry_after
        self._on_batch = on_batch
        self._queue: deque[_Pending] = deque()
        self._queued_rows = 0
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"infer-{name}")
        self._task: asyncio.Task | None = None
        self._accepting = False
        self.batches_run = 0

    @property
    def queued_rows(self) -> int:
        """Rows waiting for a batch."""
        return self._queued_rows

    def start(self) -> None:
        """Start the batching loop on the running event loop."""
        self._accepting = True
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"batcher-{self.name}")

    async def stop(self) -> None:
        """Refuse new work, finish everything queued and in flight, then stop the worker thread."""
        self._accepting = False
        self._wakeup.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)

    async def submit(self, x: np.ndarray) -> tuple[dict[str, np.ndarray], Timing]:
        """Queue a (rows, ...) batch and wait for its rows of every output."""
        if not self._accepting:
            raise NotReady(f"model {self.name} is not accepting requests (starting or shutting down)")
        rows = len(x)
        if self._queued_rows + rows > self.config.max_queue_rows:
            raise Overloaded(
                f"model {self.name} has {self._queued_rows} rows queued (limit {self.config.max_queue_rows}); "
                f"retry in {self._retry_after} s",
                retry_after=self._retry_after,
            )
        pending = _Pending(x, asyncio.get_running_loop().create_future())
        self._queue.append(pending)
        self._queued_rows += rows
        self._wakeup.set()
        return await pending.future

    async def _loop(self) -> None:
        while self._accepting or self._queue:
            if not self._queue:
                await self._wakeup.wait()
                self._wakeup.clear()
                continue
            await self._fill()
            await self._run_batch(self._take())

    async def _fill(self) -> None:
        """Wait until the batch is full or the oldest request has waited ``max_queue_delay_ms``."""
        if self.config.max_queue_delay_ms <= 0:
            return
        deadline = self._queue[0].enqueued + self.config.max_queue_delay_ms / 1000.0
        while self._queued_rows < self.config.max_batch_size and self._accepting:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except asyncio.TimeoutError:
                return

    def _take(self) -> list[_Pending]:
        batch = [self._queue.popleft()]
        rows = len(batch[0].x)
        while self._queue and rows + len(self._queue[0].x) <= self.config.max_batch_size:
            item = self._queue.popleft()
            batch.append(item)
            rows += len(item.x)
        self._queued_rows -= rows
        return batch

    async def _run_batch(self, batch: list[_Pending]) -> None:
        started = time.perf_counter()
        x = batch[0].x if len(batch) == 1 else np.concatenate([p.x for p in batch])
        try:
            outputs = await asyncio.get_running_loop().run_in_executor(self._executor, self._run, x)
        except Exception as exc:  # noqa: BLE001 - every waiting request must get an answer
            log.exception("inference failed for model %s on a batch of %d rows", self.name, len(x))
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        elapsed = time.perf_counter() - started
        self.batches_run += 1
        if self._on_batch is not None:
            self._on_batch(len(x), elapsed)
        offset = 0
        for p in batch:
            n = len(p.x)
            if not p.future.done():
                part = {name: value[offset:offset + n] for name, value in outputs.items()}
                p.future.set_result((part, Timing(started - p.enqueued, elapsed, len(x))))
            offset += n
