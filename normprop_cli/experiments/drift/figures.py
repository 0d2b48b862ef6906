"""drift.png/.pdf, from spread.csv and population.csv alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from normprop_cli.experiments import results
from normprop_cli.experiments.drift.tables import by_epoch, by_group, group_label


def plot(cfg: DictConfig) -> list[Path]:
    """Row 1: the ratio per layer vs epoch, one panel per (method, width); row 2: the rows' mean
    |cos| per layer (dotted: random rows of the same length); row 3: the population's average |mean|
    and average drift (mean over layers 2..9) and the input's top-eigenvector fraction (mean over
    layers 1..9), one line per (method, width). Means over seeds."""
    from matplotlib.ticker import MaxNLocator

    plt = results.pyplot()
    spread, population = results.read(cfg, "spread"), results.read(cfg, "population")
    groups = by_group(spread)
    ncol = max(3, len(groups))
    fig, axes = plt.subplots(3, ncol, figsize=(3.6 * ncol, 9.4), squeeze=False)
    for ax in axes[0, 1 : len(groups)]:
        ax.sharey(axes[0, 0])  # one scale for every ratio panel
    layers = sorted(spread["layer"].unique())
    colours = plt.get_cmap("viridis")(np.linspace(0.0, 0.9, len(layers)))
    for col, (key, g) in enumerate(groups):
        for layer, colour in zip(layers, colours, strict=True):
            at = g[g["layer"] == layer]
            axes[0, col].plot(*_xy(by_epoch(at, "ratio")), color=colour, marker="o", markersize=2, label=f"{layer}")
            axes[1, col].plot(*_xy(by_epoch(at, "coherence_mean")), color=colour, marker="o", markersize=2)
            axes[1, col].axhline(at["coherence_random"].mean(), color=colour, linestyle=":", linewidth=0.8)
        axes[0, col].axhline(1.0, color="0.4", linestyle="--", linewidth=0.8)
        axes[0, col].set_title(group_label(key, g), fontsize=8)
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
        for key, g in by_group(table):
            style = {"color": results.METHOD_COLORS.get(key[0], "C2"), "linestyle": "--" if key[1] > narrow else "-"}
            ax.plot(*_xy(by_epoch(g, column)), marker="o", markersize=2, label=group_label(key, g), **style)
        ax.set_ylabel(what, fontsize=7)
    axes[2, 0].legend(fontsize=6, frameon=False)
    for ax in axes.flat:
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[-1]:
        ax.set_xlabel("epoch")
    fig.suptitle(results.title(cfg, "Drift: Prop. 1's premise over training, per conv layer's input"), fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return results.save(fig, cfg, "drift")


def _xy(series: pd.Series):
    return series.index.to_numpy(), series.to_numpy()
