"""Beyond the paper (SPEC §11, drift): why a trained NormProp net's layer inputs leave N(0, 1).

    normprop run drift [--preset quick|cpu|paper]

Proposition 1 (section 3.2): if E[x x^T] = sigma^2 I and the rows of W are incoherent, u = W x has
a nearly diagonal covariance with var(u_i) = sigma^2 ||W_i||^2, so dividing by ||W_i|| keeps unit
variance layer after layer (section 3.3). Before training and after every epoch, over the evaluation
set, `SpreadProbe` measures that premise at the input x of every conv layer k = 1..9, in standard
units (experiments.probes): the spread of W_i * x / ||W_i|| against the spread of x, the coherence of
the rows of W, and how far x's patch covariance is from sigma^2 I. `PopulationProbe` (SPEC 6.1) gives
each layer's average |mean|, std and drift from initialisation.

runs/<run>/spread.csv      SPREAD_COLUMNS, one row per conv layer and epoch
runs/<run>/population.csv  probes.POPULATION_COLUMNS, layers 2..9
spread.csv       every run's spread rows, with run, setting, method, seed, width
population.csv   every run's population rows, with run, setting, method, seed, width
epochs.csv, curves.csv  every run's metrics; test accuracy per setting, mean and 95% CI over seeds
summary.csv      one row per run: engine columns + width, final_mean_ratio (final epoch, mean over
                 layers 1..9), final_population_abs_mean, final_population_drift, final_population_std
                 (final epoch, mean over layers 2..9), final_test_acc, best_test_acc
drift.png/.pdf   the ratio per layer, the rows' mean |cos| beside random rows', the population's
                 average |mean| and drift, the input's top-eigenvector fraction, vs epoch
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

from normprop_cli.engine import expand_grid, run_sweep
from normprop_cli.experiments import results
from normprop_cli.experiments.covariate_shift import final_population
from normprop_cli.experiments.probes import Batches, PopulationProbe, batch_statistics_at_init, each_layer_input
from normprop_cli.experiments.results import learned_flags
from normprop_cli.nn.dependence import conv_of

SPREAD_COLUMNS = [
    "layer",
    "epoch",
    "input_std",  # RMS over input units (c, h, w) of each unit's std over the evaluation set
    "proj_std",  # RMS over output units (i, h, w) of the std of (W_i * x) / ||W_i||
    "ratio",  # proj_std / input_std: 1 under Prop. 1 with white input
    "coherence_max",  # mutual coherence of the rows of W: max_{i != j} |cos(W_i, W_j)|
    "coherence_mean",  # mean |cos(W_i, W_j)| over the pairs i < j
    "coherence_random",  # E|cos| of two independent isotropic rows of the same length (closed form)
    "input_top_eig_fraction",  # top eigenvalue / trace of the input's patch covariance (white: 1/n)
    "input_effective_rank",  # trace^2 / ||covariance||_F^2 (white: n)
    "patch_dim",  # n = in_channels x kernel height x kernel width
    "patch_samples",  # patches behind the covariance
]
RUN = ["run", "setting", "method", "seed", "width"]
GROUP = ["method", "width"]
PREMISE = 1.2  # a mean ratio above this says the pre-activation's spread is not the input's
SHOWN_LAYERS = (4, 7)  # the wide 5x5 convs after the first, in the headlines
PROP1 = "1 (Prop. 1: white input, unit-norm rows)"
NOT_IN_PAPER = "not in the paper (SPEC §11)"


def unit_rows(weight: Tensor) -> Tensor:
    """The flattened filters W_i / ||W_i||, [out, in x kh x kw], float64."""
    return F.normalize(weight.detach().flatten(1).double(), dim=1)


def coherence(weight: Tensor) -> tuple[float, float]:
    """(max, mean) over pairs i != j of |cos(W_i, W_j)|, the mu of Prop. 1 and its average."""
    rows = unit_rows(weight)
    if len(rows) < 2:
        return math.nan, math.nan
    cos = (rows @ rows.T).abs()
    pairs = cos[torch.triu(torch.ones_like(cos, dtype=torch.bool), diagonal=1)]
    return pairs.max().item(), pairs.mean().item()


def random_coherence(n: int) -> float:
    """E|cos| of two independent isotropic (e.g. Gaussian) vectors in R^n, exactly:
    Gamma(n/2) / (sqrt(pi) Gamma((n+1)/2)), about sqrt(2 / (pi n)) for large n."""
    return math.exp(math.lgamma(n / 2) - math.lgamma((n + 1) / 2)) / math.sqrt(math.pi)


def full_patches(mask: Tensor, kernel, stride, padding) -> Tensor:
    """bool [H', W']: the output positions whose whole patch lies on input-dependent positions (no
    padding, no constant border): there the spread of W_i * x can be compared with the input's."""
    ones = torch.ones(1, 1, *kernel, dtype=torch.float64)
    seen = F.conv2d(mask[None, None].double().cpu(), ones, None, stride, padding)[0, 0]
    return seen == kernel[0] * kernel[1]


def spectrum(patches: Tensor) -> tuple[float, float]:
    """(top eigenvalue / trace, trace^2 / sum of squared eigenvalues) of the covariance of the rows
    of `patches` [samples, n]; from the smaller of X^T X and X X^T (same non-zero eigenvalues)."""
    x = patches.double()
    x = x - x.mean(0)
    gram = x @ x.T if len(x) < x.shape[1] else x.T @ x
    eig = torch.linalg.eigvalsh(gram).clamp_min(0.0)
    trace = eig.sum()
    if trace <= 0:
        return math.nan, math.nan
    return (eig[-1] / trace).item(), (trace * trace / eig.square().sum()).item()


class MapMoments:
    """Per-unit count, sum and sum of squares over images of a map [C, H, W], in float64 about a
    shift (the first image); on a CPU one image at a time: no map-sized temporaries (a probe's cost)."""

    def __init__(self) -> None:
        self.n, self.shift, self.s, self.ss = 0, None, None, None
        self.channels_last = False

    def add(self, v: Tensor) -> None:
        if self.shift is None:  # accumulate in memory order: [H, W, C] for channels-last maps
            self.channels_last = _memory_format(v) == torch.channels_last
        v = v.permute(0, 2, 3, 1) if self.channels_last else v
        if self.shift is None:
            self.shift = v[0].double()
            self.s, self.ss = torch.zeros_like(self.shift), torch.zeros_like(self.shift)
        step = 1 if v.device.type == "cpu" else 64  # a CUDA device wants fewer, larger kernels
        for part in v.split(step):
            d = part.double() - self.shift
            self.s += d.sum(0)
            self.ss += d.square().sum(0)
        self.n += len(v)

    def rms_std(self, mask: Tensor) -> float:
        """sqrt of the mean over the units at `mask` [H, W] of each unit's (population) variance."""
        m = self.s / self.n
        var = self.ss / self.n - m * m
        var = var.permute(2, 0, 1) if self.channels_last else var  # [C, H, W]
        return var[:, mask.to(var.device)].clamp_min(0.0).mean().sqrt().item()


class LayerSpread:
    """One conv layer's accumulators over the evaluation batches of one epoch."""

    def __init__(self, conv: nn.Module, mask: Tensor, positions: int, images: int, seed: int):
        self.weight = conv.weight.detach()
        self.kernel, self.stride, self.padding = _pair(conv.kernel_size), _pair(conv.stride), _pair(conv.padding)
        self.unit = self.weight / torch.linalg.vector_norm(self.weight.flatten(1), dim=1).view(-1, 1, 1, 1)
        self.inputs = mask
        self.outputs = full_patches(mask, self.kernel, self.stride, self.padding)
        self.where = torch.nonzero(self.outputs.flatten()).flatten()  # full-patch output positions
        self.positions, self.images_left = positions, images
        self.generator = torch.Generator().manual_seed(seed)
        self.x, self.u = MapMoments(), MapMoments()
        self.patches: list[Tensor] = []

    def add(self, x: Tensor) -> None:
        """x: [images, C, H, W], the layer's input in standard units."""
        self.x.add(x)
        unit = self.unit.to(x.dtype).to(memory_format=_memory_format(x))
        self.u.add(F.conv2d(x, unit, None, self.stride, self.padding))  # (W_i * x) / ||W_i||
        if self.images_left > 0 and self.positions > 0 and len(self.where):
            take = x[: self.images_left]
            self.images_left -= len(take)
            self.patches.append(self.sample(take))

    def sample(self, x: Tensor) -> Tensor:
        """`positions` patches per image at full-patch positions drawn from the fixed generator,
        flattened to [images x positions, C x kh x kw]."""
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.padding
        drawn = torch.randint(len(self.where), (len(x), self.positions), generator=self.generator)
        pos = self.where[drawn].to(x.device)
        cols = self.outputs.shape[1]
        rows = (pos // cols)[..., None] * sh + torch.arange(kh, device=x.device)  # [b, p, kh]
        cols = (pos % cols)[..., None] * sw + torch.arange(kw, device=x.device)  # [b, p, kw]
        image = torch.arange(len(x), device=x.device)[:, None, None, None]
        # A full patch never reaches the padding: index the unpadded map, shifted by the padding.
        patch = x.permute(0, 2, 3, 1)[image, rows[..., :, None] - ph, cols[..., None, :] - pw]  # [b, p, kh, kw, C]
        return patch.permute(0, 1, 4, 2, 3).reshape(len(x) * self.positions, -1).double()

    def row(self) -> dict:
        input_std, proj_std = self.x.rms_std(self.inputs), self.u.rms_std(self.outputs)
        top, rank = spectrum(torch.cat(self.patches)) if self.patches else (math.nan, math.nan)
        cmax, cmean = coherence(self.weight)
        n = self.weight[0].numel()
        return {
            "input_std": input_std,
            "proj_std": proj_std,
            "ratio": proj_std / input_std if input_std > 0 else math.nan,
            "coherence_max": cmax,
            "coherence_mean": cmean,
            "coherence_random": random_coherence(n),
            "input_top_eig_fraction": top,
            "input_effective_rank": rank,
            "patch_dim": n,
            "patch_samples": sum(len(p) for p in self.patches),
        }


def _memory_format(x: Tensor) -> torch.memory_format:
    channels_last = not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
    return torch.channels_last if channels_last else torch.contiguous_format


class SpreadProbe:
    """Prop. 1's premise at the input x of every conv layer k = 1..9 (SPREAD_COLUMNS). The patches
    of the covariance come from the first `images` evaluation images, `positions` per image at
    positions drawn from a generator seeded by the layer alone: the same patches for every method,
    epoch and resume. Nothing is carried across epochs, so there is no state to checkpoint."""

    name = "spread"

    def __init__(self, positions: int = 4, images: int = 512, first_layer: int = 1):
        self.positions, self.images, self.first_layer = positions, images, first_layer

    def observe(self, model: nn.Module, batches: Batches, epoch: int) -> list[dict]:
        convs = [conv_of(m) for m in model.hidden_layers()]
        layers: dict[int, LayerSpread] = {}

        def visit(k, x, mask, to_standard):
            if k not in layers:
                layers[k] = LayerSpread(convs[k - 1], mask.cpu(), self.positions, self.images, seed=k)
            layers[k].add(to_standard(x))

        # Epoch 0 sees BatchNorm with its batch statistics, as the other probes do.
        with batch_statistics_at_init(model, batches) if epoch == 0 else nullcontext():
            each_layer_input(model, batches, self.first_layer, visit)
        return [{"layer": k, "epoch": epoch} | layers[k].row() for k in sorted(layers)]


def run(cfg: DictConfig) -> Path:
    specs = expand_grid(cfg)
    positions, images = int(cfg.experiment.patch_positions), int(cfg.experiment.patch_images)
    manifests = run_sweep(cfg, specs, observers=lambda spec: [SpreadProbe(positions, images), PopulationProbe()])
    width = {"width": "model.width"}
    spread = results.gather(specs, SpreadProbe.name, width)
    population = results.gather(specs, PopulationProbe.name, width)
    results.write(cfg, "spread", spread)
    results.write(cfg, "population", population)

    def columns(spec) -> dict:
        s = results.of_run(spread, spec.name)
        final = {"final_mean_ratio": s.loc[s["epoch"] == s["epoch"].max(), "ratio"].mean()} if len(s) else {}
        p = final_population(population, spec.name)
        if p:
            last = results.of_run(population, spec.name)
            p["final_population_std"] = last.loc[last["epoch"] == last["epoch"].max(), "avg_std"].mean()
        return {"width": spec.cfg.model.width} | final | p

    out = results.write_curves_and_summary(cfg, specs, manifests, results.gather(specs), ["setting"], columns)
    plot(cfg)
    return out


# -- reading the CSVs: figures, headlines and findings never need a model ---------------------------


def _learned(cfg: DictConfig, table: pd.DataFrame) -> pd.DataFrame:
    """The rows of runs that learned (SPEC 6.1: the others stay in the CSVs, out of the headlines)."""
    summary = results.read(cfg, "summary")
    if "learned" not in summary or not len(table):
        return table
    kept = summary.loc[learned_flags(summary).eq(True), "run"]
    return table[table["run"].isin(kept)]


def _groups(table: pd.DataFrame):
    """(method, width) groups, NormProp first, narrow before wide."""
    if not len(table):
        return []
    groups = table.groupby(GROUP, sort=False)
    return sorted(groups, key=lambda g: (results.method_rank(g[0][0]), g[0][1]))


def _label(key, g: pd.DataFrame) -> str:
    method, width = key
    seeds = g["seed"].nunique()
    return f"{results.method_label(method)}, width {width:g} ({seeds} seed{'s' if seeds > 1 else ''})"


def _by_epoch(g: pd.DataFrame, column: str, layers=None) -> pd.Series:
    """Per epoch: the mean over layers (all, or `layers`) of each seed's value, then over seeds."""
    if layers is not None:
        g = g[g["layer"].isin(layers)]
    return g.groupby(["epoch", "seed"])[column].mean().groupby("epoch").mean()


def plot(cfg: DictConfig) -> list[Path]:
    """Row 1: the ratio per layer vs epoch, one panel per (method, width); row 2: the rows' mean
    |cos| per layer (dotted: random rows of the same length); row 3: the population's average |mean|
    and average drift (mean over layers 2..9) and the input's top-eigenvector fraction (mean over
    layers 1..9), one line per (method, width). Means over seeds."""
    from matplotlib.ticker import MaxNLocator

    plt = results.pyplot()
    spread, population = results.read(cfg, "spread"), results.read(cfg, "population")
    groups = _groups(spread)
    ncol = max(3, len(groups))
    fig, axes = plt.subplots(3, ncol, figsize=(3.6 * ncol, 9.4), squeeze=False)
    for ax in axes[0, 1 : len(groups)]:
        ax.sharey(axes[0, 0])  # one scale for every ratio panel
    layers = sorted(spread["layer"].unique())
    colours = plt.get_cmap("viridis")(np.linspace(0.0, 0.9, len(layers)))
    for col, (key, g) in enumerate(groups):
        for layer, colour in zip(layers, colours, strict=True):
            at = g[g["layer"] == layer]
            axes[0, col].plot(*_xy(_by_epoch(at, "ratio")), color=colour, marker="o", markersize=2, label=f"{layer}")
            axes[1, col].plot(*_xy(_by_epoch(at, "coherence_mean")), color=colour, marker="o", markersize=2)
            axes[1, col].axhline(at["coherence_random"].mean(), color=colour, linestyle=":", linewidth=0.8)
        axes[0, col].axhline(1.0, color="0.4", linestyle="--", linewidth=0.8)
        axes[0, col].set_title(_label(key, g), fontsize=8)
        axes[0, col].set_ylabel("std(W_i x / ||W_i||) / std(x)", fontsize=7)
        axes[1, col].set_ylabel("mean |cos(W_i, W_j)| (dotted: random)", fontsize=7)
    for ax in axes[0, len(groups) :]:
        ax.axis("off")
    for ax in axes[1, len(groups) :]:
        ax.axis("off")
    axes[0, 0].legend(title="layer", fontsize=6, title_fontsize=6, ncol=3, frameon=False)
    bottom = [
        (population, "avg_abs_mean", "average |mean|, layers 2-9 (N(0,1): 0)"),
        (population, "avg_drift", "average drift (initial stds), layers 2-9"),
        (spread, "input_top_eig_fraction", "input's top-eigenvector fraction, layers 1-9"),
    ]
    narrow = spread["width"].min()
    for ax, (table, column, what) in zip(axes[2], bottom, strict=False):
        for key, g in _groups(table):
            style = {"color": results.METHOD_COLORS.get(key[0], "C2"), "linestyle": "--" if key[1] > narrow else "-"}
            ax.plot(*_xy(_by_epoch(g, column)), marker="o", markersize=2, label=_label(key, g), **style)
        ax.set_ylabel(what, fontsize=7)
    axes[2, 0].legend(fontsize=6, frameon=False)
    for ax in axes.flat:
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[-1]:
        ax.set_xlabel("epoch")
    fig.suptitle(
        results.title(cfg, "Drift (SPEC §11): Prop. 1's premise over training, per conv layer's input"), fontsize=10
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return results.save(fig, cfg, "drift")


def _xy(series: pd.Series):
    return series.index.to_numpy(), series.to_numpy()


def _at(g: pd.DataFrame, column: str, epoch: int, layers=None) -> dict:
    """mean_ci over seeds of each seed's mean over layers of `column` at `epoch`."""
    g = g[g["epoch"] == epoch]
    if layers is not None:
        g = g[g["layer"].isin(layers)]
    return results.mean_ci(g.groupby("seed")[column].mean())


def _fmt(ci: dict, digits: int = 2) -> str:
    return results.format_ci(ci["mean"], ci["ci_low"], ci["ci_high"], digits)


def headlines(cfg: DictConfig) -> list[dict]:
    """Per (method, width): the ratio at initialisation and at the final epoch (mean over layers,
    and in layers 4 and 7), the rows' mean |cos| and mutual coherence, the input's top-eigenvector
    fraction, and the population's average |mean|, std and drift; mean [95% CI] over seeds."""
    spread = _learned(cfg, results.read(cfg, "spread"))
    population = _learned(cfg, results.read(cfg, "population"))
    rows = []
    for key, g in _groups(spread):
        label, last = _label(key, g), int(g["epoch"].max())
        rows.append(_row(f"ratio std(W_i x/||W_i||) / std(x) at initialisation, mean over layers 1-9, {label}",
                         _fmt(_at(g, "ratio", 0)), PROP1))  # fmt: skip
        rows.append(_row(f"ratio at epoch {last}, mean over layers 1-9, {label}", _fmt(_at(g, "ratio", last)), PROP1))
        for layer in SHOWN_LAYERS:
            if layer in set(g["layer"]):
                ratio = f"{_fmt(_at(g, 'ratio', 0, [layer]))} -> {_fmt(_at(g, 'ratio', last, [layer]))}"
                rows.append(_row(f"ratio in layer {layer}, initialisation -> epoch {last}, {label}", ratio, PROP1))
        cos = f"{_fmt(_at(g, 'coherence_mean', 0), 3)} -> {_fmt(_at(g, 'coherence_mean', last), 3)}"
        random = _at(g, "coherence_random", last)["mean"]
        rows.append(_row(f"rows' mean |cos|, mean over layers, initialisation -> epoch {last} (random rows of the "
                         f"same length: {random:.3f}), {label}", cos, "incoherent rows (section 3.2)"))  # fmt: skip
        mu = f"{_fmt(_at(g, 'coherence_max', 0), 3)} -> {_fmt(_at(g, 'coherence_max', last), 3)}"
        rows.append(_row(f"mutual coherence mu, mean over layers, initialisation -> epoch {last}, {label}", mu,
                         "small mu (Prop. 1, eq. 3)"))  # fmt: skip
        top = f"{_fmt(_at(g, 'input_top_eig_fraction', 0), 3)} -> {_fmt(_at(g, 'input_top_eig_fraction', last), 3)}"
        white = (1.0 / g["patch_dim"]).mean()
        rows.append(_row(f"input patch covariance: top-eigenvector share of the trace, mean over layers, "
                         f"initialisation -> epoch {last}, {label}", top,
                         f"{white:.4f} (mean 1/n: E[xx^T] = sigma^2 I)"))  # fmt: skip
    for key, g in _groups(population):
        label, last = _label(key, g), int(g["epoch"].max())
        for column, what, paper in (
            ("avg_abs_mean", "average |mean|", "0 (section 3.3: N(0,1) inputs)"),
            ("avg_std", "average std", "1 (section 3.3: N(0,1) inputs)"),
            ("avg_drift", "average drift from initialisation (initial stds)", NOT_IN_PAPER),
        ):
            rows.append(_row(f"layer inputs' {what} at epoch {last}, all units, mean over layers 2-9, {label}",
                             _fmt(_at(g, column, last), 3), paper))  # fmt: skip
    return rows + results.not_learned(cfg)


def _row(quantity: str, reproduced, paper="") -> dict:
    return {"quantity": quantity, "reproduced": reproduced, "paper": paper}


def _summary(spread: pd.DataFrame, population: pd.DataFrame) -> dict:
    """Per (method, width): the numbers the findings cite, means over seeds (and layers)."""
    out = {}
    for (method, width), g in _groups(spread):
        last = int(g["epoch"].max())
        by_layer = g[g["epoch"] == last].groupby("layer")["ratio"].mean()
        seeds = g["seed"].nunique()
        final = g[g["epoch"] == last]
        out[method, width] = {
            "label": f"width {width:g}, {seeds} seed{'s' if seeds > 1 else ''}",
            "width": width,
            "last": last,
            "layer_span": f"{int(g['layer'].min())}-{int(g['layer'].max())}",
            "ratio0": _at(g, "ratio", 0)["mean"],
            "ratio": _at(g, "ratio", last)["mean"],
            "layers": {k: by_layer[k] for k in SHOWN_LAYERS if k in by_layer.index},
            "max_layer": int(by_layer.idxmax()),
            "max_ratio": float(by_layer.max()),
            "cos0": _at(g, "coherence_mean", 0)["mean"],
            "cos": _at(g, "coherence_mean", last)["mean"],
            "cos_random": _at(g, "coherence_random", last)["mean"],
            "mu0": _at(g, "coherence_max", 0)["mean"],
            "mu": _at(g, "coherence_max", last)["mean"],
            "top0": _at(g, "input_top_eig_fraction", 0)["mean"],
            "top": _at(g, "input_top_eig_fraction", last)["mean"],
            "white": float((1.0 / g["patch_dim"]).mean()),
            "ceiling": float(np.sqrt(final["input_top_eig_fraction"] * final["patch_dim"]).mean()),
        }
        p = population[(population["method"] == method) & (population["width"] == width)]
        if len(p):
            p_last = int(p["epoch"].max())
            for column in ("avg_abs_mean", "avg_std", "avg_drift"):
                out[method, width] |= {column: _at(p, column, p_last)["mean"], f"{column}0": _at(p, column, 0)["mean"]}
    return out


def paragraphs(cfg: DictConfig) -> list[str]:
    """The finding in sentences, every number read from spread.csv and population.csv (runs that
    learned only): C2 on the population measure, the spread ratio, the wide run, Prop. 1's premise."""
    s = _summary(_learned(cfg, results.read(cfg, "spread")), _learned(cfg, results.read(cfg, "population")))
    if not s:
        return []
    narrow = min(width for _, width in s)
    normprop, bn = s.get(("normprop", narrow)), s.get(("batchnorm", narrow))
    wide = [v for (method, width), v in s.items() if method == "normprop" and width > narrow]
    texts = []
    if normprop and bn and "avg_abs_mean" in normprop and "avg_abs_mean" in bn:
        texts.append(_population_finding(normprop, bn))
    if normprop:
        texts.append(_ratio_finding(normprop, bn))
    texts += [_wide_finding(w, normprop, bn) for w in wide]
    if normprop:
        texts.append(_premise_finding(normprop))
    return texts


def _population_finding(normprop: dict, bn: dict) -> str:
    further = normprop["avg_abs_mean"] > bn["avg_abs_mean"] and normprop["avg_drift"] > bn["avg_drift"]
    closer = normprop["avg_abs_mean"] < bn["avg_abs_mean"] and normprop["avg_drift"] < bn["avg_drift"]
    if further:
        end = (
            "further from N(0, 1), and from where they started, than BatchNorm's, which contradicts claim C2 "
            "(NormProp's hidden-layer inputs stay closer to a fixed distribution than BatchNorm's) on this measure"
        )
    elif closer:
        end = "closer to N(0, 1), and to where they started, than BatchNorm's, which supports claim C2 on this measure"
    else:
        end = (
            "neither further from nor closer to N(0, 1) than BatchNorm's on both counts: claim C2 stays undecided here"
        )
    return (
        f"Over all input-dependent units of layers 2-9 and the evaluation set, after {normprop['last']} epochs "
        f"NormProp's layer inputs ({normprop['label']}) have an average |mean| of {normprop['avg_abs_mean']:.2f} "
        f"and an average std of {normprop['avg_std']:.2f} (at initialisation {normprop['avg_abs_mean0']:.2f} and "
        f"{normprop['avg_std0']:.2f}), and have drifted {normprop['avg_drift']:.2f} initial stds on average; "
        f"BatchNorm's ({bn['label']}) {bn['avg_abs_mean']:.2f} and {bn['avg_std']:.2f} (at initialisation "
        f"{bn['avg_abs_mean0']:.2f} and {bn['avg_std0']:.2f}), and {bn['avg_drift']:.2f}. NormProp's inputs end {end}."
    )


def _ratio_finding(normprop: dict, bn: dict | None) -> str:
    layers = ", ".join(f"layer {k}: {v:.2f}" for k, v in normprop["layers"].items())
    text = (
        "The spread of W_i x / ||W_i|| relative to the spread of its input x, which Proposition 1 with white "
        f"input and unit-norm rows puts at 1, averages {normprop['ratio0']:.2f} over NormProp's layers "
        f"{normprop['layer_span']} at initialisation and {normprop['ratio']:.2f} after {normprop['last']} epochs "
        f"({layers}; largest in layer {normprop['max_layer']}: {normprop['max_ratio']:.2f})."
    )
    if bn:
        text += (
            f" BatchNorm's filters go from {bn['ratio0']:.2f} to {bn['ratio']:.2f}, but BatchNorm divides by the "
            "measured std, so its ratio never reaches its layer outputs; NormProp divides by ||W_i|| alone (eq. 11), "
            "so the ratio passes into its pre-activation's std, beside gamma_i and the Jacobian factor."
        )
    if normprop["ratio"] > PREMISE:
        return text + " The trained filters have lined up with high-variance directions of their input."
    return text + (
        f" The ratio stays below {PREMISE:g}: in this budget the filters have not lined up with their input's "
        "high-variance directions enough to explain a drift."
    )


def _wide_finding(wide: dict, normprop: dict | None, bn: dict | None) -> str:
    name = "full-width" if wide["width"] >= 1.0 else "wider"
    numbers = (
        f"the ratio goes from {wide['ratio0']:.2f} to {wide['ratio']:.2f} after {wide['last']} epochs (largest in "
        f"layer {wide['max_layer']}: {wide['max_ratio']:.2f})"
    )
    if "avg_abs_mean" in wide:
        numbers += (
            f", the average |mean| is {wide['avg_abs_mean']:.2f}, the average std {wide['avg_std']:.2f} and the "
            f"drift {wide['avg_drift']:.2f}"
        )
    if normprop is None:
        return f"The {name} NormProp run ({wide['label']}): {numbers}."
    same = (wide["ratio"] > PREMISE) == (normprop["ratio"] > PREMISE)
    if bn and "avg_abs_mean" in bn and "avg_abs_mean" in wide and "avg_abs_mean" in normprop:
        numbers += f" (BatchNorm's average |mean|: {bn['avg_abs_mean']:.2f})"
        same &= (wide["avg_abs_mean"] > bn["avg_abs_mean"]) == (normprop["avg_abs_mean"] > bn["avg_abs_mean"])
    verdict = "the same, so the narrow width does not explain it" if same else "otherwise: the width may matter"
    return f"The {name} NormProp run ({wide['label']}) shows {verdict}: {numbers}."


def _premise_finding(normprop: dict) -> str:
    text = (
        "Proposition 1 assumes E[xx^T] = sigma^2 I and incoherent rows of W. The patch covariance of NormProp's "
        f"layer inputs puts {normprop['top0']:.3f} of its trace on its top eigenvector at initialisation and "
        f"{normprop['top']:.3f} after training (mean over layers; white input would give {normprop['white']:.4f}), "
        f"so the input is far from sigma^2 I from the start. The rows' mean |cos| goes from {normprop['cos0']:.3f} "
        f"to {normprop['cos']:.3f} (independent random rows of the same length: {normprop['cos_random']:.3f}) and "
        f"their mutual coherence from {normprop['mu0']:.2f} to {normprop['mu']:.2f}. With correlated input, rows in "
        "random directions still see the average variance (a ratio near 1 at initialisation), but a row along the "
        f"top eigenvector would see about sqrt(n x top share) = {normprop['ceiling']:.1f} times the input's std "
        "(mean over layers). "
    )
    if normprop["ratio"] > PREMISE:
        return text + (
            f"After training the ratio is {normprop['ratio']:.2f}: the premise fails, the canonical-covariance "
            "argument no longer holds, and dividing by ||W_i|| no longer gives a pre-activation of its input's "
            "variance."
        )
    return text + (
        f"After training the ratio is {normprop['ratio']:.2f}, within {PREMISE:g} of the premise's 1: in this budget "
        "the data do not show the canonical-covariance argument failing."
    )
