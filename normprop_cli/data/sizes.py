"""The split sizes and image shape of each data set, known without loading it (`normprop run --dry-run`
plans a run on data that need not be on this machine): the published file sizes through each loader's
split rule, the seeded subsets (`limit`, `train_limit`) applied as load_dataset applies them."""

from __future__ import annotations

import inspect
from typing import NamedTuple

from . import digits, fashion
from .cifar import cifar_val_size
from .svhn import load_svhn
from .synthetic import load_synthetic

# The published files' sizes; each loader's split rule (its own constants and defaults) is read from it.
CIFAR_TRAIN_FILES, CIFAR_TEST = 50_000, 10_000  # CIFAR-10 and CIFAR-100 alike (section 5)
SVHN_TRAIN, SVHN_EXTRA, SVHN_TEST = 73_257, 531_131, 26_032
FASHION_TRAIN_FILES, FASHION_TEST = 60_000, 10_000
DIGITS_ALL = 1_797  # scikit-learn's digits


class SplitSizes(NamedTuple):
    train: int
    val: int
    test: int
    shape: tuple[int, int, int]  # one image: channels, height, width

    @property
    def shape_text(self) -> str:
        return "x".join(map(str, self.shape))


def _default(loader, parameter: str):
    """A loader's default for one of its parameters (its split rule)."""
    return inspect.signature(loader).parameters[parameter].default


def _full(name: str) -> SplitSizes:
    rgb, grey = (3, 32, 32), (1, 32, 32)
    if name in ("cifar10", "cifar100"):
        val = cifar_val_size(CIFAR_TRAIN_FILES)
        return SplitSizes(CIFAR_TRAIN_FILES - val, val, CIFAR_TEST, rgb)
    if name == "svhn":
        val = 10 * sum(_default(load_svhn, "val_per_class"))  # per class from (train, extra), 10 classes
        return SplitSizes(SVHN_TRAIN + SVHN_EXTRA - val, val, SVHN_TEST, rgb)
    if name == "fashion-mnist":
        return SplitSizes(FASHION_TRAIN_FILES - fashion.VAL_SIZE, fashion.VAL_SIZE, FASHION_TEST, grey)
    if name == "digits":
        val, test = digits._DIGITS_VAL, digits._DIGITS_TEST
        return SplitSizes(DIGITS_ALL - val - test, val, test, rgb)
    if name == "synthetic":
        return SplitSizes(*_default(load_synthetic, "sizes"), rgb)
    raise ValueError(f"no split sizes known for data set {name!r}")


def split_sizes(name: str, limit: int | None = None, train_limit: int | None = None) -> SplitSizes:
    """(train, val, test, shape) of data set `name` as load_dataset gives it with `limit` (at most
    that many per split) and `train_limit` (at most that many training images); a ValueError for a
    data set without known sizes."""
    s = _full(name)
    if limit is not None:
        s = s._replace(train=min(s.train, int(limit)), val=min(s.val, int(limit)), test=min(s.test, int(limit)))
    if train_limit is not None:
        s = s._replace(train=min(s.train, int(train_limit)))
    return s
