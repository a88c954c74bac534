"""The loss comparison of Mukhoti et al. 2020, Table 1, over several seeds.

Protocol (``STUDY_PROTOCOL``, the defaults under any config file and flags; why: docs/study/protocol.md): every loss
trains the same model on the same data and seed with Mukhoti et al.'s CIFAR schedule scaled to the data set, and the
final model is evaluated (``checkpoint: last``, as Guo et al. 2017 and Mukhoti et al. do); T is fitted on the
validation split by ECE on Mukhoti et al.'s grid, and test ECE is reported before -> after. Each seed draws the split,
the training subset, the label noise and the initialisation. Values are mean +- sd over seeds with a 90% two-level
bootstrap interval (seeds, then test rows; ``calibkit.bootstrap.hierarchical_bootstrap``); claims about the ordering
are paired contrasts on the same seeds and rows, stated only where the interval excludes zero.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from calibkit import metrics
from calibkit.bootstrap import RunsBootstrap, hierarchical_bootstrap
from calibkit.calibrators import TemperatureScaling
from calibkit.temperature import softmax
from training.config import RunConfig, load_config
from training.inference import predict_logits
from training.machine import hardware
from training.pipeline import load_splits
from training.trainer import train

#: (label, loss, params) in the order of Mukhoti et al.'s Table 1, plus MbLS (Liu et al. 2022).
STUDY_LOSSES: tuple[tuple[str, str, dict[str, float]], ...] = (
    ("Cross-Entropy", "ce", {}),
    ("Brier Loss", "brier", {}),
    ("MMCE", "mmce", {}),
    ("LS-0.05", "label_smoothing", {"smoothing": 0.05}),
    ("FL-3 (Ours)", "focal", {"gamma": 3.0}),
    ("FLSD-53 (Ours)", "flsd53", {}),
    ("MbLS (m=10, a=0.1)", "mbls", {"margin": 10.0, "alpha": 0.1}),
)
CE, FOCAL, FLSD = "Cross-Entropy", "FL-3 (Ours)", "FLSD-53 (Ours)"
#: The papers' protocol, scaled to digits (see the module docstring and docs/study/protocol.md).
STUDY_PROTOCOL = {
    "optimizer": "sgd",
    "lr": 0.1,
    "momentum": 0.9,
    "weight_decay": 5e-4,
    "batch_size": 128,
    "schedule": "step",
    "milestones": [150 / 350, 250 / 350],
    "epochs": 70,
    "checkpoint": "last",
    "label_noise": 0.3,
    "calibration_objective": "ece",
    "n_resamples": 500,
}
DEFAULT_SEEDS = (0, 1, 2, 3, 4)
#: Bootstrapped metrics per method and stage; "error" is 1 - accuracy.
METRICS: dict[str, Callable[..., float]] = {
    "error": lambda p, y: 1.0 - metrics.accuracy(p, y),
    "ece": metrics.ece,
    "adaptive_ece": metrics.adaptive_ece,
    "classwise_ece": metrics.classwise_ece,
}
STAGES = ("pre", "post")


def study_config(path: str | Path | None = None, **overrides) -> RunConfig:
    """A ``RunConfig`` with ``STUDY_PROTOCOL`` under the optional YAML file and the ``overrides``."""
    return load_config(path, defaults=STUDY_PROTOCOL, **overrides)


def measured_on() -> str:
    """CPU model, core count and torch's thread count: what the study's time was measured on."""
    import torch

    cpu = hardware()
    return (
        f"{cpu['cpu'] or 'unknown CPU'}, {cpu['cores']} cores, torch {torch.__version__} "
        f"on {torch.get_num_threads()} threads"
    )


def train_seed(base: RunConfig, seed: int, progress: bool = True) -> tuple[dict, list[dict]]:
    """Train every loss on one seed: the run (test labels and each method's test probabilities before
    and after T, keyed ``"<method>|pre"`` / ``"<method>|post"``) and one record per method."""
    config = base.model_copy(update={"seed": seed})
    splits = load_splits(config)
    run, records = {"labels": splits.test.y}, []
    for label, loss, params in STUDY_LOSSES:
        result = train(config.model_copy(update={"loss": loss, "loss_params": params}), splits, progress=progress)
        val_logits, test_logits = (
            predict_logits(result.model, splits.val.x),
            predict_logits(result.model, splits.test.x),
        )
        calibrator = TemperatureScaling(objective=base.calibration_objective)
        calibrator.fit(val_logits, splits.val.y)
        run[f"{label}|pre"], run[f"{label}|post"] = softmax(test_logits), calibrator.transform(test_logits)
        records.append(
            {
                "method": label,
                "seed": seed,
                "temperature": calibrator.temperature,
                "epoch": result.best_epoch,
                "train_accuracy": result.history[result.best_epoch - 1]["train_accuracy"],
                "seconds": round(result.seconds, 2),
            }
        )
    return run, records


def _statistic(metric, key: str, run: dict) -> float:
    return metric(run[key], run["labels"])


def _only_value(key: str, run: dict) -> float:
    return float(run[key][0])


def bootstrap_runs(runs: Sequence[dict], n_resamples: int, n_bins: int = 15, seed: int = 0) -> RunsBootstrap:
    """Every metric of ``METRICS`` for every method and stage, two-level bootstrapped over the seeds' runs."""
    statistics = {}
    for label, _, _ in STUDY_LOSSES:
        for stage in STAGES:
            for name, metric in METRICS.items():
                if name == "error" and stage == "post":
                    continue  # temperature scaling never changes the argmax
                fn = partial(metric, n_bins=n_bins) if name != "error" else metric
                statistics[f"{label}|{stage}|{name}"] = partial(_statistic, fn, f"{label}|{stage}")
    return hierarchical_bootstrap(statistics, runs, n_resamples=n_resamples, seed=seed)


def bootstrap_temperatures(records: Sequence[dict], n_resamples: int, seed: int = 0) -> RunsBootstrap:
    """The fitted T per method, bootstrapped over seeds (one value per seed: the validation rows behind
    it differ with the seed, so the spread over seeds carries their sampling too)."""
    seeds = sorted({r["seed"] for r in records})
    runs = [{r["method"]: np.array([r["temperature"]]) for r in records if r["seed"] == s} for s in seeds]
    statistics = {label: partial(_only_value, label) for label, _, _ in STUDY_LOSSES}
    return hierarchical_bootstrap(statistics, runs, n_resamples=n_resamples, seed=seed)


def _summary(boot: RunsBootstrap, contrast, span: tuple[float, float] | None = (0.0, 1.0)) -> dict:
    """Mean, sd, per-seed values and the 90% basic interval cut to ``span``, the statistic's range (None: contrasts)."""
    ci = boot.interval(contrast)
    bounds = [ci.low, ci.high] if span is None else np.clip([ci.low, ci.high], *span).tolist()
    return {"mean": ci.estimate, "sd": boot.sd(contrast), "ci": bounds, "per_seed": boot.values(contrast).tolist()}


def claims(boot: RunsBootstrap, temperatures: RunsBootstrap) -> list[dict]:
    """The paper's ordering as paired contrasts on the same seeds and test rows, each with its 90% interval:
    four claims that ``hold`` when the interval lies above the null value, then every method's post-T ECE
    against cross-entropy's, ``lower``/``higher`` where the interval excludes 0, else ``no difference``."""

    pre, post = "{}|pre|ece".format, "{}|post|ece".format
    rows = [
        ("Cross-entropy is over-confident: T > 1", temperatures, CE, 1.0),
        (
            "Temperature scaling lowers cross-entropy's ECE: ECE pre-T - post-T > 0",
            boot,
            {pre(CE): 1, post(CE): -1},
            0.0,
        ),
        ("FL-3 below cross-entropy before T: ECE(CE) - ECE(FL-3) > 0", boot, {pre(CE): 1, pre(FOCAL): -1}, 0.0),
        ("FLSD-53 below cross-entropy before T: ECE(CE) - ECE(FLSD-53) > 0", boot, {pre(CE): 1, pre(FLSD): -1}, 0.0),
    ]
    out = []
    for text, source, contrast, null in rows:
        entry = _summary(source, contrast, span=None)
        agreeing = int(np.sum(np.asarray(entry["per_seed"]) > null))
        out.append({"claim": text, **entry, "seeds_agreeing": agreeing, "holds": entry["ci"][0] > null})
    for label, _, _ in STUDY_LOSSES[1:]:
        entry = _summary(boot, {post(label): 1, post(CE): -1}, span=None)
        low, high = entry["ci"]
        outcome = "lower" if high < 0 else "higher" if low > 0 else "no difference"
        agreeing = int(np.sum(np.sign(entry["per_seed"]) == np.sign(entry["mean"])))
        out.append(
            {"claim": f"After T: ECE({label}) - ECE(CE)", **entry, "seeds_agreeing": agreeing, "outcome": outcome}
        )
    return out


def run_study(base: RunConfig, output: Path, seeds: Sequence[int] = DEFAULT_SEEDS, progress: bool = True) -> str:
    """Train every loss of ``STUDY_LOSSES`` on every seed; write ``study.json`` and ``study.md``; the markdown."""
    if len(set(seeds)) != len(seeds) or not seeds:
        raise ValueError(f"seeds must be distinct and at least one, got {list(seeds)}")
    start = time.perf_counter()
    runs, records = [], []
    for seed in seeds:
        run, seed_records = train_seed(base, seed, progress)
        runs.append(run)
        records += seed_records
    train_seconds = time.perf_counter() - start
    boot = bootstrap_runs(runs, base.n_resamples, base.n_bins, base.seed)
    temperatures = bootstrap_temperatures(records, base.n_resamples, base.seed)
    rows = []
    for label, loss, params in STUDY_LOSSES:
        row: dict[str, Any] = {
            "method": label,
            "loss": loss,
            "params": params,
            "temperature": _summary(temperatures, label, (0.0, np.inf)),
            "epoch": sorted({r["epoch"] for r in records if r["method"] == label}),
        }
        for name in boot.names:
            method, stage, metric = name.split("|")
            if method == label:
                row.setdefault(stage, {})[metric] = _summary(boot, name)
        rows.append(row)
    study = {
        "setup": setup_line(base, runs, seeds),
        "config": base.model_dump(mode="json", exclude={"seed", "loss", "loss_params"}),
        "seeds": list(seeds),
        "machine": measured_on(),
        "seconds": {"training": round(train_seconds, 1), "total": round(time.perf_counter() - start, 1)},
        "rows": rows,
        "claims": claims(boot, temperatures),
        "per_seed": records,
    }
    output.mkdir(parents=True, exist_ok=True)
    (output / "study.json").write_text(json.dumps(study, indent=2))
    table = markdown(study)
    (output / "study.md").write_text(table)
    return table


def setup_line(base: RunConfig, runs: Sequence[dict], seeds: Sequence[int]) -> str:
    """One line naming the data, the training protocol, the seeds and how T was fitted."""
    data = (
        base.dataset
        + (f", {base.train_size} training images" if base.train_size else "")
        + (f", {base.label_noise:.0%} symmetric label noise in every split" if base.label_noise else "")
    )
    milestones = "/".join(str(int(base.epochs * m)) for m in base.milestones)
    schedule = f"step at epochs {milestones}" if base.schedule == "step" else base.schedule
    return (
        f"{data} ({len(runs[0]['labels'])} test images per seed), {base.model}, {base.epochs} epochs "
        f"{base.optimizer} lr {base.lr} momentum {base.momentum} weight decay {base.weight_decay} batch "
        f"{base.batch_size}, {schedule}, checkpoint {base.checkpoint}; seeds {', '.join(map(str, seeds))}; "
        f"T fitted on validation by {base.calibration_objective}"
    )


def _cell(entry: dict, scale: float = 100.0, digits: int = 2) -> str:
    lo, hi = entry["ci"]
    return (
        f"{scale * entry['mean']:.{digits}f} ± {scale * entry['sd']:.{digits}f} "
        f"[{scale * lo:.{digits}f}, {scale * hi:.{digits}f}]"
    )


def markdown(study: dict) -> str:
    """The study as markdown: setup, Mukhoti et al.'s Table 1 layout, AdaECE and classwise ECE, the ordering claims."""
    lines = [
        f"Setup: {study['setup']}.",
        "",
        f"Machine: {study['machine']}; {study['seconds']['total']:.0f} s in all ({study['seconds']['training']:.0f} s "
        f"training). Cells: mean ± sd over the {len(study['seeds'])} seeds [90% two-level bootstrap interval: seeds, "
        "then test rows], in % except T. The intervals are basic bootstrap intervals: binned errors are biased "
        "upwards on a few hundred rows, and the interval of the population value can sit below the mean by that "
        "bias. Protocol, choice of configuration and reading: [protocol.md](protocol.md).",
        "",
        "| method | test error | ECE pre-T | ECE post-T | T |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in study["rows"]:
        t = r["temperature"]
        lines.append(
            f"| {r['method']} | {_cell(r['pre']['error'])} | {_cell(r['pre']['ece'])} | "
            f"{_cell(r['post']['ece'])} | {_cell(t, 1.0)} |"
        )
    lines += [
        "",
        "| method | AdaECE pre-T | AdaECE post-T | Classwise ECE pre-T | Classwise ECE post-T |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in study["rows"]:
        lines.append(
            f"| {r['method']} | {_cell(r['pre']['adaptive_ece'])} | {_cell(r['post']['adaptive_ece'])} | "
            f"{_cell(r['pre']['classwise_ece'], 100.0, 3)} | {_cell(r['post']['classwise_ece'], 100.0, 3)} |"
        )
    lines += [
        "",
        "Ordering claims: paired contrasts over the same seeds and test rows (T in units, ECE in %); a claim "
        "holds when its 90% interval lies above the null value; seeds agreeing: seeds with the contrast's "
        "sign.",
        "",
        "| claim | mean ± sd [90% interval] | seeds agreeing | result |",
        "| --- | --- | --- | --- |",
    ]
    for c in study["claims"]:
        scale = 1.0 if c["claim"].startswith("Cross-entropy is over-confident") else 100.0
        result = c["outcome"] if "outcome" in c else ("holds" if c["holds"] else "does not hold")
        lines.append(f"| {c['claim']} | {_cell(c, scale)} | {c['seeds_agreeing']}/{len(study['seeds'])} | {result} |")
    return "\n".join(lines) + "\n"
