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
