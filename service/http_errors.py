"""The one mapping of errors to HTTP responses, used by the app's exception handlers and by the
middleware's direct dispatch of plain routes.

Errors of the service's own API are ``{"error": {"code", "message", "field"}}``; errors under
``/v2`` are ``{"error": "..."}`` with status 400 for bad input, as the v2 protocol specifies.
Anything else is a JSON 500 that tells nothing about the internals (the caller logs it).
"""

from __future__ import annotations

import re

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.errors import InvalidInput, ServiceError

_TYPE_TAG = re.compile(r"^(str|int|float|bool|list|dict|none|[a-z-]+\[.*\])$")
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def error_response(path: str, exc: Exception) -> JSONResponse:
    """The response for ``exc`` raised while serving ``path``."""
    if isinstance(exc, StarletteHTTPException) and isinstance(exc.__cause__, ServiceError):
        exc = exc.__cause__  # raised while FastAPI read the body (size limit)
    if isinstance(exc, ServiceError):
        return _error(path, exc.status, exc.code, exc.message, exc.field, exc.headers)
    if isinstance(exc, RequestValidationError):
        errors = exc.errors()
        first = errors[0]
        if first.get("type") == "json_invalid":
            return _error(path, 400, "invalid_json", f"request body is not valid JSON: {first.get('msg')}", "body")
        problems = "; ".join(dict.fromkeys(f"{field_path(e['loc'])}: {e['msg']}" for e in errors[:5]))
        return _error(path, 422, InvalidInput.code, problems, field_path(first["loc"]))
    if isinstance(exc, StarletteHTTPException):
        return _error(
            path,
            exc.status_code,
            _HTTP_CODES.get(exc.status_code, "http_error"),
            str(exc.detail),
            headers=getattr(exc, "headers", None),
        )
    return _error(path, 500, "internal_error", "internal error; see the server log")


def field_path(loc: tuple) -> str:
    """A JSON path like ``items[0].label`` from a pydantic location (union-member tags dropped)."""
    parts = [str(p) for p in loc if p not in ("body", "query", "path") and not _TYPE_TAG.match(str(p))]
    out = ""
    for part in parts:
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out or "body"


def _error(
    path: str, status: int, code: str, message: str, field: str | None = None, headers: dict | None = None
) -> JSONResponse:
    if path.startswith("/v2"):
        status = 400 if status == 422 else status
        return JSONResponse({"error": f"{field}: {message}" if field else message}, status, headers=headers)
    error = {"code": code, "message": message} | ({"field": field} if field else {})
    return JSONResponse({"error": error}, status, headers=headers)
