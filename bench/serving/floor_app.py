"""The floor of a single-row request on the service's HTTP stack: a plain ASGI app on the same uvicorn that only
parses the row with the service's own parsers and answers a fixed body. Its CPU per request, with the client's,
bounds what any server on this stack can reach (``bench.serving.measure.ceiling``).

With ``FLOOR_MODEL`` (an ONNX file), the batching floor: each row also goes through the service's batcher to sessions
made as the service makes them, and nothing else (no scoring, log, metrics, middleware); ``GET /`` answers the rows
and calls it has run.

    FLOOR_MODEL=artifacts/cifar-resnet56/1/model.onnx python -m uvicorn bench.serving.floor_app:app --port 8001
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import orjson

from service.http.numeric_json import numeric_rows

ANSWER = orjson.dumps({"predictions": [{"label": "class0", "confidence": 0.1, "probabilities": [0.1] * 10}]})
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]
HEADER_LENGTH = b"inference-header-content-length"
PROBABILITIES = "probabilities"  # the output the batching floor answers (the exported graphs' name)


class BatchingFloor:
    """The service's batcher over sessions of ``path``; counts the rows and calls it runs."""

    def __init__(self, path: Path):
        from service.serving.batching import DynamicBatcher
        from service.serving.runtime import create_runtime
        from service.settings import Settings

        settings = Settings()
        sessions = settings.batching.sessions()
        runtimes = [create_runtime(path, settings, sessions) for _ in range(sessions)]
        self.row_shape = tuple(runtimes[0].session.get_inputs()[0].shape[1:])
        self.rows = self.calls = 0
        self.batcher = DynamicBatcher(
            [runtime.run for runtime in runtimes], settings.batching, "floor", on_batch=self._count
        )

    def _count(self, rows: int, _seconds: float) -> None:
        self.rows, self.calls = self.rows + rows, self.calls + 1

    async def answer(self, x: np.ndarray) -> bytes:
        outputs, _ = await self.batcher.submit(x.reshape(-1, *self.row_shape))
        return orjson.dumps({PROBABILITIES: outputs[PROBABILITIES]}, option=orjson.OPT_SERIALIZE_NUMPY)


floor: BatchingFloor | None = None


async def _lifespan(receive, send) -> None:
    global floor
    while (await receive())["type"] != "lifespan.shutdown":
        if os.environ.get("FLOOR_MODEL"):
            floor = BatchingFloor(Path(os.environ["FLOOR_MODEL"]))
            floor.batcher.start()
        await send({"type": "lifespan.startup.complete"})
    if floor is not None:
        await floor.batcher.stop()
    await send({"type": "lifespan.shutdown.complete"})


async def app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    raw = b"".join(chunks)
    answer = ANSWER
    if scope["method"] == "POST":
        split = dict(scope["headers"]).get(HEADER_LENGTH)
        if split is None:
            parsed = numeric_rows(raw, "inputs")
            if parsed is None:
                raise TypeError("the floor parses only the bodies that the service's numeric path takes")
            x = parsed[1].astype(np.float32)
        else:
            orjson.loads(raw[: int(split)])
            x = np.frombuffer(raw, dtype=np.float32, offset=int(split))
        if not np.isfinite(x).all():
            raise ValueError("the benchmark's rows are finite")
        if floor is not None:
            answer = await floor.answer(x)
    elif floor is not None:
        answer = orjson.dumps({"rows": floor.rows, "calls": floor.calls})
    headers = HEADERS if answer is ANSWER else [HEADERS[0], (b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})
