"""What every claim's measurement is made of: Measurement (a per-seed table and the estimate that
turns it into an effect with an interval), the CSV reader that raises NotMeasured, and the helpers
that pick the runs a claim counts. `at_best_validation()` makes read() take each run's test metric at
its best-validation epoch in place of its final one (the robustness check of verdicts/robustness.py)."""

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
