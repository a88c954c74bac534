"""CIFAR-10 from a local copy of the "python version" (Krizhevsky 2009); nothing is downloaded.

Format (https://www.cs.toronto.edu/~kriz/cifar.html): directory ``cifar-10-batches-py`` holding ``data_batch_1`` ..
``data_batch_5``, ``test_batch`` and ``batches.meta``, each a pickled dict. A batch has ``b"data"`` (uint8, (N,
3072): the 1024 red, then green, then blue values of a 32x32 image, row-major) and ``b"labels"`` (list of ints); the
meta file has ``b"label_names"``.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .dataset import DataSplits, ImageDataset
from .splits import stratified_split

BATCHES_DIR = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
IMAGE_SHAPE = (3, 32, 32)

_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _ArrayOnlyUnpickler(pickle.Unpickler):
    """Unpickler that only rebuilds numpy arrays and builtins, so a batch file cannot run code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch file")
        if module.startswith("numpy.core.") and hasattr(np, "_core"):
            module = "numpy._core." + module[len("numpy.core.") :]
        return super().find_class(module, name)


def resolve_cifar_dir(root: str | Path) -> Path:
    """The ``cifar-10-batches-py`` directory given either it or its parent; FileNotFoundError if incomplete."""
    root = Path(root).expanduser()
    if root.name == BATCHES_DIR or (root / META_FILE).exists() or (root / TRAIN_FILES[0]).exists():
        batches, parent = root, root.parent
    else:
        batches, parent = root / BATCHES_DIR, root
    expected = [*TRAIN_FILES, TEST_FILE, META_FILE]
    missing = [f for f in expected if not (batches / f).is_file()]  # all of them when there is no such folder
    if missing:
        raise FileNotFoundError(
            f"CIFAR-10 not found: missing {', '.join(str(batches / m) for m in missing)}. "
            f"Expected {batches}/ to contain {', '.join(expected)} (the 'CIFAR-10 python version'). "
            f"Download cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html yourself and "
            f"extract it into {parent} (tar xzf cifar-10-python.tar.gz -C {parent}); nothing is downloaded."
        )
    return batches


def _get(d: dict, key: str) -> Any:
    if key.encode() in d:
        return d[key.encode()]
    if key in d:
        return d[key]
    raise ValueError(f"CIFAR file is missing the key {key!r}; found keys {sorted(map(repr, d))}")


def _unpickle(path: Path) -> dict:
    try:
        with path.open("rb") as f:
            obj = _ArrayOnlyUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
        raise ValueError(f"{path} is not a CIFAR-10 python-format pickle: {err}") from err
    if not isinstance(obj, dict):
        raise ValueError(f"{path} is not a CIFAR-10 python-format pickle (got {type(obj).__name__})")
    return obj


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    d = _unpickle(path)
    data = np.asarray(_get(d, "data"))
    labels = np.asarray(_get(d, "labels"), dtype=np.int64)
    n_values = int(np.prod(IMAGE_SHAPE))
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != n_values:
        raise ValueError(f"{path}: data must be uint8 of shape (N, {n_values}); got {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],):
        raise ValueError(f"{path}: {data.shape[0]} images but {labels.shape[0]} labels")
    return data, labels


def _to_dataset(data: np.ndarray, labels: np.ndarray, class_names: tuple[str, ...]) -> ImageDataset:
    x = data.reshape(-1, *IMAGE_SHAPE).astype(np.float32) / np.float32(255.0)
    return ImageDataset(x=x, y=labels, class_names=class_names)


def load_cifar10(
    root: str | Path,
    classes: Sequence[str] | None = None,
    val_fraction: float = 0.1,
    seed: int = 0,
) -> DataSplits:
    """CIFAR-10 as float32 (N, 3, 32, 32) in [0, 1] from ``root`` (``cifar-10-batches-py`` or its parent): test is
    ``test_batch``, validation a stratified ``val_fraction`` of the training images drawn by ``seed``. ``classes`` keeps
    those classes (by name), relabelled ``0..len(classes)-1`` in the given order, e.g. ``["bird", "cat"]``."""
    if not 0.0 < float(val_fraction) < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1); got {val_fraction}")
    batches = resolve_cifar_dir(root)
    names = _get(_unpickle(batches / META_FILE), "label_names")
    all_names = tuple(n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in names)
    parts = [_read_batch(batches / f) for f in TRAIN_FILES]
    train_data = np.concatenate([p[0] for p in parts])
    train_labels = np.concatenate([p[1] for p in parts])
    test_data, test_labels = _read_batch(batches / TEST_FILE)
    for labels in (train_labels, test_labels):
        if labels.size and (labels.min() < 0 or labels.max() >= len(all_names)):
            raise ValueError(f"{batches}: labels outside [0, {len(all_names)}) for label_names {all_names}")

    if classes is None:
        class_names, name = all_names, "cifar10"
    else:
        if isinstance(classes, str):
            raise ValueError(f"classes must be a sequence of class names, not the string {classes!r}")
        class_names = tuple(classes)
        unknown = [c for c in class_names if c not in all_names]
        if unknown:
            raise ValueError(f"unknown CIFAR-10 class(es) {unknown}; valid names: {', '.join(all_names)}")
        if not class_names or len(set(class_names)) != len(class_names):
            raise ValueError(f"classes must be non-empty and without duplicates; got {list(class_names)}")
        lookup = np.full(len(all_names), -1, dtype=np.int64)
        lookup[[all_names.index(c) for c in class_names]] = np.arange(len(class_names))
        train_keep, test_keep = lookup[train_labels] >= 0, lookup[test_labels] >= 0
        train_data, train_labels = train_data[train_keep], lookup[train_labels[train_keep]]
        test_data, test_labels = test_data[test_keep], lookup[test_labels[test_keep]]
        name = "cifar10-" + "-".join(class_names)

    tr, va, _ = stratified_split(train_labels, fractions=(1.0 - val_fraction, val_fraction, 0.0), seed=seed)
    return DataSplits(
        train=_to_dataset(train_data[tr], train_labels[tr], class_names),
        val=_to_dataset(train_data[va], train_labels[va], class_names),
        test=_to_dataset(test_data, test_labels, class_names),
        name=name,
    )


def write_cifar_format(
    directory: str | Path,
    x_uint8: np.ndarray,
    labels: Sequence[int] | np.ndarray,
    label_names: Sequence[str],
    n_train_batches: int = 5,
) -> Path:
    """Write (N, 32, 32, 3) uint8 RGB images in the CIFAR-10 python format (a fixture generator for tests and demos)
    into the ``cifar-10-batches-py`` folder ``directory``, returned: ``n_train_batches + 1`` consecutive, near-equal
    chunks, ``data_batch_1..n_train_batches`` then ``test_batch``."""
    x = np.asarray(x_uint8)
    y = np.asarray(labels, dtype=np.int64)
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1:] != (32, 32, 3):
        raise ValueError(f"x_uint8 must be uint8 of shape (N, 32, 32, 3); got {x.dtype} {x.shape}")
    if y.shape != (x.shape[0],):
        raise ValueError(f"labels must have shape ({x.shape[0]},); got {y.shape}")
    names = [str(n) for n in label_names]
    if y.size and (y.min() < 0 or y.max() >= len(names)):
        outside = int(y.min()) if y.min() < 0 else int(y.max())
        raise ValueError(f"labels must lie in [0, {len(names)}); got {outside}")
    if not 1 <= n_train_batches <= len(TRAIN_FILES):
        raise ValueError(f"n_train_batches must be in 1..{len(TRAIN_FILES)}; got {n_train_batches}")
    if x.shape[0] < n_train_batches + 1:
        raise ValueError(f"need at least {n_train_batches + 1} images for {n_train_batches} batches + test")

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    rows = np.ascontiguousarray(x.transpose(0, 3, 1, 2).reshape(x.shape[0], -1))
    chunks = np.array_split(np.arange(x.shape[0]), n_train_batches + 1)
    files = [*TRAIN_FILES[:n_train_batches], TEST_FILE]
    for i, (fname, idx) in enumerate(zip(files, chunks)):
        batch_label = "testing batch 1 of 1" if fname == TEST_FILE else f"training batch {i + 1} of 5"
        batch = {
            b"batch_label": batch_label.encode(),
            b"labels": [int(v) for v in y[idx]],
            b"data": rows[idx],
            b"filenames": [f"image_{int(j):06d}.png".encode() for j in idx],
        }
        with (out / fname).open("wb") as f:
            pickle.dump(batch, f, protocol=2)
    meta = {
        b"num_cases_per_batch": int(len(chunks[0])),
        b"label_names": [n.encode() for n in names],
        b"num_vis": int(np.prod(IMAGE_SHAPE)),
    }
    with (out / META_FILE).open("wb") as f:
        pickle.dump(meta, f, protocol=2)
    return out
