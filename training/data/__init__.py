"""Datasets (digits, CIFAR-10, image folders), corruptions and OOD batches as float32 NCHW in [0, 1]."""

from __future__ import annotations

from collections.abc import Sequence

from .cifar import load_cifar10, write_cifar_format
from .corruptions import CORRUPTIONS, available_corruptions, corrupt
from .dataset import DataSplits, ImageDataset
from .digits import load_digits_splits
from .image_folder import load_image_folder
from .ood import OOD_KINDS, ood_dataset
from .splits import split_off_fraction, stratified_split
from .training_set import subsample_train, with_label_noise

DATASETS = ("digits", "cifar10", "image_folder")

__all__ = [
    "CORRUPTIONS",
    "DATASETS",
    "OOD_KINDS",
    "DataSplits",
    "ImageDataset",
    "available_corruptions",
    "corrupt",
    "load_cifar10",
    "load_dataset",
    "load_digits_splits",
    "load_image_folder",
    "ood_dataset",
    "split_off_fraction",
    "stratified_split",
    "subsample_train",
    "with_label_noise",
    "write_cifar_format",
]


def load_dataset(
    name: str = "digits",
    *,
    path: str | None = None,
    classes: Sequence[str] | None = None,
    image_size: int | None = None,
    seed: int = 0,
) -> DataSplits:
    """Load ``name``: "digits" (bundled, no path), "cifar10" (``path`` to a local copy, optional
    ``classes``) or "image_folder" (``path`` and ``image_size``). Options a dataset cannot use raise."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    if classes is not None and name != "cifar10":
        raise ValueError(f"classes is only supported for cifar10, not {name}")
    if name == "digits":
        if path is not None:
            raise ValueError("digits is bundled with scikit-learn and takes no --data-path")
        if image_size not in (None, 8):
            raise ValueError(f"digits images are 8x8; got image_size={image_size}")
        return load_digits_splits(seed=seed)
    if name == "cifar10":
        if path is None:
            raise ValueError(
                "cifar10 needs --data-path pointing at a directory holding cifar-10-batches-py/ "
                "(or at cifar-10-batches-py/ itself), extracted from cifar-10-python.tar.gz; nothing is downloaded"
            )
        if image_size not in (None, 32):
            raise ValueError(f"cifar10 images are 32x32; got image_size={image_size}")
        return load_cifar10(path, classes=classes, seed=seed)
    if path is None or image_size is None:
        raise ValueError(
            "image_folder needs --data-path pointing at a directory with one sub-folder of images per class "
            "and --image-size"
        )
    return load_image_folder(path, image_size=image_size, seed=seed)
