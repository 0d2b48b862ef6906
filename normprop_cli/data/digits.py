"""digits: scikit-learn's bundled 1,797 8x8 handwritten digits, scaled to 0..255 and resized to 3x32x32.

Test = 300 images fixed for every split seed, val = 300 drawn from the other 1,497 with split_seed,
train = the remaining 1,197 (plain seeded permutations, not stratified).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import (
    Dataset,
    Split,
    SplitSizes,
    indices_sha1,
    make_dataset,
    random_split,
    register_dataset,
    seeded_generator,
)

_DIGITS_TEST_SEED = 2016  # the digits test set is the same for every split_seed
_DIGITS_VAL, _DIGITS_TEST = 300, 300
_DIGITS_ALL = 1_797  # scikit-learn's digits


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
    rest, test_idx = random_split(len(full), _DIGITS_TEST, seeded_generator(_DIGITS_TEST_SEED))
    train_pos, val_pos = random_split(len(rest), _DIGITS_VAL, seeded_generator(split_seed))
    train_idx, val_idx = rest[train_pos], rest[val_pos]
    return make_dataset(
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
        val_indices_sha1=indices_sha1(val_idx),
        test_indices_sha1=indices_sha1(test_idx),
    )


def digits_sizes() -> SplitSizes:
    return SplitSizes(_DIGITS_ALL - _DIGITS_VAL - _DIGITS_TEST, _DIGITS_VAL, _DIGITS_TEST, (3, 32, 32))


register_dataset("digits", load_digits, sizes=digits_sizes)
