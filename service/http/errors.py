"""The one mapping of errors to HTTP responses (under ``/v2`` as the v2 protocol specifies); a 500 tells nothing."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.errors import InvalidInput, ServiceError, field_path

log = logging.getLogger("service")
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


def _error(
    path: str, status: int, code: str, message: str, field: str | None = None, headers: dict | None = None
) -> JSONResponse:
    if path.startswith("/v2"):
        status = 400 if status == 422 else status
        return JSONResponse({"error": f"{field}: {message}" if field else message}, status, headers=headers)
    error = {"code": code, "message": message} | ({"field": field} if field else {})
    return JSONResponse({"error": error}, status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error through ``error_response``, logging the unexpected ones."""

    async def mapped(request: Request, exc: Exception):
        return error_response(request.url.path, exc)

    for kind in (ServiceError, RequestValidationError, StarletteHTTPException):
        app.add_exception_handler(kind, mapped)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(request.url.path, exc)
