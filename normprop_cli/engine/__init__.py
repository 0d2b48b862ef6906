"""The training engine: a grid of runs, each resumable, crash-safe and recorded."""

from normprop_cli.engine.runs import RunSpec, expand_grid, run_dir, sweep_dir
from normprop_cli.engine.sweep import run_sweep

__all__ = ["RunSpec", "expand_grid", "run_dir", "run_sweep", "sweep_dir"]
