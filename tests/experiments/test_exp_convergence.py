"""Fig. 3 (section 5.3): NormProp vs BN over seeds, the mean and its 95% interval per epoch."""

import pandas as pd
import pytest

from normprop_cli import config
from normprop_cli.experiments import convergence
from normprop_cli.statistics import proportion_ci

SMOKE = ["--preset", "smoke", "--quiet"]


@pytest.fixture(scope="module")
def results(run_experiment):
    return run_experiment("convergence", *SMOKE, "--seeds", "2")


def test_curves_hold_mean_and_interval_over_the_seeds(results):
    sweep = results / "convergence" / "synthetic"
    c = pd.read_csv(sweep / "curves.csv")
    assert list(c.columns) == ["method", "epoch", "n", "diverged", "mean", "sd", "ci_low", "ci_high"]
    assert sorted(c["method"].unique()) == ["batchnorm", "normprop"]
    assert (c["n"] == 2).all() and list(c["epoch"].unique()) == [1, 2]
    epochs = pd.read_csv(sweep / "epochs.csv")
    for _, row in c.iterrows():
        values = epochs[(epochs["method"] == row["method"]) & (epochs["epoch"] == row["epoch"])]["test_acc"]
        expected = proportion_ci(values)
        assert row["mean"] == pytest.approx(expected["mean"])
        assert row["ci_low"] == pytest.approx(expected["ci_low"])
        assert row["ci_high"] == pytest.approx(expected["ci_high"])
        assert 0.0 <= row["ci_low"] <= row["mean"] <= row["ci_high"] <= 100.0
    summary = pd.read_csv(sweep / "summary.csv")
    assert len(summary) == 4 and {"final_test_acc", "best_test_acc", "seed"} <= set(summary.columns)
    assert (sweep / "convergence.png").exists()


def test_plot_redraws_from_the_csvs_alone(assert_redraws, results):
    assert_redraws("convergence", results)


def test_headlines_give_final_accuracy_with_interval_per_method(results):
    rows = convergence.headlines(config.load("convergence", preset="smoke", results_dir=str(results)))
    assert {"quantity", "reproduced", "paper"} <= set(rows[0])
    finals = [r for r in rows if r["quantity"].startswith("final test accuracy")]
    assert len(finals) == 2 and all("[" in r["reproduced"] for r in finals)
