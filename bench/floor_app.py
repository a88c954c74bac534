"""The floor of a single-row request on the service's HTTP stack: a plain ASGI app on the same uvicorn
(uvloop, httptools) that does only what any server of these requests must do, and no inference. It
reads the body, turns the row into a checked float32 array with the service's own parsers (JSON
through ``service.serving.numeric_json``, v2 binary tensors through ``numpy.frombuffer`` after the JSON
header) and answers a fixed small body. Its CPU per request, with the client's, bounds what any
server on this stack can reach against onnxruntime alone (``bench.serving.ceiling``).

    python -m uvicorn bench.floor_app:app --port 8001
"""

from __future__ import annotations

import numpy as np
import orjson

from service.serving.numeric_json import numeric_rows

ANSWER = orjson.dumps({"predictions": [{"label": "class0", "confidence": 0.1, "probabilities": [0.1] * 10}]})
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]
HEADER_LENGTH = b"inference-header-content-length"


async def app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    raw = b"".join(chunks)
    if scope["method"] == "POST":
        split = dict(scope["headers"]).get(HEADER_LENGTH)
        if split is None:
            x = numeric_rows(raw, "inputs")[1].astype(np.float32)
        else:
            orjson.loads(raw[:int(split)])
            x = np.frombuffer(raw, dtype=np.float32, offset=int(split))
        if not np.isfinite(x).all():
            raise ValueError("the benchmark's rows are finite")
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})
