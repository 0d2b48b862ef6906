"""synthetic: learnable images generated in memory, 10 classes of smooth class prototypes plus pixel
noise, generated from the seed; 512 / 128 / 128 by default."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import Dataset, Split, SplitSizes, loader_default, make_dataset, register_dataset, seeded_generator

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
    coarse = torch.rand(num_classes, 3, 4, 4, generator=seeded_generator(_SYNTHETIC_CLASS_SEED))
    prototypes = 32 + 192 * F.interpolate(coarse, size=(32, 32), mode="bilinear", align_corners=False)
    g = seeded_generator(split_seed)

    def sample(n: int) -> Split:
        y = torch.arange(n, dtype=torch.int64) % num_classes
        y = y[torch.randperm(n, generator=g)]
        x = prototypes[y] + noise * torch.randn(n, 3, 32, 32, generator=g)
        return Split(x.round().clamp(0, 255).to(torch.uint8), y)

    train, val, test = (sample(int(n)) for n in sizes)
    return make_dataset(
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


def synthetic_sizes() -> SplitSizes:
    return SplitSizes(*loader_default(load_synthetic, "sizes"), (3, 32, 32))


register_dataset("synthetic", load_synthetic, sizes=synthetic_sizes)
