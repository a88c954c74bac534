"""The engine process: the model repository's sessions and one dynamic batcher per model version, behind a ZeroMQ
ROUTER socket.

Each request is submitted to its model's batcher as the in-process service does (``DynamicBatcher``: batches grow
with load, several sessions take batches from one queue, a full queue refuses with ``Overloaded``); its reply
carries the request's rows of the graph's outputs and the batch's facts. Requests are answered as their batches
finish, in any order: the front-end routes a reply by its sequence number. Pings are answered at once, so a
front-end can tell a live engine from a dead or stuck one.

    python -m service.engine --endpoint ipc:///run/calib/engine.sock [--artifacts artifacts]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import math
import signal
import sys
import threading
import time
from collections.abc import Mapping

import zmq

from service.engine import wire
from service.errors import ModelNotFound, NotReady, Overloaded
from service.serving.batching import DynamicBatcher

log = logging.getLogger("service.engine")
#: Messages read (or replies forwarded) at once, without waiting, after each wake-up.
DRAIN = 256
#: Milliseconds the socket thread waits in the poller before it looks at ``stop`` again.
POLL_MS = 100
#: Seconds a stopping engine waits at most for the replies of what it had queued.
DRAIN_SECONDS = 60.0
#: The engine's thread switch interval: an inference thread whose ``Run`` has ended waits at most this long for the
#: GIL. Beside a busy Python thread, onnxruntime alone kept a quarter of its rows/s at Python's default of 5 ms and
#: three quarters at 0.5 ms (decision 0027). A process that serves in process keeps Python's default: there the
#: first GPU run could not tell the two apart (decision 0001).
ENGINE_SWITCH_INTERVAL_MS = 0.5


class EngineServer:
    """Serves ``batchers`` (by (model, version)) on ``endpoint`` until ``stop``; ``facts`` (by the same keys) are
    what a ``describe`` request learns of each: its provider and sessions, as ``runtime_facts`` gives them.

    No event loop: one thread (``run``'s) owns the ROUTER socket and waits in ``zmq.Poller`` with the GIL released,
    reads requests in bursts and queues them with ``DynamicBatcher.submit_nowait``; each inference thread encodes its
    batch's replies itself and pushes them over ``inproc://`` to that thread, which forwards them. The Python run per
    message is a decode, a queue append and a forward, so the inference threads rarely wait for the GIL.
    """

    def __init__(
        self,
        batchers: Mapping[tuple[str, str], DynamicBatcher],
        endpoint: str,
        facts: Mapping[tuple[str, str], dict] | None = None,
    ):
        self.batchers = dict(batchers)
        self.endpoint = endpoint
        self.facts = json.dumps([{"model": m, "version": v} | f for (m, v), f in (facts or {}).items()])
        self._stopping = threading.Event()
        self._context = zmq.Context()
        self._replies = f"inproc://engine-replies-{id(self)}"
        self._pushers = threading.local()

    def run(self) -> None:
        """Bind, start the batchers, answer until ``stop``; then finish what is queued and in flight, answering it."""
        router = self._context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 1000)
        router.bind(self.endpoint)
        replies = self._context.socket(zmq.PULL)
        replies.bind(self._replies)
        for batcher in self.batchers.values():
            batcher.start()
        log.info("engine serving %d model versions on %s", len(self.batchers), self.endpoint)
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(replies, zmq.POLLIN)
        outstanding = 0  # requests queued whose reply has not been forwarded yet
        draining, deadline = False, math.inf
        try:
            while not (draining and (outstanding <= 0 or time.monotonic() > deadline)):
                if self._stopping.is_set() and not draining:
                    draining = True  # read no more requests; answer those queued and in flight
                    deadline = time.monotonic() + DRAIN_SECONDS  # a reply lost to a failed callback ends the wait
                    poller.unregister(router)
                    for batcher in self.batchers.values():
                        batcher.close()
                events = dict(poller.poll(POLL_MS))
                if events.get(router):
                    outstanding += self._read(router)
                if events.get(replies):
                    outstanding -= _forward(replies, router)
        finally:
            for batcher in self.batchers.values():
                batcher.close()
                batcher.join()
            self._context.destroy(linger=1000)

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
        except Exception as exc:  # noqa: BLE001 - a malformed message must not stop the engine
            log.warning("dropped a malformed request: %s", exc)
            return 0
        if header.kind == "ping":
            router.send_multipart([identity, *wire.reply(header.seq, {})])
            return 0
        if header.kind == "describe":
            router.send_multipart([identity, *wire.described(header.seq, self.facts)])
            return 0
        batcher = self.batchers.get((header.model, header.version))
        try:
            if batcher is None:
                raise ModelNotFound(f"the engine serves no model {header.model!r} version {header.version!r}")
            if x is None:
                raise ValueError("an inference request without rows")
            batcher.submit_nowait(x, functools.partial(self._done, identity, header.seq))
        except Exception as exc:  # noqa: BLE001 - every request gets an answer
            if not isinstance(exc, REFUSALS):
                log.error("a request for %s failed before its batch: %r", header.model, exc)
            router.send_multipart([identity, *_failure(header.seq, exc)])
            return 0
        return 1

    def _done(self, identity: bytes, seq: int, outputs, timing, exc) -> None:
        """On an inference thread: the reply of one request, pushed to the socket thread."""
        if exc is None:
            frames = wire.reply(
                seq,
                outputs,
                batch_id=timing.batch_id,
                batch_rows=timing.batch_rows,
                queue_seconds=timing.queue_seconds,
                inference_seconds=timing.inference_seconds,
            )
        else:
            frames = _failure(seq, exc)  # the batcher logged a failed batch once, with its traceback
        pusher = getattr(self._pushers, "socket", None)
        if pusher is None:
            pusher = self._pushers.socket = self._context.socket(zmq.PUSH)
            pusher.connect(self._replies)
        pusher.send_multipart([identity, *frames])


def _forward(replies: zmq.Socket, router: zmq.Socket) -> int:
    """Send the replies the inference threads pushed, up to DRAIN; how many."""
    sent = 0
    for _ in range(DRAIN):
        try:
            frames = replies.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            break
        router.send_multipart(frames)
        sent += 1
    return sent


#: The errors that are answers (refusals the front-end maps to 4xx/503), not faults to log.
REFUSALS = (Overloaded, NotReady, ModelNotFound, ValueError)


def _failure(seq: int, exc: Exception) -> list:
    """The frames of a refusal or failure: the service's error kinds by name, anything else an ``error``."""
    if isinstance(exc, Overloaded):
        return wire.failure(seq, "overloaded", exc.message, int(exc.headers["Retry-After"]))
    if isinstance(exc, NotReady):
        return wire.failure(seq, "not_ready", exc.message, 1)
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
        "sessions": len(runtimes),
        "output_names": list(first.output_names),
    }


def repository_engine(settings) -> tuple[dict[tuple[str, str], DynamicBatcher], dict[tuple[str, str], dict]]:
    """A batcher over the raw graph outputs of every version the repository loads (sessions, buckets, warm-up), and
    the facts of its sessions."""
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
        )
        for m in repository.all()
    }
    return batchers, {(m.name, m.version): runtime_facts(m.runtimes) for m in repository.all()}


def serve_repository(endpoint: str, settings) -> None:
    """The engine of ``python -m service.engine``: the repository's batchers on ``endpoint`` until SIGTERM or
    SIGINT, with the thread switch interval ``ENGINE_SWITCH_INTERVAL_MS``."""
    sys.setswitchinterval(ENGINE_SWITCH_INTERVAL_MS / 1000)
    batchers, facts = repository_engine(settings)
    server = EngineServer(batchers, endpoint, facts)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: server.stop())
    server.run()


def main(argv: list[str] | None = None) -> None:
    from service.settings import Settings

    parser = argparse.ArgumentParser(prog="python -m service.engine", description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True, help="ZeroMQ endpoint to bind, e.g. ipc:///tmp/engine.sock")
    parser.add_argument("--artifacts", help="model repository (default: CALIB_ARTIFACTS or ./artifacts)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = Settings(**({"artifacts": args.artifacts} if args.artifacts else {}))
    serve_repository(args.endpoint, settings)
