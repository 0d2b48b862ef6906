"""NormProp against BatchNorm, paired by seed: NormProp minus BatchNorm with the same activation
(paired_gaps), shown beside C8's verdict (verdicts.constants) and in the activations experiment's
report. Any verdict's effect after every epoch (effect_series, epoch_note), from the runs' metrics.csv."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

ACCURACY = "final_test_acc"  # the column C8 compares, in summary.csv
GAP_COLUMNS = ["seed", "activation", "normprop", "batchnorm", "gap"]
REFERENCE = "relu"  # C8 measures every other activation against NormProp with ReLU


def paired_gaps(summary: pd.DataFrame, value: str = ACCURACY) -> pd.DataFrame:
    """GAP_COLUMNS: per seed and activation, the final test accuracy (%) of NormProp and of BatchNorm and
    gap = NormProp minus BatchNorm; complete runs only (a diverged run is counted apart, never paired),
    and only the (seed, activation) pairs where both methods have one. `value`: another
    accuracy column (epochs.csv's test_acc, one epoch's rows)."""
    if not len(summary) or value not in summary:
        return pd.DataFrame(columns=GAP_COLUMNS)
    ended = summary["status"].eq("complete") if "status" in summary else True
    runs = summary[ended & np.isfinite(pd.to_numeric(summary[value], errors="coerce"))]
    wide = runs.pivot_table(index=["seed", "activation"], columns="method", values=value, aggfunc="mean")
    if not {"normprop", "batchnorm"} <= set(wide.columns):
        return pd.DataFrame(columns=GAP_COLUMNS)
    wide = wide[["normprop", "batchnorm"]].dropna().reset_index()
    order = {a: i for i, a in enumerate(dict.fromkeys(summary["activation"]))}  # the grid's order
    wide = wide.sort_values(["seed", "activation"], key=lambda c: c.map(order) if c.name == "activation" else c)
    return wide.assign(gap=wide["normprop"] - wide["batchnorm"])[GAP_COLUMNS].reset_index(drop=True)


def effect_series(
    sweep: Path, runs: pd.DataFrame, column: str, normprop, baseline, within: str | None = None
) -> pd.Series:
    """A verdict's effect after each epoch (index: epoch), from the runs' metrics.csv: the test accuracy
    where `column` == normprop minus where it == baseline, paired by seed (and by `within`, then averaged
    over it), mean over seeds; empty where the runs have no per-epoch metrics. (An accuracy difference
    is also the error difference the other way round: C5's BatchNorm minus NormProp error is NormProp
    minus BatchNorm accuracy, so the series has the effect's orientation.)"""
    empty = pd.Series(dtype=float, name="effect")
    if not {"run", "seed", column} <= set(runs.columns) or (within and within not in runs):
        return empty
    rows = []
    for r in runs.to_dict("records"):
        path = sweep / "runs" / str(r["run"]) / "metrics.csv"
        if path.exists():
            m = pd.read_csv(path)
            key = {column: r[column], "seed": r["seed"], "within": r[within] if within else 0}
            rows += [key | {"epoch": e, "acc": a} for e, a in zip(m["epoch"], m["test_acc"], strict=True)]
    if not rows:
        return empty
    wide = pd.DataFrame(rows).pivot_table(index=["epoch", "within", "seed"], columns=column, values="acc")
    if normprop not in wide or baseline not in wide:
        return empty
    effect = (wide[normprop] - wide[baseline]).dropna().groupby(["epoch", "seed"]).mean().groupby("epoch").mean()
    return effect.rename("effect")


def epoch_note(effect: pd.Series) -> list[str]:
    """'the effect after each epoch (mean over seeds): 1: +0.08, 2: +0.27, ...'; nothing for no epochs."""
    if not len(effect):
        return []
    text = ", ".join(f"{int(e)}: {g:+.2f}" for e, g in effect.items())
    return [f"the effect after each epoch (mean over seeds): {text}"]
