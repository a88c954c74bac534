"""The service's parts wired together and the calls the routes make on them; blocking calls run in worker threads."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Literal

import anyio
import onnxruntime as ort
from fastapi import Depends
from starlette.requests import HTTPConnection

from service import __version__
from service.auth import AccessControl
from service.engine.pod import frontend_count
from service.errors import NotReady
from service.metrics import ServiceMetrics
from service.monitoring import Monitor
from service.monitoring.evaluator import Evaluator
from service.monitoring.group_commit import FeedbackGroupCommit
from service.monitoring.pending import PendingJoiner
from service.monitoring.webhook import AlarmWebhook
from service.schemas import (
    ActivateRequest,
    ActivateResponse,
    HealthResponse,
    HistoryResponse,
    RecalibrateRequest,
    RecalibrateResponse,
    TimelineResponse,
)
from service.serving.dataplane import DataPlane
from service.serving.prediction_log import PredictionLog
from service.serving.repository import ModelRepository
from service.settings import Settings
from service.store import Store


@dataclass
class ServiceParts:
    """The parts of one service process; handlers receive them through the ``Parts`` dependency."""

    settings: Settings
    metrics: ServiceMetrics
    store: Store
    dataplane: DataPlane
    monitor: Monitor
    prediction_log: PredictionLog
    feedback: FeedbackGroupCommit
    pending: PendingJoiner
    evaluator: Evaluator
    webhook: AlarmWebhook
    access: AccessControl
    ready: bool = False
    grpc_port: int | None = None

    @classmethod
    def build(cls, settings: Settings, metrics: ServiceMetrics, access: AccessControl) -> ServiceParts:
        """The service's parts wired together (nothing started, no model loaded, the store not touched)."""
        repository = ModelRepository(settings)
        store = Store(settings.store.url, settings.limits.retry_after_seconds, settings.store.timeout_seconds)
        monitor = Monitor(
            store,
            repository,
            metrics,
            n_bins=settings.monitoring.n_bins,
            policy=settings.alarm,
            alarm_window=settings.monitoring.window,
            detail_rows=settings.monitoring.detail_rows,
            drift_rows=settings.monitoring.drift_rows,
            n_resamples=settings.monitoring.bootstrap_resamples,
            retention_seconds=settings.store.retention_days * 86400,
            trusted=settings.labels.trusted(),
            set_adaptation=settings.conformal.adaptation,
            set_step=settings.conformal.step,
            coverage_alarm_threshold=settings.conformal.alarm_threshold,
            shift=settings.shift,
        )
        webhook = AlarmWebhook(settings.monitoring.webhook_url, metrics)
        evaluator = Evaluator(
            monitor,
            metrics,
            webhook,
            every_labels=settings.monitoring.evaluate_every_labels,
            seconds=settings.monitoring.evaluate_seconds,
            sets_seconds=settings.monitoring.evaluate_sets_seconds,
        )
        joiner = PendingJoiner(
            monitor.labels,
            horizon=settings.labels.pending_seconds,
            interval=settings.labels.join_seconds,
            on_stored=evaluator.labels_arrived,
        )
        prediction_log = PredictionLog(
            store,
            metrics,
            max_pending=settings.prediction_log.queue,
            interval=settings.prediction_log.interval_seconds,
            durability=settings.prediction_log.durability,
            retry_after=settings.limits.retry_after_seconds,
            on_written=joiner.predictions_written,
        )
        feedback = FeedbackGroupCommit(
            monitor,
            prediction_log,
            max_request_items=settings.limits.max_feedback_items,
            on_stored=evaluator.labels_arrived,
            on_pending=joiner.labels_pending,
        )
        dataplane = DataPlane(
            repository, settings, metrics, monitor, prediction_log if settings.prediction_log.enabled else None
        )
        return cls(
            settings, metrics, store, dataplane, monitor, prediction_log, feedback, joiner, evaluator, webhook, access
        )

    @property
    def repository(self) -> ModelRepository:
        return self.dataplane.repository

    def is_ready(self) -> bool:
        """Started, not stopping, and at least one model version ready."""
        return self.ready and any(m.ready for m in self.repository.all())

    async def health(self, admin: bool) -> HealthResponse:
        """Readiness with details (the store's last error only for ``admin``: it names hosts and databases)."""
        models = [
            {
                "name": m.name,
                "version": m.version,
                "ready": m.ready,
                "provider": m.runtime.provider,
                "requested_providers": m.runtime.requested,
                "io_binding": m.runtime.io_binding,
                "batch_buckets": list(m.runtime.buckets),
                "bucket_sessions": bool(m.runtime.bucket_sessions),
                "cuda_graphs": all(r.cuda_graphs for r in m.runtimes),
                "graph_fallback": next((r.graph_fallback for r in m.runtimes if r.graph_fallback), ""),
                "warmup_seconds": round(sum(r.warmup_seconds for r in m.runtimes), 6),
                "staging_bytes": sum(r.staging_bytes for r in m.runtimes),
                "sessions": getattr(m.runtime, "sessions", len(m.runtimes)),  # a front-end's: the engine's
                "queued_rows": m.batcher.queued_rows if m.batcher else 0,
            }
            for m in self.repository.all()
        ]
        ready = self.is_ready()
        db = self.store.db
        store_up = await anyio.to_thread.run_sync(db.ping)
        self.metrics.storage_up.set(int(store_up))
        log_ = self.prediction_log
        storage = {
            "backend": db.engine.dialect.name,
            "up": store_up,
            "prediction_log_pending": log_.pending,
            "prediction_log": {
                "enabled": self.settings.prediction_log.enabled,
                "durability": "sync" if log_.sync else "async",
                "queued_rows": log_.pending,
                "max_queued_rows": log_.max_pending,
                "unwritten_up_to_seconds": 0.0 if log_.sync else log_.interval,
                "after_a_crash": (
                    "every answered id is stored"
                    if log_.sync
                    else "ids answered but not yet written stay unknown; labels "
                    "sent for them wait as pending, then expire"
                ),
            },
        } | ({"error": db.last_error} if admin else {})
        status: Literal["ok", "degraded", "not_ready"] = (
            "not_ready" if not ready else ("degraded" if self.repository.failed or not store_up else "ok")
        )
        return HealthResponse(
            status=status,
            ready=ready,
            models=models,
            failed_artifacts=self.repository.failed,
            storage=storage,
            device=self.settings.device,
            available_providers=ort.get_available_providers(),
            onnxruntime=ort.__version__,
            cuda_libraries=self.repository.cuda_libraries,
            grpc_port=self.grpc_port,
            version=__version__,
            pod=self._pod(),
        )

    def _pod(self) -> dict | None:
        engine = self.dataplane.engine
        if engine is None:
            return None
        return {
            "frontend": self.settings.pod.index,
            "frontends": frontend_count(self.settings),
            "pid": os.getpid(),
            "loops": "every one" if self.settings.pod.index in (None, 0) else "the sets' folder",
            "engine": {
                "endpoint": engine.endpoint,
                "answering": engine.ready,
                "batches_run": engine.batches_run,
                "stalled_seconds": round(engine.stalled_seconds, 3),
            },
        }

    def server_ready(self) -> dict:
        """The v2 server readiness (503 when no model version is ready)."""
        if not self.is_ready():
            raise NotReady("no model is ready")
        return {"ready": True}

    def model_ready(self, name: str, version: str | None) -> dict:
        """The v2 readiness of one model version (503 when it is not ready)."""
        model = self.repository.get(name, version)
        if not model.ready:
            raise NotReady(f"model {name} version {model.version} is not ready")
        return {"name": model.name, "version": model.version, "ready": True}

    async def unmatched_labels(self, status: str | None, limit: int) -> dict:
        return await anyio.to_thread.run_sync(self.store.pending.unmatched, status, limit)

    async def calibration(
        self, model: str | None, version: str | None, window: str | None, by_source: bool = False
    ) -> dict:
        return await anyio.to_thread.run_sync(self.monitor.report, model, version, window, by_source)

    async def reliability_png(self, model: str | None, version: str | None, window: str | None) -> bytes:
        return await anyio.to_thread.run_sync(self.monitor.reports.reliability_png, model, version, window)

    async def timeline(
        self, model: str | None, version: str | None, window: int, step: int, points: int
    ) -> TimelineResponse:
        return await anyio.to_thread.run_sync(self.monitor.reports.timeline, model, version, window, step, points)

    async def history(self, model: str | None, version: str | None) -> HistoryResponse:
        return await anyio.to_thread.run_sync(self.monitor.history, model, version)

    async def recalibrate(self, body: RecalibrateRequest) -> RecalibrateResponse:
        return await anyio.to_thread.run_sync(self.monitor.recalibrate, body.model, body.version, body.window)

    async def activate(self, body: ActivateRequest) -> ActivateResponse:
        return await anyio.to_thread.run_sync(self.monitor.activate, body.model, body.version, body.calibration_version)


def parts_of(connection: HTTPConnection) -> ServiceParts:
    """The app's ``ServiceParts`` (a FastAPI dependency; the fast handlers call it with their request)."""
    return connection.app.state.parts


Parts = Annotated[ServiceParts, Depends(parts_of)]
