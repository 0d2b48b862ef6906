"""Theory (sections 3.2-3.4, Remarks 1-2, Proposition 1): no training, CSVs and figures.

    normprop run theory [theory.samples=200000]

1. activation_stats.csv  Remark 1, Remark 2, eq. 12 and the note's pooling and dropout constants:
                         closed form vs quadrature vs Monte Carlo.
2. jacobian.csv          section 3.4: singular values of d o / d x of one NormProp layer, with and
                         without the Jacobian factor (histograms in jacobian_histogram.csv).
3. proposition1.csv      Prop. 1 (eq. 3, proof eq. 16-19): exact min_alpha ||Sigma - diag(alpha)||_F
                         against the bound as printed and as corrected by the note's Appendix A.
4. propagation.csv       section 3.3: mean and std of every layer of deep random nets at init, at
                         several seeds (the figure: the first seed).

Everything runs on the CPU; float64 where a number is compared with a formula.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from scipy.optimize import minimize
from torch import nn

from normprop_cli import io
from normprop_cli.experiments.results import read_csv
from normprop_cli.nn import (
    ACTIVATIONS,
    NIN,
    NormPropLayer,
    NormPropLinear,
    avgpool_stats,
    dropout_scale,
    maxpool_stats,
    prelu_stats,
    quadrature_stats,
    relu_stats,
)

CSVS = ("activation_stats", "jacobian", "jacobian_histogram", "proposition1", "propagation")
F64 = torch.float64


def out_dir(cfg: DictConfig) -> Path:
    return Path(cfg.results_dir) / "theory"


@contextmanager
def seeded(seed: int):
    """Layers initialise from torch's global generator: seed it without disturbing the caller's."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@contextmanager
def one_thread():
    """Small tensors and many small LAPACK calls: on a shared CPU a second intra-op thread costs
    more than it gives (measured: the batched SVDs 10-50x slower with two threads under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def normal(shape, seed: int, dtype=F64) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def monte_carlo(stat, arrays: tuple[torch.Tensor, ...], batches: int) -> tuple[dict, dict]:
    """stat(*arrays) -> {name: value} on all samples, and its standard error from batch means."""
    full = stat(*arrays)
    parts = [stat(*chunk) for chunk in zip(*(a.chunk(batches) for a in arrays), strict=True)]
    stderr = {k: float(np.std([p[k] for p in parts], ddof=1) / math.sqrt(batches)) for k in full}
    return full, stderr


# ---- 1. activation statistics: Remark 1, Remark 2, eq. 12, the note's sections 3-5 ---------------

# Numbers printed in the paper or the note (the note's are Monte Carlo estimates).
PUBLISHED = {
    ("activation", "relu", "jacobian_factor"): (1.21, "section 3.4"),
    ("activation", "sigmoid", "mean"): (0.5, "note section 3"),
    ("activation", "sigmoid", "std"): (0.2083, "note section 3"),
    ("pooling", "max 2x2", "mean"): (1.0291, "note section 4"),
    ("pooling", "max 2x2", "std"): (0.7010, "note section 4"),
    ("pooling", "max 3x3", "mean"): (1.4850, "note section 4"),
    ("pooling", "max 3x3", "std"): (0.5978, "note section 4"),
    ("pooling", "avg 2x2", "std"): (0.5, "note section 4"),
    ("pooling", "avg 3x3", "std"): (1 / 3, "note section 4"),
}


def _prelu(a: float):
    slope = torch.tensor([a], dtype=F64)
    return lambda x: F.prelu(x, slope)  # eq. 13


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


def _rows(quantity, name, param, closed, quadrature, mc, stderr):
    rows = []
    for statistic, value in mc.items():
        published, source = PUBLISHED.get((quantity, name, statistic), (None, None))
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
                "published": published,
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
    named += [("prelu", float(a), _prelu(float(a)), prelu_stats(float(a)), (0.0,)) for a in t.prelu_slopes]
    symmetric = {"tanh": {"mean": 0.0}, "sigmoid": {"mean": 0.5}}  # odd f; f(x) - 1/2 odd (note)
    named += [
        (name, None, ACTIVATIONS[name].fn, symmetric[name], ACTIVATIONS[name].breakpoints)
        for name in ("tanh", "sigmoid")
    ]
    for name, param, fn, closed, breakpoints in named:
        closed = closed if isinstance(closed, dict) else _as_dict(closed)
        quad = _as_dict(quadrature_stats(fn, breakpoints=breakpoints))
        mc, se = monte_carlo(_activation_stat, _activation_values(fn, x), batches)
        rows += _rows("activation", name, param, closed, quad, mc, se)

    # Pooling k x k windows of independent N(0, 1) (section 3.2, the note's section 4)
    for k in t.pool_sizes:
        windows = normal((n, k * k), cfg.seed + k)
        mx = maxpool_stats(k * k)
        mc, se = monte_carlo(_moments_stat, (windows.amax(1),), batches)
        rows += _rows("pooling", f"max {k}x{k}", float(k), {}, mx._asdict(), mc, se)
        mc, se = monte_carlo(_moments_stat, (windows.mean(1),), batches)
        rows += _rows("pooling", f"avg {k}x{k}", float(k), avgpool_stats(k * k)._asdict(), {}, mc, se)

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
            rows += _rows("dropout", name, float(p), {"mean": 0.0, "std": std}, {}, mc, se)

    df = pd.DataFrame(rows)
    reference = df["closed_form"].fillna(df["quadrature"])
    df["abs_err_quadrature"] = (df["quadrature"] - df["closed_form"]).abs()
    df["abs_err_mc"] = (df["monte_carlo"] - reference).abs()
    df["mc_z"] = (df["monte_carlo"] - reference) / df["mc_stderr"]
    return df


# ---- 2. the Jacobian of one NormProp layer (section 3.4, eq. 4-7) --------------------------------


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
            fn = ACTIVATIONS[activation].fn if activation != "prelu" else _prelu(layer.prelu_init)
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


# ---- 3. Proposition 1: the canonical error bound (eq. 3, proof eq. 16-19) ------------------------


def prop1_matrix(structure: str, rho: float | None, norms: str, m: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """m x n weights: rows with a given coherence structure, then scaled to the given norms."""
    if structure == "glorot":  # section 4.2: row norms ~ sqrt(2n / (m + n)), left as they are
        a = math.sqrt(6.0 / (m + n))
        return rng.uniform(-a, a, (m, n))
    if structure == "gaussian":
        w = rng.standard_normal((m, n))
    elif structure == "orthonormal":  # coherence 0
        w = np.linalg.qr(rng.standard_normal((n, m)))[0].T
    else:  # "common": sqrt(rho) c + sqrt(1 - rho) g_i, all orthonormal: every cosine exactly rho
        q = np.linalg.qr(rng.standard_normal((n, m + 1)))[0].T
        w = math.sqrt(rho) * q[:1] + math.sqrt(1.0 - rho) * q[1:]
    target = rng.uniform(0.5, 1.5, m) if norms == "random" else np.full(m, float(norms))
    return w * (target / np.linalg.norm(w, axis=1))[:, None]


def prop1_row(w: np.ndarray, sigma: float, cov_x: np.ndarray) -> dict:
    m = w.shape[0]
    gram = w @ w.T
    sq = np.diag(gram).copy()  # ||W_i||^2
    off = gram - np.diag(sq)
    r = np.sqrt(sq)
    # eq. 18 done exactly: ||Sigma - diag(alpha)||_F^2
    #   = sigma^4 sum_{i != j} (W_i.W_j)^2 + sum_i (alpha_i - sigma^2 ||W_i||^2)^2
    exact = sigma**2 * math.sqrt((off**2).sum())
    mu = np.abs(off / np.outer(r, r)).max() if m > 1 else 0.0  # coherence
    pairs = sq.sum() ** 2 - (sq**2).sum()  # sum_{i != j} ||W_i||^2 ||W_j||^2
    radicand = (sq * (1 - sq)).sum() + m * (m - 1) * mu**2 * pairs  # eq. 3 / eq. 19 as printed
    # negative: undefined; within rounding of 0 (sum_i r_i^2 (1 - r_i^2) at r_i = 1): 0
    undefined = radicand < -1e-12 * (sq**2).sum()
    printed = math.nan if undefined else sigma**2 * math.sqrt(max(radicand, 0.0))
    corrected = sigma**2 * math.sqrt(m * (m - 1) * mu**2 * pairs)  # the note's Appendix A
    # the proof's own step (W_i.W_j)^2 <= mu^2 ||W_i||^2 ||W_j||^2 needs no extra m(m-1)
    coherence = sigma**2 * mu * math.sqrt(pairs)

    # cross-checks: minimise over alpha numerically; and the empirical covariance of samples
    cov = sigma**2 * gram  # eq. 17

    def objective(alpha):
        diff = cov - np.diag(alpha)
        return (diff**2).sum(), -2.0 * np.diag(diff)

    opt = minimize(objective, np.zeros(m), jac=True, method="L-BFGS-B", options={"ftol": 1e-15, "gtol": 1e-12})
    empirical = sigma**2 * (w @ cov_x @ w.T)
    fails = lambda bound: bool(bound < exact * (1 - 1e-9) - 1e-12)  # noqa: E731
    return {
        "m": m,
        "n": w.shape[1],
        "row_norm_min": r.min(),
        "row_norm_max": r.max(),
        "coherence": mu,
        "exact": exact,
        "exact_numerical": math.sqrt(max(opt.fun, 0.0)),
        "alpha_numerical_max_err": np.abs(opt.x - sigma**2 * sq).max(),
        "empirical": math.sqrt((empirical**2).sum() - (np.diag(empirical) ** 2).sum()),
        "printed_radicand": radicand,
        "printed_bound": printed,
        "corrected_bound": corrected,
        "coherence_bound": coherence,
        "printed_undefined": undefined,
        "printed_fails": False if undefined else fails(printed),
        "corrected_fails": fails(corrected),
        "coherence_bound_fails": fails(coherence),
    }


def proposition1_table(cfg: DictConfig) -> pd.DataFrame:
    t = cfg.theory
    n = int(t.prop1_n)
    # the covariance of samples x ~ N(0, I), one draw for every W: Sigma_hat = sigma^2 W cov_x W^T
    cov_x = torch.cov(normal((int(t.prop1_samples), n), cfg.seed + 2).T).numpy()
    cases = [("glorot", None, "glorot")]
    cases += [
        (s, rho, str(norm))
        for s, rho in [("gaussian", None), ("orthonormal", None)] + [("common", float(r)) for r in t.prop1_rhos]
        for norm in t.prop1_row_norms
    ]
    rows = []
    for m in (int(t.prop1_m), int(t.prop1_small_m)):
        for i, (structure, rho, norms) in enumerate(cases):
            rng = np.random.default_rng([cfg.seed, m, i])
            w = prop1_matrix(structure, rho, norms, m, n, rng)
            case = f"{structure}" + (f" rho={rho:g}" if rho is not None else "")
            rows.append(
                {"case": case, "structure": structure, "rho": rho, "row_norms": norms}
                | prop1_row(w, float(t.prop1_sigma), cov_x)
            )
    return pd.DataFrame(rows)


# ---- 4. propagation through a deep random net (sections 3.2-3.3, eq. 9 and eq. 11) ---------------


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


# ---- the runner ----------------------------------------------------------------------------------


def run(cfg: DictConfig) -> Path:
    out = out_dir(cfg)
    with one_thread():
        jacobian, histogram = jacobian_tables(cfg)
        tables = {
            "activation_stats": activation_table(cfg),
            "jacobian": jacobian,
            "jacobian_histogram": histogram,
            "proposition1": proposition1_table(cfg),
            "propagation": propagation_table(cfg),
        }
    for name, frame in tables.items():
        io.write_csv(out / f"{name}.csv", frame)
    plot(cfg)
    return out


def headlines(cfg: DictConfig) -> list[dict]:
    """The constants, the Jacobian, Proposition 1 and propagation, beside the paper's claims."""
    out = out_dir(cfg)
    stats, jac, prop, propagation = (
        read_csv(out / f"{name}.csv", "normprop run theory")
        for name in ("activation_stats", "jacobian", "proposition1", "propagation")
    )
    relu = stats[(stats["quantity"] == "activation") & (stats["name"] == "relu")].set_index("statistic")
    rows = [
        {
            "quantity": "E[ReLU(X)], X ~ N(0,1) (Remark 1)",
            "reproduced": relu.loc["mean", "quadrature"],
            "paper": 1 / math.sqrt(2 * math.pi),
        },
        {
            "quantity": "std ReLU(X) (Remark 1)",
            "reproduced": relu.loc["std", "quadrature"],
            "paper": math.sqrt((1 - 1 / math.pi) / 2),
        },
        {
            "quantity": "Jacobian factor, ReLU (section 3.4)",
            "reproduced": relu.loc["jacobian_factor", "quadrature"],
            "paper": 1.21,
        },
    ]
    for mode, paper in (("off", 1.21), ("divide", "1 (the aim of the factor)")):
        row = jac[(jac["activation"] == "relu") & (jac["jacobian"] == mode)]
        if len(row):
            rows.append(
                {
                    "quantity": f"RMS singular value of a ReLU layer's Jacobian, factor {mode}",
                    "reproduced": row["sv_rms"].iloc[0],
                    "paper": paper,
                }
            )
    rows.append(
        {
            "quantity": "Prop. 1 cases where the printed bound is undefined / fails / the corrected one fails",
            "reproduced": f"{int(prop['printed_undefined'].sum())} / {int(prop['printed_fails'].sum())} / "
            f"{int(prop['corrected_fails'].sum())} of {len(prop)}",
            "paper": "0 / 0 (claimed)",
        }
    )
    fc = propagation[
        (propagation["net"] == "fc") & (propagation["method"] == "normprop") & (propagation["quantity"] == "output")
    ]
    seeds = fc["seed"].nunique() if "seed" in fc else 1
    for mode, g in fc.groupby("jacobian"):
        inside = first_seed(g).sort_values("layer")["in_band"].astype(bool).tolist()
        first_out = inside.index(False) + 1 if False in inside else None
        every = g.groupby("seed")["in_band"].all().sum() if "seed" in g else int(all(inside))
        rows.append(
            {
                "quantity": f"deep random NormProp net (factor {mode}): layers within 0±{cfg.theory.band} "
                f"mean, 1±{cfg.theory.band} std (first seed); seeds with every layer inside",
                "reproduced": f"{sum(inside)} of {len(inside)}"
                + (f" (first outside: layer {first_out})" if first_out else "")
                + f"; {int(every)} of {seeds}",
                "paper": "all (section 3.3)",
            }
        )
    return rows


def plot(cfg: DictConfig) -> list[Path]:
    """Redraw the four figures from the CSVs alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = out_dir(cfg)
    tables = {name: read_csv(out / f"{name}.csv", "normprop run theory") for name in CSVS}
    paths = []
    with plt.rc_context(
        {
            "font.size": 10,
            "axes.titlesize": 11,
            "legend.fontsize": 8.5,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    ):
        for stem, draw in (
            ("activation_stats", _fig_activation_stats),
            ("jacobian", _fig_jacobian),
            ("proposition1", _fig_proposition1),
            ("propagation", _fig_propagation),
        ):
            fig = draw(plt, tables, cfg)
            paths += io.save_figure(fig, out / stem)
            plt.close(fig)
    return paths


# ---- figures -------------------------------------------------------------------------------------


def _fig_activation_stats(plt, tables, cfg):
    df = tables["activation_stats"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.2), gridspec_kw={"width_ratios": [1, 1.15]})
    prelu = df[df["name"] == "prelu"].sort_values("param")
    for statistic, color in (("mean", "C0"), ("std", "C1"), ("jacobian_factor", "C2")):
        s = prelu[prelu["statistic"] == statistic]
        left.plot(s["param"], s["closed_form"], "-", color=color, label=f"{statistic} (Remark 2)")
        left.plot(s["param"], s["quadrature"], "o", mfc="none", color=color, ms=8)
        left.plot(s["param"], s["monte_carlo"], "x", color=color, ms=6)
    relu = df[df["name"] == "relu"]
    for _, r in relu.iterrows():
        left.plot(0.0, r["closed_form"], "*", color="k", ms=11, zorder=4)
    left.plot([], [], "o", mfc="none", color="0.3", label="quadrature")
    left.plot([], [], "x", color="0.3", label="Monte Carlo")
    left.plot([], [], "*", color="k", label="ReLU (Remark 1)")
    left.axhline(1.21, color="0.5", ls=":", lw=1)
    left.text(
        left.get_xlim()[1],
        1.21,
        "1.21 (section 3.4) ",
        ha="right",
        va="bottom",
        fontsize=8,
        color="0.4",
    )
    left.set_xlabel("PReLU slope a")
    left.set_ylabel("statistic of PReLU_a(X), X ~ N(0, 1)")
    left.set_title("ReLU and PReLU: closed form, quadrature, Monte Carlo")
    left.legend(frameon=False, loc="lower left")

    rest = df[~df["name"].isin(["relu", "prelu"])].reset_index(drop=True)
    labels = [
        (f"dropout p={r['param']:g}, {r['name']}" if r["quantity"] == "dropout" else r["name"]) + f":  {r['statistic']}"
        for _, r in rest.iterrows()
    ]
    y = np.arange(len(rest))[::-1]
    right.scatter(rest["closed_form"], y, marker="|", s=300, color="k", label="closed form", zorder=3)
    right.scatter(
        rest["quadrature"],
        y,
        marker="o",
        s=45,
        facecolors="none",
        edgecolors="C0",
        label="quadrature",
        zorder=3,
    )
    right.scatter(rest["monte_carlo"], y, marker="x", s=30, color="C3", label="Monte Carlo", zorder=3)
    right.scatter(rest["published"], y, marker="D", s=18, color="0.6", label="printed (paper, note)")
    right.set_yticks(y, labels, fontsize=8)
    right.grid(axis="x", color="0.9")
    right.set_xlabel("value")
    right.set_title("tanh, sigmoid (eq. 12), pooling and dropout (note)")
    right.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=4)
    fig.tight_layout()
    return fig


MODE_COLORS = {"off": "C3", "divide": "C0", "init": "C2"}


def _fig_jacobian(plt, tables, cfg):
    summary, hist = tables["jacobian"], tables["jacobian_histogram"]
    activations = list(dict.fromkeys(summary["activation"]))
    cols = 2 if len(activations) > 1 else 1
    rows = math.ceil(len(activations) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows + 0.8), squeeze=False)
    for ax, activation in zip(axes.flat, activations, strict=False):
        notes = []
        for mode, h in hist[hist["activation"] == activation].groupby("jacobian", sort=False):
            edges = np.append(h["bin_left"].to_numpy(), h["bin_right"].iloc[-1])
            color = MODE_COLORS.get(mode, "0.3")
            ax.stairs(h["count"].to_numpy(), edges, color=color, lw=1.5)
            this = (summary["activation"] == activation) & (summary["jacobian"] == mode)
            s = summary[this].iloc[0]
            ax.axvline(s["sv_rms"], color=color, lw=1.3)
            ax.axvline(s["predicted"], color=color, lw=1.3, ls="--")
            notes.append(f"{mode}: RMS {s['sv_rms']:.3f} (predicted {s['predicted']:.3f})")
        ax.text(
            0.98,
            0.97,
            "\n".join(notes),
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8.5,
            bbox={"facecolor": "white", "edgecolor": "0.8", "alpha": 0.9},
        )
        ax.set_yscale("log")
        slope = s["slope"]
        ax.set_title(activation + (f" (slope a = {slope:g})" if pd.notna(slope) else ""))
        ax.set_xlabel("singular value of d o / d x")
        ax.set_ylabel("count")
    for ax in list(axes.flat)[len(activations) :]:
        ax.set_visible(False)
    handles = [
        plt.Line2D([], [], color=MODE_COLORS.get(m, "0.3"), lw=1.5, label=f"jacobian={m}")
        for m in dict.fromkeys(summary["jacobian"])
    ]
    handles += [
        plt.Line2D([], [], color="0.3", lw=1.3, label="RMS singular value (measured)"),
        plt.Line2D([], [], color="0.3", lw=1.3, ls="--", label="predicted, section 3.4"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
    s0 = summary.iloc[0]
    fig.suptitle(
        f"Section 3.4: singular values of one NormProp layer's Jacobian\n"
        f"({int(s0['width'])} x {int(s0['width'])} Glorot W, "
        f"{int(s0['inputs'])} inputs x ~ N(0, I))"
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def _fig_proposition1(plt, tables, cfg):
    df = tables["proposition1"]
    ms = list(dict.fromkeys(df["m"]))
    first = df[df["m"] == ms[0]]
    labels = [
        c if n == "glorot" else f"{c}, |W_i| = {n}" for c, n in zip(first["case"], first["row_norms"], strict=True)
    ]
    fig, axes = plt.subplots(
        1,
        len(ms),
        figsize=(6.0 * len(ms) + 1.5, 0.36 * len(first) + 2.2),
        sharey=True,
        squeeze=False,
    )
    bars = (
        ("exact", "k", "exact: min over alpha (eq. 18 with alpha*)"),
        ("printed_bound", "C3", "bound of eq. 3 as printed"),
        ("corrected_bound", "C0", "bound corrected by the note"),
        ("coherence_bound", "C2", "corrected, without the extra m(m-1)"),
    )
    height, zero = 0.2, 1e-9  # below `zero`: rounding of an exact 0
    for ax, m in zip(axes[0], ms, strict=True):
        g = df[df["m"] == m].reset_index(drop=True)
        y = np.arange(len(g))[::-1].astype(float)
        values = g[[b[0] for b in bars]].to_numpy(dtype=float)
        floor = values[np.isfinite(values) & (values > zero)].min() / 5
        for k, (column, color, label) in enumerate(bars):
            v = g[column].to_numpy(dtype=float)
            yy = y + (1.5 - k) * height
            ok = np.isfinite(v) & (v > zero)
            ax.barh(yy[ok], v[ok] - floor, left=floor, height=height, color=color, label=label)
            for i in np.flatnonzero(np.isfinite(v) & (v <= zero)):
                ax.text(floor, yy[i], " 0", va="center", fontsize=7, color=color)
        for i, r in g.iterrows():
            yy = y[i] + 0.5 * height
            if r["printed_undefined"]:
                ax.text(
                    floor,
                    yy,
                    " undefined: radicand < 0",
                    va="center",
                    fontsize=7,
                    color="C3",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5},
                )
            elif r["printed_fails"]:
                ax.plot(r["printed_bound"], yy, "*", color="C3", ms=12, zorder=4)
                ax.text(
                    r["printed_bound"],
                    yy,
                    "FAILS: below the exact value   ",
                    va="center",
                    ha="right",
                    fontsize=8,
                    color="C3",
                    fontweight="bold",
                    bbox={"facecolor": "white", "edgecolor": "C3", "pad": 1.5},
                )
            for column, flag, k in (
                ("corrected_bound", "corrected_fails", 2),
                ("coherence_bound", "coherence_bound_fails", 3),
            ):
                if r[flag]:
                    ax.plot(r[column], y[i] + (1.5 - k) * height, "*", color="C3", ms=12, zorder=4)
        ax.set_xscale("log")
        ax.set_xlim(left=floor)
        ax.set_yticks(y, labels, fontsize=8.5)
        ax.set_ylim(-0.7, len(g) - 0.3)
        ax.set_xlabel(f"||Sigma - diag(alpha)||_F  (sigma = {cfg.theory.prop1_sigma:g})")
        ax.set_title(f"m = {m} rows, n = {int(g['n'].iloc[0])} columns")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=2, frameon=False)
    fig.suptitle("Proposition 1: the canonical error bound against the exact error")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def _fig_propagation(plt, tables, cfg):
    df = first_seed(tables["propagation"])
    nets = list(dict.fromkeys(df["net"]))
    fig, axes = plt.subplots(len(nets), 2, figsize=(12, 3.8 * len(nets)), squeeze=False)
    band = float(cfg.theory.band)
    for row, net in zip(axes, nets, strict=True):
        d = df[df["net"] == net]
        for (method, jacobian), g in d.groupby(["method", "jacobian"], sort=False, dropna=False):
            label = f"normprop, jacobian={jacobian}" if method == "normprop" else f"{method} (plain, Glorot)"
            color = MODE_COLORS.get(jacobian, "0.2") if method == "normprop" else "C1"
            for quantity, style in (("output", "-o"), ("pre_activation", ":")):
                q = g[g["quantity"] == quantity]
                for ax, stat in zip(row, ("mean", "std"), strict=True):
                    ax.plot(
                        q["layer"],
                        q[stat],
                        style,
                        color=color,
                        ms=3,
                        lw=1.4 if quantity == "output" else 1.0,
                        label=label if quantity == "output" else None,
                    )
        row[0].axhspan(-band, band, color="0.88", zorder=0)
        row[1].axhspan(1 - band, 1 + band, color="0.88", zorder=0)
        row[1].set_yscale("log")
        names = d.drop_duplicates("layer").sort_values("layer")
        for ax, stat in zip(row, ("mean", "std"), strict=True):
            ax.set_ylabel(f"{stat} over inputs and units")
            ax.set_title(f"{net.upper()}: {stat} of each layer (dotted: pre-activation)")
            if net == "nin":
                ax.set_xticks(names["layer"], names["name"], rotation=45, fontsize=8.5)
                # pooling: not re-normalised (section 3.2)
                for x in names.loc[names["kind"] == "pool", "layer"]:
                    ax.axvline(x, color="0.75", lw=0.8, ls="--", zorder=0)
            else:
                ax.set_xlabel("layer")
        row[0].legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig
