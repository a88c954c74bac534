"""The loss comparison of Mukhoti et al. 2020, Table 1, on the chosen data set.

Each loss trains the same model with the same data, seed and schedule; the temperature is then
fitted on the validation split (Mukhoti et al. pick T by ECE on validation, so the default
objective here is the ECE grid) and test ECE is reported before -> after, with test error, all
with 90% bootstrap intervals.
"""

from __future__ import annotations

import json
from pathlib import Path

from calibkit.calibrators import TemperatureScaling
from calibkit.temperature import softmax
from training.config import RunConfig
from training.evaluation import score
from training.inference import predict_logits
from training.pipeline import load_splits
from training.trainer import train

#: (label, loss, params) in the order of Mukhoti et al.'s Table 1, plus MbLS (Liu et al. 2022).
STUDY_LOSSES = (
    ("Cross-Entropy", "ce", {}),
    ("Brier Loss", "brier", {}),
    ("MMCE", "mmce", {}),
    ("LS-0.05", "label_smoothing", {"smoothing": 0.05}),
    ("FL-3 (Ours)", "focal", {"gamma": 3.0}),
    ("FLSD-53 (Ours)", "flsd53", {}),
    ("MbLS (m=10, a=0.1)", "mbls", {"margin": 10.0, "alpha": 0.1}),
)
SHOWN = ("ece", "adaptive_ece", "classwise_ece")


def run_study(base: RunConfig, output: Path, progress: bool = True, objective: str | None = None) -> str:
    """Train every loss of ``STUDY_LOSSES``; write ``study.json`` and ``study.md``; return the table."""
    objective = objective or ("ece" if "calibration_objective" not in base.model_fields_set else base.calibration_objective)
    splits = load_splits(base)
    rows = []
    for label, loss, params in STUDY_LOSSES:
        config = base.model_copy(update={"loss": loss, "loss_params": params})
        result = train(config, splits, progress=progress)
        val_logits, test_logits = predict_logits(result.model, splits.val.x), predict_logits(result.model, splits.test.x)
        calibrator = TemperatureScaling(objective=objective).fit(val_logits, splits.val.y)
        rows.append({
            "method": label, "loss": loss, "params": params, "temperature": calibrator.temperature,
            "best_epoch": result.best_epoch,
            "before": score(softmax(test_logits), splits.test.y, base.n_resamples, base.n_bins, base.seed),
            "after": score(calibrator.transform(test_logits), splits.test.y, base.n_resamples, base.n_bins, base.seed),
        })
    output.mkdir(parents=True, exist_ok=True)
    setup = (f"{splits.name} ({len(splits.train)}/{len(splits.val)}/{len(splits.test)} train/val/test), {base.model}, "
             f"{base.epochs} epochs {base.optimizer} lr {base.lr} {base.schedule}, seed {base.seed}; "
             f"T fitted on validation by {objective}")
    (output / "study.json").write_text(json.dumps({"setup": setup, "rows": rows}, indent=2))
    table = markdown_table(rows, setup)
    (output / "study.md").write_text(table)
    return table


def _pct(entry: dict) -> str:
    lo, hi = entry["ci"]
    return f"{100 * entry['value']:.2f} [{100 * lo:.2f}, {100 * hi:.2f}]"


def markdown_table(rows: list[dict], setup: str) -> str:
    """Test error and ECE / AdaECE / classwise ECE (%) before -> after temperature scaling."""
    lines = [f"Setup: {setup}. Values in %, 90% bootstrap intervals on the test split.", "",
             "| method | test error | ECE pre-T | ECE post-T (T) | AdaECE pre-T | AdaECE post-T | Classwise ECE pre-T | Classwise ECE post-T |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        err = {"value": 1 - r["before"]["accuracy"]["value"],
               "ci": [1 - r["before"]["accuracy"]["ci"][1], 1 - r["before"]["accuracy"]["ci"][0]]}
        cells = [_pct(err), _pct(r["before"]["ece"]), f"{_pct(r['after']['ece'])} ({r['temperature']:.2f})",
                 _pct(r["before"]["adaptive_ece"]), _pct(r["after"]["adaptive_ece"]),
                 _pct(r["before"]["classwise_ece"]), _pct(r["after"]["classwise_ece"])]
        lines.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
