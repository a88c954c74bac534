"""Service configuration from environment variables (prefix ``CALIB_``) and command-line flags.

The server's identity is top-level (``CALIB_PORT``): the command-line flags and the ports. Every other setting is in a
group by concern, ``CALIB_<GROUP>__<NAME>`` (``CALIB_CONFORMAL__METHOD``), or the whole group as a JSON object in
``CALIB_<GROUP>``; init arguments take the same shape (``Settings(conformal={"method": "aps"})``). Each description
says what the setting does and, where an operator may turn it, the trade it makes. ``docs/settings.md`` is generated
from these models (``scripts/settings_doc.py``); the variables' names, value grammars and old names are in
``service.settings_env``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated, Any, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from calibkit.alarms import AlarmPolicy
from calibkit.conformal.adaptive import DEFAULT_STEP
from calibkit.coverage_alarm import DEFAULT_THRESHOLD
from service.settings_env import PREFIX, conformal_levels, env_name, parse_tokens, rename_old_names

#: Where the models run (``CALIB_DEVICE``).
Device = Literal["auto", "cpu", "cuda"]
#: The route groups that tokens guard (``service.auth``).
Group = Literal["predict", "feedback", "admin"]
GROUPS: tuple[Group, ...] = ("predict", "feedback", "admin")


def _one_line(model: type[BaseModel]) -> None:
    """Each field's description is the docstring under it (pydantic's ``use_attribute_docstrings``), here joined
    onto one line, as docs/settings.md shows it; the schema is built at first use (``defer_build``), with that text."""
    for info in model.model_fields.values():
        info.description = info.description and " ".join(info.description.split())


class _Described(BaseModel):
    """A group of settings, each field described by the docstring under it (``_one_line``)."""

    model_config = ConfigDict(use_attribute_docstrings=True, defer_build=True)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        _one_line(cls)


class RuntimeSettings(_Described):
    """How onnxruntime runs the models: the CUDA provider's options, padding and sessions per batch size, threads.
    The graph optimisation level, the inter-op threads and I/O binding are fixed (``service.serving.runtime``)."""

    cuda_tf32: bool = False
    """TF32 tensor cores for CUDA matmuls and convolutions: faster on Ampere and newer GPUs, but the probabilities then
    differ from the CPU path's by more than float32 rounding. Accuracy against speed: on where throughput matters more
    than a served probability agreeing with the exported model's to float32 precision"""
    cuda_conv_algo_search: Literal["EXHAUSTIVE", "HEURISTIC", "DEFAULT"] = "HEURISTIC"
    """how cuDNN picks a convolution algorithm for each new input shape (onnxruntime's cudnn_conv_algo_search):
    HEURISTIC asks cuDNN's heuristics; EXHAUSTIVE (onnxruntime's default) benchmarks every algorithm on the first batch
    of each size, at load since the sizes are warmed up; DEFAULT takes cuDNN's default algorithm. Which one serves
    fastest depends on the model's convolutions (docs/decisions/0001-gpu-run.md)"""
    pad_batches: Literal["auto", "on", "off"] = "auto"
    """pad every batch with zero rows up to the next bucket size (bucket_step), so that a session meets a handful of
    input shapes, each warmed up at load: on CUDA each new shape costs cuDNN an algorithm search and plan; auto = on for
    sessions that run on CUDA. /health lists each model's batch_buckets. Off computes no padded rows, but a batch size
    first met on live traffic pays its plan then"""
    bucket_sessions: Literal["auto", "on", "off"] = "auto"
    """with padding, a session of its own for each bucket size, so that every session meets one input shape:
    onnxruntime's CUDA convolutions keep the cuDNN descriptors and plan of the last shape only and rebuild them whenever
    the shape changes (docs/decisions/0020-bucket-sessions.md); auto = on for padding sessions that run on CUDA. GPU
    memory against speed: each model version then holds one session per bucket and instance; /health says
    bucket_sessions"""
    bucket_step: int = Field(default=8, ge=0)
    """the bucket sizes a padding session runs beyond the powers of two: the powers of two up to bucket_step, then every
    bucket_step rows up to the model's max_batch_size (64 and 8: 1, 2, 4, 8, 16, 24, ... 56, 64); 0 = the powers of two
    alone. Fewer padded rows against more buckets: each is warmed up at load and, with bucket_sessions, is a session of
    its own holding its memory"""
    cuda_graphs: bool = False
    """onnxruntime's enable_cuda_graph on the bucket sessions: each captures its whole graph once at load on fixed
    device buffers bound by I/O binding, and every batch replays it with one launch. Needs sessions on CUDA with padding
    and bucket_sessions. The kernel launches of a call against GPU memory (a graph and its buffers per bucket session)
    and the capture time at load; a model whose capture fails is served without graphs, and /health says cuda_graphs and
    graph_fallback"""
    intra_op_threads: int = Field(default=0, ge=0)
    """onnxruntime intra-op threads per session; 0 = the cores shared among the model's sessions (a session with its own
    core never waits for a sibling thread that the event loop has pre-empted). Set it on a node shared with other work,
    so that the sessions keep to the cores they are given"""


class BatchingConfig(_Described):
    """Dynamic batching of every model, and the onnxruntime sessions of each. Per model it can be overridden in
    ``artifacts/<model>/serving.json``, like Triton's ``dynamic_batching`` in config.pbtxt:
    ``{"max_batch_size": 32, "max_queue_delay_ms": 1, "instances": 1}``."""

    max_batch_size: int = Field(default=64, ge=1)
    """rows per onnxruntime call at most; on a GPU larger batches pay (also the largest padded size)"""
    max_queue_delay_ms: float = Field(default=0.0, ge=0)
    """an extra wait for a batch to fill; 0: a batch runs as soon as an inference thread is free"""
    max_queue_rows: int = Field(default=4096, ge=1)
    """rows queued at most; past that, 503 with Retry-After at once. In a pod the bound holds for the pod: each
    front-end queues its share (max_queue_rows / front-ends), and the engine holds only the batches the front-ends have
    in flight. Memory and the longest wait against refusals under a burst"""
    deadline_seconds: float = Field(default=30.0, gt=0)
    """how long a request waits at most for its outputs; past it, 503 with Retry-After (gRPC: UNAVAILABLE), as Triton's
    queue policy timeout answers. In a pod a front-end stops waiting for the engine's reply then, and an engine whose
    batch has run this long exits for the pod to restart it (a stuck session)"""
    instances: int = Field(default=0, ge=0, le=64)
    """onnxruntime sessions of the model, each on its own inference thread taking batches from the one queue (Triton's
    instance_group count); 0 = 2 on machines with 2 or more cores, else 1"""

    def sessions(self) -> int:
        """The number of sessions ``instances`` asks for on this machine."""
        return self.instances or min(2, os.cpu_count() or 1)


class PodSettings(_Described):
    """A pod of front-ends (``python -m service`` with ``CALIB_FRONTENDS`` > 1): the endpoint, index and wait the pod
    sets for its front-ends (not for operators), and the front-ends' window and the engine's timeline, which an
    operator or a benchmark may turn."""

    engine_endpoint: str | None = None
    """the ZeroMQ endpoint of an engine process (python -m service.engine) that runs this process's inference (a
    front-end opens no session of its own); unset: inference in this process"""
    index: int | None = Field(default=None, ge=0)
    """this front-end's index: front-end 0 runs the once-per-pod loops (the evaluator's passes, the pending-label
    joiner, retention); every front-end folds its labels into the sets' states"""
    engine_wait_seconds: float = Field(default=120.0, gt=0)
    """how long a front-end waits at start for the engine's first answer"""
    max_window: int = Field(default=2, ge=1, le=16)
    """a front-end's batches in flight to the engine at most, per model version. From 2, the window narrows to 1 while a
    full batch waits in the engine, and widens up to this while the engine's queue is empty at a reply and requests wait
    in the front-end. More in flight keeps the engine's sessions fed when the round trip is long against a batch, at the
    CPU of more, smaller messages; 2 keeps one batch running while the next forms"""
    timeline: Path | None = None
    """a file the engine appends one JSON line per batch to: when its inference thread came back to the queue and with
    how many rows queued, took the batch, ended the call, answered, and when its replies were sent; the engine benchmark
    splits the sessions' idle time with it. Unset: none (it costs a write per batch)"""


class LimitsSettings(_Described):
    """What one request may hold, and what a refused one is told."""

    max_rows_per_request: int = Field(default=1024, ge=1)
    """rows per inference request at most"""
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    """request body limit in bytes (413 past it), and the largest gRPC message"""
    max_image_pixels: int = Field(default=4096 * 4096, ge=64)
    """decoded image size limit (pixels)"""
    max_feedback_items: int = Field(default=10000, ge=1)
    """items per POST /feedback at most"""
    retry_after_seconds: int = Field(default=1, ge=1)
    """the Retry-After of a 503 (a full queue, a store away or slow)"""


class StoreSettings(_Described):
    """The store of predictions, labels, calibrations and the alarm's state."""

    url: str = "sqlite:///monitoring.db"
    """SQLAlchemy URL of the store; postgresql+psycopg://user@host:5432/db for replicas sharing one"""
    timeout_seconds: float = Field(default=5.0, gt=0)
    """the longest a store query may wait for a lock or run (PostgreSQL statement_timeout and lock_timeout, SQLite's
    busy timeout, pool checkout) before the request answers 503 with Retry-After; migrations and retention are exempt"""
    retention_days: float = Field(default=30.0, gt=0)
    """predictions older than this go, with their labels, and pending labels received before then; on PostgreSQL a day's
    partition at a time, so a prediction is kept this long to a day longer"""


class PredictionLogSettings(_Described):
    """The log of every served prediction, which labels are joined to (docs/api.md: the prediction log)."""

    enabled: bool = True
    """log every prediction for monitoring"""
    queue: int = Field(default=100000, ge=100)
    """prediction rows held in memory for the store at most, while it is away; past that they are dropped and counted in
    calib_prediction_log_dropped_total (async) or refused with 503 (sync)"""
    durability: Literal["async", "sync"] = "async"
    """async: write-behind, the answer does not wait for its rows (a process killed meanwhile loses up to
    CALIB_PREDICTION_LOG__INTERVAL_SECONDS of rows: their ids never become known, and labels sent for them expire as
    pending); sync: each answer waits until its rows are committed, so every id answered survives a crash (503 while the
    store is away)"""
    interval_seconds: float = Field(default=0.5, gt=0)
    """async: the longest a queued prediction waits for its write while the store is up (a full batch goes at once)"""


class LabelsSettings(_Described):
    """Labels sent to POST /feedback: how long one waits for its prediction, and whose count."""

    pending_seconds: float = Field(default=300.0, gt=0)
    """how long a label whose prediction is not in the store waits for it (pending) before it expires; expired labels
    are listed by GET /feedback/unmatched and counted in calib_pending_labels_resolved_total"""
    join_seconds: float = Field(default=0.5, gt=0)
    """seconds between the passes that join pending labels to their predictions (also right after this replica's
    prediction log has written rows while labels were pending)"""
    trusted_sources: str | None = None
    """the sources whose labels count for the alarm and the refit, comma-separated: feedback token names, and
    'anonymous' for labels sent where feedback is open; unset = every source. Labels of other sources are stored, in the
    windows and reported per source (/calibration?by_source=true)"""

    def trusted(self) -> frozenset[str] | None:
        """``trusted_sources`` as a set (None: every source is trusted)."""
        if self.trusted_sources is None:
            return None
        return frozenset(s.strip() for s in self.trusted_sources.split(",") if s.strip())


class MonitoringSettings(_Described):
    """Calibration reports, the alarm's evaluations and how replicas see each other's (docs/monitoring.md)."""

    window: str = "500"
    """the default window of GET /calibration: a label count (1000) or a duration (30m, 1h, 7d)"""
    n_bins: int = Field(default=15, ge=2, le=100)
    """equal-width confidence bins"""
    bootstrap_resamples: int = Field(default=1000, ge=100)
    """bootstrap resamples of the ECE interval"""
    detail_rows: int = Field(default=5000, ge=100)
    """the most recent labels of the window used for AdaECE, classwise ECE and the refit temperature (Guo et al. 2017
    fit T on 5,000 validation images); the bin statistics (ECE, its interval, MCE, bins) always use the whole window"""
    drift_rows: int = Field(default=500, ge=10)
    """recent predictions compared with the manifest's reference confidences (label-free drift)"""
    evaluate_every_labels: int = Field(default=1000, ge=1)
    """labels stored by this replica that start an alarm evaluation at once, before the next periodic one"""
    evaluate_sets_seconds: float = Field(default=0.1, gt=0)
    """at most this often, labels stored by this replica are folded into the prediction sets' adaptive thresholds and
    coverage alarms as soon as they arrive (the evaluation pass folds them too): a threshold lags the labels by their
    delay, not by an evaluation interval"""
    evaluate_seconds: float = Field(default=1.0, gt=0)
    """seconds between the background alarm evaluations of every served model version (they also take in labels stored
    by other replicas)"""
    refresh_seconds: float = Field(default=5.0, gt=0)
    """seconds between the passes that pick up what other replicas stored: a newly activated calibration version, the
    prediction sets' states"""
    webhook_url: str | None = None
    """alarm transitions are POSTed here as JSON"""


class ShiftSettings(_Described):
    """Label-free estimates from the served probabilities: the accuracy they promise with its interval, the class
    priors of the traffic (label shift), and how they are checked once labels come (docs/monitoring.md)."""

    interval_level: float = Field(default=0.95, gt=0, lt=1)
    """the probability of the estimated accuracy's interval (Poisson-binomial, Kivimaki et al. 2024) and of the
    estimated priors' intervals"""
    check_labels: int = Field(default=500, ge=10)
    """labels per check of the estimated accuracy's interval: each block of this many labels, in label order, counts as
    one window where the interval held its realized accuracy or not"""
    prior_resamples: int = Field(default=200, ge=0)
    """bootstrap resamples of the EM priors' intervals (0: none); the rows are the drift window's"""
    adapt: Literal["off", "alarm", "always"] = "off"
    """serve probabilities adapted to the traffic's class priors (EM on the drift window, Saerens et al. 2002) and
    prediction sets by the weighted conformal quantile (Podkopaev & Ramdas 2021): off; alarm, while the label-shift
    alarm is raised; always, whenever priors are estimated. A request's adapt_priors overrides it"""
    alarm_tolerance: float = Field(default=0.02, ge=0, lt=1)
    """the label-shift alarm's material change: a change of the class priors of total variation up to this is inside its
    null (beside the margins of the reference's own sampling error)"""
    alarm_threshold: float = Field(default=1e8, gt=1)
    """A of the label-shift alarm: while the traffic's class means stay inside the band, P(a false alarm within n
    predictions) <= n / A (1e8: at most 1% per million predictions)"""
    alarm_clear_threshold: float = Field(default=1e8, gt=1)
    """B: a raised label-shift alarm clears when the evidence that every class is back inside its band reaches B
    (hysteresis)"""
    fold_rate: float = Field(default=1000.0, gt=0)
    """the most served predictions a second the label-shift alarm folds: above it, a sample chosen by the prediction
    ids' random bits (independent of what they hold, so the alarm's guarantee stands), which bounds its cost at any
    traffic and slows its detection, counted in predictions, by the sampling factor"""
    settle_seconds: float = Field(default=5.0, ge=0)
    """the label-shift alarm folds the predictions served at least this long ago, so that the prediction logs of every
    replica have written theirs (a prediction written later is passed over)"""
    accuracy_floor: float | None = Field(default=None, gt=0, lt=1)
    """the accuracy below which the EstimatedAccuracyBelowFloor alert fires, exported as the gauge calib_accuracy_floor;
    unset: no floor, no alert"""


class ConformalSettings(_Described):
    """The prediction sets' defaults when a request does not say, and how they follow the labels
    (docs/conformal.md)."""

    method: Literal["lac", "aps", "raps"] | None = None
    """the sets' score when a request names none; unset: the artifact's default"""
    coverage: float | None = Field(default=None, gt=0, lt=1)
    """the sets' coverage 1 - alpha when a request names none; unset: the artifact's default"""
    levels: str = "0.8,0.9,0.95"
    """the coverage levels served, comma-separated, each in (0, 1), besides the default coverage; a request for any
    other is refused naming the field and the levels (422 on /predict, 400 on v2 REST, INVALID_ARGUMENT on gRPC), so
    that adaptive state and metric series exist only for these"""
    randomized: bool = False
    """serve the exact sets when a request does not say: randomized APS and RAPS and LAC without its top-label floor,
    whose coverage is 1 - alpha to within 1 / (n + 1) but which may be empty and, for APS and RAPS, differ between two
    rows of the same input; false: the floor sets, never empty, the same for the same input, coverage at least 1 -
    alpha"""
    adaptation: Literal["log-quantile", "off"] = "log-quantile"  # calibkit.conformal.adaptive.DEFAULT_METHOD
    """how each set choice's threshold adapts online from the labels, in label order, so that long-run coverage holds
    under shift: the quantile tracker of conformal PID control (Angelopoulos, Candès & Tibshirani 2023) on the log scale
    of the score's distance to its top, fed each label's own score so that late and batched labels do not destabilise it
    (log-quantile), or off (the static split-conformal threshold)"""
    step: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description=f"the adaptation's step eta per label, on the log scale; unset: the rule's default, {DEFAULT_STEP}",
    )
    alarm_threshold: float = Field(default=DEFAULT_THRESHOLD, gt=1)
    """A of the coverage alarm, which watches each label's miss at the static threshold: while the labelled traffic is
    exchangeable with the calibration split, P(a false alarm within n labels) <= n / A + 0.01 (the 0.01: a calibration
    split whose static sets miss more than the alarm's tolerance)"""

    @field_validator("levels")
    @classmethod
    def _levels(cls, value: str) -> str:
        """Comma-separated numbers in (0, 1) (the message names the entry at fault)."""
        conformal_levels(value)
        return value


class AuthSettings(_Described):
    """Named bearer tokens per route group (docs/security.md). Each group's tokens are given one way: inline or in a
    file, a mounted Secret re-read when it changes. A group without tokens is open, but admin, which is then off."""

    # an invalid token setting is reported by name, never by its value
    model_config = ConfigDict(hide_input_in_errors=True)

    predict_tokens: SecretStr | None = None
    """bearer tokens of POST /predict and v2 infer (REST, and gRPC metadata authorization), as name:token,name:token;
    unset (and no file) = open"""
    predict_tokens_file: Path | None = None
    """a file of predict tokens (name:token per line or comma, # comments; a mounted Secret), re-read within
    CALIB_AUTH__REFRESH_SECONDS when it changes; a broken file keeps the previous tokens (logged)"""
    feedback_tokens: SecretStr | None = None
    """bearer tokens of POST /feedback and GET /feedback/unmatched, as name:token,...; unset (and no file) = open"""
    feedback_tokens_file: Path | None = None
    """a file of feedback tokens, re-read when it changes"""
    admin_tokens: SecretStr | None = None
    """bearer tokens of /admin/* and of the store's error text in /health, as name:token,...; with no admin token at
    all, the admin endpoints are off (403)"""
    admin_tokens_file: Path | None = None
    """a file of admin tokens, re-read when it changes"""
    refresh_seconds: float = Field(default=5.0, gt=0)
    """seconds between the checks of the token files for changes"""

    @field_validator("predict_tokens", "feedback_tokens", "admin_tokens")
    @classmethod
    def _token_list(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        """``name:token`` pairs (the message names the entry at fault, never a token)."""
        if value is not None:
            assert info.field_name is not None  # set for a field validator
            parse_tokens(value.get_secret_value(), env_name(f"auth.{info.field_name}"))
        return value

    @model_validator(mode="after")
    def _one_way(self) -> AuthSettings:
        """Each group's tokens inline or in a file, not both (the message names both variables)."""
        for group in GROUPS:
            inline, file = f"auth.{group}_tokens", f"auth.{group}_tokens_file"
            if getattr(self, f"{group}_tokens") is not None and getattr(self, f"{group}_tokens_file") is not None:
                raise ValueError(
                    f"{env_name(inline)} and {env_name(file)} are both set: give the {group} tokens one way"
                )
        return self


class Settings(BaseSettings):
    """All settings of the service, from ``CALIB_*`` environment variables, and from the flags of
    ``python -m service`` where it has one."""

    # hide_input_in_errors: an invalid token setting is reported by name, never by its value
    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        env_nested_delimiter="__",
        extra="ignore",
        hide_input_in_errors=True,
        use_attribute_docstrings=True,
        defer_build=True,
    )

    artifacts: Path = Path("artifacts")
    """the model repository: <model>/<version>/model.onnx and manifest.json, and per model an optional serving.json
    (CALIB_BATCHING__*)"""
    default_model: str | None = None
    """the model a request that names none gets; unset: the alphabetically first"""
    host: str = "127.0.0.1"
    """the address the HTTP and gRPC listeners bind"""
    port: int = Field(default=8000, ge=0, le=65535)
    """the HTTP port (0: a free one)"""
    grpc: bool = True
    """serve the Open Inference Protocol over gRPC too, on the same host"""
    grpc_port: int = Field(default=8081, ge=0, le=65535)
    """the gRPC port (0: a free one, shown in /health as grpc_port); a port that cannot be bound stops the start"""
    device: Device = "auto"
    """where the models run: auto (CUDA when onnxruntime can use a GPU, else CPU), cpu, or cuda (warns and serves on CPU
    without a usable GPU)"""
    frontends: Annotated[int, Field(ge=1, le=256)] | Literal["auto"] = 1
    """front-end processes in front of one engine process that owns the sessions and the batchers, on the same HTTP and
    gRPC ports: python -m service starts and supervises them, restarts any that ends, and /health names the answering
    one under pod (docs/decisions/0027-engine-process.md); 1: inference in this process, no IPC; auto: the cores less
    one (at most 16) where CUDA runs the models, else 1. The engine's queue bound is the models'
    CALIB_BATCHING__MAX_QUEUE_ROWS"""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """the log level"""
    graceful_shutdown_seconds: float = Field(default=30.0, ge=0)
    """how long in-flight and queued requests may take after SIGTERM"""
    opentelemetry: bool = False
    """FastAPI's native OpenTelemetry spans, metrics and logs (when a provider is configured); off by default: it looks
    the provider up on every request, on the hot path, and /metrics already has Prometheus metrics"""
    runtime: RuntimeSettings = RuntimeSettings()
    batching: BatchingConfig = BatchingConfig()
    alarm: AlarmPolicy = AlarmPolicy()
    pod: PodSettings = PodSettings()
    limits: LimitsSettings = LimitsSettings()
    store: StoreSettings = StoreSettings()
    prediction_log: PredictionLogSettings = PredictionLogSettings()
    labels: LabelsSettings = LabelsSettings()
    monitoring: MonitoringSettings = MonitoringSettings()
    shift: ShiftSettings = ShiftSettings()
    conformal: ConformalSettings = ConformalSettings()
    auth: AuthSettings = AuthSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The init arguments, then the environment with its old names renamed: a new name wins."""
        assert isinstance(env_settings, EnvSettingsSource)
        rename_old_names(env_settings, init_settings())
        return init_settings, env_settings, dotenv_settings, file_secret_settings


_one_line(Settings)


def setting_path(variable: str) -> str | None:
    """The setting or group a variable sets (``CALIB_CONFORMAL__METHOD`` -> ``conformal.method``), else None."""
    if not variable.startswith(PREFIX):
        return None
    node: Any = Settings
    names = variable.removeprefix(PREFIX).lower().split("__")
    for name in names:
        if dataclasses.is_dataclass(node):
            node = get_type_hints(node).get(name)
        elif isinstance(node, type) and issubclass(node, BaseModel) and name in node.model_fields:
            node = node.model_fields[name].annotation
        else:
            return None
        if node is None:
            return None
    return ".".join(names)
