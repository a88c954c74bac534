"""A service process in front of an engine (``CALIB_POD__ENGINE_ENDPOINT``): no onnxruntime session, its batches go
to the engine as one message each through ``RemoteRuntime``, and the engine batches them again."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import numpy as np
import zmq

from service.engine import wire
from service.engine.client import EngineClient, error_of
from service.errors import DeadlineExceeded, EngineUnavailable
from service.serving.batching import DynamicBatcher
from service.settings import BatchingConfig

#: Milliseconds between checks of the engine's liveness while a batch waits for its reply.
POLL_MS = 20
#: A front-end's batches in flight to the engine per model version at first; then ``EngineBatcher`` adapts it.
FIRST_WINDOW = 2

QueueObserver = Callable[[float, int], None]
"""Called with the engine's queue wait of a batch's message and the rows queued in the engine when it was answered."""


class RemoteRuntime:
    """A version's sessions in the engine: their facts (``runtime_facts``) and ``run``, a blocking round trip of one
    batch on the calling thread's own socket, given up after ``deadline`` seconds (a late reply is dropped)."""

    def __init__(self, facts: dict, client: EngineClient, model: str, version: str, deadline: float = 30.0):
        self.provider: str = facts["provider"]
        self.requested: list[str] = facts["requested"]
        self.output_names: list[str] = facts["output_names"]
        self.io_binding: bool = facts["io_binding"]
        self.buckets: tuple[int, ...] = tuple(facts["buckets"])
        self.bucket_sessions: dict = {b: None for b in facts["buckets"]} if facts["bucket_sessions"] else {}
        self.cuda_graphs: bool = facts.get("cuda_graphs", False)
        self.graph_fallback: str = facts.get("graph_fallback", "")
        self.warmup_seconds: float = facts.get("warmup_seconds", 0.0)
        self.staging_bytes: int = facts.get("staging_bytes", 0)
        self.sessions: int = facts["sessions"]
        self.client, self.model, self.version = client, model, version
        self.deadline = deadline
        self.on_reply: QueueObserver | None = None
        self._local = threading.local()
        self._seq = itertools.count(1)

    def run(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """The batch's outputs from the engine; ``EngineUnavailable`` once it is seen down, or ``DeadlineExceeded``."""
        socket = self._socket()
        seq = next(self._seq)
        given_up = time.monotonic() + self.deadline
        try:
            socket.send_multipart(wire.request(seq, self.model, self.version, x))
        except zmq.Again:
            raise EngineUnavailable(
                f"the engine at {self.client.endpoint} is not taking requests; retry shortly"
            ) from None
        while True:
            if socket.poll(POLL_MS):
                header, outputs = wire.read_reply(socket.recv_multipart())
                if header.seq != seq:
                    continue  # the reply to a batch given up on earlier
                if header.status != "ok":
                    raise error_of(header)
                if self.on_reply is not None:
                    self.on_reply(header.queue_seconds, header.queued_rows)
                return outputs
            if not self.client.ready:
                raise EngineUnavailable(f"the engine at {self.client.endpoint} stopped answering; retry shortly")
            if time.monotonic() > given_up:
                raise DeadlineExceeded(
                    f"model {self.model}: the engine gave no outputs within the {self.deadline:g} s deadline; "
                    "retry shortly"
                )

    def _socket(self) -> zmq.Socket:
        socket = getattr(self._local, "socket", None)
        if socket is None:
            socket = self._local.socket = zmq.Context.instance().socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.SNDTIMEO, int(self.deadline * 1000))  # no peer: a send would wait for one
            socket.connect(self.client.endpoint)
        return socket


class EngineBatcher(DynamicBatcher):
    """The in-process batcher over a ``RemoteRuntime``, ready while the engine answers. Its ``window`` follows the
    engine's queue as a congestion window does: widened by one when none is queued there, narrowed at a full batch."""

    def __init__(
        self,
        remote: RemoteRuntime,
        config: BatchingConfig,
        name: str,
        retry_after: int = 1,
        on_queue_wait: Callable[[float], None] | None = None,
        max_window: int = FIRST_WINDOW,
        **options,
    ):
        super().__init__([remote.run] * max_window, config, name, retry_after, **options)
        self.client = remote.client
        self.window = min(FIRST_WINDOW, max_window)
        self._full = config.max_batch_size
        self._on_queue_wait = on_queue_wait
        remote.on_reply = self._replied

    @property
    def ready(self) -> bool:
        return super().ready and self.client.ready

    async def submit(self, x: np.ndarray):
        if not self.client.ready:
            raise EngineUnavailable(f"the engine at {self.client.endpoint} is not answering; retry shortly")
        return await super().submit(x)

    def _replied(self, queue_seconds: float, queued_rows: int) -> None:
        """On an inference thread, after each reply: observe the engine's queue wait and adapt the window."""
        if self._on_queue_wait is not None:
            self._on_queue_wait(queue_seconds)
        if queued_rows == 0 and self.queued_rows > 0:
            self.set_window(self.window + 1)
        elif queued_rows >= self._full:
            self.set_window(self.window - 1)
