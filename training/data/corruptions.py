"""Common image corruptions after Hendrycks & Dietterich (2019).

Source: D. Hendrycks, T. Dietterich, "Benchmarking Neural Network Robustness to Common Corruptions and
Perturbations", ICLR 2019, and the CIFAR-10-C generator ``ImageNet-C/create_c/make_cifar_c.py`` in
https://github.com/hendrycks/robustness, whose severity tables are used here. Every function maps a float batch ``x``
(N, C, H, W) in [0, 1] to a float32 batch of the same shape clipped to [0, 1]; severity 0 is the identity and 1..5
index the tables. Random draws come only from ``rng``.

The tables were made for 32x32 images. For smaller ones ``gaussian_blur`` scales sigma by H/32 and ``pixelate``
shrinks by at least one pixel per severity step (details in their docstrings); from 32x32 they follow the source.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache, wraps

import numpy as np
from PIL import Image
from scipy import ndimage, special

from calibkit.validation import is_int

Corruption = Callable[[np.ndarray, int, np.random.Generator], np.ndarray]

MAX_SEVERITY = 5
REFERENCE_SIZE = 32

GAUSSIAN_NOISE_C = (0.04, 0.06, 0.08, 0.09, 0.10)
SHOT_NOISE_C = (500.0, 250.0, 100.0, 75.0, 50.0)
IMPULSE_NOISE_C = (0.01, 0.02, 0.03, 0.05, 0.07)
GAUSSIAN_BLUR_SIGMA = (0.4, 0.6, 0.7, 0.8, 1.0)
CONTRAST_C = (0.75, 0.5, 0.4, 0.3, 0.15)
BRIGHTNESS_C = (0.05, 0.1, 0.15, 0.2, 0.3)
PIXELATE_C = (0.95, 0.9, 0.85, 0.75, 0.65)


def _corruption(transform: Corruption) -> Corruption:
    """A corruption from its transform at severities 1..5: the batch and severity checked, severity 0 the identity,
    the result clipped to [0, 1] as float32."""

    @wraps(transform)
    def corruption(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
        if not is_int(severity):
            raise ValueError(f"severity must be an int in 0..{MAX_SEVERITY}; got {severity!r}")
        if not 0 <= severity <= MAX_SEVERITY:
            raise ValueError(f"severity must be in 0..{MAX_SEVERITY}; got {severity}")
        x = np.asarray(x)
        if x.ndim != 4:
            raise ValueError(f"expected a batch of shape (N, C, H, W); got shape {x.shape}")
        if severity == 0:
            return np.array(x, dtype=np.float32, copy=True)
        return np.clip(transform(x, severity, rng), 0.0, 1.0).astype(np.float32, copy=False)

    return corruption


@_corruption
def gaussian_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """``clip(x + N(0, c^2))`` per value, c = [0.04, 0.06, 0.08, 0.09, 0.10] (H&D 2019, CIFAR-10-C)."""
    c = GAUSSIAN_NOISE_C[severity - 1]
    return x.astype(np.float64) + rng.normal(0.0, c, size=x.shape)


@_corruption
def shot_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson noise ``clip(Poisson(c * x) / c)``, c = [500, 250, 100, 75, 50] (H&D 2019, CIFAR-10-C)."""
    c = SHOT_NOISE_C[severity - 1]
    return rng.poisson(np.clip(x, 0.0, 1.0).astype(np.float64) * c) / c


@_corruption
def impulse_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Salt-and-pepper noise: each value independently becomes 0 or 1 (equally likely) with probability c =
    [0.01, 0.02, 0.03, 0.05, 0.07] (H&D 2019, CIFAR-10-C; skimage ``random_noise`` mode "s&p")."""
    c = IMPULSE_NOISE_C[severity - 1]
    flipped = rng.random(x.shape) < c
    salted = rng.random(x.shape) < 0.5
    out = x.astype(np.float64, copy=True)
    out[flipped & salted] = 1.0
    out[flipped & ~salted] = 0.0
    return out


def _discrete_gaussian_kernel(sigma: float) -> np.ndarray:
    """Lindeberg's discrete Gaussian ``T(n; t) = exp(-t) I_n(t)``, t = sigma^2 (variance exactly t)."""
    radius = math.ceil(4.0 * sigma) + 2
    n = np.arange(-radius, radius + 1)
    k = special.ive(n, sigma * sigma)
    return k / k.sum()


@_corruption
def gaussian_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Gaussian blur over H and W, sigma = [0.4, 0.6, 0.7, 0.8, 1.0] pixels (H&D 2019, CIFAR-10-C).

    For H >= 32 this is the source's sampled Gaussian (skimage ``gaussian``: edge mode "nearest", truncated at 4 sigma).
    For H < 32 sigma is scaled by H/32 so the blur covers the same fraction of the image (8x8: sigma 0.1..0.25); such
    sub-pixel sigmas vanish in a sampled kernel, so the discrete Gaussian of Lindeberg (1990), whose variance is exactly
    sigma^2, is used instead. ``rng`` is unused (the corruption is deterministic).
    """
    sigma = GAUSSIAN_BLUR_SIGMA[severity - 1]
    size = min(x.shape[2], x.shape[3])
    x64 = x.astype(np.float64)
    if size >= REFERENCE_SIZE:
        out = ndimage.gaussian_filter(x64, sigma=(0.0, 0.0, sigma, sigma), mode="nearest", truncate=4.0)
    else:
        kernel = _discrete_gaussian_kernel(sigma * size / REFERENCE_SIZE)
        out = ndimage.correlate1d(x64, kernel, axis=2, mode="nearest")
        out = ndimage.correlate1d(out, kernel, axis=3, mode="nearest")
    return out


@_corruption
def contrast(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """``(x - m) * c + m`` with m the per-image, per-channel mean, c = [0.75, 0.5, 0.4, 0.3, 0.15]
    (H&D 2019, CIFAR-10-C). ``rng`` is unused."""
    c = CONTRAST_C[severity - 1]
    x64 = x.astype(np.float64)
    means = x64.mean(axis=(2, 3), keepdims=True)
    return (x64 - means) * c + means


@_corruption
def brightness(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Add c = [0.05, 0.1, 0.15, 0.2, 0.3] to the HSV value channel (H&D 2019, CIFAR-10-C).

    RGB (C == 3): V = max(R, G, B) becomes V' = min(V + c, 1) with hue and saturation kept, which is exactly
    ``rgb * V' / V`` (and grey V' for black pixels, whose saturation is 0); this equals the source's rgb2hsv -> V += c
    -> hsv2rgb. Other channel counts: ``clip(x + c)`` per value. ``rng`` is unused.
    """
    c = BRIGHTNESS_C[severity - 1]
    x64 = np.clip(x.astype(np.float64), 0.0, 1.0)
    if x.shape[1] != 3:
        return x64 + c
    v = x64.max(axis=1, keepdims=True)
    v_new = np.minimum(v + c, 1.0)
    scale = np.divide(v_new, v, out=np.zeros_like(v), where=v > 0)
    return np.where(v > 0, x64 * scale, v_new)


@lru_cache(maxsize=64)
def _pil_box_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) matrix of Pillow's 1-D BOX resize, read off by resizing an identity image."""
    eye = Image.fromarray(np.eye(n_in, dtype=np.float32))
    return np.asarray(eye.resize((n_out, n_in), Image.Resampling.BOX), dtype=np.float64).T.copy()


@lru_cache(maxsize=64)
def _area_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) exact area-weighted resize: output cell j spans [j, j + 1) * n_in / n_out."""
    edges = np.arange(n_out + 1) * (n_in / n_out)
    left = np.arange(n_in)
    overlap = np.minimum(edges[1:, None], left[None, :] + 1) - np.maximum(edges[:-1, None], left[None, :])
    weights = np.clip(overlap, 0.0, None)
    return weights / weights.sum(axis=1, keepdims=True)


def pixelate_size(n: int, severity: int) -> int:
    """The side ``n`` shrinks to at ``severity``: ``int(n * c)``, and for n < 32 at most ``n - severity``; >= 1."""
    size = int(n * PIXELATE_C[severity - 1])
    if n < REFERENCE_SIZE:
        size = min(size, n - severity)
    return max(1, size)


def _pixelate_matrix(n: int, severity: int) -> np.ndarray:
    size = pixelate_size(n, severity)
    if n >= REFERENCE_SIZE:
        return _pil_box_matrix(size, n) @ _pil_box_matrix(n, size)
    return _area_matrix(size, n) @ _area_matrix(n, size)


@_corruption
def pixelate(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Shrink each side to ``int(side * c)``, c = [0.95, 0.9, 0.85, 0.75, 0.65], and enlarge back
    (H&D 2019, CIFAR-10-C: 32 -> 30, 28, 27, 24, 20 px).

    For sides >= 32 both steps use Pillow's BOX filter as in the source (enlarging with BOX is
    nearest-neighbour). Smaller sides shrink by at least ``severity`` pixels (8 -> 7, 6, 5, 4, 3) and
    both steps use exact area weights, since Pillow's pixel-centre BOX rule makes the distortion
    non-monotone in the size for 8x8 images. ``rng`` is unused.
    """
    mh = _pixelate_matrix(x.shape[2], severity)
    mw = _pixelate_matrix(x.shape[3], severity)
    return mh @ x.astype(np.float64) @ mw.T


CORRUPTIONS: dict[str, Corruption] = {
    "gaussian_noise": gaussian_noise,
    "shot_noise": shot_noise,
    "impulse_noise": impulse_noise,
    "gaussian_blur": gaussian_blur,
    "contrast": contrast,
    "brightness": brightness,
    "pixelate": pixelate,
}


def available_corruptions() -> tuple[str, ...]:
    """Names accepted by :func:`corrupt`, in a fixed order."""
    return tuple(CORRUPTIONS)


def corrupt(x: np.ndarray, name: str, severity: int, seed: int = 0) -> np.ndarray:
    """Apply corruption ``name`` at ``severity`` (0..5) with ``np.random.default_rng(seed)``."""
    if name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; known: {', '.join(CORRUPTIONS)}")
    return CORRUPTIONS[name](x, severity, np.random.default_rng(seed))
