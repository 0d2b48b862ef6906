"""The training engine: the runs experiments ask for, planned, trained (each resumable, crash-safe and
recorded) and read back."""

from normprop_cli.engine.plan import Stage
from normprop_cli.engine.runs import RunSpec, expand_grid, read_manifest, run_dir, sweep_dir
from normprop_cli.engine.sweep import run_sweep


def manifests(specs) -> list[dict | None]:
    """Each run's manifest on disk (None where it has none), in the order of `specs`."""
    return [read_manifest(run_dir(spec.cfg, spec.name)) for spec in specs]


__all__ = ["RunSpec", "Stage", "expand_grid", "manifests", "run_dir", "run_sweep", "sweep_dir"]
