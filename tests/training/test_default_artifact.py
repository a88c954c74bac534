"""The committed default artifact is complete, consistent and serves calibrated probabilities."""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml

from calibkit.calibrators import TemperatureScaling
from calibkit.conformal import SplitConformal
from calibkit.manifest import load_conformal, load_manifest
from calibkit.temperature import apply_temperature
from training.config import ConfigError, load_config
from training.conformal import calibration_split
from training.data import load_dataset
from training.export import sha256_of
from training.vision import torchvision_available

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "artifacts" / "digits-lenet5" / "1"


def test_default_artifact_is_valid_and_calibrated():
    manifest = load_manifest(DEFAULT / "manifest.json")
    assert manifest.model_sha256 == sha256_of(DEFAULT / "model.onnx")
    session = ort.InferenceSession(str(DEFAULT / "model.onnx"), providers=["CPUExecutionProvider"])
    x = load_dataset("digits").test.x
    logits, probs = session.run(["logits", "probabilities"], {manifest.input.name: x})
    np.testing.assert_allclose(
        probs, apply_temperature(logits.astype(np.float64), manifest.calibration.temperature), atol=1e-6
    )
    assert manifest.metrics["test"]["after"]["accuracy"]["value"] > 0.9
    for name in ("report.md", "metrics.json", "plots/reliability.png"):
        assert (DEFAULT / name).is_file()


def test_default_artifact_fits_temperature_and_conformal_scores_on_disjoint_parts():
    """The temperature is the NLL fit on the temperature part of validation alone, and the conformal scores are those
    of the other part under the served ``probabilities`` output."""
    manifest = load_manifest(DEFAULT / "manifest.json")
    assert manifest.conformal is not None and manifest.conformal.default_method == "raps"
    calibrators = load_conformal(DEFAULT, manifest.conformal, manifest.class_names)
    val = load_dataset("digits").val
    split = calibration_split(val.y, 0.5, seed=0)
    assert manifest.calibration.n_samples == len(split.temperature)
    assert manifest.conformal.calibration_rows == len(split.conformal)
    session = ort.InferenceSession(str(DEFAULT / "model.onnx"), providers=["CPUExecutionProvider"])
    logits, served = (a.astype(np.float64) for a in session.run(["logits", "probabilities"], {"input": val.x}))
    refit = TemperatureScaling().fit(logits[split.temperature], val.y[split.temperature]).temperature
    assert refit == pytest.approx(manifest.calibration.temperature, rel=1e-5)
    lac = SplitConformal.fit(served[split.conformal], val.y[split.conformal], "lac")
    np.testing.assert_array_equal(calibrators["lac"].scores, lac.scores)
    floors = load_conformal(DEFAULT, manifest.conformal, manifest.class_names, floor=True)
    assert floors is not None
    for method, floor in floors.items():
        params = {"k_reg": calibrators[method].k_reg, "lam": calibrators[method].lam} if method == "raps" else {}
        fitted = SplitConformal.fit(served[split.conformal], val.y[split.conformal], method, floor=True, **params)
        np.testing.assert_array_equal(floor.scores, fitted.scores)


def test_default_artifact_carries_the_label_shift_reference_and_the_scores_per_class():
    """The manifest's ``label_shift`` is that of every validation row under the served calibration, and
    ``conformal.json``'s per-class calibrators (exact and floor) hold the marginal calibrators' scores of the conformal
    part, sorted within each class, with its class counts and the same parameters."""
    from calibkit.label_shift import confusion_counts

    manifest = load_manifest(DEFAULT / "manifest.json")
    entry, spec = manifest.label_shift, manifest.conformal
    assert entry is not None and spec is not None
    val = load_dataset("digits").val
    session = ort.InferenceSession(str(DEFAULT / "model.onnx"), providers=["CPUExecutionProvider"])
    served = session.run(["probabilities"], {"input": val.x})[0].astype(np.float64)
    assert entry.split == "validation" and entry.n_samples == len(val.y) == len(manifest.reference.confidences)
    np.testing.assert_array_equal(entry.priors, np.bincount(val.y, minlength=10) / len(val.y))
    np.testing.assert_array_equal(entry.confusion, confusion_counts(served, val.y))
    np.testing.assert_allclose(entry.mean_probabilities, served.mean(axis=0), atol=1e-6)
    conformal_rows = calibration_split(val.y, 0.5, seed=0).conformal
    for floor in (False, True):
        marginal = load_conformal(DEFAULT, spec, manifest.class_names, floor=floor)
        by_class = load_conformal(DEFAULT, spec, manifest.class_names, floor=floor, by_class=True)
        assert marginal is not None and by_class is not None and set(by_class) == set(marginal) == set(spec.methods)
        for method, calibrator in by_class.items():
            same = marginal[method]
            assert calibrator.classwise and not same.classwise
            assert (calibrator.k_reg, calibrator.lam, calibrator.randomized, calibrator.floor) == (
                same.k_reg,
                same.lam,
                same.randomized,
                floor,
            )
            np.testing.assert_array_equal(np.sort(calibrator.scores), same.scores)
            np.testing.assert_array_equal(calibrator.class_counts, np.bincount(val.y[conformal_rows], minlength=10))


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_validate(path, tmp_path):
    """Every config in configs/ validates with its local files given; a torchvision one, where torchvision does not
    import (the core venv), fails naming the [vision] extra instead."""
    settings = yaml.safe_load(path.read_text())
    weights = tmp_path / "weights.pth"
    weights.touch()
    overrides = {
        "data_path": tmp_path if settings["dataset"] != "digits" else None,
        "weights": weights if "weights" in settings else None,
    }
    if settings["model"].startswith("torchvision:") and not torchvision_available():
        with pytest.raises(ConfigError, match=f"model: {settings['model']} needs the optional \\[vision\\] extra"):
            load_config(path, **overrides)
        return
    config = load_config(path, **overrides)
    assert (config.model, config.loss, config.dataset) == (settings["model"], settings["loss"], settings["dataset"])


def test_default_artifact_calibration_lowers_test_ece_and_nll_for_its_split_and_the_median_of_20():
    """What calibration is for, on the committed model: test ECE and NLL after temperature scaling are below their
    values before it, for the run's own split of validation and as the median over split seeds 0-19 (the
    temperature refitted on each seed's temperature part; the model and its ONNX logits fixed)."""
    from calibkit import metrics
    from calibkit.temperature import softmax

    manifest = load_manifest(DEFAULT / "manifest.json")
    test = manifest.metrics["test"]
    for metric in ("ece", "nll"):
        assert test["after"][metric]["value"] < test["before"][metric]["value"], metric
    splits = load_dataset("digits")
    session = ort.InferenceSession(str(DEFAULT / "model.onnx"), providers=["CPUExecutionProvider"])
    val_logits, test_logits = (
        session.run(["logits"], {"input": s.x})[0].astype(np.float64) for s in (splits.val, splits.test)
    )
    before = softmax(test_logits)
    after = []
    for seed in range(20):
        part = calibration_split(splits.val.y, 0.5, seed).temperature
        probs = TemperatureScaling().fit(val_logits[part], splits.val.y[part]).transform(test_logits)
        after.append((metrics.ece(probs, splits.test.y, 15), metrics.nll(probs, splits.test.y)))
    ece, nll = np.median(np.array(after), axis=0)
    assert ece < metrics.ece(before, splits.test.y, 15) and nll < metrics.nll(before, splits.test.y)
