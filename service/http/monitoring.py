"""The monitoring API: /feedback (a fast handler), unmatched labels, /calibration and the admin calls."""

from __future__ import annotations

from typing import Literal

from fastapi import Query, Request, Response

from service.http.codec import Model, decode, media_type, respond, validate
from service.parts import Parts, parts_of
from service.schemas import (
    WINDOW_PATTERN,
    ActivateRequest,
    ActivateResponse,
    FeedbackRequest,
    HistoryResponse,
    RecalibrateRequest,
    RecalibrateResponse,
    TimelineResponse,
)
from service.store.rows import ANONYMOUS


async def feedback(request: Request) -> Response:
    """True labels for earlier predictions (by id) or for probabilities scored elsewhere.
    Committed before the response: a 2xx means the labels are stored. Alarms are assessed in the
    background (every ``CALIB_MONITORING__EVALUATE_SECONDS``), not in this request.
    \f
    The items join the feedback writer's next group commit; the source is the token's name
    (``ServingMiddleware``)."""
    media_type(request, "application/json")
    body = validate(FeedbackRequest, decode(await request.body()))
    source = request.scope["state"].get("principal", ANONYMOUS)
    return respond(await parts_of(request).feedback.submit(body.items, source))


async def unmatched_labels(
    parts: Parts,
    status: Literal["pending", "expired", "rejected"] | None = None,
    limit: int = Query(default=100, ge=0, le=10_000),
) -> dict:
    """Labels that arrived before their prediction was stored: how many still wait, how many expired or were
    rejected at the join, and the most recent of them with their ids (newest first)."""
    return await parts.unmatched_labels(status, limit)


async def calibration(
    parts: Parts,
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
    return await parts.calibration(model, version, window, by_source)


async def reliability_png(
    parts: Parts,
    model: str | None = None,
    version: str | None = None,
    window: str | None = Query(default=None, pattern=WINDOW_PATTERN, description="as for GET /calibration"),
) -> Response:
    """The current reliability diagram with its confidence histogram."""
    return Response(await parts.reliability_png(model, version, window), media_type="image/png")


async def timeline(
    parts: Parts,
    model: str | None = None,
    version: str | None = None,
    window: int = Query(default=500, ge=10, le=100_000),
    step: int = Query(default=50, ge=1, le=10_000),
    points: int = Query(default=60, ge=1, le=500),
) -> TimelineResponse:
    """Rolling ECE with its interval after every ``step`` labels (window of ``window`` labels)."""
    return await parts.timeline(model, version, window, step, points)


async def history(parts: Parts, model: str | None = None, version: str | None = None) -> HistoryResponse:
    """Calibration versions (manifest and refits) and alarm transitions."""
    return await parts.history(model, version)


async def recalibrate(request: Request, parts: Parts) -> RecalibrateResponse:
    """Refit the temperature on the window's labelled data and serve it as a new calibration version."""
    return await parts.recalibrate(await _admin_body(request, RecalibrateRequest))


async def activate(request: Request, parts: Parts) -> ActivateResponse:
    """Serve a recorded calibration version again (0 = the manifest's): recalibration is reversible."""
    return await parts.activate(await _admin_body(request, ActivateRequest))


async def _admin_body(request: Request, model: type[Model]) -> Model:
    """The body of an admin request, read after its token was checked (``ServingMiddleware``)."""
    media_type(request, "application/json")
    return validate(model, decode(await request.body()))
