"""normalizers.png/.pdf: final test accuracy against batch size per method, and step time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from normprop_cli.experiments import plots
from normprop_cli.experiments.lr_sweep import plot_sweep, stepped
from normprop_cli.experiments.normalizers.tables import label, read_table


def plot(cfg: DictConfig) -> list[Path]:
    """Final test accuracy against batch size per method (95% intervals), and seconds per step."""
    plt = plots.pyplot()
    t = read_table(cfg)
    fig, axes = plt.subplots(1, 2, figsize=(12.0, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    methods = list(dict.fromkeys(cfg.experiment.methods))
    sizes = sorted(t["batch_size"].unique())
    colors = plt.get_cmap("tab20")
    for k, method in enumerate(methods):
        g = t[t["normalizer"] == method].sort_values("batch_size")
        if not len(g):
            continue
        x = np.array([sizes.index(b) for b in g["batch_size"]]) + (k - len(methods) / 2) * 0.03
        y = g["final_acc"].to_numpy()
        err = np.nan_to_num(np.vstack([y - g["final_low"].to_numpy(), g["final_high"].to_numpy() - y]))
        style = {"linewidth": 2.4, "color": "k" if method.endswith("icml") else "0.35"} if method.startswith(
            "normprop") else {"linewidth": 1.0, "color": colors(k % 20)}  # fmt: skip
        axes[0].errorbar(x, y, yerr=err, capsize=3, marker="o", markersize=3, label=label(method), **style)
        axes[1].plot(x, g["step_ms"], marker="o", markersize=3, label=label(method), **style)
    for ax in axes:
        ax.set_xticks(range(len(sizes)), [str(b) for b in sizes])
        ax.set_xlabel("batch size")
    axes[0].set_ylim(-2, 102)  # accuracies and their intervals lie in [0, 100]
    axes[0].set_ylabel("final test accuracy (%)")
    axes[0].set_title(plots.title(cfg, "normalisers at their own learning rates, 95% CI"), fontsize=10)
    plots.note_if_empty(axes[0], t["final_acc"])
    if not plots.note_if_empty(axes[1], t["step_ms"]):
        axes[1].set_yscale("log")  # no log scale without a step time to put on it
    axes[1].set_ylabel("ms per SGD step (median; parallel workers)")
    axes[1].set_title("step time in the runs (bench times them side by side)", fontsize=10)
    axes[0].legend(fontsize=7, ncol=2, loc="lower left")
    fig.tight_layout()
    out = plots.save(fig, cfg, "normalizers")
    if stepped(cfg):  # normprop plot normalizers redraws the sweep's figure too
        out += plot_sweep(cfg, label)
    return out
