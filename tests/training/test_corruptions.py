"""Tests for training.data.corruptions (Hendrycks & Dietterich 2019 corruptions on NCHW batches)."""

from __future__ import annotations

import colorsys

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from training.data import CORRUPTIONS, available_corruptions, corrupt, load_digits_splits
from training.data.corruptions import (
    BRIGHTNESS_C,
    CONTRAST_C,
    GAUSSIAN_BLUR_SIGMA,
    GAUSSIAN_NOISE_C,
    IMPULSE_NOISE_C,
    _discrete_gaussian_kernel,
    brightness,
    contrast,
    gaussian_blur,
    pixelate,
    pixelate_size,
)

NAMES = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "gaussian_blur",
    "contrast",
    "brightness",
    "pixelate",
)


@pytest.fixture(scope="module")
def digits() -> np.ndarray:
    return load_digits_splits(seed=0).test.x[:200]


@pytest.fixture(scope="module")
def smooth_rgb() -> np.ndarray:
    """32x32 RGB images: bilinearly enlarged 8x8 random patterns (image-like, spatially correlated)."""
    rng = np.random.default_rng(1)
    return ndimage.zoom(rng.random((48, 3, 8, 8)), (1, 1, 4, 4), order=1).clip(0, 1).astype(np.float32)


@pytest.fixture(scope="module")
def noise_rgb() -> np.ndarray:
    return np.random.default_rng(2).random((48, 3, 32, 32), dtype=np.float32)


@pytest.fixture(scope="module", params=["digits", "smooth_rgb", "noise_rgb"])
def batch(request) -> np.ndarray:
    return request.getfixturevalue(request.param)


def test_registry_lists_the_seven_corruptions():
    assert available_corruptions() == NAMES
    assert set(CORRUPTIONS) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_severity_zero_is_identity_and_outputs_are_valid(name, batch):
    before = batch.copy()
    clean = corrupt(batch, name, 0, seed=0)
    assert clean.dtype == np.float32 and np.array_equal(clean, batch)
    for severity in range(1, 6):
        out = corrupt(batch, name, severity, seed=0)
        assert out.shape == batch.shape and out.dtype == np.float32
        assert out.min() >= 0.0 and out.max() <= 1.0
    assert np.array_equal(batch, before)


@pytest.mark.parametrize("name", NAMES)
def test_distortion_strictly_increases_with_severity(name, batch):
    distortion = [float(np.abs(corrupt(batch, name, s, seed=0) - batch).mean()) for s in range(6)]
    assert distortion[0] == 0.0
    assert all(b > a for a, b in zip(distortion, distortion[1:])), distortion


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_given_seed(name, smooth_rgb):
    a = corrupt(smooth_rgb, name, 3, seed=7)
    assert np.array_equal(a, corrupt(smooth_rgb, name, 3, seed=7))
    b = CORRUPTIONS[name](smooth_rgb, 3, np.random.default_rng(7))
    assert np.array_equal(a, b)


@pytest.mark.parametrize("name", ["gaussian_noise", "shot_noise", "impulse_noise"])
def test_noise_depends_on_seed(name, smooth_rgb):
    assert not np.array_equal(corrupt(smooth_rgb, name, 3, seed=0), corrupt(smooth_rgb, name, 3, seed=1))


@pytest.mark.parametrize("severity", [-1, 6, 1.0, True, "2"])
def test_bad_severity_raises(severity, digits):
    for name in NAMES:
        with pytest.raises(ValueError, match="severity"):
            corrupt(digits, name, severity)


def test_unknown_name_and_bad_shape_raise(digits):
    with pytest.raises(ValueError, match="unknown corruption 'fog'; known: gaussian_noise, shot_noise"):
        corrupt(digits, "fog", 1)
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        corrupt(digits[:, 0], "contrast", 1)


# --------------------------------------------------------------------------- formulas


def test_gaussian_noise_std_matches_table():
    x = np.full((64, 1, 16, 16), 0.5, np.float32)
    for s, c in enumerate(GAUSSIAN_NOISE_C, start=1):
        assert abs(float(corrupt(x, "gaussian_noise", s).std()) - c) < 0.05 * c


def test_shot_noise_is_unbiased_and_impulse_rate_matches_table():
    x = np.full((64, 1, 16, 16), 0.4, np.float32)
    assert abs(float(corrupt(x, "shot_noise", 5).mean()) - 0.4) < 0.01
    for s, c in enumerate(IMPULSE_NOISE_C, start=1):
        out = corrupt(x, "impulse_noise", s, seed=s)
        assert set(np.unique(out).tolist()) <= {0.0, np.float32(0.4).item(), 1.0}
        changed = out != x
        assert abs(float(changed.mean()) - c) < 0.2 * c
        assert abs(float((out[changed] == 1.0).mean()) - 0.5) < 0.1


def test_contrast_scales_deviation_from_per_channel_mean():
    rng = np.random.default_rng(0)
    x = (0.3 + 0.4 * rng.random((4, 3, 8, 8))).astype(np.float32)
    means = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    for s, c in enumerate(CONTRAST_C, start=1):
        out = contrast(x, s, rng)
        assert np.allclose(out, (x - means) * c + means, atol=1e-6)


def test_brightness_rgb_equals_hsv_value_shift():
    rng = np.random.default_rng(0)
    x = rng.random((3, 3, 5, 5)).astype(np.float32)
    x[0, :, 0, 0] = 0.0
    x[1, :, 1, 1] = 0.6
    for s, c in enumerate(BRIGHTNESS_C, start=1):
        out = brightness(x, s, rng)
        for n, i, j in [(0, 0, 0), (1, 1, 1), (2, 3, 4), (0, 2, 2), (1, 4, 0)]:
            h, sat, v = colorsys.rgb_to_hsv(*x[n, :, i, j].astype(np.float64))
            expected = colorsys.hsv_to_rgb(h, sat, min(v + c, 1.0))
            assert np.allclose(out[n, :, i, j], expected, atol=1e-6)


def test_brightness_greyscale_adds_to_intensity(digits):
    for s, c in enumerate(BRIGHTNESS_C, start=1):
        assert np.allclose(brightness(digits, s, np.random.default_rng(0)), np.clip(digits + c, 0, 1), atol=1e-6)


def test_gaussian_blur_matches_source_at_32(smooth_rgb):
    for s, sigma in enumerate(GAUSSIAN_BLUR_SIGMA, start=1):
        expected = ndimage.gaussian_filter(
            smooth_rgb.astype(np.float64), sigma=(0, 0, sigma, sigma), mode="nearest", truncate=4.0
        )
        assert np.allclose(gaussian_blur(smooth_rgb, s, np.random.default_rng(0)), expected, atol=1e-6)


def test_gaussian_blur_small_images_use_scaled_discrete_gaussian(digits):
    for sigma in (0.1, 0.25, 0.7):
        k = _discrete_gaussian_kernel(sigma)
        n = np.arange(len(k)) - len(k) // 2
        assert abs(k.sum() - 1.0) < 1e-12 and abs(float((k * n**2).sum()) - sigma**2) < 1e-4 * sigma**2
    flat = np.full((2, 1, 8, 8), 0.3, np.float32)
    assert np.allclose(gaussian_blur(flat, 5, np.random.default_rng(0)), 0.3)
    mild = float(np.abs(gaussian_blur(digits, 1, np.random.default_rng(0)) - digits).mean())
    assert 0.0 < mild < 0.02


def test_pixelate_sizes_and_source_behaviour_at_32(smooth_rgb):
    assert [pixelate_size(32, s) for s in range(1, 6)] == [30, 28, 27, 24, 20]
    assert [pixelate_size(8, s) for s in range(1, 6)] == [7, 6, 5, 4, 3]
    assert [pixelate_size(2, s) for s in range(1, 6)] == [1, 1, 1, 1, 1]
    img = smooth_rgb[0, 1]
    for s in range(1, 6):
        size = pixelate_size(32, s)
        pil = Image.fromarray(img).resize((size, size), Image.Resampling.BOX).resize((32, 32), Image.Resampling.BOX)
        ours = pixelate(smooth_rgb[:1], s, np.random.default_rng(0))[0, 1]
        assert np.allclose(ours, np.asarray(pil), atol=1e-5)


def test_pixelate_keeps_constant_images_and_handles_non_square():
    flat = np.full((2, 3, 8, 12), 0.7, np.float32)
    for s in range(1, 6):
        assert np.allclose(pixelate(flat, s, np.random.default_rng(0)), 0.7, atol=1e-6)
