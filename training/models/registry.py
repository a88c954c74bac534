"""Name -> constructor registry for the image classifiers in :mod:`training.models`.

Every model maps a float tensor ``(N, in_channels, H, W)`` to logits ``(N, num_classes)`` (no softmax). Fully
convolutional models (everything except ``lenet5``) end in global average pooling and accept any ``H, W >= 8``;
``lenet5`` requires ``H == W == image_size``.

``torchvision:<architecture>`` names torchvision's ImageNet classifiers (``training.vision.models``), which
need the optional ``[vision]`` extra; this module never imports torchvision itself.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from functools import partial
from typing import SupportsIndex

from torch import nn

from training.models.densenet import DenseNetBC
from training.models.lenet import LeNet5
from training.models.resnet import Bottleneck, CifarResNet, cifar_resnet
from training.models.wide_resnet import WideResNet

MIN_IMAGE_SIZE = 8
#: Prefix of the models that ``training.vision.models`` builds from torchvision.
TORCHVISION_PREFIX = "torchvision:"

#: name -> constructor of ``(num_classes=, in_channels=)``; ``lenet5`` also takes ``image_size=``.
MODELS: dict[str, Callable[..., nn.Module]] = {
    "lenet5": LeNet5,
    "resnet20": partial(cifar_resnet, 20),
    "resnet56": partial(cifar_resnet, 56),
    "resnet110": partial(cifar_resnet, 110),
    "resnet50": partial(CifarResNet, Bottleneck, [3, 4, 6, 3], [64, 128, 256, 512]),
    "densenet_bc": partial(DenseNetBC, depth=40, growth_rate=12, compression=0.5),
    "wrn16_4": partial(WideResNet, depth=16, widen_factor=4),
    "wrn28_10": partial(WideResNet, depth=28, widen_factor=10),
}


def available_models() -> list[str]:
    """Registered model names, sorted (``torchvision:*`` models come on top of these with the extra)."""
    return sorted(MODELS)


def is_torchvision(name: str) -> bool:
    """Whether ``name`` is a ``torchvision:<architecture>`` model."""
    return name.startswith(TORCHVISION_PREFIX)


def check_model_name(name: str) -> None:
    """``ValueError`` unless ``name`` is registered or a torchvision architecture built here (``[vision]`` extra)."""
    if is_torchvision(name):
        from training.vision.models import check_architecture

        check_architecture(name.removeprefix(TORCHVISION_PREFIX))
    elif name not in MODELS:
        raise ValueError(
            f"unknown {name!r}; known: {', '.join(available_models())}, or "
            f"{TORCHVISION_PREFIX}<architecture> with the [vision] extra"
        )


def _as_int(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool {value!r}")
    try:
        if not isinstance(value, SupportsIndex):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}") from None


def build_model(name: str, *, num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """Build the model ``name`` for square ``image_size`` inputs; ``TypeError`` for a size that is not an integer."""
    if name not in MODELS and not is_torchvision(name):
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(available_models())}")
    num_classes = _as_int("num_classes", num_classes)
    in_channels = _as_int("in_channels", in_channels)
    image_size = _as_int("image_size", image_size)
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if in_channels < 1:
        raise ValueError(f"in_channels must be >= 1, got {in_channels}")
    if image_size < MIN_IMAGE_SIZE:
        raise ValueError(f"image_size must be >= {MIN_IMAGE_SIZE}, got {image_size}")
    if is_torchvision(name):
        from training.vision.models import build_torchvision_model

        return build_torchvision_model(
            name.removeprefix(TORCHVISION_PREFIX),
            num_classes=num_classes,
            in_channels=in_channels,
            image_size=image_size,
        )
    sized = {"image_size": image_size} if name == "lenet5" else {}
    return MODELS[name](num_classes=num_classes, in_channels=in_channels, **sized)
