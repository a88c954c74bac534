"""Every HTTP route of the service, declared once.

``ROUTES`` is the one table (the shape of MLServer's ``rest/app.py``): path, handler, methods, who may call it
(``access``: the token group ``predict``, ``feedback`` or ``admin``, or ``open``) and what the OpenAPI document
says of the route. ``RouteAccess`` reads the groups from the table alone, and an app with a route that declares
none does not start (``RouteAccess.of_app``). ``api_routes`` turns it into FastAPI routes, which serve the requests
and give the document. A fast route's handler takes the request and returns the response itself (JSON by
``service.http.codec``); ``ServingMiddleware`` calls it directly, past FastAPI's dependency solving and
response validation, and the router keeps the route for the 405 of other methods and for the document.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Response
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.routing import BaseRoute, compile_path

from service.auth import ACCESS, Access
from service.http import dashboard, inference, monitoring, v2
from service.http.codec import MULTIPART, json_body
from service.schemas import (
    ActivateRequest,
    ActivateResponse,
    CalibrationReport,
    ErrorResponse,
    FeedbackRequest,
    FeedbackResponse,
    HealthResponse,
    HistoryResponse,
    ModelsResponse,
    PredictRequest,
    PredictResponse,
    RecalibrateRequest,
    RecalibrateResponse,
    TimelineResponse,
    UnmatchedLabels,
)
from service.serving.v2_protocol import (
    V2Error,
    V2InferenceRequest,
    V2InferenceResponse,
    V2ModelMetadata,
    V2ServerMetadata,
)

PREDICT_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "request body is not valid JSON"},
    404: {"model": ErrorResponse, "description": "unknown model or version"},
    413: {"model": ErrorResponse, "description": "request body too large"},
    415: {"model": ErrorResponse, "description": "Content-Type is neither application/json nor multipart/form-data"},
    422: {"model": ErrorResponse, "description": "invalid request: the error names the field"},
    503: {"model": ErrorResponse, "description": "overloaded (see Retry-After) or not ready"},
}
MONITORING_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 404, 413, 422, 503)
}
ADMIN_ERRORS = MONITORING_ERRORS | {401: {"model": ErrorResponse}, 403: {"model": ErrorResponse}}
V2_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": V2Error} for code in (400, 404, 413, 503)}

UPLOAD = {
    "type": "object",
    "required": ["file"],
    "properties": {
        "file": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "format": "binary"},
            "description": "PNG or JPEG images, one row each, in the polarity the model was trained on",
        },
        **{name: {"type": "string"} for name in ("model", "version", "top_k", "return_logits", "return_uncalibrated")},
    },
}
# The binary tensor extension cannot be written as an OpenAPI body (a header gives the split of the bytes),
# so the document declares the JSON form and says how to send the binary one.
BINARY_TENSORS = (
    "JSON, or with the binary tensor data extension: the JSON header followed by the raw tensor bytes, the "
    "header's length in bytes given by the Inference-Header-Content-Length header (as tritonclient.http sends)."
)
TEXT: dict[int | str, dict[str, Any]] = {200: {"content": {"text/plain": {"schema": {"type": "string"}}}}}
HTML: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the calibration dashboard (one self-contained HTML page)",
        "content": {"text/html": {"schema": {"type": "string"}}},
    }
}


#: The routes FastAPI adds itself (the OpenAPI document and its viewers): open.
FRAMEWORK_ROUTES: dict[str, Access] = {p: "open" for p in ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")}


@dataclass(frozen=True)
class Route:
    """One route: where, which handler, who may call it and what the OpenAPI document says of it.

    ``access``: required; a route that declares none (or an unknown group) is refused when the table is built.

    ``fast``: the handler takes the ``Request`` and returns the ``Response`` (``ServingMiddleware`` calls it).
    ``body``: the JSON body a handler reads itself (the document shows it; FastAPI does not parse it), with
    ``body_alternatives``: other media types of the same body. ``description``: in place of the handler's
    docstring (when one handler serves routes that the document tells apart)."""

    path: str
    handler: Callable[..., Awaitable[Any]]
    methods: tuple[str, ...] = ("GET",)
    fast: bool = False
    body: type[BaseModel] | None = None
    body_description: str | None = None
    body_alternatives: dict[str, dict] = field(default_factory=dict)
    response_model: Any = None
    responses: dict[int | str, dict[str, Any]] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    response_class: type[Response] | None = None
    description: str | None = None
    access: Access | None = None

    def __post_init__(self) -> None:
        if self.access not in ACCESS:
            raise ValueError(
                f"route {self.path} declares no access group (access={self.access!r}): give one of {list(ACCESS)}"
            )

    def api_route(self) -> APIRoute:
        extra: dict[str, Any] = {}
        if self.body is not None:
            extra = json_body(self.body)
            extra["requestBody"]["content"] |= self.body_alternatives
            if self.body_description:
                extra["requestBody"]["description"] = self.body_description
        parameters = re.findall(r"{(\w+)}", self.path)
        if self.fast and parameters:  # read by the handler from the request, so FastAPI does not see them
            extra["parameters"] = [
                {"name": name, "in": "path", "required": True, "schema": {"type": "string", "title": name.title()}}
                for name in parameters
            ]
        given = {
            "response_model": self.response_model,  # when None, FastAPI takes the handler's return annotation
            "response_class": self.response_class,
            "responses": self.responses,
            "tags": list(self.tags),
            "description": self.description,
            "openapi_extra": extra,
        }
        options = {name: value for name, value in given.items() if value}
        return APIRoute(self.path, self.handler, methods=list(self.methods), **options)


ROUTES = [
    Route(
        "/predict",
        inference.predict,
        ("POST",),
        fast=True,
        body=PredictRequest,
        body_alternatives={MULTIPART: {"schema": UPLOAD}},
        response_model=PredictResponse,
        responses=PREDICT_ERRORS,
        tags=("inference",),
        access="predict",
    ),
    Route("/models", inference.models, response_model=ModelsResponse, tags=("models",), access="open"),
    Route(
        "/health",
        inference.health,
        response_model=HealthResponse,
        responses={503: {"model": HealthResponse}},
        tags=("health",),
        access="open",
    ),
    Route("/metrics", inference.metrics, response_class=Response, responses=TEXT, tags=("health",), access="open"),
    Route(
        "/feedback",
        monitoring.feedback,
        ("POST",),
        fast=True,
        body=FeedbackRequest,
        response_model=FeedbackResponse,
        responses=MONITORING_ERRORS,
        tags=("monitoring",),
        access="feedback",
    ),
    Route(
        "/feedback/unmatched",
        monitoring.unmatched_labels,
        response_model=UnmatchedLabels,
        responses=MONITORING_ERRORS,
        tags=("monitoring",),
        access="feedback",
    ),
    Route(
        "/calibration",
        monitoring.calibration,
        response_model=CalibrationReport,
        responses=MONITORING_ERRORS,
        tags=("monitoring",),
        access="open",
    ),
    Route(
        "/calibration/reliability.png",
        monitoring.reliability_png,
        responses=MONITORING_ERRORS | {200: {"content": {"image/png": {}}}},
        response_class=Response,
        tags=("monitoring",),
        access="open",
    ),
    Route(
        "/calibration/timeline",
        monitoring.timeline,
        response_model=TimelineResponse,
        responses=MONITORING_ERRORS,
        tags=("monitoring",),
        access="open",
    ),
    Route(
        "/calibration/history",
        monitoring.history,
        response_model=HistoryResponse,
        responses=MONITORING_ERRORS,
        tags=("monitoring",),
        access="open",
    ),
    Route(
        "/admin/recalibrate",
        monitoring.recalibrate,
        ("POST",),
        body=RecalibrateRequest,
        response_model=RecalibrateResponse,
        responses=ADMIN_ERRORS,
        tags=("monitoring", "admin"),
        access="admin",
    ),
    Route(
        "/admin/calibration/activate",
        monitoring.activate,
        ("POST",),
        body=ActivateRequest,
        response_model=ActivateResponse,
        responses=ADMIN_ERRORS,
        tags=("monitoring", "admin"),
        access="admin",
    ),
    Route(
        "/dashboard",
        dashboard.dashboard,
        response_class=HTMLResponse,
        responses=HTML,
        tags=("dashboard",),
        access="open",
    ),
    Route("/v2", v2.server, response_model=V2ServerMetadata, tags=("v2",), access="open"),
    Route(
        "/v2/health/live", v2.live, responses={200: {"content": {"application/json": {}}}}, tags=("v2",), access="open"
    ),
    Route("/v2/health/ready", v2.ready, responses={503: {"model": V2Error}}, tags=("v2",), access="open"),
    *(
        Route(model + path, handler, response_model=answer, responses=V2_ERRORS, tags=("v2",), access="open")
        for path, handler, answer in (("", v2.model_metadata, V2ModelMetadata), ("/ready", v2.model_ready, None))
        for model in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}")
    ),
    *(
        Route(
            path,
            v2.infer,
            ("POST",),
            fast=True,
            body=V2InferenceRequest,
            body_description=BINARY_TENSORS,
            response_model=V2InferenceResponse,
            responses=V2_ERRORS,
            tags=("v2",),
            access="predict",
            description=f"Inference in the Open Inference Protocol v2 on {on}, JSON or with binary tensors.",
        )
        for path, on in (
            ("/v2/models/{name}/infer", "the model's latest version"),
            ("/v2/models/{name}/versions/{version}/infer", "one version of the model"),
        )
    ),
]


def api_routes() -> tuple[list[BaseRoute], list[APIRoute]]:
    """The table as FastAPI routes in its order, and those of them whose handlers the middleware calls."""
    built = [(route, route.api_route()) for route in ROUTES]
    return [api for _, api in built], [api for route, api in built if route.fast]


class RouteAccess:
    """The access group of a request's path, read from the route table alone: one dict lookup for a path without
    parameters, then the patterns of the others. A path that no route serves has none (the router answers 404);
    every route of a path shares its group, whatever the method (a wrong method is refused like a right one)."""

    def __init__(self, routes: Iterable[tuple[str, Access]]) -> None:
        by_path: dict[str, Access] = {}
        for path, access in routes:
            if by_path.setdefault(path, access) != access:
                raise ValueError(f"the routes of {path} declare two access groups: {by_path[path]} and {access}")
        self.exact = {path: access for path, access in by_path.items() if "{" not in path}
        self.patterns = [(compile_path(path)[0], access) for path, access in by_path.items() if "{" in path]

    @classmethod
    def of_app(cls, app: FastAPI) -> RouteAccess:
        """The groups of every route the app serves: the table's and FastAPI's own (``FRAMEWORK_ROUTES``). A route of
        the app that is in neither stops the start (fail closed)."""
        declared = {route.path: route.access for route in ROUTES} | FRAMEWORK_ROUTES
        paths = [getattr(route, "path", None) for route in app.routes]
        missing = [p for p in paths if p is None or p not in declared]
        if missing:
            raise RuntimeError(f"routes without an access group (declare one in service.http.routes): {missing}")
        return cls([(route.path, route.access) for route in ROUTES if route.access] + list(FRAMEWORK_ROUTES.items()))

    def of(self, path: str) -> Access | None:
        """The group of ``path``; None when no route serves it."""
        access = self.exact.get(path)
        if access is None:
            access = next((a for pattern, a in self.patterns if pattern.match(path)), None)
        return access


def openapi(app: FastAPI) -> dict[str, Any]:
    """The generated document, with the schemas of the bodies that handlers read themselves."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in dict.fromkeys(route.body for route in ROUTES if route.body is not None):
        definition = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, nested in definition.pop("$defs", {}).items():
            components.setdefault(name, nested)
        components[model.__name__] = definition
    app.openapi_schema = schema
    return schema
