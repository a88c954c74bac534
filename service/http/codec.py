"""JSON in and out of the fast handlers: bodies decoded by orjson and validated once by pydantic, responses plain
dicts encoded by orjson; failures are FastAPI's ``RequestValidationError``, answered as for any route."""

from __future__ import annotations

import json
from typing import TypeVar

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from service.errors import UnsupportedMediaType

Model = TypeVar("Model", bound=BaseModel)


MULTIPART = "multipart/form-data"


def media_type(request: Request, *supported: str) -> str:
    """The request's media type among ``supported`` (a missing Content-Type counts as the first, and
    ``application/*+json`` as JSON); 415 naming the supported types otherwise."""
    given = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if not given:
        return supported[0]
    if given.startswith("application/") and given.endswith("+json"):
        given = "application/json"
    if given not in supported:
        raise UnsupportedMediaType(f"Content-Type {given!r} is not supported; send {' or '.join(supported)}")
    return given


def decode(raw: bytes):
    """The JSON value of a request body; ``NaN``/``Infinity`` are accepted (as Python's json does) for validation
    to name, and nesting past orjson's limit is invalid JSON, never a ``RecursionError``."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise RequestValidationError([{"type": "json_invalid", "loc": ("body",), "msg": str(exc)}]) from None


def validate(model: type[Model], value) -> Model:
    """``value`` validated as ``model``; a failure is FastAPI's ``RequestValidationError`` located in the body."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


def json_body(model: type[BaseModel]) -> dict:
    """OpenAPI ``requestBody`` of a route that reads its JSON body itself."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def respond(content, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """An orjson-encoded JSON response (numpy arrays allowed)."""
    return Response(
        orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY), status_code, headers, media_type="application/json"
    )
