"""Augmentation on the device, the cifar10-airbench way.

The data set is one tensor on the device; the trainer cuts an epoch's seeded permutation into index
slices (engine.trainer.train_epoch). An epoch's augmentation is drawn once for all its images
(`draw_augmentation`: a flip mask or shifts) and each batch applies its slice (`augment_batch`); a
horizontal flip is a `torch.where` over the mask. The draws come from a `torch.Generator` the caller
owns (the trainer's is seeded from the seed and the epoch), so a run is reproducible and resumable.
"""

from __future__ import annotations

import torch


def flip_mask(n: int, generator: torch.Generator) -> torch.Tensor:
    """A bool [n] mask, each entry True with probability 1/2, drawn on the generator's device."""
    return torch.rand(n, generator=generator, device=generator.device) < 0.5


# What `train.augment=true` applies follows the data set (`dataset.augment`): horizontal
# flips for CIFAR (the paper), none for SVHN, small translations for digits, which are not
# mirror-symmetric.
AUGMENTATIONS = ("flip", "translate", "none")


def random_shifts(n: int, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """An int64 [n, 2] tensor of (dy, dx) shifts, each uniform in [-max_shift, max_shift]."""
    return torch.randint(-max_shift, max_shift + 1, (n, 2), generator=generator, device=generator.device)


def translate_batch(x: torch.Tensor, shifts: torch.Tensor, max_shift: int | None = None) -> torch.Tensor:
    """Shift each image of x [N, C, H, W] by its (dy, dx) of `shifts` [N, 2] (down and right for
    positive values); what enters from outside the image is 0. Same shape and dtype as x. `max_shift`,
    a bound on |shifts| where the caller knows one (the trainer: dataset.translate_pixels), spares
    reading the largest shift back from the device (a host sync per batch); the result is the same."""
    if shifts.shape != (len(x), 2):
        raise ValueError(f"shifts of shape {tuple(shifts.shape)} for a batch of {len(x)} images")
    n, _, h, w = x.shape
    pad = int(max_shift) if max_shift is not None else int(shifts.abs().max()) if n else 0
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


def augment_batch(x: torch.Tensor, drawn: torch.Tensor | None, max_shift: int | None = None) -> torch.Tensor:
    """Apply a batch's slice of `draw_augmentation`'s draws to x [N, C, H, W]: flip horizontally (the
    last dimension) the images a bool mask [N] selects, or shift each by its row of shifts [N, 2]
    (`max_shift`: as translate_batch's)."""
    if drawn is None:
        return x
    if drawn.dtype != torch.bool:
        return translate_batch(x, drawn, max_shift)
    if drawn.shape != x.shape[:1]:
        raise ValueError(f"flip mask of shape {tuple(drawn.shape)} for a batch of {len(x)} images")
    mask = drawn.to(x.device).view(-1, *([1] * (x.dim() - 1)))
    return torch.where(mask, x.flip(-1), x)
