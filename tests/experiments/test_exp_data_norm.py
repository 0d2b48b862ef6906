"""Fig. 1 (section 5.1): NormProp with global vs batch data normalisation at two batch sizes."""

import pandas as pd
import pytest

from normprop_cli import config
from normprop_cli.experiments import data_norm


@pytest.fixture(scope="module")
def results(run_experiment):
    return run_experiment("data-norm", "--preset", "smoke", "--quiet")


def test_four_settings_each_with_a_test_accuracy_per_epoch(results):
    sweep = results / "data-norm" / "synthetic"
    c = pd.read_csv(sweep / "curves.csv")
    assert {
        "setting",
        "data_norm",
        "batch_size",
        "initial_lr",
        "epoch",
        "n",
        "mean",
        "ci_low",
        "ci_high",
    } <= set(c.columns)
    assert sorted(c["data_norm"].unique()) == ["batch", "global"]
    assert c.groupby("setting").size().to_dict() == {s: 2 for s in c["setting"].unique()}
    assert len(c["setting"].unique()) == 4 and c["mean"].between(0, 100).all()
    summary = pd.read_csv(sweep / "summary.csv")
    assert {"data_norm", "batch_size", "initial_lr", "best_test_acc", "best_test_epoch"} <= set(summary.columns)
    assert (summary["status"] == "complete").all()
    assert (sweep / "data_norm.png").exists()


def test_the_paper_protocol_is_batch_50_and_100_with_their_rates():
    cfg = config.load("data-norm", preset="paper")
    grid = {(g.set["train.data_norm"], g.set["train.batch_size"]): g.set["train.lr"] for g in cfg.grid}
    assert grid == {
        ("global", 50): 0.05,
        ("batch", 50): 0.05,
        ("global", 100): 0.08,
        ("batch", 100): 0.08,
    }
    assert cfg.train.lr_halve_every == 10 and cfg.experiment.paper_best_test_acc == 90.35


def test_plot_redraws_from_the_csvs_alone(assert_redraws, results):
    assert_redraws("data-norm", results)


def test_headlines_name_the_best_setting_beside_the_papers(results):
    rows = data_norm.headlines(config.load("data-norm", preset="smoke", results_dir=str(results)))
    assert rows[0]["quantity"].startswith("best test accuracy (%")
    assert "90.35" in rows[0]["paper"] and "batch 50" in rows[0]["paper"]
    assert "not comparable with synthetic" in rows[0]["paper"]  # CIFAR-10's number, labelled
    finals = [r for r in rows[1:] if not r["quantity"].startswith("runs that did not learn")]
    assert len(finals) == 4 and all("95% CI" in r["quantity"] for r in finals)
