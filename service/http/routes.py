"""Every HTTP route of the service, declared once in ``ROUTES`` (as MLServer's ``rest/app.py``); an app with a route
that does not say who may call it does not start.
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


Handler = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    """One route: where, which handler, who may call it (``access``) and what the OpenAPI document says of it; a
    ``fast`` handler takes the ``Request`` and returns the ``Response``."""

    path: str
    handler: Handler
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


def _monitoring(path: str, handler: Handler, answer: Any = None, access: Access = "open", **options: Any) -> Route:
    """A route of the monitoring API with its error bodies and tags (an admin route's: 401 and 403 too, and the admin
    tag), unless ``options`` give others."""
    admin = access == "admin"
    given = {
        "responses": ADMIN_ERRORS if admin else MONITORING_ERRORS,
        "tags": ("monitoring", "admin") if admin else ("monitoring",),
    }
    return Route(path, handler, response_model=answer, access=access, **(given | options))


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
    _monitoring(
        "/feedback",
        monitoring.feedback,
        FeedbackResponse,
        "feedback",
        methods=("POST",),
        fast=True,
        body=FeedbackRequest,
    ),
    _monitoring("/feedback/unmatched", monitoring.unmatched_labels, UnmatchedLabels, "feedback"),
    _monitoring("/calibration", monitoring.calibration, CalibrationReport),
    _monitoring(
        "/calibration/reliability.png",
        monitoring.reliability_png,
        responses=MONITORING_ERRORS | {200: {"content": {"image/png": {}}}},
        response_class=Response,
    ),
    _monitoring("/calibration/timeline", monitoring.timeline, TimelineResponse),
    _monitoring("/calibration/history", monitoring.history, HistoryResponse),
    _monitoring(
        "/admin/recalibrate",
        monitoring.recalibrate,
        RecalibrateResponse,
        "admin",
        methods=("POST",),
        body=RecalibrateRequest,
    ),
    _monitoring(
        "/admin/calibration/activate",
        monitoring.activate,
        ActivateResponse,
        "admin",
        methods=("POST",),
        body=ActivateRequest,
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
    """The access group of a request's path, from the route table alone (whatever the method; None: no route)."""

    def __init__(self, routes: Iterable[tuple[str, Access]]) -> None:
        by_path: dict[str, Access] = {}
        for path, access in routes:
            if by_path.setdefault(path, access) != access:
                raise ValueError(f"the routes of {path} declare two access groups: {by_path[path]} and {access}")
        self.exact = {path: access for path, access in by_path.items() if "{" not in path}
        self.patterns = [(compile_path(path)[0], access) for path, access in by_path.items() if "{" in path]

    @classmethod
    def of_app(cls, app: FastAPI) -> RouteAccess:
        """The groups of every route the app serves (``FRAMEWORK_ROUTES`` too); one without stops the start."""
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
