"""Table 1 (section 5.5): test error of NormProp vs BatchNorm, without and with augmentation: the
paper's horizontal flips on CIFAR, small translations on digits (not mirror-symmetric), none on SVHN.

summary.csv  one row per run: engine columns + augment, paper_test_error (the paper's, in %)
table1.png/.pdf  final test error per method and augmentation: mean over seeds (bar) with its 95% interval
                 (whisker), each seed a dot, beside the paper's
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from normprop_cli import engine, statistics
from normprop_cli.engine import Stage, expand_grid
from normprop_cli.experiments import plots, tables
from normprop_cli.experiments.base import experiment


def augment(spec) -> str:
    """The run's augmentation: the data set's (flips on CIFAR, translations on digits), or none."""
    return spec.cfg.dataset.get("augment", "flip") if spec.cfg.train.augment else "none"


def headlines(cfg: DictConfig) -> list[dict]:
    """Final test error per method and augmentation, mean over the complete runs with its 95% interval
    (statistics.proportion_ci, inside [0, 100]) and the diverged runs counted beside it, beside the
    paper's Table 1 (labelled not comparable off the paper's data sets, experiment.paper_test_error)."""
    summary = tables.read(cfg, "summary")
    paper_dataset = cfg.dataset.name if cfg.dataset.name in cfg.experiment.paper_test_error else "cifar10"
    rows = []
    for (method, augmentation), g in summary.groupby(["method", "augment"], sort=False):
        e = statistics.proportion_ci(complete(g).get("final_test_error", EMPTY))
        rows.append(
            {
                "quantity": f"final test error % [95% CI, n = {e['n']}] ({method}, augmentation {augmentation})",
                "reproduced": tables.with_diverged(statistics.format_mean_ci(e), g),
                "paper": tables.paper_value(cfg, g["paper_test_error"].iloc[0], paper_dataset),
            }
        )
    return rows + tables.not_learned(cfg)


EMPTY = pd.Series(dtype=float)  # the final errors of a summary whose every run diverged before its first epoch


def complete(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that finished their epochs: a diverged or unfinished run is not averaged in."""
    return runs[runs["status"] == "complete"] if "status" in runs else runs


def augmentation_label(augmentation: str, cfg: DictConfig) -> str:
    """'no augmentation', 'random horizontal flips' or 'random shifts (up to 3 px)': a run's training-set
    augmentation, for the figure's x axis."""
    if augmentation == "translate":
        pixels = cfg.dataset.get("translate_pixels")
        return f"random shifts (up to {pixels} px)" if pixels else "random shifts"
    return {"none": "no augmentation", "flip": "random horizontal flips"}.get(augmentation, augmentation)


def plot(cfg: DictConfig) -> list[Path]:
    """Per method and augmentation: a bar at this reproduction's mean final test error over the complete
    runs with its 95% interval (statistics.proportion_ci, as in the report) as a whisker, each seed a dot;
    the paper's Table 1 beside it (grey, hatched) where it has the data set. Each tick names the method,
    the augmentation and the seeds (n) behind the bar."""
    plt = plots.pyplot()
    summary = tables.read(cfg, "summary")
    groups = list(summary.groupby(["method", "augment"], sort=False))
    papers = summary["paper_test_error"].notna().any()
    x, width = (-0.18, 0.36) if papers else (0.0, 0.5)  # no paper bars: the reproduction's bar in the middle
    fig, ax = plt.subplots(figsize=(2.0 + 1.6 * len(groups), 4.0))
    seeds, ticks, legend = {}, [], {}
    for i, ((method, augmentation), g) in enumerate(groups):
        done = complete(g).get("final_test_error", EMPTY)
        e = statistics.proportion_ci(done)
        seeds.setdefault(method, set()).add(e["n"])
        whisker = {"yerr": [[e["mean"] - e["ci_low"]], [e["ci_high"] - e["mean"]]], "capsize": 4} if e["n"] > 1 else {}
        bar = ax.bar(i + x, e["mean"], width=width, color=tables.METHOD_COLORS.get(method, "C2"), **whisker)
        legend.setdefault(method, bar)
        left = i + x - width / 4  # the dots left of the whisker
        legend["seed"] = ax.scatter([left] * len(done), done, color="k", s=10, zorder=3)
        paper = g["paper_test_error"].dropna()
        if len(paper):
            legend["paper"] = ax.bar(i + 0.18, paper.iloc[0], width=0.36, color="0.75", hatch="//")
        gone = len(g) - len(done)
        left_out = f"\n({gone} diverged, left out)" if gone else ""
        ticks.append(f"{tables.method_label(method)}\n{augmentation_label(augmentation, cfg)}\nn = {e['n']}{left_out}")
    plots.note_if_empty(ax, complete(summary).get("final_test_error", EMPTY))
    order = [*sorted(seeds, key=tables.method_rank), "seed", "paper"]  # the methods' bars, then the dots, the paper
    ax.set_xticks(range(len(groups)), ticks, fontsize=8)
    ax.set_xlabel("method, training-set augmentation, seeds (n)")
    ax.set_ylabel("final test error (%)")
    interval = "; whisker: 95% interval of the mean" if max(map(max, seeds.values()), default=0) > 1 else ""
    ax.set_title(plots.title(cfg, "Table 1: final test error") + f"\nbar: mean over seeds{interval}; dot: one seed",
                 fontsize=10)  # fmt: skip
    labels = {m: f"{tables.method_label(m)}: this reproduction, mean of {_count(n)}" for m, n in seeds.items()}
    labels |= {"seed": "this reproduction, one seed", "paper": "paper (Table 1, same data set)"}
    shown = [k for k in order if k in legend]
    ax.legend([legend[k] for k in shown], [labels[k] for k in shown], frameon=False, fontsize=8, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))  # fmt: skip
    return plots.save(fig, cfg, "table1")


def _count(seeds: set[int]) -> str:
    """'4 seeds', '1 seed' or '3-5 seeds': the seed counts of a method's bars."""
    lo, hi = min(seeds), max(seeds)
    return f"{lo} seed{'s' * (hi != 1)}" if lo == hi else f"{lo}-{hi} seeds"


def stages(cfg: DictConfig):
    yield Stage(cfg, expand_grid(cfg))


@experiment("table1", plot=plot, headlines=headlines, stages=stages)
def analyse(cfg: DictConfig) -> Path:
    specs = expand_grid(cfg)
    manifests = engine.manifests(specs)
    paper = cfg.experiment.paper_test_error.get(cfg.dataset.name, {})

    def columns(spec) -> dict:
        return {"augment": augment(spec), "paper_test_error": paper.get(spec.cfg.model.norm, {}).get(augment(spec))}

    out = tables.summarise(cfg, specs, manifests, columns)
    plot(cfg)
    return out
