"""Image classification data: loading, checking and resizing (zo/inputs.py maps them to a model's input).

Three layouts are read (see load_dataset):
  - a .npz with x_train, y_train, x_test, y_test (and optionally class_names), like /work/shared/data;
  - the EuroSAT public layout: one folder of images per class, split here into train/test;
  - the STL-10 binary layout: stl10_binary/{train,test}_{X,y}.bin.
Whatever the source, a Dataset holds uint8 NHWC RGB images and int64 labels in [0, num_classes),
and every problem is reported as one DataError line naming the file and the key or folder at fault.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from npusim.errors import numpy_load_error

from .errors import DataError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".tif", ".tiff")
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")

# STL-10: 96x96 RGB, 10 classes; the names are those of the official class_names.txt, used when the
# file is absent (the binary labels are 1..10 in this order).
STL10_SIDE = 96
STL10_CLASSES = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]


@dataclass
class Dataset:
    x_train: np.ndarray  # uint8 (N, H, W, 3) RGB
    y_train: np.ndarray  # int64 (N,) in [0, num_classes)
    x_test: np.ndarray
    y_test: np.ndarray
    class_names: list[str]
    name: str

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


# ----------------------------------------------------------------------------------------------
# Loading


def load_dataset(path, test_fraction: float = 0.2, seed: int = 0, image_size=None) -> Dataset:
    """Load a data set from a .npz file, a EuroSAT-style image folder or an STL-10 binary folder.

    test_fraction and seed only apply to the image-folder layout, which has no split of its own:
    each class is split separately (stratified), deterministically for a given seed.
    image_size (int or (height, width)), if given, resizes every image (bilinear) on load; an
    image folder whose images differ in size needs it.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.is_file():
        if path.suffix.lower() != ".npz":
            raise DataError(f"{path}: unknown data layout, expected a .npz file or a folder")
        ds = _load_npz(path)
    elif (stl_dir := _stl10_dir(path)) is not None:
        ds = _load_stl10(stl_dir)
    elif _class_folders(path):
        ds = _load_image_folder(path, test_fraction, seed, image_size)
    else:
        raise DataError(
            f"{path}: unknown data layout, expected a .npz file, a folder of per-class image folders "
            f"(EuroSAT) or a folder with stl10_binary/train_X.bin (STL-10)"
        )
    if image_size is not None:
        ds.x_train = resize_images(ds.x_train, image_size)
        ds.x_test = resize_images(ds.x_test, image_size)
    return ds


def _load_npz(path: Path) -> Dataset:
    try:
        # allow_pickle=False: a data file must never be able to run code on load.
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in NPZ_KEYS if k not in z.files]
            if missing:
                raise DataError(
                    f"{path}: missing key(s) {', '.join(missing)}, expected {', '.join(NPZ_KEYS)}"
                )
            arrays = {k: z[k] for k in NPZ_KEYS}
            names = z["class_names"] if "class_names" in z.files else None
    except DataError:
        raise
    except Exception as e:  # zip errors, pickled object arrays, truncated files ...
        raise DataError(f"{path}: cannot read as .npz: {numpy_load_error(path, e)}") from None

    where = str(path)
    for split in ("train", "test"):
        _check_images(arrays[f"x_{split}"], where, f"x_{split}")
        _check_labels_dtype(arrays[f"y_{split}"], where, f"y_{split}")
    if names is None:
        # Without names the labels themselves say how many classes there are.
        top = max(int(arrays["y_train"].max(initial=0)), int(arrays["y_test"].max(initial=0)))
        class_names = [str(i) for i in range(top + 1)]
    else:
        if names.ndim != 1 or names.dtype.kind not in "US":
            raise DataError(
                f"{path}: class_names has dtype {names.dtype} shape {names.shape}, expected a 1-D "
                "array of strings"
            )
        class_names = [str(n) for n in names]
    ds = Dataset(
        arrays["x_train"],
        arrays["y_train"].astype(np.int64),
        arrays["x_test"],
        arrays["y_test"].astype(np.int64),
        class_names,
        path.stem,
    )
    _check_dataset(ds, where, {k: k for k in NPZ_KEYS})
    return ds


def _stl10_dir(path: Path) -> Path | None:
    """The folder holding the STL-10 .bin files: path/stl10_binary or path itself."""
    for d in (path / "stl10_binary", path):
        if (d / "train_X.bin").is_file():
            return d
    return None


def _load_stl10(folder: Path) -> Dataset:
    files = {
        k: folder / f"{split}_{xy}.bin"
        for k, split, xy in [
            ("x_train", "train", "X"),
            ("y_train", "train", "y"),
            ("x_test", "test", "X"),
            ("y_test", "test", "y"),
        ]
    }
    for f in files.values():
        if not f.is_file():
            raise DataError(
                f"{f}: missing, expected STL-10 files train_X.bin, train_y.bin, test_X.bin, "
                f"test_y.bin in {folder}"
            )

    names_file = folder / "class_names.txt"
    class_names = STL10_CLASSES
    if names_file.is_file():
        class_names = [line.strip() for line in names_file.read_text().splitlines() if line.strip()]
        if not class_names:
            raise DataError(f"{names_file}: empty, expected one class name a line")

    arrays = {}
    for split in ("train", "test"):
        arrays[f"x_{split}"] = _read_stl10_images(files[f"x_{split}"])
        raw = np.fromfile(files[f"y_{split}"], dtype=np.uint8)
        # STL-10 labels are 1..K; 0 or >K would silently wrap or alias after the shift, so check first.
        bad = (raw < 1) | (raw > len(class_names))
        if bad.any():
            raise DataError(
                f"{files[f'y_{split}']}: label {int(raw[bad][0])} at index {int(np.argmax(bad))} "
                f"out of range, expected STL-10 labels 1..{len(class_names)}"
            )
        arrays[f"y_{split}"] = raw.astype(np.int64) - 1
    ds = Dataset(
        arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"], class_names, "stl10"
    )
    _check_dataset(ds, str(folder), {k: f.name for k, f in files.items()})
    return ds


def _read_stl10_images(f: Path) -> np.ndarray:
    raw = np.fromfile(f, dtype=np.uint8)
    per_image = 3 * STL10_SIDE * STL10_SIDE
    if raw.size % per_image:
        raise DataError(
            f"{f}: {raw.size} bytes is not a whole number of 3x96x96 STL-10 images ({per_image} bytes each)"
        )
    # Each image is stored channel by channel, each channel column-major (x outer, y inner).
    # Same as the official stl10_input.py: reshape(-1, 3, 96, 96) then transpose (0, 3, 2, 1),
    # which gives out[n, y, x, c] = raw[n, c, x, y].
    images = raw.reshape(-1, 3, STL10_SIDE, STL10_SIDE).transpose(0, 3, 2, 1)
    return np.ascontiguousarray(images)


def _class_folders(path: Path) -> list[Path]:
    """Sub-folders that hold at least one image file (hidden folders ignored)."""
    return [
        d
        for d in sorted(path.iterdir())
        if d.is_dir() and not d.name.startswith(".") and any(_image_files(d))
    ]


def _image_files(folder: Path) -> list[Path]:
    # Sorted so that the split does not depend on the file system's listing order.
    return sorted(
        f
        for f in folder.iterdir()
        if f.is_file() and not f.name.startswith(".") and f.suffix.lower() in IMAGE_SUFFIXES
    )


def _load_image_folder(path: Path, test_fraction: float, seed: int, image_size) -> Dataset:
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"{path}: test_fraction={test_fraction}, expected a value strictly between 0 and 1")
    # Class = every non-hidden sub-folder, in sorted order, so labels do not depend on which folders
    # happen to be empty: an empty class folder is an error, not a silently shifted label.
    class_dirs = [d for d in sorted(path.iterdir()) if d.is_dir() and not d.name.startswith(".")]
    rng = np.random.default_rng(seed)
    train, test = [], []  # (file, label)
    for label, d in enumerate(class_dirs):
        files = _image_files(d)
        if not files:
            raise DataError(
                f"{d}: class folder has no images, expected files ending in {', '.join(IMAGE_SUFFIXES)}"
            )
        order = rng.permutation(len(files))
        # At least one test and one train image per class when the class has two or more.
        n_test = min(len(files) - 1, max(1, round(len(files) * test_fraction))) if len(files) > 1 else 0
        test += [(files[i], label) for i in sorted(order[:n_test])]
        train += [(files[i], label) for i in sorted(order[n_test:])]

    size = None if image_size is None else _hw(image_size)
    x_train, y_train = _read_images(train, size)
    x_test, y_test = _read_images(test, size)
    ds = Dataset(x_train, y_train, x_test, y_test, [d.name for d in class_dirs], path.name)
    _check_dataset(
        ds,
        str(path),
        {"x_train": "train split", "y_train": "train split", "x_test": "test split", "y_test": "test split"},
    )
    return ds


def _read_images(
    items: list[tuple[Path, int]], size: tuple[int, int] | None
) -> tuple[np.ndarray, np.ndarray]:
    images = []
    for f, _ in items:
        try:
            with Image.open(f) as im:
                # convert("RGB") decodes palette/grayscale/RGBA files to 3 channels like the rest.
                im = im.convert("RGB")
                if size is not None and im.size != (size[1], size[0]):
                    im = im.resize((size[1], size[0]), Image.BILINEAR)
                a = np.asarray(im, dtype=np.uint8)
        except (UnidentifiedImageError, OSError, ValueError) as e:
            raise DataError(f"{f}: cannot read as an RGB image ({type(e).__name__}: {e})") from None
        if images and a.shape != images[0].shape:
            raise DataError(
                f"{f}: image is {a.shape[1]}x{a.shape[0]} but {items[0][0]} is "
                f"{images[0].shape[1]}x{images[0].shape[0]}, "
                f"expected one size (pass image_size= to resize on load)"
            )
        images.append(a)
    x = np.stack(images) if images else np.zeros((0, 1, 1, 3), np.uint8)
    y = np.array([label for _, label in items], dtype=np.int64)
    return x, y


# ----------------------------------------------------------------------------------------------
# Checks: one line each, naming the file (where) and the key or folder at fault (what).


def _check_images(x: np.ndarray, where: str, what: str) -> None:
    if x.ndim != 4 or x.shape[-1] != 3 or x.dtype != np.uint8:
        # Grayscale or RGBA arrays are refused rather than guessed at: the models take RGB.
        raise DataError(
            f"{where}: {what} has shape {x.shape} dtype {x.dtype}, expected N x H x W x 3 uint8 RGB images"
        )


def _check_labels_dtype(y: np.ndarray, where: str, what: str) -> None:
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise DataError(
            f"{where}: {what} has shape {y.shape} dtype {y.dtype}, expected a 1-D array of integer labels"
        )


def _check_dataset(ds: Dataset, where: str, what: dict[str, str]) -> None:
    """Shapes, lengths, label range, non-empty splits; what maps x_train.. to the name the user knows."""
    if ds.num_classes < 1:
        raise DataError(f"{where}: no classes")
    for split in ("train", "test"):
        x, y = getattr(ds, f"x_{split}"), getattr(ds, f"y_{split}")
        xk, yk = what[f"x_{split}"], what[f"y_{split}"]
        _check_images(x, where, xk)
        _check_labels_dtype(y, where, yk)
        if len(x) != len(y):
            raise DataError(
                f"{where}: {xk} has {len(x)} images but {yk} has {len(y)} labels, expected the same number"
            )
        if len(x) == 0:
            raise DataError(f"{where}: {xk} is empty, expected at least one {split} image")
        bad = (y < 0) | (y >= ds.num_classes)
        if bad.any():
            i = int(np.argmax(bad))
            raise DataError(
                f"{where}: {yk} has label {int(y[i])} at index {i}, expected labels in [0, {ds.num_classes})"
            )
    if ds.x_train.shape[1:] != ds.x_test.shape[1:]:
        raise DataError(
            f"{where}: {what['x_train']} images are {ds.x_train.shape[1:]} but {what['x_test']} images are "
            f"{ds.x_test.shape[1:]}, expected one image size"
        )


# ----------------------------------------------------------------------------------------------
# Preprocessing


def _hw(size) -> tuple[int, int]:
    h, w = (size, size) if np.isscalar(size) else tuple(size)
    if int(h) < 1 or int(w) < 1:
        raise DataError(f"image size {size}: expected positive height and width")
    return int(h), int(w)


def resize_images(x: np.ndarray, size) -> np.ndarray:
    """Resize a uint8 (N, H, W, 3) batch to size = side or (height, width), bilinear.

    Pillow's BILINEAR (which widens its filter when shrinking, so down-scaling averages rather
    than aliases); deterministic, and it reproduces /work/shared/data/eurosat32 from eurosat64.
    Returns x itself when it already has that size.
    """
    _check_images(x, "resize_images", "x")
    h, w = _hw(size)
    if x.shape[1:3] == (h, w):
        return x
    out = np.empty((len(x), h, w, 3), dtype=np.uint8)
    for i, img in enumerate(x):
        out[i] = np.asarray(Image.fromarray(img).resize((w, h), Image.BILINEAR))
    return out


# ----------------------------------------------------------------------------------------------
# Batches and subsets


def batches(
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int,
    rng: np.random.Generator,
    epochs: int | None = 1,
    drop_last: bool = False,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield shuffled (x, y) mini-batches: each epoch is a fresh permutation drawn from rng.

    epochs=None repeats forever (for step-budgeted training). drop_last skips the last, shorter
    batch of an epoch, for code that needs a fixed batch shape.
    """
    if len(x) != len(y):
        raise DataError(f"batches: x has {len(x)} images but y has {len(y)} labels, expected the same number")
    if batch_size < 1:
        raise DataError(f"batches: batch_size {batch_size}, expected >= 1")
    if len(x) == 0 or (drop_last and len(x) < batch_size):
        return  # nothing to yield; avoids an endless loop with epochs=None
    epoch = 0
    while epochs is None or epoch < epochs:
        perm = rng.permutation(len(x))
        for start in range(0, len(x), batch_size):
            idx = perm[start : start + batch_size]
            if drop_last and len(idx) < batch_size:
                break
            yield x[idx], y[idx]
        epoch += 1


def _stratified_pick(y: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n indices spread over classes as evenly as their sizes allow, in ascending order.

    Shuffle, rank each sample within its class in shuffled order, then take the n lowest ranks
    (ties broken by the shuffle): every class gets its k-th sample before any class its (k+1)-th.
    """
    perm = rng.permutation(len(y))
    rank = np.empty(len(y), dtype=np.int64)
    for c in np.unique(y):
        members = perm[y[perm] == c]
        rank[members] = np.arange(len(members))
    order = perm[np.argsort(rank[perm], kind="stable")]
    return np.sort(order[:n])


def subset(dataset: Dataset, n_train: int | None = None, n_test: int | None = None, seed: int = 0) -> Dataset:
    """A deterministic, class-balanced subset: n_train / n_test images (None keeps the whole split)."""
    rng = np.random.default_rng(seed)
    parts = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x, y = getattr(dataset, f"x_{split}"), getattr(dataset, f"y_{split}")
        if n is None:
            parts[split] = (x, y)
            continue
        if not 1 <= n <= len(y):
            raise DataError(f"{dataset.name}: n_{split}={n}, expected 1..{len(y)} (the {split} split's size)")
        idx = _stratified_pick(y, n, rng)
        parts[split] = (x[idx], y[idx])
    return Dataset(*parts["train"], *parts["test"], list(dataset.class_names), dataset.name)
