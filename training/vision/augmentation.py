"""The standard CIFAR augmentation from torchvision's transforms, drawn per image.

He et al. 2016 (Sec. 4.2): "4 pixels are padded on each side, and a 32x32 crop is randomly sampled from the padded image
or its horizontal flip". The padding scales with the image (``image_size // 8``, at least 1): 4 pixels at 32, 1 at
digits' 8. The draws come from torch's generator, which the trainer seeds, so a run repeats.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from training.vision import require_torchvision


def padding_for(image_size: int) -> int:
    """Zero padding on each side before the random crop: ``image_size // 8``, at least 1."""
    return max(1, image_size // 8)


def cifar_augmentation(image_size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Batch (N, C, H, W) -> each image randomly cropped from its zero-padded copy and flipped with probability 1/2."""
    require_torchvision("the standard CIFAR augmentation")
    from torchvision.transforms import v2

    transform = v2.Compose([v2.RandomCrop(image_size, padding=padding_for(image_size)), v2.RandomHorizontalFlip()])

    def augment(batch: torch.Tensor) -> torch.Tensor:
        return torch.stack([transform(image) for image in batch])

    return augment
