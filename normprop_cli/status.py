"""`normprop status EXPERIMENT`: where a sweep stands, read from its run directories alone.

Every run of the grid with its state (missing, running, complete, diverged), its last epoch out
of its total, where it ran (host, device) and, for a SLURM submission, its job.
"""

from __future__ import annotations

from collections import Counter

from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from normprop_cli.engine import expand_grid, run_dir, sweep_dir
from normprop_cli.engine.runs import read_manifest, submitted

STATE_STYLES = {"missing": "dim", "running": "yellow", "complete": "green", "diverged": "red", "damaged": "red"}


def rows(cfg: DictConfig) -> list[dict]:
    """One row per run of the grid, in the grid's order."""
    jobs = submitted(cfg)
    out = []
    for spec in expand_grid(cfg):
        manifest = read_manifest(run_dir(spec.cfg, spec.name)) or {}
        out.append(
            {
                "run": spec.name,
                "state": manifest.get("status", "missing"),
                "epoch": manifest.get("epochs_done", 0),
                "epochs": manifest.get("epochs", int(spec.cfg.train.epochs)),
                "host": manifest.get("host", ""),
                "device": manifest.get("device", ""),
                "updated": manifest.get("updated", manifest.get("started", ""))[:16].replace("T", " "),
                "job": jobs.get(spec.name, ""),
            }
        )
    return out


def show(cfg: DictConfig, console: Console | None = None) -> list[dict]:
    """Print the sweep's runs as a table and a count per state; return the rows."""
    if console is None:
        console = Console()
        if not console.is_terminal:  # a log or a pipe: no need to squeeze the table into 80 columns
            console.width = max(console.width, 140)
    runs = rows(cfg)
    table = Table()
    columns = ["run", "state", "epoch", "host", "device", "updated"]
    columns += ["job"] if any(r["job"] for r in runs) else []
    for name in columns:
        table.add_column(name, no_wrap=True)
    for r in runs:
        cells = {
            **r,
            "state": f"[{STATE_STYLES.get(r['state'], 'default')}]{r['state']}",
            "epoch": f"{r['epoch']}/{r['epochs']}",
        }
        table.add_row(*(str(cells[name]) for name in columns))
    console.print(
        f"{cfg.experiment.name} on {cfg.dataset.name}, {cfg.preset.name} preset: {sweep_dir(cfg)}", highlight=False
    )
    console.print(table)
    counts = Counter(r["state"] for r in runs)
    states = [s for s in STATE_STYLES if counts[s]] + [s for s in counts if s not in STATE_STYLES]
    console.print(f"{len(runs)} run(s): " + ", ".join(f"{counts[s]} {s}" for s in states))
    return runs
