"""In-memory image datasets shared by every loader: float32 NCHW in [0, 1] plus int64 labels."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class ImageDataset:
    """Images ``x`` (N, C, H, W) float32 in [0, 1], labels ``y`` (N,) int64 in ``[0, len(class_names))``."""

    x: np.ndarray
    y: np.ndarray
    class_names: tuple[str, ...]

    def __post_init__(self) -> None:
        x, y = self.x, self.y
        if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 4:
            raise ValueError(
                "ImageDataset.x must be a float32 numpy array of shape (N, C, H, W); got "
                f"{type(x).__name__} dtype={getattr(x, 'dtype', None)} shape={getattr(x, 'shape', None)}"
            )
        if not isinstance(y, np.ndarray) or y.dtype != np.int64 or y.ndim != 1:
            raise ValueError(
                "ImageDataset.y must be an int64 numpy array of shape (N,); got "
                f"{type(y).__name__} dtype={getattr(y, 'dtype', None)} shape={getattr(y, 'shape', None)}"
            )
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"ImageDataset.x has {x.shape[0]} images but y has {y.shape[0]} labels")
        if min(x.shape[1:]) < 1:
            raise ValueError(f"ImageDataset.x needs C, H, W >= 1; got shape {x.shape}")
        if isinstance(self.class_names, str) or not isinstance(self.class_names, Sequence):
            raise ValueError(f"class_names must be a sequence of strings; got {self.class_names!r}")
        names = tuple(self.class_names)
        if not names or not all(isinstance(n, str) for n in names):
            raise ValueError(f"class_names must be a non-empty sequence of strings; got {names!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"class_names must be unique; got {names!r}")
        object.__setattr__(self, "class_names", names)
        if x.size:
            lo, hi = float(x.min()), float(x.max())
            if not (np.isfinite(lo) and np.isfinite(hi)) or lo < 0.0 or hi > 1.0:
                raise ValueError(f"ImageDataset.x values must lie in [0, 1]; got min={lo} max={hi}")
        if y.size and (int(y.min()) < 0 or int(y.max()) >= len(names)):
            raise ValueError(
                f"ImageDataset.y must lie in [0, {len(names)}) for {len(names)} classes; "
                f"got min={int(y.min())} max={int(y.max())}"
            )

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def subset(self, indices: np.ndarray | Sequence[int]) -> ImageDataset:
        """A new dataset with the rows ``indices`` (integer positions or a boolean mask), copied."""
        idx = np.asarray(indices)
        if idx.dtype != bool:
            idx = idx.astype(np.int64, copy=False)
        return ImageDataset(x=self.x[idx], y=self.y[idx], class_names=self.class_names)


@dataclass(frozen=True, eq=False)
class DataSplits:
    """Train / validation / test datasets over the same classes and image shape."""

    train: ImageDataset
    val: ImageDataset
    test: ImageDataset
    name: str

    def __post_init__(self) -> None:
        parts = {"train": self.train, "val": self.val, "test": self.test}
        for part, ds in parts.items():
            if not isinstance(ds, ImageDataset):
                raise ValueError(f"DataSplits.{part} must be an ImageDataset; got {type(ds).__name__}")
        shape = self.train.x.shape[1:]
        for part, ds in parts.items():
            if ds.class_names != self.train.class_names:
                raise ValueError(
                    f"DataSplits.{part} class_names {ds.class_names} differ from train {self.train.class_names}"
                )
            if ds.x.shape[1:] != shape:
                raise ValueError(f"DataSplits.{part} images are {ds.x.shape[1:]} but train images are {shape}")
        if shape[1] != shape[2]:
            raise ValueError(f"DataSplits requires square images (H == W); got H={shape[1]} W={shape[2]}")
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"DataSplits.name must be a non-empty string; got {self.name!r}")

    @property
    def class_names(self) -> tuple[str, ...]:
        return self.train.class_names

    @property
    def num_classes(self) -> int:
        return len(self.train.class_names)

    @property
    def in_channels(self) -> int:
        return int(self.train.x.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.train.x.shape[2])
