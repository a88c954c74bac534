"""LeNet-5 of LeCun et al. (1998), "Gradient-based learning applied to document recognition".

Layout: conv 5x5 (6) -> ReLU -> max-pool 2 -> conv 5x5 (16) -> ReLU -> max-pool 2 -> fc 120 -> ReLU -> fc 84 -> ReLU ->
fc ``num_classes``.  ReLU replaces the original scaled tanh and max-pooling replaces the trainable sub-sampling.

The fully connected head fixes the input resolution: the model only accepts ``image_size x image_size`` inputs.  For
``image_size >= 32`` the convolutions are unpadded (the classic 32 -> 28 -> 14 -> 10 -> 5 geometry); below 32 they use
``padding=2`` so that tiny inputs such as the 8x8 sklearn digits survive (8 -> 8 -> 4 -> 4 -> 2).
"""

from __future__ import annotations

import torch
from torch import nn

from training.models.initialization import init_weights

KERNEL_SIZE = 5


class LeNet5(nn.Module):
    """LeNet-5 with ReLU activations and max-pooling, sized for ``image_size`` inputs."""

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 32,
        padding: int | None = None,
    ) -> None:
        super().__init__()
        if padding is None:
            padding = 0 if image_size >= 32 else 2
        side = image_size
        for _ in range(2):  # the side after each conv + pool stage
            side = (side + 2 * padding - KERNEL_SIZE + 1) // 2
        if side < 1:
            raise ValueError(
                f"image_size={image_size} is too small for LeNet-5 with padding={padding}: "
                "the feature map vanishes after the second pooling stage"
            )
        self.image_size = image_size
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, KERNEL_SIZE, padding=padding),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, KERNEL_SIZE, padding=padding),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * side * side, 120),
            nn.ReLU(inplace=True),
            nn.Linear(120, 84),
            nn.ReLU(inplace=True),
            nn.Linear(84, num_classes),
        )
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
