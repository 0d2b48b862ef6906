"""What an experiment is, and the registry `normprop run`, `plot`, `reproduce-all` and the report read.

An experiment is one module that declares what it trains and ends with its analysis, decorated::

    def stages(cfg: DictConfig):
        yield Stage(cfg, expand_grid(cfg), observers)

    @experiment("table1", plot=plot, headlines=headlines, stages=stages)
    def analyse(cfg: DictConfig) -> Path:
        ...

plus its YAML, `conf/experiment/<name>.yaml` (its protocol: `experiment.name`, `experiment.paper`
where the paper has it, which is the experiment's `section`, the grid, the epochs). `stages(cfg)` yields
the runs it trains, stage by stage (engine.plan.Stage: the runs and their observers), each stage sent back
its manifests once its runs are finished, so that a stage may follow from the results of the one before (a
learning-rate sweep, then the runs at the rates it chose); it trains nothing itself (engine.sweep does, for
every experiment asked for at once). `analyse(cfg)` writes the CSVs and figures into
`results/<name>/<dataset>/` from the finished runs (or, for an experiment that trains nothing, `trains=False`
and no stages, computes them into `results/<name>/`), `plot(cfg)` redraws the figures from the CSVs alone,
`headlines(cfg)` gives the report's rows (quantity, reproduced, paper) and `paragraphs(cfg)`, where given, its
findings in sentences. An experiment without `stages` that trains (timing, which trains in rounds of its own)
does so in its `analyse`.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

if TYPE_CHECKING:
    from normprop_cli.engine.executor import Executor
    from normprop_cli.engine.plan import Plan, Stage

    Stages = Generator[Stage, list, None]  # yields a stage; is sent its manifests once its runs are finished


def no_paragraphs(cfg: DictConfig) -> list[str]:
    return []


@dataclass(frozen=True)
class Experiment:
    name: str  # as `normprop run NAME` and conf/experiment/NAME.yaml name it
    analyse: Callable[[DictConfig], Path]  # writes CSVs and figures from the finished runs; returns the main CSV
    plot: Callable[[DictConfig], list[Path]]  # redraws the figures from the CSVs
    headlines: Callable[[DictConfig], list[dict]]  # the report's rows: quantity, reproduced, paper
    paragraphs: Callable[[DictConfig], list[str]] = no_paragraphs  # the report's findings
    trains: bool = True  # False: no runs, no data set; results in results/<name>/
    alone: bool = False  # True: it times its runs, so reproduce-all gives it the machine to itself
    stages: Callable[[DictConfig], Stages] | None = None  # what it trains, stage by stage (module docstring)

    def run(self, cfg: DictConfig) -> Path:
        """`normprop run`: train the stages (on the executor the config asks for), then analyse."""
        if self.stages is not None:
            from normprop_cli.engine.sweep import executor_of, train

            with contextlib.closing(executor_of(cfg)) as executor:
                train({self.name: self.stages(cfg)}, executor)
        return self.analyse(cfg)

    @property
    def section(self) -> str:
        """Where the paper has it (its YAML's `experiment.paper`: "Table 1, section 5.5"), or "beyond the paper"."""
        from normprop_cli import config

        return str(config.load(self.name).experiment.get("paper") or "")

    @property
    def datasets(self) -> tuple[str, ...]:
        """The data sets the paper reports it on (its YAML's published errors, else CIFAR-10); none
        where it trains nothing."""
        from normprop_cli.verdicts.sources import paper_datasets

        return paper_datasets(self.name) if self.trains else ()


# By name, in the order they register: experiments/__init__.py imports the package's own in reproduce-all's
# order (its ORDER), and any registered later follow them.
EXPERIMENTS: dict[str, Experiment] = {}


def experiment(
    name: str,
    *,
    plot: Callable[[DictConfig], list[Path]],
    headlines: Callable[[DictConfig], list[dict]],
    paragraphs: Callable[[DictConfig], list[str]] = no_paragraphs,
    trains: bool = True,
    alone: bool = False,
    stages: Callable[[DictConfig], Stages] | None = None,
) -> Callable[[Callable[[DictConfig], Path]], Callable[[DictConfig], Path]]:
    """Register the decorated `analyse` as the experiment `name`, with its other parts."""

    def register(analyse: Callable[[DictConfig], Path]) -> Callable[[DictConfig], Path]:
        EXPERIMENTS[name] = Experiment(name, saying_diverged(analyse) if trains else analyse, plot, headlines,
                                       paragraphs, trains, alone, stages)  # fmt: skip
        return analyse

    return register


def saying_diverged(analyse: Callable[[DictConfig], Path]) -> Callable[[DictConfig], Path]:
    """`analyse`, then a line naming the runs that diverged and their rates ('3 of 3 runs diverged (lr 1e9)'),
    where any did: `normprop run` and `reproduce-all` print it after the sweep, whatever the experiment."""

    @wraps(analyse)
    def wrapped(cfg: DictConfig) -> Path:
        from normprop_cli.engine.runs import sweep_dir
        from normprop_cli.verdicts import divergence

        out = analyse(cfg)
        gone = divergence(sweep_dir(cfg))
        if gone:
            print(f"{gone.text()}; {'no run is left to average' if gone.every else 'left out of every mean'}")
        return out

    return wrapped


def executor_for(cfgs: Sequence[DictConfig], workers: int | None = None) -> Executor:
    """One executor for the runs of every experiment of `cfgs` (engine.sweep.executor_of): where any of them trains in
    worker processes (`jobs` > 1), a pool of `workers` (the preset's `jobs`; an experiment's own `jobs` then
    sets only its runs' threads), else the one the first asks for."""
    from normprop_cli.engine.sweep import executor_of

    pooled = workers is not None and any(int(c.get("jobs") or 1) > 1 for c in cfgs)
    return executor_of(cfgs[0], workers=workers if pooled else None)


def reproduce(cfgs: Sequence[DictConfig], workers: int, step: Callable[[DictConfig, Callable], None]) -> None:
    """`reproduce-all`'s experiments: those that time their runs (`alone`) first, each trained and analysed with
    nothing else running; then the others' stages round by round on one executor (train_all); then each one's
    analysis, in the order of `cfgs` (an experiment without stages trains in its own). `step(cfg, part)` calls
    one experiment's `part` (its run, or its analyse) and says what it wrote."""
    for cfg in cfgs:
        if EXPERIMENTS[str(cfg.experiment.name)].alone:
            step(cfg, EXPERIMENTS[str(cfg.experiment.name)].run)
    rest = [c for c in cfgs if not EXPERIMENTS[str(c.experiment.name)].alone]
    staged = [c for c in rest if EXPERIMENTS[str(c.experiment.name)].stages is not None]
    if staged:
        print(f"== the runs of {', '.join(str(c.experiment.name) for c in staged)}", file=sys.stderr, flush=True)
        began = time.perf_counter()
        train_all(staged, workers)
        print(f"the runs of {len(staged)} experiment(s) took {time.perf_counter() - began:.0f} s", flush=True)
    for cfg in rest:
        step(cfg, EXPERIMENTS[str(cfg.experiment.name)].analyse)


def train_all(cfgs: Sequence[DictConfig], workers: int | None = None) -> None:
    """`reproduce-all`'s training: the stages of every experiment of `cfgs`, round by round, on one executor
    (engine.sweep.train: runs of one trajectory in several experiments train once)."""
    from normprop_cli.engine.sweep import train

    with contextlib.closing(executor_for(cfgs, workers)) as executor:
        train({str(c.experiment.name): EXPERIMENTS[str(c.experiment.name)].stages(c) for c in cfgs}, executor)


def first_round(cfgs: Sequence[DictConfig], workers: int | None = None) -> Plan:
    """The plan of the first round of `cfgs`' stages, as training them would make it (the later rounds follow
    from results: a learning-rate sweep's choice); nothing is trained or written."""
    from normprop_cli.engine import plan

    stages = []
    for cfg in cfgs:
        declared = EXPERIMENTS[str(cfg.experiment.name)].stages(cfg)
        stages += [stage for stage in [next(declared, None)] if stage is not None]
        declared.close()
    return plan.make(stages, executor_for(cfgs, workers).threads)
