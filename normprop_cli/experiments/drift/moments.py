"""The drift decomposed (`experiment.moments_probe`): per layer and probe, how much of the layer input's
departure from N(0, 1) is its mean and how much its spread, and the pre-activation's mean W_i^T E[x]
beside the mean of the unit it feeds.

For a unit x in standard units, E[x^2] - 1 = mean^2 + (var - 1): the second moment's excess splits
exactly into the mean's part and the spread's. Per layer (the input of conv k, k >= 2, its
input-dependent units as in the population metric):

    mean_sq          average of mean^2 over units
    var_minus_1      average of var - 1 (signed: a spread below 1 lowers the second moment)
    abs_var_minus_1  average of |var - 1|
    share_mean       mean_sq / (mean_sq + abs_var_minus_1): the mean's share of the departure

The pre-activation (every conv k): each filter's normalised linear map, W_i * x / ||W_i|| as the layer
computes it (centred filters and the oracles included: `_op` with the layer's own divisor; a plain conv's
filters divided by their norm under BatchNorm), over the full patches of the evaluation images:

    wx_abs_mean      average over filters of |mean_i|, mean_i the measured W_i^T E[x] / ||W_i||
    wx_std           average over filters of its std (1 for N(0, 1) white input)
    out_abs_mean     average over channels of |the channel's mean| in the next layer's input (k <= 8)
    corr_wx_out      Pearson correlation over filters of mean_i and that channel mean: how much of the
                     unit's mean the pre-activation's mean accounts for (k <= 8)

runs/<run>/moments.csv  MOMENTS_COLUMNS, one row per conv layer and probe (moments_steps.csv inside
epoch 1 with experiment.probe_every_steps). It changes no weight and draws no random number."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from normprop_cli.experiments.probes import CHUNK, UnitMoments, _measurement_context, each_layer_input
from normprop_cli.nn import NormPropLayer
from normprop_cli.nn.oracle import full_positions

MOMENTS_COLUMNS = ["layer", "epoch", "units", "mean_sq", "var_minus_1", "abs_var_minus_1", "share_mean",
                   "wx_abs_mean", "wx_std", "out_abs_mean", "corr_wx_out"]  # fmt: skip


def first_conv(block: nn.Module) -> nn.Module:
    """The conv that makes a hidden block's pre-activation: the block itself for NormProp, else its first conv."""
    if isinstance(block, NormPropLayer | nn.Conv2d):
        return block
    return next(m for m in block.modules() if isinstance(m, nn.Conv2d))


def normalised_map(conv: nn.Module, x: Tensor) -> Tensor:
    """W_i * x / ||W_i|| per filter, as the layer normalises (its own divisor and `_op`), no gain or bias."""
    w = conv.weight
    if isinstance(conv, NormPropLayer):
        return conv._op(x, w / conv.filter_norms().view(-1, *(1,) * (w.ndim - 1)), None)
    unit = w / w.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *(1,) * (w.ndim - 1))
    return nn.functional.conv2d(x, unit, None, conv.stride, conv.padding, conv.dilation, conv.groups)


class _FilterMoments:
    """Per-filter sum and sum of squares of the normalised map over full positions, in float64."""

    def __init__(self) -> None:
        self.n, self.s, self.ss = 0, 0.0, 0.0

    def add(self, y: Tensor) -> None:  # y [b, C, L]
        y = y.double()
        self.n += y.shape[0] * y.shape[2]
        self.s = self.s + y.sum((0, 2))
        self.ss = self.ss + y.square().sum((0, 2))

    def mean_std(self) -> tuple[Tensor, Tensor]:
        m = self.s / self.n
        return m, (self.ss / self.n - m * m).clamp_min(0.0).sqrt()


def _corr(a: Tensor, b: Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    den = float(a.norm() * b.norm())
    return float((a * b).sum()) / den if den > 0 else math.nan


class MomentsProbe:
    """Observer: MOMENTS_COLUMNS per conv layer at every epoch (module docstring)."""

    name = "moments"

    def observe(self, model: nn.Module, batches, epoch: int) -> list[dict]:
        units: dict[int, UnitMoments] = {}
        filters: dict[int, _FilterMoments] = {}
        masks: dict[int, Tensor] = {}
        convs = [first_conv(b) for b in model.hidden_layers()]

        def visit(k, x, mask, to_standard):
            masks[k] = mask
            conv = convs[k - 1]
            where = full_positions(mask.cpu(), conv).to(x.device)
            acc = filters.setdefault(k, _FilterMoments())
            for part in x.split(CHUNK):
                if k >= 2:
                    units.setdefault(k, UnitMoments()).add(part, to_standard)
                acc.add(normalised_map(conv, part).flatten(2)[:, :, where])

        with torch.no_grad(), _measurement_context(model, batches, epoch):
            each_layer_input(model, batches, 1, visit)
        rows, channel_means = [], {}
        for k in sorted(units):
            mean, std = (t.cpu() for t in units[k].mean_std())
            mask = masks[k].cpu()
            m, v = mean[:, mask], std[:, mask].square()  # [C, positions]
            channel_means[k] = m.mean(1)
            mean_sq, dv = float(m.square().mean()), float((v - 1).mean())
            adv = float((v - 1).abs().mean())
            share = mean_sq / (mean_sq + adv) if mean_sq + adv else math.nan
            rows.append({"layer": k, "units": m.numel(), "mean_sq": mean_sq, "var_minus_1": dv,
                         "abs_var_minus_1": adv, "share_mean": share})  # fmt: skip
        by_layer = {r["layer"]: r for r in rows}
        for k in sorted(filters):
            wm, ws = (t.cpu() for t in filters[k].mean_std())
            row = by_layer.setdefault(k, {"layer": k, "units": math.nan, "mean_sq": math.nan, "var_minus_1": math.nan,
                                          "abs_var_minus_1": math.nan, "share_mean": math.nan})  # fmt: skip
            out = channel_means.get(k + 1)
            row |= {"wx_abs_mean": float(wm.abs().mean()), "wx_std": float(ws.mean()),
                    "out_abs_mean": float(out.abs().mean()) if out is not None else math.nan,
                    "corr_wx_out": _corr(wm, out) if out is not None and len(out) == len(wm) else math.nan}  # fmt: skip
        return [{"layer": k, "epoch": epoch} | {c: by_layer[k].get(c, math.nan) for c in MOMENTS_COLUMNS[2:]}
                for k in sorted(by_layer)]  # fmt: skip
