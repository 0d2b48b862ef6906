"""The registry's order is reproduce-all's and the report's: the package's own experiments in the paper's order,
as experiments/__init__.py imports them, and nothing reorders it afterwards."""

from normprop_cli.experiments import EXPERIMENTS, ORDER

PAPER = ("theory", "data-norm", "covariate-shift", "convergence", "batch-size", "table1", "timing", "drift",
         "activations", "normalizers")  # fmt: skip


def test_the_package_experiments_register_in_the_papers_order():
    assert ORDER == PAPER
    assert tuple(EXPERIMENTS)[: len(ORDER)] == ORDER
