"""The frames between front-ends and the engine: a msgspec header, then each tensor's raw bytes as a frame.

Request: ``[header, rows]``, the header naming the model, version, dtype and shape of the rows. Reply:
``[header, output, ...]``, the header carrying the request's sequence number, a status, and per output its name,
dtype and shape, with the batch's facts (rows, queue wait, inference time, batch id). A ping is a request of kind
``ping`` without rows; its reply has status ``ok`` and no outputs. A ``describe`` request is answered with the
engine's model versions and their sessions (provider, outputs) as JSON in the reply's message.
"""

from __future__ import annotations

import msgspec
import numpy as np

#: Statuses of a reply; every one but ``ok`` becomes the matching ``service.errors`` error at the front-end.
STATUSES = ("ok", "overloaded", "not_ready", "model_not_found", "invalid", "error")


class Tensor(msgspec.Struct, array_like=True):
    name: str
    dtype: str
    shape: list[int]


class Request(msgspec.Struct, array_like=True):
    seq: int
    kind: str = "infer"
    model: str = ""
    version: str = ""
    rows: Tensor | None = None


class Reply(msgspec.Struct, array_like=True):
    seq: int
    status: str
    message: str = ""
    retry_after: int = 0
    outputs: list[Tensor] = []
    batch_id: int = 0
    batch_rows: int = 0
    queue_seconds: float = 0.0
    inference_seconds: float = 0.0


_request = msgspec.msgpack.Decoder(Request)
_reply = msgspec.msgpack.Decoder(Reply)
_encode = msgspec.msgpack.Encoder().encode


def request(seq: int, model: str, version: str, x: np.ndarray) -> list:
    """The frames of an inference request for the rows ``x``."""
    x = np.ascontiguousarray(x)
    header = Request(seq, "infer", model, version, Tensor("rows", x.dtype.str, list(x.shape)))
    return [_encode(header), x.data.cast("B")]


def ping(seq: int) -> list:
    return [_encode(Request(seq, "ping"))]


def describe(seq: int) -> list:
    """A request for the engine's models and their sessions (answered in the reply's message, as JSON)."""
    return [_encode(Request(seq, "describe"))]


def described(seq: int, facts: str) -> list:
    return [_encode(Reply(seq, "ok", facts))]


def read_request(frames: list) -> tuple[Request, np.ndarray | None]:
    """The header and the rows (a read-only view of the frame) of a request."""
    header = _request.decode(frames[0])
    if header.rows is None:
        return header, None
    return header, _array(header.rows, frames[1])


def reply(seq: int, outputs: dict[str, np.ndarray], **facts) -> list:
    """The frames of a successful reply: the outputs in order, with the batch's ``facts``."""
    arrays = {name: np.ascontiguousarray(value) for name, value in outputs.items()}
    tensors = [Tensor(name, a.dtype.str, list(a.shape)) for name, a in arrays.items()]
    return [_encode(Reply(seq, "ok", outputs=tensors, **facts)), *(a.data.cast("B") for a in arrays.values())]


def failure(seq: int, status: str, message: str, retry_after: int = 0) -> list:
    assert status in STATUSES and status != "ok"
    return [_encode(Reply(seq, status, message, retry_after))]


def read_reply(frames: list) -> tuple[Reply, dict[str, np.ndarray]]:
    """The header and the outputs by name of a reply."""
    header = _reply.decode(frames[0])
    return header, {t.name: _array(t, frame) for t, frame in zip(header.outputs, frames[1:])}


def _array(tensor: Tensor, frame) -> np.ndarray:
    return np.frombuffer(frame, dtype=np.dtype(tensor.dtype)).reshape(tensor.shape)
