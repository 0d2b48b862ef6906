"""drift.png/.pdf, from spread.csv and population.csv alone (the main settings: tables.main_rows); where the
grid has ablations, drift_ablation.png/.pdf from population.csv, summary.csv and affine.csv; where it has
in-epoch probes, drift_steps.png/.pdf from spread_steps.csv and population_steps.csv."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from normprop_cli.experiments import plots
from normprop_cli.experiments import tables as run_tables
from normprop_cli.experiments.drift.ablation import label, read_optional
from normprop_cli.experiments.drift.mean_report import plot_mean
from normprop_cli.experiments.drift.tables import (
    ablation_settings,
    by_epoch,
    by_group,
    group_label,
    learned_rows,
    main_rows,
)


def plot(cfg: DictConfig) -> list[Path]:
    """Row 1: the ratio per layer vs epoch, one panel per (method, width); row 2: the rows' mean
    |cos| per layer (dotted: random rows of the same length); row 3: the population's average |mean|
    and average drift (mean over layers 2..9) and the input's top-eigenvector fraction (mean over
    layers 1..9), one line per (method, width). Means over seeds."""
    from matplotlib.ticker import MaxNLocator

    plt = plots.pyplot()
    spread, population = main_rows(run_tables.read(cfg, "spread")), main_rows(run_tables.read(cfg, "population"))
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
            style = {"color": run_tables.METHOD_COLORS.get(key[0], "C2"), "linestyle": "--" if key[1] > narrow else "-"}
            ax.plot(*_xy(by_epoch(g, column)), marker="o", markersize=2, label=group_label(key, g), **style)
        ax.set_ylabel(what, fontsize=7)
    for ax in axes[2, len(bottom) :]:
        ax.axis("off")
    axes[2, 0].legend(fontsize=6, frameon=False)
    for ax in axes.flat:
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[-1]:
        ax.set_xlabel("epoch")
    fig.suptitle(plots.title(cfg, "Drift: Prop. 1's premise over training, per conv layer's input"), fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return plots.save(fig, cfg, "drift") + plot_ablation(cfg) + plot_steps(cfg) + plot_mean(cfg)


def plot_ablation(cfg: DictConfig) -> list[Path]:
    """drift_ablation.png/.pdf where the grid has ablations, one line per setting (means over seeds, dashed:
    wider than the narrowest): the population's average drift per layer at the last epoch, and over epochs
    (mean over layers 2-9); where affine.csv exists, gamma's RMS change since initialisation over epochs
    (mean over layers) and NormProp's mean gamma / f per layer at the last epoch (dotted: initialisation)."""
    from matplotlib.ticker import MaxNLocator

    population = run_tables.read(cfg, "population")
    if not ablation_settings(population):
        return []
    population, affine = learned_rows(cfg, population), learned_rows(cfg, read_optional(cfg, "affine"))
    plt = plots.pyplot()
    panels = 4 if len(affine) else 2
    fig, axes = plt.subplots(1, panels, figsize=(3.9 * panels, 4.2), squeeze=False)
    ax = axes[0]
    narrow = population["width"].min()
    settings = list(dict.fromkeys(population["setting"]))
    colours = plt.get_cmap("tab10" if len(settings) <= 10 else "tab20")
    for i, setting in enumerate(settings):
        g = population[population["setting"] == setting]
        style = {"color": colours(i % colours.N), "linestyle": "--" if g["width"].iloc[0] > narrow else "-"}
        name = f"{label(cfg, setting, g['method'].iloc[0])}, width {g['width'].iloc[0]:g}"
        last = g[g["epoch"] == g["epoch"].max()]
        per_layer = last.groupby(["layer", "seed"])["avg_drift"].mean().groupby("layer").mean()
        ax[0].plot(*_xy(per_layer), marker="o", markersize=3, label=name, **style)
        ax[1].plot(*_xy(by_epoch(g, "avg_drift")), marker="o", markersize=3, **style)
        a = affine[affine["setting"] == setting] if len(affine) else affine
        if not len(a):
            continue
        ax[2].plot(*_xy(by_epoch(a, "gamma_change")), marker="o", markersize=3, **style)
        if a["gain_mean"].notna().any():
            first, end = (a[a["epoch"] == e].groupby("layer")["gain_mean"].mean() for e in (0, a["epoch"].max()))
            ax[3].plot(*_xy(end), marker="o", markersize=3, **style)
            ax[3].plot(*_xy(first), linestyle=":", color=style["color"], linewidth=0.8)
    labels = ["average drift at the last epoch (initial stds)", "average drift, layers 2-9 (initial stds)",
              "gamma's RMS change since initialisation", "mean gamma / f (dotted: initialisation)"]  # fmt: skip
    for a, what, x in zip(ax, labels, ["layer", "epoch", "epoch", "layer"], strict=False):
        a.set_ylabel(what, fontsize=7)
        a.set_xlabel(x)
        a.tick_params(labelsize=7)
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles, names = ax[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="lower center", ncol=min(4, len(names)), fontsize=7, frameon=False)
    fig.suptitle(plots.title(cfg, "Drift ablation: which part of NormProp moves its layer inputs"), fontsize=10)
    fig.tight_layout(rect=(0, 0.06 * ((len(names) + 3) // 4), 1, 0.95))
    return plots.save(fig, cfg, "drift_ablation")


def plot_steps(cfg: DictConfig) -> list[Path]:
    """drift_steps.png/.pdf where the runs have in-epoch probes: the spread ratio (mean over layers 1-9) and
    the population's average drift (layers 2-9) against the epochs trained, from initialisation to the end
    of epoch 1 (the in-epoch probes, then the epoch's own), one line per setting, means over seeds."""
    spread_steps = learned_rows(cfg, read_optional(cfg, "spread_steps"))
    if not len(spread_steps):
        return []
    population_steps = learned_rows(cfg, read_optional(cfg, "population_steps"))
    epochs = {"ratio": learned_rows(cfg, read_optional(cfg, "spread")),
              "avg_drift": learned_rows(cfg, read_optional(cfg, "population"))}  # fmt: skip
    plt = plots.pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(9.0, 4.0), squeeze=False)
    for i, (setting, g) in enumerate(spread_steps.groupby("setting", sort=False)):
        for a, (column, table) in zip(ax[0], ((("ratio", g)), ("avg_drift", population_steps)), strict=True):
            rows = table[table["setting"] == setting] if len(table) else table
            if not len(rows):
                continue
            e = epochs[column]
            end = e[(e["setting"] == setting) & (e["epoch"] == 1)] if len(e) else e
            line = pd.concat([by_epoch(rows, column), by_epoch(end, column)]) if len(end) else by_epoch(rows, column)
            a.plot(*_xy(line.sort_index()), marker="o", markersize=3, color=f"C{i}",
                   label=label(cfg, setting, g["method"].iloc[0]))  # fmt: skip
    ax[0, 0].axhline(1.0, color="0.4", linestyle="--", linewidth=0.8)
    names = ["spread ratio, mean over layers 1-9", "average drift, layers 2-9 (initial stds)"]
    for a, what in zip(ax[0], names, strict=True):
        a.set(xlabel="epochs trained", ylabel=what)
        a.tick_params(labelsize=7)
    handles, names = ax[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(3, len(names)), fontsize=7, frameon=False)
    fig.suptitle(plots.title(cfg, "Drift inside epoch 1 (in-epoch probes)"), fontsize=10)
    rows = -(-len(names) // 3)  # the legend's rows under the axes
    fig.tight_layout(rect=(0, 0.05 * rows + 0.02, 1, 0.93))
    return plots.save(fig, cfg, "drift_steps")


def _xy(series: pd.Series):
    return series.index.to_numpy(), series.to_numpy()
