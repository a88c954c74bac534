"""Tests for training.data: dataset containers, splits, digits, CIFAR-10 format, image folders, OOD."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from training.data import (
    DataSplits,
    ImageDataset,
    load_cifar10,
    load_dataset,
    load_digits_splits,
    load_image_folder,
    ood_dataset,
    stratified_split,
    write_cifar_format,
)

CIFAR_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def _dataset(n: int = 6, c: int = 1, size: int = 4, k: int = 2) -> ImageDataset:
    rng = np.random.default_rng(0)
    x = rng.random((n, c, size, size), dtype=np.float32)
    y = np.arange(n, dtype=np.int64) % k
    return ImageDataset(x=x, y=y, class_names=tuple(str(i) for i in range(k)))


# --------------------------------------------------------------------------- ImageDataset / DataSplits


def test_image_dataset_len_subset_and_class_names_tuple():
    ds = ImageDataset(x=np.zeros((4, 1, 2, 2), np.float32), y=np.array([0, 1, 1, 0], np.int64), class_names=["a", "b"])
    assert len(ds) == 4 and ds.class_names == ("a", "b") and ds.num_classes == 2
    sub = ds.subset([3, 1])
    assert len(sub) == 2 and sub.y.tolist() == [0, 1] and sub.class_names == ds.class_names
    assert len(ds.subset(np.array([True, False, False, True]))) == 2
    assert len(ds.subset(np.array([], dtype=np.int64))) == 0


@pytest.mark.parametrize(
    ("x", "y", "names", "match"),
    [
        (np.zeros((2, 1, 2, 2), np.float64), np.zeros(2, np.int64), ("a",), "float32"),
        (np.zeros((2, 2, 2), np.float32), np.zeros(2, np.int64), ("a",), "float32"),
        (np.zeros((2, 1, 2, 2), np.float32), np.zeros(2, np.int32), ("a",), "int64"),
        (np.zeros((2, 1, 2, 2), np.float32), np.zeros(3, np.int64), ("a",), "2 images but y has 3"),
        (np.full((2, 1, 2, 2), 1.5, np.float32), np.zeros(2, np.int64), ("a",), r"\[0, 1\]"),
        (np.full((2, 1, 2, 2), np.nan, np.float32), np.zeros(2, np.int64), ("a",), r"\[0, 1\]"),
        (np.zeros((2, 1, 2, 2), np.float32), np.array([0, 2], np.int64), ("a", "b"), "y must lie"),
        (np.zeros((2, 1, 2, 2), np.float32), np.zeros(2, np.int64), (), "non-empty"),
        (np.zeros((2, 1, 2, 2), np.float32), np.zeros(2, np.int64), ("a", "a"), "unique"),
        (np.zeros((2, 1, 2, 2), np.float32), np.zeros(2, np.int64), "ab", "sequence of strings"),
    ],
)
def test_image_dataset_validation(x, y, names, match):
    with pytest.raises(ValueError, match=match):
        ImageDataset(x=x, y=y, class_names=names)


def test_image_dataset_is_frozen():
    ds = _dataset()
    with pytest.raises(AttributeError):
        ds.x = ds.x  # type: ignore[misc]


def test_data_splits_properties_and_validation():
    ds = _dataset(c=3, size=5, k=2)
    splits = DataSplits(train=ds, val=ds.subset([0, 1]), test=ds.subset([2, 3]), name="toy")
    assert (splits.num_classes, splits.in_channels, splits.image_size) == (2, 3, 5)
    assert splits.class_names == ("0", "1")
    other = _dataset(c=1, size=5, k=2)
    with pytest.raises(ValueError, match="test images"):
        DataSplits(train=ds, val=ds, test=other, name="toy")
    renamed = ImageDataset(x=ds.x, y=ds.y, class_names=("a", "b"))
    with pytest.raises(ValueError, match="class_names"):
        DataSplits(train=ds, val=renamed, test=ds, name="toy")
    rect = ImageDataset(x=np.zeros((2, 1, 4, 5), np.float32), y=np.zeros(2, np.int64), class_names=("a",))
    with pytest.raises(ValueError, match="H == W"):
        DataSplits(train=rect, val=rect, test=rect, name="rect")


# --------------------------------------------------------------------------- splits


def test_stratified_split_partitions_and_is_deterministic():
    y = np.repeat(np.arange(5), 40)
    tr, va, te = stratified_split(y, seed=3)
    assert (len(tr), len(va), len(te)) == (120, 40, 40)
    assert np.array_equal(np.sort(np.concatenate([tr, va, te])), np.arange(200))
    for part, n in ((tr, 24), (va, 8), (te, 8)):
        assert np.bincount(y[part], minlength=5).tolist() == [n] * 5
    again = stratified_split(y, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip((tr, va, te), again))
    other = stratified_split(y, seed=4)
    assert not np.array_equal(tr, other[0])


def test_stratified_split_with_n_and_zero_test_fraction():
    tr, va, te = stratified_split(10, fractions=(0.8, 0.2, 0.0), seed=0)
    assert (len(tr), len(va), len(te)) == (8, 2, 0)
    assert tr.dtype == np.int64 and te.dtype == np.int64


@pytest.mark.parametrize("fractions", [(0.5, 0.2, 0.2), (0.0, 0.5, 0.5), (0.7, -0.1, 0.4), (0.5, 0.5)])
def test_stratified_split_rejects_bad_fractions(fractions):
    with pytest.raises(ValueError, match="fractions"):
        stratified_split(np.zeros(20, np.int64), fractions=fractions)


def test_stratified_split_explains_impossible_stratification():
    with pytest.raises(ValueError, match="stratification"):
        stratified_split(np.array([0, 0, 0, 0, 1]), fractions=(0.6, 0.2, 0.2))


# --------------------------------------------------------------------------- digits


def test_digits_splits_sizes_values_and_stratification():
    s = load_digits_splits(seed=0)
    assert s.name == "digits" and s.class_names == tuple("0123456789")
    assert (s.num_classes, s.in_channels, s.image_size) == (10, 1, 8)
    sizes = (len(s.train), len(s.val), len(s.test))
    assert sum(sizes) == 1797 and sizes == (1079, 359, 359)
    for part in (s.train, s.val, s.test):
        assert part.x.dtype == np.float32 and part.y.dtype == np.int64
        assert part.x.shape[1:] == (1, 8, 8)
        assert part.x.min() >= 0.0 and part.x.max() <= 1.0
        assert np.array_equal(np.unique(part.x * 16), np.unique(np.round(part.x * 16)))
        counts = np.bincount(part.y, minlength=10)
        frac = counts / counts.sum()
        assert np.all(np.abs(frac - 0.1) < 0.02)
    assert s.train.x.max() == 1.0


def test_digits_splits_deterministic_and_seed_dependent():
    a, b, c = load_digits_splits(seed=0), load_digits_splits(seed=0), load_digits_splits(seed=1)
    assert np.array_equal(a.train.x, b.train.x) and np.array_equal(a.test.y, b.test.y)
    assert not np.array_equal(a.train.x, c.train.x)


# --------------------------------------------------------------------------- CIFAR-10 format


@pytest.fixture(scope="module")
def cifar_tree(tmp_path_factory) -> tuple[Path, np.ndarray, np.ndarray]:
    """120 random 32x32 RGB images, 2 per class per batch (5 train batches + test batch of 20)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(120, 32, 32, 3), dtype=np.uint8)
    labels = np.tile(np.arange(10), 12)
    parent = tmp_path_factory.mktemp("cifar")
    write_cifar_format(parent / "cifar-10-batches-py", x, labels, CIFAR_NAMES)
    return parent, x, labels


def test_write_cifar_format_produces_the_real_layout(cifar_tree):
    parent, x, labels = cifar_tree
    batches = parent / "cifar-10-batches-py"
    expected = {f"data_batch_{i}" for i in range(1, 6)} | {"test_batch", "batches.meta"}
    assert {p.name for p in batches.iterdir()} == expected
    with (batches / "data_batch_2").open("rb") as f:
        batch = pickle.load(f, encoding="bytes")
    assert batch[b"data"].dtype == np.uint8 and batch[b"data"].shape == (20, 3072)
    assert batch[b"labels"] == labels[20:40].tolist()
    first = x[20]
    assert np.array_equal(batch[b"data"][0][:1024].reshape(32, 32), first[:, :, 0])
    assert np.array_equal(batch[b"data"][0][2048:].reshape(32, 32), first[:, :, 2])
    with (batches / "batches.meta").open("rb") as f:
        meta = pickle.load(f, encoding="bytes")
    assert [n.decode() for n in meta[b"label_names"]] == list(CIFAR_NAMES)


def test_load_cifar10_all_classes_round_trips_pixels(cifar_tree):
    parent, x, labels = cifar_tree
    s = load_cifar10(parent, val_fraction=0.1, seed=0)
    assert s.name == "cifar10" and s.class_names == CIFAR_NAMES
    assert (s.num_classes, s.in_channels, s.image_size) == (10, 3, 32)
    assert (len(s.train), len(s.val), len(s.test)) == (90, 10, 20)
    assert np.bincount(s.val.y, minlength=10).tolist() == [1] * 10
    expected_test = x[100:].transpose(0, 3, 1, 2)
    assert np.array_equal(s.test.x * 255, expected_test)
    assert np.array_equal(s.test.y, labels[100:])
    train_pixels = np.concatenate([s.train.x, s.val.x]) * 255
    assert np.array_equal(train_pixels.astype(np.uint8), train_pixels)
    originals = {img.tobytes() for img in x[:100].transpose(0, 3, 1, 2)}
    assert {img.astype(np.uint8).tobytes() for img in train_pixels} == originals


def test_load_cifar10_binary_subset_relabels_in_given_order(cifar_tree):
    parent, x, labels = cifar_tree
    s = load_cifar10(parent, classes=["cat", "bird"], seed=0)
    assert s.class_names == ("cat", "bird") and s.name == "cifar10-cat-bird"
    assert (len(s.train) + len(s.val), len(s.test)) == (20, 4)
    test_orig = labels[100:]
    keep = np.isin(test_orig, [2, 3])
    assert np.array_equal(s.test.y, np.where(test_orig[keep] == 3, 0, 1))
    assert np.array_equal(s.test.x * 255, x[100:][keep].transpose(0, 3, 1, 2))
    assert set(np.concatenate([s.train.y, s.val.y]).tolist()) == {0, 1}


def test_load_cifar10_root_may_be_batches_dir_and_is_deterministic(cifar_tree):
    parent, _, _ = cifar_tree
    a = load_cifar10(parent, classes=["bird", "cat"], seed=5)
    b = load_cifar10(str(parent / "cifar-10-batches-py"), classes=["bird", "cat"], seed=5)
    assert np.array_equal(a.train.x, b.train.x) and np.array_equal(a.val.y, b.val.y)


def test_load_cifar10_missing_directory_explains_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        load_cifar10(tmp_path / "nowhere")
    msg = str(info.value)
    assert str(tmp_path / "nowhere" / "cifar-10-batches-py" / "data_batch_1") in msg
    assert "cifar-10-python.tar.gz" in msg and "nothing is downloaded" in msg


def test_load_cifar10_missing_file_is_named(tmp_path):
    x = np.zeros((12, 32, 32, 3), np.uint8)
    write_cifar_format(tmp_path / "cifar-10-batches-py", x, np.arange(12) % 10, CIFAR_NAMES, n_train_batches=3)
    with pytest.raises(FileNotFoundError, match="data_batch_4") as info:
        load_cifar10(tmp_path)
    assert "data_batch_1" not in str(info.value).split("Expected")[0]


def test_load_cifar10_unknown_class_lists_valid_names(cifar_tree):
    parent, _, _ = cifar_tree
    with pytest.raises(ValueError, match="unknown CIFAR-10 class.*'cow'.*airplane, automobile, bird"):
        load_cifar10(parent, classes=["bird", "cow"])
    with pytest.raises(ValueError, match="duplicates"):
        load_cifar10(parent, classes=["bird", "bird"])


def test_load_cifar10_refuses_pickles_that_run_code(tmp_path):
    x = np.zeros((6, 32, 32, 3), np.uint8)
    batches = write_cifar_format(tmp_path / "cifar-10-batches-py", x, np.zeros(6, int), CIFAR_NAMES)
    with (batches / "test_batch").open("wb") as f:
        pickle.dump({b"data": Path("evil"), b"labels": []}, f, protocol=2)
    with pytest.raises(ValueError, match="not a CIFAR-10 python-format pickle"):
        load_cifar10(tmp_path)


# --------------------------------------------------------------------------- image folder


def _write_png(path: Path, rgb: tuple[int, int, int], size: tuple[int, int] = (12, 10)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, rgb).save(path)


@pytest.fixture()
def folder(tmp_path) -> Path:
    root = tmp_path / "pets"
    for i in range(5):
        _write_png(root / "dog" / f"{i}.png", (255, 0, 0))
        _write_png(root / "cat" / f"{i}.jpg", (0, 0, 255))
    (root / "cat" / "notes.txt").write_text("not an image")
    return root


def test_load_image_folder_rgb(folder):
    s = load_image_folder(folder, image_size=6, seed=0)
    assert s.class_names == ("cat", "dog") and s.name == "image_folder-pets"
    assert (s.num_classes, s.in_channels, s.image_size) == (2, 3, 6)
    assert (len(s.train), len(s.val), len(s.test)) == (6, 2, 2)
    for part in (s.train, s.val, s.test):
        assert set(np.bincount(part.y, minlength=2).tolist()) == {len(part) // 2}
    dogs = np.concatenate([p.x[p.y == 1] for p in (s.train, s.val, s.test)])
    assert np.allclose(dogs[:, 0], 1.0) and np.allclose(dogs[:, 2], 0.0)
    cats = np.concatenate([p.x[p.y == 0] for p in (s.train, s.val, s.test)])
    assert cats[:, 2].min() > 0.9 and cats[:, 0].max() < 0.1


def test_load_image_folder_greyscale_and_determinism(folder):
    a = load_image_folder(folder, image_size=4, channels=1, seed=2)
    b = load_image_folder(folder, image_size=4, channels=1, seed=2)
    assert a.in_channels == 1 and a.train.x.shape[1:] == (1, 4, 4)
    assert np.array_equal(a.train.x, b.train.x) and np.array_equal(a.test.y, b.test.y)
    red = round(0.299 * 255) / 255
    assert np.allclose(a.train.x[a.train.y == 1], red, atol=1 / 255)


def test_load_image_folder_errors_name_the_path(tmp_path, folder):
    with pytest.raises(FileNotFoundError, match="missing"):
        load_image_folder(tmp_path / "missing", image_size=4)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=f"no class folders in {empty}"):
        load_image_folder(empty, image_size=4)
    (folder / "bird").mkdir()
    with pytest.raises(ValueError, match="bird contains no images"):
        load_image_folder(folder, image_size=4)
    (folder / "bird").rmdir()
    bad = folder / "dog" / "broken.png"
    bad.write_bytes(b"this is not a png")
    with pytest.raises(ValueError, match="cannot read image file .*broken.png"):
        load_image_folder(folder, image_size=4)


@pytest.mark.parametrize(("kwargs", "match"), [({"image_size": 0}, "image_size"), ({"channels": 2}, "channels")])
def test_load_image_folder_rejects_bad_arguments(folder, kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_image_folder(folder, **{"image_size": 4, **kwargs})


# --------------------------------------------------------------------------- load_dataset


def test_load_dataset_dispatch(cifar_tree, folder):
    assert load_dataset().name == "digits"
    assert load_dataset("digits", seed=1).num_classes == 10
    parent, _, _ = cifar_tree
    assert load_dataset("cifar10", path=str(parent), classes=["bird", "cat"]).num_classes == 2
    assert load_dataset("image_folder", path=str(folder), image_size=5).image_size == 5


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("mnist",), {}, "unknown dataset 'mnist'; known: digits, cifar10, image_folder"),
        (("cifar10",), {}, "cifar10 needs --data-path pointing at"),
        (("image_folder",), {"path": "x"}, "image-size"),
        (("digits",), {"path": "x"}, "no --data-path"),
        (("digits",), {"classes": ["1"]}, "classes"),
    ],
)
def test_load_dataset_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_dataset(*args, **kwargs)


# --------------------------------------------------------------------------- OOD


@pytest.mark.parametrize("kind", ["sample_images", "uniform_noise"])
@pytest.mark.parametrize(("c", "size"), [(1, 8), (3, 32)])
def test_ood_dataset_shapes_ranges_determinism(kind, c, size):
    like = _dataset(n=2, c=c, size=size)
    a = ood_dataset(kind, like, n=7, seed=0)
    assert a.shape == (7, c, size, size) and a.dtype == np.float32
    assert a.min() >= 0.0 and a.max() <= 1.0 and a.std() > 0.01
    assert np.array_equal(a, ood_dataset(kind, like, n=7, seed=0))
    assert not np.array_equal(a, ood_dataset(kind, like, n=7, seed=1))


def test_ood_photo_crops_are_smoother_than_noise():
    like = _dataset(n=2, c=3, size=32)
    photos = ood_dataset("sample_images", like, n=16, seed=0)
    noise = ood_dataset("uniform_noise", like, n=16, seed=0)

    def roughness(z):
        return float(np.abs(np.diff(z, axis=3)).mean())

    assert roughness(photos) < 0.5 * roughness(noise)


def test_ood_dataset_errors():
    like = _dataset()
    with pytest.raises(ValueError, match="unknown OOD kind 'held_out_classes'; known: sample_images, uniform_noise"):
        ood_dataset("held_out_classes", like, n=3)
    with pytest.raises(ValueError, match="n must be"):
        ood_dataset("uniform_noise", like, n=-1)
    with pytest.raises(ValueError, match="1 or 3 channels"):
        ood_dataset("sample_images", _dataset(c=2), n=3)
    assert ood_dataset("uniform_noise", like, n=0).shape == (0, 1, 4, 4)


def test_load_cifar10_reads_legacy_numpy_core_pickles(tmp_path):
    """Files pickled by numpy 1.x / Python 2 name ``numpy.core.multiarray``; they must still load."""
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, size=(12, 32, 32, 3), dtype=np.uint8)
    batches = write_cifar_format(tmp_path / "cifar-10-batches-py", x, np.arange(12) % 2, CIFAR_NAMES)
    for path in batches.iterdir():
        raw = path.read_bytes().replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
        path.write_bytes(raw)
    s = load_cifar10(tmp_path, classes=["airplane", "automobile"], val_fraction=0.2)
    assert np.array_equal(s.test.x * 255, x[10:].transpose(0, 3, 1, 2))
