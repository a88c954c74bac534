"""Out-of-distribution image batches shaped like an in-distribution dataset (no download)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from PIL import Image
from sklearn.datasets import load_sample_images

from .dataset import ImageDataset

OOD_KINDS = ("sample_images", "uniform_noise")
MIN_CROP_FRACTION = 0.125


@lru_cache(maxsize=1)
def _photos() -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(im, dtype=np.uint8) for im in load_sample_images().images)


def _photo_crops(n: int, channels: int, size: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    photos = _photos()
    mode = "L" if channels == 1 else "RGB"
    h, w = size
    out = np.empty((n, channels, h, w), dtype=np.float32)
    for i in range(n):
        photo = photos[int(rng.integers(len(photos)))]
        ph, pw = photo.shape[:2]
        short = min(ph, pw)
        side = int(rng.integers(max(1, int(short * MIN_CROP_FRACTION)), short + 1))
        top = int(rng.integers(ph - side + 1))
        left = int(rng.integers(pw - side + 1))
        crop = Image.fromarray(photo[top : top + side, left : left + side]).convert(mode)
        arr = np.asarray(crop.resize((w, h), Image.Resampling.BILINEAR), dtype=np.float32) / np.float32(255.0)
        out[i] = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
    return out


def ood_dataset(kind: str, like: ImageDataset, n: int, seed: int = 0) -> np.ndarray:
    """``n`` float32 images (n, C, H, W) in [0, 1] with ``like``'s C, H, W.

    ``"sample_images"``: random square crops (side 1/8 to all of the shorter edge) of the two photos
    bundled with scikit-learn (``load_sample_images``: china.jpg, flower.jpg), converted to greyscale
    or RGB and resized bilinearly. ``"uniform_noise"``: i.i.d. U(0, 1) values.
    """
    if kind not in OOD_KINDS:
        raise ValueError(f"unknown OOD kind {kind!r}; known: {', '.join(OOD_KINDS)}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative int; got {n!r}")
    _, channels, h, w = like.x.shape
    rng = np.random.default_rng(seed)
    if kind == "uniform_noise":
        return rng.random((int(n), channels, h, w), dtype=np.float32)
    if channels not in (1, 3):
        raise ValueError(f"sample_images needs 1 or 3 channels; the reference dataset has {channels}")
    return _photo_crops(int(n), channels, (h, w), rng)
