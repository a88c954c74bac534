"""The model repository: every ``artifacts/<model>/<version>/`` loaded, checked and warmed up; a broken version is
refused (logged, listed under ``failed`` in /health) without stopping the others."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from calibkit.manifest import Manifest, load_manifest
from service.errors import ModelNotFound, NotReady
from service.serving.adaptation import Adaptation
from service.serving.batching import Batcher
from service.serving.conformal import ModelSets
from service.serving.runtime import ModelRuntime, Runtime, create_runtime, preload_cuda_libraries
from service.settings import BatchingConfig, Settings
from service.settings_env import conformal_levels

log = logging.getLogger("service.serving.repository")

SERVING_FILE = "serving.json"


@dataclass
class ServedModel:
    """One loaded model version with its runtime and (once started) its batcher."""

    name: str
    version: str
    directory: Path
    manifest: Manifest
    runtimes: list[Runtime]
    batching: BatchingConfig
    batcher: Batcher | None = None
    sets: ModelSets = field(default_factory=lambda: ModelSets({}, reason="not loaded"))
    adaptation: Adaptation | None = None  # the class priors adaptations serve (``service.monitoring.shift_alarm``)

    @property
    def runtime(self) -> Runtime:
        """The first session (all of them have the same signature and provider)."""
        return self.runtimes[0]

    @property
    def shape(self) -> tuple[int, ...]:
        """Per-row input shape: (C, H, W) or (F,)."""
        return self.manifest.input.row_shape

    @property
    def ready(self) -> bool:
        return self.batcher is not None and self.batcher.ready


@dataclass
class ModelRepository:
    """All served models by name and version, plus the artifacts that were refused."""

    settings: Settings
    models: dict[str, dict[str, ServedModel]] = field(default_factory=dict)
    failed: list[dict] = field(default_factory=list)
    default: str | None = None
    cuda_libraries: list[str] | None = None

    def load(self, sessions: bool = True) -> None:
        """Load every version of ``settings.artifacts`` (without ``sessions``: no onnxruntime session)."""
        if sessions:
            self.cuda_libraries = preload_cuda_libraries(self.settings.device)
        root = self.settings.artifacts
        if not root.is_dir():
            log.error("artifacts directory %s does not exist: no model to serve", root)
            self.failed.append({"path": ".", "error": "the artifacts directory does not exist"})
            return
        for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            try:
                batching = _batching_for(model_dir, self.settings.batching)
            except ValueError as exc:
                self._refuse(model_dir, str(exc))
                continue
            for version_dir in sorted((p for p in model_dir.iterdir() if p.is_dir()), key=_version_key):
                try:
                    served = load_version(version_dir, self.settings, batching, sessions)
                except Exception as exc:  # noqa: BLE001 - any broken artifact is refused, never fatal
                    self._refuse(version_dir, str(exc))
                    continue
                self.models.setdefault(served.name, {})[served.version] = served
                log.info(
                    "loaded %s version %s from %s on %s",
                    served.name,
                    served.version,
                    version_dir,
                    served.runtime.provider if served.runtimes else "the engine",
                )
        self.default = self._choose_default()

    def _refuse(self, path: Path, error: str) -> None:
        """Log the refusal in full; list it for /health without this machine's absolute paths."""
        log.error("refused artifact %s: %s", path, error)
        root = self.settings.artifacts
        self.failed.append(
            {
                "path": path.relative_to(root).as_posix(),
                "error": error.replace(f"{root.resolve()}/", "").replace(f"{root}/", ""),
            }
        )

    def _choose_default(self) -> str | None:
        wanted = self.settings.default_model
        if wanted is not None:
            if wanted not in self.models:
                log.error("default model %r is not loaded; requests must name a model", wanted)
                return None
            return wanted
        return min(self.models) if self.models else None

    def all(self) -> list[ServedModel]:
        """Every served version, by name then version."""
        return [
            m for name in sorted(self.models) for _, m in sorted(self.models[name].items(), key=lambda kv: int(kv[0]))
        ]

    def get(self, name: str | None = None, version: str | None = None) -> ServedModel:
        """The named model (default model when None) at ``version`` (latest when None)."""
        if name is None:
            if self.default is None:
                raise NotReady("no default model is loaded: name one in 'model' (see GET /models)")
            name = self.default
        versions = self.models.get(name)
        if not versions:
            known = ", ".join(sorted(self.models)) or "none"
            raise ModelNotFound(f"unknown model {name!r}; loaded models: {known}", field="model")
        if version is None:
            version = max(versions, key=int)
        if version not in versions:
            raise ModelNotFound(
                f"model {name!r} has no version {version!r}; versions: {', '.join(sorted(versions, key=int))}",
                field="version",
            )
        return versions[version]

    def latest_version(self, name: str) -> str:
        return max(self.models[name], key=int)


def _version_key(path: Path):
    return (0, int(path.name), "") if path.name.isdigit() else (1, 0, path.name)


def _batching_for(model_dir: Path, defaults: BatchingConfig) -> BatchingConfig:
    path = model_dir / SERVING_FILE
    if not path.is_file():
        return defaults
    try:
        return BatchingConfig.model_validate(defaults.model_dump() | json.loads(path.read_text()))
    except (json.JSONDecodeError, ValidationError, TypeError) as exc:
        raise ValueError(f"{path}: invalid serving configuration: {exc}") from None


def load_version(directory: Path, settings: Settings, batching: BatchingConfig, sessions: bool = True) -> ServedModel:
    """Load, check and warm up one artifact version; ``ValueError`` says what is wrong."""
    if not directory.name.isdigit():
        raise ValueError(f"version directories must be numbers, got {directory.name!r}")
    manifest = load_manifest(directory / "manifest.json")
    if manifest.name != directory.parent.name or manifest.version != directory.name:
        raise ValueError(
            f"manifest says {manifest.name}/{manifest.version} but it lies in {directory.parent.name}/{directory.name}"
        )
    model_path = directory / manifest.model_file
    if not model_path.resolve().is_relative_to(directory.resolve()):
        raise ValueError(f"model_file {manifest.model_file!r} lies outside the version folder")
    if not model_path.is_file():
        raise ValueError(f"model file {model_path} is missing")
    digest = hashlib.sha256(model_path.read_bytes()).hexdigest()
    if digest != manifest.model_sha256:
        raise ValueError(
            f"{model_path} does not match the manifest's sha256 (file {digest[:12]}..., "
            f"manifest {manifest.model_sha256[:12]}...)"
        )
    runtimes = _sessions(model_path, manifest, settings, batching) if sessions else []
    sets = ModelSets.load(
        directory,
        manifest,
        settings.conformal.method,
        settings.conformal.coverage,
        conformal_levels(settings.conformal.levels),
        settings.conformal.randomized,
    )
    return ServedModel(manifest.name, manifest.version, directory, manifest, runtimes, batching, sets=sets)


def _sessions(model_path: Path, manifest: Manifest, settings: Settings, batching: BatchingConfig) -> list:
    """The version's onnxruntime sessions, checked against the manifest and warmed up."""
    count = batching.sessions()
    runtimes = [
        create_runtime(model_path, settings, count, max_batch_size=batching.max_batch_size) for _ in range(count)
    ]
    _check_signature(runtimes[0], manifest)
    for each in runtimes:
        _warm_up(each, manifest, batching)
    return runtimes


def _check_signature(runtime: ModelRuntime, manifest: Manifest) -> None:
    inputs = runtime.session.get_inputs()
    if len(inputs) != 1 or inputs[0].name != manifest.input.name:
        raise ValueError(
            f"ONNX inputs {[i.name for i in inputs]} do not match the manifest input {manifest.input.name!r}"
        )
    declared = inputs[0].shape[1:]
    if len(inputs[0].shape) != len(manifest.input.shape) or any(
        isinstance(d, int) and d != m for d, m in zip(declared, manifest.input.shape[1:])
    ):
        raise ValueError(f"ONNX input shape {inputs[0].shape} does not match the manifest {manifest.input.shape}")
    missing = {manifest.outputs["logits"], manifest.outputs["probabilities"]} - set(runtime.output_names)
    if missing:
        raise ValueError(f"ONNX outputs {runtime.output_names} lack {sorted(missing)} named in the manifest")


def _warm_up(runtime: ModelRuntime, manifest: Manifest, batching: BatchingConfig) -> None:
    """Run one row and the largest batch, or every bucket, once and check the outputs (timed in ``warmup_seconds``)."""
    started = time.perf_counter()
    k = len(manifest.class_names)
    for rows in runtime.buckets or sorted({1, batching.max_batch_size}):
        outputs = runtime.run(np.zeros((rows, *manifest.input.row_shape), dtype=np.float32))
        probs = outputs[manifest.outputs["probabilities"]]
        if outputs[manifest.outputs["logits"]].shape != (rows, k) or probs.shape != (rows, k):
            raise ValueError(
                f"warm-up: outputs have shapes {[o.shape for o in outputs.values()]}, expected ({rows}, {k})"
            )
        if not np.allclose(probs.sum(axis=1), 1.0, atol=1e-4):
            raise ValueError("warm-up: the probabilities output does not sum to 1")
    runtime.warmup_seconds += time.perf_counter() - started
