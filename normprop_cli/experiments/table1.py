"""Table 1 (section 5.5): test error of NormProp vs BatchNorm, without and with augmentation: the
paper's horizontal flips on CIFAR, small translations on digits (not mirror-symmetric), none on SVHN.

summary.csv  one row per run: engine columns + augment, paper_test_error (the paper's, in %)
table1.png/.pdf  reproduced test error per method and augmentation (each seed a dot) beside the paper's
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from normprop_cli.engine import expand_grid, run_sweep
from normprop_cli.experiments import results


def augment(spec) -> str:
    """The run's augmentation: the data set's (flips on CIFAR, translations on digits), or none."""
    return spec.cfg.dataset.get("augment", "flip") if spec.cfg.train.augment else "none"


def run(cfg: DictConfig) -> Path:
    specs = expand_grid(cfg)
    manifests = run_sweep(cfg, specs)
    paper = cfg.experiment.paper_test_error.get(cfg.dataset.name, {})

    def columns(spec) -> dict:
        return {"augment": augment(spec), "paper_test_error": paper.get(spec.cfg.model.norm, {}).get(augment(spec))}

    out = results.summarise(cfg, specs, manifests, columns)
    plot(cfg)
    return out


def headlines(cfg: DictConfig) -> list[dict]:
    """Final test error per method and augmentation, mean over the complete runs with its 95% interval
    (results.proportion_ci, inside [0, 100]) and the diverged runs counted beside it, beside the
    paper's Table 1 (labelled not comparable off the paper's data sets, experiment.paper_test_error)."""
    summary = results.read(cfg, "summary")
    paper_dataset = cfg.dataset.name if cfg.dataset.name in cfg.experiment.paper_test_error else "cifar10"
    rows = []
    for (method, augmentation), g in summary.groupby(["method", "augment"], sort=False):
        e = results.proportion_ci(complete(g)["final_test_error"])
        rows.append(
            {
                "quantity": f"final test error % [95% CI, n = {e['n']}] ({method}, augmentation {augmentation})",
                "reproduced": results.with_diverged(results.format_mean_ci(e), g),
                "paper": results.paper_value(cfg, g["paper_test_error"].iloc[0], paper_dataset),
            }
        )
    return rows + results.not_learned(cfg)


def complete(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that finished their epochs: a diverged or unfinished run is not averaged in."""
    return runs[runs["status"] == "complete"] if "status" in runs else runs


def plot(cfg: DictConfig) -> list[Path]:
    """Reproduced test error (mean over the complete runs, each seed a dot) beside the paper's."""
    plt = results.pyplot()
    summary = results.read(cfg, "summary")
    groups = list(summary.groupby(["method", "augment"], sort=False))
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(groups), 3.4))
    labelled = set()
    for i, ((method, _augment), g) in enumerate(groups):
        mean = complete(g)["final_test_error"].mean()
        ax.bar(i - 0.18, mean, width=0.36, color=results.METHOD_COLORS.get(method, "C2"))
        seed_label = None if "seed" in labelled else "reproduced, one seed"
        ax.scatter([i - 0.18] * len(g), g["final_test_error"], color="k", s=10, zorder=3, label=seed_label)
        labelled.add("seed")
        paper = g["paper_test_error"].dropna()
        if len(paper):
            paper_label = None if "paper" in labelled else "paper"
            ax.bar(i + 0.18, paper.iloc[0], width=0.36, color="0.75", hatch="//", label=paper_label)
            labelled.add("paper")
    ax.set_xticks(range(len(groups)), [f"{m}\n{a}" for (m, a), _ in groups])
    ax.set_ylabel("test error (%)")
    ax.set_title(results.title(cfg, "Table 1"))
    ax.legend(frameon=False)
    return results.save(fig, cfg, "table1")
