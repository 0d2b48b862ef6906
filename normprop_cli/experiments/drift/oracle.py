"""The Sigma-oracle setting's observer (`model.sigma_oracle_every`, nn/oracle.py): it gives the model its
held-out batch before training, and records what the oracle divides by.

The held-out batch: `images` validation images (never the test set, which the probes and the accuracy
read), drawn by the run's seed, data-normalised as training normalises them (train.data_norm, fitted
on the training split). Given at epoch 0, before the probes see the model, so that every probe, the
first included, sees the oracle's division; a resumed run has it in its checkpoint (the oracle's state).

runs/<run>/sigma_oracle.csv  ORACLE_COLUMNS, one row per conv layer and epoch."""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig
from torch import nn

from normprop_cli.data import make_data_norm, to_float
from normprop_cli.engine.job import load_data
from normprop_cli.nn.oracle import oracle_layers

HELD_OUT = 500  # validation images behind each layer's input-patch covariance
ORACLE_COLUMNS = [
    "layer",
    "epoch",
    "input_var",  # sigma^2: the mean diagonal of the layer's input-patch covariance on the held-out batch
    "divisor_ratio",  # RMS over filters of sqrt(W_i^T A W_i) / ||W_i||: the oracle's divisor over NormProp's
    "divisor_ratio_max",  # its largest filter
    "steps",  # SGD steps taken when measured
]


def held_out(cfg: DictConfig, device: torch.device, images: int = HELD_OUT) -> torch.Tensor:
    """`images` validation images drawn by cfg.seed, normalised as training normalises them."""
    data = load_data(cfg, device)
    norm = make_data_norm(cfg.train.data_norm, data.train.x).to(device).eval()
    pick = torch.randperm(len(data.val), generator=torch.Generator().manual_seed(int(cfg.seed)))[:images]
    with torch.no_grad():
        return norm(to_float(data.val.x[pick.to(data.val.x.device)]))


class SigmaOracleFeed:
    """Observer: the held-out batch into `model.sigma_oracle` at epoch 0; every epoch, ORACLE_COLUMNS."""

    name = "sigma_oracle"

    def __init__(self, cfg: DictConfig, images: int = HELD_OUT):
        self.cfg, self.images = cfg, images

    def observe(self, model: nn.Module, batches, epoch: int) -> list[dict]:
        oracle = getattr(model, "sigma_oracle", None)
        if oracle is None:
            return []
        if oracle.held_out is None:
            oracle.give(model, held_out(self.cfg, next(model.parameters()).device, self.images))
        rows = []
        with torch.no_grad():
            for k, layer in oracle_layers(model):
                ratio = layer.filter_norms() / layer.plain_norms()
                rows.append({"layer": k, "epoch": epoch, "input_var": float(layer.input_var),
                             "divisor_ratio": math.sqrt(float(ratio.square().mean())),
                             "divisor_ratio_max": float(ratio.max()), "steps": oracle.steps})  # fmt: skip
        return rows
