"""Assembly of the FastAPI app: lifespan, middleware, routes and the exception handlers (which
answer through the one mapping in ``service.http_errors``). Nothing a client sends produces a 500:
unexpected exceptions are logged and answered as JSON 500.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from starlette.exceptions import HTTPException as StarletteHTTPException

from service import __version__
from service.auth import GROUPS, AccessControl
from service.dashboard import router as dashboard_router
from service.endpoints import Endpoints
from service.errors import ServiceError, StorageUnavailable
from service.http_errors import error_response
from service.metrics import ServiceMetrics
from service.middleware import ServingMiddleware
from service.monitoring.routes import FEEDBACK_CONTRACT, FEEDBACK_ROUTES
from service.monitoring.routes import router as monitoring_router
from service.schemas import ActivateRequest, RecalibrateRequest, V2InferenceRequest
from service.serving import grpc_server as grpc_api
from service.serving.rest import PREDICT_CONTRACT, PREDICT_ROUTES
from service.serving.rest import router as rest_router
from service.serving.v2 import INFER_CONTRACTS, INFER_ROUTES
from service.serving.v2 import router as v2_router
from service.settings import Settings

log = logging.getLogger("service")


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service app for ``settings`` (environment variables when None)."""
    settings = settings or Settings()
    metrics = ServiceMetrics()
    access = AccessControl(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        endpoints = app.state.endpoints = Endpoints.build(settings, metrics, access)
        await anyio.to_thread.run_sync(endpoints.repository.load)
        _set_switch_interval(settings)
        endpoints.monitor.feedback.export_bin_counters()
        if not await _sync_store(endpoints):
            log.error("feedback store unavailable: predictions are served, feedback answers 503 until it is back")
        await endpoints.dataplane.start()
        grpc_server = await grpc_api.start(endpoints)
        endpoints.prediction_log.start()
        endpoints.feedback.start()
        endpoints.pending.start()
        endpoints.evaluator.start()
        housekeeping = asyncio.get_running_loop().create_task(_housekeeping(endpoints))
        endpoints.ready = True
        log.info("tokens required for: %s", ", ".join(g for g in GROUPS if access.required(g)))
        log.info(
            "ready: %d model version(s), %d refused; store %s",
            len(endpoints.repository.all()),
            len(endpoints.repository.failed),
            "up" if endpoints.store.db.last_error is None else f"unavailable ({endpoints.store.db.last_error})",
        )
        yield
        endpoints.ready = False
        housekeeping.cancel()
        if grpc_server is not None:
            await grpc_server.stop(settings.graceful_shutdown_seconds)
        await endpoints.dataplane.stop()
        await endpoints.feedback.stop()
        await endpoints.prediction_log.stop()
        await endpoints.pending.stop()
        await endpoints.evaluator.stop()
        await endpoints.webhook.aclose()
        endpoints.store.db.engine.dispose()
        log.info("stopped: queued and in-flight batches finished")

    telemetry = {} if settings.opentelemetry else {"tracing": False, "metrics": False, "logs": False}
    app = FastAPI(
        title="Calibrated model serving",
        version=__version__,
        lifespan=lifespan,
        telemetry=telemetry,
        description="Calibrated probabilities from ONNX models, with calibration monitoring.",
    )
    app.add_middleware(
        ServingMiddleware,
        metrics=metrics,
        max_body_bytes=settings.max_body_bytes,
        direct=[*PREDICT_ROUTES, *FEEDBACK_ROUTES, *INFER_ROUTES],
        access=access,
    )
    app.include_router(rest_router)
    app.router.routes[:0] = [*PREDICT_ROUTES, *FEEDBACK_ROUTES, *INFER_ROUTES]  # the hottest routes are matched first
    app.include_router(monitoring_router)
    app.include_router(dashboard_router)
    app.include_router(v2_router)
    _install_error_handlers(app)
    app.openapi = lambda: _openapi(app)
    return app


def _set_switch_interval(settings: Settings) -> None:
    """Python's thread switch interval, when configured: an inference thread whose onnxruntime call has
    ended waits up to that long for the GIL while the event loop runs."""
    if settings.switch_interval_ms is not None:
        sys.setswitchinterval(settings.switch_interval_ms / 1000)
        log.info("thread switch interval %.2f ms", settings.switch_interval_ms)


async def _sync_store(endpoints: Endpoints) -> bool:
    """Create/migrate the schema and load the active calibrations; whether the store answered (a down
    store is not fatal, and ``Database`` logs each outage once)."""
    try:
        await anyio.to_thread.run_sync(endpoints.monitor.sync)
    except StorageUnavailable:
        endpoints.metrics.storage_up.set(0)
        return False
    endpoints.metrics.storage_up.set(1)
    return True


async def _housekeeping(endpoints: Endpoints) -> None:
    """Refresh active calibrations (replicas see each other's recalibrations), re-read changed token files and
    apply retention."""
    settings, store = endpoints.settings, endpoints.store
    last_purge = 0.0
    while True:
        await asyncio.sleep(settings.calibration_refresh_seconds)
        await _sync_store(endpoints)
        endpoints.access.reload()
        if time.time() - last_purge > 3600 and store.db.last_error is None:
            cutoff = time.time() - settings.retention_days * 86400
            try:
                purged = await anyio.to_thread.run_sync(store.purge, cutoff)
                last_purge = time.time()
                if purged:
                    log.info("retention: deleted %d predictions older than %.1f days", purged, settings.retention_days)
            except StorageUnavailable:
                pass


def _install_error_handlers(app: FastAPI) -> None:
    async def mapped(request: Request, exc: Exception):
        return error_response(request.url.path, exc)

    for kind in (ServiceError, RequestValidationError, StarletteHTTPException):
        app.add_exception_handler(kind, mapped)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(request.url.path, exc)


def _openapi(app: FastAPI) -> dict:
    """The generated schema (with the contracts of the plain routes) plus the bodies of the routes that
    read them themselves: v2 infer (JSON or binary) and the admin routes (after the token)."""
    if app.openapi_schema:
        return app.openapi_schema
    contracts = [PREDICT_CONTRACT, FEEDBACK_CONTRACT, *INFER_CONTRACTS]
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=[*app.routes, *contracts]
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (V2InferenceRequest, RecalibrateRequest, ActivateRequest):
        definition = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, nested in definition.pop("$defs", {}).items():
            components.setdefault(name, nested)
        components[model.__name__] = definition
    app.openapi_schema = schema
    return schema
