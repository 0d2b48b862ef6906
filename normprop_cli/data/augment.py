"""Batches and augmentation on the device, the cifar10-airbench way.

The data set is one tensor on the device; an epoch is a seeded permutation cut
into index slices, and a horizontal flip is a `torch.where` over a random mask.
Both draw from a `torch.Generator` the caller owns, so a run is reproducible and,
with the generator's state saved (`get_state` / `set_state`), resumable.
"""

from __future__ import annotations

import torch


def flip_mask(n: int, generator: torch.Generator) -> torch.Tensor:
    """A bool [n] mask, each entry True with probability 1/2, drawn on the generator's device."""
    return torch.rand(n, generator=generator, device=generator.device) < 0.5


def flip_batch(x: torch.Tensor, generator_or_mask: torch.Generator | torch.Tensor) -> torch.Tensor:
    """Flip horizontally (the last dimension) the images of x [N, C, H, W] selected by a
    bool mask [N], or by a fresh `flip_mask` drawn from a generator."""
    mask = generator_or_mask
    if isinstance(mask, torch.Generator):
        mask = flip_mask(len(x), mask)
    if mask.shape != x.shape[:1]:
        raise ValueError(f"flip mask of shape {tuple(mask.shape)} for a batch of {len(x)} images")
    mask = mask.to(device=x.device, dtype=torch.bool).view(-1, *([1] * (x.dim() - 1)))
    return torch.where(mask, x.flip(-1), x)


def epoch_batches(
    n: int,
    batch_size: int,
    generator: torch.Generator,
    drop_last: bool = False,
    device: torch.device | str | None = None,
) -> list[torch.Tensor]:
    """One epoch over n examples: a seeded permutation cut into index tensors of
    `batch_size` (the last one shorter unless dropped), on `device` if given."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    perm = torch.randperm(n, generator=generator, device=generator.device)
    if device is not None:
        perm = perm.to(device)
    batches = list(perm.split(batch_size))
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


# What `train.augment=true` applies follows the data set (`dataset.augment`, SPEC §6.1): horizontal
# flips for CIFAR (the paper), none for SVHN, small translations for digits, which are not
# mirror-symmetric.
AUGMENTATIONS = ("flip", "translate", "none")


def random_shifts(n: int, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """An int64 [n, 2] tensor of (dy, dx) shifts, each uniform in [-max_shift, max_shift]."""
    return torch.randint(-max_shift, max_shift + 1, (n, 2), generator=generator, device=generator.device)


def translate_batch(x: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Shift each image of x [N, C, H, W] by its (dy, dx) of `shifts` [N, 2] (down and right for
    positive values); what enters from outside the image is 0. Same shape and dtype as x."""
    if shifts.shape != (len(x), 2):
        raise ValueError(f"shifts of shape {tuple(shifts.shape)} for a batch of {len(x)} images")
    n, _, h, w = x.shape
    pad = int(shifts.abs().max()) if n else 0
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    shifts = shifts.to(x.device)
    rows = torch.arange(h, device=x.device) + pad - shifts[:, :1]  # [N, H]
    cols = torch.arange(w, device=x.device) + pad - shifts[:, 1:]  # [N, W]
    batch = torch.arange(n, device=x.device)[:, None, None]
    # advanced indices around a slice put their dimensions first: [N, H, W, C]
    return padded[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()


def draw_augmentation(kind: str, n: int, generator: torch.Generator, max_shift: int = 0) -> torch.Tensor | None:
    """One epoch's random draws for n images: a flip mask [n], shifts [n, 2], or None."""
    if kind == "flip":
        return flip_mask(n, generator)
    if kind == "translate":
        return random_shifts(n, max_shift, generator)
    if kind == "none":
        return None
    raise ValueError(f"unknown augmentation {kind!r}; known: {', '.join(AUGMENTATIONS)}")


def augment_batch(x: torch.Tensor, drawn: torch.Tensor | None) -> torch.Tensor:
    """Apply a batch's slice of `draw_augmentation`'s draws (a flip mask or shifts) to x."""
    if drawn is None:
        return x
    return flip_batch(x, drawn) if drawn.dtype == torch.bool else translate_batch(x, drawn)
