"""Fig. 4 (section 5.4): NormProp at batch sizes down to 1 (global data norm); BN at 1, labelled."""

import shutil

import pandas as pd
import pytest
from omegaconf import DictConfig

from normprop_cli import config
from normprop_cli.experiments import batch_size, tables
from normprop_cli.experiments.lr_sweep import SWEEP

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


def test_each_batch_size_trains_at_the_rate_its_validation_sweep_chose(results):
    """The learning rate of each batch size comes from a small sweep on the validation
    split, recorded; the winner has the best final validation accuracy of its setting."""
    sweep = results / "batch-size" / "synthetic"
    lr_sweep = pd.read_csv(sweep / "lr_sweep.csv")
    assert list(lr_sweep.columns) == SWEEP
    summary = pd.read_csv(sweep / "summary.csv")
    for setting, g in lr_sweep.groupby("setting"):
        assert len(g) == 2 and g["chosen"].sum() == 1  # the smoke preset's factors: 1 and 2
        winner = g[g["chosen"]].iloc[0]
        assert winner["val_acc"] == g["val_acc"].max()
        assert (summary.loc[summary["setting"] == setting, "initial_lr"] == winner["lr"]).all()
        base = config.load("batch-size", preset="smoke").grid
        centre = next(e.set["train.lr"] for e in base if e.id == setting)
        assert sorted(g["lr"]) == pytest.approx([centre, 2 * centre])


def test_every_batch_size_sees_the_full_split_and_updates_are_counted(results):
    """No batch size trains on a subset; updates = epochs x (train size // batch size),
    one per image at batch 1."""
    sweep = results / "batch-size" / "synthetic"
    epochs = pd.read_csv(sweep / "epochs.csv")
    train = 24  # dataset.limit=24 of the test's ARGS, the same for every run
    for (bs, epoch), g in epochs.groupby(["batch_size", "epoch"]):
        assert (g["updates"] == epoch * (train // bs if bs > 1 else train)).all()
    curve = pd.read_csv(sweep / "curves.csv")
    assert "updates" in curve and (curve.groupby("setting")["updates"].diff().dropna() > 0).all()
    assert config.load("batch-size").dataset.limit is None  # the quick preset: the full split


def test_curves_have_an_interval_per_batch_size_and_a_figure(results):
    sweep = results / "batch-size" / "synthetic"
    c = pd.read_csv(sweep / "curves.csv")
    assert {
        "setting",
        "method",
        "batch_size",
        "label",
        "epoch",
        "updates",
        "n",
        "mean",
        "ci_low",
        "ci_high",
    } <= set(c)
    assert (c["n"] == 2).all() and (c["ci_low"] <= c["ci_high"]).all()
    assert len(c.groupby(["method", "batch_size"])) == 3
    assert (sweep / "batch_size.png").exists()


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


def with_flags(results, tmp_path, train_acc: float) -> DictConfig:
    """A copy of the sweep where BatchNorm at batch 1 did not learn (summary.csv's `learned`) and every
    other setting did, with BN's last-epoch training accuracy (training mode) set to `train_acc`."""
    copy = tmp_path / "results"
    shutil.copytree(results, copy)
    sweep = copy / "batch-size" / "synthetic"
    summary = pd.read_csv(sweep / "summary.csv")
    summary.assign(learned=summary["method"] != "batchnorm").to_csv(sweep / "summary.csv", index=False)
    epochs = pd.read_csv(sweep / "epochs.csv")
    epochs.loc[epochs["method"] == "batchnorm", "train_acc"] = train_acc
    epochs.to_csv(sweep / "epochs.csv", index=False)
    return config.load("batch-size", preset="smoke", results_dir=str(copy))


def notes(fig) -> list[str]:
    """The figure's texts but its title: the notes below the panels."""
    return [t.get_text() for t in fig.texts if t.get_text() != fig.get_suptitle()]


def test_figure_names_its_seeds_and_interval(results, drawn):
    batch_size.plot(config.load("batch-size", preset="smoke", results_dir=str(results)))
    fig = drawn["batch_size"]
    assert "mean of 2 seeds" in fig.get_suptitle() and "95% interval of the mean" in fig.get_suptitle()
    assert [ax.get_ylabel() for ax in fig.axes] == ["test accuracy (%)"] * 2
    assert fig.axes[0].get_xlabel() == "epoch" and "SGD updates" in fig.axes[1].get_xlabel()


def test_a_setting_at_chance_gets_a_chance_line_and_a_note_on_its_modes(results, tmp_path, drawn, legend_texts):
    cfg = with_flags(results, tmp_path, train_acc=97.0)
    batch_size.plot(cfg)
    fig = drawn["batch_size"]
    assert f"chance ({tables.chance(cfg):g}%)" in legend_texts(fig)
    (note,) = notes(fig)
    assert note.startswith("BatchNorm, batch 1") and "did not learn in evaluation mode" in note
    assert "learns in training mode (training accuracy 97.0%" in note and "fails in evaluation mode" in note
    (note,) = batch_size.not_learned_notes(with_flags(results, tmp_path / "low", train_acc=9.0))
    assert "nor in training mode (training accuracy 9.0%" in note and "learns in" not in note


def test_no_note_where_every_setting_learned(results, tmp_path, drawn):
    cfg = with_flags(results, tmp_path, train_acc=97.0)
    sweep = tmp_path / "results" / "batch-size" / "synthetic"
    pd.read_csv(sweep / "summary.csv").assign(learned=True).to_csv(sweep / "summary.csv", index=False)
    assert batch_size.not_learned_notes(cfg) == []
    batch_size.plot(cfg)
    assert notes(drawn["batch_size"]) == []
