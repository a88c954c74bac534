"""Cross-check ECE and MCE against torchmetrics' multiclass_calibration_error.

torchmetrics bins [lo, hi) and calibkit (lo, hi] (Guo et al. 2017), so inputs are drawn away from
bin edges, where both definitions agree; there the two must match to 1e-6.
"""

import numpy as np
import pytest
import torch
from torchmetrics.functional.classification import multiclass_calibration_error

from calibkit import metrics


def _away_from_edges(n, k, concentration, seed, n_bins=15):
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(k, concentration), size=4 * n)
    confidence = probs.max(axis=1)
    distance = np.abs(confidence * n_bins - np.round(confidence * n_bins)) / n_bins
    probs = probs[distance > 1e-4][:n]
    assert len(probs) == n
    labels = rng.integers(0, k, size=n)
    # make some predictions right so accuracy varies across bins
    right = rng.random(n) < probs.max(axis=1)
    labels[right] = probs[right].argmax(axis=1)
    return probs, labels


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k, concentration", [(2, 1.0), (3, 0.5), (10, 0.3), (10, 2.0)])
@pytest.mark.parametrize("n_bins", [15, 10])
def test_matches_torchmetrics(seed, k, concentration, n_bins):
    probs, labels = _away_from_edges(2000, k, concentration, seed, n_bins)
    preds, target = torch.from_numpy(probs), torch.from_numpy(labels)
    for norm, ours in (("l1", metrics.ece), ("max", metrics.mce)):
        reference = multiclass_calibration_error(preds, target, num_classes=k, n_bins=n_bins, norm=norm).item()
        assert ours(probs, labels, n_bins=n_bins) == pytest.approx(reference, abs=1e-6), norm
