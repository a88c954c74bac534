"""Losses by name: ``build_loss("focal", gamma=2.0)``; parameters and defaults are each class's constructor's."""

from __future__ import annotations

import inspect

from torch import nn

from .brier import BrierLoss
from .cross_entropy import CrossEntropyLoss, LabelSmoothingCrossEntropy
from .entropy_penalty import ConfidencePenaltyLoss
from .focal import FLSD53Loss, FocalLoss
from .margin import MarginLabelSmoothingLoss
from .mmce import MMCEWeightedLoss

_REGISTRY: dict[str, type[nn.Module]] = {
    "ce": CrossEntropyLoss,
    "label_smoothing": LabelSmoothingCrossEntropy,
    "focal": FocalLoss,
    "flsd53": FLSD53Loss,
    "mbls": MarginLabelSmoothingLoss,
    "brier": BrierLoss,
    "mmce": MMCEWeightedLoss,
    "entropy_penalty": ConfidencePenaltyLoss,
}


def available_losses() -> list[str]:
    """Names accepted by :func:`build_loss`, sorted alphabetically."""
    return sorted(_REGISTRY)


def loss_parameters(name: str) -> dict[str, object]:
    """The parameters :func:`build_loss` accepts for ``name``, with their defaults."""
    cls = _lookup(name)
    return {
        p.name: p.default
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def build_loss(name: str, **params: object) -> nn.Module:
    """The loss ``name`` with ``params``; ValueError for an unknown name or parameter, or a bad value."""
    accepted = loss_parameters(name)  # ValueError for an unknown name
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        accepted_txt = ", ".join(accepted) if accepted else "none"
        raise ValueError(
            f"loss {name!r}: unknown parameter(s) {', '.join(repr(u) for u in unknown)}; "
            f"accepted parameters: {accepted_txt}"
        )
    return _REGISTRY[name](**params)


def _lookup(name: str) -> type[nn.Module]:
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unknown loss {name!r}; known losses: {', '.join(available_losses())}")
    return _REGISTRY[name]
