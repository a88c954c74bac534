"""Prometheus metrics of one service process (its own registry, at GET /metrics); a pod's processes are summed by
prometheus-client's multiprocess mode, so the pod is scraped as one service."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
PHASES = ("parse", "validate", "batch", "encode")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ServiceMetrics:
    """Request counts and latencies by route template, batching, in-flight requests, model info."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._phases: dict[str, dict] = {}
        r = self.registry

        def latest(name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
            """A gauge that a pod of front-ends exposes as the value its live processes wrote last."""
            return Gauge(name, documentation, labels, registry=r, multiprocess_mode="livemostrecent")

        def count(name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
            return Counter(name, documentation, labels, registry=r)

        def timing(name: str, documentation: str, labels: Sequence[str] = ()) -> Histogram:
            """A histogram of durations in seconds, in ``LATENCY_BUCKETS``."""
            return Histogram(name, documentation, labels, buckets=LATENCY_BUCKETS, registry=r)

        self.requests = count(
            "calib_http_requests_total",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
        )
        self.latency = timing(
            "calib_http_request_duration_seconds", "Total request latency by route template", ["route"]
        )
        self.phase = timing(
            "calib_request_phase_duration_seconds",
            "Request time by phase: parse (read + decode JSON), validate, batch (queue + "
            "inference, see the two histograms below), encode (build + encode the response)",
            ["route", "phase"],
        )
        self.grpc_requests = count(
            "calib_grpc_requests_total", "gRPC calls by method and status code", ["method", "code"]
        )
        self.grpc_latency = timing("calib_grpc_request_duration_seconds", "gRPC call latency by method", ["method"])
        self.in_flight = Gauge(
            "calib_http_requests_in_flight", "Requests being served", registry=r, multiprocess_mode="livesum"
        )
        self.queue = timing("calib_queue_duration_seconds", "Time a request waited for its batch", ["model"])
        self.inference = timing(
            "calib_inference_duration_seconds",
            "onnxruntime time of a batch: the session's call only, in process and in a pod's engine alike",
            ["model"],
        )
        self.batch_size = Histogram(
            "calib_batch_size_rows", "Rows per onnxruntime call", ["model"], buckets=BATCH_BUCKETS, registry=r
        )
        self.engine_round_trip = timing(
            "calib_engine_round_trip_seconds",
            "A front-end's batch sent to the engine process until its answer (pods of front-ends only; the engine's "
            "own batches and onnxruntime time are the two histograms above)",
            ["model"],
        )
        self.engine_queue = timing(
            "calib_engine_queue_duration_seconds",
            "Time a front-end's batch waited in the engine process's queue for an onnxruntime call (pods of "
            "front-ends only; calib_queue_duration_seconds is the wait in the front-end)",
            ["model"],
        )
        self.engine_message_rows = Histogram(
            "calib_engine_message_rows",
            "Rows per message a front-end sends to the engine process (its own batch)",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.rejected = count("calib_batcher_rejected_total", "Requests refused because the queue was full", ["model"])
        self.predictions = count("calib_predictions_total", "Rows predicted", ["model", "version"])
        self.model_info = latest(
            "calib_model_info",
            "Loaded model versions and the provider that runs them (1)",
            ["model", "version", "provider", "calibration"],
        )
        self.model_ready = latest("calib_model_ready", "1 when the model version is ready", ["model", "version"])

        self.log_written = count("calib_prediction_log_written_total", "Prediction rows written to the store")
        self.log_dropped = count(
            "calib_prediction_log_dropped_total", "Prediction rows not logged, by reason", ["reason"]
        )
        self.storage_up = latest("calib_storage_up", "1 when the feedback store answered the last operation")
        self.partitions_end = Gauge(
            "calib_store_partitions_end_timestamp_seconds",
            "When the newest partition of the prediction log ends (PostgreSQL; set by the replica that did the last "
            "upkeep): inserts of predictions made after it would fail",
            ["table"],
            registry=r,
            multiprocess_mode="max",
        )
        self.feedback_items = count(
            "calib_feedback_items_total",
            "Feedback items by result: accepted, pending (stored until their prediction is) or rejected",
            ["result"],
        )
        self.pending_labels = latest(
            "calib_pending_labels",
            "Labels waiting for their prediction, as this replica last counted them in the store",
        )
        self.pending_resolved = count(
            "calib_pending_labels_resolved_total",
            "Pending labels this replica joined to their prediction, expired or rejected at the join",
            ["outcome"],
        )
        by_bin = ["model", "version", "bin"]
        self.labeled = count("calib_labeled_total", "Labelled predictions per confidence bin", by_bin)
        self.confidence_sum = count(
            "calib_confidence_sum_total", "Sum of confidences of labelled predictions per bin", by_bin
        )
        self.correct = count("calib_correct_total", "Correct labelled predictions per confidence bin", by_bin)
        mv = ["model", "version"]
        self.alarm_state = latest("calib_alarm_state", "0 ok, 1 warning, 2 alarm", mv)
        self.window_ece = latest("calib_window_ece", "ECE of the alarm window", mv)
        self.window_ece_low = latest("calib_window_ece_lower", "Lower bound of the alarm window's ECE interval", mv)
        self.window_ece_high = latest("calib_window_ece_upper", "Upper bound of the alarm window's ECE interval", mv)
        self.window_labels = latest("calib_window_labels", "Labels in the alarm window", mv)
        self.e_detector = latest(
            "calib_e_detector",
            "The alarm's e-detector: the weighted mixture of its CUSUMs (alarm at CALIB_ALARM__THRESHOLD)",
            mv,
        )
        self.transitions = count("calib_alarm_transitions_total", "Alarm state transitions", [*mv, "to"])
        self.label_shift_alarm = latest(
            "calib_label_shift_alarm",
            "1 while the label-shift alarm is raised: some class's mean calibrated probability left its band",
            mv,
        )
        self.label_shift_e_detector = latest(
            "calib_label_shift_e_detector",
            "The label-shift alarm's e-detector (alarm at CALIB_SHIFT__ALARM_THRESHOLD)",
            mv,
        )
        self.label_shift_transitions = count(
            "calib_label_shift_transitions_total", "Label-shift alarm transitions", [*mv, "to"]
        )
        self.estimated_accuracy, self.estimated_accuracy_low, self.estimated_accuracy_high = (
            latest(
                f"calib_estimated_accuracy{suffix}",
                f"{what} of the drift window's recent predictions, from their calibrated confidences alone "
                "(Poisson-binomial interval at CALIB_SHIFT__INTERVAL_LEVEL)",
                mv,
            )
            for suffix, what in (
                ("", "Estimated accuracy"),
                ("_lower", "Lower bound of the estimated accuracy"),
                ("_upper", "Upper bound of the estimated accuracy"),
            )
        )
        self.accuracy_floor = latest(
            "calib_accuracy_floor", "CALIB_SHIFT__ACCURACY_FLOOR: the estimated accuracy's alert floor", mv
        )
        self.estimated_prior = latest(
            "calib_estimated_prior",
            "Class prior of the drift window's recent predictions, by EM on their calibrated probabilities",
            [*mv, "class_name"],
        )
        self.prior_shift = latest(
            "calib_prior_shift",
            "Total variation distance between the EM priors of recent predictions and the validation priors",
            mv,
        )
        sets = [*mv, "method", "coverage", "randomized"]
        self.coverage_observed = latest(
            "calib_set_coverage", "Share of labels the served prediction sets held, since the version's first", sets
        )
        self.coverage_threshold = latest(
            "calib_set_threshold",
            "The score threshold the sets are served at (adapted from the labels, or static)",
            sets,
        )
        self.coverage_statistic = latest(
            "calib_set_coverage_e_detector", "The coverage alarm's e-detector mixture (alarm at its threshold)", sets
        )
        self.coverage_alarm = latest(
            "calib_set_coverage_alarm", "1 while the coverage alarm says the sets cover less than their target", sets
        )
        self.set_size = Histogram(
            "calib_set_size",
            "Classes per served prediction set",
            mv,
            buckets=(0, 1, 2, 3, 5, 10, 20, 50, 100),
            registry=r,
        )
        self.webhook_failures = count("calib_webhook_failures_total", "Alarm webhooks that could not be delivered")
        self.evaluation = timing(
            "calib_evaluation_duration_seconds",
            "Alarm evaluation passes over every served model version (its count: the passes completed)",
        )

    def phases(self, route: str) -> dict:
        """The phase histograms of ``route`` by phase name (resolved once: label lookups cost per request)."""
        found = self._phases.get(route)
        if found is None:
            found = self._phases[route] = {p: self.phase.labels(route, p) for p in PHASES}
        return found

    def observe_batch(self, model: str, rows: int, seconds: float) -> None:
        self.batch_size.labels(model).observe(rows)
        self.inference.labels(model).observe(seconds)

    def observe_engine_message(self, model: str, rows: int, seconds: float) -> None:
        self.engine_message_rows.labels(model).observe(rows)
        self.engine_round_trip.labels(model).observe(seconds)

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format: this process's, or in a pod every live process's."""
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not directory:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)
        return generate_latest(registry)


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
