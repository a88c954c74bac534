"""calibkit.plotting: the reliability diagram renders the bins it is given."""

import numpy as np

from calibkit import metrics
from calibkit.plotting import figure_png, reliability_figure
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax


def test_reliability_figure_has_a_diagram_and_histogram_per_panel():
    z, y = calibrated_logits(2000, seed=0)
    before = metrics.reliability_bins(softmax(2.5 * z), y)
    after = metrics.reliability_bins(softmax(z), y)
    fig = reliability_figure({"before": before, "after": after}, title="test")
    diagram, histogram = fig.axes[0], fig.axes[2]
    assert diagram.get_title().startswith(f"before: ECE {metrics.ece(softmax(2.5 * z), y):.4f}, n = 2000")
    heights = [bar.get_height() for bar in histogram.patches]
    np.testing.assert_allclose(heights, before.count / 2000)
    png = figure_png(fig)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_empty_bins_are_not_drawn():
    rel = metrics.reliability_bins(np.array([[0.95, 0.05], [0.9, 0.1]]), np.array([0, 1]))
    fig = reliability_figure({"only": rel})
    accuracy_bars = fig.axes[0].containers[0]
    assert len(accuracy_bars) == int((rel.count > 0).sum()) == 2  # (.867, .933] and (.933, 1]
