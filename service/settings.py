"""Service configuration from environment variables (prefix ``CALIB_``) and command-line flags.

Per-model dynamic batching can be overridden in ``artifacts/<model>/serving.json`` (like Triton's
``dynamic_batching`` in config.pbtxt): ``{"max_batch_size": 64, "max_queue_delay_ms": 2, "max_queue_rows": 4096}``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class BatchingConfig(BaseModel):
    """Dynamic batching of one model: at most ``max_batch_size`` rows per onnxruntime call, waiting
    at most ``max_queue_delay_ms`` for a batch to fill, and at most ``max_queue_rows`` rows queued
    (past that, requests get 503 with Retry-After)."""

    max_batch_size: int = Field(default=64, ge=1)
    max_queue_delay_ms: float = Field(default=2.0, ge=0)
    max_queue_rows: int = Field(default=4096, ge=1)


class Settings(BaseSettings):
    """All knobs of the service; every field can be set as ``CALIB_<NAME>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="CALIB_", env_nested_delimiter="__", extra="ignore")

    artifacts: Path = Path("artifacts")
    default_model: str | None = Field(default=None, description="model used when a request names none")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="auto: CUDA when onnxruntime can use a GPU, else CPU; cuda: warn and fall back"
    )
    intra_op_threads: int = Field(default=0, ge=0, description="onnxruntime intra-op threads; 0 = one per core")
    inter_op_threads: int = Field(default=1, ge=1)
    graph_optimization: Literal["disable", "basic", "extended", "all"] = "all"
    batching: BatchingConfig = BatchingConfig()
    max_rows_per_request: int = Field(default=1024, ge=1)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    max_image_pixels: int = Field(default=4096 * 4096, ge=64, description="decoded image size limit (pixels)")
    retry_after_seconds: int = Field(default=1, ge=1)
    graceful_shutdown_seconds: float = Field(default=30.0, ge=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
