"""The service process: its parts started and stopped in the app's lifespan, and the FastAPI app."""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
from fastapi import FastAPI

from service import __version__
from service.auth import GROUPS, AccessControl
from service.errors import StorageUnavailable
from service.http.errors import install_error_handlers
from service.http.middleware import ServingMiddleware
from service.http.routes import RouteAccess, api_routes, openapi
from service.metrics import ServiceMetrics
from service.parts import ServiceParts
from service.serving import grpc_server as grpc_api
from service.settings import Settings

if TYPE_CHECKING:
    # the annotation only: fastapi.telemetry is newer than the oldest fastapi that pyproject.toml allows
    from fastapi.telemetry import TelemetryConfig

log = logging.getLogger("service")


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service app for ``settings`` (environment variables when None)."""
    settings = settings or Settings()
    metrics = ServiceMetrics()
    access = AccessControl(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        parts = app.state.parts = ServiceParts.build(settings, metrics, access)
        primary = settings.pod.index in (None, 0)
        # a front-end of an engine process opens no session of its own (service.engine.frontend)
        await anyio.to_thread.run_sync(parts.repository.load, settings.pod.engine_endpoint is None)
        parts.monitor.labels.export_bin_counters()
        if not await _sync_store(parts):
            log.error("feedback store unavailable: predictions are served, feedback answers 503 until it is back")
        await parts.dataplane.start()
        grpc_server = await grpc_api.start(parts)
        parts.prediction_log.start()
        parts.feedback.start()
        if primary:
            parts.pending.start()
            parts.evaluator.start()
        else:  # a pod's other front-ends fold their labels into the sets' states; front-end 0 does the rest
            parts.evaluator.sets.start()
        loop = asyncio.get_running_loop()
        housekeeping = [loop.create_task(_housekeeping(parts, retention=primary))]
        if access.watches_files:
            housekeeping.append(loop.create_task(_reload_tokens(access, settings.auth.refresh_seconds)))
        parts.ready = True
        log.info("tokens required for: %s", ", ".join(g for g in GROUPS if access.required(g)))
        log.info(
            "ready: %d model version(s), %d refused; store %s",
            len(parts.repository.all()),
            len(parts.repository.failed),
            "up" if parts.store.db.last_error is None else f"unavailable ({parts.store.db.last_error})",
        )
        yield
        parts.ready = False
        for task in housekeeping:
            task.cancel()
        if grpc_server is not None:
            await grpc_server.stop(settings.graceful_shutdown_seconds)
        await parts.dataplane.stop()
        await parts.feedback.stop()
        await parts.prediction_log.stop()
        await parts.pending.stop()
        await parts.evaluator.stop()
        await parts.webhook.aclose()
        parts.store.db.engine.dispose()
        log.info("stopped: queued and in-flight batches finished")

    telemetry: TelemetryConfig = {} if settings.opentelemetry else {"tracing": False, "metrics": False, "logs": False}
    routes, fast = api_routes()
    app = FastAPI(
        title="Calibrated model serving",
        version=__version__,
        lifespan=lifespan,
        telemetry=telemetry,
        description="Calibrated probabilities from ONNX models, with calibration monitoring.",
        routes=routes,
    )
    groups = RouteAccess.of_app(app)  # every route's access group, or no start
    app.add_middleware(
        ServingMiddleware,
        metrics=metrics,
        max_body_bytes=settings.limits.max_body_bytes,
        fast=fast,
        access=access,
        groups=groups,
    )
    install_error_handlers(app)
    app.openapi = lambda: openapi(app)  # type: ignore[method-assign]
    return app


async def _sync_store(parts: ServiceParts) -> bool:
    """Migrate the schema and load the active calibrations; whether the store answered (a down store is not fatal)."""
    try:
        await anyio.to_thread.run_sync(parts.monitor.sync)
    except StorageUnavailable:
        parts.metrics.storage_up.set(0)
        return False
    parts.metrics.storage_up.set(1)
    return True


async def _housekeeping(parts: ServiceParts, retention: bool = True) -> None:
    """Refresh active calibrations and the sets' states and, with ``retention``, run the store's upkeep."""
    settings, store = parts.settings, parts.store
    last_upkeep = 0.0
    while True:
        await asyncio.sleep(settings.monitoring.refresh_seconds)
        await _sync_store(parts)
        if retention and time.time() - last_upkeep > 3600 and store.db.last_error is None:
            try:
                done = await anyio.to_thread.run_sync(store.upkeep, settings.store.retention_days * 86400)
            except StorageUnavailable:
                continue
            last_upkeep = time.time()
            if done is not None:
                _report_upkeep(parts, done)
                if done.converted:  # the version-2 log is being moved: go on at the next tick
                    last_upkeep = 0.0


def _report_upkeep(parts: ServiceParts, done) -> None:
    """Log and export what a pass of the store's upkeep did (``service.store.retention.Upkeep``)."""
    if done.partitions_end is not None:
        parts.metrics.partitions_end.labels("prediction_log").set(done.partitions_end)
    if done.dropped or done.deleted or done.labels or done.pending or done.converted:
        log.info(
            "retention: dropped partitions %s, deleted %d log rows, %d labels and %d pending labels; moved %d rows of "
            "the version-2 log",
            done.dropped or "none",
            done.deleted,
            done.labels,
            done.pending,
            done.converted,
        )


async def _reload_tokens(access: AccessControl, seconds: float) -> None:
    """Re-read the token files that changed, every ``seconds``."""
    while True:
        await asyncio.sleep(seconds)
        access.reload()
