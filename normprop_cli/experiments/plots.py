"""Drawing the experiments' figures: mean-over-seeds curves with their intervals, the accuracy axes,
titles, matplotlib without a display, and saving a figure beside the sweep's CSVs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from normprop_cli import io
from normprop_cli.engine.runs import sweep_dir
from normprop_cli.verdicts import ALL_DIVERGED


def plot_curve(ax, curve: pd.DataFrame, label: str, band: bool = False, dodge: float = 0.0, **style) -> None:
    """One mean-over-seeds curve; caps on the markers show the 95% interval (Figs. 3, 4), or a
    shaded band. Where n = 1 there is no interval and only the line is drawn. `dodge` shifts the
    epochs a little so that the caps of several curves do not hide each other."""
    low, high = curve["ci_low"].to_numpy(), curve["ci_high"].to_numpy()
    has_ci = np.isfinite(low).any()
    x, y = curve["epoch"].to_numpy() + (dodge if has_ci else 0.0), curve["mean"].to_numpy()
    style = {"marker": "o", "markersize": 3, "linewidth": 1.2} | style
    if band or not has_ci:
        (line,) = ax.plot(x, y, label=label, **style)
        if has_ci:
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    else:
        yerr = np.vstack([y - low, high - y])
        ax.errorbar(x, y, yerr=np.nan_to_num(yerr), capsize=3, elinewidth=0.8, label=label, **style)


def note_if_empty(ax, values, text: str = ALL_DIVERGED) -> bool:
    """Write `text` ("all runs diverged") across `ax` where `values`, what it plots, has nothing finite:
    a figure of a grid whose every run diverged says so instead of showing empty axes. True where it did."""
    numbers = pd.to_numeric(pd.Series(np.ravel(np.asarray(values, dtype=object))), errors="coerce")
    if np.isfinite(numbers.to_numpy(dtype=float)).any():
        return False
    box = {"boxstyle": "round", "facecolor": "white", "edgecolor": "0.7"}  # above any reference line
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=11, color="0.3", bbox=box,
            zorder=5)  # fmt: skip
    return True


def dodges(k: int, width: float = 0.24) -> list[float]:
    """k small x offsets centred on 0, for k curves with caps at the same epochs."""
    return [0.0] * k if k < 2 else list(np.linspace(-width / 2, width / 2, k))


def accuracy_axes(ax, cfg: DictConfig, what: str) -> None:
    """Epochs on x (integers), test accuracy in % on y, clipped to [0, 100]; the legend below."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    low, high = ax.get_ylim()
    ax.set_ylim(max(low, 0.0), min(high, 100.0))
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title(cfg, what), fontsize=10)
    if ax.get_legend_handles_labels()[0]:  # none where every run diverged
        ax.legend(frameon=False, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, cfg: DictConfig, name: str) -> list[Path]:
    """`<sweep>/<name>.png`, `.pdf`, ... (the config's `figures`), atomically."""
    paths = io.save_figure(fig, sweep_dir(cfg) / name, cfg.figures)
    pyplot().close(fig)
    return paths


def title(cfg: DictConfig, what: str) -> str:
    return f"{what}, {cfg.dataset.name} ({cfg.preset.name} preset)"
