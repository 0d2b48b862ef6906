"""What the theory studies share: float64 normal samples, a seeded layer init, the published numbers."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from omegaconf import DictConfig

F64 = torch.float64


def normal(shape, seed: int, dtype=F64) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@contextmanager
def seeded(seed: int):
    """Layers initialise from torch's global generator: seed it without disturbing the caller's."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def published(cfg: DictConfig, quantity: str, name: str, statistic: str) -> tuple[float | None, str | None]:
    """(value, where printed) of a number the paper or the note prints, `experiment.published` in
    conf/experiment/theory.yaml (the one place that holds them); (None, None) for one they do not."""
    entry = cfg.experiment.published.get(quantity, {}).get(name, {}).get(statistic)
    return (None, None) if entry is None else (float(entry[0]), str(entry[1]))
