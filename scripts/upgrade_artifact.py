"""Add the entries newer than an artifact to it, computed again from its own model and split, changing nothing else.

Two backward-compatible entries postdate some artifacts, and the service can only use them where they are:

- the manifest's ``label_shift`` (``calibkit.manifest.LabelShiftReference``), which the label-free estimates need
  (Saerens et al. 2002; Lipton et al. 2018), computed as ``training.export`` does from the ONNX graph's logits;
- ``conformal.json``'s ``class_calibrators`` / ``class_floor_calibrators``, the same scores kept per class for the
  weighted quantile of label shift (Podkopaev & Ramdas 2021), as ``training.conformal.fit_conformal`` writes them on
  the recorded split under the graph's ``probabilities``, with the same seeded draws.

The validation split is drawn again from the run's config (``training.pipeline.load_splits``). The upgrade is
refused unless the model file has the manifest's SHA-256, the recomputed probabilities give the manifest's reference,
and every entry already in ``conformal.json`` equals its recomputed value; only the manifest's ``label_shift`` and
``conformal.sha256`` change. An artifact with both entries is left alone; one from ``python -m training calibrate
--onnx`` is refused (no data to draw again).

    python scripts/upgrade_artifact.py artifacts/digits-lenet5/1 [more artifact directories]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from calibkit.calibrators import calibrator_from_dict
from calibkit.manifest import (
    MANIFEST_FILE,
    LabelShiftReference,
    Manifest,
    load_conformal,
    load_manifest,
    write_manifest,
)
from training.config import RunConfig
from training.conformal import fit_conformal, read_split, write_conformal
from training.export import MAX_PROB_DIFF, sha256_of
from training.inference import onnx_outputs, onnx_session
from training.pipeline import load_splits

#: The keys of ``conformal.json`` that this script adds.
CLASS_KEYS = ("class_calibrators", "class_floor_calibrators")


class UpgradeError(ValueError):
    """The artifact cannot be upgraded without changing what it holds."""


def missing_entries(directory: Path) -> list[str]:
    """The entries ``directory``'s artifact lacks, of ``label_shift`` and ``CLASS_KEYS`` (none without conformal
    scores)."""
    manifest = load_manifest(directory / MANIFEST_FILE)
    missing = ["label_shift"] if manifest.label_shift is None else []
    if manifest.conformal is not None:
        data = json.loads((directory / manifest.conformal.file).read_text())
        missing += [key for key in CLASS_KEYS if key not in data]
    return missing


def upgrade(directory: str | Path) -> list[str]:
    """Add the missing entries to the artifact in ``directory``; the names of those added (none when up to date).

    Raises:
        UpgradeError: Naming what differs when the artifact's model, split or existing values are not those drawn
            again, or when it records no training config.
    """
    directory = Path(directory)
    missing = missing_entries(directory)
    if not missing:
        return []
    manifest = load_manifest(directory / MANIFEST_FILE)
    model_path = directory / manifest.model_file
    if sha256_of(model_path) != manifest.model_sha256:
        raise UpgradeError(f"{model_path}: its SHA-256 is not the manifest's model_sha256")
    config = (manifest.training or {}).get("config")
    if not isinstance(config, dict):
        raise UpgradeError(
            f"{directory}: the manifest records no training.config, so its validation rows cannot be drawn again "
            "(an artifact of `calibrate --onnx` gets both entries by calibrating it again)"
        )
    try:
        validation = load_splits(RunConfig.model_validate(config)).val
    except ValidationError as exc:
        raise UpgradeError(f"{directory}: training.config does not validate: {exc}") from None
    served = onnx_outputs(onnx_session(model_path), validation.x)

    label_shift = manifest.label_shift
    if "label_shift" in missing:
        label_shift = _label_shift(manifest, served["logits"], validation.y, directory)
    conformal_spec, conformal_data = manifest.conformal, None
    if manifest.conformal is not None and set(CLASS_KEYS) & set(missing):
        path = directory / manifest.conformal.file
        recorded = json.loads(path.read_text())
        split = read_split(path, validation.y)
        if len(split.temperature) != manifest.calibration.n_samples:
            raise UpgradeError(
                f"{path}: the split drawn again has {len(split.temperature)} temperature rows, not the manifest's "
                f"calibration.n_samples {manifest.calibration.n_samples}"
            )
        fitted = fit_conformal(served["probabilities"], validation.y, split)
        recomputed = json.loads(json.dumps(fitted))
        for key, value in recorded.items():
            if recomputed.get(key) != value:
                raise UpgradeError(f"{path}: `{key}` differs from the one computed again; nothing was written")
        conformal_data = fitted
    if conformal_data is not None:
        assert manifest.conformal is not None
        written = write_conformal(conformal_data, directory / manifest.conformal.file)
        conformal_spec = manifest.conformal.model_copy(update={"sha256": written.sha256})
    upgraded = Manifest.model_validate(
        manifest.model_dump() | {"label_shift": label_shift, "conformal": conformal_spec}
    )
    write_manifest(upgraded, directory)
    if upgraded.conformal is not None:
        for floor in (False, True):
            load_conformal(directory, upgraded.conformal, upgraded.class_names, floor=floor, by_class=True)
    return missing


def _label_shift(manifest: Manifest, logits: np.ndarray, labels: np.ndarray, directory: Path) -> LabelShiftReference:
    """``LabelShiftReference.from_rows`` of the manifest's calibration applied to the validation logits, after
    checking that they give the manifest's reference confidences (rounded to 6 digits) and accuracy."""
    calibration = manifest.calibration
    calibrator = calibrator_from_dict(
        {"method": calibration.method, "params": calibration.params, "n_classes": len(manifest.class_names)}
    )
    probs = calibrator.transform(logits)
    reference = manifest.reference
    confidences = np.sort(probs.max(axis=1))
    if len(confidences) != len(reference.confidences) or not np.allclose(
        confidences, reference.confidences, rtol=0, atol=MAX_PROB_DIFF
    ):
        raise UpgradeError(
            f"{directory}: the validation split drawn again does not give the manifest's reference confidences"
        )
    if float(np.mean(probs.argmax(axis=1) == labels)) != reference.accuracy:
        raise UpgradeError(f"{directory}: the validation split drawn again does not give the reference accuracy")
    return LabelShiftReference.from_rows(probs, labels, split=reference.split)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directories", nargs="+", type=Path, help="artifact directories (artifacts/<name>/<version>)")
    args = parser.parse_args(argv)
    for directory in args.directories:
        try:
            added = upgrade(directory)
        except (ValueError, FileNotFoundError) as exc:
            print(f"{directory}: not upgraded: {exc}", file=sys.stderr)
            return 1
        print(f"{directory}: added {', '.join(added)}" if added else f"{directory}: up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
