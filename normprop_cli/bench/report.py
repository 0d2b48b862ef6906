"""`normprop bench`'s tables on the terminal: the step medians, where a step goes (the CPU's
phases) and whole epochs, then the conditions they were timed in."""

from __future__ import annotations

import pandas as pd

from normprop_cli.engine.step import PHASES


def show(table: pd.DataFrame) -> None:
    """Print bench.csv's rows (and `attrs["epochs"]`, epochs.csv's) as rich tables."""
    from rich.console import Console

    console = Console(width=max(Console().width, 100))  # the methods' names in full
    first = table.iloc[0]
    t = _table(f"NIN training step, ms (median of the timed steps), {first['device']}, {first['options']}",
               "width", "batch", "precision", "method", "steps", "median ms", "p10-p90", "/ none [95% CI]",
               "/ BN [95% CI]", "conv GFLOP/s")  # fmt: skip
    for r in table.itertuples():
        t.add_row(f"{r.width:g}", str(r.batch_size), r.precision, r.method, str(r.steps),
                  f"{r.step_ms_median:.2f}", f"{r.step_ms_p10:.1f}-{r.step_ms_p90:.1f}",
                  ratio(r, "none"), ratio(r, "batchnorm"), f"{r.gflops:.1f}")  # fmt: skip
    console.print(t)
    phase_cols = [f"{p}_ms_median" for p in PHASES]
    if table[phase_cols].notna().all(axis=None):
        p = _table("Where a step goes: median ms of each phase", "width", "batch", "precision", "method", *PHASES)
        for r in table.itertuples():
            p.add_row(f"{r.width:g}", str(r.batch_size), r.precision, r.method,
                      *(f"{getattr(r, c):.2f}" for c in phase_cols))  # fmt: skip
        console.print(p)
    epochs = table.attrs.get("epochs")
    if epochs is not None and len(epochs):
        e = _table("Whole epochs (digits, quick preset): seconds and shares of the epoch",
                   "precision", "method", "epoch s", "steps s", "eval s", "outside", "data+books", "eval")  # fmt: skip
        for r in epochs.itertuples():
            e.add_row(r.precision, r.method, f"{r.epoch_s:.2f}", f"{r.steps_s:.2f}", f"{r.eval_s:.2f}",
                      f"{100 * r.outside_share:.1f}%", f"{100 * r.data_share:.1f}%",
                      f"{100 * r.eval_share:.1f}%")  # fmt: skip
        console.print(e)
    flushed = bool(table["flush_denormal"].all())
    console.print(f"flush-to-zero of denormal floats: {'on' if flushed else 'OFF'}; "
                  f"load average {table['load_average'].iloc[-1]:.2f}; "
                  f"threads {table['threads'].iloc[0]}")  # fmt: skip


def ratio(row, reference: str) -> str:
    """'0.912 [0.880, 0.947]': the median paired ratio to the reference and its 95% interval."""
    mid, low, high = (getattr(row, f"ratio_vs_{reference}{end}") for end in ("", "_low", "_high"))
    return f"{mid:.3f} [{low:.3f}, {high:.3f}]" if pd.notna(low) else f"{mid:.3f}"


def _table(title: str, *columns: str):
    """A compact rich table."""
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for col in columns:
        t.add_column(col, justify="right")
    return t
