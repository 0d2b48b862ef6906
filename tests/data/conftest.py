"""Tiny CIFAR-10, CIFAR-100 and SVHN files in the real on-disk formats.

CIFAR: torchvision's python-version layout, one pickled dict per file with
b'data' (uint8 [N, 3072], channel-major rows) and b'labels' / b'fine_labels'.
SVHN: .mat files with X uint8 [32, 32, 3, N] and y [N, 1] in 1..10 (10 is digit 0).
Every writer returns the images it wrote as uint8 [N, 3, 32, 32] and the labels
the loader should give, so tests can find each loaded image in its source.
"""

import pickle

import numpy as np
import pytest
import scipy.io


def _images(rng, n):
    return rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)


def _pickle(path, d, bytes_keys=True):
    if not bytes_keys:  # what the original Python 2 pickles give with encoding="latin1"
        d = {k.decode(): v for k, v in d.items()}
    with open(path, "wb") as f:
        pickle.dump(d, f, protocol=2)


@pytest.fixture
def write_cifar10():
    """write_cifar10(root, n_per_batch=60, n_test=50) -> {"train": (x, y), "test": (x, y)}"""

    def write(root, n_per_batch=60, n_test=50, seed=0, bytes_keys=True):
        rng = np.random.default_rng(seed)
        d = root / "cifar-10-batches-py"
        d.mkdir(parents=True, exist_ok=True)
        written = {"train": [], "test": []}
        files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
        for name in files:
            n = n_test if name == "test_batch" else n_per_batch
            x, y = _images(rng, n), rng.integers(0, 10, size=n)
            entry = {
                b"batch_label": name.encode(),
                b"labels": [int(v) for v in y],
                b"data": x.reshape(n, 3072),
                b"filenames": [f"img_{i}.png".encode() for i in range(n)],
            }
            _pickle(d / name, entry, bytes_keys)
            written["test" if name == "test_batch" else "train"].append((x, y))
        return {k: tuple(np.concatenate(p) for p in zip(*v, strict=True)) for k, v in written.items()}

    return write


@pytest.fixture
def write_cifar100():
    """write_cifar100(root, n_train=200, n_test=40) -> {"train": (x, y), "test": (x, y)}"""

    def write(root, n_train=200, n_test=40, seed=0):
        rng = np.random.default_rng(seed)
        d = root / "cifar-100-python"
        d.mkdir(parents=True, exist_ok=True)
        written = {}
        for name, n in (("train", n_train), ("test", n_test)):
            x, fine = _images(rng, n), rng.integers(0, 100, size=n)
            entry = {
                b"filenames": [f"img_{i}.png".encode() for i in range(n)],
                b"batch_label": name.encode(),
                b"fine_labels": [int(v) for v in fine],
                b"coarse_labels": [int(v) // 5 for v in fine],
                b"data": x.reshape(n, 3072),
            }
            _pickle(d / name, entry)
            written[name] = (x, fine)
        return written

    return write


@pytest.fixture
def write_svhn():
    """write_svhn(root, per_class=(12, 8), n_test=30) -> {"train"|"extra"|"test": (x, y)}
    with per_class images of every class in train and extra; y as the loader gives it (0..9)."""

    def write(root, per_class=(12, 8), n_test=30, seed=0, splits=("train", "extra", "test")):
        rng = np.random.default_rng(seed)
        root.mkdir(parents=True, exist_ok=True)
        sizes = {"train": 10 * per_class[0], "extra": 10 * per_class[1], "test": n_test}
        written = {}
        for split in splits:
            n = sizes[split]
            digit = rng.permutation(np.arange(n) % 10)
            x = _images(rng, n)
            mat = {
                "X": np.ascontiguousarray(x.transpose(2, 3, 1, 0)),  # [N,C,H,W] -> [H,W,C,N]
                "y": np.where(digit == 0, 10, digit).astype(np.uint8).reshape(n, 1),
            }
            scipy.io.savemat(root / f"{split}_32x32.mat", mat)
            written[split] = (x, digit)
        return written

    return write
