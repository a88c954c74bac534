"""Calibration-aware training losses of (logits (N, K), targets (N,)), by name (:func:`build_loss`) or class; each
class docstring states its formula and source paper."""

from .brier import BrierLoss
from .cross_entropy import CrossEntropyLoss, LabelSmoothingCrossEntropy
from .entropy_penalty import ConfidencePenaltyLoss
from .focal import FLSD53Loss, FocalLoss, SampleDependentFocalLoss
from .margin import MarginLabelSmoothingLoss
from .mmce import MMCEWeightedLoss, mmce_weighted
from .registry import available_losses, build_loss, loss_parameters

__all__ = [
    "BrierLoss",
    "ConfidencePenaltyLoss",
    "CrossEntropyLoss",
    "FLSD53Loss",
    "FocalLoss",
    "LabelSmoothingCrossEntropy",
    "MMCEWeightedLoss",
    "MarginLabelSmoothingLoss",
    "SampleDependentFocalLoss",
    "available_losses",
    "build_loss",
    "loss_parameters",
    "mmce_weighted",
]
