"""Confidence penalty: cross-entropy minus a multiple of the predictive entropy."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._validation import check_inputs, check_real


class ConfidencePenaltyLoss(nn.Module):
    r"""Cross-entropy with a bonus for high-entropy (less confident) predictions.

    .. math::

        L = \frac{1}{N} \sum_i \Big[ -\log p_{i,y_i} - \beta\, H(p_i) \Big],
        \qquad H(p_i) = -\sum_{k=1}^{K} p_{ik} \log p_{ik}.

    The entropy is summed over classes (not averaged), as in the paper. Default
    ``beta = 0.1``. Since :math:`0 \le H \le \log K` the loss is bounded below by
    :math:`-\beta \log K`. Pereyra, Tucker, Chorowski, Kaiser & Hinton 2017,
    "Regularizing Neural Networks by Penalizing Confident Output Distributions"
    (ICLR workshop).
    """

    name = "entropy_penalty"

    def __init__(self, beta: float = 0.1) -> None:
        super().__init__()
        self.beta = check_real(self.name, "beta", beta, low=0.0)

    def extra_repr(self) -> str:
        return f"beta={self.beta}"

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        targets = check_inputs(logits, targets, self.name)
        log_p = F.log_softmax(logits, dim=1)
        ce = -log_p.gather(1, targets.unsqueeze(1)).squeeze(1)
        # p * log p with p from exp(log_p): a saturated class gives 0 * (finite) = 0.
        entropy = -(log_p.exp() * log_p).sum(dim=1)
        return (ce - self.beta * entropy).mean()
