"""4. Propagation through deep random nets at initialisation (sections 3.2-3.3, eq. 9 and eq. 11): the
mean and std of every layer, at several seeds (propagation.csv)."""

from __future__ import annotations

import pandas as pd
import torch
from omegaconf import DictConfig
from torch import nn

from normprop_cli.experiments.theory.common import normal, seeded
from normprop_cli.nn import NIN, NormPropLayer, NormPropLinear


def pre_activation(layer: NormPropLayer, x: torch.Tensor) -> torch.Tensor:
    """gamma_i (W_i * x) / (f ||W_i||) + beta_i: the input to the activation in eq. 9 / eq. 11."""
    wx = layer._op(x, layer.weight, None)
    shape = (1, -1) + (1,) * (wx.ndim - 2)
    scale = layer.gamma / (layer.divisor() * layer.filter_norms())
    return wx * scale.view(shape) + layer.beta.view(shape)


def _plain_fc(width: int) -> nn.Module:
    lin = nn.Linear(width, width)
    nn.init.xavier_uniform_(lin.weight)  # section 4.2 for the baseline too
    nn.init.zeros_(lin.bias)
    return nn.Sequential(lin, nn.ReLU())


def fc_net(method: str, jacobian: str, depth: int, width: int) -> list[tuple[str, nn.Module]]:
    if method == "normprop":
        return [(f"fc{i + 1}", NormPropLinear(width, width, jacobian=jacobian)) for i in range(depth)]
    return [(f"fc{i + 1}", _plain_fc(width)) for i in range(depth)]


def trace(layers: list[tuple[str, nn.Module]], x: torch.Tensor, band: float) -> list[dict]:
    """Mean and std over inputs and units of each layer's pre-activation and output (by hooks)."""
    rows = []

    def record(position, name, quantity, t):
        mean, std = t.mean().item(), t.std().item()
        kind = "pool" if name.startswith("pool") else "layer"
        rows.append(
            {
                "layer": position,
                "name": name,
                "kind": kind,
                "quantity": quantity,
                "mean": mean,
                "std": std,
                "in_band": abs(mean) <= band and abs(std - 1.0) <= band,
            }
        )

    handles = []
    for position, (name, module) in enumerate(layers, start=1):

        def output_hook(mod, inputs, out, p=position, n=name):
            if isinstance(mod, NormPropLayer):
                record(p, n, "pre_activation", pre_activation(mod, inputs[0]))
            elif isinstance(mod, nn.Conv2d | nn.Linear):  # the plain classifier: no activation
                record(p, n, "pre_activation", out)
            record(p, n, "output", out)

        if isinstance(module, nn.Sequential):  # plain conv/linear + ReLU: hook the linear part too
            handles.append(
                module[0].register_forward_hook(
                    lambda mod, inputs, out, p=position, n=name: record(p, n, "pre_activation", out)
                )
            )
        handles.append(module.register_forward_hook(output_hook))
    with torch.no_grad():
        for _, module in layers:
            x = module(x)
    for h in handles:
        h.remove()
    return rows


def propagation_table(cfg: DictConfig) -> pd.DataFrame:
    """Every setting's trace at `theory.propagation_seeds` seeds (cfg.seed, cfg.seed + 1, ...): each
    seed draws its own weights and its own N(0, 1) input, so the spread over seeds is an interval."""
    t = cfg.theory
    band = float(t.band)
    settings = [("normprop", j) for j in t.propagation_jacobian] + [("none", "")]
    rows = []
    for seed in range(int(cfg.seed), int(cfg.seed) + int(t.get("propagation_seeds", 1))):
        x = normal((int(t.batch), int(t.width)), seed + 3, torch.float32)
        for method, jacobian in settings:
            with seeded(seed):
                layers = fc_net(method, jacobian or "off", int(t.depth), int(t.width))
            head = {"net": "fc", "method": method, "jacobian": jacobian, "seed": seed}
            rows += [head | r for r in trace(layers, x, band)]
        x = normal((int(t.nin_batch), 3, 32, 32), seed + 4, torch.float32)
        for method, jacobian in settings:
            with seeded(seed):
                model = NIN(norm=method, width=float(t.nin_width), jacobian=jacobian or "divide")
            head = {"net": "nin", "method": method, "jacobian": jacobian, "seed": seed}
            rows += [head | r for r in trace(list(model.features.named_children()), x, band)]
    return pd.DataFrame(rows)


def first_seed(propagation: pd.DataFrame) -> pd.DataFrame:
    """The rows of the first seed (all rows of a CSV written before the seed column)."""
    return propagation[propagation["seed"] == propagation["seed"].min()] if "seed" in propagation else propagation
