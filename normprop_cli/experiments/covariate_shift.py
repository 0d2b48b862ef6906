"""Fig. 2 (section 5.2): internal covariate shift. Before training and after every epoch, the mean
and std over the test set of the input to one randomly chosen, fixed unit of each hidden layer 2..9.

    normprop run covariate-shift [--preset paper]

runs/<run>/unit_stats.csv  layer, channel, row, col, epoch, n, mean, std (the probe's rows)
unit_stats.csv   the same for every run, with run, setting, method, seed, initial_lr
settling.csv     method, seed, layer, band, final_epoch, final_mean, settled_after_epoch, settled:
                 the first epoch from which the mean stays within +-band of its final value
summary.csv      one row per run: engine columns + initial_lr, avg_abs_final_mean (over layers
                 2..9), band, last_settled_after_epoch (the latest over the layers)
covariate_shift.png/.pdf  the mean vs epoch, one panel per layer, the methods as lines
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from matplotlib.ticker import MaxNLocator
from omegaconf import DictConfig

from normprop_cli.engine import expand_grid, run_sweep
from normprop_cli.engine.summary import run_row, write_summary
from normprop_cli.experiments import curves

FIRST_LAYER = 2  # Fig. 2 shows the inputs of the last 8 of the 9 conv layers
PROBE = ["layer", "channel", "row", "col", "epoch", "n", "mean", "std"]  # runs/<run>/unit_stats.csv
SETTLING = ["run", "setting", "method", "seed", "layer", "band", "final_epoch", "final_mean",
            "settled_after_epoch", "settled"]  # fmt: skip


class UnitProbe:
    """An Observer (engine.trainer): the input of one unit (channel, row, col) of each hidden layer
    2..9, hooked before the layer, in evaluation mode. The units are drawn from the run's seed
    alone, so every method of a seed probes the same units, and a resumed run the same as before.
    At epoch 0 BN's running estimates are still their initial (0, 1): BN has seen no data yet."""

    name = "unit_stats"

    def __init__(self, seed: int):
        self.seed = seed

    def unit(self, layer: int, shape: torch.Size) -> tuple[int, int, int]:
        """The unit of `layer` for inputs of `shape` (C, H, W): uniform, from (seed, layer) only."""
        rng = np.random.default_rng([self.seed, layer])
        return tuple(int(rng.integers(size)) for size in shape)

    @torch.no_grad()
    def observe(self, model: torch.nn.Module, batches: Callable[[], Iterator], epoch: int) -> list[dict]:
        acc: dict[int, dict] = {}

        def hook(layer):
            def record(module, inputs):
                x = inputs[0]
                if layer not in acc:
                    unit = self.unit(layer, x.shape[1:])
                    acc[layer] = {"unit": unit, "n": 0, "s": 0.0, "ss": 0.0}
                a = acc[layer]
                v = x[(slice(None), *a["unit"])].double()
                a["n"] += v.numel()
                a["s"] += v.sum().item()
                a["ss"] += v.square().sum().item()

            return record

        layers = model.hidden_layers()[FIRST_LAYER - 1 :]
        handles = [m.register_forward_pre_hook(hook(k)) for k, m in enumerate(layers, start=FIRST_LAYER)]
        training = model.training
        model.eval()
        try:
            for x, _ in batches():
                model(x)
        finally:
            for h in handles:
                h.remove()
            model.train(training)
        rows = []
        for layer in sorted(acc):
            a = acc[layer]
            mean = a["s"] / a["n"]
            std = max(a["ss"] / a["n"] - mean * mean, 0.0) ** 0.5
            values = (layer, *a["unit"], epoch, a["n"], mean, std)
            rows.append(dict(zip(PROBE, values, strict=True)))
        return rows


def settling(stats: pd.DataFrame, band: float) -> pd.DataFrame:
    """Per run and layer: the first epoch from which the unit's mean stays within +-band of its
    final value (`settled` is False when only the last epoch is: not settled before the end)."""
    if not len(stats):
        return pd.DataFrame(columns=SETTLING)
    rows = []
    for (run, setting, method, seed, layer), g in stats.groupby(SETTLING[:5], sort=False):
        g = g.sort_values("epoch")
        means, epochs = g["mean"].to_numpy(), g["epoch"].to_numpy()
        outside = np.flatnonzero(np.abs(means - means[-1]) > band)
        first = int(epochs[outside[-1] + 1]) if len(outside) else int(epochs[0])
        values = (run, setting, method, seed, layer, band, int(epochs[-1]), means[-1], first,
                  bool(first < epochs[-1]))  # fmt: skip
        rows.append(dict(zip(SETTLING, values, strict=True)))
    return pd.DataFrame(rows, columns=SETTLING)


def run(cfg: DictConfig) -> Path:
    specs = expand_grid(cfg)
    manifests = run_sweep(cfg, specs, observers=lambda spec: [UnitProbe(spec.seed)])
    stats = curves.gather(specs, UnitProbe.name, columns={"initial_lr": "train.lr"})
    curves.write(cfg, "unit_stats", stats)
    band = float(cfg.experiment.band)
    settled = settling(stats, band)
    curves.write(cfg, "settling", settled)
    rows = []
    for spec, manifest in zip(specs, manifests, strict=True):
        row = run_row(spec, manifest) | {"initial_lr": spec.cfg.train.lr, "band": band}
        s = settled[settled["run"] == spec.name] if len(settled) else settled
        if len(s):
            row |= {
                "avg_abs_final_mean": s["final_mean"].abs().mean(),
                "last_settled_after_epoch": int(s["settled_after_epoch"].max()),
            }
        rows.append(row)
    out = write_summary(cfg, rows)
    plot(cfg)
    return out


def plot(cfg: DictConfig) -> list[Path]:
    """Fig. 2: one panel per hidden layer 2..9, the unit's mean vs epoch per method. The
    unnormalised net, "incomparable due to extreme variations", has its own axis on the right."""
    plt = curves.pyplot()
    stats = curves.read(cfg, "unit_stats")
    layers = sorted(stats["layer"].unique())
    first_seed = stats["seed"].min()
    fig, axes = plt.subplots(2, (len(layers) + 1) // 2, figsize=(13, 5.8), sharex=True, squeeze=False)
    handles = {}
    for ax, layer in zip(axes.flat, layers, strict=False):
        ax.axhline(0.0, color="0.6", linewidth=0.6, linestyle=":")
        right = None
        for (method, seed), g in stats[stats["layer"] == layer].groupby(["method", "seed"], sort=False):
            if method == "none":
                right = right or ax.twinx()
            first = seed == first_seed
            (line,) = (right if method == "none" else ax).plot(
                g["epoch"],
                g["mean"],
                color=curves.METHOD_COLORS.get(method, "C2"),
                marker="o",
                markersize=2,
                linewidth=1.2 if first else 0.6,
                alpha=1.0 if first else 0.4,
                linestyle="--" if method == "none" else "-",
            )
            where = " (right axis)" if method == "none" else ""
            handles.setdefault(f"{curves.method_label(method)}, lr {g['initial_lr'].iloc[0]:g}{where}", line)
        if right is not None:
            right.tick_params(axis="y", colors=curves.METHOD_COLORS["none"], labelsize=7)
            _readable(right)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        _readable(ax)
        unit = stats[(stats["layer"] == layer) & (stats["seed"] == first_seed)].iloc[0]
        ax.set_title(
            f"layer {layer}, unit (c, h, w) = ({unit['channel']}, {unit['row']}, {unit['col']})"
            + (f", seed {first_seed}" if stats["seed"].nunique() > 1 else ""),
            fontsize=8,
        )
    for ax in axes[-1]:
        ax.set_xlabel("epoch")
    for ax in axes[:, 0]:
        ax.set_ylabel("input mean")
    for ax in list(axes.flat)[len(layers) :]:
        ax.axis("off")
    fig.legend(
        handles.values(),
        handles.keys(),
        loc="lower center",
        ncol=len(handles),
        frameon=False,
        fontsize=8,
    )
    seeds = "" if stats["seed"].nunique() == 1 else "; thin lines: other seeds, other units"
    fig.suptitle(
        curves.title(
            cfg,
            f"Fig. 2: mean over the test set of the input to one fixed unit per hidden layer{seeds}",
        ),
        fontsize=10,
    )
    fig.subplots_adjust(left=0.05, right=0.95, bottom=0.15, top=0.88, wspace=0.4, hspace=0.3)
    return curves.save(fig, cfg, "covariate_shift")


def _readable(ax) -> None:
    """No offset notation, and a y range of at least 5% of the values' size, so that a near-constant
    line does not fill the panel with digits."""
    lo, hi = ax.get_ylim()
    span = max(hi - lo, 0.05 * max(abs(lo), abs(hi), 0.1))
    middle = (lo + hi) / 2
    ax.set_ylim(middle - span / 2, middle + span / 2)
    ax.ticklabel_format(axis="y", useOffset=False)


def headlines(cfg: DictConfig) -> list[dict]:
    """Average |final mean| over layers 2..9 per method; when every layer's mean settles."""
    settled = curves.read(cfg, "settling")
    if not len(settled):
        return []
    paper_avg = cfg.experiment.paper_avg_abs_final_mean
    paper_settled = cfg.experiment.paper_settled
    band = settled["band"].iloc[0]
    rows = []
    for method, g in settled.groupby("method", sort=False):
        per_run = g.assign(a=g["final_mean"].abs()).groupby("run")["a"].mean()
        rows.append(
            {
                "quantity": f"average |final mean| of the probed inputs, layers 2-9, {curves.method_label(method)}",
                "reproduced": round(float(per_run.mean()), 3),
                "paper": paper_avg.get(method, ""),
            }
        )
    for method, g in settled.groupby("method", sort=False):
        never = sorted(g.loc[~g["settled"], "layer"].unique().tolist())
        epochs = int(g["final_epoch"].max())
        if never:
            text = f"not by epoch {epochs}: layer(s) {', '.join(map(str, never))} still moving"
        else:
            text = f"{int(g['settled_after_epoch'].max())} of {epochs}"
        rows.append(
            {
                "quantity": f"epoch after which every layer's mean stays within +-{band:g} "
                f"of its final value, {curves.method_label(method)}",
                "reproduced": text,
                "paper": paper_settled.get(method, ""),
            }
        )
    return rows
