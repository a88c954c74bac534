"""JSON in and out of the fast handlers, without FastAPI's generic body handling.

Bodies are decoded with orjson and validated once by pydantic; responses are plain dicts encoded by orjson
(FastAPI would decode with the standard library, re-validate the response against ``response_model`` and
encode through ``jsonable_encoder``). Failures are raised as FastAPI's own ``RequestValidationError`` so that
the one error mapping (``service.http.errors``) answers them as for any route: 400 for a body that is not
JSON, 422 naming the field.
"""

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
    """The JSON value of a request body. Non-standard ``NaN``/``Infinity`` literals are accepted (as
    Python's json module does) so that they reach validation and get an error naming the field.
    Nesting deeper than orjson's limit (1,024) is invalid JSON here, never a ``RecursionError``."""
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
    """OpenAPI ``requestBody`` of a route that reads its JSON body itself (``service.http.routes`` adds
    ``model`` to the document's components)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def respond(content, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """An orjson-encoded JSON response (numpy arrays allowed)."""
    return Response(
        orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY), status_code, headers, media_type="application/json"
    )
