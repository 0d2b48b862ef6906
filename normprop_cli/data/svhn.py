"""SVHN: the cropped-digits .mat files.

val = 400 per class from train_32x32.mat + 200 per class from extra_32x32.mat (the protocol of
Goodfellow et al., 2013), train = the rest of both, test = test_32x32.mat (26,032).
"""

from __future__ import annotations

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
    loader_default,
    make_dataset,
    per_class_split,
    register_dataset,
    require_files,
    seeded_generator,
)

_SVHN_SPLITS = {"train": "train_32x32.mat", "extra": "extra_32x32.mat", "test": "test_32x32.mat"}
FILE_SIZES = {"train": 73_257, "extra": 531_131, "test": 26_032}  # the published files' images


def _read_svhn(path: Path) -> Split:
    from scipy.io import loadmat

    try:
        mat = loadmat(str(path))
        X, y = np.asarray(mat["X"]), np.asarray(mat["y"])
    except Exception as exc:
        raise corrupt_error("svhn", path, error_text(exc)) from exc
    if X.dtype != np.uint8 or X.ndim != 4 or X.shape[:3] != (32, 32, 3) or X.shape[3] == 0:
        raise corrupt_error("svhn", path, f"X is {X.dtype} {X.shape}, expected uint8 [32, 32, 3, N]")
    if y.size != X.shape[3]:
        raise corrupt_error("svhn", path, f"{X.shape[3]} images but y of shape {y.shape}")
    y = y.reshape(-1).astype(np.int64)
    if y.min() < 0 or y.max() > 10:
        raise corrupt_error("svhn", path, "labels outside 1..10")
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

        fetch_missing("svhn", data_dir, md5s, fetch)
    directory = require_files("svhn", data_dir)
    g = seeded_generator(split_seed)
    parts = {}
    for split, per_class in zip(("train", "extra"), val_per_class, strict=True):
        path = directory / _SVHN_SPLITS[split]
        full = _read_svhn(path)
        try:
            rest, val = per_class_split(full.y, per_class, 10, g)
        except ValueError as exc:
            raise corrupt_error("svhn", path, str(exc)) from exc
        parts[split] = (full, rest, val)
    (tr, tr_rest, tr_val), (ex, ex_rest, ex_val) = parts["train"], parts["extra"]
    train = Split(torch.cat([tr.x[tr_rest], ex.x[ex_rest]]), torch.cat([tr.y[tr_rest], ex.y[ex_rest]]))
    val = Split(torch.cat([tr.x[tr_val], ex.x[ex_val]]), torch.cat([tr.y[tr_val], ex.y[ex_val]]))
    del parts, tr, ex
    test = _read_svhn(directory / _SVHN_SPLITS["test"])
    return make_dataset(
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
        val_indices_sha1=indices_sha1(tr_val, ex_val),
    )


def svhn_sizes() -> SplitSizes:
    val = 10 * sum(loader_default(load_svhn, "val_per_class"))  # per class from (train, extra), 10 classes
    return SplitSizes(FILE_SIZES["train"] + FILE_SIZES["extra"] - val, val, FILE_SIZES["test"], (3, 32, 32))


register_dataset("svhn", load_svhn, sizes=svhn_sizes)
