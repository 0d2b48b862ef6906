"""Fig. 1 (section 5.1): NormProp with global vs batch data normalisation (section 4.1).

    normprop run data-norm [--preset paper]

epochs.csv   every run's metrics, one row per run and epoch
curves.csv   setting, data_norm, batch_size, initial_lr, epoch, n, diverged, mean, sd, ci_low, ci_high
             (test accuracy %, mean over the seeds that did not diverge, 95% interval on the logit
             scale: statistics.proportion_ci; `diverged` counts the setting's diverged runs)
summary.csv  one row per run: engine columns + data_norm, batch_size, initial_lr, best_test_acc,
             best_test_epoch, final_test_acc
data_norm.png/.pdf  test accuracy vs epoch, one line per (data normalisation, batch size)
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from normprop_cli import engine, statistics
from normprop_cli.engine import Stage, expand_grid
from normprop_cli.experiments import plots, tables
from normprop_cli.experiments.base import experiment

KEYS = ["setting", "data_norm", "batch_size", "initial_lr"]
COLUMNS = {"data_norm": "train.data_norm", "batch_size": "train.batch_size", "initial_lr": "train.lr"}


def best(epochs, run: str) -> dict:
    """The run's best test accuracy and its first epoch (the paper reports the best, footnote 4);
    write_curves_and_summary then adds final_test_acc after them."""
    m = tables.of_run(epochs, run)
    if not len(m):
        return {}
    top = m.loc[m["test_acc"].idxmax()]
    return {"best_test_acc": top["test_acc"], "best_test_epoch": int(top["epoch"])}


def label(data_norm: str, batch_size: int, lr: float) -> str:
    return f"{data_norm} data norm, batch {batch_size}, lr {lr:g}"


def plot(cfg: DictConfig) -> list[Path]:
    """Fig. 1: test accuracy (mean over seeds, 95% caps) vs epoch for each setting."""
    plt = plots.pyplot()
    curve = tables.read_curves(cfg, KEYS)
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    sizes = sorted(curve["batch_size"].unique())
    groups = list(curve.groupby(KEYS, sort=False))
    for ((_, data_norm, batch_size, lr), c), dodge in zip(groups, plots.dodges(len(groups)), strict=True):
        plots.plot_curve(
            ax,
            c,
            label(data_norm, batch_size, lr),
            dodge=dodge,
            color=f"C{sizes.index(batch_size)}",
            linestyle="-" if data_norm == "batch" else "--",
            marker="o" if data_norm == "batch" else "s",
        )
    plots.note_if_empty(ax, curve["mean"])
    paper = cfg.experiment.paper_best_test_acc
    ax.axhline(paper, color="0.5", linewidth=0.8, linestyle=":", label=f"paper's best, CIFAR-10 ({paper}%)")
    plots.accuracy_axes(ax, cfg, "Fig. 1: global vs batch data normalisation")
    return plots.save(fig, cfg, "data_norm")


def headlines(cfg: DictConfig) -> list[dict]:
    """Final and best test accuracy per setting (mean over the seeds that did not diverge, with its 95%
    interval, statistics.proportion_ci; the diverged runs counted beside it), and the best setting, beside
    the paper's (experiment.paper_best_test_acc and paper_best_setting)."""
    summary = tables.read(cfg, "summary")
    if "best_test_acc" not in summary:
        return []
    paper_setting = tuple(cfg.experiment.paper_best_setting.values())
    paper_best = cfg.experiment.paper_best_test_acc
    done = tables.kept(summary)
    best = done.groupby(KEYS[1:], sort=False)["best_test_acc"].mean().sort_values(ascending=False)
    rows = []
    if len(best):
        (top_norm, top_bs, top_lr), top = best.index[0], best.iloc[0]
        rows.append(
            {
                "quantity": "best test accuracy (%, max over epochs, mean over the seeds that did not diverge) and "
                "its setting",
                "reproduced": f"{top:.2f} ({label(top_norm, top_bs, top_lr)})",
                "paper": tables.paper_value(cfg, f"{paper_best} ({label(*paper_setting)})"),
            }
        )
    for (data_norm, batch_size, lr), g in summary.groupby(KEYS[1:], sort=True):
        final = statistics.proportion_ci(tables.kept(g)["final_test_acc"])
        paper = paper_best if (data_norm, batch_size, lr) == paper_setting else ""
        rows.append(
            {
                "quantity": f"final test accuracy (%) [95% CI, n = {final['n']}], {label(data_norm, batch_size, lr)}",
                "reproduced": tables.with_diverged(statistics.format_mean_ci(final), g),
                "paper": tables.paper_value(cfg, f"{paper} (best)" if paper else ""),
            }
        )
    return rows + tables.not_learned(cfg)


def stages(cfg: DictConfig):
    yield Stage(cfg, expand_grid(cfg))


@experiment("data-norm", plot=plot, headlines=headlines, stages=stages)
def analyse(cfg: DictConfig) -> Path:
    specs = expand_grid(cfg)
    manifests = engine.manifests(specs)
    epochs = tables.gather(specs, columns=COLUMNS)
    out = tables.write_curves_and_summary(
        cfg, specs, manifests, epochs, KEYS, lambda spec: tables.settings(spec, COLUMNS) | best(epochs, spec.name)
    )
    plot(cfg)
    return out
