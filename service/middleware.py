"""Pure ASGI middleware: request ids, the request body size limit and per-route metrics.

Pure ASGI (not BaseHTTPMiddleware) so bodies are streamed, never buffered twice, and the limit
is enforced on the bytes actually received, chunked uploads included.
"""

from __future__ import annotations

import json
import re
import time
import os

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import PayloadTooLarge
from service.metrics import ServiceMetrics

REQUEST_ID = "x-request-id"
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class ServingMiddleware:
    """Echo or assign ``X-Request-ID``, refuse bodies over ``max_body_bytes`` with 413, and count
    requests and latency by route template (not raw path, which would explode label cardinality)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics, max_body_bytes: int):
        self.app = app
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        given = headers.get(REQUEST_ID.encode(), b"").decode("latin-1")
        request_id = given if _SAFE_ID.match(given) else os.urandom(16).hex()
        scope.setdefault("state", {})["request_id"] = request_id
        declared = headers.get(b"content-length")
        limit = self.max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._reject_too_large(scope, send, request_id, int(declared))
            return

        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise PayloadTooLarge(f"request body exceeds {limit} bytes")
            return message

        status = 500

        async def tagged_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (REQUEST_ID.encode(), request_id.encode())]
            await send(message)

        start = time.perf_counter()
        self.metrics.in_flight.inc()
        try:
            await self.app(scope, limited_receive, tagged_send)
        finally:
            self.metrics.in_flight.dec()
            route = scope.get("route")
            template = getattr(route, "path", None) or "<unmatched>"
            self.metrics.requests.labels(template, scope["method"], str(status)).inc()
            self.metrics.latency.labels(template).observe(time.perf_counter() - start)

    async def _reject_too_large(self, scope: Scope, send: Send, request_id: str, size: int) -> None:
        error = PayloadTooLarge(f"request body of {size} bytes exceeds the limit of {self.max_body_bytes} bytes")
        body = json.dumps(error.body()).encode()
        await send({"type": "http.response.start", "status": error.status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (REQUEST_ID.encode(), request_id.encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
        self.metrics.requests.labels("<rejected>", scope["method"], str(error.status)).inc()
