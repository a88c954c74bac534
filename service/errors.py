"""Typed errors of the service, mapped to HTTP responses in one place (``service.http.errors``); each names the
field (a JSON path into the request) and the problem, so a client can fix its request without the server's logs."""

from __future__ import annotations

import re

_TYPE_TAG = re.compile(r"^(str|int|float|bool|list|dict|none|[a-z-]+\[.*\])$")


class ServiceError(Exception):
    """Base class: an HTTP status, a machine-readable code, a message and an optional field."""

    status = 500
    code = "internal_error"

    def __init__(self, message: str, field: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.headers = headers or {}

    def body(self) -> dict:
        """The JSON error body of the service's own API."""
        error = {"code": self.code, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        return {"error": error}


class InvalidInput(ServiceError):
    """The request is well-formed JSON but its content cannot be served (shape, dtype, values, image)."""

    status = 422
    code = "invalid_input"


class UnsupportedMediaType(ServiceError):
    """The body's Content-Type is not one the endpoint reads."""

    status = 415
    code = "unsupported_media_type"

    def __init__(self, message: str):
        super().__init__(message, field="headers.content-type")


class Unauthorized(ServiceError):
    """A request to a route group that takes tokens, without a valid one (``service.auth``)."""

    status = 401
    code = "unauthorized"

    def __init__(self, message: str, challenge: str = "Bearer"):
        super().__init__(message, headers={"WWW-Authenticate": challenge})


class Forbidden(ServiceError):
    """Admin endpoints are disabled (no admin token)."""

    status = 403
    code = "admin_disabled"


class ModelNotFound(ServiceError):
    """No such model or version in the repository."""

    status = 404
    code = "model_not_found"


class PayloadTooLarge(ServiceError):
    """The request body exceeds ``max_body_bytes``."""

    status = 413
    code = "payload_too_large"


class RetryLater(ServiceError):
    """A 503 that tells the client when to retry (``Retry-After``, in seconds)."""

    status = 503

    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(message, headers={"Retry-After": str(retry_after)})


class Overloaded(RetryLater):
    """The batching queue is full: retry after the given number of seconds."""

    code = "overloaded"


class NotReady(ServiceError):
    """The service or model is not ready (starting, shutting down, or no model loaded)."""

    status = 503
    code = "not_ready"


class EngineUnavailable(RetryLater):
    """The inference engine process is down or not answering (``service.engine``): retry once it is back."""

    code = "engine_unavailable"


class DeadlineExceeded(RetryLater):
    """A request's outputs did not come within its model's ``deadline_seconds``: retry shortly (as Triton's)."""

    code = "deadline_exceeded"


class StorageUnavailable(RetryLater):
    """The database cannot be reached: retry later."""

    code = "storage_unavailable"


def field_path(loc: tuple) -> str:
    """A JSON path like ``items[0].label`` from a pydantic location (union-member tags dropped)."""
    parts = [str(p) for p in loc if p not in ("body", "query", "path") and not _TYPE_TAG.match(str(p))]
    out = ""
    for part in parts:
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out or "body"
