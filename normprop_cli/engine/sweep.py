"""Train what experiments ask for: their stages (engine.plan.Stage), round by round, each round planned once
(engine.plan) and trained by one executor (engine.executor), which the config chooses: here (the default),
`jobs` worker processes, or submitit jobs (`launcher: local | slurm`).

An experiment's stages are a generator (experiments.base.Experiment.stages): it yields a stage, is sent back
that stage's manifests once every run of it is finished, and may then yield the next, made from those results
(a learning-rate sweep, then the runs at the rates it chose). Several experiments (`normprop reproduce-all`)
advance together: each round takes the next stage of every experiment that has one, so that runs of one
trajectory in several experiments train once, and no executor waits on one experiment while another has
runs to train. Complete and diverged runs are reused, never trained again; unfinished ones resume.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf

from normprop_cli import config
from normprop_cli.engine import tally
from normprop_cli.engine.executor import Executor, InProcess, Workers
from normprop_cli.engine.plan import Observers, Stage, make, no_observers
from normprop_cli.engine.progress import make_progress
from normprop_cli.engine.runs import RunSpec, read_manifest, run_dir, say
from normprop_cli.errors import UserError

Stages = Generator[Stage, list, None]  # yields a stage; is sent its manifests once its runs are finished


def executor_of(cfg: DictConfig, workers: int | None = None) -> Executor:
    """The executor the config asks for: `launcher: local | slurm` through submitit (engine.launch), `jobs` > 1
    (or `workers`, where several experiments share one pool) worker processes, else this process."""
    jobs, launcher = int(workers or cfg.get("jobs") or 1), OmegaConf.select(cfg, "launcher.name", default="none")
    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}")
    config.check_choice("launcher", launcher)  # conf/launcher/ is the registry
    if launcher != "none":
        from normprop_cli.engine.launch import Submitit  # submitit, only where it is asked for

        return Submitit(cfg, jobs)
    if jobs > 1:
        return Workers(jobs, str(cfg.device), bool(cfg.get("deterministic", False)))
    return InProcess(cfg)


def execute(stages: Sequence[Stage], executor: Executor, named: str = "") -> list[list[dict | None]]:
    """Plan `stages` (engine.plan.make: every run checked before any trains), say what each reuses, train the
    rest on `executor`; each stage's manifests. `named` ('round 2'), where the lines of several experiments
    interleave: the plan's line is said, and each progress line names its experiment."""
    plan = make(stages, executor.threads)
    if named:
        say(plan.line(named))
    for stage, done in zip(stages, plan.finished, strict=True):
        if done:
            where = run_dir(stage.specs[0].cfg, stage.specs[0].name).parent
            say(f"{len(done)} of {len(stage.specs)} runs already finished in {where}: reused, not retrained")
    live = executor.live and len(stages) == 1 and not named  # a bar per run follows one stage's steps
    bars = [make_progress(len(s.specs), bool(s.cfg.get("quiet")) or not live, s.experiment if named else "")
            for s in stages]  # fmt: skip
    with contextlib.ExitStack() as shown:
        for bar in bars:
            shown.enter_context(bar)
        for bar, done in zip(bars, plan.finished, strict=True):
            for spec in done:
                bar.skip(spec, read_manifest(run_dir(spec.cfg, spec.name)))
        for task in plan.tasks:
            for member in task.members:
                member.progress = bars[member.stage]
        if plan.tasks:
            executor.submit(plan)
    manifests = [[read_manifest(run_dir(s.cfg, s.name)) for s in stage.specs] for stage in stages]
    for stage, done, got in zip(stages, plan.finished, manifests, strict=True):
        tally.record(len(stage.specs), len(stage.specs) - len(done), got)
    return manifests


def train(experiments: Mapping[str, Stages], executor: Executor) -> None:
    """Every experiment's stages, round by round (module docstring), on one executor."""
    live, sent, rounds = dict(experiments), dict.fromkeys(experiments), 0
    while live:
        stages = {}
        for name, stages_of in list(live.items()):
            try:
                stages[name] = stages_of.send(sent[name])
            except StopIteration:
                del live[name]
        if stages:
            rounds += 1
            named = f"round {rounds}" if len(experiments) > 1 else ""
            sent = dict(zip(stages, execute(list(stages.values()), executor, named), strict=True))


def run_sweep(cfg: DictConfig, specs: Sequence[RunSpec], observers: Observers = no_observers) -> list[dict]:
    """Train one stage, `specs` observed by `observers`, on the executor the config asks for; its manifests."""
    with contextlib.closing(executor_of(cfg)) as executor:
        return execute([Stage(cfg, specs, observers)], executor)[0]
