"""The experiments, one small runner each: `run(cfg)` trains and writes CSVs and figures,
`plot(cfg)` redraws the figures from the CSVs alone. Adding an experiment is one YAML in
conf/experiment/ plus one module here."""

from __future__ import annotations

import importlib
from types import ModuleType

# The order of `normprop reproduce-all`: the paper's order, the no-training one first.
RUNNERS = {
    "theory": "normprop_cli.experiments.theory",
    "data-norm": "normprop_cli.experiments.data_norm",
    "covariate-shift": "normprop_cli.experiments.covariate_shift",
    "convergence": "normprop_cli.experiments.convergence",
    "batch-size": "normprop_cli.experiments.batch_size",
    "table1": "normprop_cli.experiments.table1",
    "timing": "normprop_cli.experiments.timing",
    "drift": "normprop_cli.experiments.drift",  # beyond the paper
    "activations": "normprop_cli.experiments.activations",  # C8, section 4.6
    "normalizers": "normprop_cli.experiments.normalizers",  # beyond the paper
}


def runner(name: str) -> ModuleType:
    """The module with `run(cfg) -> Path`, `plot(cfg) -> list[Path]` and
    `headlines(cfg) -> list[dict]` (rows: quantity, reproduced, paper) for the report."""
    return importlib.import_module(RUNNERS[name])
