"""2. The Jacobian of one NormProp layer (section 3.4, eq. 4-7): singular values of d o / d x with and
without the Jacobian factor (jacobian.csv, histograms in jacobian_histogram.csv)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig
from torch import nn

from normprop_cli.experiments.theory.activations import prelu_fn
from normprop_cli.experiments.theory.common import normal, seeded
from normprop_cli.nn import ACTIVATIONS, NormPropLinear, quadrature_stats


def layer_jacobians(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """d o / d x at each row of x, [inputs, m, n]; o[b] depends on x[b] only: grad of sum_b o[b]."""
    jac = torch.autograd.functional.jacobian(lambda z: layer(z).sum(0), x, vectorize=True)
    return jac.permute(1, 0, 2).detach()


def jacobian_tables(cfg: DictConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    t = cfg.theory
    width, inputs = int(t.jacobian_width), int(t.jacobian_inputs)
    x = normal((inputs, width), cfg.seed + 1)
    rows, hist = [], []
    for activation in t.jacobian_activations:
        spectra = {}
        for mode in t.jacobian_modes:
            with seeded(cfg.seed):  # the same W for every mode
                layer = NormPropLinear(width, width, activation=activation, jacobian=mode).double()
            jac = layer_jacobians(layer, x)  # eq. 4
            sv = torch.linalg.svdvals(jac).flatten().numpy()
            gram = torch.einsum("bij,bkj->ik", jac, jac) / inputs  # E_x[J J^T], eq. 7
            gram_sv = torch.linalg.eigvalsh(gram).clamp_min(0).sqrt().numpy()
            with torch.no_grad():
                st = layer.stats()
                c1, factor = float(st.std), float(st.jacobian_factor)
                # z = W~x / d: d = f for "divide" and "init" (gamma = 1/f), 1 for "off"
                d = float(layer.divisor()) / layer.gamma[0].item()
            fn = ACTIVATIONS[activation].fn if activation != "prelu" else prelu_fn(layer.prelu_init)
            breakpoints = ACTIVATIONS[activation].breakpoints if activation != "prelu" else (0.0,)
            # section 3.4 predicts sqrt(E[f'(X)^2]) / c1 without the factor, 1 with it; exactly, the
            # RMS singular value is sqrt(E[f'(Z)^2]) / c1 with Z = W~x / d ~ N(0, 1 / d^2)
            predicted = factor if mode == "off" else 1.0
            scaled = quadrature_stats(lambda u, fn=fn, d=d: fn(u / d), breakpoints=breakpoints)
            rows.append(
                {
                    "activation": activation,
                    "jacobian": mode,
                    "slope": layer.prelu_init if activation == "prelu" else None,
                    "width": width,
                    "inputs": inputs,
                    "factor": factor,
                    "predicted": predicted,
                    "predicted_exact": math.sqrt(float(scaled.mean_sq_derivative)) / c1,
                    "sv_mean": sv.mean(),
                    "sv_rms": math.sqrt((sv**2).mean()),
                    "sv_median": float(np.median(sv)),
                    "sv_min": sv.min(),
                    "sv_max": sv.max(),
                    "sv_zero_fraction": float((sv < 1e-9 * sv.max()).mean()),
                    "ejj_sv_min": gram_sv.min(),
                    "ejj_sv_max": gram_sv.max(),
                }
            )
            spectra[mode] = sv
        edges = np.linspace(0.0, max(s.max() for s in spectra.values()) * 1.001, int(t.histogram_bins) + 1)
        for mode, sv in spectra.items():
            counts, _ = np.histogram(sv, edges)
            hist += [
                {
                    "activation": activation,
                    "jacobian": mode,
                    "bin_left": lo,
                    "bin_right": hi,
                    "count": int(c),
                }
                for lo, hi, c in zip(edges[:-1], edges[1:], counts, strict=True)
            ]
    return pd.DataFrame(rows), pd.DataFrame(hist)
