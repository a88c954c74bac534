"""Dynamic batching: concurrent requests to one model coalesce into one onnxruntime call.

Each of a model's onnxruntime sessions has an inference thread that loops on its own: it takes
everything queued (up to ``max_batch_size`` rows), runs it, hands the results back to the event loop
in one callback, and immediately takes the next batch, so onnxruntime never waits for the event
loop to be scheduled; several sessions take batches from the one queue.
Requests arriving while a batch runs form the next batch: batches grow with load and a lone
request waits for nothing. With ``max_queue_delay_ms`` > 0 a batch additionally waits up to that
long for more rows, as Triton's ``dynamic_batching`` does; the wait is timed on the inference
thread, so a busy event loop does not stretch it. Whole requests are batched (never split); a
request larger than ``max_batch_size`` runs alone. The queue is bounded in rows: past
``max_queue_rows`` a request is refused with ``Overloaded`` (HTTP 503 + Retry-After) instead of
growing memory without bound. A caller without an event loop (the engine's socket thread,
``service.engine.server``) queues with ``submit_nowait`` and is answered by a callback on the
inference thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from service.errors import NotReady, Overloaded, ServiceError
from service.settings import BatchingConfig

log = logging.getLogger("service.serving.batching")

RunFn = Callable[[np.ndarray], Any]
"""Runs a batch; what it returns is sliced by rows: a dict value by value (arrays, lists, nested dicts of them),
anything else as ``result[start:stop]``."""


def _rows(outputs: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of a batch's result (see ``RunFn``)."""
    if isinstance(outputs, dict):
        return {name: _rows(value, start, stop) for name, value in outputs.items()}
    return outputs[start:stop]


@dataclass
class Timing:
    """Where one request's time went: waiting in the queue, and the onnxruntime call of its batch (the batcher's
    ``batch_id``-th, counted from 1)."""

    queue_seconds: float
    inference_seconds: float
    batch_rows: int
    batch_id: int = 0


Done = Callable[[Any, "Timing | None", "Exception | None"], None]
"""``submit_nowait``'s callback: the request's rows of the result and their ``Timing``, or the exception."""


@dataclass
class _Pending:
    x: np.ndarray
    future: asyncio.Future | None
    enqueued: float = field(default_factory=time.perf_counter)
    done: Done | None = None


BatchObserver = Callable[[int, float], None]


class Batcher(Protocol):
    """What serving needs of a model's batcher: this module's ``DynamicBatcher``, or a front-end's
    ``service.engine.frontend.EngineBatcher``."""

    @property
    def ready(self) -> bool: ...

    @property
    def queued_rows(self) -> int: ...

    async def submit(self, x: np.ndarray) -> tuple[Any, Timing]: ...

    async def stop(self) -> None: ...


class DynamicBatcher:
    """Coalesces ``submit`` calls into batched ``run`` calls; see the module docstring."""

    def __init__(
        self,
        run: RunFn | Sequence[RunFn],
        config: BatchingConfig,
        name: str,
        retry_after: int = 1,
        on_batch: BatchObserver | None = None,
    ):
        self._runs = list(run) if isinstance(run, Sequence) else [run]
        self.config = config
        self.name = name
        self._retry_after = retry_after
        self._on_batch = on_batch
        self._queue: deque[_Pending] = deque()
        self._queued_rows = 0
        self._ready = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepting = False
        self.batches_run = 0

    @property
    def ready(self) -> bool:
        """Started and not stopping."""
        return self._accepting

    @property
    def queued_rows(self) -> int:
        """Rows waiting for a batch."""
        return self._queued_rows

    def start(self) -> None:
        """Start the inference threads (one per run function); ``submit``'s results are delivered to the
        running event loop (without one, only ``submit_nowait`` is served)."""
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._accepting = True
        self._threads = [
            threading.Thread(target=self._work, args=(run,), name=f"infer-{self.name}-{i}", daemon=True)
            for i, run in enumerate(self._runs)
        ]
        for thread in self._threads:
            thread.start()

    async def stop(self) -> None:
        """Refuse new work, finish everything queued and in flight, then stop the inference threads."""
        self.close()
        for thread in self._threads:
            await asyncio.to_thread(thread.join)

    def close(self) -> None:
        """Refuse new work; the inference threads finish what is queued and in flight, then end (``join``)."""
        with self._ready:
            self._accepting = False
            self._ready.notify_all()

    def join(self) -> None:
        for thread in self._threads:
            thread.join()

    async def submit(self, x: np.ndarray) -> tuple[Any, Timing]:
        """Queue a (rows, ...) batch and wait for its rows of the batch's result."""
        if self._loop is None:  # not started (or started outside an event loop: submit_nowait's callers only)
            raise NotReady(f"model {self.name} is not accepting requests (starting or shutting down)")
        future = self._loop.create_future()
        self._enqueue(_Pending(x, future))
        return await future

    def submit_nowait(self, x: np.ndarray, done: Done) -> None:
        """Queue a (rows, ...) batch; ``done`` is called on an inference thread with its rows of the result and
        their ``Timing``, or with the exception that failed the batch. Refusals (``NotReady``, ``Overloaded``)
        are raised here, and ``done`` is then never called."""
        self._enqueue(_Pending(x, None, done=done))

    def _enqueue(self, pending: _Pending) -> None:
        rows = len(pending.x)
        with self._ready:
            if not self._accepting:
                raise NotReady(f"model {self.name} is not accepting requests (starting or shutting down)")
            if self._queued_rows + rows > self.config.max_queue_rows:
                raise Overloaded(
                    f"model {self.name} has {self._queued_rows} rows queued (limit {self.config.max_queue_rows}); "
                    f"retry in {self._retry_after} s",
                    retry_after=self._retry_after,
                )
            self._queue.append(pending)
            self._queued_rows += rows
            self._ready.notify()

    def _work(self, run: RunFn) -> None:
        while True:
            with self._ready:
                while not self._queue and self._accepting:
                    self._ready.wait()
                if not self._queue:
                    return
                self._fill()
                if not self._queue:  # another inference thread took the rows while this one waited
                    continue
                batch = self._take()
            self._run_batch(run, batch)

    def _fill(self) -> None:
        """Wait (lock held, released while waiting) until the batch is full or the oldest request has
        waited ``max_queue_delay_ms``."""
        if self.config.max_queue_delay_ms <= 0:
            return
        deadline = self._queue[0].enqueued + self.config.max_queue_delay_ms / 1000.0
        while self._queued_rows < self.config.max_batch_size and self._accepting:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            self._ready.wait(remaining)

    def _take(self) -> list[_Pending]:
        batch = [self._queue.popleft()]
        rows = len(batch[0].x)
        while self._queue and rows + len(self._queue[0].x) <= self.config.max_batch_size:
            item = self._queue.popleft()
            batch.append(item)
            rows += len(item.x)
        self._queued_rows -= rows
        return batch

    def _run_batch(self, run: RunFn, batch: list[_Pending]) -> None:
        started = time.perf_counter()
        try:
            x = batch[0].x if len(batch) == 1 else np.concatenate([p.x for p in batch])
            outputs = run(x)
        except ServiceError as exc:  # a front-end's engine that is down: an answer, not a fault here
            self._answer(batch, self._fail, exc)
            return
        except Exception as exc:  # noqa: BLE001 - every waiting request must get an answer
            log.exception("inference failed for model %s on a batch of %d requests", self.name, len(batch))
            self._answer(batch, self._fail, exc)
            return
        elapsed = time.perf_counter() - started
        with self._ready:
            self.batches_run += 1
            batch_id = self.batches_run
        if self._on_batch is not None:
            self._on_batch(len(x), elapsed)
        self._answer(batch, self._deliver, outputs, started, elapsed, len(x), batch_id)

    def _answer(self, batch: list[_Pending], answer: Callable[..., None], *args: Any) -> None:
        """``answer(batch, futures, *args)`` (``_deliver`` or ``_fail``): on the event loop for ``submit``'s
        futures, here on the inference thread for ``submit_nowait``'s callbacks."""
        if any(p.done is not None for p in batch):
            try:
                answer(batch, False, *args)
            except Exception:  # a callback's fault must not end the inference thread
                log.exception("a batch's callback failed for model %s", self.name)
        if self._loop is not None and any(p.future is not None for p in batch):
            self._loop.call_soon_threadsafe(answer, batch, True, *args)

    @staticmethod
    def _deliver(
        batch: list[_Pending], futures: bool, outputs: Any, started: float, elapsed: float, rows: int, batch_id: int
    ) -> None:
        """Give every request its rows of the batch's result: the futures (``futures``, on the event loop), or the
        callbacks."""
        offset = 0
        for p in batch:
            n = len(p.x)
            timing = Timing(started - p.enqueued, elapsed, rows, batch_id)
            if futures and p.future is not None and not p.future.done():
                p.future.set_result((_rows(outputs, offset, offset + n), timing))
            elif not futures and p.done is not None:
                p.done(_rows(outputs, offset, offset + n), timing, None)
            offset += n

    @staticmethod
    def _fail(batch: list[_Pending], futures: bool, exc: Exception) -> None:
        for p in batch:
            if futures and p.future is not None and not p.future.done():
                p.future.set_exception(exc)
            elif not futures and p.done is not None:
                p.done(None, None, exc)
