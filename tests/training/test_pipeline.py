"""The training pipeline end to end: config errors, run, artifact, parity, determinism, CLI, BYOM (the study:
test_checkpoint_and_study.py)."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

from calibkit.manifest import load_manifest
from calibkit.temperature import apply_temperature
from training import pipeline
from training.cli import main
from training.config import ConfigError, load_config
from training.data import load_dataset, write_cifar_format
from training.evaluation import score
from training.export import CalibratedClassifier, ExportError
from training.trainer import train

FAST = {
    "epochs": 3,
    "n_resamples": 50,
    "n_resamples_shifted": 20,
    "corruptions": ["gaussian_noise", "contrast"],
    "severities": [1, 5],
}


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    config = load_config(**FAST)
    out = pipeline.run(config, root / "run", root / "artifacts", progress=False)
    return root, out


def test_run_writes_a_complete_artifact(default_run):
    root, out = default_run
    directory = root / "artifacts" / "digits-lenet5" / "1"
    assert out["artifact"] == str(directory)
    for name in (
        "model.onnx",
        "manifest.json",
        "metrics.json",
        "report.md",
        "calibration.json",
        "conformal.json",
        "plots/reliability.png",
        "plots/ece_vs_temperature.png",
        "plots/ece_vs_severity.png",
    ):
        assert (directory / name).is_file(), name
    assert (directory / "plots" / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    manifest = load_manifest(directory / "manifest.json")
    assert manifest.class_names == [str(d) for d in range(10)]
    assert manifest.input.shape == [None, 1, 8, 8]
    assert manifest.preprocessing.color_mode == "L"
    assert manifest.calibration.method == "temperature" and manifest.calibration.in_graph
    assert len(manifest.reference.confidences) == 359
    assert manifest.calibration.n_samples == 179 and manifest.conformal is not None
    assert manifest.conformal.calibration_rows == 180
    assert set(manifest.metrics) == {"validation", "test"}
    assert out["parity"]["max_abs_diff_probabilities"] < 1e-5


def test_onnx_probabilities_are_temperature_scaled_logits(default_run):
    root, _ = default_run
    directory = root / "artifacts" / "digits-lenet5" / "1"
    manifest = load_manifest(directory / "manifest.json")
    session = ort.InferenceSession(str(directory / "model.onnx"), providers=["CPUExecutionProvider"])
    x = load_dataset("digits").test.x[:57]  # a batch size never seen at export: the batch axis is dynamic
    logits, probs = session.run(["logits", "probabilities"], {"input": x})
    assert probs.shape == (57, 10)
    np.testing.assert_allclose(
        probs, apply_temperature(logits.astype(np.float64), manifest.calibration.temperature), atol=1e-6
    )


def test_the_manifest_carries_the_validation_priors_and_confusion_counts_of_the_served_probabilities(default_run):
    """What label-shift estimation needs, from every validation row under the graph's calibrated probabilities."""
    from calibkit.label_shift import confusion_counts

    root, _ = default_run
    directory = root / "artifacts" / "digits-lenet5" / "1"
    entry = load_manifest(directory / "manifest.json").label_shift
    assert entry is not None and entry.split == "validation" and entry.n_samples == 359
    val = load_dataset("digits").val
    session = ort.InferenceSession(str(directory / "model.onnx"), providers=["CPUExecutionProvider"])
    served = session.run(["probabilities"], {"input": val.x})[0].astype(np.float64)
    np.testing.assert_array_equal(entry.confusion, confusion_counts(served, val.y))
    np.testing.assert_allclose(entry.priors, np.bincount(val.y, minlength=10) / 359)
    np.testing.assert_allclose(entry.mean_probabilities, served.mean(axis=0), atol=1e-6)


def test_metrics_cover_test_corruptions_and_ood_with_intervals(default_run):
    root, out = default_run
    evaluation = json.loads((root / "run" / "metrics.json").read_text())
    assert set(evaluation["test"]["before"]) == {
        "accuracy",
        "ece",
        "mce",
        "adaptive_ece",
        "classwise_ece",
        "nll",
        "brier",
    }
    for stage in ("before", "after"):
        for entry in evaluation["test"][stage].values():
            lo, hi = entry["ci"]
            assert 0.0 <= lo <= hi
    assert set(evaluation["shifted"]) == {"gaussian_noise", "contrast"}
    assert set(evaluation["shifted"]["contrast"]) == {"1", "5"}
    assert 0.5 <= evaluation["ood"]["auroc_before"] <= 1.0
    report = (root / "run" / "report.md").read_text()
    assert "| ECE |" in report and "gaussian_noise" in report and "AUROC" in report


def test_steps_run_separately_and_in_order(tmp_path):
    config = load_config(**(FAST | {"epochs": 2}))
    run_dir = tmp_path / "run"
    pipeline.train_step(config, run_dir, progress=False)
    with pytest.raises(FileNotFoundError, match="no calibration.json .* run `python -m training calibrate` first"):
        pipeline.evaluate_step(run_dir)
    calibrator = pipeline.calibrate_step(run_dir, method="vector")
    assert calibrator.method == "vector"
    with pytest.raises(FileNotFoundError, match="run `python -m training evaluate` first"):
        pipeline.export_step(run_dir, tmp_path / "artifacts")
    pipeline.evaluate_step(run_dir)
    directory, parity = pipeline.export_step(run_dir, tmp_path / "artifacts", version="7")
    assert directory.name == "7" and parity["max_abs_diff_probabilities"] < 1e-5
    assert load_manifest(directory / "manifest.json").calibration.method == "vector"
    with pytest.raises(FileExistsError, match="exists; pass --overwrite"):
        pipeline.export_step(run_dir, tmp_path / "artifacts", version="7")
    pipeline.export_step(run_dir, tmp_path / "artifacts", version="7", overwrite=True)
    directory, _ = pipeline.export_step(run_dir, tmp_path / "artifacts")
    assert directory.name == "8"
    # bias-corrected temperature scaling is baked into the graph as vector scaling with w = 1 / T
    calibrator = pipeline.calibrate_step(run_dir, method="bcts")
    pipeline.evaluate_step(run_dir)
    directory, parity = pipeline.export_step(run_dir, tmp_path / "artifacts", version="9")
    assert parity["max_abs_diff_probabilities"] < 1e-5
    assert load_manifest(directory / "manifest.json").calibration.method == "bcts"
    x = load_dataset("digits").test.x
    session = ort.InferenceSession(str(directory / "model.onnx"), providers=["CPUExecutionProvider"])
    logits, probs = session.run(["logits", "probabilities"], {"input": x})
    np.testing.assert_allclose(probs, calibrator.transform(logits.astype(np.float64)), atol=1e-6)


def test_calibrators_that_cannot_be_baked_are_refused(tmp_path):
    config = load_config(**(FAST | {"epochs": 1}))
    pipeline.train_step(config, tmp_path, progress=False)
    calibrator = pipeline.calibrate_step(tmp_path, method="isotonic")
    with pytest.raises(
        ExportError, match="'isotonic' cannot be baked into ONNX; export with 'temperature', 'vector' or"
    ):
        CalibratedClassifier(torch.nn.Identity(), calibrator)


def test_training_is_deterministic_given_a_seed():
    splits = load_dataset("digits")
    states = [train(load_config(epochs=2, seed=seed), splits, progress=False).model.state_dict() for seed in (3, 3, 4)]
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key
    assert any(not torch.equal(states[0][k], states[2][k]) for k in states[0] if states[0][k].is_floating_point())


def test_cifar_format_end_to_end_on_the_binary_bird_cat_task(tmp_path):
    rng = np.random.default_rng(0)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    labels = np.tile(np.arange(10), 30)
    images = rng.integers(0, 256, size=(len(labels), 32, 32, 3), dtype=np.uint8)
    images[labels == 2, :, :, 0] = 250  # birds are red enough to learn
    write_cifar_format(tmp_path / "cifar-10-batches-py", images, labels, names)
    config = load_config(dataset="cifar10", data_path=tmp_path, classes=["bird", "cat"], **(FAST | {"epochs": 2}))
    out = pipeline.run(config, tmp_path / "run", tmp_path / "artifacts", progress=False)
    manifest = load_manifest(tmp_path / "artifacts" / "cifar10-lenet5" / "1" / "manifest.json")
    assert manifest.class_names == ["bird", "cat"]
    assert manifest.input.shape == [None, 3, 32, 32] and manifest.preprocessing.color_mode == "RGB"
    assert out["parity"]["max_abs_diff_probabilities"] < 1e-5


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model": "vgg16"}, "model: unknown 'vgg16'; known: densenet_bc, lenet5"),
        ({"loss": "hinge"}, "loss: unknown 'hinge'; known: brier, ce"),
        ({"dataset": "mnist"}, "dataset: unknown 'mnist'"),
        ({"dataset": "cifar10"}, "data_path is required for dataset 'cifar10'"),
        ({"dataset": "cifar10", "data_path": "/nonexistent/cifar"}, "data_path '/nonexistent/cifar' does not exist"),
        ({"loss": "focal", "loss_params": {"gama": 2}}, "loss_params: gama not accepted by loss 'focal'"),
        ({"epochs": 0}, "epochs: Input should be greater than or equal to 1"),
        ({"calibration": "beta"}, "calibration: unknown 'beta'"),
        ({"severities": [6]}, r"severities must be in 1..5"),
        ({"learning_rate": 0.1}, "learning_rate: Extra inputs are not permitted"),
    ],
)
def test_bad_configs_fail_fast_naming_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(**overrides)


def test_yaml_config_with_cli_overrides(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("model: resnet20\nepochs: 7\nloss: focal\nloss_params: {gamma: 2.0}\n")
    config = load_config(path, epochs=9)
    assert (config.model, config.epochs, config.loss_params) == ("resnet20", 9, {"gamma": 2.0})
    assert config.model_name == "digits-resnet20-focal"
    (tmp_path / "bad.yaml").write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--model", "vgg16"], "error: invalid configuration: model: unknown 'vgg16'"),
        (["run", "--dataset", "cifar10"], "data_path is required for dataset 'cifar10'"),
        (["evaluate", "--run-dir", "/nonexistent/run"], "error: no checkpoint at /nonexistent/run/checkpoint.pt"),
        (["calibrate", "--onnx", "/nonexistent/model.onnx", "--data", "x.npz"], "error: no ONNX model at"),
    ],
)
def test_cli_reports_bad_input_in_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_cli_run_prints_the_table_and_parity(tmp_path, capsys):
    argv = [
        "run",
        "--epochs",
        "1",
        "--n-resamples",
        "20",
        "--n-resamples-shifted",
        "10",
        "--no-progress",
        "--run-dir",
        str(tmp_path / "run"),
        "--artifacts",
        str(tmp_path / "artifacts"),
        "--name",
        "cli-test",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "ece" in out and "ONNX parity on 359 validation images" in out
    assert (tmp_path / "artifacts" / "cli-test" / "1" / "model.onnx").is_file()


def test_every_interval_lies_in_its_metrics_range():
    # one confident miss alone in its bin: the MCE is its gap, and the resamples without it pull the basic interval's
    # reflection (2 theta - q_lo) past 1
    probs = np.full((20, 2), [0.25, 0.75])
    probs[0] = [0.05, 0.95]
    labels = np.r_[0, np.ones(15, int), np.zeros(4, int)]
    got = score(probs, labels, n_resamples=200)
    assert got["mce"]["value"] == pytest.approx(0.95)
    for name, entry in got.items():
        lo, hi = entry["ci"]
        assert 0.0 <= lo <= hi <= {"nll": np.inf, "brier": 2.0}.get(name, 1.0), name
    assert got["mce"]["ci"][1] == 1.0
