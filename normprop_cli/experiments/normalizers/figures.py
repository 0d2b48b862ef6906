"""normalizers.png/.pdf: a forest plot, per batch size, of every method's difference from the reference
(NormProp) in final test accuracy (pp), with its Bonferroni-corrected Welch interval (tables.table)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from normprop_cli.experiments import plots
from normprop_cli.experiments.lr_sweep import plot_sweep, stepped
from normprop_cli.experiments.normalizers.tables import label, read_table

COLORS = {"better": "tab:green", "worse": "tab:red"}  # the rest ("indistinguishable", "no interval"): grey
MODES = {  # marker, fill, legend entry
    "final": ("o", None, "final test accuracy"),
    "eval": ("s", None, "evaluation mode (running estimates)"),
    "train": ("^", "white", "training mode (own statistics; same level, not one of the comparisons)"),
}


def plot(cfg: DictConfig) -> list[Path]:
    """The forest plot (normalizers.png/.pdf); and the sweep's figure, where rates were swept."""
    out = forest(cfg)
    if stepped(cfg):  # normprop plot normalizers redraws the sweep's figure too
        out += plot_sweep(cfg, label)
    return out


def _finite(values) -> np.ndarray:
    return np.isfinite(pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=float))


def forest(cfg: DictConfig, t: pd.DataFrame | None = None) -> list[Path]:
    """One panel per batch size: each method's difference from the reference (mean final test accuracy,
    pp) with its interval, ranked by the difference (the largest on top), a line at 0. At batch 1 the
    batch-statistics methods show two markers, evaluation mode (the table's) and training mode
    (mode_gap.csv's last epoch). A method with no finite difference (every run diverged) is left out of
    its panel and named in the panel's title; a batch size whose reference diverged says so."""
    plt = plots.pyplot()
    t = read_table(cfg) if t is None else t
    reference = cfg.experiment.get("reference", "normprop-icml")
    ref = label(reference)
    sizes = sorted(int(b) for b in t["batch_size"].unique())
    others = t[t["normalizer"] != reference]
    most = max([int((others["batch_size"] == b).sum()) for b in sizes] or [1])
    fig, axes = plt.subplots(1, max(len(sizes), 1), figsize=(1.5 + 4.8 * max(len(sizes), 1), 2.0 + 0.34 * most),
                             squeeze=False)  # fmt: skip
    used = set()
    for ax, bs in zip(axes[0], sizes or [None], strict=True):
        g = others[others["batch_size"] == bs]
        shown = g[_finite(g["diff_vs_reference"])].sort_values("diff_vs_reference", kind="stable")
        used |= _panel(ax, shown)
        ax.axvline(0.0, color="k", linewidth=0.8, linestyle="--", zorder=1)
        ax.set_xlabel(f"final test accuracy minus {ref}'s (pp)")
        title, gone = f"batch {bs}", g.loc[~_finite(g["diff_vs_reference"]), "normalizer"]
        own = t[(t["batch_size"] == bs) & (t["normalizer"] == reference)]
        if len(own) and not _finite(own["final_acc"]).any():
            title += f"\nevery run of {ref} diverged: no comparison"
        elif len(gone):
            title += "\nleft out, no finite difference (diverged): " + ", ".join(label(m) for m in gone)
        ax.set_title(title if bs is not None else "", fontsize=9)
        plots.note_if_empty(ax, shown["diff_vs_reference"])
    level = float(t["diff_level"].dropna().iloc[0]) if t["diff_level"].notna().any() else math.nan
    k = int(t["compared"].astype(bool).sum()) if "compared" in t else 0
    what = f"difference from {ref}, Welch {100 * level:.2f}% intervals (Bonferroni over {k} comparisons)"
    fig.suptitle(plots.title(cfg, what), fontsize=10)
    handles = [plt.Line2D([], [], color="0.3", marker=MODES[m][0], markerfacecolor=MODES[m][1] or "0.3",
                          linestyle="", label=MODES[m][2]) for m in MODES if m in used]  # fmt: skip
    handles += [plt.Line2D([], [], color=c, linewidth=2, label=f"{reading}: the interval excludes 0")
                for reading, c in COLORS.items() if (t["reading"] == reading).any()]  # fmt: skip
    if len(handles) > 1:
        fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.05 if len(handles) > 1 else 0, 1, 1))
    return plots.save(fig, cfg, "normalizers")


def _panel(ax, shown: pd.DataFrame) -> set[str]:
    """The rows of one batch size, lowest difference at the bottom; which markers (MODES) it drew."""
    used = set()
    for y, (_, r) in enumerate(shown.iterrows()):
        two = "train_mode_diff" in r and _finite([r["train_mode_diff"]])[0]
        points = [("eval" if two else "final", r["diff_vs_reference"], r["diff_low"], r["diff_high"], 0.17 * two)]
        if two:
            points.append(("train", r["train_mode_diff"], r["train_mode_diff_low"], r["train_mode_diff_high"], -0.17))
        for mode, mid, low, high, dy in points:
            marker, fill, _ = MODES[mode]
            color = COLORS.get(r["reading"], "0.35") if mode != "train" else "0.35"
            err = np.nan_to_num(np.array([[mid - low], [high - mid]], dtype=float))  # no interval: a point
            ax.errorbar([mid], [y + dy], xerr=err, fmt=marker, color=color, markerfacecolor=fill or color,
                        markersize=5, capsize=2.5, elinewidth=1.0, zorder=3)  # fmt: skip
            used.add(mode)
    ax.set_yticks(range(len(shown)), [label(m) for m in shown["normalizer"]], fontsize=8)
    ax.set_ylim(-0.7, max(len(shown), 1) - 0.3)
    ax.grid(axis="x", color="0.9", linewidth=0.6)
    return used
