"""The frames between front-ends and the engine: a msgspec header, then each tensor's raw bytes as a frame; a ping's
reply carries the engine's progress, a ``describe``'s its model versions."""

from __future__ import annotations

import msgspec
import numpy as np

#: Statuses of a reply; every one but ``ok`` becomes the matching ``service.errors`` error at the front-end.
STATUSES = ("ok", "overloaded", "not_ready", "model_not_found", "invalid", "unavailable", "error")


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
    queued_rows: int = 0  # rows queued in the engine for the model when the reply left (a front-end's window)
    stalled_seconds: float = 0.0  # a ping's: how long the engine's longest-running batch has run so far


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


def request_seq(frames: list) -> int:
    """The sequence number of a request that cannot be read whole, for its error reply (0: unreadable)."""
    try:
        header = msgspec.msgpack.decode(frames[0])
        seq = header[0] if isinstance(header, list) and header else 0
        return seq if isinstance(seq, int) and not isinstance(seq, bool) else 0
    except Exception:  # noqa: BLE001 - any garbage: no sequence number
        return 0


def read_request(frames: list) -> tuple[Request, np.ndarray | None]:
    """The header and the rows (a read-only view of the frame) of a request."""
    header = _request.decode(frames[0])
    if header.rows is None:
        return header, None
    if len(frames) != 2:
        raise ValueError(f"an inference request has a header and one frame of rows, not {len(frames) - 1}")
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
