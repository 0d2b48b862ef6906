"""Section 5.6: seconds per training epoch after a warm-up epoch, and the ratios between methods.
No assertion on the times themselves: only on how they are read and related."""

import pandas as pd
import pytest

from normprop_cli import config
from normprop_cli.experiments import timing


@pytest.fixture(scope="module")
def results(run_experiment):
    return run_experiment("timing", "--preset", "smoke", "--quiet", "train.epochs=3")


def test_timing_is_the_median_after_the_warm_up_with_ratios(results):
    sweep = results / "timing" / "synthetic"
    table = pd.read_csv(sweep / "timing.csv").set_index("method")
    assert {
        "device",
        "epochs_timed",
        "median_epoch_seconds",
        "images_per_second",
        "ratio_vs_batchnorm",
        "ratio_vs_none",
        "pooled_ratio_vs_batchnorm",
        "paper_seconds",
    } <= set(table.columns)
    assert list(table.index) == ["normprop", "batchnorm", "none"]
    assert table["device"].str.startswith("cpu (").all() and (table["epochs_timed"] == 2).all()
    epochs = pd.read_csv(sweep / "epochs.csv")
    for method, row in table.iterrows():
        later = epochs[(epochs["method"] == method) & (epochs["epoch"] >= 2)]
        assert row["median_epoch_seconds"] == pytest.approx(later["train_seconds"].median())
    assert table.loc["batchnorm", "ratio_vs_batchnorm"] == pytest.approx(1.0)
    assert table.loc["none", "ratio_vs_none"] == pytest.approx(1.0)
    # the verdict's ratio: the geometric mean over seeds of each seed's ratio of median epoch seconds
    runs = pd.read_csv(sweep / "summary.csv")
    seconds = runs.pivot_table(index="seed", columns="method", values="median_train_seconds")
    paired = (seconds["normprop"] / seconds["batchnorm"]).prod() ** (1 / len(seconds))
    assert table.loc["normprop", "ratio_vs_batchnorm"] == pytest.approx(paired)
    assert table.loc["normprop", "pooled_ratio_vs_batchnorm"] == pytest.approx(
        table.loc["normprop", "median_epoch_seconds"] / table.loc["batchnorm", "median_epoch_seconds"]
    )
    assert table.loc["normprop", "paper_seconds"] == 84 and table.loc["batchnorm", "paper_seconds"] == 96
    assert (sweep / "timing.png").exists() and (sweep / "timing.pdf").exists()


def test_one_epoch_is_timed_when_there_is_no_other():
    epochs = pd.DataFrame({"epoch": [1], "train_seconds": [2.0]})
    assert len(timing.timed(epochs, warmup=1)) == 1


def test_plot_redraws_from_the_csvs_alone(assert_redraws, results):
    assert_redraws("timing", results)


def test_headlines_put_the_ratio_beside_the_papers(results):
    cfg = config.load("timing", preset="smoke", results_dir=str(results))
    rows = timing.headlines(cfg)
    ratio = [r for r in rows if r["quantity"].startswith("epoch time ratio NormProp / BatchNorm: geometric mean")]
    # a CPU's seconds on synthetic data are not the paper's GPU seconds on CIFAR-10
    seconds, where = cfg.experiment.paper_seconds, f"{cfg.experiment.paper_device}, CIFAR-10"
    assert cfg.experiment.paper_device == "GTX Titan X"
    assert len(ratio) == 1 and ratio[0]["paper"].startswith(f"{seconds.normprop / seconds.batchnorm:.3f} ({where}; not")
    assert any(r["paper"].startswith(f"{seconds.normprop} ({where}") for r in rows)
    assert sum(r["quantity"].startswith("ratio of the pooled medians") for r in rows) == 1
    assert "geometric mean of those ratios" in timing.paragraphs(cfg)[0]
