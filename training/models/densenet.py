"""DenseNet-BC of Huang et al. (2017), "Densely Connected Convolutional Networks".

CIFAR variant: a 3x3 stem with ``2 * growth_rate`` channels, three dense blocks of ``(depth - 4) / 6`` bottleneck layers
(BN-ReLU-conv1x1(4k)-BN-ReLU-conv3x3(k)), and transition layers (BN-ReLU-conv1x1 with ``compression`` - average-pool 2)
between blocks.  The default is DenseNet-BC with depth 40, growth rate 12 and compression 0.5.  The two transitions
halve the resolution (32 -> 16 -> 8, 8 -> 4 -> 2) and the head uses ``nn.AdaptiveAvgPool2d(1)``, so any input of at
least 8x8 works.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from training.models.initialization import init_weights


class DenseLayer(nn.Module):
    """Bottleneck layer producing ``growth_rate`` new feature maps, concatenated to its input."""

    def __init__(self, in_planes: int, growth_rate: int) -> None:
        super().__init__()
        inner = 4 * growth_rate
        self.body = nn.Sequential(
            nn.BatchNorm2d(in_planes),
            nn.ReLU(inplace=True),
            nn.Conv2d(in_planes, inner, 1, bias=False),
            nn.BatchNorm2d(inner),
            nn.ReLU(inplace=True),
            nn.Conv2d(inner, growth_rate, 3, padding=1, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.body(x)], dim=1)


class Transition(nn.Sequential):
    """BN-ReLU-conv1x1 compression followed by 2x2 average pooling."""

    def __init__(self, in_planes: int, out_planes: int) -> None:
        super().__init__(
            nn.BatchNorm2d(in_planes),
            nn.ReLU(inplace=True),
            nn.Conv2d(in_planes, out_planes, 1, bias=False),
            nn.AvgPool2d(2),
        )


class DenseNetBC(nn.Module):
    """DenseNet-BC for small images (three dense blocks, two transitions, GAP, fc)."""

    def __init__(
        self,
        depth: int = 40,
        growth_rate: int = 12,
        compression: float = 0.5,
        num_classes: int = 10,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        if depth < 10 or (depth - 4) % 6 != 0:
            raise ValueError(f"depth must be 6n + 4 with n >= 1 (40, 100, 190, ...), got {depth}")
        if not 0.0 < compression <= 1.0:
            raise ValueError(f"compression must be in (0, 1], got {compression}")
        layers_per_block = (depth - 4) // 6
        planes = 2 * growth_rate
        modules: list[nn.Module] = [nn.Conv2d(in_channels, planes, 3, padding=1, bias=False)]
        for block_index in range(3):
            for _ in range(layers_per_block):
                modules.append(DenseLayer(planes, growth_rate))
                planes += growth_rate
            if block_index < 2:
                out_planes = int(math.floor(planes * compression))
                modules.append(Transition(planes, out_planes))
                planes = out_planes
        modules += [nn.BatchNorm2d(planes), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*modules)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(planes, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.pool(self.features(x))
        return self.fc(torch.flatten(out, 1))
