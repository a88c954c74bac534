"""Pure ASGI middleware (bodies streamed, the size limit on the bytes received): request ids, route-group tokens
before the body is read, the body size limit and per-route metrics."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Awaitable, Callable, Sequence

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.auth import AccessControl
from service.errors import PayloadTooLarge, ServiceError
from service.http.errors import error_response
from service.http.routes import RouteAccess
from service.metrics import ServiceMetrics

REQUEST_ID = "x-request-id"
_REQUEST_ID_HEADER = REQUEST_ID.encode()
_AUTHORIZATION = b"authorization"
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class ServingMiddleware:
    """Echo or assign ``X-Request-ID``, refuse requests without their group's token (401) or too large (413), count and
    time them by route template, and call the ``fast`` routes' handlers directly."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: ServiceMetrics,
        max_body_bytes: int,
        fast: Sequence[APIRoute] = (),
        access: AccessControl | None = None,
        groups: RouteAccess | None = None,
    ):
        self.app = app
        self.access = access
        if access is not None and groups is None:
            raise ValueError("token checks need the routes' access groups (RouteAccess)")
        self.groups = groups
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.fast = {
            (method, route.path): route
            for route in fast
            if not route.param_convertors
            for method in route.methods or ()
        }
        self.patterns = [route for route in fast if route.param_convertors]
        self._route_metrics: dict[tuple, tuple] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = declared = authorization = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = value
            elif name == _REQUEST_ID_HEADER:
                given = value.decode("latin-1")
            elif name == _AUTHORIZATION:
                authorization = value.decode("latin-1")
        # A tracing id, not a secret: drawn without a system call (os.urandom would hand the GIL to the
        # inference threads in the middle of every request and wait for it back)
        request_id = given if given and _SAFE_ID.match(given) else f"{random.getrandbits(128):032x}"
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        group = self.groups.of(scope["path"]) if self.groups is not None else None
        if self.access is not None and group is not None and group != "open":
            try:
                state["principal"] = self.access.check(group, authorization)
            except ServiceError as exc:
                await self._refuse(scope, send, request_id, exc, "<unauthorized>")
                return
        limit = self.max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            error = PayloadTooLarge(f"request body of {int(declared)} bytes exceeds the limit of {limit} bytes")
            await self._refuse(scope, send, request_id, error, "<rejected>")
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

        status = None  # until the response starts

        async def tagged_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (_REQUEST_ID_HEADER, request_id.encode())]
            await send(message)

        start = time.perf_counter()
        self.metrics.in_flight.inc()
        fast = self.fast.get((scope["method"], scope["path"])) or self._match(scope)
        try:
            if fast is None:
                await self.app(scope, limited_receive, tagged_send)
            else:
                scope["route"] = fast
                await self._serve(fast.endpoint, scope, limited_receive, tagged_send)
        finally:
            self.metrics.in_flight.dec()
            route = scope.get("route")
            template = getattr(route, "path", None) or "<unmatched>"
            counter, histogram = self._metrics_of(template, scope["method"], status or 500)
            counter.inc()
            histogram.observe(time.perf_counter() - start)

    def _match(self, scope: Scope) -> APIRoute | None:
        """The fast route with path parameters that fully matches the request, its parameters put in the scope."""
        for route in self.patterns:
            match, child = route.matches(scope)
            if match == Match.FULL:
                scope.update(child)
                return route
        return None

    @staticmethod
    async def _serve(handler: Callable[[Request], Awaitable[Response]], scope: Scope, receive: Receive, send: Send):
        """Answer with a fast route's handler; an error it raises answers through the one mapping."""
        try:
            response = await handler(Request(scope, receive))
        except Exception as exc:
            response = error_response(scope["path"], exc)
            if response.status_code == 500:
                raise
        await response(scope, receive, send)

    def _metrics_of(self, template: str, method: str, status: int) -> tuple:
        """The request counter and latency histogram of one route, method and status (looked up once)."""
        key = (template, method, status)
        found = self._route_metrics.get(key)
        if found is None:
            found = self._route_metrics[key] = (
                self.metrics.requests.labels(template, method, str(status)),
                self.metrics.latency.labels(template),
            )
        return found

    async def _refuse(self, scope: Scope, send: Send, request_id: str, error: ServiceError, route: str) -> None:
        """Answer a request refused before its body is read, counted under ``route``; the connection closes."""
        response = error_response(scope["path"], error)
        response.headers[REQUEST_ID] = request_id
        response.headers["connection"] = "close"

        async def nothing() -> Message:
            return {"type": "http.disconnect"}

        await response(scope, nothing, send)
        self.metrics.requests.labels(route, scope["method"], str(error.status)).inc()
