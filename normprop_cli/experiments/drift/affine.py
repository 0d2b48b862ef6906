"""NormProp's gamma and beta (eq. 11) per conv layer over training, and BatchNorm's weight and bias
beside them (AFFINE_COLUMNS). `AffineProbe` is the trainer's observer; it reads the parameters only,
never the data."""

from __future__ import annotations

import math

from torch import Tensor, nn

from normprop_cli.experiments.probes import BATCH_NORMS, Batches
from normprop_cli.nn import NormPropLayer

AFFINE_COLUMNS = [
    "layer",
    "epoch",
    "units",  # output units (channels) of the layer
    "divisor",  # NormProp: f, the Jacobian factor the layer divides by (eq. 11; 1 unless jacobian is divide); else NaN
    "gamma_mean",  # over units: NormProp's gamma_i, BatchNorm's weight
    "gamma_std",  # population std over units
    "gamma_min",
    "gamma_max",
    "beta_mean",  # NormProp's beta_i, BatchNorm's bias
    "beta_std",
    "beta_min",
    "beta_max",
    "gain_mean",  # NormProp: the effective per-unit gain gamma_i / f; else NaN
    "gain_std",
    "gain_min",
    "gain_max",
    "gamma_change",  # sqrt(mean over units of (gamma_i - gamma_i at epoch 0)^2); NaN without the epoch-0 values
    "beta_change",  # the same for beta
]
GAIN = ["gain_mean", "gain_std", "gain_min", "gain_max"]


def affine_of(layer: nn.Module) -> tuple[Tensor, Tensor, float] | None:
    """(gamma, beta, f) of a hidden layer: NormProp's own (f its divisor), or the weight and bias of
    the BatchNorm inside a block (f NaN); None for any other layer (a plain conv, another norm)."""
    if isinstance(layer, NormPropLayer):
        return layer.gamma, layer.beta, float(layer.divisor())
    for m in layer.modules():
        if isinstance(m, BATCH_NORMS) and m.weight is not None:
            return m.weight, m.bias, math.nan
    return None


def _moments(prefix: str, v: Tensor) -> dict:
    return {
        f"{prefix}_mean": v.mean().item(),
        f"{prefix}_std": v.std(correction=0).item(),
        f"{prefix}_min": v.min().item(),
        f"{prefix}_max": v.max().item(),
    }


class AffineProbe:
    """Per conv layer k = 1..9 that has them (NormProp: all nine; BatchNorm: the eight hidden ones),
    the spread over units of gamma, beta and NormProp's gamma / f, and the RMS change of gamma and beta
    since epoch 0 (AFFINE_COLUMNS). The epoch-0 values are the observer's state, kept in the run's
    checkpoint, so a resumed run reports the same change as an uninterrupted one."""

    name = "affine"

    def __init__(self) -> None:
        self.initial: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> epoch-0 (gamma, beta), float64 on the CPU

    def state_dict(self) -> dict:
        return {"initial": {k: {"gamma": g, "beta": b} for k, (g, b) in self.initial.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.initial = {int(k): (v["gamma"].cpu(), v["beta"].cpu()) for k, v in state.get("initial", {}).items()}

    def observe(self, model: nn.Module, batches: Batches, epoch: int) -> list[dict]:
        rows = []
        for k, layer in enumerate(model.hidden_layers(), start=1):
            found = affine_of(layer)
            if found is None:
                continue
            gamma, beta, f = found
            gamma, beta = gamma.detach().double().cpu().flatten(), beta.detach().double().cpu().flatten()
            if epoch == 0:
                self.initial[k] = (gamma.clone(), beta.clone())
            gain = _moments("gain", gamma / f) if math.isfinite(f) else dict.fromkeys(GAIN, math.nan)
            row = {"layer": k, "epoch": epoch, "units": len(gamma), "divisor": f}
            row |= _moments("gamma", gamma) | _moments("beta", beta) | gain
            if k in self.initial:
                gamma0, beta0 = self.initial[k]
                row |= {"gamma_change": (gamma - gamma0).square().mean().sqrt().item(),
                        "beta_change": (beta - beta0).square().mean().sqrt().item()}  # fmt: skip
            else:  # a run resumed from a checkpoint without the epoch-0 values
                row |= {"gamma_change": math.nan, "beta_change": math.nan}
            rows.append(row)
        return rows


def final_change(affine, run: str) -> dict:
    """A run's final_gamma_change and final_beta_change (the last epoch, mean over its layers); {}
    where the probe did not run."""
    if not len(affine):
        return {}
    a = affine[affine["run"] == run]
    if not len(a):
        return {}
    last = a[a["epoch"] == a["epoch"].max()]
    return {"final_gamma_change": last["gamma_change"].mean(), "final_beta_change": last["beta_change"].mean()}
