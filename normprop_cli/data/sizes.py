"""The split sizes and image shape of each data set, known without loading it (`normprop run --dry-run`
plans a run on data that need not be on this machine): each data set's own `sizes` (declared with its
loader, base.register_dataset: the published file sizes through the loader's split rule), the seeded
subsets (`limit`, `train_limit`) applied as load_dataset applies them."""

from __future__ import annotations

from .base import FULL_SIZES, SplitSizes
from .datasets import DATASETS

__all__ = ["SplitSizes", "split_sizes"]


def split_sizes(name: str, limit: int | None = None, train_limit: int | None = None) -> SplitSizes:
    """(train, val, test, shape) of data set `name` as load_dataset gives it with `limit` (at most
    that many per split) and `train_limit` (at most that many training images); a ValueError for a
    data set without known sizes."""
    if name not in FULL_SIZES:
        raise ValueError(f"no split sizes known for data set {name!r}; known: {', '.join(DATASETS)}")
    s = FULL_SIZES[name]()
    if limit is not None:
        s = s._replace(train=min(s.train, int(limit)), val=min(s.val, int(limit)), test=min(s.test, int(limit)))
    if train_limit is not None:
        s = s._replace(train=min(s.train, int(train_limit)))
    return s
