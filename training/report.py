"""The human-readable side of an evaluation: a markdown report and PNG plots, the reliability diagram with confidence
histogram before/after calibration (Guo et al. 2017, Fig. 1), ECE versus temperature, and ECE versus corruption
severity (Ovadia et al. 2019, Fig. 2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calibkit import metrics
from calibkit.calibrators import Calibrator
from calibkit.plotting import reliability_figure
from calibkit.temperature import softmax

METRIC_TITLES = {
    "accuracy": "Accuracy",
    "ece": "ECE",
    "mce": "MCE",
    "adaptive_ece": "AdaECE",
    "classwise_ece": "Classwise ECE",
    "nll": "NLL",
    "brier": "Brier",
}


def _figure(size=(6.0, 4.0)):
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    return Figure(figsize=size, layout="constrained")


def plot_ece_vs_temperature(evaluation: dict, path: Path) -> None:
    """ECE of softmax(z / T) over the temperature grid, validation and test, with the fitted T."""
    fig = _figure()
    ax = fig.subplots()
    for split, curve in evaluation["ece_vs_temperature"].items():
        ax.plot(curve["temperature"], curve["ece"], label=split)
    fitted = evaluation["calibration"]["params"].get("temperature")
    if fitted is not None:
        ax.axvline(fitted, color="black", linestyle="--", label=f"fitted T = {fitted:.3f}")
    ax.set(xscale="log", xlabel="temperature T", ylabel="ECE (15 bins)", title="ECE versus temperature")
    ax.legend()
    fig.savefig(path, dpi=110)


def plot_ece_vs_severity(evaluation: dict, path: Path) -> None:
    """ECE before and after calibration per corruption severity (0 = clean test split)."""
    fig = _figure((7.0, 4.5))
    ax = fig.subplots()
    clean = {stage: evaluation["test"][stage]["ece"]["value"] for stage in ("before", "after")}
    for stage, color in (("before", "#c23b2b"), ("after", "#3b75af")):
        per_corruption = []
        for by_severity in evaluation["shifted"].values():
            severities = sorted(int(s) for s in by_severity)
            values = [clean[stage]] + [by_severity[str(s)][stage]["ece"]["value"] for s in severities]
            per_corruption.append(values)
            ax.plot([0, *severities], values, color=color, alpha=0.25, linewidth=0.8)
        if per_corruption:
            ax.plot(
                [0, *severities],
                np.mean(per_corruption, axis=0),
                color=color,
                linewidth=2.5,
                marker="o",
                label=f"{stage} calibration (mean over corruptions)",
            )
    ax.set(xlabel="corruption severity (0 = clean)", ylabel="ECE (15 bins)", title="Calibration under dataset shift")
    ax.legend()
    fig.savefig(path, dpi=110)


def _cell(entry: dict) -> str:
    lo, hi = entry["ci"]
    return f"{entry['value']:.4f} [{lo:.4f}, {hi:.4f}]"


def markdown_report(title: str, evaluation: dict, summary: dict[str, str], rows: str = "Test split") -> str:
    """Summary, metrics before/after on ``evaluation["test"]`` (titled ``rows``), shift table and OOD if any."""
    lines = [f"# {title}", ""]
    lines += [f"- **{key}**: {value}" for key, value in summary.items()]
    lines += [
        "",
        f"## {rows}",
        "",
        "Point values are the plug-in estimates as the papers define them; brackets are 90% basic bootstrap "
        "intervals for the population value. Binned calibration errors are biased upwards on small samples, "
        "so their interval can sit below the plug-in estimate: that gap is the bootstrap's estimate of the bias.",
        "",
        "| metric | before calibration | after calibration |",
        "| --- | --- | --- |",
    ]
    test = evaluation["test"]
    lines += [f"| {METRIC_TITLES[m]} | {_cell(test['before'][m])} | {_cell(test['after'][m])} |" for m in METRIC_TITLES]
    lines += [
        "",
        "![reliability](plots/reliability.png)",
        "",
        "![ECE vs temperature](plots/ece_vs_temperature.png)",
        "",
    ]
    if evaluation["shifted"]:
        severities = sorted({int(s) for by_sev in evaluation["shifted"].values() for s in by_sev})
        lines += [
            "## Dataset shift: ECE before -> after calibration (90% intervals), accuracy",
            "",
            "| corruption | " + " | ".join(f"severity {s}" for s in severities) + " |",
            "| --- |" + " --- |" * len(severities),
        ]
        for name, by_sev in evaluation["shifted"].items():
            cells = []
            for s in severities:
                entry = by_sev[str(s)]
                cells.append(
                    f"{_cell(entry['before']['ece'])} -> {_cell(entry['after']['ece'])}; "
                    f"acc {entry['after']['accuracy']['value']:.3f}"
                )
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += ["", "![ECE vs severity](plots/ece_vs_severity.png)", ""]
    ood = evaluation.get("ood")
    if ood is not None:
        lines += [
            "## Out-of-distribution detection",
            "",
            f"Predictive-entropy AUROC, {ood['n_in']} test images vs {ood['n_out']} `{ood['kind']}` images: "
            f"{ood['auroc_before']:.4f} before, {ood['auroc_after']:.4f} after calibration.",
            "",
        ]
    return "\n".join(lines)


def write_report(
    directory: Path,
    title: str,
    evaluation: dict,
    summary: dict[str, str],
    logits: np.ndarray,
    labels: np.ndarray,
    calibrator: Calibrator,
    n_bins: int = 15,
    rows: tuple[str, str] = ("Test split", "the test split"),
) -> Path:
    """Write ``report.md`` and ``plots/*.png`` into ``directory``; returns the report path. ``rows`` names the rows
    of ``evaluation["test"]`` and of ``logits``: the report's heading, and the reliability plot's words."""
    plots = directory / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    bins = {
        "before calibration": metrics.reliability_bins(softmax(logits), labels, n_bins),
        f"after {calibrator.method} scaling": metrics.reliability_bins(calibrator.transform(logits), labels, n_bins),
    }
    reliability_figure(bins, title=f"Reliability on {rows[1]}").savefig(plots / "reliability.png", dpi=110)
    plot_ece_vs_temperature(evaluation, plots / "ece_vs_temperature.png")
    if evaluation["shifted"]:
        plot_ece_vs_severity(evaluation, plots / "ece_vs_severity.png")
    path = directory / "report.md"
    path.write_text(markdown_report(title, evaluation, summary, rows[0]))
    return path
