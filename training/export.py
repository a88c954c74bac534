"""ONNX export with calibration baked in, a parity check on onnxruntime, and the artifact layout.

The exported graph has one input and two outputs: ``logits`` and ``probabilities`` =
softmax((w * logits + b) / T), which is temperature scaling (w = 1, b = 0; Guo et al. 2017),
vector scaling (T = 1) or bias-corrected temperature scaling (w = 1 / T, T = 1; Alexandari et al. 2020). Any ONNX
consumer therefore gets calibrated probabilities. When the calibration
was fitted on a part of the validation split, the conformal scores of the other part are computed from the exported
graph's ``probabilities`` output, the probabilities the service serves, and written to ``conformal.json``.
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
    """Max |difference| of onnxruntime's outputs against torch logits and calibkit's calibrated
    probabilities on ``x``; raises ``ExportError`` past the bounds."""
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


def next_version(root: Path, name: str) -> str:
    """One more than the highest numeric version under ``root/name`` (``"1"`` when there is none)."""
    existing = [int(p.name) for p in (root / name).glob("*") if p.is_dir() and p.name.isdigit()]
    return str(max(existing, default=0) + 1)


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
    """Export, check parity and write ``root/name/version/`` (model.onnx, manifest.json, conformal.json, extras).

    ``split`` says which validation rows fitted the calibration; when it has conformal rows, their conformal scores
    under the exported ``probabilities`` output go to ``conformal.json``, named with its SHA-256 in the manifest.
    None: the calibration was fitted on every validation row, and there are no conformal scores.

    Returns the artifact directory and the parity numbers.
    """
    version = version or next_version(root, name)
    directory = root / name / version
    if directory.exists():
        if not overwrite:
            raise FileExistsError(f"{directory} exists; pass --overwrite or another --version")
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    onnx_path = directory / "model.onnx"
    export_onnx(model, calibrator, input_shape, onnx_path)
    parity = check_parity(model, calibrator, onnx_path, val_x)

    val_probs = calibrator.transform(predict_logits(model, val_x))
    conformal = None
    if split is not None and len(split.conformal):
        served = onnx_outputs(onnx_session(onnx_path), val_x)["probabilities"]
        conformal = write_conformal(fit_conformal(served, val_y, split), directory / CONFORMAL_FILE)
    channels, size, _ = input_shape
    manifest = Manifest(
        name=name,
        version=version,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        model_sha256=sha256_of(onnx_path),
        class_names=list(class_names),
        input=InputSpec(name="input", shape=[None, *input_shape]),
        outputs={"logits": "logits", "probabilities": "probabilities"},
        preprocessing=Preprocessing(color_mode="L" if channels == 1 else "RGB", image_size=size, invert=invert),
        calibration=CalibrationSpec(
            method=calibrator.method,
            params=calibrator.to_dict()["params"],
            objective=getattr(calibrator, "objective", None),
            n_samples=len(val_y) if split is None else len(split.temperature),
            in_graph=True,
        ),
        metrics={split: evaluation[split] for split in ("validation", "test") if split in evaluation},
        reference=ReferenceDistribution(
            confidences=[round(float(c), 6) for c in val_probs.max(axis=1)],
            accuracy=float(np.mean(val_probs.argmax(axis=1) == val_y)),
            ece=float(evaluation["validation"]["after"]["ece"]["value"]),
        ),
        training=(training_info or {}) | {"export_parity": parity, "torch": torch.__version__, "opset": OPSET},
        conformal=conformal,
        label_shift=LabelShiftReference.from_rows(val_probs, val_y),
    )
    write_manifest(manifest, directory)
    for extra in extra_files:
        target = directory / extra.name
        if extra.is_dir():
            shutil.copytree(extra, target)
        else:
            shutil.copy2(extra, target)
    return directory, parity
