"""1. Activation statistics: Remark 1, Remark 2, eq. 12 and the note's pooling and dropout constants,
closed form vs quadrature vs Monte Carlo (activation_stats.csv)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from normprop_cli.experiments.theory.common import F64, normal, published
from normprop_cli.nn import (
    ACTIVATIONS,
    avgpool_stats,
    dropout_scale,
    maxpool_stats,
    prelu_stats,
    quadrature_stats,
    relu_stats,
)


def monte_carlo(stat, arrays: tuple[torch.Tensor, ...], batches: int) -> tuple[dict, dict]:
    """stat(*arrays) -> {name: value} on all samples, and its standard error from batch means."""
    full = stat(*arrays)
    parts = [stat(*chunk) for chunk in zip(*(a.chunk(batches) for a in arrays), strict=True)]
    stderr = {k: float(np.std([p[k] for p in parts], ddof=1) / math.sqrt(batches)) for k in full}
    return full, stderr


def prelu_fn(a: float):
    """PReLU with slope a (eq. 13) on float64 tensors."""
    slope = torch.tensor([a], dtype=F64)
    return lambda x: F.prelu(x, slope)


def _activation_values(fn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """f(x) and f'(x), elementwise, by autograd."""
    x = x.clone().requires_grad_(True)
    y = fn(x)
    (dy,) = torch.autograd.grad(y.sum(), x)
    return y.detach(), dy


def _activation_stat(y, dy):
    std = y.std().item()
    factor = math.sqrt((dy**2).mean().item()) / std  # section 3.4: sqrt(E[f'(X)^2]) / c1
    return {"mean": y.mean().item(), "std": std, "jacobian_factor": factor}


def _as_dict(st) -> dict:
    return {"mean": st.mean, "std": st.std, "jacobian_factor": st.jacobian_factor}


def _moments_stat(y):
    return {"mean": y.mean().item(), "std": y.std().item()}


def _rows(cfg, quantity, name, param, closed, quadrature, mc, stderr):
    rows = []
    for statistic, value in mc.items():
        printed, source = published(cfg, quantity, name, statistic)
        rows.append(
            {
                "quantity": quantity,
                "name": name,
                "param": param,
                "statistic": statistic,
                "closed_form": closed.get(statistic),
                "quadrature": quadrature.get(statistic),
                "monte_carlo": value,
                "mc_stderr": stderr[statistic],
                "published": printed,
                "published_in": source,
            }
        )
    return rows


def activation_table(cfg: DictConfig) -> pd.DataFrame:
    t, n, batches = cfg.theory, int(cfg.theory.samples), int(cfg.theory.mc_batches)
    x = normal(n, cfg.seed)
    rows = []

    # Remark 1 (ReLU), Remark 2 (PReLU over slopes), eq. 12 numerically (tanh, sigmoid)
    named = [("relu", None, torch.relu, relu_stats(), (0.0,))]
    named += [("prelu", float(a), prelu_fn(float(a)), prelu_stats(float(a)), (0.0,)) for a in t.prelu_slopes]
    symmetric = {"tanh": {"mean": 0.0}, "sigmoid": {"mean": 0.5}}  # odd f; f(x) - 1/2 odd (note)
    named += [
        (name, None, ACTIVATIONS[name].fn, symmetric[name], ACTIVATIONS[name].breakpoints)
        for name in ("tanh", "sigmoid")
    ]
    for name, param, fn, closed, breakpoints in named:
        closed = closed if isinstance(closed, dict) else _as_dict(closed)
        quad = _as_dict(quadrature_stats(fn, breakpoints=breakpoints))
        mc, se = monte_carlo(_activation_stat, _activation_values(fn, x), batches)
        rows += _rows(cfg, "activation", name, param, closed, quad, mc, se)

    # Pooling k x k windows of independent N(0, 1) (section 3.2, the note's section 4)
    for k in t.pool_sizes:
        windows = normal((n, k * k), cfg.seed + k)
        mx = maxpool_stats(k * k)
        mc, se = monte_carlo(_moments_stat, (windows.amax(1),), batches)
        rows += _rows(cfg, "pooling", f"max {k}x{k}", float(k), {}, mx._asdict(), mc, se)
        mc, se = monte_carlo(_moments_stat, (windows.mean(1),), batches)
        rows += _rows(cfg, "pooling", f"avg {k}x{k}", float(k), avgpool_stats(k * k)._asdict(), {}, mc, se)

    # Dropout keeping with probability p (the note's section 5)
    for p in t.dropout_keep:
        d = dropout_scale(float(p))
        kept = x * (torch.rand(n, generator=torch.Generator().manual_seed(cfg.seed + 100), dtype=F64) < p)
        for name, y, std in (
            ("no rescale", kept, d.masked_std),
            ("1/p", kept / p, d.inverted_std),
            ("1/sqrt(p)", kept * d.scale, d.masked_std * d.scale),
        ):
            mc, se = monte_carlo(_moments_stat, (y,), batches)
            rows += _rows(cfg, "dropout", name, float(p), {"mean": 0.0, "std": std}, {}, mc, se)

    df = pd.DataFrame(rows)
    reference = df["closed_form"].fillna(df["quadrature"])
    df["abs_err_quadrature"] = (df["quadrature"] - df["closed_form"]).abs()
    df["abs_err_mc"] = (df["monte_carlo"] - reference).abs()
    df["mc_z"] = (df["monte_carlo"] - reference) / df["mc_stderr"]
    return df
