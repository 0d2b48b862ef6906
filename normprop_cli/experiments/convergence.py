"""Fig. 3 (section 5.3): convergence stability of NormProp vs BatchNorm over several seeds.

    normprop run convergence [--preset paper] [--seeds 5]

epochs.csv   every run's metrics, one row per run and epoch
curves.csv   method, epoch, n, diverged, mean, sd, ci_low, ci_high: test accuracy (%) over the seeds
             that did not diverge, 95% interval on the logit scale (statistics.proportion_ci);
             `diverged` counts the method's diverged runs, left out of every epoch
summary.csv  one row per run: engine columns + final_test_acc, best_test_acc
convergence.png/.pdf  test accuracy vs epoch, caps on the markers showing the 95% interval
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from normprop_cli import engine, statistics
from normprop_cli.engine import Stage, expand_grid
from normprop_cli.experiments import plots, tables
from normprop_cli.experiments.base import experiment

KEYS = ["method"]


def plot(cfg: DictConfig) -> list[Path]:
    """Fig. 3: test accuracy, mean over seeds with 95% caps, per method."""
    plt = plots.pyplot()
    curve = tables.read_curves(cfg, KEYS)
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    groups = sorted(curve.groupby("method", sort=False), key=lambda g: tables.method_rank(g[0]))
    for (method, c), dodge in zip(groups, plots.dodges(len(groups)), strict=True):
        plots.plot_curve(
            ax,
            c,
            f"{tables.method_label(method)} (n = {int(c['n'].max())} seeds)",
            dodge=dodge,
            color=tables.METHOD_COLORS.get(method),
        )
    plots.note_if_empty(ax, curve["mean"])
    plots.accuracy_axes(ax, cfg, "Fig. 3: NormProp vs BN convergence, 95% CI")
    return plots.save(fig, cfg, "convergence")


def early_half_width(c, epochs: int) -> float:
    """Mean 95% half-width, (ci_high - ci_low) / 2, over epochs 1..`epochs` (the paper: "specially
    during initial training"); the logit-scale interval is asymmetric, its half-width is its mean reach."""
    head = c[c["epoch"] <= epochs]
    return float(((head["ci_high"] - head["ci_low"]) / 2).mean())


def headlines(cfg: DictConfig) -> list[dict]:
    """Final accuracy with its 95% interval (the diverged runs left out and counted beside it), and
    the spread over seeds in the stated early window."""
    curve = tables.read_curves(cfg, KEYS)
    summary = tables.read(cfg, "summary")
    window = int(cfg.experiment.early_epochs)
    paper = f"{cfg.experiment.paper_claim} (CIFAR-10)"
    rows = []
    for method, c in curve.groupby("method", sort=False):
        last = tables.last_epoch(c, KEYS).iloc[0]
        rows.append(
            {
                "quantity": f"final test accuracy (%) [95% CI, n = {int(last['n'])}] at epoch "
                f"{int(last['epoch'])}, {tables.method_label(method)}",
                "reproduced": tables.with_diverged(
                    statistics.format_mean_ci(last), summary[summary["method"] == method]
                ),
                "paper": "",
            }
        )
    for method, c in curve.groupby("method", sort=False):
        rows.append(
            {
                "quantity": f"mean 95% CI half-width of test accuracy (pp) over epochs 1-{window} "
                f"(n = {int(c['n'].max())} seeds), {tables.method_label(method)}",
                "reproduced": round(early_half_width(c, window), 2),
                "paper": paper if method == "normprop" else "",
            }
        )
    return rows + tables.not_learned(cfg)


def stages(cfg: DictConfig):
    yield Stage(cfg, expand_grid(cfg))


@experiment("convergence", plot=plot, headlines=headlines, stages=stages)
def analyse(cfg: DictConfig) -> Path:
    specs = expand_grid(cfg)
    manifests = engine.manifests(specs)
    epochs = tables.gather(specs)
    out = tables.write_curves_and_summary(cfg, specs, manifests, epochs, KEYS)
    plot(cfg)
    return out
