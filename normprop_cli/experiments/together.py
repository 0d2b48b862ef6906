"""`normprop reproduce-all`'s experiments at the same time, in one pool of worker processes
(engine.pool): where a preset trains its grids in worker processes (`jobs` > 1, no launcher), an
experiment that waits for its last runs, or for its rate sweep, leaves the workers to the others'
runs instead of to idleness, and the workers start once.

An experiment that times its runs (`Experiment.alone`: timing, C6) runs first, on its own, before the
pool starts: nothing else runs on the machine while it measures. Each other experiment runs in a thread;
the threads take turns at the parent's own work (engine.pool.TURN), so configs, choices, tables and
figures are made one experiment at a time, exactly as one after another. Every run trains as it would
in `normprop run EXPERIMENT`: the same config, seed and threads, so the same numbers.

Before the pool starts, the plan (engine.pool.Plan) names the runs of several experiments that train one
trajectory, from the grids the experiments will hand in: each such trajectory trains once, with the others
riding along, whichever experiment hands its run in first.

The first experiment that fails (a one-line error, a crashed run) stops the others: the pool's workers
are stopped, every run keeps its finished epochs, and the command exits as that experiment would have.
Ctrl-C does the same and lists the runs left unfinished.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence

from omegaconf import DictConfig, OmegaConf

from normprop_cli.engine import expand_grid, pool
from normprop_cli.engine.parallel import stop_unfinished, worker_threads
from normprop_cli.engine.runs import say
from normprop_cli.errors import UserError
from normprop_cli.experiments.base import EXPERIMENTS

Run = Callable[[DictConfig], None]  # runs one experiment's config, saying when it starts and ends


def shared(cfgs: Sequence[DictConfig]) -> bool:
    """Do these experiments train their grids in worker processes on this machine (then they share them)?"""
    training = [c for c in cfgs if EXPERIMENTS[c.experiment.name].trains]
    return any(int(c.jobs) > 1 for c in training) and all(
        OmegaConf.select(c, "launcher.name", default="none") == "none" for c in cfgs
    )


def plan(cfgs: Sequence[DictConfig]) -> pool.Plan:
    """Which of these experiments' runs train one trajectory (engine.pool.Plan), from the runs they will hand
    the pool that are known before anything trains: the grid (engine.expand_grid) of each experiment that
    trains in worker processes and has no learning-rate sweep (a sweep's choice sets its runs' rates)."""
    grids = {}
    for cfg in cfgs:
        name = str(cfg.experiment.name)
        if not EXPERIMENTS[name].trains or cfg.experiment.get("lr_sweep") is not None:
            continue
        if int(cfg.get("jobs") or 1) > 1:
            try:
                grids[name] = (expand_grid(cfg), worker_threads(int(cfg.jobs)))
            except UserError:  # the experiment's own run says so, as it would alone
                continue
    return pool.Plan.of(grids)


def run_all(cfgs: Sequence[DictConfig], run: Run, workers: int) -> None:
    """`run` every experiment's config of `cfgs`: those that must be alone one after another first, then the
    others at the same time in one pool of `workers` processes (the preset's `jobs`: an experiment's own
    `jobs` sets only its runs' threads, engine.pool)."""
    for cfg in cfgs:
        if EXPERIMENTS[cfg.experiment.name].alone:
            run(cfg)
    rest = [c for c in cfgs if not EXPERIMENTS[c.experiment.name].alone]
    if not rest:
        return
    # The last in the paper's order (normalizers, with the longest chain of rate-sweep rounds) hands in
    # its first runs first; those that train nothing (theory) take their turn after every grid is queued.
    rest = sorted(reversed(rest), key=lambda c: not EXPERIMENTS[c.experiment.name].trains)
    errors: list[BaseException] = []

    def body(cfg: DictConfig) -> None:
        try:
            with pool.TURN:
                run(cfg)
        except pool.Closed:
            pass
        except BaseException as exc:  # noqa: BLE001  (SystemExit of a run's worker too: the main thread raises it)
            errors.append(exc)
            shared_pool.close(f"{cfg.experiment.name} stopped")
        finally:
            shared_pool.ended(str(cfg.experiment.name))

    began = time.perf_counter()
    names = [str(c.experiment.name) for c in rest]
    with pool.opened(workers, str(rest[0].device), plan(rest), names) as shared_pool:
        threads = [threading.Thread(target=body, args=(c,), name=c.experiment.name, daemon=True) for c in rest]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.2)
        except KeyboardInterrupt:
            left = shared_pool.unfinished()
            shared_pool.close("interrupted")
            if left:
                stop_unfinished(left, "interrupted", 130)
            say("interrupted")
            sys.exit(130)
    if errors:
        raise errors[0]
    print(f"the {len(rest)} experiments together took {time.perf_counter() - began:.0f} s", flush=True)
