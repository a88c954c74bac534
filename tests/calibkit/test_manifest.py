"""calibkit.manifest: the training/service contract validates and names what is wrong."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from calibkit.conformal import SplitConformal
from calibkit.label_shift import bbse_priors
from calibkit.manifest import (
    ConformalSpec,
    LabelShiftReference,
    Manifest,
    load_conformal,
    load_manifest,
    write_manifest,
)


def _valid() -> dict:
    return {
        "name": "digits-lenet5",
        "version": "1",
        "created_at": "2026-11-22T00:00:00+00:00",
        "model_sha256": "0" * 64,
        "class_names": ["0", "1", "2"],
        "input": {"name": "input", "shape": [None, 1, 8, 8], "dtype": "float32"},
        "outputs": {"logits": "logits", "probabilities": "probabilities"},
        "preprocessing": {"color_mode": "L", "image_size": 8},
        "calibration": {"method": "temperature", "params": {"temperature": 1.5}, "n_samples": 100, "in_graph": True},
        "reference": {"confidences": [0.9, 0.5, 0.7], "accuracy": 0.8, "ece": 0.02},
    }


def test_round_trip(tmp_path):
    manifest = Manifest.model_validate(_valid())
    write_manifest(manifest, tmp_path)
    loaded = load_manifest(tmp_path / "manifest.json")
    assert loaded == manifest
    assert loaded.calibration.temperature == 1.5
    assert loaded.reference.confidences == [0.5, 0.7, 0.9]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"version": "v1"}, "version: String should match pattern"),
        ({"class_names": ["a", "a"]}, "Expected `class_names` to be unique"),
        ({"class_names": ["only"]}, "class_names: List should have at least 2 items"),
        ({"outputs": {"logits": "logits"}}, "Expected `outputs` to name the 'logits' and 'probabilities'"),
        (
            {"input": {"name": "input", "shape": [None, 3, 8, 8]}},
            r"Expected `input.shape` to be .*, but got \[None, 3, 8, 8\]",
        ),
        (
            {"input": {"name": "input", "shape": [4, 1, 8, 8]}},
            r"input.shape: Value error, Expected `shape` to be \[null, C, H, W\] or \[null, F\]",
        ),
        ({"input": {"name": "input", "shape": [None, 8, 8]}}, r"Expected `shape` to be \[null, C, H, W\] or"),
        ({"input": {"name": "input", "shape": [None, 0]}}, "with positive sizes"),
        (
            {"input": {"name": "x", "shape": [None, 30]}},
            r"Expected `preprocessing` to be null for the feature-vector input \[None, 30\]",
        ),
        ({"input": {"name": "x", "shape": [None, 30], "dtype": "int64"}}, "input.dtype: Input should be 'float32'"),
        ({"model_sha256": "xyz"}, "model_sha256"),
        (
            {"reference": {"confidences": [1.5], "accuracy": 0.8, "ece": 0.02}},
            r"Expected `confidences` to lie in \[0, 1\], but got 1.5",
        ),
        ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
        ({"schema_version": 2}, "schema_version"),
    ],
)
def test_invalid_manifests_name_the_field(tmp_path, change, message):
    (tmp_path / "manifest.json").write_text(json.dumps(_valid() | change))
    with pytest.raises(ValueError, match=message):
        load_manifest(tmp_path / "manifest.json")


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ValueError, match="no manifest file"):
        load_manifest(tmp_path / "manifest.json")
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_manifest(tmp_path / "manifest.json")


def _conformal_artifact(directory, n_classes: int = 3, rows: int = 40) -> dict:
    """A conformal.json of LAC and APS on random probabilities, and the manifest entry naming it."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(n_classes), size=rows)
    labels = rng.integers(0, n_classes, size=rows)
    data = {
        "format": 1,
        "calibrators": {
            "lac": SplitConformal.fit(probs, labels, "lac").to_dict(),
            "aps": SplitConformal.fit(probs, labels, "aps", u=rng).to_dict(),
        },
        "split": {"fitted_on": "validation", "rows": rows, "seed": 0, "fraction": 0.5},
    }
    raw = json.dumps(data).encode()
    (directory / "conformal.json").write_bytes(raw)
    return {
        "sha256": hashlib.sha256(raw).hexdigest(),
        "methods": ["lac", "aps"],
        "default_method": "aps",
        "calibration_rows": rows,
    }


def test_conformal_round_trip(tmp_path):
    spec = _conformal_artifact(tmp_path)
    manifest = Manifest.model_validate(_valid() | {"conformal": spec})
    write_manifest(manifest, tmp_path)
    loaded = load_manifest(tmp_path / "manifest.json")
    assert loaded == manifest
    assert loaded.conformal is not None
    assert (loaded.conformal.file, loaded.conformal.default_coverage) == ("conformal.json", 0.9)
    calibrators = load_conformal(tmp_path, loaded.conformal, loaded.class_names)
    written = json.loads((tmp_path / "conformal.json").read_text())["calibrators"]
    assert list(calibrators) == ["lac", "aps"]
    for method, calibrator in calibrators.items():
        assert calibrator.to_dict() == written[method]
    assert calibrators["aps"].randomized and not calibrators["lac"].randomized


def test_a_manifest_without_conformal_still_loads(tmp_path):
    """A manifest written before the conformal field (same schema_version 1) loads with ``conformal`` None."""
    (tmp_path / "manifest.json").write_text(json.dumps(_valid()))
    assert load_manifest(tmp_path / "manifest.json").conformal is None


LABEL_SHIFT = {
    "n_samples": 10,
    "priors": [0.4, 0.3, 0.3],
    "mean_probabilities": [0.38, 0.32, 0.3],
    "confusion": [[3, 1, 0], [1, 2, 0], [0, 0, 3]],
}


def test_label_shift_reference_round_trips_and_feeds_bbse(tmp_path):
    probs = np.array([[0.8, 0.1, 0.1]] * 3 + [[0.1, 0.8, 0.1]] * 2 + [[0.2, 0.2, 0.6]] * 2 + [[0.5, 0.4, 0.1]])
    labels = np.array([0, 0, 1, 1, 1, 2, 2, 2])
    entry = LabelShiftReference.from_rows(probs, labels)
    assert entry.confusion == [[2, 1, 1], [0, 2, 0], [0, 0, 2]]  # rows the argmax, columns the label
    assert entry.n_samples == 8 and entry.priors == [2 / 8, 3 / 8, 3 / 8] and entry.split == "validation"
    np.testing.assert_allclose(entry.mean_probabilities, probs.mean(axis=0))
    manifest = Manifest.model_validate(_valid() | {"label_shift": entry.model_dump()})
    write_manifest(manifest, tmp_path)
    loaded = load_manifest(tmp_path / "manifest.json")
    assert loaded == manifest and loaded.label_shift == entry
    # what BBSE needs: the counts as they were, so that no shift in the window gives the validation priors back
    np.testing.assert_allclose(bbse_priors(probs, loaded.label_shift.confusion).priors, entry.priors, atol=1e-12)


def test_a_manifest_without_label_shift_loads_and_is_written_back_without_it(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(_valid()))
    manifest = load_manifest(tmp_path / "manifest.json")
    assert manifest.label_shift is None
    write_manifest(manifest, tmp_path)
    assert "label_shift" not in json.loads((tmp_path / "manifest.json").read_text())


@pytest.mark.parametrize(
    "change, message",
    [
        ({"priors": [0.5, 0.5]}, r"Expected `mean_probabilities` to be 2 non-negative numbers summing to 1"),
        ({"mean_probabilities": [0.5, 0.3, 0.3]}, r"Expected `mean_probabilities` to be 3 non-negative numbers"),
        ({"confusion": [[3, 1], [1, 2], [0, 0]]}, r"Expected `confusion` to be a 3 x 3 matrix of non-negative counts"),
        ({"confusion": [[3, 1, 0], [1, 2, 0], [0, 0, -3]]}, r"Expected `confusion` to be a 3 x 3 matrix"),
        ({"n_samples": 11}, r"Expected `confusion` to be counts summing to n_samples \(11\)"),
        ({"priors": [0.3, 0.4, 0.3]}, r"Expected `priors` to be the confusion's column sums / n_samples"),
        ({"confusion": [[3, 1.5, 0], [1, 2, 0], [0, 0, 3]]}, "confusion.0.1"),
    ],
)
def test_invalid_label_shift_entries_name_the_field(tmp_path, change, message):
    data = _valid() | {"label_shift": LABEL_SHIFT | change}
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        load_manifest(tmp_path / "manifest.json")


def test_label_shift_priors_must_have_one_entry_a_class(tmp_path):
    two = {"n_samples": 4, "priors": [0.5, 0.5], "mean_probabilities": [0.5, 0.5], "confusion": [[2, 0], [0, 2]]}
    (tmp_path / "manifest.json").write_text(json.dumps(_valid() | {"label_shift": two}))
    with pytest.raises(ValueError, match=r"Expected `label_shift.priors` to be 3 numbers, one a class"):
        load_manifest(tmp_path / "manifest.json")


def test_a_tampered_conformal_file_is_refused(tmp_path):
    spec = ConformalSpec.model_validate(_conformal_artifact(tmp_path))
    data = json.loads((tmp_path / "conformal.json").read_text())
    data["calibrators"]["lac"]["scores"][-1] = 1.0  # a wider LAC quantile: sets that over-cover
    (tmp_path / "conformal.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"conformal.json: sha256 [0-9a-f]{64} differs from the manifest's"):
        load_conformal(tmp_path, spec, ["0", "1", "2"])


def _rewritten(directory, spec: dict, change) -> ConformalSpec:
    data = json.loads((directory / "conformal.json").read_text())
    change(data)
    raw = json.dumps(data).encode()
    (directory / "conformal.json").write_bytes(raw)
    return ConformalSpec.model_validate(spec | {"sha256": hashlib.sha256(raw).hexdigest()})


@pytest.mark.parametrize(
    "change, class_names, message",
    [
        (lambda d: d["calibrators"].pop("aps"), 3, r"the manifest's methods \['aps'\] are not in `calibrators`"),
        (lambda d: None, 4, r"calibrators.lac: Expected `n_classes` to be 4 \(the class names\), but got 3"),
        (lambda d: d.update(format=2), 3, "Expected `format` to be 1, but got 2"),
        (lambda d: d["calibrators"]["lac"].update(method="aps"), 3, "calibrators.lac: Expected `method` to be 'lac'"),
        (lambda d: d["calibrators"]["aps"]["scores"].pop(), 3, "calibrators.aps: has 39 scores but the manifest's"),
        (lambda d: d["calibrators"]["lac"].pop("scores"), 3, "calibrators.lac: Expected `data` to be an object with"),
        (
            lambda d: d["calibrators"]["lac"].update(class_counts=[13, 13, 14]),
            3,
            r"calibrators.lac: Expected `class_counts` to be null \(served sets use one marginal threshold\)",
        ),
    ],
)
def test_a_conformal_file_that_does_not_fit_the_manifest_is_refused(tmp_path, change, class_names, message):
    spec = _rewritten(tmp_path, _conformal_artifact(tmp_path), change)
    with pytest.raises(ValueError, match=message):
        load_conformal(tmp_path, spec, [str(k) for k in range(class_names)])


def test_a_missing_conformal_file_is_named(tmp_path):
    spec = ConformalSpec.model_validate(_conformal_artifact(tmp_path) | {"file": "other.json"})
    with pytest.raises(ValueError, match="other.json: no conformal file"):
        load_conformal(tmp_path, spec, ["0", "1", "2"])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"methods": ["lac", "thr"]}, r"Expected `methods` to be distinct names among \['lac', 'aps', 'raps'\]"),
        ({"methods": ["lac", "lac"]}, "Expected `methods` to be distinct names"),
        ({"methods": []}, "conformal.methods: List should have at least 1 item"),
        ({"default_method": "raps"}, r"Expected `default_method` to be one of `methods` \['lac', 'aps'\]"),
        ({"default_coverage": 1.0}, "conformal.default_coverage: Input should be less than 1"),
        ({"calibration_rows": 0}, "conformal.calibration_rows: Input should be greater than or equal to 1"),
        ({"sha256": "abc"}, "conformal.sha256: String should match pattern"),
        ({"file": "../model.onnx"}, "conformal.file: String should match pattern"),
        ({"extra": 1}, "conformal.extra: Extra inputs are not permitted"),
    ],
)
def test_invalid_conformal_entries_name_the_field(tmp_path, change, message):
    spec = _conformal_artifact(tmp_path) | change
    (tmp_path / "manifest.json").write_text(json.dumps(_valid() | {"conformal": spec}))
    with pytest.raises(ValueError, match=message):
        load_manifest(tmp_path / "manifest.json")


def test_floor_calibrators_load_when_present_and_are_none_in_files_from_before_them(tmp_path):
    spec = _conformal_artifact(tmp_path)
    assert load_conformal(tmp_path, ConformalSpec(**spec), ["0", "1", "2"], floor=True) is None
    data = json.loads((tmp_path / "conformal.json").read_text())
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(3), 40)
    labels = rng.integers(0, 3, 40)
    data["floor_calibrators"] = {m: SplitConformal.fit(probs, labels, m, floor=True).to_dict() for m in ("lac", "aps")}
    raw = json.dumps(data).encode()
    (tmp_path / "conformal.json").write_bytes(raw)
    spec = ConformalSpec(**(spec | {"sha256": hashlib.sha256(raw).hexdigest()}))
    floors = load_conformal(tmp_path, spec, ["0", "1", "2"], floor=True)
    assert floors is not None and all(c.floor for c in floors.values()) and list(floors) == ["lac", "aps"]
    data["floor_calibrators"]["aps"] = data["calibrators"]["aps"]  # an exact calibrator where a floor one belongs
    raw = json.dumps(data).encode()
    (tmp_path / "conformal.json").write_bytes(raw)
    spec = spec.model_copy(update={"sha256": hashlib.sha256(raw).hexdigest()})
    with pytest.raises(ValueError, match="floor_calibrators.aps: Expected `floor` to be true"):
        load_conformal(tmp_path, spec, ["0", "1", "2"], floor=True)


def test_feature_vector_inputs_take_no_preprocessing_and_image_inputs_may_go_without(tmp_path):
    vectors = Manifest.model_validate(_valid() | {"input": {"name": "x", "shape": [None, 30]}, "preprocessing": None})
    assert vectors.input.row_shape == (30,) and not vectors.input.images and vectors.preprocessing is None
    write_manifest(vectors, tmp_path)
    assert json.loads((tmp_path / "manifest.json").read_text())["preprocessing"] is None
    assert load_manifest(tmp_path / "manifest.json") == vectors
    numbers_only = Manifest.model_validate({k: v for k, v in _valid().items() if k != "preprocessing"})
    assert numbers_only.input.row_shape == (1, 8, 8) and numbers_only.input.images
    assert numbers_only.preprocessing is None


def test_the_committed_artifact_loads_unchanged_and_writes_back_the_same_json(tmp_path):
    """The schema grew feature vectors and optional preprocessing without touching what existing manifests say."""
    committed = Path(__file__).resolve().parents[2] / "artifacts" / "digits-lenet5" / "1" / "manifest.json"
    manifest = load_manifest(committed)
    assert manifest.input.row_shape == (1, 8, 8) and manifest.preprocessing is not None
    write_manifest(manifest, tmp_path)
    assert json.loads((tmp_path / "manifest.json").read_text()) == json.loads(committed.read_text())


def _with_class_calibrators(directory, spec: dict, change=None) -> ConformalSpec:
    """conformal.json rewritten with exact and floor calibrators, marginal and per class, of the same rows."""
    rng = np.random.default_rng(1)
    probs, labels, draws = rng.dirichlet(np.ones(3), 40), rng.integers(0, 3, 40), rng.random(40)
    data = json.loads((directory / "conformal.json").read_text())
    for prefix, classwise in (("", False), ("class_", True)):
        data[prefix + "calibrators"] = {
            "lac": SplitConformal.fit(probs, labels, "lac", classwise=classwise).to_dict(),
            "aps": SplitConformal.fit(probs, labels, "aps", u=draws, classwise=classwise).to_dict(),
        }
        data[prefix + "floor_calibrators"] = {
            m: SplitConformal.fit(probs, labels, m, floor=True, classwise=classwise).to_dict() for m in ("lac", "aps")
        }
    if change is not None:
        change(data)
    raw = json.dumps(data).encode()
    (directory / "conformal.json").write_bytes(raw)
    return ConformalSpec(**(spec | {"sha256": hashlib.sha256(raw).hexdigest()}))


def test_class_calibrators_round_trip_and_are_none_in_files_from_before_them(tmp_path):
    spec = _conformal_artifact(tmp_path)
    for floor in (False, True):  # a file from before them: None, and the marginal calibrators load as they did
        assert load_conformal(tmp_path, ConformalSpec(**spec), ["0", "1", "2"], floor=floor, by_class=True) is None
    assert load_conformal(tmp_path, ConformalSpec(**spec), ["0", "1", "2"]) is not None
    spec = _with_class_calibrators(tmp_path, spec)
    written = json.loads((tmp_path / "conformal.json").read_text())
    for floor, key in ((False, "class_calibrators"), (True, "class_floor_calibrators")):
        loaded = load_conformal(tmp_path, spec, ["0", "1", "2"], floor=floor, by_class=True)
        marginal = load_conformal(tmp_path, spec, ["0", "1", "2"], floor=floor)
        assert loaded is not None and marginal is not None and list(loaded) == ["lac", "aps"]
        for method, calibrator in loaded.items():
            assert calibrator.to_dict() == written[key][method] and calibrator.classwise and calibrator.floor == floor
            # the weighted quantile at unit weights is the served marginal quantile
            q = calibrator.label_shift_quantiles(np.ones(3), 0.2)
            assert np.array_equal(q, np.full(3, marginal[method].quantile(0.2)))


def test_the_committed_artifact_has_class_calibrators_and_a_label_shift_entry_and_verifies():
    """Added by scripts/upgrade_artifact.py (tests/training/test_default_artifact.py checks their values)."""
    directory = Path(__file__).resolve().parents[2] / "artifacts" / "digits-lenet5" / "1"
    manifest = load_manifest(directory / "manifest.json")
    assert manifest.conformal is not None and manifest.label_shift is not None
    for floor in (False, True):
        assert load_conformal(directory, manifest.conformal, manifest.class_names, floor=floor) is not None
        assert load_conformal(directory, manifest.conformal, manifest.class_names, floor=floor, by_class=True)


@pytest.mark.parametrize(
    "change, floor, message",
    [
        (lambda d: d["class_calibrators"].pop("aps"), False, r"\['aps'\] are not in `class_calibrators`"),
        (
            lambda d: d["class_calibrators"].update(lac=d["calibrators"]["lac"]),
            False,
            r"class_calibrators.lac: Expected `class_counts` to be the count of each class",
        ),
        (
            lambda d: d["class_floor_calibrators"].update(aps=d["class_calibrators"]["aps"]),
            True,
            "class_floor_calibrators.aps: Expected `floor` to be true",
        ),
        (
            lambda d: d["class_calibrators"]["aps"].update(randomized=False),
            False,
            "class_calibrators.aps: k_reg, lambda or randomized differ from the marginal",
        ),
        (
            lambda d: d["class_calibrators"]["lac"]["scores"].__setitem__(0, 0.0),
            False,
            "class_calibrators.lac: its scores are not the marginal calibrator's",
        ),
        (lambda d: d.update(class_calibrators=[]), False, "Expected `class_calibrators` to be an object"),
    ],
)
def test_class_calibrators_that_are_not_the_marginal_ones_per_class_are_refused(tmp_path, change, floor, message):
    spec = _with_class_calibrators(tmp_path, _conformal_artifact(tmp_path), change)
    with pytest.raises(ValueError, match=message):
        load_conformal(tmp_path, spec, ["0", "1", "2"], floor=floor, by_class=True)
