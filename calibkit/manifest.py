"""The calibration manifest: the contract between the training export and the service.

Every artifact ``artifacts/<name>/<version>/`` holds ``model.onnx`` and ``manifest.json``; this
module is the one definition of that JSON. ``load_manifest`` turns any problem into a
``ValueError`` naming the field, so a broken artifact is refused with a clear message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from calibkit.validation import expected

SCHEMA_VERSION: Literal[1] = 1
MANIFEST_FILE = "manifest.json"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(_Strict):
    """The ONNX input: its name, shape (None for the dynamic batch axis) and element type."""

    name: str
    shape: list[int | None] = Field(min_length=4, max_length=4)
    dtype: Literal["float32"] = "float32"

    @field_validator("shape")
    @classmethod
    def _batch_dynamic(cls, shape):
        if shape[0] is not None or any(d is None or d < 1 for d in shape[1:]):
            raise ValueError(expected("shape", "[null, C, H, W] with positive C, H, W", shape))
        return shape


class Preprocessing(_Strict):
    """How to turn an image into the model input: decode to ``color_mode``, resize to
    ``image_size`` x ``image_size`` (``resample``), scale pixel values by ``scale`` into [0, 1]
    and, when ``invert``, take 1 - value (for data stored as ink-is-high, like scikit-learn's
    digits, while photos and scans have dark ink on light paper); layout NCHW.
    Any normalisation (mean/std) happens inside the ONNX graph."""

    color_mode: Literal["L", "RGB"]
    image_size: int = Field(ge=1)
    resample: Literal["bilinear", "nearest", "bicubic"] = "bilinear"
    scale: float = Field(default=1.0 / 255.0, gt=0)
    invert: bool = False
    layout: Literal["NCHW"] = "NCHW"
    value_range: tuple[float, float] = (0.0, 1.0)


class CalibrationSpec(_Strict):
    """The post-hoc calibration of the ``probabilities`` output, and where it was fitted."""

    method: str
    params: dict[str, Any]
    objective: str | None = None
    fitted_on: str = "validation"
    n_samples: int = Field(ge=1)
    in_graph: bool = Field(description="true when the ONNX probabilities output already applies it")

    @property
    def temperature(self) -> float | None:
        """The temperature of temperature scaling, None for other methods."""
        return float(self.params["temperature"]) if self.method == "temperature" else None


class ReferenceDistribution(_Strict):
    """Calibrated top-label confidences on the validation split: the label-free baseline against
    which the service compares live traffic (e.g. a two-sample KS test)."""

    split: str = "validation"
    confidences: list[float] = Field(min_length=1)
    accuracy: float = Field(ge=0, le=1)
    ece: float = Field(ge=0, le=1)

    @field_validator("confidences")
    @classmethod
    def _in_unit_interval(cls, values):
        outside = [v for v in values if not 0.0 <= v <= 1.0]
        if outside:
            raise ValueError(f"Expected `confidences` to lie in [0, 1], but got {outside[0]!r}")
        return sorted(values)


class Manifest(_Strict):
    """Everything the service needs to serve, explain and monitor one model version."""

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    version: str = Field(pattern=r"^[0-9]+$")
    created_at: str
    model_file: str = "model.onnx"
    model_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    class_names: list[str] = Field(min_length=2)
    input: InputSpec
    outputs: dict[str, str]
    preprocessing: Preprocessing
    calibration: CalibrationSpec
    metrics: dict[str, Any] = {}
    reference: ReferenceDistribution
    training: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _consistent(self):
        if len(set(self.class_names)) != len(self.class_names):
            repeated = sorted({name for name in self.class_names if self.class_names.count(name) > 1})
            raise ValueError(f"Expected `class_names` to be unique, but got {repeated} more than once")
        if not {"logits", "probabilities"} <= self.outputs.keys():
            raise ValueError(
                f"Expected `outputs` to name the 'logits' and 'probabilities' outputs, but got {sorted(self.outputs)}"
            )
        channels = 1 if self.preprocessing.color_mode == "L" else 3
        wanted = [None, channels, self.preprocessing.image_size, self.preprocessing.image_size]
        if self.input.shape != wanted:
            raise ValueError(
                f"Expected `input.shape` to be {wanted} (from `preprocessing`), but got {self.input.shape}"
            )
        return self


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate a manifest.

    Args:
        path: The ``manifest.json`` file.

    Returns:
        The validated manifest.

    Raises:
        ValueError: Naming the file and, for an invalid manifest, each field at fault.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no manifest file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"{path}: invalid manifest: {problems}") from None


def write_manifest(manifest: Manifest, directory: str | Path) -> Path:
    """Write a manifest as ``manifest.json``.

    Args:
        manifest: The manifest.
        directory: The artifact directory to write it into.

    Returns:
        The path written.
    """
    path = Path(directory) / MANIFEST_FILE
    path.write_text(manifest.model_dump_json(indent=2))
    return path
