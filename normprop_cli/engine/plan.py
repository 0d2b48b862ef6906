"""The plan of one round of training: the runs that the experiments asked for at once (their `Stage`s), which
of them are finished (reused), and the trajectories left to train (`Task`), before anything trains.

Runs of several experiments with the same config, seed and threads but their own epochs and observers train
one trajectory (runs.trajectory): the plan makes them one task, whose run with the most epochs trains while
the others ride along it (trainer.train_run's riders), each observed by its own observers and written as its
own training would have written it. Which runs ride is decided here, from the runs every experiment of the
round asked for, never by when a run comes in; an executor (engine.executor) then trains the tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from normprop_cli.engine.cost import run_cost
from normprop_cli.engine.job import finished, validate
from normprop_cli.engine.runs import RunSpec, check_same_config, run_dir, trajectory
from normprop_cli.engine.trainer import Observer

Observers = Callable[[RunSpec], Sequence[Observer]]  # must pickle (cloudpickle): worker processes call it


def no_observers(spec: RunSpec) -> Sequence[Observer]:
    return ()


@dataclass
class Stage:
    """Runs an experiment asks for at once (its grid, or a round of its learning-rate sweep), each observed by
    `observers(spec)`; `cfg` is the experiment's config (its name, device, jobs, launcher and quiet)."""

    cfg: DictConfig
    specs: Sequence[RunSpec]
    observers: Observers = no_observers

    @property
    def experiment(self) -> str:
        return str(self.cfg.experiment.name)


@dataclass
class Member:
    """A run of a task: its spec, observers, stage (an index into the plan's stages), and the progress that
    says its line (set by the sweep that executes the plan)."""

    spec: RunSpec
    observers: Observers
    stage: int
    progress: Any = None


@dataclass
class Task:
    """One trajectory to train on `threads` CPU threads: the first member trains, the others ride along it."""

    members: list[Member]
    threads: int

    @property
    def leader(self) -> Member:
        return self.members[0]

    @property
    def specs(self) -> list[RunSpec]:
        return [m.spec for m in self.members]


@dataclass
class Plan:
    stages: list[Stage]
    tasks: list[Task] = field(default_factory=list)
    finished: list[list[RunSpec]] = field(default_factory=list)  # per stage: complete or diverged, reused

    @property
    def riders(self) -> int:
        return sum(len(t.members) - 1 for t in self.tasks)

    def line(self, title: str) -> str:
        """'plan of round 1: 12 run(s) to train as 8 trajectories (4 ride along); 470 finished: reused'."""
        runs, reused = sum(len(t.members) for t in self.tasks), sum(map(len, self.finished))
        along = f" as {len(self.tasks)} trajectories ({self.riders} ride along)" if self.riders else ""
        return f"plan of {title}: {runs} run(s) to train{along}; {reused} finished: reused"


def make(stages: Sequence[Stage], threads: Callable[[DictConfig], int]) -> Plan:
    """The plan of `stages`, whose runs train on `threads(stage.cfg)` CPU threads. Every run's settings are
    checked first (engine.job.validate), and a run directory that holds another config is refused, before
    anything trains. Runs of one trajectory become one task, the one with the most epochs first (the first
    asked for among equals); the tasks keep the order their first runs were asked for in."""
    for stage in stages:
        for spec in stage.specs:
            validate(spec)
            # a changed setting is refused, never answered with an old run's numbers
            check_same_config(spec, run_dir(spec.cfg, spec.name), write=False)
    plan = Plan(list(stages), finished=[[] for _ in stages])
    groups: dict[object, Task] = {}
    for i, stage in enumerate(stages):
        n = threads(stage.cfg)
        for spec in stage.specs:
            if finished(spec):
                plan.finished[i].append(spec)
                continue
            member = Member(spec, stage.observers, i)
            key = trajectory(spec, n)
            if key is not None and key in groups:
                groups[key].members.append(member)
                continue
            task = Task([member], n)
            plan.tasks.append(task)
            if key is not None:
                groups[key] = task
    for task in plan.tasks:
        task.members.sort(key=lambda m: -int(m.spec.cfg.train.epochs))  # stable: the first asked for leads
    return plan


def weight(spec: RunSpec) -> float:
    """A run's work in image-passes, for the order only: SGD steps cost about 8 images each beyond their images
    (a batch-1 step is bound by its operator calls), evaluation a third of a training image, and the NIN's work
    grows with the square of its width."""
    cost = run_cost(spec)
    if cost is None:
        return 0.0
    work = 8 * cost.steps + cost.train_images + cost.eval_images / 3 + cost.single_images
    return work * (max(float(spec.cfg.model.width), 0.25) / 0.25) ** 2


def costliest_first(tasks: Sequence[Task]) -> list[Task]:
    """The order in which workers take the tasks: a learning-rate sweep's runs (sweep-*) first, then the
    costliest, so that the last tasks to finish are short ones. The order changes no run's numbers."""
    return sorted(tasks, key=lambda t: (not t.leader.spec.name.startswith("sweep-"), -weight(t.leader.spec)))
