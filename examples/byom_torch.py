"""Bring your own model, images: a small torch network on the 8x8 digits, exported with ``torch.onnx.export``
(input ``image`` [N, 1, 8, 8], output ``logits``), calibrated, served, predicted and labelled over HTTP.

    python examples/byom_torch.py [WORKDIR]

Trained on one part of the digits, calibrated on the second (``--data``), and the third is sent to the running
service, whose probabilities must equal the network's own logits, calibrated: softmax(z / T) with T from the
artifact's manifest.
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from byom_common import calibrate, round_trip, serve, served_temperature, show
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from calibkit.temperature import apply_temperature

NAME = "my-digits"


def train(x: np.ndarray, y: np.ndarray, epochs: int = 60) -> nn.Module:
    """A small convolutional network, trained with cross-entropy on ``x``."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 4 * 4, 10)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    inputs, targets = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(epochs):
        for batch in torch.randperm(len(x)).split(64):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs[batch]), targets[batch]).backward()
            optimizer.step()
    return model.eval()


def main(workdir: Path) -> dict:
    digits = load_digits()
    x, y = (digits.images / 16.0).astype(np.float32)[:, None], digits.target
    x_train, x_rest, y_train, y_rest = train_test_split(x, y, train_size=0.3, random_state=0, stratify=y)
    x_val, x_test, y_val, y_test = train_test_split(x_rest, y_rest, train_size=0.5, random_state=0, stratify=y_rest)
    model = train(x_train, y_train)

    # what the user brings: an ONNX file with a dynamic batch axis, and labelled rows
    onnx_path, data_path = workdir / "model.onnx", workdir / "val.npz"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model,
            (torch.zeros(1, 1, 8, 8),),
            str(onnx_path),
            input_names=["image"],
            output_names=["logits"],
            dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
            dynamo=False,
        )
    np.savez(data_path, x=x_val, y=y_val)

    artifacts = workdir / "artifacts"
    calibrated = calibrate(onnx_path, data_path, NAME, artifacts)
    with torch.no_grad():
        logits = model(torch.from_numpy(x_test)).double().numpy()
    own = apply_temperature(logits, served_temperature(Path(calibrated["artifact"])))
    with serve(artifacts, workdir / "store.db") as url:
        served = round_trip(url, NAME, x_test, [str(k) for k in y_test])
    show("digits, torch", calibrated, served, own)
    return {
        "calibrated": calibrated,
        "served": served,
        "own": own,
        "labels": y_test,
        "classes": [str(k) for k in range(10)],
    }


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp))
