"""normalizers.csv from summary.csv: per batch size and method, accuracies with intervals, the difference
from the reference method in pp with a Welch interval Bonferroni-corrected over the table's comparisons, the
minimum difference each comparison could detect (`mdd`), drift and both modes at batch 1."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from normprop_cli import statistics
from normprop_cli.experiments import tables as run_tables
from normprop_cli.nn import methods

KEYS = ["setting", "normalizer", "batch_size", "initial_lr"]
TABLE = ["batch_size", "rank", "normalizer", "lr", "n", "diverged", "learned", "final_acc", "final_low",
         "final_high", "best_val_acc", "best_val_low", "best_val_high", "diff_vs_reference", "diff_low", "diff_high",
         "p_value", "diff_level", "compared", "mdd", "reading", "train_mode_diff", "train_mode_diff_low",
         "train_mode_diff_high", "step_ms", "drift", "drift_low", "drift_high", "train_mode_acc",
         "train_mode_low", "train_mode_high", "eval_mode_acc", "eval_mode_low", "eval_mode_high", "mode_gap",
         "mode_gap_low", "mode_gap_high"]  # fmt: skip


def label(method: str) -> str:
    """A method's label, as its registration (nn.methods) gives it."""
    return methods.label(method)


def final_drift(population: pd.DataFrame) -> float:
    """The population's average drift at the run's last epoch, averaged over its layers."""
    if not len(population):
        return math.nan
    last = population[population["epoch"] == population["epoch"].max()]
    return float(last["avg_drift"].mean())


def best_val_test_acc(runs: pd.DataFrame) -> float:
    """Test accuracy at the epoch of best validation accuracy (first such epoch)."""
    return float(runs.loc[runs["val_acc"].idxmax(), "test_acc"]) if len(runs) else math.nan


ACCURACY_DIFFERENCE = (-100.0, 100.0)  # a difference of two accuracies in %: statistics.welch's bounds


POWER = 0.8  # the power at which `mdd` is the smallest difference a comparison detects


def mdd(a, b, level: float = statistics.LEVEL, power: float = POWER) -> float:
    """The minimum detectable difference of mean(a) - mean(b): the smallest true difference that the
    two-sided Welch test at `level` (alpha = 1 - level) detects with probability `power`, given the two
    samples' sizes and spreads: (t_{1-alpha/2} + t_{power}) sqrt(s_a^2/n_a + s_b^2/n_b), both t quantiles at
    Welch's degrees of freedom. NaN with fewer than 2 finite values on a side or no spread on either."""
    from scipy.special import stdtrit

    x, y = (pd.to_numeric(pd.Series(v, dtype=float), errors="coerce").to_numpy() for v in (a, b))
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    if len(x) < 2 or len(y) < 2:
        return math.nan
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    if vx + vy == 0:
        return math.nan
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    return float((stdtrit(df, 0.5 + level / 2) + stdtrit(df, power)) * math.sqrt(vx + vy))


def compared(summary: pd.DataFrame, reference: str) -> set[tuple[int, str]]:
    """(batch size, method) of every comparison with the reference: a method other than the reference
    with at least 2 runs that did not diverge, at a batch size where the reference has at least 2."""
    found = set()
    for bs, every in summary.groupby("batch_size"):
        kept = run_tables.kept(every)
        if (kept["normalizer"] == reference).sum() >= 2:
            sizes = kept.groupby("normalizer").size().drop(reference, errors="ignore")
            found |= {(int(bs), m) for m in sizes[sizes >= 2].index}
    return found


def comparisons(summary: pd.DataFrame, reference: str) -> int:
    """How many methods are compared with the reference over the table (every batch size): the family
    of the Bonferroni correction, m (at least 1)."""
    return max(len(compared(summary, reference)), 1)


def reading(low: float, high: float) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return "no interval"
    return "better" if low > 0 else "worse" if high < 0 else "indistinguishable"


def table(cfg: DictConfig, summary: pd.DataFrame) -> pd.DataFrame:
    """One row per batch size and method, ranked by mean final test accuracy (best first), over the
    runs that did not diverge (those are counted in `diverged`): accuracies with proportion_ci, drift and
    the mode gap with t intervals, and the difference from the reference's final test accuracy in pp with a
    Welch interval at the Bonferroni level 1 - 0.05/m, m the comparisons over the whole table (`compared`
    marks them), its uncorrected p-value and its minimum detectable difference at that level (`mdd`); at
    batch 1, the batch-statistics methods' training-mode accuracy minus the reference's (`train_mode_diff`,
    the same level; not one of the m). `learned` counts the runs that learned in a mode they are scored
    in (experiments.tables.learned_in_a_mode)."""
    reference = cfg.experiment.get("reference", "normprop-icml")
    summary = run_tables.with_columns(summary, "final_test_acc", "best_val_test_acc", "step_ms", "drift")
    family = compared(summary, reference)
    level = 1.0 - (1.0 - statistics.LEVEL) / max(len(family), 1)  # Bonferroni over the whole table
    rows = []
    for bs, every in summary.groupby("batch_size", sort=True):
        at = run_tables.kept(every)
        ref = at.loc[at["normalizer"] == reference, "final_test_acc"]
        for method, runs in every.groupby("normalizer", sort=False):
            g = run_tables.kept(runs)
            final = statistics.proportion_ci(g["final_test_acc"])
            best = statistics.proportion_ci(g["best_val_test_acc"])
            drift = statistics.mean_ci(g["drift"])
            drift["ci_low"] = max(drift.get("ci_low", math.nan), 0.0)  # an average distance: never below 0
            modes = {}  # train_mode_acc, train_mode_low, ..., eval_mode_high
            for column in run_tables.MODES:
                modes |= _ci_columns(column, statistics.proportion_ci(g[column]) if column in g else {})
            gap = statistics.mean_ci(g["train_mode_acc"] - g["eval_mode_acc"]) if "train_mode_acc" in g else {}
            diff = (math.nan,) * 4
            if method != reference and len(ref):
                diff = statistics.welch(g["final_test_acc"], ref, level, ACCURACY_DIFFERENCE)
            trained = g["train_mode_acc"] if "train_mode_acc" in g else pd.Series(dtype=float)
            other = method != reference and len(ref) > 0 and trained.notna().any()
            train = statistics.welch(trained, ref, level, ACCURACY_DIFFERENCE) if other else (math.nan,) * 4
            rows.append({"batch_size": int(bs), "normalizer": method, "lr": float(runs["initial_lr"].iloc[0]),
                         "n": final["n"], "diverged": len(runs) - len(g),
                         "learned": int(run_tables.learned_in_a_mode(g, cfg).eq(True).sum()),
                         "final_acc": final["mean"], "final_low": final["ci_low"], "final_high": final["ci_high"],
                         "best_val_acc": best["mean"], "best_val_low": best["ci_low"], "best_val_high": best["ci_high"],
                         "diff_vs_reference": diff[0], "diff_low": diff[1], "diff_high": diff[2], "p_value": diff[3],
                         "diff_level": level, "compared": (int(bs), method) in family,
                         "mdd": mdd(g["final_test_acc"], ref, level) if method != reference else math.nan,
                         "reading": "reference" if method == reference else reading(diff[1], diff[2]),
                         "train_mode_diff": train[0], "train_mode_diff_low": train[1], "train_mode_diff_high": train[2],
                         "step_ms": float(g["step_ms"].median()),
                         "drift": drift["mean"], "drift_low": drift["ci_low"], "drift_high": drift["ci_high"],
                         **modes,
                         "mode_gap": gap.get("mean", math.nan), "mode_gap_low": gap.get("ci_low", math.nan),
                         "mode_gap_high": gap.get("ci_high", math.nan)})  # fmt: skip
    out = pd.DataFrame(rows, columns=[c for c in TABLE if c != "rank"])
    out = out.sort_values(["batch_size", "final_acc"], ascending=[True, False], kind="stable")
    out.insert(1, "rank", out.groupby("batch_size").cumcount() + 1)
    return out.reset_index(drop=True)


def _ci_columns(column: str, ci: dict) -> dict:
    """A mode's columns of the table: `<mode>_acc`, `<mode>_low`, `<mode>_high` of `column` = `<mode>_acc`."""
    mode = column.removesuffix("_acc")
    return {column: ci.get("mean", math.nan), f"{mode}_low": ci.get("ci_low", math.nan),
            f"{mode}_high": ci.get("ci_high", math.nan)}  # fmt: skip


def read_table(cfg: DictConfig) -> pd.DataFrame:
    """normalizers.csv; one written by an earlier version of `table` (other columns) is formed again
    from summary.csv, so that the figure and the report always show this version's numbers."""
    t = run_tables.read(cfg, "normalizers")
    return t if list(t.columns) == TABLE else table(cfg, run_tables.read(cfg, "summary"))
