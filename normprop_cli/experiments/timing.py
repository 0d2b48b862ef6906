"""Section 5.6: seconds per training epoch of NormProp vs BatchNorm (and no normalisation).

    normprop run timing [--preset paper]

Each method trains a few epochs; the first is a warm-up (allocator, cuDNN autotuning) and the median
of the others' `train_seconds` (the training pass alone, no evaluation) is a run's epoch time.

The ratio of two methods (`ratio_vs_batchnorm`, `ratio_vs_none`) pairs their complete runs by seed:
exp(mean over seeds of log(seconds of the method) - log(seconds of the base)), the geometric mean
of the per-seed ratios of each run's median epoch seconds. It is the ratio behind the verdict on C6
(its effect is 1 - this ratio). `pooled_ratio_vs_batchnorm` is the ratio of the two methods'
`median_epoch_seconds`, the medians of all their runs' timed epochs pooled: another quantity, which
differs where the seeds' runs differ in speed.

timing.csv   method, device, host, runs, epochs_timed, median_epoch_seconds, images_per_second,
             ratio_vs_batchnorm, seeds_vs_batchnorm, ratio_vs_none, seeds_vs_none,
             pooled_ratio_vs_batchnorm, paper_seconds, paper_ratio_vs_batchnorm
summary.csv  one row per run: engine columns + initial_lr, batch_size, epochs_timed, median_train_seconds,
             images_per_second
timing.png/.pdf  seconds per epoch beside the paper's (experiment.paper_seconds, on experiment.paper_device),
             and the ratio to BatchNorm
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from normprop_cli.engine import expand_grid, run_sweep
from normprop_cli.experiments import plots, tables
from normprop_cli.experiments.base import experiment

COLUMNS = ["method", "device", "host", "runs", "epochs_timed", "median_epoch_seconds",
           "images_per_second", "ratio_vs_batchnorm", "seeds_vs_batchnorm", "ratio_vs_none", "seeds_vs_none",
           "pooled_ratio_vs_batchnorm", "paper_seconds", "paper_ratio_vs_batchnorm"]  # fmt: skip
SECONDS = "median_train_seconds"  # summary.csv: a run's median training seconds over its timed epochs
SETTINGS = {"initial_lr": "train.lr", "batch_size": "train.batch_size"}


def timed(epochs: pd.DataFrame, warmup: int) -> pd.DataFrame:
    """The epochs after the warm-up; all of them when there is nothing after it (e.g. one epoch)."""
    later = epochs[epochs["epoch"] > warmup]
    return later if len(later) else epochs


def run_timing(epochs: pd.DataFrame, run: str, warmup: int) -> dict:
    """A run's summary columns: its timed epochs, their median training seconds and images per second."""
    m = tables.of_run(epochs, run)
    if not len(m):
        return {}
    t = timed(m, warmup)
    return {"epochs_timed": len(t), "median_train_seconds": t["train_seconds"].median(),
            "images_per_second": t["images_per_second"].median()}  # fmt: skip


def paired_ratio(summary: pd.DataFrame, method: str, base: str) -> tuple[float, int]:
    """(ratio, seeds): exp(mean over seeds of log(s_method) - log(s_base)), with s a complete run's
    median epoch seconds (summary.csv's median_train_seconds), paired by seed: the geometric mean of
    the per-seed ratios, the ratio whose 1 - ratio is C6's effect. NaN and 0 without a pair."""
    if not len(summary) or SECONDS not in summary:
        return math.nan, 0
    done = summary[summary["status"] == "complete"] if "status" in summary else summary
    done = done[np.isfinite(pd.to_numeric(done[SECONDS], errors="coerce"))]
    wide = done.pivot_table(index="seed", columns="method", values=SECONDS, aggfunc="mean")
    if method not in wide or base not in wide:
        return math.nan, 0
    pairs = pd.DataFrame({"method": wide[method], "base": wide[base]}).dropna()
    if not len(pairs):
        return math.nan, 0
    return float(np.exp((np.log(pairs["method"]) - np.log(pairs["base"])).mean())), len(pairs)


def timing_table(epochs: pd.DataFrame, warmup: int, paper: dict, summary: pd.DataFrame) -> pd.DataFrame:
    """One row per method: the median over its runs' timed epochs pooled, and the methods' ratios
    paired by seed (paired_ratio, from summary.csv's per-run medians), beside the ratio of the pooled
    medians (pooled_ratio_vs_batchnorm)."""
    if not len(epochs):
        return pd.DataFrame(columns=COLUMNS)
    rows = []
    for method, g in epochs.groupby("method", sort=False):
        t = timed(g, warmup)
        row = {
            "method": method,
            "device": ", ".join(sorted(t["device"].astype(str).unique())),
            "host": ", ".join(sorted(t["host"].astype(str).unique())),
            "runs": t["run"].nunique(),
            "epochs_timed": len(t),
            "median_epoch_seconds": t["train_seconds"].median(),
            "images_per_second": t["images_per_second"].median(),
            "paper_seconds": paper.get(method, math.nan),
        }
        for base in ("batchnorm", "none"):
            row[f"ratio_vs_{base}"], row[f"seeds_vs_{base}"] = paired_ratio(summary, method, base)
        rows.append(row)
    table = pd.DataFrame(rows)
    seconds = table.set_index("method")["median_epoch_seconds"]
    table["pooled_ratio_vs_batchnorm"] = table["median_epoch_seconds"] / seconds.get("batchnorm", math.nan)
    table["paper_ratio_vs_batchnorm"] = table["paper_seconds"] / paper.get("batchnorm", math.nan)
    table = table.sort_values("method", key=lambda s: s.map(tables.method_rank))
    return table[COLUMNS]


def read_table(cfg: DictConfig) -> pd.DataFrame:
    """timing.csv; one written before the ratios were paired by seed (other columns) is formed again
    from epochs.csv and summary.csv, so that the figure and the report show the verdict's ratio."""
    table = tables.read(cfg, "timing")
    if list(table.columns) == COLUMNS:
        return table
    epochs, summary = tables.read(cfg, "epochs"), tables.read(cfg, "summary")
    return timing_table(epochs, int(cfg.experiment.warmup_epochs), dict(cfg.experiment.paper_seconds), summary)


def paper_source(cfg: DictConfig) -> str:
    """Where the paper's seconds were measured: experiment.paper_device, on CIFAR-10."""
    return f"{cfg.experiment.paper_device}, CIFAR-10"


def paired_bars(ax, table: pd.DataFrame, mine: str, paper: str, mine_label: str, paper_label: str) -> None:
    """Per method, the reproduced value (left, the method's colour) beside the paper's (right, hatched)."""
    x = range(len(table))
    colors = [tables.METHOD_COLORS.get(m, "C2") for m in table["method"]]
    ax.bar([i - 0.2 for i in x], table[mine], width=0.4, color=colors, label=mine_label)
    ax.bar([i + 0.2 for i in x], table[paper], width=0.4, color="0.8", hatch="//", label=paper_label)


def plot(cfg: DictConfig) -> list[Path]:
    """Seconds per training epoch (reproduced beside the paper's), and each method relative to BN"""
    plt = plots.pyplot()
    table = read_table(cfg)
    fig, (ax, rel) = plt.subplots(1, 2, figsize=(9.0, 3.6))
    x = range(len(table))
    names = [tables.method_label(m) for m in table["method"]]
    device = ", ".join(table["device"].astype(str).unique())
    paired_bars(ax, table, "median_epoch_seconds", "paper_seconds", f"reproduced ({device})",
                f"paper ({paper_source(cfg)})")  # fmt: skip
    for i, (mine, paper) in enumerate(zip(table["median_epoch_seconds"], table["paper_seconds"], strict=True)):
        ax.annotate(f"{mine:.3g}", (i - 0.2, mine), ha="center", va="bottom", fontsize=7)
        if math.isfinite(paper):
            ax.annotate(f"{paper:g}", (i + 0.2, paper), ha="center", va="bottom", fontsize=7)
    finite = table[["median_epoch_seconds", "paper_seconds"]].stack()
    if len(finite) and finite.max() / finite.min() > 20:
        ax.set_yscale("log")  # a CPU epoch of digits beside a GPU epoch of CIFAR-10
    ax.set_xticks(list(x), names)
    ax.set_ylabel("seconds per training epoch (median)")
    ax.legend(frameon=False, fontsize=7)
    seconds = cfg.experiment.paper_seconds
    paper_ratio = f"paper ({seconds.normprop:g} / {seconds.batchnorm:g} = {seconds.normprop / seconds.batchnorm:.3f})"
    paired_bars(rel, table, "ratio_vs_batchnorm", "paper_ratio_vs_batchnorm", "reproduced", paper_ratio)
    rel.axhline(1.0, color="0.5", linewidth=0.8, linestyle=":")
    rel.set_xticks(list(x), names)
    rel.set_ylabel("epoch time / BatchNorm's (geometric mean of per-seed ratios)", fontsize=8)
    rel.legend(frameon=False, fontsize=7)
    for panel, values in ((ax, table["median_epoch_seconds"]), (rel, table["ratio_vs_batchnorm"])):
        plots.note_if_empty(panel, values)
    fig.suptitle(plots.title(cfg, "Section 5.6: training speed"), fontsize=10)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.12, top=0.88, wspace=0.3)
    return plots.save(fig, cfg, "timing")


def headlines(cfg: DictConfig) -> list[dict]:
    """Seconds per epoch of each method and the NormProp / BatchNorm ratio (paired by seed, the C6
    verdict's; and the ratio of the pooled medians, labelled), beside the paper's
    (experiment.paper_seconds): a GPU's seconds on CIFAR-10, labelled not comparable unless this sweep
    ran on CUDA with CIFAR-10."""
    table = read_table(cfg).set_index("method")
    comparable = cfg.dataset.name == "cifar10" and table["device"].astype(str).str.startswith("cuda").all()
    note = "" if comparable else f" ({paper_source(cfg)}; not comparable with {cfg.dataset.name} on this device)"
    rows = []
    for method, r in table.iterrows():
        paper = r["paper_seconds"]
        rows.append(
            {
                "quantity": f"seconds per training epoch (median of {int(r['epochs_timed'])} epochs over "
                f"{int(r['runs'])} run(s) pooled), {tables.method_label(method)}, {r['device']}",
                "reproduced": round(float(r["median_epoch_seconds"]), 3),
                "paper": f"{paper:g}{note}" if math.isfinite(paper) else "",
            }
        )
    if "normprop" in table.index and "batchnorm" in table.index:
        r = table.loc["normprop"]
        rows.append(
            {
                "quantity": "epoch time ratio NormProp / BatchNorm: geometric mean over "
                f"{int(r['seeds_vs_batchnorm'])} seeds of each seed's ratio of median epoch seconds (the C6 "
                "verdict's ratio, its effect 1 - ratio)",
                "reproduced": round(float(r["ratio_vs_batchnorm"]), 3),
                "paper": f"{r['paper_ratio_vs_batchnorm']:.3f}{note}",
            }
        )
        rows.append(
            {
                "quantity": "ratio of the pooled medians above, NormProp / BatchNorm (all runs' timed epochs "
                "together; not paired by seed, not the verdict's)",
                "reproduced": round(float(r["pooled_ratio_vs_batchnorm"]), 3),
                "paper": "",
            }
        )
    return rows + tables.not_learned(cfg)


def paragraphs(cfg: DictConfig) -> list[str]:
    """Which ratio the table shows, and why the ratio of the seconds above differs from it."""
    table = read_table(cfg).set_index("method")
    if not {"normprop", "batchnorm"} <= set(table.index) or not table.loc["normprop", "seeds_vs_batchnorm"]:
        return []  # no seed with both methods complete (e.g. every NormProp run diverged): no ratio to explain
    r = table.loc["normprop"]
    return [
        "The epoch time ratio NormProp / BatchNorm pairs the runs by seed: each complete run's median "
        "training seconds over its timed epochs, the ratio of NormProp's to BatchNorm's for every seed, and "
        f"the geometric mean of those ratios over the {int(r['seeds_vs_batchnorm'])} seeds, "
        f"{float(r['ratio_vs_batchnorm']):.3f}. The verdict on C6 reads the same quantity (its effect is "
        f"1 - ratio = {1.0 - float(r['ratio_vs_batchnorm']):.3f}). The seconds per epoch above are medians of "
        "all runs' timed epochs pooled; their ratio, "
        f"{float(r['pooled_ratio_vs_batchnorm']):.3f}, weighs slow and fast seeds otherwise and is shown "
        "for reference only."
    ]


@experiment("timing", plot=plot, headlines=headlines, paragraphs=paragraphs)
def run(cfg: DictConfig) -> Path:
    if cfg.get("jobs", 1) > 1 and cfg.launcher.name != "slurm":
        # Runs sharing one machine would time each other: the timing runs go one at a time.
        cfg.jobs = 1
    # Seed by seed, the methods in turn: a slow spell of a shared machine then hits every method
    # of a seed alike, instead of all the runs of one method (C6 pairs the methods by seed).
    specs = sorted(expand_grid(cfg), key=lambda spec: spec.seed)
    manifests = run_sweep(cfg, specs)
    epochs = tables.gather(specs)
    if len(epochs):
        where = {spec.name: manifest or {} for spec, manifest in zip(specs, manifests, strict=True)}
        epochs["device"] = epochs["run"].map(lambda r: where[r].get("device_name", where[r].get("device")))
        epochs["host"] = epochs["run"].map(lambda r: where[r].get("host"))
    tables.write(cfg, "epochs", epochs)
    warmup = int(cfg.experiment.warmup_epochs)
    paper = dict(cfg.experiment.paper_seconds)
    out = tables.summarise(
        cfg, specs, manifests, lambda spec: tables.settings(spec, SETTINGS) | run_timing(epochs, spec.name, warmup)
    )
    tables.write(cfg, "timing", timing_table(epochs, warmup, paper, pd.read_csv(out)))
    plot(cfg)
    return out
