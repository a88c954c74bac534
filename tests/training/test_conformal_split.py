"""The validation split's two parts: the calibration fitted on one, the conformal scores on the other, in ``run``,
``calibrate`` and ``calibrate --onnx``."""

import json

import numpy as np
import onnxruntime as ort
import pytest

from calibkit.calibrators import TemperatureScaling
from calibkit.conformal import SplitConformal, pick_k_reg
from calibkit.manifest import load_conformal, load_manifest
from training import pipeline
from training.byom import calibrate_onnx
from training.cli import main
from training.config import ConfigError, load_config
from training.conformal import calibration_split, read_split
from training.data import load_dataset
from training.inference import predict_logits
from training.trainer import load_checkpoint

FAST = {"epochs": 2, "n_resamples": 20, "n_resamples_shifted": 10, "corruptions": ["contrast"], "severities": [1]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("conformal") / "run"
    pipeline.train_step(load_config(**FAST), run_dir, progress=False)
    return run_dir


def test_the_split_is_disjoint_complete_stratified_and_seeded():
    labels = load_dataset("digits").val.y
    split = calibration_split(labels, 0.5, seed=0)
    assert len(np.intersect1d(split.temperature, split.conformal)) == 0
    assert np.array_equal(np.union1d(split.temperature, split.conformal), np.arange(len(labels)))
    assert len(split.conformal) == round(0.5 * len(labels))
    for part in (split.temperature, split.conformal):  # every class about half in each part
        counts, totals = np.bincount(labels[part], minlength=10), np.bincount(labels, minlength=10)
        assert np.all(np.abs(counts - totals * len(part) / len(labels)) <= 1)
    again, other = calibration_split(labels, 0.5, seed=0), calibration_split(labels, 0.5, seed=1)
    assert np.array_equal(again.conformal, split.conformal)
    assert not np.array_equal(other.conformal, split.conformal)
    assert len(calibration_split(labels, 0.3, seed=0).conformal) == round(0.3 * len(labels))
    off = calibration_split(labels, 0.0, seed=0)
    assert len(off.conformal) == 0 and np.array_equal(off.temperature, np.arange(len(labels)))


@pytest.mark.parametrize(
    "labels, fraction, message",
    [
        (np.tile(np.arange(3), 10), 1.0, r"conformal_fraction 1.0: Expected `fraction` to be in \[0, 1\)"),
        (np.tile(np.arange(3), 10), -0.1, "conformal_fraction -0.1: Expected `fraction`"),
        (np.tile(np.arange(3), 10), 0.01, "conformal_fraction 0.01 of 30 rows leaves no conformal rows"),
        (np.tile(np.arange(3), 10), 0.05, "conformal_fraction 0.05: cannot split 2 of 30 examples off"),
        (np.r_[np.zeros(9), 1], 0.5, "conformal_fraction 0.5: cannot split 5 of 10 examples off"),
    ],
)
def test_a_split_that_cannot_be_made_names_the_fraction(labels, fraction, message):
    with pytest.raises(ValueError, match=message):
        calibration_split(labels, fraction, seed=0)


def test_the_temperature_is_fitted_on_its_part_only(trained, monkeypatch):
    seen = []
    fit = TemperatureScaling.fit

    def recording_fit(self, logits, labels):
        seen.append((np.array(logits), np.array(labels)))
        return fit(self, logits, labels)

    monkeypatch.setattr(TemperatureScaling, "fit", recording_fit)
    calibrator = pipeline.calibrate_step(trained)
    result, config = load_checkpoint(trained / pipeline.CHECKPOINT)
    val = load_dataset("digits").val
    split = calibration_split(val.y, config.conformal_fraction, config.seed)
    logits = predict_logits(result.model, val.x)
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0][0], logits[split.temperature])
    np.testing.assert_array_equal(seen[0][1], val.y[split.temperature])
    # the conformal scores are those of the other rows, under the fitted temperature
    written = json.loads((trained / "conformal.json").read_text())
    assert written["split"] == {
        "fitted_on": "validation",
        "rows": len(split.conformal),
        "seed": 0,
        "fraction": 0.5,
        "validation_rows": len(val.y),
        "temperature_rows": len(split.temperature),
    }
    probs = calibrator.transform(logits)
    lac = SplitConformal.fit(probs[split.conformal], val.y[split.conformal], "lac")
    np.testing.assert_array_equal(SplitConformal.from_dict(written["calibrators"]["lac"]).scores, lac.scores)
    raps = written["calibrators"]["raps"]
    assert raps["k_reg"] == pick_k_reg(probs[split.temperature], val.y[split.temperature], 0.1)
    assert (raps["lambda"], raps["randomized"], written["calibrators"]["aps"]["randomized"]) == (0.01, True, True)
    assert np.array_equal(read_split(trained / "conformal.json", val.y).temperature, split.temperature)


def test_fraction_zero_fits_the_temperature_on_all_of_validation(trained, monkeypatch, tmp_path):
    seen = []
    fit = TemperatureScaling.fit
    monkeypatch.setattr(TemperatureScaling, "fit", lambda self, z, y: seen.append(len(y)) or fit(self, z, y))
    pipeline.calibrate_step(trained, conformal_fraction=0.0)
    assert seen == [len(load_dataset("digits").val.y)]
    assert not (trained / "conformal.json").exists()
    pipeline.evaluate_step(trained)
    directory, _ = pipeline.export_step(trained, tmp_path / "artifacts")
    manifest = load_manifest(directory / "manifest.json")
    assert manifest.conformal is None and manifest.calibration.n_samples == len(load_dataset("digits").val.y)
    assert not (directory / "conformal.json").exists()
    assert "fitted on the validation split" in (directory / "report.md").read_text()
    pipeline.calibrate_step(trained)  # back to the default for the other tests


def test_the_fraction_is_a_setting_and_a_flag(trained, capsys):
    assert load_config().conformal_fraction == 0.5
    with pytest.raises(ConfigError, match="conformal_fraction: Input should be less than 1"):
        load_config(conformal_fraction=1.0)
    assert main(["calibrate", "--run-dir", str(trained), "--conformal-fraction", "0.25"]) == 0
    assert json.loads((trained / "conformal.json").read_text())["split"]["fraction"] == 0.25
    assert main(["calibrate", "--run-dir", str(trained), "--conformal-fraction", "0.001"]) == 2
    assert "conformal_fraction 0.001 of 359 rows leaves no conformal rows" in capsys.readouterr().err
    pipeline.calibrate_step(trained)


def test_the_artifact_holds_the_scores_of_the_served_probabilities(trained, tmp_path):
    pipeline.calibrate_step(trained)
    pipeline.evaluate_step(trained)
    directory, _ = pipeline.export_step(trained, tmp_path / "artifacts")
    manifest = load_manifest(directory / "manifest.json")
    val = load_dataset("digits").val
    split = calibration_split(val.y, 0.5, 0)
    assert manifest.conformal is not None
    assert manifest.conformal.model_dump() == {
        "file": "conformal.json",
        "sha256": manifest.conformal.sha256,
        "methods": ["lac", "aps", "raps"],
        "default_method": "raps",
        "default_coverage": 0.9,
        "calibration_rows": len(split.conformal),
    }
    assert manifest.calibration.n_samples == len(split.temperature)
    assert len(manifest.reference.confidences) == len(val.y)  # the label-free reference: all of validation
    calibrators = load_conformal(directory, manifest.conformal, manifest.class_names)
    session = ort.InferenceSession(str(directory / "model.onnx"), providers=["CPUExecutionProvider"])
    served = session.run(["probabilities"], {"input": val.x})[0].astype(np.float64)
    lac = SplitConformal.fit(served[split.conformal], val.y[split.conformal], "lac")
    np.testing.assert_array_equal(calibrators["lac"].scores, lac.scores)  # bit for bit
    draws = np.random.default_rng(0).random(len(split.conformal))
    aps = SplitConformal.fit(served[split.conformal], val.y[split.conformal], "aps", u=draws)
    np.testing.assert_array_equal(calibrators["aps"].scores, aps.scores)
    # the same scores per class, exact and floor, for the weighted sets of label shift
    for floor in (False, True):
        by_class = load_conformal(directory, manifest.conformal, manifest.class_names, floor=floor, by_class=True)
        assert by_class is not None and set(by_class) == {"lac", "aps", "raps"}
        lac = SplitConformal.fit(served[split.conformal], val.y[split.conformal], "lac", classwise=True, floor=floor)
        np.testing.assert_array_equal(by_class["lac"].scores, lac.scores)
        np.testing.assert_array_equal(by_class["lac"].class_counts, np.bincount(val.y[split.conformal], minlength=10))
    assert "conformal.json" not in {p.name for p in directory.glob("plots/*")}


def test_calibrate_onnx_writes_the_conformal_scores(trained, tmp_path, capsys):
    pipeline.calibrate_step(trained)
    pipeline.evaluate_step(trained)
    directory, _ = pipeline.export_step(trained, tmp_path / "artifacts")
    onnx_path = tmp_path / "user.onnx"
    onnx_path.write_bytes((directory / "model.onnx").read_bytes())
    val = load_dataset("digits").val
    np.savez(tmp_path / "val.npz", x=val.x, y=val.y)
    mine = tmp_path / "mine"
    argv = ["calibrate", "--onnx", str(onnx_path), "--data", str(tmp_path / "val.npz"), "--seed", "3"]
    assert main([*argv, "--artifacts", str(mine)]) == 0
    summary = json.loads(capsys.readouterr().out)
    version = mine / "user" / "1"
    assert summary["artifact"] == str(version)
    split = calibration_split(val.y, 0.5, seed=3)
    assert summary["conformal"]["calibration_rows"] == len(split.conformal)
    assert set(summary["held_out"]) == {"before", "after"}
    data = json.loads((version / "conformal.json").read_text())
    assert data["format"] == 1 and set(data["calibrators"]) == {"lac", "aps", "raps"}
    assert data["split"]["seed"] == 3 and data["split"]["rows"] == len(split.conformal)
    # the temperature comes from the temperature part only, the scores from the calibrated graph's output
    logits = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(["logits"], {"input": val.x})
    expected_t = TemperatureScaling().fit(logits[0].astype(np.float64)[split.temperature], val.y[split.temperature])
    assert summary["calibration"]["params"]["temperature"] == pytest.approx(expected_t.temperature, rel=1e-9)
    calibrated = ort.InferenceSession(str(version / "model.onnx"), providers=["CPUExecutionProvider"])
    served = calibrated.run(["probabilities"], {"input": val.x})[0].astype(np.float64)
    lac = SplitConformal.fit(served[split.conformal], val.y[split.conformal], "lac")
    np.testing.assert_array_equal(SplitConformal.from_dict(data["calibrators"]["lac"]).scores, lac.scores)
    assert set(data["class_calibrators"]) == set(data["class_floor_calibrators"]) == {"lac", "aps", "raps"}
    aps = SplitConformal.fit(
        served[split.conformal],
        val.y[split.conformal],
        "aps",
        u=np.random.default_rng(3).random(len(split.conformal)),
        classwise=True,
    )
    np.testing.assert_array_equal(SplitConformal.from_dict(data["class_calibrators"]["aps"]).scores, aps.scores)
    manifest = load_manifest(version / "manifest.json")
    assert manifest.conformal is not None
    assert load_conformal(version, manifest.conformal, manifest.class_names, by_class=True) is not None
    # a served version needs its conformal scores: 0 leaves none and is refused, naming the fraction
    with pytest.raises(ValueError, match="leave 0 for the conformal scores"):
        calibrate_onnx(onnx_path, tmp_path / "val.npz", artifacts=mine, conformal_fraction=0.0)
