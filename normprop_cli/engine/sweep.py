"""Run an experiment's grid: validate, load the data once, train each run, skip what is done.

Where the runs train is the config's choice: here one after another (the default), in `jobs`
worker processes (engine.parallel), or as submitit jobs, `launcher: local | slurm` (engine.launch).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from omegaconf import DictConfig, OmegaConf

from normprop_cli import config
from normprop_cli import device as devices
from normprop_cli.engine import tally
from normprop_cli.engine.job import check_data, check_ready, finished, load_data, train_one, validate
from normprop_cli.engine.progress import QuietProgress, make_progress
from normprop_cli.engine.runs import RunSpec, check_same_config, read_manifest, run_dir, say
from normprop_cli.engine.trainer import Observer
from normprop_cli.errors import UserError


def run_sweep(
    cfg: DictConfig, specs: Sequence[RunSpec], observers: Callable[[RunSpec], Sequence[Observer]] = lambda spec: ()
) -> list[dict]:
    """Train every run of the grid; return their manifests.

    Complete and diverged runs are skipped, unfinished ones resume from their checkpoint, each under
    its own config (another one is refused before anything trains).
    Ctrl-C keeps every finished epoch and says how to resume. `jobs` > 1 trains the runs in
    that many worker processes; `launcher: local` runs them as submitit jobs and waits for them;
    `launcher: slurm` submits them as a SLURM job array and exits (engine.launch).
    """
    jobs, launcher = int(cfg.get("jobs") or 1), OmegaConf.select(cfg, "launcher.name", default="none")
    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}")
    config.check_choice("launcher", launcher)  # conf/launcher/ is the registry
    for spec in specs:
        validate(spec)
        # before anything trains: a changed setting is refused, never answered with an old run's numbers
        check_same_config(spec, run_dir(spec.cfg, spec.name), write=False)
    # The jobs of a SLURM array pick their device on their node; a login node may have no GPU.
    device = devices.resolve(cfg.device) if launcher != "slurm" else None
    todo = [s for s in specs if not finished(s)]
    pending = {s.name for s in todo}
    if len(todo) < len(specs):
        where = run_dir(specs[0].cfg, specs[0].name).parent
        done = len(specs) - len(todo)
        say(f"{done} of {len(specs)} runs already finished in {where}: reused, not retrained")
    if todo and (jobs > 1 or launcher != "none"):
        from normprop_cli.engine import launch, parallel, pool

        check_data(cfg, todo)
        shared = pool.active()  # reproduce-all's one pool for several experiments, whose lines interleave
        progress = QuietProgress(len(specs), cfg.experiment.name if shared else "")  # one line per finished run
        for spec in specs:
            if spec.name not in pending:
                progress.skip(spec, read_manifest(run_dir(spec.cfg, spec.name)))
        if launcher == "slurm":
            launch.submit_slurm(cfg, todo, observers)  # exits: the jobs run on the cluster
        elif launcher == "local":
            launch.run_local(cfg, todo, observers, progress)
        elif shared is not None:
            pool.run_shared(shared, cfg, todo, observers, progress)
        else:
            parallel.run_pool(cfg, todo, observers, progress)
        manifests = [read_manifest(run_dir(s.cfg, s.name)) for s in specs]
        tally.record(len(specs), len(todo), manifests)
        return manifests

    devices.prepare(device, bool(cfg.get("deterministic", False)))
    data = load_data(cfg, device) if todo else None
    if todo:
        check_ready(cfg, todo, data)
    manifests = []
    with make_progress(len(specs), bool(cfg.quiet)) as progress:
        for spec in specs:
            if spec.name not in pending:
                manifest = read_manifest(run_dir(spec.cfg, spec.name))
                progress.skip(spec, manifest)
                manifests.append(manifest)
                continue
            try:
                manifests.append(train_one(spec, data, device, progress, observers(spec)))
            except KeyboardInterrupt:
                done = (read_manifest(run_dir(spec.cfg, spec.name)) or {}).get("epochs_done", 0)
                say(f"interrupted: run {spec.name} kept {done} finished epoch(s); run the same command again to resume")
                sys.exit(130)
    tally.record(len(specs), len(todo), manifests)
    return manifests
