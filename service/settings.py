"""Service configuration from environment variables (prefix ``CALIB_``) and command-line flags.

Per-model dynamic batching can be overridden in ``artifacts/<model>/serving.json`` (like Triton's
``dynamic_batching`` in config.pbtxt): ``{"max_batch_size": 64, "max_queue_delay_ms": 2, "max_queue_rows": 4096}``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from calibkit.alarms import AlarmPolicy
from calibkit.coverage_alarm import DEFAULT_THRESHOLD
from service.auth import parse_tokens

#: Where the models run (``CALIB_DEVICE``).
Device = Literal["auto", "cpu", "cuda"]


class BatchingConfig(BaseModel):
    """Dynamic batching of one model: at most ``max_batch_size`` rows per onnxruntime call, an
    optional extra wait of ``max_queue_delay_ms`` for a batch to fill (0: run as soon as the worker
    is free), and at most ``max_queue_rows`` rows queued (past that, 503 with Retry-After)."""

    max_batch_size: int = Field(default=64, ge=1)
    max_queue_delay_ms: float = Field(default=0.0, ge=0)
    max_queue_rows: int = Field(default=4096, ge=1)
    instances: int = Field(
        default=0,
        ge=0,
        le=64,
        description="onnxruntime sessions of the model, each on its own "
        "inference thread taking batches from the one queue (Triton's instance_group count); "
        "0 = 2 on machines with 2 or more cores, else 1",
    )

    def sessions(self) -> int:
        """The number of sessions ``instances`` asks for on this machine."""
        return self.instances or min(2, os.cpu_count() or 1)


class Settings(BaseSettings):
    """All knobs of the service; every field can be set as ``CALIB_<NAME>`` in the environment."""

    # hide_input_in_errors: an invalid token setting is reported by name, never by its value
    model_config = SettingsConfigDict(
        env_prefix="CALIB_", env_nested_delimiter="__", extra="ignore", hide_input_in_errors=True
    )

    artifacts: Path = Path("artifacts")
    default_model: str | None = Field(default=None, description="model used when a request names none")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    grpc: bool = Field(default=True, description="serve the Open Inference Protocol over gRPC too")
    grpc_port: int = Field(default=8081, ge=0, le=65535, description="the gRPC port (0: a free one, shown in /health)")
    frontends: Annotated[int, Field(ge=1, le=256)] | Literal["auto"] = Field(
        default=1,
        description="front-end processes in front of one engine process that owns the sessions and the batchers "
        "(python -m service starts and supervises them, on one HTTP and one gRPC port); 1: inference in this "
        "process, no IPC; auto: the cores less one (at most 16) where CUDA runs the models, else 1",
    )
    engine_endpoint: str | None = Field(
        default=None,
        description="the ZeroMQ endpoint of an engine process (python -m service.engine) that runs this process's "
        "inference; unset: inference in this process",
    )
    pod_index: int | None = Field(
        default=None,
        ge=0,
        description="set by the pod for its front-ends: this one's index; the pod's once-per-pod loops (the "
        "evaluator's passes, the pending-label joiner, retention) run in front-end 0",
    )
    engine_wait_seconds: float = Field(
        default=120.0, gt=0, description="how long a front-end waits at start for the engine's first answer"
    )
    device: Device = Field(
        default="auto", description="auto: CUDA when onnxruntime can use a GPU, else CPU; cuda: warn and fall back"
    )
    cuda_tf32: bool = Field(
        default=False,
        description="TF32 tensor cores for CUDA matmuls and convolutions: faster "
        "on Ampere and newer GPUs, but probabilities then differ from the CPU path's by more "
        "than float32 rounding",
    )
    cuda_conv_algo_search: Literal["EXHAUSTIVE", "HEURISTIC", "DEFAULT"] = Field(
        default="HEURISTIC",
        description="how cuDNN picks a convolution algorithm for each new input shape "
        "(onnxruntime's cudnn_conv_algo_search): HEURISTIC asks cuDNN's heuristics; EXHAUSTIVE (onnxruntime's "
        "default) benchmarks every algorithm on the first batch of each size (docs/decisions/0001-gpu-run.md)",
    )
    pad_batches: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="pad every batch with zero rows up to the next power of two (or the model's "
        "max_batch_size), so that a session meets a handful of input shapes, each warmed up at load: on CUDA each "
        "new shape costs cuDNN an algorithm search and plan; auto = on for sessions that run on CUDA",
    )
    conformal_method: Literal["lac", "aps", "raps"] | None = Field(
        default=None,
        description="the prediction sets' default score when a request names none; unset: the artifact's default",
    )
    conformal_coverage: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="the prediction sets' default coverage 1 - alpha when a request names none; unset: the "
        "artifact's default",
    )
    conformal_levels: str = Field(
        default="0.8,0.9,0.95",
        description="the coverage levels served, comma-separated, each in (0, 1), besides the default coverage; a "
        "request for any other is refused naming the levels (each level keeps adaptive state and metric series)",
    )
    conformal_randomized: bool = Field(
        default=False,
        description="serve the exact sets when a request does not say: randomized APS and RAPS and LAC without "
        "its top-label floor, whose coverage is 1 - alpha to within 1 / (n + 1) but which may be empty and, for APS "
        "and RAPS, differ between two rows of the same input; false: the floor sets, never empty, the same for the "
        "same input, coverage at least 1 - alpha",
    )
    conformal_adaptation: Literal["log-quantile", "off"] = Field(
        default="log-quantile",  # calibkit.conformal.adaptive.DEFAULT_METHOD
        description="how each set choice's threshold adapts online from the labels, so long-run coverage holds "
        "under shift: the quantile tracker of conformal PID control (Angelopoulos, Candès & Tibshirani 2023) on "
        "the log scale of the score's distance to its top, fed each label's own score so that label delay does not "
        "destabilise it (log-quantile), or off (the static split-conformal threshold)",
    )
    conformal_step: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="the adaptation's step eta per label, on the log scale; unset: the rule's default",
    )
    coverage_alarm_threshold: float = Field(
        default=DEFAULT_THRESHOLD,
        gt=1,
        description="A of the coverage alarm, which watches each label's miss at the static threshold: while the "
        "traffic is exchangeable with the calibration split, P(a false alarm within n labels) <= n / A + 0.01",
    )
    bucket_sessions: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="with padding, a session of its own for each bucket size, so that every session meets one "
        "input shape: onnxruntime's CUDA convolutions keep the cuDNN descriptors and plan of the last shape only and "
        "rebuild them whenever the shape changes; auto = on for padding sessions that run on CUDA",
    )
    intra_op_threads: int = Field(
        default=0,
        ge=0,
        description="onnxruntime intra-op threads per session; 0 = the "
        "cores shared among the model's sessions (a session with its own core never "
        "waits for a sibling thread that the event loop has pre-empted)",
    )
    batching: BatchingConfig = BatchingConfig()
    max_rows_per_request: int = Field(default=1024, ge=1)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    max_image_pixels: int = Field(default=4096 * 4096, ge=64, description="decoded image size limit (pixels)")
    retry_after_seconds: int = Field(default=1, ge=1)
    store_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        description="the longest a store query may wait for a "
        "lock or run (PostgreSQL statement and lock timeout, SQLite busy timeout, "
        "pool checkout) before the request answers 503 with Retry-After",
    )
    graceful_shutdown_seconds: float = Field(default=30.0, ge=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    opentelemetry: bool = Field(
        default=False,
        description="FastAPI's native OpenTelemetry spans, metrics and logs "
        "(when a provider is configured); off by default: it looks the provider up on every "
        "request, on the hot path, and /metrics already has Prometheus metrics",
    )
    database_url: str = Field(
        default="sqlite:///monitoring.db",
        description="SQLAlchemy URL of the feedback store; postgresql+psycopg://... for replicas",
    )
    n_bins: int = Field(default=15, ge=2, le=100)
    alarm_window: str = Field(
        default="500", description="default window of GET /calibration: a label count or a duration"
    )
    alarm: AlarmPolicy = AlarmPolicy()
    bootstrap_resamples: int = Field(default=1000, ge=100)
    detail_rows: int = Field(
        default=5000,
        ge=100,
        description="most recent labels used for AdaECE, classwise ECE and "
        "the refit temperature (Guo et al. 2017 fit T on 5,000 validation images); the bin "
        "statistics (ECE, interval, MCE, bins) always use the whole window",
    )
    drift_rows: int = Field(
        default=500, ge=10, description="recent predictions compared with the reference confidences"
    )
    max_feedback_items: int = Field(default=10000, ge=1)
    evaluate_every_labels: int = Field(
        default=1000,
        ge=1,
        description="labels stored by this replica that start an "
        "alarm evaluation at once (otherwise one runs every evaluate_seconds)",
    )
    evaluate_sets_seconds: float = Field(
        default=0.1,
        gt=0,
        description="at most this often, labels stored by this replica are folded into the prediction sets' "
        "adaptive thresholds and coverage alarms as soon as they arrive (the full evaluation folds them too)",
    )
    evaluate_seconds: float = Field(
        default=1.0,
        gt=0,
        description="seconds between alarm evaluations of every "
        "served model version (they also fold in labels stored by other replicas)",
    )
    prediction_log: bool = Field(default=True, description="log every prediction for monitoring")
    prediction_log_queue: int = Field(
        default=100000,
        ge=100,
        description="prediction rows queued for the store at most (async: more are dropped and counted; sync: 503)",
    )
    prediction_log_durability: Literal["async", "sync"] = Field(
        default="async",
        description="async: the answer does not wait for its rows to be written (write-behind; a "
        "process killed meanwhile loses up to prediction_log_interval_seconds of rows, whose ids then never "
        "become known); sync: each answer waits until its rows are committed, so every id answered survives a "
        "crash (docs/api.md: the prediction log)",
    )
    prediction_log_interval_seconds: float = Field(
        default=0.5,
        gt=0,
        description="async durability: the longest a queued prediction waits for its write while the store is up",
    )
    pending_label_seconds: float = Field(
        default=300.0,
        gt=0,
        description="how long a label whose prediction is not in the store waits for it (pending) before it expires",
    )
    pending_join_seconds: float = Field(
        default=0.5,
        gt=0,
        description="seconds between passes that join pending "
        "labels to their predictions (also right after this replica's prediction "
        "log writes)",
    )
    retention_days: float = Field(default=30.0, gt=0)
    calibration_refresh_seconds: float = Field(default=5.0, gt=0)
    admin_token: SecretStr | None = Field(
        default=None,
        description="bearer token of the /admin endpoints (named "
        "'admin'); with no admin token at all the admin endpoints are off",
    )
    predict_tokens: SecretStr | None = Field(
        default=None,
        description="bearer tokens of POST /predict and v2 infer "
        "(REST and gRPC), as name:token,name:token; unset = open",
    )
    predict_tokens_file: Path | None = Field(
        default=None,
        description="a file of predict tokens (name:token per "
        "line or comma), re-read when it changes: a mounted Secret",
    )
    feedback_tokens: SecretStr | None = Field(
        default=None,
        description="bearer tokens of POST /feedback and GET /feedback/unmatched, as name:token,...; unset = open",
    )
    feedback_tokens_file: Path | None = Field(
        default=None, description="a file of feedback tokens, re-read when it changes"
    )
    admin_tokens: SecretStr | None = Field(
        default=None, description="more bearer tokens of the /admin endpoints, as name:token,... (beside admin_token)"
    )
    admin_tokens_file: Path | None = Field(default=None, description="a file of admin tokens, re-read when it changes")
    webhook_url: str | None = Field(default=None, description="alarm transitions are POSTed here as JSON")
    trusted_label_sources: str | None = Field(
        default=None,
        description="the sources (feedback token names, "
        "'anonymous' for labels sent without one) whose labels count for "
        "the alarm and the refit, comma-separated; unset = every source. "
        "The others are stored and reported per source",
    )

    def frontend_count(self) -> int:
        """``frontends`` as a number: ``auto`` is the cores less one, at most 16, where CUDA is wanted, else 1."""
        if self.frontends != "auto":
            return self.frontends
        from service.serving.runtime import cuda_wanted

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return max(1, min(16, cores - 1)) if cuda_wanted(self.device) else 1

    @property
    def gc_threshold(self) -> int:
        """``service.cli.GC_THRESHOLD``, no longer a setting: kept for one release for code that still reads it."""
        from service.cli import GC_THRESHOLD

        warnings.warn("Settings.gc_threshold is no longer a setting; use service.cli.GC_THRESHOLD", FutureWarning, 2)
        return GC_THRESHOLD

    def trusted_sources(self) -> frozenset[str] | None:
        """``trusted_label_sources`` as a set (None: every source is trusted)."""
        if self.trusted_label_sources is None:
            return None
        return frozenset(s.strip() for s in self.trusted_label_sources.split(",") if s.strip())

    @field_validator("conformal_levels")
    @classmethod
    def _levels(cls, value: str) -> str:
        """Comma-separated numbers in (0, 1) (the message names the entry at fault)."""
        conformal_levels(value)
        return value

    @field_validator("predict_tokens", "feedback_tokens", "admin_tokens")
    @classmethod
    def _token_list(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        """``name:token`` pairs (the message names the entry at fault, never a token)."""
        if value is not None:
            assert info.field_name is not None  # set for a field validator
            parse_tokens(value.get_secret_value(), f"CALIB_{info.field_name.upper()}")
        return value


def conformal_levels(value: str) -> tuple[float, ...]:
    """The coverage levels of ``CALIB_CONFORMAL_LEVELS``: comma-separated numbers in (0, 1), sorted, distinct."""
    levels = []
    for entry in value.split(","):
        try:
            level = float(entry)
        except ValueError:
            raise ValueError(f"CALIB_CONFORMAL_LEVELS: {entry.strip()!r} is not a number") from None
        if not 0 < level < 1:
            raise ValueError(f"CALIB_CONFORMAL_LEVELS: {entry.strip()!r} is not in (0, 1)")
        levels.append(level)
    return tuple(sorted(set(levels)))
