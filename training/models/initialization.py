"""Weight initialisation shared by every model in :mod:`training.models`.

Convolutions use He et al. (2015), "Delving Deep into Rectifiers" (Kaiming normal, fan-out, ReLU gain); batch-norm
layers start as the identity (weight 1, bias 0); linear layers keep PyTorch's default Kaiming-uniform weights with a
zero bias.
"""

from __future__ import annotations

from torch import nn


def init_weights(model: nn.Module) -> None:
    """Initialise ``model`` in place, module by module."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            if module.bias is not None:
                nn.init.zeros_(module.bias)
