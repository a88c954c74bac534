"""Brier loss (multi-class squared error on probabilities)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._validation import Loss


class BrierLoss(Loss):
    r"""Multi-class Brier score used as a training loss.

    .. math::

        L = \frac{1}{N} \sum_i \sum_{k=1}^{K} \big(p_{ik} - \mathbb{1}[y_i = k]\big)^2,
        \qquad p_i = \mathrm{softmax}(z_i).

    Lies in [0, 2]. Brier 1950, "Verification of Forecasts Expressed in Terms of Probability" (Monthly Weather Review);
    used as a calibration-aware training loss in Mukhoti et al. 2020, "Calibrating Deep Neural Networks using Focal
    Loss" (NeurIPS), with the same sum-over-classes, mean-over-batch reduction.
    """

    name = "brier"

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        probs = F.softmax(logits, dim=1)
        one_hot = F.one_hot(targets, num_classes=logits.shape[1]).to(probs.dtype)
        return ((probs - one_hot) ** 2).sum(dim=1).mean()
