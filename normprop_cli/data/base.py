"""What every data set loader shares: the Dataset and Split types, the registry (`register_dataset`), the files
each expects on disk with the one-line errors about them, and the seeded splitting helpers.

Splits are drawn with CPU `torch.Generator`s seeded with `split_seed`, so they are the same on every
machine and device; `Dataset.info` records the rule.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import torch


class DataError(ValueError):
    """A missing, corrupt or unknown data set. The message is one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


@dataclass
class Split:
    """x: uint8 images [N, C, H, W]; y: int64 labels [N]."""

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self):
        if self.x.dtype != torch.uint8 or self.x.dim() != 4:
            raise ValueError(f"Split.x must be uint8 [N, C, H, W], got {self.x.dtype} {tuple(self.x.shape)}")
        if self.y.dtype != torch.int64 or self.y.shape != self.x.shape[:1]:
            raise ValueError(f"Split.y must be int64 [{len(self.x)}], got {self.y.dtype} {tuple(self.y.shape)}")

    def __len__(self) -> int:
        return self.x.shape[0]

    def to(self, device, non_blocking: bool = False) -> Split:
        return Split(
            self.x.to(device, non_blocking=non_blocking),
            self.y.to(device, non_blocking=non_blocking),
        )

    def subset(self, index: torch.Tensor) -> Split:
        return Split(self.x[index], self.y[index])


@dataclass
class Dataset:
    name: str
    train: Split
    val: Split
    test: Split
    num_classes: int
    in_channels: int = 3
    info: dict = field(default_factory=dict)  # JSON-serialisable: sizes, seed, sources, split rule

    def to(self, device, non_blocking: bool = False) -> Dataset:
        moved = {s: getattr(self, s).to(device, non_blocking) for s in ("train", "val", "test")}
        return replace(self, **moved)


class SplitSizes(NamedTuple):
    """A data set's split sizes and image shape as its loader gives them, known without loading it."""

    train: int
    val: int
    test: int
    shape: tuple[int, int, int]  # one image: channels, height, width

    @property
    def shape_text(self) -> str:
        return "x".join(map(str, self.shape))


# ---------------------------------------------------------------------------
# the registry: each data set declared beside its loader, in its own module

DATASETS: dict[str, Callable[..., Dataset]] = {}  # name -> loader, in the order the modules declare them
FULL_SIZES: dict[str, Callable[[], SplitSizes]] = {}  # name -> its whole splits' sizes (data.sizes)
PRESENT: dict[str, Callable[[object], bool]] = {}  # name -> whether its files are under data_dir


def register_dataset(
    name: str,
    loader: Callable[..., Dataset],
    sizes: Callable[[], SplitSizes],
    present: Callable[[object], bool] | None = None,
) -> None:
    """Declare data set `name`. `loader(data_dir=, download=, split_seed=, **options)` loads it (load_dataset
    adds `limit` and `train_limit`); `sizes()` gives its splits' sizes and image shape from the published files'
    sizes through the loader's own split rule, nothing read (the plan prices runs on data that need not be on
    this machine); `present(data_dir)` says whether its files are there without a download (default: the files
    DATA_FILES lists for it, or always for a data set made in memory)."""
    DATASETS[name] = loader
    FULL_SIZES[name] = sizes
    PRESENT[name] = present or (lambda data_dir: _files_present(name, data_dir))


def loader_default(loader: Callable, parameter: str):
    """A loader's default for one of its parameters: a split rule that `sizes` reads rather than repeats."""
    return inspect.signature(loader).parameters[parameter].default


def _files_present(name: str, data_dir) -> bool:
    if name not in DATA_FILES:
        return True
    directory = data_directory(name, data_dir)
    return all((directory / f).is_file() for f in DATA_FILES[name][1])


# ---------------------------------------------------------------------------
# files on disk and the one-line errors about them

#: name -> (sub-directory of data_dir, files expected there). Torchvision's layout.
DATA_FILES: dict[str, tuple[str, tuple[str, ...]]] = {
    "cifar10": (
        "cifar-10-batches-py",
        tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",),
    ),
    "cifar100": ("cifar-100-python", ("train", "test")),
    "svhn": ("", ("train_32x32.mat", "extra_32x32.mat", "test_32x32.mat")),
}

_REQUIRED_NOTE = {  # why a file that some setups skip is needed
    "extra_32x32.mat": "extra_32x32.mat is required: the paper's SVHN protocol takes 200 "
    "validation images per class from it and trains on the rest of it",
}


def data_directory(name: str, data_dir) -> Path:
    """Where a data set's files are expected under data_dir."""
    return Path(data_dir).expanduser().resolve() / DATA_FILES[name][0]


def _missing_error(name: str, directory: Path, missing: list[str]) -> DataError:
    files = DATA_FILES[name][1]
    if not directory.is_dir():
        what = "the directory does not exist"
    elif len(missing) == len(files):
        what = "none of them is there"
    else:
        what = f"missing: {', '.join(missing)}"
    note = "".join(f"; {_REQUIRED_NOTE[f]}" for f in missing if f in _REQUIRED_NOTE)
    return DataError(
        f"{name} data set not found: expected {', '.join(files)} in {directory} ({what}){note}; "
        "run with --download to fetch it"
    )


def corrupt_error(name: str, path: Path, reason: str) -> DataError:
    """The one-line error for a file that is there but cannot be read as the data set."""
    files = ", ".join(DATA_FILES[name][1])
    return DataError(
        f"{name} data set is corrupt: cannot read {path.name} ({reason}); "
        f"expected {files} in {path.parent}; run with --download to fetch it again"
    )


def error_text(exc: BaseException, limit: int = 200) -> str:
    """An exception as one short line, for the reason in a DataError."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def require_files(name: str, data_dir) -> Path:
    """The data set's directory, or the one-line error naming the files that are missing."""
    directory = data_directory(name, data_dir)
    missing = [f for f in DATA_FILES[name][1] if not (directory / f).is_file()]
    if missing:
        raise _missing_error(name, directory, missing)
    return directory


def fetch_missing(name: str, data_dir, md5s: dict[str, str], fetch: Callable[[list[str]], None]):
    """Fetch through torchvision unless every file is already there and intact."""
    from torchvision.datasets.utils import check_integrity

    directory = data_directory(name, data_dir)
    bad = [f for f in DATA_FILES[name][1] if not check_integrity(str(directory / f), md5s[f])]
    if not bad:
        return
    try:
        fetch(bad)
    except Exception as exc:  # network, disk, checksum: all mean "no data set"
        files = ", ".join(DATA_FILES[name][1])
        raise DataError(
            f"{name} download into {directory} failed ({error_text(exc)}); "
            f"check the network, or put {files} in {directory} by hand"
        ) from exc


# ---------------------------------------------------------------------------
# splitting


def seeded_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def _complement(n: int, index: torch.Tensor) -> torch.Tensor:
    keep = torch.ones(n, dtype=torch.bool)
    keep[index] = False
    return keep.nonzero().flatten()


def indices_sha1(*indices: torch.Tensor) -> str:
    """A fingerprint of a split's indices, recorded in `Dataset.info`."""
    h = hashlib.sha1()
    for index in indices:
        h.update(index.to(torch.int64).numpy().tobytes())
    return h.hexdigest()


def random_split(n: int, n_val: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, val) indices of a seeded permutation, each in ascending order."""
    perm = torch.randperm(n, generator=generator)
    return perm[n_val:].sort().values, perm[:n_val].sort().values


def per_class_split(y: torch.Tensor, per_class: int, num_classes: int, generator: torch.Generator):
    """(rest, picked): `per_class` seeded picks of every class, and the others; ascending."""
    picked = []
    for c in range(num_classes):
        members = (y == c).nonzero().flatten()
        if len(members) < per_class:
            raise ValueError(f"class {c} has {len(members)} images, fewer than the {per_class} needed")
        picked.append(members[torch.randperm(len(members), generator=generator)[:per_class]])
    picked = torch.cat(picked).sort().values
    return _complement(len(y), picked), picked


def make_dataset(name, train, val, test, num_classes, split_seed, **info) -> Dataset:
    """A Dataset whose `info` has its name, split seed and sizes, then the loader's own entries."""
    info = {
        "name": name,
        "split_seed": int(split_seed),
        "sizes": {"train": len(train), "val": len(val), "test": len(test)},
        **info,
    }
    return Dataset(name, train, val, test, num_classes, in_channels=train.x.shape[1], info=info)
