"""Data sets as whole uint8 tensors [N, 3, 32, 32] (SPEC section 5).

Each split is one uint8 image tensor and one int64 label tensor, the
cifar10-airbench way: move the data set to the device once (`Dataset.to`), take
batches as index slices (`augment.epoch_batches`), augment on the device.

Splits are drawn with CPU `torch.Generator`s seeded with `split_seed`, so they
are the same on every machine and device; `Dataset.info` records the rule.

- cifar10, cifar100: val = min(5000, n_train // 10) images of the training files
  drawn by a seeded permutation, train = the rest, test = the test file. On the
  real files that is the paper's 45,000 / 5,000 / 10,000 (section 5); smaller
  files keep 10 % for validation.
- svhn: val = 400 per class from train_32x32.mat + 200 per class from
  extra_32x32.mat (the protocol of Goodfellow et al., 2013), train = the rest of
  both, test = test_32x32.mat (26,032).
- digits: scikit-learn's 1,797 8x8 digits, scaled to 0..255 and resized to
  3x32x32. Test = 300 images fixed for every split seed, val = 300 drawn from
  the other 1,497 with split_seed, train = the remaining 1,197 (plain seeded
  permutations, not stratified).
- synthetic: 10 classes of smooth class prototypes plus pixel noise, generated
  from the seed; 512 / 128 / 128 by default.
"""

from __future__ import annotations

import hashlib
import inspect
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


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

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train.x.shape[1:])


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


def _directory(name: str, data_dir) -> Path:
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


def _corrupt_error(name: str, path: Path, reason: str) -> DataError:
    files = ", ".join(DATA_FILES[name][1])
    return DataError(
        f"{name} data set is corrupt: cannot read {path.name} ({reason}); "
        f"expected {files} in {path.parent}; run with --download to fetch it again"
    )


def _reason(exc: BaseException, limit: int = 200) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _require_files(name: str, data_dir) -> Path:
    directory = _directory(name, data_dir)
    missing = [f for f in DATA_FILES[name][1] if not (directory / f).is_file()]
    if missing:
        raise _missing_error(name, directory, missing)
    return directory


def _download(name: str, data_dir, md5s: dict[str, str], fetch: Callable[[list[str]], None]):
    """Fetch through torchvision unless every file is already there and intact."""
    from torchvision.datasets.utils import check_integrity

    directory = _directory(name, data_dir)
    bad = [f for f in DATA_FILES[name][1] if not check_integrity(str(directory / f), md5s[f])]
    if not bad:
        return
    try:
        fetch(bad)
    except Exception as exc:  # network, disk, checksum: all mean "no data set"
        files = ", ".join(DATA_FILES[name][1])
        raise DataError(
            f"{name} download into {directory} failed ({_reason(exc)}); "
            f"check the network, or put {files} in {directory} by hand"
        ) from exc


def available_datasets(data_dir="data") -> dict[str, bool]:
    """Which data sets can be loaded without a download (files present; not checksummed)."""
    present = {}
    for name in DATASETS:
        if name in DATA_FILES:
            directory = _directory(name, data_dir)
            present[name] = all((directory / f).is_file() for f in DATA_FILES[name][1])
        else:
            present[name] = True
    return present


# ---------------------------------------------------------------------------
# splitting


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def _complement(n: int, index: torch.Tensor) -> torch.Tensor:
    keep = torch.ones(n, dtype=torch.bool)
    keep[index] = False
    return keep.nonzero().flatten()


def _sha1(*indices: torch.Tensor) -> str:
    h = hashlib.sha1()
    for index in indices:
        h.update(index.to(torch.int64).numpy().tobytes())
    return h.hexdigest()


def cifar_val_size(n_train: int) -> int:
    """Validation images taken from the CIFAR training files: 5,000 of 50,000, else 10 %."""
    return min(5000, n_train // 10)


def _random_split(n: int, n_val: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, val) indices of a seeded permutation, each in ascending order."""
    perm = torch.randperm(n, generator=generator)
    return perm[n_val:].sort().values, perm[:n_val].sort().values


def _per_class_split(y: torch.Tensor, per_class: int, num_classes: int, generator: torch.Generator):
    """(rest, picked): `per_class` seeded picks of every class, and the others; ascending."""
    picked = []
    for c in range(num_classes):
        members = (y == c).nonzero().flatten()
        if len(members) < per_class:
            raise ValueError(f"class {c} has {len(members)} images, fewer than the {per_class} needed")
        picked.append(members[torch.randperm(len(members), generator=generator)[:per_class]])
    picked = torch.cat(picked).sort().values
    return _complement(len(y), picked), picked


def _dataset(name, train, val, test, num_classes, split_seed, **info) -> Dataset:
    info = {
        "name": name,
        "split_seed": int(split_seed),
        "sizes": {"train": len(train), "val": len(val), "test": len(test)},
        **info,
    }
    return Dataset(name, train, val, test, num_classes, in_channels=train.x.shape[1], info=info)


# ---------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100: torchvision's python-version pickles

_CIFAR = {  # name -> (train files, test files, label key, classes, torchvision class)
    "cifar10": (DATA_FILES["cifar10"][1][:5], ("test_batch",), "labels", 10, "CIFAR10"),
    "cifar100": (("train",), ("test",), "fine_labels", 100, "CIFAR100"),
}


def _entry(d, key: str):
    """A value of a CIFAR dict: str keys when read with latin1 from the original
    Python 2 pickles, bytes keys (b'data') when written by Python 3."""
    for k in (key, key.encode()):
        if k in d:
            return d[k]
    raise KeyError(f"no {key!r} entry")


def _read_cifar(name: str, path: Path, label_key: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as f:
            d = pickle.load(f, encoding="latin1")
        data = np.asarray(_entry(d, "data"))
        labels = np.asarray(_entry(d, label_key), dtype=np.int64)
    except Exception as exc:
        raise _corrupt_error(name, path, _reason(exc)) from exc
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(data) == 0:
        raise _corrupt_error(name, path, f"data is {data.dtype} {data.shape}, expected uint8 [N, 3072]")
    if labels.shape != (len(data),):
        raise _corrupt_error(name, path, f"{len(data)} images but labels of shape {labels.shape}")
    if labels.min() < 0 or labels.max() >= num_classes:
        raise _corrupt_error(name, path, f"labels outside 0..{num_classes - 1}")
    return data.reshape(-1, 3, 32, 32), labels


def _load_cifar(name: str, data_dir, download: bool, split_seed: int) -> Dataset:
    train_files, test_files, label_key, num_classes, tv_class = _CIFAR[name]
    if download:
        import torchvision.datasets as tvd

        cls = getattr(tvd, tv_class)
        md5s = dict(cls.train_list + cls.test_list)
        _download(
            name,
            data_dir,
            md5s,
            lambda bad: cls(root=str(Path(data_dir)), train=True, download=True),
        )
    directory = _require_files(name, data_dir)

    def read(files):
        parts = [_read_cifar(name, directory / f, label_key, num_classes) for f in files]
        x = torch.from_numpy(np.concatenate([p[0] for p in parts]))
        return x, torch.from_numpy(np.concatenate([p[1] for p in parts]))

    full, test = Split(*read(train_files)), Split(*read(test_files))
    train_idx, val_idx = _random_split(len(full), cifar_val_size(len(full)), _generator(split_seed))
    return _dataset(
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
        val_indices_sha1=_sha1(val_idx),
    )


def load_cifar10(data_dir="data", download: bool = False, split_seed: int = 0) -> Dataset:
    return _load_cifar("cifar10", data_dir, download, split_seed)


def load_cifar100(data_dir="data", download: bool = False, split_seed: int = 0) -> Dataset:
    return _load_cifar("cifar100", data_dir, download, split_seed)


# ---------------------------------------------------------------------------
# SVHN: the cropped-digits .mat files

_SVHN_SPLITS = {"train": "train_32x32.mat", "extra": "extra_32x32.mat", "test": "test_32x32.mat"}


def _read_svhn(path: Path) -> Split:
    from scipy.io import loadmat

    try:
        mat = loadmat(str(path))
        X, y = np.asarray(mat["X"]), np.asarray(mat["y"])
    except Exception as exc:
        raise _corrupt_error("svhn", path, _reason(exc)) from exc
    if X.dtype != np.uint8 or X.ndim != 4 or X.shape[:3] != (32, 32, 3) or X.shape[3] == 0:
        raise _corrupt_error("svhn", path, f"X is {X.dtype} {X.shape}, expected uint8 [32, 32, 3, N]")
    if y.size != X.shape[3]:
        raise _corrupt_error("svhn", path, f"{X.shape[3]} images but y of shape {y.shape}")
    y = y.reshape(-1).astype(np.int64)
    if y.min() < 0 or y.max() > 10:
        raise _corrupt_error("svhn", path, "labels outside 1..10")
    y[y == 10] = 0  # SVHN writes the digit 0 as label 10
    x = torch.from_numpy(np.ascontiguousarray(X.transpose(3, 2, 0, 1)))  # [H,W,C,N] -> [N,C,H,W]
    return Split(x, torch.from_numpy(y))


def load_svhn(
    data_dir="data",
    download: bool = False,
    split_seed: int = 0,
    val_per_class: tuple[int, int] = (400, 200),
) -> Dataset:
    """val_per_class: validation images per class taken from (train, extra)."""
    if download:
        import torchvision.datasets as tvd

        md5s = {f: md5 for _, f, md5 in tvd.SVHN.split_list.values()}
        split_of = {f: s for s, f in _SVHN_SPLITS.items()}

        def fetch(bad):
            for f in bad:
                tvd.SVHN(root=str(Path(data_dir)), split=split_of[f], download=True)

        _download("svhn", data_dir, md5s, fetch)
    directory = _require_files("svhn", data_dir)
    g = _generator(split_seed)
    parts = {}
    for split, per_class in zip(("train", "extra"), val_per_class, strict=True):
        path = directory / _SVHN_SPLITS[split]
        full = _read_svhn(path)
        try:
            rest, val = _per_class_split(full.y, per_class, 10, g)
        except ValueError as exc:
            raise _corrupt_error("svhn", path, str(exc)) from exc
        parts[split] = (full, rest, val)
    (tr, tr_rest, tr_val), (ex, ex_rest, ex_val) = parts["train"], parts["extra"]
    train = Split(torch.cat([tr.x[tr_rest], ex.x[ex_rest]]), torch.cat([tr.y[tr_rest], ex.y[ex_rest]]))
    val = Split(torch.cat([tr.x[tr_val], ex.x[ex_val]]), torch.cat([tr.y[tr_val], ex.y[ex_val]]))
    del parts, tr, ex
    test = _read_svhn(directory / _SVHN_SPLITS["test"])
    return _dataset(
        "svhn",
        train,
        val,
        test,
        10,
        split_seed,
        source_dir=str(directory),
        source_files=list(DATA_FILES["svhn"][1]),
        source_sizes={
            "train": len(tr_rest) + len(tr_val),
            "extra": len(ex_rest) + len(ex_val),
            "test": len(test),
        },
        val_per_class={"train": int(val_per_class[0]), "extra": int(val_per_class[1])},
        split_rule=(
            "for train then extra, for each class 0..9: val_per_class images drawn with "
            "torch.randperm(n_class, generator=g), one g = "
            "torch.Generator().manual_seed(split_seed) for all; "
            "val = the picks of train then extra, train = the rest of train then of extra; "
            "indices ascending; label 10 is digit 0"
        ),
        val_indices_sha1=_sha1(tr_val, ex_val),
    )


# ---------------------------------------------------------------------------
# digits: scikit-learn's bundled 8x8 handwritten digits

_DIGITS_TEST_SEED = 2016  # the digits test set is the same for every split_seed
_DIGITS_VAL, _DIGITS_TEST = 300, 300


def digits_images() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 digits as uint8 [1797, 3, 32, 32] (values 0..16 scaled to 0..255,
    bilinear resize on float, rounded, grey replicated to 3 channels) and int64 labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.from_numpy(d.images).float().mul(255.0 / 16.0).unsqueeze(1)
    x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False)
    x = x.round().clamp(0, 255).to(torch.uint8).expand(-1, 3, -1, -1).contiguous()
    return x, torch.from_numpy(d.target).to(torch.int64)


def load_digits(data_dir=None, download: bool = False, split_seed: int = 0) -> Dataset:
    x, y = digits_images()
    full = Split(x, y)
    rest, test_idx = _random_split(len(full), _DIGITS_TEST, _generator(_DIGITS_TEST_SEED))
    train_pos, val_pos = _random_split(len(rest), _DIGITS_VAL, _generator(split_seed))
    train_idx, val_idx = rest[train_pos], rest[val_pos]
    return _dataset(
        "digits",
        full.subset(train_idx),
        full.subset(val_idx),
        full.subset(test_idx),
        10,
        split_seed,
        source="sklearn.datasets.load_digits (1,797 images, 8x8 -> 3x32x32 bilinear)",
        source_sizes={"all": len(full)},
        split_rule=(
            f"test = {_DIGITS_TEST} images by a permutation with the fixed seed "
            f"{_DIGITS_TEST_SEED}; "
            f"val = {_DIGITS_VAL} of the rest by a permutation with split_seed; train = the rest; "
            "indices ascending"
        ),
        val_indices_sha1=_sha1(val_idx),
        test_indices_sha1=_sha1(test_idx),
    )


# ---------------------------------------------------------------------------
# synthetic: learnable images generated in memory

_SYNTHETIC_CLASS_SEED = 1729  # the class prototypes are the same for every split_seed


def load_synthetic(
    data_dir=None,
    download: bool = False,
    split_seed: int = 0,
    sizes: tuple[int, int, int] = (512, 128, 128),
    num_classes: int = 10,
    noise: float = 48.0,
) -> Dataset:
    """Each class is a smooth random colour pattern (4x4 upsampled to 32x32, values 32..224);
    an image is its class pattern plus Gaussian pixel noise of std `noise` (0..255 scale)."""
    coarse = torch.rand(num_classes, 3, 4, 4, generator=_generator(_SYNTHETIC_CLASS_SEED))
    prototypes = 32 + 192 * F.interpolate(coarse, size=(32, 32), mode="bilinear", align_corners=False)
    g = _generator(split_seed)

    def sample(n: int) -> Split:
        y = torch.arange(n, dtype=torch.int64) % num_classes
        y = y[torch.randperm(n, generator=g)]
        x = prototypes[y] + noise * torch.randn(n, 3, 32, 32, generator=g)
        return Split(x.round().clamp(0, 255).to(torch.uint8), y)

    train, val, test = (sample(int(n)) for n in sizes)
    return _dataset(
        "synthetic",
        train,
        val,
        test,
        num_classes,
        split_seed,
        source="generated in memory",
        generator={
            "sizes": [int(n) for n in sizes],
            "num_classes": num_classes,
            "noise": noise,
            "class_seed": _SYNTHETIC_CLASS_SEED,
        },
        split_rule=("train, val, test sampled in that order from torch.Generator().manual_seed(split_seed)"),
    )


# ---------------------------------------------------------------------------
# the registry

DATASETS: dict[str, Callable[..., Dataset]] = {
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "svhn": load_svhn,
    "digits": load_digits,
    "synthetic": load_synthetic,
}


def _limit(ds: Dataset, limit: int, split_seed: int) -> Dataset:
    """At most `limit` examples per split: a seeded random subset, in the original order."""
    g = _generator(split_seed)
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
