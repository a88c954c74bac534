"""HTTP side of monitoring: /feedback, /calibration (+ reliability diagram, history) and /admin."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.routing import APIRoute
from starlette.types import Receive, Scope, Send

from service.endpoints import CurrentEndpoints, current
from service.schemas import (
    WINDOW_PATTERN,
    ActivateRequest,
    ActivateResponse,
    CalibrationReport,
    ErrorResponse,
    FeedbackRequest,
    FeedbackResponse,
    HistoryResponse,
    RecalibrateRequest,
    RecalibrateResponse,
    TimelineResponse,
    UnmatchedLabels,
)
from service.serving.codec import Model, PlainRoute, decode, json_body, media_type, respond, validate
from service.store.rows import ANONYMOUS

router = APIRouter(tags=["monitoring"])

ERRORS = {code: {"model": ErrorResponse} for code in (400, 404, 413, 422, 503)}
ADMIN_ERRORS = ERRORS | {401: {"model": ErrorResponse}, 403: {"model": ErrorResponse}}


class FeedbackEndpoint:
    """POST /feedback as a plain ASGI endpoint (see ``service.serving.codec``): the items join the feedback
    writer's next group commit, and the request is answered once they are stored."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        media_type(request, "application/json")
        body = validate(FeedbackRequest, decode(await request.body()))
        source = scope["state"].get("principal", ANONYMOUS)  # the token's name (``ServingMiddleware``)
        await respond(await current(request).feedback.submit(body.items, source))(scope, receive, send)


def feedback_contract(body: FeedbackRequest) -> FeedbackResponse:
    """True labels for earlier predictions (by id) or for probabilities scored elsewhere.
    Committed before the response: a 2xx means the labels are stored. Alarms are assessed in the
    background (every ``CALIB_EVALUATE_SECONDS``), not in this request."""
    raise NotImplementedError("documentation only: FeedbackEndpoint serves POST /feedback")


FEEDBACK_ROUTES = [PlainRoute("/feedback", FeedbackEndpoint(), methods=["POST"])]
FEEDBACK_CONTRACT = APIRoute(
    "/feedback",
    feedback_contract,
    methods=["POST"],
    response_model=FeedbackResponse,
    responses=ERRORS,
    tags=["monitoring"],
    name="feedback",
)


@router.get("/feedback/unmatched", response_model=UnmatchedLabels, responses=ERRORS)
async def unmatched_labels(
    endpoints: CurrentEndpoints,
    status: Literal["pending", "expired", "rejected"] | None = None,
    limit: int = Query(default=100, ge=0, le=10_000),
) -> dict:
    """Labels that arrived before their prediction was stored: how many still wait, how many expired or were
    rejected at the join, and the most recent of them with their ids (newest first)."""
    return await endpoints.unmatched_labels(status, limit)


@router.get("/calibration", response_model=CalibrationReport, responses=ERRORS)
async def calibration(
    endpoints: CurrentEndpoints,
    model: str | None = None,
    version: str | None = None,
    window: str | None = Query(
        default=None, pattern=WINDOW_PATTERN, description="a label count (1000) or a duration (30s, 15m, 1h, 7d)"
    ),
    by_source: bool = Query(
        default=False, description="add the window's labels per source (an aggregate over the window's rows)"
    ),
):
    """Rolling calibration with intervals, reliability bins, reference values, drift and the alarm."""
    return await endpoints.calibration(model, version, window, by_source)


@router.get(
    "/calibration/reliability.png", responses=ERRORS | {200: {"content": {"image/png": {}}}}, response_class=Response
)
async def reliability_png(
    endpoints: CurrentEndpoints,
    model: str | None = None,
    version: str | None = None,
    window: str | None = Query(default=None, pattern=WINDOW_PATTERN, description="as for GET /calibration"),
) -> Response:
    """The current reliability diagram with its confidence histogram."""
    return Response(await endpoints.reliability_png(model, version, window), media_type="image/png")


@router.get("/calibration/timeline", response_model=TimelineResponse, responses=ERRORS)
async def timeline(
    endpoints: CurrentEndpoints,
    model: str | None = None,
    version: str | None = None,
    window: int = Query(default=500, ge=10, le=100_000),
    step: int = Query(default=50, ge=1, le=10_000),
    points: int = Query(default=60, ge=1, le=500),
) -> TimelineResponse:
    """Rolling ECE with its interval after every ``step`` labels (window of ``window`` labels)."""
    return await endpoints.timeline(model, version, window, step, points)


@router.get("/calibration/history", response_model=HistoryResponse, responses=ERRORS)
async def history(endpoints: CurrentEndpoints, model: str | None = None, version: str | None = None) -> HistoryResponse:
    """Calibration versions (manifest and refits) and alarm transitions."""
    return await endpoints.history(model, version)


async def _admin_body(request: Request, model: type[Model]) -> Model:
    """The body of an admin request (its token was checked before: ``ServingMiddleware``)."""
    media_type(request, "application/json")
    return validate(model, decode(await request.body()))


@router.post(
    "/admin/recalibrate",
    response_model=RecalibrateResponse,
    responses=ADMIN_ERRORS,
    tags=["admin"],
    openapi_extra=json_body(RecalibrateRequest),
)
async def recalibrate(request: Request, endpoints: CurrentEndpoints) -> RecalibrateResponse:
    """Refit the temperature on the window's labelled data and serve it as a new calibration version."""
    return await endpoints.recalibrate(await _admin_body(request, RecalibrateRequest))


@router.post(
    "/admin/calibration/activate",
    response_model=ActivateResponse,
    responses=ADMIN_ERRORS,
    tags=["admin"],
    openapi_extra=json_body(ActivateRequest),
)
async def activate(request: Request, endpoints: CurrentEndpoints) -> ActivateResponse:
    """Serve a recorded calibration version again (0 = the manifest's): recalibration is reversible."""
    return await endpoints.activate(await _admin_body(request, ActivateRequest))
