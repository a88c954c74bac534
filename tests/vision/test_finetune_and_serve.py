"""The path of the [vision] extra end to end, with the real commands: fine-tune a torchvision ResNet-18 from a local
weights file (``python -m training run``), export it to ONNX, serve it (``python -m service``), and check what
the service answers against the checkpoint; and the seed-000 recipe in configs/ on a generated CIFAR-10 file."""

import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.common import loopback
from calibkit.calibrators import load_calibrator
from calibkit.manifest import load_manifest
from service.ports import free_port
from training import pipeline
from training.cli import main
from training.inference import predict_logits

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--epochs", "1", "--n-resamples", "20", "--n-resamples-shifted", "10", "--no-progress"]


def test_a_resnet18_fine_tuned_from_a_local_weights_file_is_exported_and_served(tmp_path, cifar_root, weights_file):
    weights, run_dir, artifacts = weights_file("resnet18"), tmp_path / "run", tmp_path / "artifacts"
    assert (
        main(
            [
                "run",
                "--dataset",
                "cifar10",
                "--data-path",
                str(cifar_root),
                "--classes",
                "bird,cat",
                "--model",
                "torchvision:resnet18",
                "--weights",
                str(weights),
                "--finetune",
                "head",
                *QUICK,
                "--run-dir",
                str(run_dir),
                "--artifacts",
                str(artifacts),
            ]
        )
        == 0
    )
    manifest = load_manifest(artifacts / "cifar10-torchvision-resnet18" / "1" / "manifest.json")
    assert manifest.class_names == ["bird", "cat"] and manifest.input.shape == [None, 3, 32, 32]
    assert manifest.training["config"]["weights"] == str(weights)
    assert manifest.training["config"]["finetune"] == "head"
    assert "from resnet18-imagenet.pth, fine-tuning a new classification layer" in (run_dir / "report.md").read_text()

    result, config = pipeline.load_checkpoint(run_dir / pipeline.CHECKPOINT)
    test = pipeline.load_splits(config).test
    images, labels = test.x[:8], test.y[:8]
    expected = load_calibrator(run_dir / pipeline.CALIBRATION).transform(predict_logits(result.model, images))
    port = free_port()
    argv = [sys.executable, "-m", "service", "--artifacts", str(artifacts), "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(url, server)
        health = loopback.get(url + "/health").json()
        assert [(m["name"], m["ready"]) for m in health["models"]] == [("cifar10-torchvision-resnet18", True)]
        response = loopback.post(url + "/predict", json={"inputs": images.tolist()}, timeout=60)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"] == "cifar10-torchvision-resnet18" and body["temperature"] == pytest.approx(
            manifest.calibration.temperature
        )
        served = np.array([p["probabilities"] for p in body["predictions"]])
        np.testing.assert_allclose(served, expected, atol=1e-5)
        feedback = loopback.post(
            url + "/feedback",
            json={
                "items": [
                    {"prediction_id": p["id"], "label": manifest.class_names[y]}
                    for p, y in zip(body["predictions"], labels)
                ]
            },
            timeout=60,
        )
        assert feedback.status_code == 200 and feedback.json()["accepted"] == 8
    finally:
        server.terminate()
        server.wait(30)


def _wait_until_up(url: str, server: subprocess.Popen, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if loopback.get(url + "/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail(f"python -m service did not answer /health (exit status {server.poll()})")


@pytest.mark.parametrize(
    "recipe, architecture",
    [("seed000_cifar10_birdcat_lenet5_ce.yaml", "lenet5"), ("seed000_cifar10_birdcat_resnet50_ce.yaml", "resnet50")],
)
def test_the_seed000_recipe_runs_end_to_end(tmp_path, cifar_root, weights_file, recipe, architecture):
    argv = [
        "run",
        "--config",
        str(ROOT / "configs" / recipe),
        "--data-path",
        str(cifar_root),
        *QUICK,
        "--run-dir",
        str(tmp_path / "run"),
        "--artifacts",
        str(tmp_path / "artifacts"),
    ]
    if architecture == "resnet50":
        argv += ["--weights", str(weights_file("resnet50"))]
    assert main(argv) == 0
    manifest = load_manifest(tmp_path / "artifacts" / f"seed000-birdcat-{architecture}" / "1" / "manifest.json")
    config = manifest.training["config"]
    assert manifest.class_names == ["bird", "cat"]
    assert (config["loss"], config["checkpoint"], config["calibration"]) == ("ce", "last", "temperature")
    assert config["model"] == ("lenet5" if architecture == "lenet5" else "torchvision:resnet50")
    assert manifest.calibration.method == "temperature" and manifest.calibration.temperature > 0
    for stage in ("before", "after"):
        assert 0 <= manifest.metrics["test"][stage]["ece"]["value"] <= 1


def test_the_resnet50_recipe_without_its_weights_file_says_which_file_it_needs(
    tmp_path, cifar_root, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    argv = [
        "run",
        "--config",
        str(ROOT / "configs" / "seed000_cifar10_birdcat_resnet50_ce.yaml"),
        "--data-path",
        str(cifar_root),
    ]
    assert main(argv) == 2
    assert "weights: 'data/weights/resnet50-0676ba61.pth' is not a file" in capsys.readouterr().err
