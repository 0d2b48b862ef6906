"""Did the runs reach their validation plateau? Per experiment and setting, from every run's
metrics.csv alone: the epoch of the best validation accuracy, and the validation accuracy gained over
the last quarter of the epochs (last epoch minus the epoch ceil(E / 4) before it). A budget that stops
runs while they still climb shows as best epochs at the end and gains well above the seed-to-seed
noise; `plateau_section` is the report's table for one results tree.

PLATEAU_COLUMNS: experiment, setting, runs, epochs, best_val_epoch (median over runs), at_last_epoch
(how many runs peak on validation in their last epoch), last_quarter_gain (mean over runs, pp),
gain_low / gain_high (their smallest and largest).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from normprop_cli.statistics import markdown

PLATEAU_COLUMNS = ["experiment", "setting", "runs", "epochs", "best_val_epoch", "at_last_epoch",
                   "last_quarter_gain", "gain_low", "gain_high"]  # fmt: skip


def run_plateau(metrics: pd.DataFrame) -> dict | None:
    """best_val_epoch, at_last_epoch and last_quarter_gain (pp) of one run's metrics; None without
    validation numbers."""
    m = metrics.dropna(subset=["val_acc"]) if "val_acc" in metrics else pd.DataFrame()
    if not len(m):
        return None
    epochs = int(m["epoch"].max())
    best = int(m.loc[m["val_acc"].idxmax(), "epoch"])
    back = max(1, math.ceil(epochs / 4))
    start = m.loc[m["epoch"] == epochs - back, "val_acc"]
    gain = float(m["val_acc"].iloc[-1] - start.iloc[0]) if len(start) else math.nan
    return {"epochs": epochs, "best_val_epoch": best, "at_last_epoch": best == epochs, "last_quarter_gain": gain}


def sweep_plateau(sweep: Path) -> pd.DataFrame:
    """PLATEAU_COLUMNS for one results/<experiment>/<dataset>/ directory: its finished runs (the
    learning-rate sweep's short runs, named sweep-*, left out), one row per setting."""
    rows = []
    for manifest_path in sorted(Path(sweep).glob("runs/*/manifest.json")):
        run = manifest_path.parent
        if run.name.startswith("sweep-") or not (run / "metrics.csv").exists():
            continue
        try:
            manifest = json.loads(manifest_path.read_text())
            row = run_plateau(pd.read_csv(run / "metrics.csv"))
        except (OSError, ValueError, KeyError, pd.errors.ParserError):
            continue
        if row is None or manifest.get("status") != "complete":
            continue
        rows.append({"experiment": manifest.get("experiment", ""), "setting": manifest.get("setting", run.name)} | row)
    if not rows:
        return pd.DataFrame(columns=PLATEAU_COLUMNS)
    runs = pd.DataFrame(rows)
    table = runs.groupby(["experiment", "setting"], sort=False).agg(
        runs=("epochs", "size"),
        epochs=("epochs", "max"),
        best_val_epoch=("best_val_epoch", "median"),
        at_last_epoch=("at_last_epoch", "sum"),
        last_quarter_gain=("last_quarter_gain", "mean"),
        gain_low=("last_quarter_gain", "min"),
        gain_high=("last_quarter_gain", "max"),
    )
    return table.reset_index()[PLATEAU_COLUMNS]


def plateau_lines(table: pd.DataFrame) -> list[str]:
    """The table as markdown rows for the report."""
    if not len(table):
        return []
    head = ["experiment", "setting", "runs", "epochs", "best validation epoch (median)", "runs best at the last epoch",
            "validation gain over the last quarter, pp: mean [min, max]"]  # fmt: skip
    rows = [[r["experiment"], r["setting"], r["runs"], r["epochs"], f"{r['best_val_epoch']:g}",
             f"{int(r['at_last_epoch'])} of {r['runs']}",
             f"{r['last_quarter_gain']:+.2f} [{r['gain_low']:+.2f}, {r['gain_high']:+.2f}]"]
            for r in table.to_dict("records")]  # fmt: skip
    return markdown(rows, head)


def plateau_section(tree: Path) -> list[str]:
    """Did the budget let the runs converge? Each sweep's best validation epoch and the validation gain
    over the last quarter of its epochs (experiments.plateau), one table per results tree."""
    from normprop_cli.experiments import EXPERIMENTS
    from normprop_cli.verdicts import result_dirs

    tables = [sweep_plateau(d) for e, exp in EXPERIMENTS.items() if exp.trains for d in result_dirs(tree, e)]
    tables = [t for t in tables if len(t)]
    if not tables:
        return []
    intro = (
        "Per setting (complete runs; the learning-rate sweeps left out): the median epoch of the best "
        "validation accuracy, how many runs peak in their last epoch, and the validation accuracy gained "
        "over the last quarter of the epochs. A gain well above the seed-to-seed spread means the runs "
        "were still climbing when the budget ended."
    )
    return ["## Budget: did the runs reach their plateau?", "", intro, ""] + plateau_lines(pd.concat(tables)) + [""]
