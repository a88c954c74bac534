"""Wide residual networks of Zagoruyko & Komodakis (2016), "Wide Residual Networks".

WRN-d-k: a 3x3 stem with 16 channels, then three stages of ``(d - 4) / 6`` pre-activation basic blocks
(BN-ReLU-conv3x3-dropout-BN-ReLU-conv3x3) with widths ``16k``, ``32k`` and ``64k`` (strides 1, 2, 2), a final BN-ReLU,
global average pooling and a linear classifier.  Shape-changing shortcuts are 1x1 convolutions applied to the
pre-activated input, as in the authors' code. Registered as ``wrn16_4`` (default) and ``wrn28_10``.
"""

from __future__ import annotations

import torch
from torch import nn

from training.models.initialization import init_weights


class WideBasicBlock(nn.Module):
    """Pre-activation basic block with optional dropout between the two convolutions."""

    def __init__(self, in_planes: int, planes: int, stride: int, dropout: float) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.relu = nn.ReLU(inplace=False)
        self.equal_shapes = stride == 1 and in_planes == planes
        self.shortcut = (
            nn.Identity() if self.equal_shapes else nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.relu(self.bn1(x))
        out = self.conv1(pre)
        out = self.conv2(self.dropout(self.relu(self.bn2(out))))
        residual = x if self.equal_shapes else self.shortcut(pre)
        return out + residual


class WideResNet(nn.Module):
    """WRN-``depth``-``widen_factor`` for small images."""

    def __init__(
        self,
        depth: int = 16,
        widen_factor: int = 4,
        dropout: float = 0.0,
        num_classes: int = 10,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        if depth < 10 or (depth - 4) % 6 != 0:
            raise ValueError(f"depth must be 6n + 4 with n >= 1 (16, 22, 28, 40, ...), got {depth}")
        if widen_factor < 1:
            raise ValueError(f"widen_factor must be >= 1, got {widen_factor}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        n = (depth - 4) // 6
        widths = [16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        self.stem = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        stages = []
        in_planes = 16
        for index, width in enumerate(widths):
            blocks = []
            for block_index in range(n):
                stride = 2 if index > 0 and block_index == 0 else 1
                blocks.append(WideBasicBlock(in_planes, width, stride, dropout))
                in_planes = width
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.BatchNorm2d(in_planes), nn.ReLU(inplace=True))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.head(self.stages(self.stem(x)))
        return self.fc(torch.flatten(self.pool(out), 1))
