"""The CSVs as the figures and the report read them, no model needed: the rows of runs that learned
and did not diverge, the (method, width) groups and their labels, and means over seeds (and layers).

An ablation setting is one that shares its (method, width) with another setting of the grid: the
group's main setting is the one named after the method (`normprop`, `batchnorm`), else the group's
first; every other setting of the group is an ablation of it (e.g. `normprop-zca`). The (method,
width) findings and drift.png read the main settings alone (`main_rows`); the ablation findings
(ablation.py) compare each ablation with its main setting."""

from __future__ import annotations

import pandas as pd
from omegaconf import DictConfig

from normprop_cli import outcomes, statistics
from normprop_cli.experiments import tables as run_tables
from normprop_cli.outcomes import learned_flags

GROUP = ["method", "width"]


def learned_rows(cfg: DictConfig, table: pd.DataFrame) -> pd.DataFrame:
    """The rows of runs that learned and did not diverge; the others stay in the CSVs, out of the
    headlines (experiments.tables.not_learned names those that did not learn)."""
    summary = run_tables.read(cfg, "summary")
    if "learned" not in summary or not len(table):
        return table
    kept = summary.loc[learned_flags(summary).eq(True) & ~outcomes.diverged(summary), "run"]
    return table[table["run"].isin(kept)]


def ablation_settings(table: pd.DataFrame) -> dict[str, str]:
    """{ablation setting: the main setting it is compared with}, in the table's order; {} without any."""
    if not len(table) or not {"setting", "method", "width"} <= set(table):
        return {}
    out = {}
    for (method, _), g in table.groupby(GROUP, sort=False):
        settings = list(dict.fromkeys(g["setting"]))
        main = method if method in settings else settings[0]
        out |= {s: main for s in settings if s != main}
    return out


def main_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the main settings: one setting per (method, width), as the grid had before ablations."""
    ablations = ablation_settings(table)
    return table[~table["setting"].isin(list(ablations))] if ablations else table


def by_group(table: pd.DataFrame):
    """(method, width) groups, NormProp first, narrow before wide."""
    if not len(table):
        return []
    groups = table.groupby(GROUP, sort=False)
    return sorted(groups, key=lambda g: (run_tables.method_rank(g[0][0]), g[0][1]))


def group_label(key, g: pd.DataFrame) -> str:
    """A (method, width) group's name in the legends and headlines, with its number of seeds."""
    method, width = key
    seeds = g["seed"].nunique()
    return f"{run_tables.method_label(method)}, width {width:g} ({seeds} seed{'s' if seeds > 1 else ''})"


def by_epoch(g: pd.DataFrame, column: str, layers=None) -> pd.Series:
    """Per epoch: the mean over layers (all, or `layers`) of each seed's value, then over seeds."""
    if layers is not None:
        g = g[g["layer"].isin(layers)]
    return g.groupby(["epoch", "seed"])[column].mean().groupby("epoch").mean()


def mean_at(g: pd.DataFrame, column: str, epoch: int, layers=None) -> dict:
    """mean_ci (a t interval: ratios, coherences and drifts are not proportions) over seeds of each
    seed's mean over layers of `column` at `epoch`."""
    g = g[g["epoch"] == epoch]
    if layers is not None:
        g = g[g["layer"].isin(layers)]
    return statistics.mean_ci(g.groupby("seed")[column].mean())
