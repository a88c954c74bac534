"""Reliability diagrams with their confidence histograms (matplotlib, imported on first use).

The diagram of Guo et al. 2017 (Fig. 1): per bin the accuracy as a bar against the diagonal of
perfect calibration, the gap to the bin's mean confidence shaded, and underneath the histogram of
confidences (the bin counts), which shows how much each bar is worth.
"""

from __future__ import annotations

import io
from collections.abc import Mapping

import numpy as np

from calibkit.binning import Reliability


def reliability_figure(panels: Mapping[str, Reliability], title: str | None = None):
    """A matplotlib Figure of reliability diagrams side by side, one column per panel (reliability data by panel
    title, e.g. ``{"before": ..., "after": ...}``): the reliability diagram on top, its confidence histogram below.

    References:
        Guo et al. 2017, "On Calibration of Modern Neural Networks", Fig. 1.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.8 * len(panels), 6.0), layout="constrained")
    axes = fig.subplots(2, len(panels), squeeze=False, height_ratios=[3, 1], sharex=True)
    for col, (name, rel) in enumerate(panels.items()):
        _draw(axes[0, col], axes[1, col], rel, name)
    if title:
        fig.suptitle(title)
    return fig


def _draw(ax, ax_hist, rel: Reliability, name: str) -> None:
    width = rel.upper - rel.lower
    filled = rel.count > 0
    n = int(rel.count.sum())
    gap = np.abs(rel.accuracy - rel.mean_confidence)
    ece = float(np.nansum(rel.count * gap) / n) if n else float("nan")
    ax.bar(
        rel.lower[filled],
        rel.accuracy[filled],
        width=width[filled],
        align="edge",
        color="#3b75af",
        edgecolor="black",
        linewidth=0.5,
        label="accuracy",
    )
    ax.bar(
        rel.lower[filled],
        (rel.mean_confidence - rel.accuracy)[filled],
        bottom=rel.accuracy[filled],
        width=width[filled],
        align="edge",
        color="#e36b5c",
        alpha=0.45,
        edgecolor="#c23b2b",
        hatch="//",
        linewidth=0.5,
        label="gap to confidence",
    )
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1, label="perfect calibration")
    title = f"{name}: ECE {ece:.4f}, n = {n}" if n else f"{name}: no labels yet"
    ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy", title=title)
    ax.legend(loc="upper left", fontsize=8)
    ax_hist.bar(
        rel.lower, rel.count / max(n, 1), width=width, align="edge", color="#7f7f7f", edgecolor="black", linewidth=0.5
    )
    ax_hist.set(xlim=(0, 1), xlabel="confidence", ylabel="fraction")


def figure_png(fig) -> bytes:
    """The PNG bytes of a matplotlib Figure."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()
