"""calibkit.manifest: the training/service contract validates and names what is wrong."""

import json

import pytest

from calibkit.manifest import Manifest, load_manifest, write_manifest


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
            r"input.shape: Value error, Expected `shape` to be \[null, C, H, W\]",
        ),
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
