"""Table 1 (section 5.5): test error of NormProp vs BatchNorm, without and with augmentation: the
paper's horizontal flips on CIFAR, small translations on digits (not mirror-symmetric), none on SVHN."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from normprop_cli import io
from normprop_cli.engine import expand_grid, run_sweep, sweep_dir
from normprop_cli.experiments import results
from normprop_cli.experiments.results import read_csv, run_row, write_summary

PAPER = ("cifar10", "cifar100", "svhn")  # the data sets of the paper's Table 1


def run(cfg: DictConfig) -> Path:
    specs = expand_grid(cfg)
    manifests = run_sweep(cfg, specs)
    paper = cfg.experiment.paper_test_error.get(cfg.dataset.name, {})
    rows = []
    for spec, manifest in zip(specs, manifests, strict=True):
        augment = spec.cfg.dataset.get("augment", "flip") if spec.cfg.train.augment else "none"
        row = run_row(spec, manifest) | {"augment": augment}
        row["paper_test_error"] = paper.get(spec.cfg.model.norm, {}).get(augment)
        rows.append(row)
    out = write_summary(cfg, rows)
    plot(cfg)
    return out


def headlines(cfg: DictConfig) -> list[dict]:
    """Final test error per method and augmentation, mean over seeds with its 95% interval, beside
    the paper's Table 1 (labelled not comparable off CIFAR and SVHN)."""
    summary = read_csv(sweep_dir(cfg) / "summary.csv", f"normprop run table1 --dataset {cfg.dataset.name}")
    rows = []
    for (method, augment), g in summary.groupby(["method", "augment"], sort=False):
        done = g[g["status"] == "complete"]
        e = results.mean_ci(done["final_test_error"])
        paper = g["paper_test_error"].iloc[0]
        rows.append(
            {
                "quantity": f"final test error % [95% CI, n = {e['n']}] ({method}, augmentation {augment})",
                "reproduced": results.format_ci(e["mean"], e["ci_low"], e["ci_high"]) if len(done) else "diverged",
                "paper": results.paper_value(cfg, paper, cfg.dataset.name if cfg.dataset.name in PAPER else "cifar10"),
            }
        )
    return rows + results.not_learned(cfg)


def plot(cfg: DictConfig) -> list[Path]:
    """Reproduced test error (mean over seeds, each seed a dot) beside the paper's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = sweep_dir(cfg)
    summary = read_csv(directory / "summary.csv", f"normprop run table1 --dataset {cfg.dataset.name}")
    groups = list(summary.groupby(["method", "augment"], sort=False))
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(groups), 3.4))
    labelled = set()
    for i, ((method, _augment), g) in enumerate(groups):
        ax.bar(i - 0.18, g["final_test_error"].mean(), width=0.36, color="C0" if method == "normprop" else "C1")
        ax.scatter(
            [i - 0.18] * len(g),
            g["final_test_error"],
            color="k",
            s=10,
            zorder=3,
            label=None if "seed" in labelled else "reproduced, one seed",
        )
        labelled.add("seed")
        paper = g["paper_test_error"].dropna()
        if len(paper):
            ax.bar(
                i + 0.18,
                paper.iloc[0],
                width=0.36,
                color="0.75",
                hatch="//",
                label=None if "paper" in labelled else "paper",
            )
            labelled.add("paper")
    ax.set_xticks(range(len(groups)), [f"{m}\n{a}" for (m, a), _ in groups])
    ax.set_ylabel("test error (%)")
    ax.set_title(f"Table 1, {cfg.dataset.name} ({cfg.preset.name} preset)")
    ax.legend(frameon=False)
    paths = io.save_figure(fig, directory / "table1")
    plt.close(fig)
    return paths
