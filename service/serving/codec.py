"""JSON in and out of the hot endpoints, without FastAPI's generic body handling.

FastAPI decodes bodies with the standard library, validates the response a second time against
``response_model`` and encodes it through ``jsonable_encoder``; on a small-model ``/predict`` that is
most of the request's CPU. Here bodies are decoded with orjson and validated once by pydantic, and
responses are plain dicts encoded by orjson. Errors are re-raised as FastAPI's own
``RequestValidationError`` so the one error mapping (``service.http_errors``) answers them exactly as
before (400 for a body that is not JSON, 422 naming the field). Such endpoints are declared to the
OpenAPI document by a separate contract route, so the document is unchanged.
"""

from __future__ import annotations

import json
import time
from typing import TypeVar

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.routing import Match, Route
from starlette.types import Scope

from service.errors import UnsupportedMediaType

Model = TypeVar("Model", bound=BaseModel)


class PlainRoute(Route):
    """A Starlette route to a plain ASGI endpoint, without FastAPI's per-request machinery (dependency
    solving, response re-validation: about 50 us a request). ``ServingMiddleware`` dispatches its
    method directly; through the router it answers the 405 of other methods. Like FastAPI's routes it
    records itself in the scope for per-route metrics."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        return match, (child | {"route": self}) if match != Match.NONE else child


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
    """OpenAPI ``requestBody`` of a route that reads its JSON body itself (``service.app`` adds ``model``
    to the document's components)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def respond(content, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """An orjson-encoded JSON response (numpy arrays allowed)."""
    return Response(
        orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY), status_code, headers, media_type="application/json"
    )


class Phases:
    """Wall time of the consecutive phases of one request, each observed in its histogram."""

    def __init__(self, histograms: dict):
        self.histograms = histograms
        self.last = time.perf_counter()

    def mark(self, phase: str) -> None:
        """End ``phase`` now (it began at the previous mark) and start the next one."""
        now = time.perf_counter()
        self.histograms[phase].observe(now - self.last)
        self.last = now
