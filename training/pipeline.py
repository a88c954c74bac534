"""The training commands as functions over a run directory: train, calibrate, evaluate, export, run.

A run directory holds ``checkpoint.pt`` (the weights the checkpoint policy kept, model spec, config, history),
``calibration.json``, ``conformal.json``, ``metrics.json``, ``report.md`` and ``plots/``; each step reads what the
previous one wrote, so steps can be re-run alone (e.g. another calibration method)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

import yaml

from calibkit.calibrators import Calibrator, build_calibrator, load_calibrator, save_calibrator
from calibkit.manifest import CONFORMAL_FILE
from training.config import RunConfig
from training.conformal import CalibrationSplit, calibration_split, fit_conformal, read_split
from training.data import DataSplits, load_dataset, subsample_train, with_label_noise
from training.evaluation import evaluate
from training.export import write_artifact
from training.inference import predict_logits
from training.report import write_report
from training.trainer import TrainResult, load_checkpoint, save_checkpoint, train

CHECKPOINT, CALIBRATION, METRICS = "checkpoint.pt", "calibration.json", "metrics.json"
#: Data sets stored with ink as high values: images sent to the service must be inverted to match.
INK_IS_HIGH = {"digits": True}


def load_splits(config: RunConfig) -> DataSplits:
    """The data set of ``config``, split deterministically by its seed, with the training split cut to
    ``train_size`` and ``label_noise`` applied to every split (both also drawn by the seed)."""
    splits = load_dataset(
        config.dataset,
        path=None if config.data_path is None else str(config.data_path),
        classes=config.classes,
        image_size=config.image_size,
        seed=config.seed,
    )
    if config.train_size is not None:
        splits = subsample_train(splits, config.train_size, config.seed)
    if config.label_noise:
        splits = with_label_noise(splits, config.label_noise, config.seed)
    return splits


def train_step(config: RunConfig, run_dir: Path, progress: bool = True) -> TrainResult:
    """Train and write the checkpoint (the epoch ``config.checkpoint`` keeps), the config and the per-epoch history."""
    splits = load_splits(config)
    result = train(config, splits, progress=progress)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_checkpoint(result, config, run_dir / CHECKPOINT)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    (run_dir / "history.json").write_text(json.dumps(result.history, indent=2))
    return result


def calibrate_step(
    run_dir: Path,
    method: str | None = None,
    objective: Literal["nll", "ece"] | None = None,
    conformal_fraction: float | None = None,
) -> Calibrator:
    """Split the validation split (``conformal_fraction``, by the seed), fit post-hoc calibration on the temperature
    part and write ``calibration.json``; fit the conformal scores of the calibrated probabilities on the other part
    and write ``conformal.json`` (none when the fraction is 0: calibration on all of validation)."""
    result, config = load_checkpoint(run_dir / CHECKPOINT)
    options = {"calibration": method, "calibration_objective": objective, "conformal_fraction": conformal_fraction}
    for field, value in options.items():
        if value is not None:
            setattr(config, field, value)  # validated: RunConfig validates assignments
    val = load_splits(config).val
    split = calibration_split(val.y, config.conformal_fraction, config.seed)
    logits, rows = predict_logits(result.model, val.x), split.temperature
    options = {"objective": config.calibration_objective} if config.calibration == "temperature" else {}
    calibrator = build_calibrator(config.calibration, **options).fit(logits[rows], val.y[rows])
    save_calibrator(calibrator, run_dir / CALIBRATION)
    conformal_path = run_dir / CONFORMAL_FILE
    if len(split.conformal):
        conformal_path.write_text(json.dumps(fit_conformal(calibrator.transform(logits), val.y, split), indent=1))
    else:
        conformal_path.unlink(missing_ok=True)
    return calibrator


def evaluate_step(run_dir: Path) -> dict:
    """Evaluate before/after calibration on test, shifted and OOD data; write metrics and the report."""
    result, config, calibrator, splits, split = _load_run(run_dir)
    evaluation = evaluate(lambda x: predict_logits(result.model, x), calibrator, splits, config)
    (run_dir / METRICS).write_text(json.dumps(evaluation, indent=2))
    params = str(calibrator.to_dict()["params"]) if calibrator.method == "temperature" else ""
    summary = {
        "data": f"{splits.name}: {len(splits.train)} train / {len(splits.val)} validation / {len(splits.test)} test",
        "model": _describe_model(config),
        "loss": f"{config.loss} {config.loss_params or ''}".strip(),
        "training": f"{config.epochs} epochs, {config.optimizer} lr {config.lr}, {config.schedule} schedule, "
        f"seed {config.seed}; kept epoch {result.best_epoch} by {config.checkpoint} ({result.seconds:.1f} s)",
        "calibration": " ".join(part for part in (calibrator.method, params, _fitted_on(split)) if part),
    }
    write_report(
        run_dir,
        f"Calibration report: {config.model_name}",
        evaluation,
        summary,
        predict_logits(result.model, splits.test.x),
        splits.test.y,
        calibrator,
        config.n_bins,
    )
    return evaluation


def export_step(
    run_dir: Path, artifacts: Path, version: str | None = None, overwrite: bool = False
) -> tuple[Path, dict]:
    """Export the calibrated model with its manifest, report and plots to ``artifacts/<name>/<version>/``."""
    if not (run_dir / METRICS).is_file():
        raise FileNotFoundError(f"no {METRICS} in {run_dir}: run `python -m training evaluate` first")
    result, config, calibrator, splits, split = _load_run(run_dir)
    evaluation = json.loads((run_dir / METRICS).read_text())
    spec = result.spec
    return write_artifact(
        model=result.model,
        calibrator=calibrator,
        class_names=spec.class_names,
        input_shape=(spec.in_channels, spec.image_size, spec.image_size),
        val_x=splits.val.x,
        val_y=splits.val.y,
        evaluation=evaluation,
        training_info={
            "config": config.model_dump(mode="json"),
            "best_epoch": result.best_epoch,
            "train_seconds": round(result.seconds, 2),
            "final_epoch": result.history[-1],
        },
        root=artifacts,
        name=config.model_name,
        version=version or config.version,
        overwrite=overwrite,
        extra_files=[run_dir / name for name in (METRICS, "report.md", "plots", CALIBRATION)],
        invert=INK_IS_HIGH.get(config.dataset, False),
        split=split,
    )


def run(config: RunConfig, run_dir: Path, artifacts: Path, overwrite: bool = False, progress: bool = True) -> dict:
    """train -> calibrate -> evaluate -> export; returns a summary with timings."""
    timings, start = {}, time.perf_counter()
    train_step(config, run_dir, progress)
    timings["train"] = time.perf_counter() - start
    calibrate_step(run_dir)
    timings["calibrate"] = time.perf_counter() - start - sum(timings.values())
    evaluation = evaluate_step(run_dir)
    timings["evaluate"] = time.perf_counter() - start - sum(timings.values())
    directory, parity = export_step(run_dir, artifacts, overwrite=overwrite)
    timings["export"] = time.perf_counter() - start - sum(timings.values())
    return {
        "artifact": str(directory),
        "parity": parity,
        "evaluation": evaluation,
        "seconds": {k: round(v, 2) for k, v in timings.items()},
    }


def _fitted_on(split: CalibrationSplit) -> str:
    if not len(split.conformal):
        return "fitted on the validation split"
    return (
        f"fitted on {len(split.temperature)} of the {split.rows} validation rows; conformal scores (LAC, APS, RAPS) "
        f"on the other {len(split.conformal)} (seed {split.seed}, stratified)"
    )


def _describe_model(config: RunConfig) -> str:
    """The model with where its weights came from, what was fine-tuned, any resize and augmentation."""
    parts = [config.model if config.weights is None else f"{config.model} from {config.weights.name}"]
    if config.weights is not None:
        parts.append("fine-tuning " + ("all layers" if config.finetune == "all" else "a new classification layer"))
    if config.input_size:
        parts.append(f"input resized to {config.input_size}")
    if config.augment:
        parts.append("CIFAR augmentation")
    return ", ".join(parts)


def _load_run(run_dir: Path) -> tuple[TrainResult, RunConfig, Calibrator, DataSplits, CalibrationSplit]:
    """A calibrated run: its checkpoint, config and calibrator, its data and the split that fitted the calibration."""
    result, config = load_checkpoint(run_dir / CHECKPOINT)
    if not (run_dir / CALIBRATION).is_file():
        raise FileNotFoundError(f"no {CALIBRATION} in {run_dir}: run `python -m training calibrate` first")
    calibrator, splits = load_calibrator(run_dir / CALIBRATION), load_splits(config)
    return result, config, calibrator, splits, read_split(run_dir / CONFORMAL_FILE, splits.val.y)
