"""Fig. 4 (section 5.4): NormProp at batch sizes down to 1 (global data norm); BN at 1, labelled."""

import pandas as pd
import pytest

from normprop_cli import config
from normprop_cli.experiments import batch_size

# 2 seeds for an interval; 24 images keep the batch-1 runs (one step per image) to seconds.
ARGS = ["--preset", "smoke", "--quiet", "--seeds", "2", "dataset.limit=24"]


@pytest.fixture(scope="module")
def results(run_experiment):
    return run_experiment("batch-size", *ARGS)


def test_batch_size_1_trains_and_bn_at_batch_1_is_labelled(results):
    sweep = results / "batch-size" / "synthetic"
    summary = pd.read_csv(sweep / "summary.csv")
    assert {"batch_size", "initial_lr", "data_norm", "label", "final_test_acc"} <= set(summary.columns)
    assert (summary["data_norm"] == "global").all()
    assert 1 in set(summary.loc[summary["method"] == "normprop", "batch_size"])
    bn = summary[summary["method"] == "batchnorm"]
    assert set(bn["batch_size"]) == {1} and bn["label"].str.contains("BatchNorm, batch 1").all()
    assert bn["label"].str.contains("paper: BN not applicable").all()
    assert not summary.loc[summary["method"] == "normprop", "label"].str.contains("not applicable").any()
    assert (summary["status"] == "complete").all()
    # the larger batch trains at the larger learning rate (section 4.4)
    rates = summary[summary["method"] == "normprop"].groupby("batch_size")["initial_lr"].first()
    assert rates.is_monotonic_increasing


def test_curves_have_an_interval_per_batch_size_and_a_figure(results):
    sweep = results / "batch-size" / "synthetic"
    c = pd.read_csv(sweep / "curves.csv")
    assert {
        "setting",
        "method",
        "batch_size",
        "label",
        "epoch",
        "n",
        "mean",
        "ci_low",
        "ci_high",
    } <= set(c)
    assert (c["n"] == 2).all() and (c["ci_low"] <= c["ci_high"]).all()
    assert len(c.groupby(["method", "batch_size"])) == 3
    assert (sweep / "batch_size.png").exists() and (sweep / "batch_size.pdf").exists()


def test_the_paper_preset_includes_batch_1_and_rates_grow_with_the_batch():
    cfg = config.load("batch-size", preset="paper")
    normprop = sorted(
        (g.set["train.batch_size"], g.set["train.lr"]) for g in cfg.grid if g.set["model.norm"] == "normprop"
    )
    assert normprop[0][0] == 1 and len(normprop) >= 4
    assert [lr for _, lr in normprop] == sorted(lr for _, lr in normprop)
    assert cfg.train.data_norm == "global" and cfg.seeds >= 2


def test_plot_redraws_from_the_csvs_alone(assert_redraws, results):
    assert_redraws("batch-size", results)


def test_headlines_give_the_final_accuracy_of_each_batch_size(results):
    cfg = config.load("batch-size", preset="smoke", results_dir=str(results))
    rows = batch_size.headlines(cfg)
    finals = [r for r in rows if r["quantity"].startswith("final test accuracy")]
    assert len(finals) == 3 and any("batch 1," in r["quantity"] for r in finals)
