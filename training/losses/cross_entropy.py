"""Cross-entropy and label-smoothed cross-entropy."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._validation import Loss, check_real


class CrossEntropyLoss(Loss):
    r"""Plain (negative log-likelihood) cross-entropy, averaged over the batch.

    .. math::

        L = -\frac{1}{N} \sum_{i=1}^{N} \log p_{i, y_i},
        \qquad p_i = \mathrm{softmax}(z_i).

    The usual baseline; known to produce over-confident networks (Guo et al. 2017, "On Calibration of Modern Neural
    Networks", ICML).
    """

    name = "ce"

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets, reduction="mean")


class LabelSmoothingCrossEntropy(Loss):
    r"""Cross-entropy against uniformly smoothed targets.

    With smoothing :math:`\varepsilon \in [0, 1)` the target is :math:`t_k = (1-\varepsilon)\,\mathbb{1}[k = y] +
    \varepsilon / K` (the uniform mass spread over *all* K classes, the true one included), and

    .. math::

        L = -\frac{1}{N} \sum_i \sum_k t_{ik} \log p_{ik}
          = \frac{1}{N} \sum_i \Big[ -(1-\varepsilon) \log p_{i,y_i}
            - \frac{\varepsilon}{K} \sum_k \log p_{ik} \Big].

    ``smoothing = 0`` recovers :class:`CrossEntropyLoss`.

    Sources: Szegedy et al. 2016, "Rethinking the Inception Architecture for Computer Vision" (CVPR); Müller, Kornblith
    & Hinton 2019, "When Does Label Smoothing Help?" (NeurIPS), which studies its calibration effect.
    """

    name = "label_smoothing"
    params = ("smoothing",)

    def __init__(self, smoothing: float = 0.05) -> None:
        super().__init__()
        self.smoothing = check_real(self.name, "smoothing", smoothing, low=0.0, high=1.0, high_inclusive=False)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        num_classes = logits.shape[1]
        log_p = F.log_softmax(logits, dim=1)
        nll_true = -log_p.gather(1, targets.unsqueeze(1)).squeeze(1)
        nll_uniform = -log_p.sum(dim=1) / num_classes
        eps = self.smoothing
        return ((1.0 - eps) * nll_true + eps * nll_uniform).mean()
