"""Name-based construction of the training losses.

``build_loss("focal", gamma=2.0)`` returns a configured :class:`torch.nn.Module`;
``available_losses()`` lists the accepted names. Parameter names and defaults are
those of each loss class's constructor (the classes validate the values).
"""

from __future__ import annotations

import inspect

from torch import nn

from .brier import BrierLoss
from .cross_entropy import CrossEntropyLoss, LabelSmoothingCrossEntropy
from .entropy_penalty import ConfidencePenaltyLoss
from .focal import FLSD53Loss, FocalLoss
from .margin import MarginLabelSmoothingLoss
from .mmce import MMCEWeightedLoss

# name -> class; accepted parameters (and their defaults) come from the constructor:
#   ce               -
#   label_smoothing  smoothing=0.05
#   focal            gamma=3.0
#   flsd53           -
#   mbls             margin=10.0, alpha=0.1, class_reduction="sum"
#   brier            -
#   mmce             lam=2.0, kernel_width=0.4
#   entropy_penalty  beta=0.1
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
    """Build the loss registered as ``name`` with the given hyper-parameters.

    Raises :class:`ValueError` for an unknown name (listing the known ones), for a
    parameter the loss does not accept (listing the accepted ones), and for an
    invalid parameter value (naming the parameter and the problem).
    """
    cls = _lookup(name)
    accepted = loss_parameters(name)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        accepted_txt = ", ".join(accepted) if accepted else "none"
        raise ValueError(
            f"loss {name!r}: unknown parameter(s) {', '.join(repr(u) for u in unknown)}; "
            f"accepted parameters: {accepted_txt}"
        )
    return cls(**params)


def _lookup(name: str) -> type[nn.Module]:
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unknown loss {name!r}; known losses: {', '.join(available_losses())}")
    return _REGISTRY[name]
