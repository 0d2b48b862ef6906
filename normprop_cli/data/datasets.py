"""Data sets as whole uint8 tensors [N, 3, 32, 32] (SPEC section 5), by name: the registry.

Each split is one uint8 image tensor and one int64 label tensor, the cifar10-airbench way: move the
data set to the device once (`Dataset.to`), take batches as index slices of a seeded permutation
(engine.trainer.train_epoch), augment on the device (augment.py).

One module per source, each with its split rule: cifar.py (cifar10, cifar100), svhn.py, digits.py,
synthetic.py; what they share (Dataset, Split, DataError, DATA_FILES, the split helpers) is base.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import replace

import torch

from .base import DATA_FILES, DataError, Dataset, data_directory, seeded_generator
from .cifar import load_cifar10, load_cifar100
from .digits import load_digits
from .svhn import load_svhn
from .synthetic import load_synthetic

DATASETS: dict[str, Callable[..., Dataset]] = {
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "svhn": load_svhn,
    "digits": load_digits,
    "synthetic": load_synthetic,
}


def available_datasets(data_dir="data") -> dict[str, bool]:
    """Which data sets can be loaded without a download (files present; not checksummed)."""
    present = {}
    for name in DATASETS:
        if name in DATA_FILES:
            directory = data_directory(name, data_dir)
            present[name] = all((directory / f).is_file() for f in DATA_FILES[name][1])
        else:
            present[name] = True
    return present


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


def load_dataset(
    name: str,
    data_dir="data",
    download: bool = False,
    split_seed: int = 0,
    limit: int | None = None,
    **options,
) -> Dataset:
    """Load a data set by name; `options` go to its loader (e.g. svhn's `val_per_class`,
    synthetic's `sizes`). Raises DataError for an unknown, missing or corrupt data set."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    loader = DATASETS[name]
    allowed = set(inspect.signature(loader).parameters) - {"data_dir", "download", "split_seed"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        known = ", ".join(sorted(allowed)) or "none"
        raise DataError(f"unknown option {', '.join(unknown)} for dataset {name!r}; known: {known}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise DataError(f"limit must be a positive integer or None, got {limit!r}")
    ds = loader(data_dir=data_dir, download=download, split_seed=split_seed, **options)
    ds.info.setdefault("limit", None)
    return _limit(ds, limit, split_seed) if limit is not None else ds
