"""summary.csv: one row per run, read back from each run's manifest and metrics.csv."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from normprop_cli import io
from normprop_cli.engine.runs import METRICS, RunSpec, run_dir, sweep_dir
from normprop_cli.errors import UserError


def metrics(spec: RunSpec) -> pd.DataFrame:
    path = run_dir(spec.cfg, spec.name) / METRICS
    return pd.read_csv(path) if path.exists() and path.stat().st_size > 1 else pd.DataFrame()


def run_row(spec: RunSpec, manifest: dict | None) -> dict:
    """The columns every experiment's summary shares; errors are in percent."""
    manifest = manifest or {"status": "missing"}
    m = metrics(spec)
    row = {
        "run": spec.name,
        "setting": spec.setting,
        "method": spec.cfg.model.norm,
        "seed": spec.seed,
        "status": manifest.get("status"),
        "epochs_done": manifest.get("epochs_done", 0),
        "device": manifest.get("device"),
    }
    if len(m):
        best = m.loc[m["val_acc"].idxmax()]
        row |= {
            "final_test_error": 100.0 - m["test_acc"].iloc[-1],
            "final_val_error": 100.0 - m["val_acc"].iloc[-1],
            "best_val_epoch": int(best["epoch"]),
            "best_val_test_error": 100.0 - best["test_acc"],
            "median_epoch_seconds": m["epoch_seconds"].median(),
            "learned": learned(m["test_acc"].iloc[-1], spec.cfg),
        }
    return row


LEARNED_MARGIN = 5.0  # SPEC §6.1: a run within 5 points of chance did not learn


def chance(cfg) -> float:
    """Chance accuracy (%) of the run's data set."""
    return 100.0 / int(cfg.dataset.get("num_classes") or 10)


def learned(final_test_acc: float, cfg) -> bool:
    """Did the run learn: a final test accuracy more than 5 points above chance (SPEC §6.1)? Runs that
    did not are labelled so and kept out of headlines; their numbers stay in the CSVs."""
    return bool(final_test_acc > chance(cfg) + LEARNED_MARGIN)


def learned_flags(summary: pd.DataFrame, absent: bool = True) -> pd.Series:
    """summary.csv's `learned` column read back: True, False, or NaN for a run without metrics;
    `absent` for every run when the summary has no such column. Compare with .eq(True) / .eq(False)."""
    if "learned" not in summary:
        return pd.Series(absent, index=summary.index, dtype=object)
    return summary["learned"].astype(str).str.lower().map({"true": True, "false": False, "1": True, "0": False})


def write_summary(cfg, rows: Sequence[dict]) -> Path:
    return io.write_csv(sweep_dir(cfg) / "summary.csv", pd.DataFrame(list(rows)))


def read_csv(path: Path, command: str) -> pd.DataFrame:
    """A CSV that a figure or the report needs; missing is a one-line error naming the command."""
    if not path.exists():
        raise UserError(f"{path} is missing; `{command}` produces it")
    return pd.read_csv(path)
