"""A service process in front of an engine (``CALIB_POD__ENGINE_ENDPOINT``): its models' inference goes to the engine.

The front-end loads every version's manifest and conformal scores as in process but opens no onnxruntime session,
so it never initialises CUDA. It batches its own concurrent requests as in process (``DynamicBatcher``, whose
inference threads score each batch and draw its sets); ``RemoteRuntime`` takes the place of the session: each batch
goes to the engine as one message and comes back as one, so the IPC and the per-batch work are paid once a batch,
not once a request, and the engine batches the front-ends' batches again. ``EngineBatcher`` is ready only while the
engine answers (``EngineClient``), and refuses at once when it does not.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import zmq

from service.engine import wire
from service.engine.client import EngineClient, error_of
from service.errors import EngineUnavailable
from service.serving.batching import DynamicBatcher

#: Milliseconds between checks of the engine's liveness while a batch waits for its reply.
POLL_MS = 20


class RemoteRuntime:
    """A version's sessions in the engine: their facts (``service.engine.server.runtime_facts``) for what the
    front-end shows, and ``run``, a blocking round trip of one batch on the calling thread's own socket."""

    def __init__(self, facts: dict, client: EngineClient, model: str, version: str):
        self.provider: str = facts["provider"]
        self.requested: list[str] = facts["requested"]
        self.output_names: list[str] = facts["output_names"]
        self.io_binding: bool = facts["io_binding"]
        self.buckets: tuple[int, ...] = tuple(facts["buckets"])
        self.bucket_sessions: dict = {b: None for b in facts["buckets"]} if facts["bucket_sessions"] else {}
        self.client, self.model, self.version = client, model, version
        self._local = threading.local()
        self._seq = itertools.count(1)

    def run(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """The batch's outputs from the engine; ``EngineUnavailable`` as soon as the engine is seen down."""
        socket = self._socket()
        seq = next(self._seq)
        socket.send_multipart(wire.request(seq, self.model, self.version, x))
        while True:
            if socket.poll(POLL_MS):
                header, outputs = wire.read_reply(socket.recv_multipart())
                if header.seq != seq:
                    continue  # the reply to a batch given up on earlier
                if header.status != "ok":
                    raise error_of(header)
                return outputs
            if not self.client.ready:
                raise EngineUnavailable(f"the engine at {self.client.endpoint} stopped answering; retry shortly")

    def _socket(self) -> zmq.Socket:
        socket = getattr(self._local, "socket", None)
        if socket is None:
            socket = self._local.socket = zmq.Context.instance().socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(self.client.endpoint)
        return socket


class EngineBatcher(DynamicBatcher):
    """The in-process batcher over ``RemoteRuntime``: ready while the engine answers, refusing at once otherwise."""

    def __init__(self, client: EngineClient, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.client = client

    @property
    def ready(self) -> bool:
        return super().ready and self.client.ready

    async def submit(self, x: np.ndarray):
        if not self.client.ready:
            raise EngineUnavailable(f"the engine at {self.client.endpoint} is not answering; retry shortly")
        return await super().submit(x)
