"""CIFAR-10 and CIFAR-100: torchvision's python-version pickles.

val = min(5000, n_train // 10) images of the training files drawn by a seeded permutation, train = the
rest, test = the test file. On the real files that is the paper's 45,000 / 5,000 / 10,000 (section 5);
smaller files keep 10 % for validation.

The pickles are read by `_BatchUnpickler`, which builds dicts, lists, strings, bytes and numbers (pickle's
own opcodes) and numpy arrays, and nothing else: a pickle that names any other class or function (the way
a pickle runs code) is refused as a corrupt data set before anything is called.
"""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path

import numpy as np
import torch

from .base import (
    DATA_FILES,
    Dataset,
    Split,
    SplitSizes,
    corrupt_error,
    error_text,
    fetch_missing,
    indices_sha1,
    make_dataset,
    random_split,
    register_dataset,
    require_files,
    seeded_generator,
)

TRAIN_FILES_SIZE, TEST_SIZE = 50_000, 10_000  # the published files, CIFAR-10's and CIFAR-100's alike (section 5)

_CIFAR = {  # name -> (train files, test files, label key, classes, torchvision class)
    "cifar10": (DATA_FILES["cifar10"][1][:5], ("test_batch",), "labels", 10, "CIFAR10"),
    "cifar100": (("train",), ("test",), "fine_labels", 100, "CIFAR100"),
}


def cifar_val_size(n_train: int) -> int:
    """Validation images taken from the CIFAR training files: 5,000 of 50,000, else 10 %."""
    return min(5000, n_train // 10)


def _entry(d, key: str):
    """A value of a CIFAR dict: str keys when read with latin1 from the original
    Python 2 pickles, bytes keys (b'data') when written by Python 3."""
    for k in (key, key.encode()):
        if k in d:
            return d[k]
    raise KeyError(f"no {key!r} entry")


def _numpy_module(name: str):
    """numpy's `_core.<name>` (numpy 2) or `core.<name>` (numpy 1), without the deprecated alias's warning."""
    try:
        return importlib.import_module(f"numpy._core.{name}")
    except ImportError:
        return importlib.import_module(f"numpy.core.{name}")


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """`_codecs.encode(text, "latin1")`, how Python 3 writes bytes under pickle protocols 0-2; no other codec."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"refused _codecs.encode of {type(text).__name__} to {encoding!r}")
    return text.encode("latin1")


_multiarray, _numeric = _numpy_module("multiarray"), _numpy_module("numeric")
# What a CIFAR batch names, and numpy needs to rebuild its arrays: ndarray.__reduce__ (_reconstruct, then
# __setstate__ with a dtype and the bytes), under numpy 1's and numpy 2's module names, and protocol 5's
# _frombuffer; and bytes as Python 3 writes them under protocols 0-2. Nothing here runs anything but
# numpy's own array construction and a latin-1 encoding.
_ALLOWED_GLOBALS = {
    ("_codecs", "encode"): _latin1_bytes,
    **{(f"numpy.{core}.multiarray", "_reconstruct"): _multiarray._reconstruct for core in ("core", "_core")},
    **{(f"numpy.{core}.numeric", "_frombuffer"): _numeric._frombuffer for core in ("core", "_core")},
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class _BatchUnpickler(pickle.Unpickler):
    """pickle.Unpickler that admits only `_ALLOWED_GLOBALS`: a CIFAR batch, never code."""

    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED_GLOBALS[module, name]
        except KeyError:
            raise pickle.UnpicklingError(f"refused {module}.{name}: not part of a CIFAR batch") from None


def _read_cifar(name: str, path: Path, label_key: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as f:
            d = _BatchUnpickler(f, encoding="latin1").load()
        data = np.asarray(_entry(d, "data"))
        labels = np.asarray(_entry(d, label_key), dtype=np.int64)
    except Exception as exc:
        raise corrupt_error(name, path, error_text(exc)) from exc
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(data) == 0:
        raise corrupt_error(name, path, f"data is {data.dtype} {data.shape}, expected uint8 [N, 3072]")
    if labels.shape != (len(data),):
        raise corrupt_error(name, path, f"{len(data)} images but labels of shape {labels.shape}")
    if labels.min() < 0 or labels.max() >= num_classes:
        raise corrupt_error(name, path, f"labels outside 0..{num_classes - 1}")
    return data.reshape(-1, 3, 32, 32), labels


def _load_cifar(name: str, data_dir, download: bool, split_seed: int) -> Dataset:
    train_files, test_files, label_key, num_classes, tv_class = _CIFAR[name]
    if download:
        import torchvision.datasets as tvd

        cls = getattr(tvd, tv_class)
        md5s = dict(cls.train_list + cls.test_list)
        fetch_missing(
            name,
            data_dir,
            md5s,
            lambda bad: cls(root=str(Path(data_dir)), train=True, download=True),
        )
    directory = require_files(name, data_dir)

    def read(files):
        parts = [_read_cifar(name, directory / f, label_key, num_classes) for f in files]
        x = torch.from_numpy(np.concatenate([p[0] for p in parts]))
        return x, torch.from_numpy(np.concatenate([p[1] for p in parts]))

    full, test = Split(*read(train_files)), Split(*read(test_files))
    train_idx, val_idx = random_split(len(full), cifar_val_size(len(full)), seeded_generator(split_seed))
    return make_dataset(
        name,
        full.subset(train_idx),
        full.subset(val_idx),
        test,
        num_classes,
        split_seed,
        source_dir=str(directory),
        source_files=list(train_files + test_files),
        source_sizes={"train": len(full), "test": len(test)},
        split_rule=(
            "val = min(5000, n_train // 10) images of the training files: "
            "torch.randperm(n_train, generator=torch.Generator().manual_seed(split_seed))[:n_val]; "
            "train = the rest; indices ascending"
        ),
        val_indices_sha1=indices_sha1(val_idx),
    )


def load_cifar10(data_dir="data", download: bool = False, split_seed: int = 0) -> Dataset:
    return _load_cifar("cifar10", data_dir, download, split_seed)


def load_cifar100(data_dir="data", download: bool = False, split_seed: int = 0) -> Dataset:
    return _load_cifar("cifar100", data_dir, download, split_seed)


def cifar_sizes() -> SplitSizes:
    val = cifar_val_size(TRAIN_FILES_SIZE)
    return SplitSizes(TRAIN_FILES_SIZE - val, val, TEST_SIZE, (3, 32, 32))


register_dataset("cifar10", load_cifar10, sizes=cifar_sizes)
register_dataset("cifar100", load_cifar100, sizes=cifar_sizes)
