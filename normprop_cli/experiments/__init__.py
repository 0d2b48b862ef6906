"""The experiments, one module each, registered with `@experiment` on its `analyse` (base.py): `stages(cfg)`
declares what it trains (engine.plan.Stage: the runs, with their observers, stage by stage), `analyse(cfg)`
writes CSVs and figures from the finished runs, `plot(cfg)` redraws the figures from the CSVs alone,
`headlines(cfg)` and `paragraphs(cfg)` give the report's numbers and findings. `normprop run` trains one
experiment's stages, then analyses; `reproduce-all` trains every experiment's stages round by round on one
executor (base.train_all), then analyses each.

Adding an experiment is one YAML, `conf/experiment/<name>.yaml` (with `experiment.name: <name>`),
plus one module that defines its parts and ends with::

    @experiment("<name>", plot=plot, headlines=headlines, stages=stages)
    def analyse(cfg): ...

imported below (or anywhere before the command runs: the registry is `EXPERIMENTS`).
"""

from __future__ import annotations

# Each module registers its experiment when it is imported, so the registry holds them in the order of these
# imports, which is `normprop reproduce-all`'s and the report's: the paper's, the no-training one first; then
# those beyond the paper (drift, activations' C8 of section 4.6, normalizers). One registered later follows.
# isort: off
from normprop_cli.experiments import theory  # noqa: F401
from normprop_cli.experiments import data_norm  # noqa: F401
from normprop_cli.experiments import covariate_shift  # noqa: F401
from normprop_cli.experiments import convergence  # noqa: F401
from normprop_cli.experiments import batch_size  # noqa: F401
from normprop_cli.experiments import table1  # noqa: F401
from normprop_cli.experiments import timing  # noqa: F401
from normprop_cli.experiments import drift  # noqa: F401
from normprop_cli.experiments import activations  # noqa: F401
from normprop_cli.experiments import normalizers  # noqa: F401

# isort: on
from normprop_cli.experiments.base import EXPERIMENTS, Experiment, experiment, first_round, reproduce, train_all

ORDER = tuple(EXPERIMENTS)  # the package's own, in the order above

__all__ = ["EXPERIMENTS", "ORDER", "Experiment", "experiment", "first_round", "reproduce", "train_all"]
