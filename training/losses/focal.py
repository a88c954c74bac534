"""Focal loss with a fixed gamma and the sample-dependent FLSD-53 variant."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._validation import Loss, check_real

# Lower bound on (1 - p_y) before it is raised to the power gamma. It only bites when p_y rounds to 1, where the loss
# term is ~0 anyway, and keeps the backward pass of (1 - p_y) ** gamma finite for 0 < gamma < 1.
_MIN_ONE_MINUS_P = 1e-12


def _focal_terms(logits: torch.Tensor, targets: torch.Tensor, gamma: torch.Tensor | float) -> torch.Tensor:
    """Per-sample focal terms ``-(1 - p_y)^gamma * log p_y`` computed from log_softmax."""
    log_p_y = F.log_softmax(logits, dim=1).gather(1, targets.unsqueeze(1)).squeeze(1)
    # 1 - p_y = -expm1(log p_y): accurate even when p_y is close to 1.
    one_minus_p = (-torch.expm1(log_p_y)).clamp_min(_MIN_ONE_MINUS_P)
    return -(one_minus_p**gamma) * log_p_y


class FocalLoss(Loss):
    r"""Focal loss with a fixed focusing parameter (no class weighting).

    .. math::

        L = -\frac{1}{N} \sum_i (1 - p_{i,y_i})^{\gamma} \log p_{i,y_i}.

    ``gamma = 0`` recovers cross-entropy. Lin et al. 2017, "Focal Loss for Dense Object Detection" (ICCV); its
    calibration effect is studied in Mukhoti et al. 2020, "Calibrating Deep Neural Networks using Focal Loss" (NeurIPS),
    whose best fixed value on CIFAR is gamma = 3 (the default here). The alpha class-balancing factor of Lin et al. is
    deliberately omitted.

    Computed through ``log_softmax`` (and ``expm1`` for ``1 - p_y``) so that it is stable for large logits.
    """

    name = "focal"
    params = ("gamma",)

    def __init__(self, gamma: float = 3.0) -> None:
        super().__init__()
        self.gamma = check_real(self.name, "gamma", gamma, low=0.0)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return _focal_terms(logits, targets, self.gamma).mean()


class SampleDependentFocalLoss(Loss):
    r"""Focal loss whose gamma depends on the sample's true-class probability.

    .. math::

        \gamma_i = \begin{cases} \gamma_{\text{low}} & p_{i,y_i} < \tau \\
                                 \gamma_{\text{high}} & \text{otherwise} \end{cases},
        \qquad
        L = -\frac{1}{N} \sum_i (1 - p_{i,y_i})^{\gamma_i} \log p_{i,y_i}.

    :math:`\gamma_i` is chosen on a detached :math:`p_{i,y_i}`: no gradient flows through the choice. Mukhoti et al.
    2020, "Calibrating Deep Neural Networks using Focal Loss" (NeurIPS), Sec. 5 ("FLSD"); :class:`FLSD53Loss` is the
    paper's setting.
    """

    name = "focal_sample_dependent"
    params = ("threshold", "gamma_low", "gamma_high")

    def __init__(self, threshold: float = 0.2, gamma_low: float = 5.0, gamma_high: float = 3.0) -> None:
        super().__init__()
        self.threshold = check_real(self.name, "threshold", threshold, low=0.0, high=1.0)
        self.gamma_low = check_real(self.name, "gamma_low", gamma_low, low=0.0)
        self.gamma_high = check_real(self.name, "gamma_high", gamma_high, low=0.0)

    def gammas(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per-sample gamma (no gradient); ``targets`` must already be validated int64."""
        with torch.no_grad():
            p_y = F.softmax(logits.detach(), dim=1).gather(1, targets.unsqueeze(1)).squeeze(1)
            return torch.full_like(p_y, self.gamma_high).masked_fill(p_y < self.threshold, self.gamma_low)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return _focal_terms(logits, targets, self.gammas(logits, targets)).mean()


class FLSD53Loss(SampleDependentFocalLoss):
    r"""FLSD-53: focal loss with gamma = 5 if :math:`p_{y} < 0.2`, else gamma = 3.

    .. math::

        L = -\frac{1}{N} \sum_i (1 - p_{i,y_i})^{\gamma_i} \log p_{i,y_i},
        \qquad \gamma_i = 5 \text{ if } p_{i,y_i} < 0.2 \text{ else } 3,

    with :math:`\gamma_i` chosen without gradient. Mukhoti et al. 2020, "Calibrating Deep Neural Networks using Focal
    Loss" (NeurIPS); the official code uses gamma 5 for p_y in [0, 0.2) and gamma 3 for p_y >= 0.2.
    """

    name = "flsd53"

    def __init__(self) -> None:
        super().__init__(threshold=0.2, gamma_low=5.0, gamma_high=3.0)
