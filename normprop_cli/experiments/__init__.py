"""The experiments, one module each, registered with `@experiment` on its `run` (base.py): `run(cfg)`
trains and writes CSVs and figures, `plot(cfg)` redraws the figures from the CSVs alone,
`headlines(cfg)` and `paragraphs(cfg)` give the report's numbers and findings.

Adding an experiment is one YAML, `conf/experiment/<name>.yaml` (with `experiment.name: <name>`),
plus one module that defines its parts and ends with::

    @experiment("<name>", plot=plot, headlines=headlines)
    def run(cfg): ...

imported below (or anywhere before the command runs: the registry is `EXPERIMENTS`).
"""

from __future__ import annotations

from normprop_cli.experiments import (  # noqa: F401  (each registers itself)
    activations,
    batch_size,
    convergence,
    covariate_shift,
    data_norm,
    drift,
    normalizers,
    table1,
    theory,
    timing,
)
from normprop_cli.experiments.base import EXPERIMENTS, Experiment, experiment

# The order of `normprop reproduce-all` and of the report: the paper's, the no-training one first;
# then those beyond the paper (drift, activations' C8 of section 4.6, normalizers); any other in the
# order it registered.
ORDER = ("theory", "data-norm", "covariate-shift", "convergence", "batch-size", "table1", "timing", "drift",
         "activations", "normalizers")  # fmt: skip
_ordered = sorted(EXPERIMENTS.items(), key=lambda item: ORDER.index(item[0]) if item[0] in ORDER else len(ORDER))
EXPERIMENTS.clear()
EXPERIMENTS.update(_ordered)

__all__ = ["EXPERIMENTS", "ORDER", "Experiment", "experiment"]
