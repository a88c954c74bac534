"""The engine process: the model repository's sessions and one dynamic batcher per model version, behind a ZeroMQ
ROUTER socket; pings are answered at once, so a front-end can tell a live engine from a dead or stuck one.

    python -m service.engine --endpoint ipc:///run/calib/engine.sock [--artifacts artifacts]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import errno
import functools
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import zmq

from service.engine import wire
from service.engine.health import EngineFault, Health, sticky_device_error
from service.errors import EngineUnavailable, ModelNotFound, NotReady, Overloaded
from service.serving.batching import DynamicBatcher

log = logging.getLogger("service.engine")
#: Messages read (or replies sent) at once, without waiting, after each wake-up.
DRAIN = 256
#: Milliseconds the socket thread waits in the poller before it looks at ``stop`` and the engine's health again.
POLL_MS = 100
#: Seconds a stopping engine waits at most for the replies of what it had queued.
DRAIN_SECONDS = 60.0
#: The engine's thread switch interval, the longest an inference thread waits for the GIL (decision 0027; in process:
#: Python's default, decision 0001).
ENGINE_SWITCH_INTERVAL_MS = 0.5
#: The exit status of an engine that cannot serve again (``service.engine.health``): its supervisor restarts it.
EXIT_FAULT = 70
#: Messages a socket queues per peer before a send would block: far above what the front-ends keep in flight.
HIGH_WATER_MARK = 10_000


class EngineServer:
    """Serves ``batchers`` on ``endpoint`` until ``stop``. One thread owns the ROUTER socket (``ROUTER_MANDATORY``) and
    sends the replies inference threads leave in an outbox; a stuck session or sticky device error: ``EngineFault``."""

    def __init__(
        self,
        batchers: Mapping[tuple[str, str], DynamicBatcher],
        endpoint: str,
        facts: Mapping[tuple[str, str], dict] | None = None,
        health: Health | None = None,
        timeline: Path | None = None,
    ):
        self.batchers = dict(batchers)
        self.endpoint = endpoint
        self.facts = json.dumps([{"model": m, "version": v} | f for (m, v), f in (facts or {}).items()])
        self.health = health or Health()
        self.timeline = timeline
        self._stopping = threading.Event()
        self._context = zmq.Context()
        self._outbox: collections.deque = collections.deque()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self._wake_pending = False
        for batcher in self.batchers.values():  # its metrics and timeline are written by the socket thread
            if batcher.on_batch is not None:
                batcher.on_batch = functools.partial(self.observe, batcher.on_batch)
            if timeline is not None:
                batcher.timeline = self.record

    def run(self) -> None:
        """Bind, start the batchers, answer until ``stop``, then answer what is queued and in flight; ``EngineFault``
        at once when the engine cannot serve again."""
        router = self._context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 1000)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.SNDHWM, HIGH_WATER_MARK)
        router.setsockopt(zmq.RCVHWM, HIGH_WATER_MARK)
        router.bind(self.endpoint)
        timeline = self.timeline.open("a", buffering=1 << 16) if self.timeline is not None else None
        for batcher in self.batchers.values():
            batcher.start()
        log.info("engine serving %d model versions on %s", len(self.batchers), self.endpoint)
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        outstanding = 0  # requests queued whose reply has not been sent yet
        draining, deadline, fault = False, math.inf, None
        try:
            while not (draining and (outstanding <= 0 or time.monotonic() > deadline)):
                fault = self.health.check(self.batchers)
                if fault is not None:
                    raise EngineFault(fault)
                if self._stopping.is_set() and not draining:
                    draining = True  # read no more requests; answer those queued and in flight
                    deadline = time.monotonic() + DRAIN_SECONDS  # a reply lost to a failed callback ends the wait
                    poller.unregister(router)
                    for batcher in self.batchers.values():
                        batcher.close()
                events = dict(poller.poll(POLL_MS))
                if events.get(router):
                    outstanding += self._read(router)
                if events.get(self._wake_read):
                    outstanding -= self._flush(router, timeline)
        finally:
            for batcher in self.batchers.values():
                batcher.close()
                if fault is None:  # a stuck inference thread would never be joined
                    batcher.join()
            if timeline is not None:
                timeline.close()
            self._context.destroy(linger=0 if fault else 1000)
            if fault is None:  # else a stuck thread may yet post: its pipe stays open until the process ends
                os.close(self._wake_read)
                os.close(self._wake_write)

    async def serve(self) -> None:
        """``run`` on a thread of its own, for callers inside an event loop."""
        await asyncio.to_thread(self.run)

    def stop(self) -> None:
        """Thread- and signal-safe: ``run`` drains and returns."""
        self._stopping.set()

    def _read(self, router: zmq.Socket) -> int:
        """Answer or queue the messages waiting, up to DRAIN; the number queued for a batch."""
        queued = 0
        for _ in range(DRAIN):
            try:
                identity, *frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            queued += self._answer(router, identity, frames)
        return queued

    def _answer(self, router: zmq.Socket, identity: bytes, frames: list) -> int:
        try:
            header, x = wire.read_request(frames)
        except Exception as exc:  # noqa: BLE001 - a malformed message gets an answer and never stops the engine
            log.warning("a malformed request: %s", exc)
            self._send(
                router, [identity, *wire.failure(wire.request_seq(frames), "invalid", f"a malformed request: {exc}")]
            )
            return 0
        if header.kind == "ping":
            batches, stalled = self.health.progress(self.batchers.values())
            self._send(router, [identity, *wire.reply(header.seq, {}, batch_id=batches, stalled_seconds=stalled)])
            return 0
        if header.kind == "describe":
            self._send(router, [identity, *wire.described(header.seq, self.facts)])
            return 0
        batcher = self.batchers.get((header.model, header.version))
        try:
            if batcher is None:
                raise ModelNotFound(f"the engine serves no model {header.model!r} version {header.version!r}")
            if x is None:
                raise ValueError("an inference request without rows")
            batcher.submit_nowait(x, functools.partial(self._done, identity, header.seq, batcher))
        except Exception as exc:  # noqa: BLE001 - every request gets an answer
            if not isinstance(exc, REFUSALS):
                log.error("a request for %s failed before its batch: %r", header.model, exc)
            self._send(router, [identity, *_failure(header.seq, exc)])
            return 0
        return 1

    def _done(self, identity: bytes, seq: int, batcher: DynamicBatcher, outputs, timing, exc) -> None:
        """On an inference thread: the reply of one request, left in the outbox for the socket thread."""
        if exc is not None:
            self.health.note(exc, batcher.name)
        self._post(("reply", identity, seq, outputs, timing, exc, batcher.queued_rows))

    def observe(self, observe_batch, rows: int, seconds: float) -> None:
        """On an inference thread: a batch's metrics, observed by the socket thread."""
        self._post(("batch", observe_batch, rows, seconds))

    def record(self, facts: dict) -> None:
        """On an inference thread: a batch's timeline entry, written by the socket thread once its replies are sent."""
        self._post(("timeline", facts))

    def _post(self, item: tuple) -> None:
        """Append to the outbox and wake the socket thread unless a wake-up is pending (it clears the flag before it
        empties the outbox, so nothing appended meanwhile waits)."""
        self._outbox.append(item)
        if not self._wake_pending:
            self._wake_pending = True
            os.write(self._wake_write, b"\0")

    def _flush(self, router: zmq.Socket, timeline) -> int:
        """Send the outbox's replies and observe its batches; the number of replies."""
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass
        self._wake_pending = False
        sent = 0
        while self._outbox:
            kind, *item = self._outbox.popleft()
            if kind == "reply":
                identity, seq, outputs, timing, exc, queued = item
                self._send(router, [identity, *_reply(seq, outputs, timing, exc, queued)])
                sent += 1
            elif kind == "batch":
                observe_batch, rows, seconds = item
                observe_batch(rows, seconds)
            elif timeline is not None:
                timeline.write(json.dumps(item[0] | {"sent": time.perf_counter()}) + "\n")
        if timeline is not None:
            timeline.flush()  # readable while the engine runs
        return sent

    def _send(self, router: zmq.Socket, frames: list) -> None:
        """Send without blocking; a reply ZeroMQ cannot route (its front-end gave up on it, or ended) is logged."""
        try:
            router.send_multipart(frames, zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            if exc.errno not in (errno.EHOSTUNREACH, errno.EAGAIN):
                raise
            log.warning("a reply could not be delivered (%s): its front-end has ended or stopped reading", exc.strerror)


def _reply(seq: int, outputs, timing, exc, queued_rows: int) -> list:
    """The frames of a request's reply: its outputs with the batch's facts and the engine's queue, or its failure."""
    if exc is not None and sticky_device_error(exc):
        return wire.failure(seq, "unavailable", f"the engine's device failed and the engine restarts: {exc}", 1)
    if exc is not None:
        return _failure(seq, exc)  # the batcher logged a failed batch once, with its traceback
    return wire.reply(
        seq,
        outputs,
        batch_id=timing.batch_id,
        batch_rows=timing.batch_rows,
        queue_seconds=timing.queue_seconds,
        inference_seconds=timing.inference_seconds,
        queued_rows=queued_rows,
    )


#: The errors that are answers (refusals the front-end maps to 4xx/503), not faults to log.
REFUSALS = (Overloaded, NotReady, ModelNotFound, ValueError)


def _failure(seq: int, exc: Exception) -> list:
    """The frames of a refusal or failure: the service's error kinds by name, anything else an ``error``."""
    if isinstance(exc, Overloaded):
        return wire.failure(seq, "overloaded", exc.message, int(exc.headers["Retry-After"]))
    if isinstance(exc, NotReady):
        return wire.failure(seq, "not_ready", exc.message, 1)
    if isinstance(exc, EngineUnavailable):
        return wire.failure(seq, "unavailable", exc.message, 1)
    if isinstance(exc, ModelNotFound):
        return wire.failure(seq, "model_not_found", exc.message)
    if isinstance(exc, ValueError):
        return wire.failure(seq, "invalid", str(exc))
    return wire.failure(seq, "error", f"{type(exc).__name__}: {exc}")


def runtime_facts(runtimes) -> dict:
    """What a front-end shows of a version's sessions (``/health``, ``provider`` in answers, the v2 outputs)."""
    first = runtimes[0]
    return {
        "provider": first.provider,
        "requested": list(first.requested),
        "io_binding": first.io_binding,
        "buckets": list(first.buckets),
        "bucket_sessions": bool(first.bucket_sessions),
        "cuda_graphs": all(r.cuda_graphs for r in runtimes),
        "graph_fallback": next((r.graph_fallback for r in runtimes if r.graph_fallback), ""),
        "warmup_seconds": sum(r.warmup_seconds for r in runtimes),
        "staging_bytes": sum(r.staging_bytes for r in runtimes),
        "sessions": len(runtimes),
        "output_names": list(first.output_names),
    }


def repository_engine(settings) -> tuple[dict[tuple[str, str], DynamicBatcher], dict[tuple[str, str], dict]]:
    """A batcher over the raw graph outputs of every version the repository loads, and its sessions' facts."""
    from service.metrics import ServiceMetrics
    from service.serving.repository import ModelRepository

    repository = ModelRepository(settings)
    repository.load()
    metrics = ServiceMetrics()  # in a pod, its multiprocess files join the front-ends' /metrics
    batchers = {
        (m.name, m.version): DynamicBatcher(
            [runtime.run for runtime in m.runtimes],
            m.batching,
            f"{m.name}:{m.version}",
            settings.limits.retry_after_seconds,
            on_batch=functools.partial(metrics.observe_batch, f"{m.name}:{m.version}"),
            gather=True,
        )
        for m in repository.all()
    }
    return batchers, {(m.name, m.version): runtime_facts(m.runtimes) for m in repository.all()}


def serve_repository(endpoint: str, settings) -> None:
    """``python -m service.engine``: the repository's batchers on ``endpoint`` until SIGTERM or SIGINT; an engine that
    cannot serve again exits at once with ``EXIT_FAULT`` (stuck threads left behind) for its supervisor to restart."""
    sys.setswitchinterval(ENGINE_SWITCH_INTERVAL_MS / 1000)
    batchers, facts = repository_engine(settings)
    server = EngineServer(batchers, endpoint, facts, timeline=settings.pod.timeline)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: server.stop())
    try:
        server.run()
    except EngineFault as fault:
        log.critical("the engine must restart: %s", fault)
        logging.shutdown()
        os._exit(EXIT_FAULT)


def main(argv: list[str] | None = None) -> None:
    from service.settings import Settings

    parser = argparse.ArgumentParser(prog="python -m service.engine", description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True, help="ZeroMQ endpoint to bind, e.g. ipc:///tmp/engine.sock")
    parser.add_argument("--artifacts", help="model repository (default: CALIB_ARTIFACTS or ./artifacts)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = Settings(**({"artifacts": args.artifacts} if args.artifacts else {}))
    serve_repository(args.endpoint, settings)
