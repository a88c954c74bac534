"""The committed default artifact is complete, consistent and serves calibrated probabilities."""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from calibkit.manifest import load_manifest
from calibkit.temperature import apply_temperature
from training.config import load_config
from training.data import load_dataset
from training.export import sha256_of

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "artifacts" / "digits-lenet5" / "1"


def test_default_artifact_is_valid_and_calibrated():
    manifest = load_manifest(DEFAULT / "manifest.json")
    assert manifest.model_sha256 == sha256_of(DEFAULT / "model.onnx")
    session = ort.InferenceSession(str(DEFAULT / "model.onnx"), providers=["CPUExecutionProvider"])
    x = load_dataset("digits").test.x
    logits, probs = session.run(["logits", "probabilities"], {manifest.input.name: x})
    np.testing.assert_allclose(probs, apply_temperature(logits.astype(np.float64), manifest.calibration.temperature),
                               atol=1e-6)
    assert manifest.metrics["test"]["after"]["accuracy"]["value"] > 0.9
    for name in ("report.md", "metrics.json", "plots/reliability.png"):
        assert (DEFAULT / name).is_file()


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_validate(path, tmp_path):
    config = load_config(path, data_path=tmp_path if "cifar" in path.name else None)
    assert config.model and config.loss
