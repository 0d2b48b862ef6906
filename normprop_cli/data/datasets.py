"""Data sets as whole uint8 tensors [N, C, 32, 32], by name: the registry.

Each split is one uint8 image tensor and one int64 label tensor, the cifar10-airbench way: move the
data set to the device once (`Dataset.to`), take batches as index slices of a seeded permutation
(engine.trainer.train_epoch), augment on the device (augment.py).

One module per source, each with its split rule, which declares its data sets beside its loader
(base.register_dataset: the loader, its split sizes for the plan, whether its files are here): cifar.py
(cifar10, cifar100), svhn.py, digits.py, fashion.py (fashion-mnist), synthetic.py; what they share (Dataset,
Split, DataError, DATA_FILES, the registry, the split helpers) is base.py. Importing this module imports each
of them, which fills the registry.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import torch

from .base import DATASETS, PRESENT, DataError, Dataset, seeded_generator

# Importing a source module declares its data sets, in the order of these imports (DATASETS's, which
# `normprop info` lists); their loaders are also taken from here.
# isort: off
from .cifar import load_cifar10, load_cifar100
from .svhn import load_svhn
from .digits import load_digits
from .fashion import load_fashion_mnist
from .synthetic import load_synthetic

# isort: on

__all__ = [
    "DATASETS",
    "available_datasets",
    "load_cifar10",
    "load_cifar100",
    "load_digits",
    "load_dataset",
    "load_fashion_mnist",
    "load_svhn",
    "load_synthetic",
]


def available_datasets(data_dir="data") -> dict[str, bool]:
    """Which data sets can be loaded without a download (files present; not checksummed)."""
    return {name: PRESENT[name](data_dir) for name in DATASETS}


def _limit(ds: Dataset, limit: int, split_seed: int) -> Dataset:
    """At most `limit` examples per split: a seeded random subset, in the original order."""
    g = seeded_generator(split_seed)
    splits = {}
    for s in ("train", "val", "test"):
        split = getattr(ds, s)
        if len(split) > limit:
            split = split.subset(torch.randperm(len(split), generator=g)[:limit].sort().values)
        splits[s] = split
    info = {
        **ds.info,
        "limit": limit,
        "full_sizes": ds.info["sizes"],
        "sizes": {s: len(split) for s, split in splits.items()},
    }
    return replace(ds, info=info, **splits)


def _train_subset(ds: Dataset, n: int, split_seed: int) -> Dataset:
    """The first `n` images of a seeded permutation of the training split (in the original order);
    validation and test stay whole."""
    if n >= len(ds.train):
        return ds
    index = torch.randperm(len(ds.train), generator=seeded_generator(split_seed + 1))[:n].sort().values
    info = {**ds.info, "train_limit": n, "full_train": len(ds.train), "sizes": {**ds.info["sizes"], "train": n}}
    return replace(ds, train=ds.train.subset(index), info=info)


def _positive(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise DataError(f"{name} must be a positive integer or None, got {value!r}")


def load_dataset(
    name: str,
    data_dir="data",
    download: bool = False,
    split_seed: int = 0,
    limit: int | None = None,
    train_limit: int | None = None,
    **options,
) -> Dataset:
    """Load a data set by name; `options` go to its loader (e.g. svhn's `val_per_class`,
    synthetic's `sizes`). `limit` keeps at most that many examples of every split; `train_limit` at
    most that many training images (a seeded subset), validation and test whole.
    Raises DataError for an unknown, missing or corrupt data set."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    loader = DATASETS[name]
    allowed = set(inspect.signature(loader).parameters) - {"data_dir", "download", "split_seed"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        known = ", ".join(sorted(allowed)) or "none"
        raise DataError(f"unknown option {', '.join(unknown)} for dataset {name!r}; known: {known}")
    _positive("limit", limit)
    _positive("train_limit", train_limit)
    ds = loader(data_dir=data_dir, download=download, split_seed=split_seed, **options)
    ds.info.setdefault("limit", None)
    ds = _limit(ds, limit, split_seed) if limit is not None else ds
    return _train_subset(ds, train_limit, split_seed) if train_limit is not None else ds
