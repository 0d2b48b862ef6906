"""Theory (sections 3.2-3.4, Remarks 1-2, Proposition 1): no training, CSVs and figures.

    normprop run theory [theory.samples=200000]

1. activation_stats.csv  Remark 1, Remark 2, eq. 12 and the note's pooling and dropout constants:
                         closed form vs quadrature vs Monte Carlo.
2. jacobian.csv          section 3.4: singular values of d o / d x of one NormProp layer, with and
                         without the Jacobian factor (histograms in jacobian_histogram.csv).
3. proposition1.csv      Prop. 1 (eq. 3, proof eq. 16-19): exact min_alpha ||Sigma - diag(alpha)||_F
                         against the bound as printed and as corrected by the note's Appendix A.
4. propagation.csv       section 3.3: mean and std of every layer of deep random nets at init, at
                         several seeds (the figure: the first seed).

Everything runs on the CPU; float64 where a number is compared with a formula. One module per study
(activations, jacobian, proposition1, propagation), the figures in figures.py; the numbers the paper and
the note print are `experiment.published` in conf/experiment/theory.yaml.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from normprop_cli import io
from normprop_cli.engine.runs import say
from normprop_cli.experiments.base import experiment
from normprop_cli.experiments.tables import command, read_csv
from normprop_cli.experiments.theory.activations import activation_table
from normprop_cli.experiments.theory.common import published
from normprop_cli.experiments.theory.figures import FIGURES
from normprop_cli.experiments.theory.jacobian import jacobian_tables
from normprop_cli.experiments.theory.propagation import first_seed, propagation_table
from normprop_cli.experiments.theory.proposition1 import proposition1_table

CSVS = ("activation_stats", "jacobian", "jacobian_histogram", "proposition1", "propagation")


def out_dir(cfg: DictConfig) -> Path:
    return Path(cfg.results_dir) / "theory"


@contextmanager
def one_thread():
    """Small tensors and many small LAPACK calls: on a shared CPU a second intra-op thread costs
    more than it gives (measured: the batched SVDs 10-50x slower with two threads under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def headlines(cfg: DictConfig) -> list[dict]:
    """The constants, the Jacobian, Proposition 1 and propagation, beside the paper's claims."""
    out = out_dir(cfg)
    stats, jac, prop, propagation = (
        read_csv(out / f"{name}.csv", command(cfg))
        for name in ("activation_stats", "jacobian", "proposition1", "propagation")
    )
    relu = stats[(stats["quantity"] == "activation") & (stats["name"] == "relu")].set_index("statistic")
    factor, _ = published(cfg, "activation", "relu", "jacobian_factor")
    rows = [
        {
            "quantity": "E[ReLU(X)], X ~ N(0,1) (Remark 1)",
            "reproduced": relu.loc["mean", "quadrature"],
            "paper": 1 / math.sqrt(2 * math.pi),
        },
        {
            "quantity": "std ReLU(X) (Remark 1)",
            "reproduced": relu.loc["std", "quadrature"],
            "paper": math.sqrt((1 - 1 / math.pi) / 2),
        },
        {
            "quantity": "Jacobian factor, ReLU (section 3.4)",
            "reproduced": relu.loc["jacobian_factor", "quadrature"],
            "paper": factor,
        },
    ]
    for mode, paper in (("off", factor), ("divide", "1 (the aim of the factor)")):
        row = jac[(jac["activation"] == "relu") & (jac["jacobian"] == mode)]
        if len(row):
            rows.append(
                {
                    "quantity": f"RMS singular value of a ReLU layer's Jacobian, factor {mode}",
                    "reproduced": row["sv_rms"].iloc[0],
                    "paper": paper,
                }
            )
    rows.append(
        {
            "quantity": "Prop. 1 cases where the printed bound is undefined / fails / the corrected one fails",
            "reproduced": f"{int(prop['printed_undefined'].sum())} / {int(prop['printed_fails'].sum())} / "
            f"{int(prop['corrected_fails'].sum())} of {len(prop)}",
            "paper": "0 / 0 (claimed)",
        }
    )
    fc = propagation[
        (propagation["net"] == "fc") & (propagation["method"] == "normprop") & (propagation["quantity"] == "output")
    ]
    seeds = fc["seed"].nunique() if "seed" in fc else 1
    for mode, g in fc.groupby("jacobian"):
        inside = first_seed(g).sort_values("layer")["in_band"].astype(bool).tolist()
        first_out = inside.index(False) + 1 if False in inside else None
        every = g.groupby("seed")["in_band"].all().sum() if "seed" in g else int(all(inside))
        rows.append(
            {
                "quantity": f"deep random NormProp net (factor {mode}): layers within 0±{cfg.theory.band} "
                f"mean, 1±{cfg.theory.band} std (first seed); seeds with every layer inside",
                "reproduced": f"{sum(inside)} of {len(inside)}"
                + (f" (first outside: layer {first_out})" if first_out else "")
                + f"; {int(every)} of {seeds}",
                "paper": "all (section 3.3)",
            }
        )
    return rows


def plot(cfg: DictConfig) -> list[Path]:
    """Redraw the four figures from the CSVs alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = out_dir(cfg)
    tables = {name: read_csv(out / f"{name}.csv", command(cfg)) for name in CSVS}
    paths = []
    with plt.rc_context(
        {
            "font.size": 10,
            "axes.titlesize": 11,
            "legend.fontsize": 8.5,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    ):
        for stem, draw in FIGURES.items():
            fig = draw(plt, tables, cfg)
            paths += io.save_figure(fig, out / stem, cfg.figures)
            plt.close(fig)
    return paths


def computed_with(cfg: DictConfig) -> str:
    """What the tables depend on (the theory settings and the published numbers), as YAML: stored
    beside the CSVs, so that a second `run` under the same settings skips the computation."""
    return OmegaConf.to_yaml({"theory": cfg.theory, "published": cfg.experiment.published})


def complete(cfg: DictConfig) -> bool:
    """Every CSV is there, computed under these settings."""
    out, stamp = out_dir(cfg), out_dir(cfg) / "config.yaml"
    return all((out / f"{n}.csv").exists() for n in CSVS) and stamp.exists() and stamp.read_text() == computed_with(cfg)


@experiment("theory", plot=plot, headlines=headlines, trains=False)
def run(cfg: DictConfig) -> Path:
    """Compute the tables and draw the figures; where they were computed under the same settings,
    skip them (as a finished run is skipped) and only draw the figures that are missing."""
    out = out_dir(cfg)
    if complete(cfg):
        say(f"theory: computed under the same settings in {out}: reused (delete {out / 'config.yaml'} to recompute)")
        if not all((out / f"{stem}.png").exists() for stem in FIGURES):
            plot(cfg)
        return out
    with one_thread():
        jacobian, histogram = jacobian_tables(cfg)
        tables = {
            "activation_stats": activation_table(cfg),
            "jacobian": jacobian,
            "jacobian_histogram": histogram,
            "proposition1": proposition1_table(cfg),
        }
    tables["propagation"] = propagation_table(cfg)  # 1024 x 1024 products: every thread helps
    for name, frame in tables.items():
        io.write_csv(out / f"{name}.csv", frame)
    plot(cfg)
    io.write_text(out / "config.yaml", computed_with(cfg))  # last: a killed computation is redone
    return out
