"""Bring your own model, tabular: a scikit-learn classifier on the breast cancer data, exported with skl2onnx (its
default ZipMap output included), calibrated, served, predicted and labelled over HTTP.

    python examples/byom_tabular.py [WORKDIR]

The data are split three ways: the model is trained on one part, calibrated on the second (``--data``), and the
third is sent to the running service, whose probabilities must equal the model's own, calibrated:
softmax(log p / T) with p from ``predict_proba`` and T from the artifact's manifest.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from byom_common import calibrate, round_trip, serve, served_temperature, show
from skl2onnx import to_onnx
from sklearn.datasets import load_breast_cancer
from sklearn.ensemble import GradientBoostingClassifier
from sklearn.model_selection import train_test_split

from calibkit.temperature import apply_temperature

NAME = "breast-cancer"


def main(workdir: Path) -> dict:
    data = load_breast_cancer()
    x, y = data.data.astype(np.float32), data.target
    x_train, x_rest, y_train, y_rest = train_test_split(x, y, train_size=0.4, random_state=0, stratify=y)
    x_val, x_test, y_val, y_test = train_test_split(x_rest, y_rest, train_size=0.6, random_state=0, stratify=y_rest)
    model = GradientBoostingClassifier(random_state=0).fit(x_train, y_train)

    # what the user brings: an ONNX file, labelled rows and the class names
    onnx_path, data_path, names_path = workdir / "model.onnx", workdir / "val.npz", workdir / "classes.json"
    onnx_path.write_bytes(to_onnx(model, x_train[:1], target_opset=17).SerializeToString())
    np.savez(data_path, x=x_val, y=y_val)
    names_path.write_text(json.dumps(list(data.target_names)))

    artifacts = workdir / "artifacts"
    calibrated = calibrate(onnx_path, data_path, NAME, artifacts, "--class-names", str(names_path))
    own = apply_temperature(
        np.log(np.clip(model.predict_proba(x_test), 1e-30, 1)), served_temperature(Path(calibrated["artifact"]))
    )
    with serve(artifacts, workdir / "store.db") as url:
        served = round_trip(url, NAME, x_test, [str(data.target_names[k]) for k in y_test])
    show("breast cancer, gradient boosting", calibrated, served, own)
    return {
        "calibrated": calibrated,
        "served": served,
        "own": own,
        "labels": y_test,
        "classes": list(data.target_names),
    }


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp))
