"""Tests for zo.data on small fixtures built in tmp_path, plus the real shared data when present."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from zo.data import Dataset, batches, load_dataset, resize_images, subset
from zo.errors import DataError, ZoError

from shared_paths import SHARED

# ----------------------------------------------------------------------------------------------
# Fixture builders


def _images(n, h=8, w=8, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def write_npz(path, **override):
    arrays = dict(
        x_train=_images(6),
        y_train=np.array([0, 1, 2, 0, 1, 2]),
        x_test=_images(3, seed=1),
        y_test=np.array([2, 1, 0]),
        class_names=np.array(["a", "b", "c"]),
    )
    arrays.update(override)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


def write_eurosat(root, per_class=(5, 5, 5), size=(16, 16)):
    """EuroSAT public layout: one folder of JPEGs per class. Class k's images are a flat colour
    (so JPEG keeps them recognisable) whose red channel encodes k, to check labels survive."""
    for k, n in enumerate(per_class):
        d = root / f"Class{k}"
        d.mkdir(parents=True)
        for i in range(n):
            Image.new("RGB", size, (40 + 80 * k, 10 * i, 128)).save(d / f"Class{k}_{i}.jpg", quality=95)
    return root


def stl10_bytes(images_nhwc):
    """The official STL-10 byte layout, written from first principles rather than by inverting the
    loader: per image, channel planes R, G, B, each plane column-major (all of column 0 top to bottom,
    then column 1, ...)."""
    n, h, w, _ = images_nhwc.shape
    out = bytearray()
    for img in images_nhwc:
        for c in range(3):
            for col in range(w):
                for row in range(h):
                    out.append(int(img[row, col, c]))
    return bytes(out)


def write_stl10(root, n_train=3, n_test=2, labels_train=None, labels_test=None, class_names=True):
    d = root / "stl10_binary"
    d.mkdir(parents=True)
    xs = {"train": np.zeros((n_train, 96, 96, 3), np.uint8), "test": np.zeros((n_test, 96, 96, 3), np.uint8)}
    # A known, asymmetric pixel: row 5, column 70, green, of train image 1. A loader that forgets the
    # H/W transposition would find it at row 70, column 5.
    if n_train > 1:
        xs["train"][1, 5, 70, 1] = 200
    if n_test > 0:
        xs["test"][0, 90, 2, 2] = 77
    labels = {
        "train": labels_train if labels_train is not None else [1, 2, 10][:n_train],
        "test": labels_test if labels_test is not None else [3, 10][:n_test],
    }
    for split in ("train", "test"):
        (d / f"{split}_X.bin").write_bytes(stl10_bytes(xs[split]))
        np.array(labels[split], dtype=np.uint8).tofile(d / f"{split}_y.bin")
    if class_names:
        (d / "class_names.txt").write_text("\n".join(f"c{i}" for i in range(10)) + "\n")
    return root, xs


# ----------------------------------------------------------------------------------------------
# .npz


def test_npz_loads(tmp_path):
    ds = load_dataset(write_npz(tmp_path / "tiny.npz"))
    assert isinstance(ds, Dataset)
    assert ds.name == "tiny" and ds.class_names == ["a", "b", "c"] and ds.num_classes == 3
    assert ds.x_train.shape == (6, 8, 8, 3) and ds.x_train.dtype == np.uint8
    assert ds.y_train.dtype == np.int64 and ds.y_test.tolist() == [2, 1, 0]


def test_npz_without_class_names_counts_labels(tmp_path):
    ds = load_dataset(write_npz(tmp_path / "t.npz", class_names=None))
    assert ds.class_names == ["0", "1", "2"]


@pytest.mark.parametrize(
    "override, fragments",
    [
        (dict(y_test=None), ["y_test", "missing"]),
        (dict(x_train=_images(6)[..., 0]), ["x_train", "N x H x W x 3"]),  # grayscale refused
        (dict(x_train=np.concatenate([_images(6)] * 2, axis=-1)[..., :4]), ["x_train", "x 3"]),  # RGBA
        (dict(x_test=_images(3).astype(np.float32)), ["x_test", "uint8"]),
        (dict(y_train=np.array([0, 1, 2, 0, 1, 3])), ["y_train", "label 3", "[0, 3)"]),
        (dict(y_test=np.array([2, -1, 0])), ["y_test", "label -1"]),
        (dict(y_train=np.array([0, 1, 2, 0, 1, 2.0])), ["y_train", "integer"]),
        (dict(y_train=np.array([0, 1, 2, 0, 1])), ["x_train", "y_train", "6 images", "5 labels"]),
        (dict(x_train=_images(0), y_train=np.array([], dtype=np.int64)), ["x_train", "empty"]),
        (dict(x_test=_images(0), y_test=np.array([], dtype=np.int64)), ["x_test", "empty"]),
        (dict(x_test=_images(3, h=4)), ["x_train", "x_test", "one image size"]),
    ],
)
def test_npz_errors_name_file_and_key(tmp_path, override, fragments):
    path = write_npz(tmp_path / "bad.npz", **override)
    with pytest.raises(DataError) as e:
        load_dataset(path)
    msg = str(e.value)
    assert "bad.npz" in msg and "\n" not in msg
    for f in fragments:
        assert f in msg


def test_npz_with_pickled_objects_is_refused(tmp_path):
    path = write_npz(tmp_path / "obj.npz", class_names=np.array(["a", "b", 3], dtype=object))
    with pytest.raises(DataError, match="obj.npz"):
        load_dataset(path)


def test_missing_path_and_unknown_layout(tmp_path):
    with pytest.raises(DataError, match="nope.npz.*no such"):
        load_dataset(tmp_path / "nope.npz")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(DataError, match="notes.txt.*unknown data layout"):
        load_dataset(tmp_path / "notes.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty.*unknown data layout"):
        load_dataset(tmp_path / "empty")
    assert issubclass(DataError, ZoError)


# ----------------------------------------------------------------------------------------------
# EuroSAT folder layout


def test_eurosat_folder_split_is_stratified_and_deterministic(tmp_path):
    root = write_eurosat(tmp_path / "EuroSAT", per_class=(5, 10, 5))
    ds = load_dataset(root)
    assert ds.class_names == ["Class0", "Class1", "Class2"] and ds.name == "EuroSAT"
    assert ds.x_train.shape[1:] == (16, 16, 3) and ds.x_train.dtype == np.uint8
    # 20% of each class goes to test: 1, 2, 1.
    assert np.bincount(ds.y_test).tolist() == [1, 2, 1]
    assert np.bincount(ds.y_train).tolist() == [4, 8, 4]
    # Labels follow the sorted folder names: the red channel encodes the class (JPEG is lossy, so +-8).
    for x, y in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
        assert np.all(np.abs(x[:, 8, 8, 0].astype(int) - (40 + 80 * y)) <= 8)
    again = load_dataset(root)
    assert np.array_equal(again.x_test, ds.x_test) and np.array_equal(again.y_train, ds.y_train)
    other = load_dataset(root, seed=1)
    assert not np.array_equal(other.x_test[:, 0, 0, 1], ds.x_test[:, 0, 0, 1])  # green encodes file index
    half = load_dataset(root, test_fraction=0.5)
    assert np.bincount(half.y_test).tolist() == [2, 5, 2]  # round half to even: 2.5 -> 2


def test_eurosat_folder_reads_png_tif_and_grayscale(tmp_path):
    root = write_eurosat(tmp_path / "ds", per_class=(2, 2))
    Image.new("L", (16, 16), 90).save(root / "Class0" / "gray.png")  # promoted to RGB on load
    Image.new("RGB", (16, 16), (1, 2, 3)).save(root / "Class1" / "x.tif")
    (root / "Class1" / "README.txt").write_text("not an image")  # ignored
    ds = load_dataset(root)
    assert len(ds.y_train) + len(ds.y_test) == 6
    assert ds.x_train.shape[-1] == 3


def test_eurosat_folder_image_size_resizes_on_load(tmp_path):
    root = write_eurosat(tmp_path / "ds", per_class=(3, 3))
    Image.new("RGB", (20, 12), (0, 0, 0)).save(root / "Class0" / "odd.jpg")
    with pytest.raises(DataError, match="odd.jpg.*image_size"):
        load_dataset(root)
    ds = load_dataset(root, image_size=8)
    assert ds.x_train.shape[1:] == (8, 8, 3) and ds.x_test.shape[1:] == (8, 8, 3)


def test_eurosat_folder_errors(tmp_path):
    root = write_eurosat(tmp_path / "ds", per_class=(3, 3))
    (root / "EmptyClass").mkdir()
    with pytest.raises(DataError, match="EmptyClass.*no images"):
        load_dataset(root)
    (root / "EmptyClass").rmdir()

    (root / "Class1" / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DataError, match="broken.jpg.*cannot read"):
        load_dataset(root)
    (root / "Class1" / "broken.jpg").unlink()

    with pytest.raises(DataError, match="test_fraction"):
        load_dataset(root, test_fraction=1.0)

    single = write_eurosat(tmp_path / "single", per_class=(1, 1))  # nothing left for a test split
    with pytest.raises(DataError, match="single.*test split is empty"):
        load_dataset(single)


# ----------------------------------------------------------------------------------------------
# STL-10 binary layout


def test_stl10_layout_matches_official_loader(tmp_path):
    root, xs = write_stl10(tmp_path)
    ds = load_dataset(root)
    assert ds.name == "stl10" and ds.class_names == [f"c{i}" for i in range(10)]
    assert ds.x_train.shape == (3, 96, 96, 3) and ds.x_test.shape == (2, 96, 96, 3)
    assert ds.x_train[1, 5, 70, 1] == 200 and ds.x_train[1, 70, 5, 1] == 0
    assert ds.x_test[0, 90, 2, 2] == 77
    assert np.array_equal(ds.x_train, xs["train"]) and np.array_equal(ds.x_test, xs["test"])
    # Labels 1..10 on disk become 0..9.
    assert ds.y_train.tolist() == [0, 1, 9] and ds.y_test.tolist() == [2, 9]
    # The official stl10_input.py read_all_images, verbatim, agrees.
    raw = np.fromfile(root / "stl10_binary" / "train_X.bin", dtype=np.uint8)
    official = np.transpose(np.reshape(raw, (-1, 3, 96, 96)), (0, 3, 2, 1))
    assert np.array_equal(ds.x_train, official)
    # Pointing at stl10_binary/ itself works too; without class_names.txt the official names are used.
    (root / "stl10_binary" / "class_names.txt").unlink()
    ds2 = load_dataset(root / "stl10_binary")
    assert ds2.class_names[0] == "airplane" and ds2.num_classes == 10


def test_stl10_errors(tmp_path):
    root, _ = write_stl10(tmp_path / "a", labels_train=[1, 11, 2])
    with pytest.raises(DataError, match="train_y.bin.*label 11.*1..10"):
        load_dataset(root)

    root, _ = write_stl10(tmp_path / "b", labels_test=[0, 3])
    with pytest.raises(DataError, match="test_y.bin.*label 0"):
        load_dataset(root)

    root, _ = write_stl10(tmp_path / "c", labels_train=[1, 2])  # 3 images, 2 labels
    with pytest.raises(DataError, match="train_X.bin.*3 images.*train_y.bin.*2 labels"):
        load_dataset(root)

    root, _ = write_stl10(tmp_path / "d")
    (root / "stl10_binary" / "test_y.bin").unlink()
    with pytest.raises(DataError, match="test_y.bin.*missing"):
        load_dataset(root)

    root, _ = write_stl10(tmp_path / "e")
    with open(root / "stl10_binary" / "train_X.bin", "ab") as f:
        f.write(b"\0" * 10)
    with pytest.raises(DataError, match="train_X.bin.*whole number"):
        load_dataset(root)

    root, _ = write_stl10(tmp_path / "f", n_test=0, labels_test=[])
    with pytest.raises(DataError, match="test_X.bin is empty"):
        load_dataset(root)


# ----------------------------------------------------------------------------------------------
# resize, quantize, batches, subset


def test_resize_images():
    x = _images(4, 16, 16)
    assert resize_images(x, 16) is x  # no-op when the size already matches
    small = resize_images(x, (8, 4))
    assert small.shape == (4, 8, 4, 3) and small.dtype == np.uint8
    assert np.array_equal(small, resize_images(x, (8, 4)))  # deterministic
    flat = np.full((2, 10, 10, 3), 123, np.uint8)
    assert np.all(resize_images(flat, 7) == 123)  # bilinear keeps a constant image constant
    with pytest.raises(DataError, match="x.*N x H x W x 3"):
        resize_images(x[..., 0], 8)


def test_batches_cover_each_epoch_once():
    x, y = _images(10), np.arange(10)
    rng = np.random.default_rng(0)
    got = list(batches(x, y, 4, rng, epochs=2))
    assert [len(b[1]) for b in got] == [4, 4, 2, 4, 4, 2]
    e1, e2 = np.concatenate([b[1] for b in got[:3]]), np.concatenate([b[1] for b in got[3:]])
    assert sorted(e1) == list(range(10)) and sorted(e2) == list(range(10))
    assert not np.array_equal(e1, e2)  # a fresh permutation each epoch
    for bx, by in got:
        assert np.array_equal(bx, x[by])  # images stay with their labels
    same = [b[1] for b in batches(x, y, 4, np.random.default_rng(0), epochs=2)]
    assert all(np.array_equal(a, b[1]) for a, b in zip(same, got))
    assert [len(b[1]) for b in batches(x, y, 4, rng, drop_last=True)] == [4, 4]
    forever = batches(x, y, 3, rng, epochs=None)
    assert len([next(forever) for _ in range(25)]) == 25


def test_subset_is_balanced_and_deterministic():
    y = np.repeat(np.arange(3), [20, 10, 4])
    ds = Dataset(_images(len(y)), y, _images(9), np.repeat(np.arange(3), 3), ["a", "b", "c"], "t")
    sub = subset(ds, n_train=9, seed=0)
    assert np.bincount(sub.y_train).tolist() == [3, 3, 3]
    assert np.array_equal(sub.x_test, ds.x_test)  # None keeps the split
    sub2 = subset(ds, n_train=18)  # class c has only 4: the rest come from a and b
    assert np.bincount(sub2.y_train).tolist() == [7, 7, 4]
    again = subset(ds, n_train=9, seed=0)
    assert np.array_equal(again.x_train, sub.x_train)
    with pytest.raises(DataError, match="n_test=10.*1..9"):
        subset(ds, n_test=10)


# ----------------------------------------------------------------------------------------------
# The real shared data


def _shared_npz(name):
    path = SHARED / "data" / name
    if not path.exists():
        pytest.skip(f"REAL DATA NOT TESTED: {path} not found (set NPU_SHARED to the shared folder)")
    return path


def test_real_eurosat32():
    ds = load_dataset(_shared_npz("eurosat32_subset.npz"))
    assert ds.num_classes == 10 and ds.class_names[0] == "AnnualCrop" and ds.class_names[-1] == "SeaLake"
    assert ds.x_train.shape == (10000, 32, 32, 3) and ds.x_test.shape == (2000, 32, 32, 3)
    assert np.bincount(ds.y_train).tolist() == [1000] * 10 and np.bincount(ds.y_test).tolist() == [200] * 10


def test_resize_reproduces_shared_eurosat32_from_eurosat64():
    """The shared eurosat32 was made with a bilinear 64->32 resize; ours gives the same bytes."""
    small = np.load(_shared_npz("eurosat32_subset.npz"))
    big = np.load(_shared_npz("eurosat64_subset.npz"))
    where = {f: i for i, f in enumerate(small["files_train"])}
    pairs = [(where[f], j) for j, f in enumerate(big["files_train"]) if f in where][:20]
    assert pairs, "no images in common between eurosat32 and eurosat64"
    i, j = map(list, zip(*pairs))
    assert np.array_equal(resize_images(big["x_train"][j], 32), small["x_train"][i])
