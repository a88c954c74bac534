"""The round trip of the bring-your-own-model examples: calibrate the ONNX file into an artifact version, serve it,
predict over HTTP, send the true labels back and read the rolling calibration.

Each step is the command or request a user makes: ``python -m training calibrate --onnx ...``, ``python -m service``,
``POST /predict``, ``POST /feedback``, ``GET /calibration``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def calibrate(onnx_path: Path, data_path: Path, name: str, artifacts: Path, *options: str) -> dict:
    """``python -m training calibrate --onnx ... --data ... --name ... --artifacts ...``: its printed summary."""
    argv = [sys.executable, "-m", "training", "calibrate", "--onnx", str(onnx_path), "--data", str(data_path)]
    argv += ["--name", name, "--artifacts", str(artifacts), *options]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[1:])} failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


@contextmanager
def serve(artifacts: Path, store: Path) -> Iterator[str]:
    """``python -m service --artifacts ...`` on a free loopback port, with its own SQLite store; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, CALIB_STORE__URL=f"sqlite:///{store}", CALIB_GRPC_PORT="0")
    argv = [sys.executable, "-m", "service", "--artifacts", str(artifacts), "--port", str(port)]
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while process.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/v2/health/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError(f"{' '.join(argv[1:])} did not become ready")
        yield url
    finally:
        process.terminate()
        process.wait(30)


def round_trip(url: str, name: str, x: np.ndarray, labels: list[str]) -> dict:
    """Predict ``x`` with model ``name``, send each row's true label, wait until every label is counted; the served
    probabilities (in class order), prediction sets, the feedback answer and ``GET /calibration``."""
    client = httpx.Client(base_url=url, timeout=60)
    predictions = client.post("/predict", json={"model": name, "inputs": x.tolist()}).raise_for_status().json()
    rows = predictions["predictions"]
    feedback = client.post(
        "/feedback",
        json={"items": [{"prediction_id": r["id"], "label": label} for r, label in zip(rows, labels)]},
    ).raise_for_status()
    deadline = time.monotonic() + 30
    while True:
        report = client.get("/calibration", params={"model": name, "window": len(labels)}).raise_for_status().json()
        if report["n"] >= len(labels) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {
        "probabilities": np.array([r["probabilities"] for r in rows]),
        "sets": [r["prediction_set"] for r in rows],
        "feedback": feedback.json(),
        "calibration": report,
    }


def served_temperature(artifact: Path) -> float:
    """The temperature the calibrate command baked into the graph, from the version's manifest."""
    return float(json.loads((artifact / "manifest.json").read_text())["calibration"]["params"]["temperature"])


def show(title: str, calibrated: dict, served: dict, own: np.ndarray) -> None:
    """Print what a user checks: held-out calibration, served against the model's own probabilities, the labels."""
    report = served["calibration"]
    print(f"{title}: artifact {calibrated['artifact']}, T = {calibrated['calibration']['params'].get('temperature')}")
    held_out = calibrated["held_out"]
    print(f"  held-out ECE {held_out['before']['ece']:.4f} -> {held_out['after']['ece']:.4f}")
    diff = np.abs(served["probabilities"] - own).max()
    print(f"  served against the model's own output, calibrated: max |diff| {diff:.2e}")
    print(
        f"  /feedback accepted {served['feedback']['accepted']}; /calibration n {report['n']}, "
        f"accuracy {report['accuracy']:.3f}, ECE {report['ece']:.4f}"
    )
