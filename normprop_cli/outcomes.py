"""What became of a run, as summary.csv says, below the experiments and the verdicts that both read
it: whether it learned (`learned_flags`, the rule's margin `LEARNED_MARGIN`) and whether it diverged."""

from __future__ import annotations

import pandas as pd

DIVERGED = "diverged"  # a run's manifest status once its loss went non-finite
LEARNED_MARGIN = 5.0  # a run whose final accuracy is at most chance + this many points did not learn
NEAR_CHANCE = f"at or below chance + {LEARNED_MARGIN:g} points"  # the final accuracy of a run that did not learn


def learned_flags(summary: pd.DataFrame, absent: bool = True) -> pd.Series:
    """summary.csv's `learned` column read back: True, False, or NaN for a run without metrics;
    `absent` for every run when the summary has no such column. Compare with .eq(True) / .eq(False)."""
    if "learned" not in summary:
        return pd.Series(absent, index=summary.index, dtype=object)
    return summary["learned"].astype(str).str.lower().map({"true": True, "false": False, "1": True, "0": False})


def diverged(runs: pd.DataFrame) -> pd.Series:
    """True for the rows of summary.csv whose run diverged (status "diverged")."""
    if "status" not in runs:
        return pd.Series(False, index=runs.index)
    return runs["status"].astype(str).eq(DIVERGED)
