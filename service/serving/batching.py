"""Dynamic batching: concurrent requests to one model coalesce into one onnxruntime call.

Each session's inference thread takes everything queued (up to ``max_batch_size`` rows), runs it and hands the results
to the event loop in one callback, so onnxruntime never waits for the loop. ``max_queue_delay_ms`` waits for more rows
as Triton does; past ``max_queue_rows`` a request gets ``Overloaded``, past ``deadline_seconds`` ``DeadlineExceeded``.
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

from service.errors import DeadlineExceeded, NotReady, Overloaded, ServiceError
from service.settings import BatchingConfig

log = logging.getLogger("service.serving.batching")

RunFn = Callable[[Any], Any]
"""Runs a batch (its rows as one array, or with ``gather`` the requests' arrays in order); what it returns, after
``finish``, is sliced by rows: a dict value by value (arrays, lists, nested dicts of them), anything else as
``result[start:stop]``."""


def _rows(outputs: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of a batch's result (see ``RunFn``)."""
    if isinstance(outputs, dict):
        return {name: _rows(value, start, stop) for name, value in outputs.items()}
    return outputs[start:stop]


@dataclass
class Timing:
    """Where one request's time went: queued, and its batch's onnxruntime call (``batch_id``, from 1)."""

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

    @property
    def abandoned(self) -> bool:
        """Its caller stopped waiting (its deadline passed): no batch runs it."""
        return self.future is not None and self.future.done()


def _expire(future: asyncio.Future, name: str, deadline: float, retry_after: int) -> None:
    """On the event loop, at a request's deadline: answer it with ``DeadlineExceeded`` unless it has its outputs."""
    if not future.done():
        message = f"model {name} gave no outputs within its deadline of {deadline:g} s; retry shortly"
        future.set_exception(DeadlineExceeded(message, retry_after))


BatchObserver = Callable[[int, float], None]


class Batcher(Protocol):
    """What serving needs of a model's batcher: ``DynamicBatcher`` or a front-end's ``EngineBatcher``."""

    @property
    def ready(self) -> bool: ...

    @property
    def queued_rows(self) -> int: ...

    async def submit(self, x: np.ndarray) -> tuple[Any, Timing]: ...

    async def stop(self) -> None: ...


class DynamicBatcher:
    """Coalesces ``submit`` calls into batched ``run`` calls; ``finish`` builds the requests' shared result."""

    def __init__(
        self,
        run: RunFn | Sequence[RunFn],
        config: BatchingConfig,
        name: str,
        retry_after: int = 1,
        on_batch: BatchObserver | None = None,
        finish: Callable[[Any], Any] | None = None,
        gather: bool = False,
    ):
        self._runs = list(run) if isinstance(run, Sequence) else [run]
        self.config = config
        self.name = name
        self._retry_after = retry_after
        self.on_batch = on_batch
        self.timeline: Callable[[dict], None] | None = None  # opt-in: each batch's timeline entry
        self._finish = finish
        self._gather = gather
        self._queue: deque[_Pending] = deque()
        self._queued_rows = 0
        self._ready = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepting = False
        self._running: dict[int, float] = {}  # inference thread -> when its batch's run began
        self.window = len(self._runs)
        self.batches_run = 0

    @property
    def ready(self) -> bool:
        """Started and not stopping."""
        return self._accepting

    @property
    def queued_rows(self) -> int:
        """Rows waiting for a batch."""
        return self._queued_rows

    def stalled_seconds(self) -> float:
        """How long the longest-running batch has run so far (0 when none runs): a stuck session's measure."""
        with self._ready:
            started = min(self._running.values(), default=None)
        return 0.0 if started is None else time.perf_counter() - started

    def set_window(self, window: int) -> None:
        """Let at most ``window`` batches run at once (1 to the number of inference threads)."""
        with self._ready:
            self.window = max(1, min(len(self._runs), window))
            self._ready.notify_all()

    def start(self) -> None:
        """Start an inference thread per run function; ``submit`` needs a running event loop, ``submit_nowait`` none."""
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
        deadline = self.config.deadline_seconds
        timer = self._loop.call_later(deadline, _expire, future, self.name, deadline, self._retry_after)
        try:
            return await future
        finally:
            timer.cancel()

    def submit_nowait(self, x: np.ndarray, done: Done) -> None:
        """Queue a (rows, ...) batch; ``done`` gets its rows of the result and their ``Timing``, or the batch's
        exception, on an inference thread. Refusals (``NotReady``, ``Overloaded``) are raised here instead."""
        self._enqueue(_Pending(x, None, done=done))

    def _enqueue(self, pending: _Pending) -> None:
        rows = len(pending.x)
        with self._ready:
            if not self._accepting:
                raise NotReady(f"model {self.name} is not accepting requests (starting or shutting down)")
            if self._queued_rows and self._queued_rows + rows > self.config.max_queue_rows:
                raise Overloaded(
                    f"model {self.name} has {self._queued_rows} rows queued (limit {self.config.max_queue_rows}); "
                    f"retry in {self._retry_after} s",
                    retry_after=self._retry_after,
                )
            self._queue.append(pending)
            self._queued_rows += rows
            self._ready.notify()

    def _work(self, run: RunFn) -> None:
        me = threading.get_ident()
        while True:
            back = time.perf_counter()
            with self._ready:
                queued_back = self._queued_rows
                while (not self._queue or len(self._running) >= self.window) and self._accepting:
                    self._ready.wait()
                if not self._queue:
                    return
                self._fill()
                batch = self._take()
                if not batch:  # another inference thread took the rows while this one waited, or all were abandoned
                    continue
                taken = self._running[me] = time.perf_counter()
                queued_after = self._queued_rows
            try:
                batch_id, elapsed = self._run_batch(run, batch)
            finally:
                with self._ready:
                    del self._running[me]
                    self._ready.notify()
            if self.timeline is not None:
                self.timeline(
                    {
                        "model": self.name,
                        "thread": threading.current_thread().name,
                        "batch": batch_id,
                        "rows": sum(len(p.x) for p in batch),
                        "back": back,  # the thread came back to the queue
                        "queued_back": queued_back,  # rows then queued: 0 means it idled for want of work
                        "taken": taken,  # ... and took its batch (the run starts now)
                        "ran": taken + elapsed,  # the session's call ended
                        "queued_after": queued_after,
                        "answered": time.perf_counter(),  # the run and its callbacks are done
                    }
                )

    def _fill(self) -> None:
        """Wait (lock held) until the batch is full or its oldest waited ``max_queue_delay_ms``."""
        if self.config.max_queue_delay_ms <= 0:
            return
        deadline = self._queue[0].enqueued + self.config.max_queue_delay_ms / 1000.0
        while self._queued_rows < self.config.max_batch_size and self._accepting:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            self._ready.wait(remaining)

    def _take(self) -> list[_Pending]:
        """The next batch (lock held): whole requests up to ``max_batch_size`` rows (a larger one alone), dropping
        the abandoned ones on the way."""
        batch: list[_Pending] = []
        rows = 0
        while self._queue:
            head = self._queue[0]
            if not head.abandoned and batch and rows + len(head.x) > self.config.max_batch_size:
                break
            self._queue.popleft()
            self._queued_rows -= len(head.x)
            if not head.abandoned:
                batch.append(head)
                rows += len(head.x)
        return batch

    def _run_batch(self, run: RunFn, batch: list[_Pending]) -> tuple[int, float]:
        """Run and answer one batch; its id (0 when it failed) and the run's seconds."""
        started = time.perf_counter()
        rows = sum(len(p.x) for p in batch)
        try:
            if self._gather:
                outputs = run([p.x for p in batch])
            else:
                outputs = run(batch[0].x if len(batch) == 1 else np.concatenate([p.x for p in batch]))
            elapsed = time.perf_counter() - started
            if self._finish is not None:
                outputs = self._finish(outputs)
        except ServiceError as exc:  # a front-end's engine that is down: an answer, not a fault here
            self._answer(batch, self._fail, exc)
            return 0, time.perf_counter() - started
        except Exception as exc:  # noqa: BLE001 - every waiting request must get an answer
            log.exception("inference failed for model %s on a batch of %d requests", self.name, len(batch))
            self._answer(batch, self._fail, exc)
            return 0, time.perf_counter() - started
        with self._ready:
            self.batches_run += 1
            batch_id = self.batches_run
        if self.on_batch is not None:
            self.on_batch(rows, elapsed)
        self._answer(batch, self._deliver, outputs, started, elapsed, rows, batch_id)
        return batch_id, elapsed

    def _answer(self, batch: list[_Pending], answer: Callable[..., None], *args: Any) -> None:
        """``answer(batch, futures, *args)``: on the event loop for futures, here for ``submit_nowait``'s callbacks."""
        if any(p.done is not None for p in batch):
            answer(batch, False, *args)
        if self._loop is not None and any(p.future is not None for p in batch):
            self._loop.call_soon_threadsafe(answer, batch, True, *args)

    def _deliver(
        self,
        batch: list[_Pending],
        futures: bool,
        outputs: Any,
        started: float,
        elapsed: float,
        rows: int,
        batch_id: int,
    ) -> None:
        """Give every request its rows of the result (``futures``: on the event loop); a failed reply is logged."""
        offset = 0
        for p in batch:
            n = len(p.x)
            try:
                timing = Timing(started - p.enqueued, elapsed, rows, batch_id)
                if futures and p.future is not None and not p.future.done():
                    p.future.set_result((_rows(outputs, offset, offset + n), timing))
                elif not futures and p.done is not None:
                    p.done(_rows(outputs, offset, offset + n), timing, None)
            except Exception:  # noqa: BLE001 - one reply's fault must not cost the batch's others theirs
                log.exception("a reply of model %s's batch %d could not be delivered", self.name, batch_id)
            offset += n

    def _fail(self, batch: list[_Pending], futures: bool, exc: Exception) -> None:
        for p in batch:
            try:
                if futures and p.future is not None and not p.future.done():
                    p.future.set_exception(exc)
                elif not futures and p.done is not None:
                    p.done(None, None, exc)
            except Exception:  # noqa: BLE001 - as in _deliver
                log.exception("a failure of model %s could not be delivered", self.name)
