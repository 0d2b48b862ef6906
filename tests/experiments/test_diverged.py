"""Divergence is a result, not a crash: every training experiment's `run`, `plot` and `report` on a grid
whose every run (or every run of a setting) diverged exit 0, name how many runs diverged at which rate,
draw "all runs diverged" in a figure with no finite curve, and give the claim the experiment feeds the
verdict "inconclusive: N of M runs diverged"."""

import pandas as pd
import pytest
from typer.testing import CliRunner

from normprop_cli.cli import app
from normprop_cli.verdicts import ALL_DIVERGED, Divergence, is_diverged_verdict
from normprop_cli.verdicts.divergence import rate

FAST = ("--preset", "smoke", "--seeds", "1", "--quiet", "train.epochs=1")
# The overrides that make an experiment's runs diverge. batch-size and normalizers choose their rate by a
# validation sweep and refuse train.lr: their sweep's rates diverge instead (every candidate, so the chosen).
DIVERGE = {
    "table1": ["train.lr=1e9"],
    "convergence": ["train.lr=1e9"],
    "data-norm": ["train.lr=1e9"],
    "covariate-shift": ["train.lr=1e9"],
    "activations": ["train.lr=1e9"],  # BatchNorm with tanh and sigmoid stays finite: "6 of 8 runs diverged"
    "timing": ["train.lr=1e9"],
    "drift": ["train.lr=1e9"],
    "batch-size": ["experiment.lr_sweep.factors=[1e9]"],
    "normalizers": ["experiment.lr=[1e9,1e9]"],
}
CLAIMS = {"data-norm": "C1", "covariate-shift": "C2", "convergence": "C3", "batch-size": "C4", "table1": "C5",
          "timing": "C6", "activations": "C8"}  # fmt: skip
# The figures whose every curve is gone: they say so in their axes.
EMPTY = {"table1": "table1", "convergence": "convergence", "data-norm": "data_norm", "batch-size": "batch_size",
         "timing": "timing", "normalizers": "normalizers"}  # fmt: skip


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
    """Every training experiment run into one results directory at a diverging rate, then the report:
    {"results": path, "runs": {experiment: CliRunner result}, "report": result}."""
    results = tmp_path_factory.mktemp("diverged") / "results"
    runs = {name: invoke("run", name, *FAST, *overrides, "--results-dir", results) for name, overrides in
            DIVERGE.items()}  # fmt: skip
    return {"results": results, "runs": runs, "report": invoke("report", "--results-dir", results)}


def ok(result) -> None:
    assert result.exit_code == 0 and result.exception is None, result.output
    assert "Traceback" not in result.output


def section(report: str, experiment: str) -> str:
    """The report's section of `experiment`, up to the next one."""
    return report.split(f"\n## {experiment}")[1].split("\n## ")[0]


@pytest.mark.parametrize("experiment", list(DIVERGE))
def test_a_diverged_grid_runs_plots_and_reports(diverged, experiment, drawn):
    results, run = diverged["results"], diverged["runs"][experiment]
    ok(run)
    assert "runs diverged (lr " in run.output  # e.g. '3 of 3 runs diverged (lr 1e9)'
    plotted = invoke("plot", experiment, "--preset", "smoke", "--results-dir", results)
    ok(plotted)
    if experiment in EMPTY:
        texts = [t.get_text() for ax in drawn[EMPTY[experiment]].axes for t in ax.texts]
        assert ALL_DIVERGED in texts
    ok(diverged["report"])
    report = (results / "REPORT.md").read_text()
    assert "runs diverged (lr " in section(report, experiment)
    assert "rerun" not in report
    if experiment in CLAIMS:
        verdicts = pd.read_csv(results / "verdicts.csv").set_index("claim")
        verdict = verdicts.loc[CLAIMS[experiment], "verdict"]
        assert is_diverged_verdict(verdict) and verdict.startswith("inconclusive: ")
        summary = pd.read_csv(results / experiment / "synthetic" / "summary.csv")
        gone = int((summary["status"] == "diverged").sum())
        assert verdict == f"inconclusive: {gone} of {len(summary)} runs diverged"  # the count that did
        assert f"| {verdict} |" in report  # the first table's cell


def test_a_grid_with_one_method_diverged_still_reports_the_other(tmp_path, drawn):
    """table1 at lr 30: every NormProp run diverges, BatchNorm's train; the figure and the report give
    BatchNorm's errors and name the diverged settings, and C5, which pairs the two, is inconclusive."""
    results = tmp_path / "results"
    run = invoke("run", "table1", *FAST, "train.lr=30", "--results-dir", results)
    ok(run)
    assert "2 of 4 runs diverged (lr 30): every run of normprop, normprop-augment" in run.output
    ok(invoke("plot", "table1", "--preset", "smoke", "--results-dir", results))
    assert ALL_DIVERGED not in [t.get_text() for t in drawn["table1"].axes[0].texts]  # BatchNorm's bars are there
    ok(invoke("report", "--results-dir", results))
    text = section((results / "REPORT.md").read_text(), "table1")
    assert "**Diverged**: 2 of 4 runs diverged (lr 30)" in text
    rows = [line for line in text.splitlines() if "(batchnorm, augmentation" in line]
    assert len(rows) == 2 and all("n = 1]" in r and "n/a" not in r for r in rows)
    verdicts = pd.read_csv(results / "verdicts.csv").set_index("claim")
    assert verdicts.loc["C5", "verdict"] == "inconclusive: 2 of 4 runs diverged"


def test_the_divergence_line_names_the_count_the_rates_and_the_settings_lost():
    assert rate(1e9) == "1e9" and rate(0.05) == "0.05" and rate(2.5e-5) == "2.5e-5"
    every = Divergence(3, 3, (1e9,), ("a", "b", "c"))
    assert every.text() == "3 of 3 runs diverged (lr 1e9)" and every.every
    assert every.verdict() == "inconclusive: 3 of 3 runs diverged" and is_diverged_verdict(every.verdict())
    some = Divergence(2, 6, (0.5, 2.0), ("b1",))
    assert some.text() == "2 of 6 runs diverged (lr 0.5, 2): every run of b1" and not some.every
    assert not Divergence(0, 4) and Divergence(0, 4).text() == ""
    assert not is_diverged_verdict("inconclusive")
