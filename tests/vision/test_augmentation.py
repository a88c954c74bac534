"""The standard CIFAR augmentation (He et al. 2016): each image a random crop of its zero-padded copy, flipped
horizontally half the time, drawn per image from the seeded generator; and ``augment`` in training."""

import numpy as np
import pytest
import torch

from training import pipeline
from training.config import load_config
from training.trainer import train
from training.vision.augmentation import cifar_augmentation, padding_for


def _placements(image: np.ndarray, pad: int):
    """Every (dy, dx, flipped) crop of the zero-padded ``image`` (C, H, W) and its mirror."""
    size = image.shape[-1]
    padded = np.pad(image, ((0, 0), (pad, pad), (pad, pad)))
    for flipped in (False, True):
        source = padded[..., ::-1] if flipped else padded
        for dy in range(2 * pad + 1):
            for dx in range(2 * pad + 1):
                yield (dy, dx, flipped), source[:, dy : dy + size, dx : dx + size]


@pytest.mark.parametrize("size, pad", [(32, 4), (8, 1)])
def test_each_image_is_a_crop_of_its_padded_copy_or_its_mirror_drawn_per_image(size, pad):
    assert padding_for(size) == pad
    rng = np.random.default_rng(0)
    batch = torch.from_numpy(rng.random((64, 3, size, size), dtype=np.float32))
    torch.manual_seed(0)
    out = cifar_augmentation(size)(batch)
    assert out.shape == batch.shape and out.dtype == batch.dtype
    drawn = []
    for original, augmented in zip(batch.numpy(), out.numpy()):
        matches = [p for p, crop in _placements(original, pad) if np.array_equal(crop, augmented)]
        assert len(matches) == 1
        drawn.append(matches[0])
    assert len(set(drawn)) > 10  # not one crop for the whole batch
    assert 16 < sum(flipped for _, _, flipped in drawn) < 48


def test_the_draws_follow_the_seed():
    batch = torch.rand(16, 3, 32, 32)
    augment = cifar_augmentation(32)
    torch.manual_seed(7)
    first = augment(batch)
    torch.manual_seed(7)
    assert torch.equal(first, augment(batch))
    assert not torch.equal(first, augment(batch))


def test_training_with_augment_repeats_for_a_seed_and_differs_from_training_without(cifar_root):
    config = load_config(dataset="cifar10", data_path=cifar_root, classes=["bird", "cat"], model="lenet5", epochs=2)
    splits = pipeline.load_splits(config)
    states = []
    for augment in (True, True, False):
        config.augment = augment
        states.append(train(config, splits, progress=False).model.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert any(not torch.equal(states[0][k], states[2][k]) for k in states[0] if states[0][k].is_floating_point())
