"""``Settings``: the server's identity at the top, everything else in groups by concern (``service.settings.groups``).

Top level are what an operator sets first, the command-line flags and the ports (``CALIB_<NAME>``); each group is
``CALIB_<GROUP>__<NAME>``, or the whole group as a JSON object in ``CALIB_<GROUP>``. Init arguments take the same
shape: ``Settings(conformal={"method": "aps"})``. The old names are accepted, in the environment only,
for one release (``service.settings.deprecated``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Literal, get_type_hints

from pydantic import BaseModel, Field
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from calibkit.alarms import AlarmPolicy
from service.settings.deprecated import DeprecatedNames
from service.settings.groups import (
    PREFIX,
    AuthSettings,
    BatchingConfig,
    ConformalSettings,
    LabelsSettings,
    LimitsSettings,
    MonitoringSettings,
    PodSettings,
    PredictionLogSettings,
    RuntimeSettings,
    ShiftSettings,
    StoreSettings,
)

#: Where the models run (``CALIB_DEVICE``).
Device = Literal["auto", "cpu", "cuda"]


class Settings(BaseSettings):
    """All settings of the service, from ``CALIB_*`` environment variables, and from the flags of
    ``python -m service`` where it has one."""

    # hide_input_in_errors: an invalid token setting is reported by name, never by its value
    model_config = SettingsConfigDict(
        env_prefix=PREFIX, env_nested_delimiter="__", extra="ignore", hide_input_in_errors=True
    )

    artifacts: Path = Field(
        default=Path("artifacts"),
        description="the model repository: <model>/<version>/model.onnx and manifest.json, and per model an optional "
        "serving.json (CALIB_BATCHING__*)",
    )
    default_model: str | None = Field(
        default=None, description="the model a request that names none gets; unset: the alphabetically first"
    )
    host: str = Field(default="127.0.0.1", description="the address the HTTP and gRPC listeners bind")
    port: int = Field(default=8000, ge=0, le=65535, description="the HTTP port (0: a free one)")
    grpc: bool = Field(default=True, description="serve the Open Inference Protocol over gRPC too, on the same host")
    grpc_port: int = Field(
        default=8081,
        ge=0,
        le=65535,
        description="the gRPC port (0: a free one, shown in /health as grpc_port); a port that cannot be bound stops "
        "the start",
    )
    device: Device = Field(
        default="auto",
        description="where the models run: auto (CUDA when onnxruntime can use a GPU, else CPU), cpu, or cuda (warns "
        "and serves on CPU without a usable GPU)",
    )
    frontends: Annotated[int, Field(ge=1, le=256)] | Literal["auto"] = Field(
        default=1,
        description="front-end processes in front of one engine process that owns the sessions and the batchers, on "
        "the same HTTP and gRPC ports: python -m service starts and supervises them, restarts any that ends, and "
        "/health names the answering one under pod (docs/decisions/0027-engine-process.md); 1: inference in this "
        "process, no IPC; auto: the cores less one (at most 16) where CUDA runs the models, else 1. The engine's "
        "queue bound is the models' CALIB_BATCHING__MAX_QUEUE_ROWS",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="the log level")
    graceful_shutdown_seconds: float = Field(
        default=30.0, ge=0, description="how long in-flight and queued requests may take after SIGTERM"
    )
    opentelemetry: bool = Field(
        default=False,
        description="FastAPI's native OpenTelemetry spans, metrics and logs (when a provider is configured); off by "
        "default: it looks the provider up on every request, on the hot path, and /metrics already has Prometheus "
        "metrics",
    )
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
        """The init arguments, the environment, then the old names (``DeprecatedNames``), so that new names win."""
        assert isinstance(env_settings, EnvSettingsSource)
        deprecated = DeprecatedNames(settings_cls, env_settings)
        return init_settings, env_settings, deprecated, dotenv_settings, file_secret_settings


def setting_path(variable: str) -> str | None:
    """The dotted path of the setting (or group) an environment variable sets, ``CALIB_CONFORMAL__METHOD`` ->
    ``conformal.method``; None where it sets none, an old name included."""
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
