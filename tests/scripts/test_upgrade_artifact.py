"""scripts/upgrade_artifact.py: an artifact written before the manifest's ``label_shift`` and conformal.json's
per-class scores gets them back as the committed default holds them, byte for byte, and nothing else changes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from calibkit.manifest import load_manifest, write_manifest

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "artifacts" / "digits-lenet5" / "1"
CLASS_KEYS = ("class_calibrators", "class_floor_calibrators")


def _script():
    spec = importlib.util.spec_from_file_location("upgrade_artifact", ROOT / "scripts" / "upgrade_artifact.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


upgrade_artifact = _script()


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _old_format(directory: Path, label_shift: bool = True, class_keys: bool = True, edit=None) -> None:
    """Strip ``label_shift`` and/or the per-class calibrators, as the export wrote them before; ``edit`` changes
    conformal.json's data first."""
    manifest = load_manifest(directory / "manifest.json")
    assert manifest.conformal is not None
    path = directory / manifest.conformal.file
    data = json.loads(path.read_text())
    if class_keys:
        for key in CLASS_KEYS:
            del data[key]
    if edit is not None:
        edit(data)
    raw = json.dumps(data, indent=1).encode()
    path.write_bytes(raw)
    update = {"conformal": manifest.conformal.model_copy(update={"sha256": hashlib.sha256(raw).hexdigest()})}
    write_manifest(manifest.model_copy(update=update | ({"label_shift": None} if label_shift else {})), directory)


@pytest.fixture
def copy(tmp_path) -> Path:
    target = tmp_path / "digits-lenet5" / "1"
    shutil.copytree(DEFAULT, target)
    return target


def test_an_old_artifact_gets_both_entries_back_identical_and_a_second_run_changes_nothing(copy, capsys):
    committed = _files(DEFAULT)
    _old_format(copy)
    stripped = _files(copy)
    assert stripped.keys() == committed.keys()
    assert {name for name in committed if stripped[name] != committed[name]} == {"manifest.json", "conformal.json"}
    assert load_manifest(copy / "manifest.json").label_shift is None
    assert upgrade_artifact.missing_entries(copy) == ["label_shift", *CLASS_KEYS]

    assert upgrade_artifact.main([str(copy)]) == 0
    assert capsys.readouterr().out.strip() == f"{copy}: added label_shift, {', '.join(CLASS_KEYS)}"
    assert _files(copy) == committed
    assert upgrade_artifact.main([str(copy)]) == 0
    assert capsys.readouterr().out.strip() == f"{copy}: up to date"
    assert _files(copy) == committed


def test_either_entry_alone_is_added(copy):
    _old_format(copy, label_shift=False)
    assert upgrade_artifact.upgrade(copy) == list(CLASS_KEYS)
    assert _files(copy) == _files(DEFAULT)
    _old_format(copy, class_keys=False)
    assert upgrade_artifact.upgrade(copy) == ["label_shift"]
    assert _files(copy) == _files(DEFAULT)


def test_refused_when_a_recorded_score_differs_from_the_recomputed_one(copy, capsys):
    def nudge(data):
        data["calibrators"]["aps"]["scores"][0] += 1e-9

    _old_format(copy, edit=nudge)
    before = _files(copy)
    with pytest.raises(upgrade_artifact.UpgradeError, match=r"conformal.json: `calibrators` differs"):
        upgrade_artifact.upgrade(copy)
    assert _files(copy) == before
    assert upgrade_artifact.main([str(copy)]) == 1
    assert "not upgraded" in capsys.readouterr().err


def test_refused_without_a_training_config_for_another_split_or_another_model(copy):
    _old_format(copy)
    manifest = load_manifest(copy / "manifest.json")
    write_manifest(manifest.model_copy(update={"training": {"source": "python -m training calibrate --onnx"}}), copy)
    with pytest.raises(upgrade_artifact.UpgradeError, match="records no training.config"):
        upgrade_artifact.upgrade(copy)
    other_seed = manifest.training | {"config": manifest.training["config"] | {"seed": 1}}
    write_manifest(manifest.model_copy(update={"training": other_seed}), copy)
    with pytest.raises(upgrade_artifact.UpgradeError, match="does not give the manifest's reference confidences"):
        upgrade_artifact.upgrade(copy)
    write_manifest(manifest.model_copy(update={"model_sha256": "0" * 64}), copy)
    with pytest.raises(upgrade_artifact.UpgradeError, match="not the manifest's model_sha256"):
        upgrade_artifact.upgrade(copy)
