"""Prometheus metrics of one service process (its own registry, exposed at GET /metrics).

One process serves with one uvicorn worker (enforced by ``python -m service``): scale out with
replicas, each scraped on its own port, which keeps the in-process batching and these counters
exact without prometheus-client's multiprocess mode.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ServiceMetrics:
    """Request counts and latencies by route template, batching, in-flight requests, model info."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("calib_http_requests_total", "HTTP requests by route template, method and status",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("calib_http_request_duration_seconds", "Total request latency by route template",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("calib_http_requests_in_flight", "Requests being served", registry=r)
        self.queue = Histogram("calib_queue_duration_seconds", "Time a request waited for its batch",
                               ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.inference = Histogram("calib_inference_duration_seconds", "onnxruntime time of a batch",
                                   ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("calib_batch_size_rows", "Rows per onnxruntime call", ["model"],
                                    buckets=BATCH_BUCKETS, registry=r)
        self.rejected = Counter("calib_batcher_rejected_total", "Requests refused because the queue was full",
                                ["model"], registry=r)
        self.predictions = Counter("calib_predictions_total", "Rows predicted", ["model", "version"], registry=r)
        self.model_info = Gauge("calib_model_info", "Loaded model versions and the provider that runs them (1)",
                                ["model", "version", "provider", "calibration"], registry=r)
        self.model_ready = Gauge("calib_model_ready", "1 when the model version is ready", ["model", "version"],
                                 registry=r)

    def observe_batch(self, model: str, rows: int, seconds: float) -> None:
        self.batch_size.labels(model).observe(rows)
        self.inference.labels(model).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
