"""The network a run trains and exports: input adapter, normalisation and classifier in one ``nn.Sequential``.

The exported graph takes raw [0, 1] pixels of the data set's size; all else is inside it, so clients never need the
training statistics or the network's resolution: the per-channel normalisation (fitted on the training split, or
ImageNet's statistics for ``torchvision:*`` models, whose pretrained weights expect them), the channel of grey images
repeated to the three that ``torchvision:*`` models take, and with ``input_size`` the bilinear resize to the side
length the network was trained at.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from training.models.registry import build_model, is_torchvision

#: The ImageNet statistics that torchvision's pretrained weights were trained with.
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
#: Channels every torchvision classifier takes.
TORCHVISION_CHANNELS = 3


class Normalize(nn.Module):
    """(x - mean) / std per channel, with the statistics stored as buffers (exported with the model)."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, mean: np.ndarray, std: np.ndarray):
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class InputAdapter(nn.Module):
    """One input channel repeated to ``channels``, then a bilinear resize to ``size`` x ``size`` (each if given)."""

    def __init__(self, channels: int | None = None, size: int | None = None):
        super().__init__()
        self.channels, self.size = channels, size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels is not None:
            x = x.expand(-1, self.channels, -1, -1)
        if self.size is not None:
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return x

    def extra_repr(self) -> str:
        return f"channels={self.channels}, size={self.size}"


@dataclass(frozen=True)
class ModelSpec:
    """What rebuilds the network from a checkpoint: ``image_size`` is the data's (and the exported input's) side
    length, ``input_size`` the classifier's (``None``: the same)."""

    architecture: str
    num_classes: int
    in_channels: int
    image_size: int
    class_names: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    input_size: int | None = None

    @classmethod
    def for_data(cls, architecture: str, splits, input_size: int | None = None) -> ModelSpec:
        """The spec for ``splits`` (a ``training.data.DataSplits``): normalisation statistics of its training split,
        or ImageNet's for a ``torchvision:*`` architecture."""
        mean: tuple[float, ...]
        std: tuple[float, ...]
        if is_torchvision(architecture):
            mean, std = IMAGENET_MEAN, IMAGENET_STD
        else:
            x = splits.train.x
            mean = tuple(float(v) for v in x.mean(axis=(0, 2, 3)))
            std = tuple(float(max(v, 1e-3)) for v in x.std(axis=(0, 2, 3)))
        return cls(
            architecture=architecture,
            num_classes=splits.num_classes,
            in_channels=splits.in_channels,
            image_size=splits.image_size,
            class_names=splits.class_names,
            mean=mean,
            std=std,
            input_size=None if input_size == splits.image_size else input_size,
        )

    @property
    def network_channels(self) -> int:
        """Channels the classifier takes: three for torchvision's, the data's otherwise."""
        return TORCHVISION_CHANNELS if is_torchvision(self.architecture) else self.in_channels

    def build(self) -> nn.Sequential:
        """``[InputAdapter,] Normalize, classifier``; the adapter only where channels or size change."""
        channels = self.network_channels
        repeat = channels if channels != self.in_channels else None
        if repeat is not None and self.in_channels != 1:
            raise ValueError(
                f"{self.architecture} takes {channels} channels; images with {self.in_channels} cannot "
                f"be adapted (only grey images are repeated to {channels})"
            )
        net = build_model(
            self.architecture,
            num_classes=self.num_classes,
            in_channels=channels,
            image_size=self.input_size or self.image_size,
        )
        layers: list[nn.Module] = [Normalize(np.array(self.mean), np.array(self.std)), net]
        if repeat is not None or self.input_size is not None:
            layers.insert(0, InputAdapter(repeat, self.input_size))
        return nn.Sequential(*layers)


def classifier_of(model: nn.Sequential) -> nn.Module:
    """The classifier inside a network built by ``ModelSpec.build`` (its last layer)."""
    return model[-1]
