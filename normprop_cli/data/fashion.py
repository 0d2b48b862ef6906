"""fashion-mnist: Fashion-MNIST (Xiao, Rasul and Vollgraf 2017), 70,000 real 28x28 grey images of 10
classes of clothing, as the four IDX files of torchvision's `FashionMNIST/raw/` layout.

Where the files are read from, first found wins (each file gzipped or not):
  1. `<data_dir>/FashionMNIST/raw/` (torchvision's layout; `--download` fetches into it),
  2. `/usr/share/datasets/fashion-mnist/`, where the Debian/Ubuntu package `dataset-fashion-mnist`
     installs them (`apt-get install dataset-fashion-mnist`).

How the images enter the NIN: each 28x28 image is zero-padded by 2 pixels on every side to 32x32 (the
background of Fashion-MNIST is 0, so padding adds background, never stretches an item), one channel;
the NIN's first convolution takes 1 input channel. Split: val = 5,000 of the 60,000 training images
by a seeded permutation (split_seed), train = the other 55,000, test = the 10,000 test images.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch

from .base import (
    DataError,
    Dataset,
    Split,
    SplitSizes,
    error_text,
    indices_sha1,
    make_dataset,
    random_split,
    register_dataset,
    seeded_generator,
)

NAME = "fashion-mnist"
SUBDIR = Path("FashionMNIST") / "raw"  # under data_dir: torchvision's layout
SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")  # the Debian/Ubuntu package dataset-fashion-mnist
FILES = {  # part -> the IDX file's stem (".gz" optional)
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
VAL_SIZE = 5000
TRAIN_FILE_SIZE, TEST_FILE_SIZE = 60_000, 10_000  # the published files' images
PAD = 2  # 28 + 2 * 2 = 32, the input size the NIN's pooling arithmetic expects
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
INSTALL_HINT = "apt-get install dataset-fashion-mnist (Debian/Ubuntu), or run with --download"

_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (LeCun's MNIST format; gzipped when its name ends in .gz) as a numpy array.

    Header: two zero bytes, a type code, the number of dimensions d, then d big-endian uint32 sizes.
    Raises ValueError for a file that is not one (bad magic, unknown type, wrong length)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError("not an IDX file (bad magic number)")
    code, ndim = data[2], data[3]
    if code not in _IDX_TYPES:
        raise ValueError(f"unknown IDX type code 0x{code:02X}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError("truncated IDX header")
    shape = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_TYPES[code])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) - header != expected:
        raise ValueError(f"{len(data) - header} bytes of data for shape {shape}, expected {expected}")
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write `array` (uint8 images or labels) as an IDX file, gzipped when the name ends in .gz: the
    inverse of read_idx, for tests and small fixtures."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    opener = gzip.open if Path(path).suffix == ".gz" else open
    with opener(path, "wb") as f:
        f.write(header + array.tobytes())


def _find(directory: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            return directory / name
    return None


def search_dirs(data_dir) -> list[Path]:
    """Where the files are looked for, in order: the data directory's torchvision layout, then the
    Debian package's directory."""
    return [Path(data_dir).expanduser().resolve() / SUBDIR, SYSTEM_DIR]


def locate(data_dir) -> dict[str, Path] | None:
    """The four files from the first directory that holds all of them, else None."""
    for directory in search_dirs(data_dir):
        found = {part: _find(directory, stem) for part, stem in FILES.items()}
        if all(found.values()):
            return found
    return None


def _missing(data_dir) -> DataError:
    where = " or ".join(str(d) for d in search_dirs(data_dir))
    files = ", ".join(f"{stem}[.gz]" for stem in FILES.values())
    return DataError(f"{NAME} data set not found: expected {files} in {where}; install it with {INSTALL_HINT}")


def _download(data_dir) -> None:
    from torchvision.datasets import FashionMNIST

    try:
        FashionMNIST(root=str(Path(data_dir).expanduser()), train=True, download=True)
    except Exception as exc:  # network, disk, checksum: all mean "no data set"
        raise DataError(
            f"{NAME} download into {search_dirs(data_dir)[0]} failed ({error_text(exc)}); check the network, "
            f"or install it with apt-get install dataset-fashion-mnist"
        ) from exc


def _read_pair(images: Path, labels: Path) -> Split:
    try:
        x, y = read_idx(images), read_idx(labels)
    except Exception as exc:
        bad = images if "images" in str(exc) else labels
        raise DataError(f"{NAME} data set is corrupt: cannot read {bad.name} in {bad.parent} ({error_text(exc)}); "
                        f"install it again with {INSTALL_HINT}") from exc  # fmt: skip
    if x.dtype != np.uint8 or x.ndim != 3 or x.shape[1:] != (28, 28) or len(x) == 0:
        raise DataError(
            f"{NAME} data set is corrupt: {images.name} holds {x.dtype} {x.shape}, expected uint8 [N, 28, 28]"
        )
    if y.shape != (len(x),) or (len(y) and int(y.max()) >= len(CLASSES)):
        top = int(y.max()) if len(y) else "-"
        raise DataError(
            f"{NAME} data set is corrupt: {labels.name} holds {y.shape} labels (values up to {top}) "
            f"for {len(x)} images, expected one of 0..9 each"
        )
    images_t = torch.nn.functional.pad(torch.from_numpy(x.copy()).unsqueeze(1), (PAD, PAD, PAD, PAD))
    return Split(images_t.contiguous(), torch.from_numpy(y.astype(np.int64)))


def load_fashion_mnist(data_dir="data", download: bool = False, split_seed: int = 0) -> Dataset:
    if download and locate(data_dir) is None:
        _download(data_dir)
    files = locate(data_dir)
    if files is None:
        raise _missing(data_dir)
    full = _read_pair(files["train_images"], files["train_labels"])
    test = _read_pair(files["test_images"], files["test_labels"])
    n_val = min(VAL_SIZE, len(full) // 12)  # 5,000 of the real 60,000; a small file keeps 1/12
    train_idx, val_idx = random_split(len(full), n_val, seeded_generator(split_seed))
    return make_dataset(
        NAME,
        full.subset(train_idx),
        full.subset(val_idx),
        test,
        len(CLASSES),
        split_seed,
        source_dir=str(files["train_images"].parent),
        source_files=[p.name for p in files.values()],
        source_sizes={"train": len(full), "test": len(test)},
        input="28x28 grey, zero-padded by 2 pixels to 1x32x32",
        split_rule=(
            f"val = {n_val} of the training images: torch.randperm(n_train, "
            "generator=torch.Generator().manual_seed(split_seed))[:n_val]; train = the rest; "
            "test = the 10,000 test images; indices ascending"
        ),
        val_indices_sha1=indices_sha1(val_idx),
    )


def fashion_sizes() -> SplitSizes:
    return SplitSizes(TRAIN_FILE_SIZE - VAL_SIZE, VAL_SIZE, TEST_FILE_SIZE, (1, 32, 32))  # 28x28 padded by PAD


register_dataset(NAME, load_fashion_mnist, sizes=fashion_sizes, present=lambda data_dir: locate(data_dir) is not None)
