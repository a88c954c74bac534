"""A front-end's ZeroMQ DEALER connection to the engine; a dropped connection or ``dead_after`` seconds without a ping
answer fails every waiting and new request with ``EngineUnavailable`` until the engine answers again."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time

import numpy as np
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from service.engine import wire
from service.errors import EngineUnavailable, InvalidInput, ModelNotFound, NotReady, Overloaded, ServiceError
from service.serving.batching import Timing


class EngineClient:
    """``await submit(model, version, x)`` -> (outputs by name, the batch's ``Timing``); see the module docstring."""

    def __init__(self, endpoint: str, heartbeat: float = 0.2, dead_after: float = 1.0, max_in_flight: int = 100_000):
        self.endpoint = endpoint
        self.heartbeat = heartbeat
        self.dead_after = dead_after
        self.max_in_flight = max_in_flight
        self._seq = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._last_answer = 0.0
        self._connected = False
        self._tasks: list[asyncio.Task] = []
        self._socket: zmq.asyncio.Socket | None = None
        self.batches_run = 0  # the engine's progress, as its last ping reported it
        self.stalled_seconds = 0.0

    @property
    def ready(self) -> bool:
        """Connected, and the engine answered within ``dead_after`` seconds."""
        return self._connected and time.monotonic() - self._last_answer < self.dead_after

    async def start(self, wait: float = 0.0) -> None:
        """Connect; with ``wait`` > 0, wait that long at most for the engine's first answer."""
        socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        monitor = socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        socket.connect(self.endpoint)
        self._socket = socket
        self._tasks = [
            asyncio.ensure_future(self._receive(socket)),
            asyncio.ensure_future(self._watch(monitor)),
            asyncio.ensure_future(self._ping(socket)),
        ]
        deadline = time.monotonic() + wait
        while wait > 0 and not self.ready:
            if time.monotonic() > deadline:
                raise EngineUnavailable(f"the engine at {self.endpoint} did not answer within {wait:g} s")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fail_all("the front-end is shutting down")
        if self._socket is not None:
            self._socket.disable_monitor()
            self._socket.close()

    async def submit(self, model: str, version: str, x: np.ndarray) -> tuple[dict[str, np.ndarray], Timing]:
        """Send the rows and wait for their outputs."""
        return await self._ask(lambda seq: wire.request(seq, model, version, x))

    async def describe(self) -> list[dict]:
        """The engine's model versions and their sessions (``service.engine.server.runtime_facts``)."""
        return await self._ask(wire.describe)

    async def _ask(self, frames):
        """Send ``frames(seq)`` under a new sequence number and wait for its reply (``_receive`` routes it)."""
        if self._socket is None or not self.ready:
            raise EngineUnavailable(f"the engine at {self.endpoint} is not answering; retry shortly")
        if len(self._pending) >= self.max_in_flight:
            raise Overloaded(f"{len(self._pending)} requests are waiting for the engine", retry_after=1)
        seq = next(self._seq)
        future = asyncio.get_running_loop().create_future()
        self._pending[seq] = future
        try:
            await self._socket.send_multipart(frames(seq), flags=zmq.NOBLOCK)
        except zmq.Again:
            self._pending.pop(seq, None)
            raise EngineUnavailable(f"the engine at {self.endpoint} is not taking requests; retry shortly") from None
        return await future

    async def _receive(self, socket) -> None:
        while True:
            frames = await socket.recv_multipart()
            header, outputs = wire.read_reply(frames)
            self._last_answer = time.monotonic()
            if header.seq == 0:  # a ping's answer (or the engine's error reply to a message it could not read)
                if header.status == "ok":
                    self.batches_run, self.stalled_seconds = header.batch_id, header.stalled_seconds
                continue
            future = self._pending.pop(header.seq, None)
            if future is None or future.done():
                continue  # a request that already failed
            if header.status == "ok" and header.message:  # a describe request's answer
                future.set_result(json.loads(header.message))
            elif header.status == "ok":
                timing = Timing(header.queue_seconds, header.inference_seconds, header.batch_rows, header.batch_id)
                future.set_result((outputs, timing))
            else:
                future.set_exception(error_of(header))

    async def _watch(self, monitor) -> None:
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            if event["event"] == zmq.EVENT_CONNECTED:
                # the engine binds once its models are loaded and warm: a connection is an engine that serves
                self._connected, self._last_answer = True, time.monotonic()
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._connected = False
                self._fail_all("the engine's connection dropped (the engine process ended)")

    async def _ping(self, socket) -> None:
        while True:
            if self._connected:
                with contextlib.suppress(zmq.Again):
                    await socket.send_multipart(wire.ping(0), flags=zmq.NOBLOCK)
            await asyncio.sleep(self.heartbeat)
            if self._pending and time.monotonic() - self._last_answer > self.dead_after:
                self._fail_all(f"the engine has not answered for {self.dead_after:g} s")

    def _fail_all(self, why: str) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(EngineUnavailable(f"{why}; retry shortly"))


def error_of(header: wire.Reply) -> ServiceError:
    """The ``service.errors`` error of a failed reply."""
    if header.status == "overloaded":
        return Overloaded(header.message, retry_after=max(header.retry_after, 1))
    if header.status == "not_ready":
        return NotReady(header.message)
    if header.status == "unavailable":
        return EngineUnavailable(header.message, retry_after=max(header.retry_after, 1))
    if header.status == "model_not_found":
        return ModelNotFound(header.message, field="model")
    if header.status == "invalid":
        return InvalidInput(header.message, field="inputs")
    return ServiceError(header.message)
