"""The bring-your-own-model examples run as a user runs them: export, `python -m training calibrate --onnx`,
`python -m service`, then /predict, /feedback and /calibration over HTTP. The service's probabilities are the
model's own, calibrated with the artifact's temperature; every label sent is counted."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.e2e  # each starts a service process

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name: str):
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXAMPLES))
    return module


@pytest.mark.parametrize(
    "name, tolerance",
    [
        # skl2onnx runs the trees in float32 against scikit-learn's float64
        ("byom_tabular", 1e-3),
        ("byom_torch", 1e-5),
    ],
)
def test_a_users_model_is_served_calibrated_and_monitored(name, tolerance, tmp_path, capsys):
    result = _example(name).main(tmp_path)
    served, own, labels = result["served"], result["own"], result["labels"]
    np.testing.assert_allclose(served["probabilities"], own, atol=tolerance)
    assert np.ptp(own) > 0.5, "the rows are not all alike"
    assert all(len(s) >= 1 and set(s) <= set(result["classes"]) for s in served["sets"])
    top = [result["classes"][k] for k in own.argmax(axis=1)]
    assert all(label in s for label, s in zip(top, served["sets"])), "every set holds the top label"
    assert served["feedback"]["accepted"] == len(labels) and not served["feedback"]["rejected"]
    report = served["calibration"]
    assert report["n"] == len(labels)
    assert report["accuracy"] == pytest.approx(np.mean(own.argmax(axis=1) == labels), abs=1e-9)
    assert report["ece"] is not None and report["coverage"] is not None
    calibrated = result["calibrated"]
    assert calibrated["held_out"]["after"]["ece"] < calibrated["held_out"]["before"]["ece"] + 0.02
    assert "served against the model's own output" in capsys.readouterr().out
