"""What every claim's measurement is made of: Measurement (a per-seed table and the estimate that
turns it into an effect with an interval), the CSV reader that raises NotMeasured, and the helpers
that pick the runs a claim counts. A View tells read() which reading of the results to give: as
written, with each run's test metric at its best-validation epoch in place of its final one, or as
they stood after an epoch (the robustness checks of verdicts/robustness.py); the caller names it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from normprop_cli.outcomes import NEAR_CHANCE, diverged, learned_flags
from normprop_cli.verdicts.rule import Estimate

FINAL = {"final_test_error": "error", "final_test_acc": "acc"}  # summary.csv's final test metrics


@dataclass(frozen=True)
class View:
    """Which reading of a sweep's CSVs read() gives; View() is the results as written.

    - `best_validation`: a summary's final test metrics (FINAL) become the test metric at each run's
      best-validation epoch (best_val_test_error); read() appends each CSV where it did so to `replaced`
      (left empty: the claim reads no final test metric, and the check does not apply).
    - `epoch`: the results as they stood after it: a summary's final test metrics become each run's test
      metric at its last epoch <= `epoch` (its runs/<run>/metrics.csv), and a table of epochs or rounds
      (an `epoch` or `round` column) keeps those <= `epoch`.
    - `note_epochs`: read() appends to `last_epochs` the last epoch (or round) of every table it reads
      that has one (for a summary's final test metrics, its runs' metrics.csv): where the last quarter
      the stability check judges ends.

    The two lists are what the reads found, filled in by read(); a View is made for one measurement."""

    epoch: int | None = None
    best_validation: bool = False
    note_epochs: bool = False
    replaced: list[Path] = field(default_factory=list, compare=False)
    last_epochs: list[int] = field(default_factory=list, compare=False)


def _metrics(path: Path, run) -> pd.DataFrame | None:
    metrics = path.parent / "runs" / str(run) / "metrics.csv"
    return pd.read_csv(metrics, usecols=["epoch", "test_acc"]) if metrics.exists() else None


def _test_acc_at(path: Path, run, epoch: int) -> float:
    m = _metrics(path, run)
    if m is None:
        return math.nan
    m = m[m["epoch"] <= epoch]
    return float(m["test_acc"].iloc[-1]) if len(m) else math.nan


def _best_validation(path: Path, frame: pd.DataFrame, columns, view: View) -> pd.DataFrame:
    """View.best_validation's part of read()."""
    wanted = [c for c in FINAL if c in columns and c in frame]
    if not (view.best_validation and wanted and "best_val_test_error" in frame):
        return frame
    best = pd.to_numeric(frame["best_val_test_error"], errors="coerce")
    view.replaced.append(path)
    return frame.assign(**{c: best if FINAL[c] == "error" else 100.0 - best for c in wanted})


def _epoch_view(path: Path, frame: pd.DataFrame, columns, view: View) -> pd.DataFrame:
    """View.epoch and View.note_epochs's part of read()."""
    finals = [c for c in FINAL if c in columns and c in frame]
    if view.note_epochs:
        if finals and "run" in frame:
            last = [m["epoch"].max() for run in frame["run"] if (m := _metrics(path, run)) is not None and len(m)]
            view.last_epochs.extend([int(max(last))] if last else [])
        view.last_epochs.extend(
            int(pd.to_numeric(frame[c]).max()) for c in ("epoch", "round") if c in frame and len(frame)
        )
    epoch = view.epoch
    if epoch is None:
        return frame
    if finals and "run" in frame:
        acc = frame["run"].map(lambda run: _test_acc_at(path, run, epoch))
        frame = frame.assign(**{c: 100.0 - acc if FINAL[c] == "error" else acc for c in finals})
    for column in ("epoch", "round"):
        if column in frame:
            frame = frame[pd.to_numeric(frame[column]) <= epoch]
    return frame


class NotMeasured(Exception):
    """The claim's CSV, or the columns it needs, are not there: its verdict is "not measured"."""


@dataclass
class Measurement:
    table: pd.DataFrame  # per seed (or per seed and method); a `seed` column
    estimate: Callable[[pd.DataFrame], Estimate]
    test: str
    metric: dict = field(default_factory=dict)  # values for the claim's {placeholders}
    notes: list[str] = field(default_factory=list)
    # the baseline's test error (%, mean over all seeds) that a claim's relative margin is a fraction
    # of (Claim.relative_to); NaN where the claim has none
    reference: float = math.nan
    # where it stands on no runs (an experiment that trains nothing): its input, in the data set's
    # column, and its budget
    dataset: str = ""
    budget: str = ""
    # the effect after each epoch (mean over seeds, the effect's orientation), where the claim has one
    by_epoch: pd.Series | None = None
    # the last epoch the claim reads, where not the runs' last (C3: its early window's end)
    last_epoch: int | None = None


def read(path: Path, columns, view: View | None = None) -> pd.DataFrame:
    """A CSV with the columns the claim needs, in the reading `view` names (None: as written), else
    NotMeasured naming what is missing."""
    if not path.exists():
        raise NotMeasured(f"no {path.name}")
    view = view or View()
    frame = _best_validation(path, pd.read_csv(path), columns, view)
    frame = _epoch_view(path, frame, columns, view)
    if lacking := [c for c in columns if c not in frame.columns]:
        raise NotMeasured(f"{path.name} has no column(s) {', '.join(lacking)}: rerun the experiment")
    if not len(frame):  # e.g. epochs.csv of runs that all diverged in their first epoch
        raise NotMeasured(f"{path.name} has no rows")
    return frame


def finished(summary: pd.DataFrame, value: str) -> pd.DataFrame:
    """Complete runs with a finite `value`. Diverged runs are counted apart (diverged_note), never
    averaged into an effect: their last finite metrics stay in the CSVs."""
    done = summary[summary["status"] == "complete"] if "status" in summary else summary
    return done[np.isfinite(pd.to_numeric(done[value], errors="coerce"))]


def error_of(runs: pd.DataFrame, column: str = "final_test_acc") -> float:
    """Mean test error (%) over the runs: the reference a relative margin is a fraction of."""
    values = pd.to_numeric(runs[column], errors="coerce")
    return float(100.0 - values.mean()) if "acc" in column else float(values.mean())


def not_learned(summary: pd.DataFrame) -> pd.Series:
    """True where the summary says the run did not learn; False where it says nothing."""
    return learned_flags(summary).eq(False)


def learned_note(runs: pd.DataFrame) -> list[str]:
    """Accuracy claims keep runs that did not learn (failing to learn is an outcome); say how many."""
    k = int(not_learned(runs).sum())
    if not k:
        return []
    return [f"{k} of {len(runs)} runs did not learn (final accuracy {NEAR_CHANCE}); they count"]


def diverged_note(runs: pd.DataFrame, by: str | None = None) -> list[str]:
    """'k of n runs diverged (...): counted apart, their seeds' pairs left out of the effect'. `runs` is
    the summary before `finished` (all statuses); `by` names the column that tells the arms apart."""
    bad = runs[diverged(runs)]
    if not len(bad):
        return []
    where = ""
    if by and by in bad:
        where = " (" + ", ".join(f"{key}: {len(g)}" for key, g in bad.groupby(by, sort=False)) + ")"
    return [f"{len(bad)} of {len(runs)} runs diverged{where}: counted apart, their seeds' pairs left out of the effect"]


def per_seed(runs: pd.DataFrame, value: str, column: str, normprop, baseline, within: str | None = None):
    """seed, normprop, baseline: `value` where `column` == normprop / baseline, paired by seed (and by
    `within`, then averaged over it); only the pairs where both exist."""
    index = ["seed"] + ([within] if within else [])
    wide = runs.pivot_table(index=index, columns=column, values=value, aggfunc="mean")
    if normprop not in wide or baseline not in wide:
        raise NotMeasured(f"no runs with {column} = {normprop} and {column} = {baseline}")
    wide = wide[[normprop, baseline]].dropna().groupby("seed").mean()
    return pd.DataFrame({"seed": wide.index, "normprop": wide[normprop].values, "baseline": wide[baseline].values})
