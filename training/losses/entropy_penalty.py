"""Confidence penalty: cross-entropy minus a multiple of the predictive entropy."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._validation import Loss, check_real


class ConfidencePenaltyLoss(Loss):
    r"""Cross-entropy with a bonus for high-entropy (less confident) predictions.

    .. math::

        L = \frac{1}{N} \sum_i \Big[ -\log p_{i,y_i} - \beta\, H(p_i) \Big],
        \qquad H(p_i) = -\sum_{k=1}^{K} p_{ik} \log p_{ik}.

    The entropy is summed over classes, as in the paper; default ``beta = 0.1``. As :math:`0 \le H \le \log K`, the
    loss is at least :math:`-\beta \log K`. Pereyra, Tucker, Chorowski, Kaiser & Hinton 2017, "Regularizing Neural
    Networks by Penalizing Confident Output Distributions" (ICLR workshop).
    """

    name = "entropy_penalty"
    params = ("beta",)

    def __init__(self, beta: float = 0.1) -> None:
        super().__init__()
        self.beta = check_real(self.name, "beta", beta, low=0.0)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        log_p = F.log_softmax(logits, dim=1)
        ce = -log_p.gather(1, targets.unsqueeze(1)).squeeze(1)
        # p * log p with p from exp(log_p): a saturated class gives 0 * (finite) = 0.
        entropy = -(log_p.exp() * log_p).sum(dim=1)
        return (ce - self.beta * entropy).mean()
