"""torchvision's ImageNet classifiers as ``torchvision:<architecture>``, fine-tuned from a local weights file.

Families (each with the name of its classification layer): ResNet, ResNeXt and wide ResNet (He et al. 2016; Xie et
al. 2017; Zagoruyko & Komodakis 2016; ``fc``) and DenseNet (Huang et al. 2017; ``classifier``). Pretrained weights
are a local state-dict file, never a download: its classification layer (ImageNet's 1000 classes) is replaced by a
new one for the data set's classes; every other tensor must fit the architecture.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from training.vision import require_torchvision

#: Architecture-name prefix -> the attribute holding the classification layer.
HEADS = {"resnet": "fc", "resnext": "fc", "wide_resnet": "fc", "densenet": "classifier"}
#: Smallest image side each family runs on (DenseNet's three 2x2 transitions need 32).
MIN_IMAGE_SIZE = {"resnet": 8, "resnext": 8, "wide_resnet": 8, "densenet": 32}
#: The old DenseNet parameter names of torchvision's published files (``denselayer1.norm.1.weight``), mapped
#: to the module's (``denselayer1.norm1.weight``) as torchvision's own loader does.
_DENSENET_LEGACY_KEY = re.compile(r"(denselayer\d+\.(?:norm|relu|conv))\.([12])\.")
#: Batch-norm's batch counter, which files saved before PyTorch 0.4.1 lack; a missing one keeps the module's.
_BATCH_COUNTER = "num_batches_tracked"


def _family(architecture: str) -> str | None:
    return next((f for f in sorted(HEADS, key=len, reverse=True) if architecture.startswith(f)), None)


def supported_architectures() -> list[str]:
    """torchvision's classification models of the supported families, sorted."""
    tv = require_torchvision("torchvision:* models")
    return sorted(a for a in tv.models.list_models(module=tv.models) if _family(a))


def check_architecture(architecture: str) -> str:
    """``architecture``'s family; ``ValueError`` unless torchvision imports and supports it."""
    require_torchvision(f"torchvision:{architecture}")
    supported = supported_architectures()
    if architecture not in supported:
        raise ValueError(f"unknown torchvision architecture {architecture!r}; supported: {', '.join(supported)}")
    return str(_family(architecture))


def head_name(architecture: str) -> str:
    """The attribute of ``architecture``'s classification layer (``fc`` or ``classifier``)."""
    return HEADS[check_architecture(architecture)]


def build_torchvision_model(architecture: str, *, num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """torchvision's ``architecture``, ``num_classes`` outputs, randomly initialised (``weights=None``)."""
    family = check_architecture(architecture)
    if in_channels != 3:
        raise ValueError(f"torchvision:{architecture} takes 3 input channels, got {in_channels}")
    smallest = MIN_IMAGE_SIZE[family]
    if image_size < smallest:
        raise ValueError(
            f"torchvision:{architecture} needs images of at least {smallest}x{smallest}, got "
            f"{image_size}x{image_size}; set input_size (--input-size) to resize them inside the network"
        )
    tv = require_torchvision(f"torchvision:{architecture}")
    return tv.models.get_model(architecture, weights=None, num_classes=num_classes)


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a state-dict file, loaded without running code (``weights_only``); ``ValueError`` naming
    ``weights`` when it is not one."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(
            f"weights: {path} is not a file torch can load as plain tensors ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None
    if (
        not isinstance(state, Mapping)
        or not state
        or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())
    ):
        raise ValueError(
            f"weights: {path} holds a {type(state).__name__}, not a state dict (parameter names to "
            f"tensors, as torch.save(model.state_dict(), path) writes)"
        )
    return {_DENSENET_LEGACY_KEY.sub(r"\1\2.", k): v for k, v in state.items()}


def load_pretrained(net: nn.Module, architecture: str, path: Path) -> None:
    """Load every tensor of the state-dict file ``path`` but the classification layer into ``net``, a
    ``torchvision:<architecture>`` classifier; ``net``'s own classification layer is kept as initialised, and so
    are batch-norm batch counters the file lacks."""
    head = head_name(architecture) + "."
    backbone = {k: v for k, v in read_state_dict(path).items() if not k.startswith(head)}
    expected = {k: v for k, v in net.state_dict().items() if not k.startswith(head)}
    missing = sorted(k for k in set(expected) - set(backbone) if not k.endswith(_BATCH_COUNTER))
    unexpected = sorted(set(backbone) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"weights: {path} does not fit torchvision:{architecture}: {len(missing)} missing "
            f"tensors {missing[:3]}, {len(unexpected)} unexpected {unexpected[:3]}"
        )
    wrong = [
        f"{k} {tuple(v.shape)} (expected {tuple(expected[k].shape)})"
        for k, v in backbone.items()
        if v.shape != expected[k].shape
    ]
    if wrong:
        raise ValueError(
            f"weights: {path} does not fit torchvision:{architecture}: {len(wrong)} tensors of "
            f"another shape, e.g. {', '.join(wrong[:3])}"
        )
    net.load_state_dict(backbone, strict=False)


def freeze_all_but_head(net: nn.Module, architecture: str) -> int:
    """Stop the gradients of every parameter but the classification layer's; returns the trainable count."""
    head = head_name(architecture) + "."
    for name, parameter in net.named_parameters():
        parameter.requires_grad_(name.startswith(head))
    return sum(p.numel() for p in net.parameters() if p.requires_grad)
