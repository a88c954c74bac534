"""Images from a local ``root/<class name>/<image file>`` tree, read with Pillow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from calibkit.validation import is_int

from .dataset import DataSplits, ImageDataset
from .splits import stratified_split

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


def _read_image(path: Path, image_size: int, mode: str) -> np.ndarray:
    try:
        with Image.open(path) as opened:
            im = opened.convert(mode).resize((image_size, image_size), Image.Resampling.BILINEAR)
            arr = np.asarray(im, dtype=np.float32) / np.float32(255.0)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise ValueError(f"cannot read image file {path}: {err}") from err
    return arr[None, :, :] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def _class_files(root: Path) -> dict[str, list[Path]]:
    if not root.is_dir():
        raise FileNotFoundError(
            f"image folder {root} does not exist or is not a directory; expected {root}/<class name>/<images>"
        )
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not class_dirs:
        raise ValueError(f"no class folders in {root}; expected one sub-folder per class, e.g. {root}/cat/1.png")
    files = {}
    for d in class_dirs:
        images = sorted(
            p
            for p in d.iterdir()
            if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS
        )
        if not images:
            raise ValueError(f"class folder {d} contains no images ({', '.join(IMAGE_EXTENSIONS)})")
        files[d.name] = images
    return files


def load_image_folder(
    root: str | Path,
    image_size: int,
    channels: int = 3,
    val_fraction: float = 0.2,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> DataSplits:
    """One sub-folder per class (sorted folder names are the class names); split stratified.

    Every image is converted to greyscale (``channels=1``, Pillow mode L) or RGB (``channels=3``), resized to
    ``image_size`` x ``image_size`` with bilinear interpolation (aspect ratio not kept) and scaled to [0, 1].
    """
    if not is_int(image_size) or image_size < 1:
        raise ValueError(f"image_size must be a positive int; got {image_size!r}")
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 (greyscale) or 3 (RGB); got {channels!r}")
    root = Path(root).expanduser()
    files = _class_files(root)
    class_names = tuple(files)
    mode = "L" if channels == 1 else "RGB"
    labelled = [(label, path) for label, paths in enumerate(files.values()) for path in paths]
    x = np.empty((len(labelled), channels, image_size, image_size), dtype=np.float32)  # one copy of the images
    for i, (_, path) in enumerate(labelled):
        x[i] = _read_image(path, int(image_size), mode)
    y = np.array([label for label, _ in labelled], dtype=np.int64)
    full = ImageDataset(x=x, y=y, class_names=class_names)
    fractions = (1.0 - val_fraction - test_fraction, val_fraction, test_fraction)
    train, val, test = stratified_split(y, fractions=fractions, seed=seed)
    return DataSplits(
        train=full.subset(train), val=full.subset(val), test=full.subset(test), name=f"image_folder-{root.name}"
    )
