"""What every claim's measurement is made of: Measurement (a per-seed table and the estimate that
turns it into an effect with an interval), the CSV reader that raises NotMeasured, and the helpers
that pick the runs a claim counts. `at_best_validation()` makes read() take each run's test metric at
its best-validation epoch in place of its final one, and `at_epoch(e)` makes it read the results as they
stood after epoch e (the robustness checks of verdicts/robustness.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from normprop_cli.outcomes import NEAR_CHANCE, diverged, learned_flags
from normprop_cli.verdicts.rule import Estimate

FINAL = {"final_test_error": "error", "final_test_acc": "acc"}  # summary.csv's final test metrics
_BEST_VALIDATION: ContextVar[list | None] = ContextVar("best_validation", default=None)
_AT_EPOCH: ContextVar[int | None] = ContextVar("at_epoch", default=None)
_EPOCHS_SEEN: ContextVar[list | None] = ContextVar("epochs_seen", default=None)


@contextmanager
def at_best_validation() -> Iterator[list[Path]]:
    """Within it, read() replaces a summary's final test metrics (FINAL) by the test metric at each run's
    best-validation epoch (best_val_test_error); the list it yields names the CSVs where it did so
    (empty: the claim reads no final test metric, and the check does not apply)."""
    used: list[Path] = []
    token = _BEST_VALIDATION.set(used)
    try:
        yield used
    finally:
        _BEST_VALIDATION.reset(token)


@contextmanager
def at_epoch(epoch: int) -> Iterator[None]:
    """Within it, read() gives the results as they stood after `epoch`: a summary's final test metrics
    (FINAL) become each run's test metric at its last epoch <= `epoch` (its runs/<run>/metrics.csv),
    and a table of epochs or rounds (an `epoch` or `round` column) keeps those <= `epoch`. The
    stability check of verdicts/robustness.py judges the claim so at each epoch of the last quarter."""
    token = _AT_EPOCH.set(int(epoch))
    try:
        yield
    finally:
        _AT_EPOCH.reset(token)


@contextmanager
def epochs_seen() -> Iterator[list[int]]:
    """Within it, read() notes the last epoch (or round) of every table it reads that has one."""
    seen: list[int] = []
    token = _EPOCHS_SEEN.set(seen)
    try:
        yield seen
    finally:
        _EPOCHS_SEEN.reset(token)


def _metrics(path: Path, run) -> pd.DataFrame | None:
    metrics = path.parent / "runs" / str(run) / "metrics.csv"
    return pd.read_csv(metrics, usecols=["epoch", "test_acc"]) if metrics.exists() else None


def _test_acc_at(path: Path, run, epoch: int) -> float:
    m = _metrics(path, run)
    if m is None:
        return math.nan
    m = m[m["epoch"] <= epoch]
    return float(m["test_acc"].iloc[-1]) if len(m) else math.nan


def _epoch_view(path: Path, frame: pd.DataFrame, columns) -> pd.DataFrame:
    """at_epoch and epochs_seen's part of read()."""
    epoch, seen = _AT_EPOCH.get(), _EPOCHS_SEEN.get()
    finals = [c for c in FINAL if c in columns and c in frame]
    if seen is not None:
        if finals and "run" in frame:
            last = [m["epoch"].max() for run in frame["run"] if (m := _metrics(path, run)) is not None and len(m)]
            seen += [int(max(last))] if last else []
        seen += [int(pd.to_numeric(frame[c]).max()) for c in ("epoch", "round") if c in frame and len(frame)]
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


def read(path: Path, columns) -> pd.DataFrame:
    """A CSV with the columns the claim needs, else NotMeasured naming what is missing."""
    if not path.exists():
        raise NotMeasured(f"no {path.name}")
    frame = pd.read_csv(path)
    used = _BEST_VALIDATION.get()
    wanted = [c for c in FINAL if c in columns and c in frame]
    if used is not None and wanted and "best_val_test_error" in frame:
        best = pd.to_numeric(frame["best_val_test_error"], errors="coerce")
        frame = frame.assign(**{c: best if FINAL[c] == "error" else 100.0 - best for c in wanted})
        used.append(path)
    frame = _epoch_view(path, frame, columns)
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
