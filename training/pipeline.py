"""The training commands as functions over a run directory: train, calibrate, evaluate, export, run.

A run directory holds ``checkpoint.pt`` (the weights the checkpoint policy kept, model spec, config, history),
``calibration.json``, ``metrics.json``, ``report.md`` and ``plots/``; each step reads what the
previous one wrote, so steps can be re-run alone (e.g. another calibration method).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

import numpy as np
import yaml

from calibkit.calibrators import Calibrator, build_calibrator, load_calibrator, save_calibrator
from training.config import RunConfig
from training.conformal import CONFORMAL_FILE, CalibrationSplit, calibration_split, fit_conformal, read_split
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


def fit_calibration(config: RunConfig, model, splits: DataSplits, rows: np.ndarray | None = None) -> Calibrator:
    """Fit ``config.calibration`` on the validation split's logits (only its ``rows`` when given)."""
    options = {"objective": config.calibration_objective} if config.calibration == "temperature" else {}
    logits, labels = predict_logits(model, splits.val.x), splits.val.y
    if rows is not None:
        logits, labels = logits[rows], labels[rows]
    return build_calibrator(config.calibration, **options).fit(logits, labels)


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
    if method is not None:
        config.calibration = method
    if objective is not None:
        config.calibration_objective = objective
    if conformal_fraction is not None:
        config.conformal_fraction = conformal_fraction
    splits = load_splits(config)
    split = calibration_split(splits.val.y, config.conformal_fraction, config.seed)
    calibrator = fit_calibration(config, result.model, splits, split.temperature)
    save_calibrator(calibrator, run_dir / CALIBRATION)
    conformal_path = run_dir / CONFORMAL_FILE
    if len(split.conformal):
        probs = calibrator.transform(predict_logits(result.model, splits.val.x))
        conformal_path.write_text(json.dumps(fit_conformal(probs, splits.val.y, split), indent=1))
    else:
        conformal_path.unlink(missing_ok=True)
    return calibrator


def evaluate_step(run_dir: Path) -> dict:
    """Evaluate before/after calibration on test, shifted and OOD data; write metrics and the report."""
    result, config = load_checkpoint(run_dir / CHECKPOINT)
    calibrator = _load_run_calibrator(run_dir)
    splits = load_splits(config)
    split = read_split(run_dir / CONFORMAL_FILE, splits.val.y)
    evaluation = evaluate(lambda x: predict_logits(result.model, x), calibrator, splits, config)
    (run_dir / METRICS).write_text(json.dumps(evaluation, indent=2))
    summary = {
        "data": f"{splits.name}: {len(splits.train)} train / {len(splits.val)} validation / {len(splits.test)} test",
        "model": _describe_model(config),
        "loss": f"{config.loss} {config.loss_params or ''}".strip(),
        "training": f"{config.epochs} epochs, {config.optimizer} lr {config.lr}, {config.schedule} schedule, "
        f"seed {config.seed}; kept epoch {result.best_epoch} by {config.checkpoint} "
        f"({result.seconds:.1f} s)",
        "calibration": " ".join(
            part
            for part in (
                calibrator.method,
                str(calibrator.to_dict()["params"]) if calibrator.method == "temperature" else "",
                _fitted_on(split),
            )
            if part
        ),
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
    result, config = load_checkpoint(run_dir / CHECKPOINT)
    calibrator = _load_run_calibrator(run_dir)
    if not (run_dir / METRICS).is_file():
        raise FileNotFoundError(f"no {METRICS} in {run_dir}: run `python -m training evaluate` first")
    evaluation = json.loads((run_dir / METRICS).read_text())
    splits = load_splits(config)
    split = read_split(run_dir / CONFORMAL_FILE, splits.val.y)
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


def _load_run_calibrator(run_dir: Path) -> Calibrator:
    path = run_dir / CALIBRATION
    if not path.is_file():
        raise FileNotFoundError(f"no {CALIBRATION} in {run_dir}: run `python -m training calibrate` first")
    return load_calibrator(path)
