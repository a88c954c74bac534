"""Residual networks of He et al. (2016), "Deep Residual Learning for Image Recognition".

* ``resnet20`` / ``resnet56`` / ``resnet110``: the CIFAR networks of Section 4.2 (3 stages of 16/32/64 channels,
  ``6n + 2`` layers, basic blocks). Shortcuts that change shape use option B (1x1 convolution + batch norm) rather
  than option A (zero padding): it exports cleanly to ONNX and adds only ~2.8k parameters to ResNet-20.
* ``resnet50``: the ImageNet bottleneck ResNet-50 (stages [3, 4, 6, 3], expansion 4, widths 64/128/256/512) adapted
  to CIFAR with a 3x3 stride-1 stem and no max-pool, as used by Mukhoti et al. (2020), "Calibrating Deep Neural
  Networks using Focal Loss".

Both end in global average pooling (``nn.AdaptiveAvgPool2d(1)``), so any input of at least 8x8 works.
"""

from __future__ import annotations

import torch
from torch import nn

from training.models.initialization import init_weights


def _projection(in_planes: int, out_planes: int, stride: int) -> nn.Module:
    """Option-B shortcut: identity when shapes match, else 1x1 conv + BN."""
    if stride == 1 and in_planes == out_planes:
        return nn.Identity()
    return nn.Sequential(
        nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False),
        nn.BatchNorm2d(out_planes),
    )


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (He et al. 2016, Fig. 2)."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _projection(in_planes, planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 -> 1x1 expand (x4) residual block (He et al. 2016, Fig. 5)."""

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out_planes = planes * self.expansion
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_planes, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _projection(in_planes, out_planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet for small images: 3x3 stride-1 stem, no max-pool, strided stages, GAP, fc."""

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        blocks_per_stage: list[int],
        widths: list[int],
        num_classes: int = 10,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        if len(blocks_per_stage) != len(widths):
            raise ValueError(
                f"blocks_per_stage ({len(blocks_per_stage)} stages) and widths "
                f"({len(widths)} stages) must have the same length"
            )
        stem_width = widths[0]
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, stem_width, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(stem_width),
            nn.ReLU(inplace=True),
        )
        stages = []
        in_planes = stem_width
        for index, (count, width) in enumerate(zip(blocks_per_stage, widths)):
            layers = []
            for block_index in range(count):
                stride = 2 if index > 0 and block_index == 0 else 1
                layers.append(block(in_planes, width, stride))
                in_planes = width * block.expansion
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.stages(self.stem(x))
        return self.fc(torch.flatten(self.pool(out), 1))


def cifar_resnet(depth: int, num_classes: int = 10, in_channels: int = 3) -> CifarResNet:
    """The ``6n + 2``-layer CIFAR ResNet of He et al. (2016), Section 4.2."""
    if depth < 8 or (depth - 2) % 6 != 0:
        raise ValueError(f"depth must be 6n + 2 with n >= 1 (20, 32, 44, 56, 110, ...), got {depth}")
    n = (depth - 2) // 6
    return CifarResNet(BasicBlock, [n, n, n], [16, 32, 64], num_classes, in_channels)
