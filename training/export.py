"""ONNX export with calibration baked in, a parity check on onnxruntime, and the artifact layout.

The exported graph has one input and two outputs: ``logits`` and ``probabilities`` = softmax((w * logits + b) / T),
which is temperature scaling (w = 1, b = 0; Guo et al. 2017), vector scaling (T = 1) or bias-corrected temperature
scaling (w = 1 / T, T = 1; Alexandari et al. 2020). Any ONNX consumer therefore gets calibrated probabilities. When the
calibration was fitted on a part of the validation split, the conformal scores of the other part are computed from the
exported graph's ``probabilities`` output, the probabilities the service serves, and written to ``conformal.json``.
"""

from __future__ import annotations

import hashlib
import shutil
import warnings
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from torch import nn

from calibkit.calibrators import BiasCorrectedTemperatureScaling, Calibrator, TemperatureScaling, VectorScaling
from calibkit.manifest import (
    CONFORMAL_FILE,
    CalibrationSpec,
    ConformalSpec,
    InputSpec,
    LabelShiftReference,
    Manifest,
    Preprocessing,
    ReferenceDistribution,
    write_manifest,
)
from training.conformal import CalibrationSplit, fit_conformal, write_conformal
from training.inference import onnx_outputs, onnx_session, predict_logits

OPSET = 17
#: Largest accepted |onnxruntime - reference| on the validation split: for logits relative to their
#: largest magnitude (float32 rounding grows with it), for probabilities absolute.
MAX_LOGIT_REL_DIFF, MAX_PROB_DIFF = 1e-4, 1e-5


class ExportError(RuntimeError):
    """The export could not produce a faithful ONNX model."""


def calibration_head(calibrator: Calibrator) -> tuple[np.ndarray | None, np.ndarray | None, float]:
    """(w, b, T) of softmax((w * logits + b) / T) for a calibrator a graph can carry: temperature scaling (w and b
    None: w = 1, b = 0), vector scaling (T = 1) or BCTS (w = 1 / T, T = 1); ExportError for any other method."""
    if isinstance(calibrator, TemperatureScaling):
        return None, None, float(calibrator.temperature)
    if isinstance(calibrator, VectorScaling):
        assert calibrator.w is not None and calibrator.b is not None  # fitted
        return calibrator.w, calibrator.b, 1.0
    if isinstance(calibrator, BiasCorrectedTemperatureScaling):
        assert calibrator.b is not None  # fitted
        return np.full(len(calibrator.b), 1.0 / calibrator.temperature), calibrator.b, 1.0
    raise ExportError(
        f"calibration method {calibrator.method!r} cannot be baked into ONNX; "
        "export with 'temperature', 'vector' or 'bcts' (the others are for evaluation)"
    )


class CalibratedClassifier(nn.Module):
    """``x -> (logits, softmax((w * logits + b) / T))`` around a trained classifier."""

    def __init__(self, model: nn.Module, calibrator: Calibrator):
        super().__init__()
        w, b, t = calibration_head(calibrator)
        k = calibrator.n_classes
        assert k is not None  # fitted
        self.model = model
        self.register_buffer("w", torch.tensor(np.ones(k) if w is None else w, dtype=torch.float32).view(1, -1))
        self.register_buffer("b", torch.tensor(np.zeros(k) if b is None else b, dtype=torch.float32).view(1, -1))
        self.register_buffer("t", torch.tensor(float(t), dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(x)
        return logits, torch.softmax((logits * self.w + self.b) / self.t, dim=1)


def export_onnx(model: nn.Module, calibrator: Calibrator, input_shape: tuple[int, int, int], path: Path) -> None:
    """Write the calibrated classifier to ``path`` with a dynamic batch axis."""
    wrapper = CalibratedClassifier(model, calibrator).eval()
    dummy = torch.zeros((1, *input_shape), dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            wrapper,
            (dummy,),
            str(path),
            input_names=["input"],
            output_names=["logits", "probabilities"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}, "probabilities": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )


def check_parity(model: nn.Module, calibrator: Calibrator, onnx_path: Path, x: np.ndarray) -> dict:
    """Max |onnxruntime - reference| of the logits (torch's) and probabilities (calibkit's); ExportError past bounds."""
    reference_logits = predict_logits(model, x)
    outputs = onnx_outputs(onnx_session(onnx_path), x)
    parity = {
        "n": len(x),
        "max_abs_logit": float(np.max(np.abs(reference_logits))),
        "max_abs_diff_logits": float(np.max(np.abs(outputs["logits"] - reference_logits))),
        "max_abs_diff_probabilities": float(
            np.max(np.abs(outputs["probabilities"] - calibrator.transform(reference_logits)))
        ),
    }
    logit_bound = MAX_LOGIT_REL_DIFF * max(1.0, parity["max_abs_logit"])
    if parity["max_abs_diff_logits"] > logit_bound or parity["max_abs_diff_probabilities"] > MAX_PROB_DIFF:
        raise ExportError(f"ONNX output differs from the reference beyond the bounds: {parity}")
    return parity


def version_directory(root: Path, name: str, version: str | None, overwrite: bool) -> Path:
    """The new, empty ``root/name/version`` (None: the highest numeric one + 1); replaced only with ``overwrite``."""
    existing = [int(p.name) for p in (root / name).glob("*") if p.is_dir() and p.name.isdigit()]
    directory = root / name / (version or str(max(existing, default=0) + 1))
    if directory.exists():
        if not overwrite:
            raise FileExistsError(f"{directory} exists; pass --overwrite or another --version")
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    return directory


def write_artifact_manifest(
    directory: Path,
    calibrator: Calibrator,
    n_fitted: int,
    probs: np.ndarray,
    labels: np.ndarray,
    *,
    class_names: Sequence[str],
    input_name: str,
    row_shape: Sequence[int],
    preprocessing: Preprocessing | None,
    ece: float,
    metrics: dict,
    training: dict,
    conformal: ConformalSpec | None,
    split: str = "validation",
    fitted_on: str = "validation",
) -> Manifest:
    """Write the manifest of the version folder ``directory`` (named ``<name>/<version>``) around its
    ``model.onnx``, which bakes in ``calibrator`` (fitted on ``n_fitted`` rows of ``fitted_on``), with the
    reference and label-shift entry of the served probabilities ``probs`` of the rows ``labels`` of ``split``."""
    manifest = Manifest(
        name=directory.parent.name,
        version=directory.name,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        model_sha256=sha256_of(directory / "model.onnx"),
        class_names=list(class_names),
        input=InputSpec(name=input_name, shape=[None, *row_shape]),
        outputs={"logits": "logits", "probabilities": "probabilities"},
        preprocessing=preprocessing,
        calibration=CalibrationSpec(
            method=calibrator.method,
            params=calibrator.to_dict()["params"],
            objective=getattr(calibrator, "objective", None),
            fitted_on=fitted_on,
            n_samples=n_fitted,
            in_graph=True,
        ),
        metrics=metrics,
        reference=ReferenceDistribution(
            split=split,
            confidences=[round(float(c), 6) for c in probs.max(axis=1)],
            accuracy=float(np.mean(probs.argmax(axis=1) == labels)),
            ece=ece,
        ),
        training=training,
        conformal=conformal,
        label_shift=LabelShiftReference.from_rows(probs, labels, split=split),
    )
    write_manifest(manifest, directory)
    return manifest


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_artifact(
    *,
    model: nn.Module,
    calibrator: Calibrator,
    class_names: tuple[str, ...],
    input_shape: tuple[int, int, int],
    val_x: np.ndarray,
    val_y: np.ndarray,
    evaluation: dict,
    training_info: dict | None,
    root: Path,
    name: str,
    version: str | None = None,
    overwrite: bool = False,
    extra_files: Sequence[Path] = (),
    invert: bool = False,
    split: CalibrationSplit | None = None,
) -> tuple[Path, dict]:
    """Export, check parity and write ``root/name/version/`` (model.onnx, manifest.json, conformal.json, extras);
    returns the folder and the parity. ``split``: the validation rows that fitted the calibration (None: all of them,
    no conformal scores); the conformal scores of its other rows are those of the exported ``probabilities``."""
    directory = version_directory(root, name, version, overwrite)
    onnx_path = directory / "model.onnx"
    export_onnx(model, calibrator, input_shape, onnx_path)
    parity = check_parity(model, calibrator, onnx_path, val_x)

    val_probs = calibrator.transform(predict_logits(model, val_x))
    conformal = None
    if split is not None and len(split.conformal):
        served = onnx_outputs(onnx_session(onnx_path), val_x)["probabilities"]
        conformal = write_conformal(fit_conformal(served, val_y, split), directory / CONFORMAL_FILE)
    channels, size, _ = input_shape
    write_artifact_manifest(
        directory,
        calibrator,
        len(val_y) if split is None else len(split.temperature),
        val_probs,
        val_y,
        class_names=class_names,
        input_name="input",
        row_shape=input_shape,
        preprocessing=Preprocessing(color_mode="L" if channels == 1 else "RGB", image_size=size, invert=invert),
        ece=float(evaluation["validation"]["after"]["ece"]["value"]),
        metrics={part: evaluation[part] for part in ("validation", "test") if part in evaluation},
        training=(training_info or {}) | {"export_parity": parity, "torch": torch.__version__, "opset": OPSET},
        conformal=conformal,
    )
    for extra in extra_files:
        (shutil.copytree if extra.is_dir() else shutil.copy2)(extra, directory / extra.name)
    return directory, parity
