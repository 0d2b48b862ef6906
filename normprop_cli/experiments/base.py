"""What an experiment is, and the registry `normprop run`, `plot`, `reproduce-all` and the report read.

An experiment is one module that ends with its `run`, decorated::

    @experiment("table1", plot=plot, headlines=headlines)
    def run(cfg: DictConfig) -> Path:
        ...

plus its YAML, `conf/experiment/<name>.yaml` (its protocol: `experiment.name`, `experiment.paper`
where the paper has it, which is the experiment's `section`, the grid, the epochs). `run(cfg)`
trains and writes the CSVs and figures into `results/<name>/<dataset>/` (or `results/<name>/` for an
experiment that trains nothing, `trains=False`), `plot(cfg)` redraws the figures from the CSVs
alone, `headlines(cfg)` gives the report's rows (quantity, reproduced, paper) and `paragraphs(cfg)`,
where given, its findings in sentences.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from pathlib import Path

from omegaconf import DictConfig


def no_paragraphs(cfg: DictConfig) -> list[str]:
    return []


@dataclass(frozen=True)
class Experiment:
    name: str  # as `normprop run NAME` and conf/experiment/NAME.yaml name it
    run: Callable[[DictConfig], Path]  # trains, writes CSVs and figures; returns the main CSV
    plot: Callable[[DictConfig], list[Path]]  # redraws the figures from the CSVs
    headlines: Callable[[DictConfig], list[dict]]  # the report's rows: quantity, reproduced, paper
    paragraphs: Callable[[DictConfig], list[str]] = no_paragraphs  # the report's findings
    trains: bool = True  # False: no runs, no data set; results in results/<name>/
    alone: bool = False  # True: it times its runs, so reproduce-all gives it the machine to itself

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
) -> Callable[[Callable[[DictConfig], Path]], Callable[[DictConfig], Path]]:
    """Register the decorated `run` as the experiment `name`, with its other parts."""

    def register(run: Callable[[DictConfig], Path]) -> Callable[[DictConfig], Path]:
        EXPERIMENTS[name] = Experiment(name, saying_diverged(run) if trains else run, plot, headlines, paragraphs,
                                       trains, alone)  # fmt: skip
        return run

    return register


def saying_diverged(run: Callable[[DictConfig], Path]) -> Callable[[DictConfig], Path]:
    """`run`, then a line naming the runs that diverged and their rates ('3 of 3 runs diverged (lr 1e9)'),
    where any did: `normprop run` and `reproduce-all` print it after the sweep, whatever the experiment."""

    @wraps(run)
    def wrapped(cfg: DictConfig) -> Path:
        from normprop_cli.engine.runs import sweep_dir
        from normprop_cli.verdicts import divergence

        out = run(cfg)
        gone = divergence(sweep_dir(cfg))
        if gone:
            print(f"{gone.text()}; {'no run is left to average' if gone.every else 'left out of every mean'}")
        return out

    return wrapped
