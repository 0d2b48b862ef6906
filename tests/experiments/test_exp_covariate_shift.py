"""Fig. 2 (section 5.2): the inputs of the hidden layers 2..9 over training, probed units and population."""

import shutil

import pandas as pd
import pytest

from normprop_cli import config
from normprop_cli.experiments import covariate_shift
from normprop_cli.experiments.covariate_shift import paper_metric, settling
from normprop_cli.experiments.probes import POPULATION_COLUMNS, UNIT_COLUMNS

UNIT = ["channel", "row", "col"]
METHODS = ["batchnorm", "none", "normprop"]


@pytest.fixture(scope="module")
def results(run_experiment):
    return run_experiment("covariate-shift", "--preset", "smoke", "--quiet")


@pytest.fixture(scope="module")
def sweep(results):
    return results / "covariate-shift" / "synthetic"


def test_settling_is_the_first_epoch_from_which_the_mean_stays_in_the_band():
    stats = pd.DataFrame(
        {"run": "r", "setting": "s", "method": "normprop", "seed": 0, "layer": 2, "draw": 0, "epoch": range(5),
         "mean": [1.0, 0.5, 0.32, 0.25, 0.3]}
    )  # fmt: skip
    row = settling(stats, band=0.1).iloc[0]
    assert row["settled_after_epoch"] == 2 and row["settled"] and row["final_mean"] == 0.3
    moving = stats.assign(mean=[0.0, 1.0, 2.0, 3.0, 4.0])
    row = settling(moving, band=0.1).iloc[0]
    assert row["settled_after_epoch"] == 4 and not row["settled"]


def test_paper_metric_is_the_average_over_layers_of_the_absolute_final_mean():
    rows = [
        {"run": "r", "setting": "s", "method": "normprop", "seed": 0, "initial_lr": 0.05, "layer": layer,
         "draw": draw, "epoch": epoch, "mean": (-1) ** layer * (layer + draw) * epoch}
        for layer in (2, 3) for draw in (0, 1) for epoch in (0, 1, 2)
    ]  # fmt: skip
    table = paper_metric(pd.DataFrame(rows)).set_index("draw")
    assert table.loc[0, "avg_abs_final_mean"] == (4 + 6) / 2  # |2 * 2|, |-3 * 2|
    assert table.loc[1, "avg_abs_final_mean"] == (6 + 8) / 2
    assert (table["layers"] == 2).all() and (table["final_epoch"] == 2).all()


def test_every_method_of_a_seed_probes_the_same_recorded_units_from_epoch_0(sweep):
    stats = pd.read_csv(sweep / "unit_stats.csv")
    assert list(stats.columns) == ["run", "setting", "method", "seed", "initial_lr", *UNIT_COLUMNS]
    assert sorted(stats["method"].unique()) == METHODS
    assert sorted(stats["layer"].unique()) == list(range(2, 10))
    assert sorted(stats["draw"].unique()) == list(range(8))  # probe_draws
    units = stats.groupby(["seed", "layer", "draw"])[UNIT].nunique()
    assert (units == 1).all().all()
    for _, g in stats.groupby(["run", "layer", "draw"]):
        assert sorted(g["epoch"]) == [0, 1, 2]
    layer9 = stats[stats["layer"] == 9]
    assert layer9["row"].between(2, 5).all() and layer9["col"].between(2, 5).all()  # never the bias-only border
    per_run = pd.read_csv(sweep / "runs" / "normprop-s0" / "unit_stats.csv")
    assert list(per_run.columns) == UNIT_COLUMNS


def test_population_rows_cover_every_layer_and_epoch_and_start_without_drift(sweep):
    population = pd.read_csv(sweep / "population.csv")
    assert list(population.columns) == ["run", "setting", "method", "seed", *POPULATION_COLUMNS]
    assert len(population) == 3 * 8 * 3  # methods x layers 2..9 x epochs 0..2
    assert (population.loc[population["epoch"] == 0, "avg_drift"] == 0.0).all()
    # the same architecture and width for every method: the same input-dependent units
    assert (population.groupby("layer")["units"].nunique() == 1).all()


def test_probes_summary_settling_and_figures(sweep):
    probes = pd.read_csv(sweep / "probes.csv")
    assert list(probes.columns) == covariate_shift.PROBES and len(probes) == 3 * 8  # runs x draws
    assert (probes["layers"] == 8).all() and (probes["final_epoch"] == 2).all()
    settled = pd.read_csv(sweep / "settling.csv")
    assert list(settled.columns) == covariate_shift.SETTLING
    assert (settled["band"] == 0.1).all() and len(settled) == 3 * 8 * 8  # runs x layers x draws
    summary = pd.read_csv(sweep / "summary.csv").set_index("setting")
    extra = ["initial_lr", "band", "probe_draws", "avg_abs_final_mean", "avg_abs_final_mean_sd",
             "final_population_abs_mean", "final_population_drift", "last_settled_after_epoch"]  # fmt: skip
    assert set(extra) <= set(summary.columns)
    assert summary["initial_lr"].to_dict() == {"normprop": 0.05, "batchnorm": 0.05, "none": 0.0001}
    by_run = probes.groupby("setting")["avg_abs_final_mean"]
    assert summary["avg_abs_final_mean"].to_dict() == pytest.approx(by_run.mean().to_dict())
    assert summary["avg_abs_final_mean_sd"].to_dict() == pytest.approx(by_run.std().to_dict())
    for stem in ("covariate_shift", "population"):
        assert (sweep / f"{stem}.png").exists()


def test_plot_redraws_from_the_csvs_alone(assert_redraws, results, sweep):
    (sweep / "population.png").unlink()
    assert_redraws("covariate-shift", results)
    assert (sweep / "population.png").exists()


def headlines(results) -> list[dict]:
    return covariate_shift.headlines(config.load("covariate-shift", preset="smoke", results_dir=str(results)))


def test_headlines_put_the_metrics_beside_the_papers_labelled_as_not_comparable(results, sweep, tmp_path):
    copy = tmp_path / "results"
    shutil.copytree(results, copy)
    summary = pd.read_csv(sweep / "summary.csv")
    summary.assign(learned=True).to_csv(copy / "covariate-shift" / "synthetic" / "summary.csv", index=False)
    rows = headlines(copy)
    paper = {
        label: r["paper"]
        for r in rows
        for label in ("NormProp", "BatchNorm")
        if "probed units" in r["quantity"] and f", {label} (" in r["quantity"]
    }
    published = config.load("covariate-shift").experiment.paper_avg_abs_final_mean
    assert paper["NormProp"] == f"{published.normprop} (cifar10; not comparable with synthetic)"
    assert paper["BatchNorm"] == f"{published.batchnorm} (cifar10; not comparable with synthetic)"
    assert any("+-0.1" in r["quantity"] for r in rows)
    assert sum("all units" in r["quantity"] for r in rows) == 2 * 3  # |mean| and drift per method


def test_a_method_that_did_not_learn_is_kept_out_of_the_headlines(results, sweep, tmp_path):
    copy = tmp_path / "results"
    shutil.copytree(results, copy)
    summary = pd.read_csv(sweep / "summary.csv")
    learned = summary.assign(learned=summary["method"] != "none")
    learned.to_csv(copy / "covariate-shift" / "synthetic" / "summary.csv", index=False)
    rows = [r for r in headlines(copy) if "no normalisation" in r["quantity"]]
    assert len(rows) == 1 and "did not learn" in rows[0]["quantity"]
    accuracy = 100.0 - summary.loc[summary["method"] == "none", "final_test_error"].mean()
    assert rows[0]["reproduced"] == f"final test accuracy {accuracy:.1f}% (chance is 10%)"


def test_a_resumed_run_probes_exactly_as_an_uninterrupted_one(cli, tmp_path, interrupt_at):
    args = ["run", "covariate-shift", "--preset", "smoke", "--quiet", "train.epochs=3",
            "grid=[{id: r, set: {model.norm: batchnorm, train.lr: 0.05}}]"]  # fmt: skip
    assert cli(*args, "--results-dir", tmp_path / "a").exit_code == 0
    # Ctrl-C in the second epoch
    assert interrupt_at(5, lambda: cli(*args, "--results-dir", tmp_path / "b")).exit_code == 130
    assert cli(*args, "--results-dir", tmp_path / "b").exit_code == 0
    for name in ("unit_stats.csv", "population.csv"):
        a, b = (tmp_path / d / "covariate-shift" / "synthetic" / "runs" / "r-s0" / name for d in "ab")
        assert a.read_bytes() == b.read_bytes(), name
    manifest = (tmp_path / "b" / "covariate-shift" / "synthetic" / "runs" / "r-s0" / "manifest.json").read_text()
    assert '"resumed_from_epoch": 1' in manifest


def test_runs_of_an_older_probe_are_refused_not_mixed_in(cli, results, tmp_path):
    copy = tmp_path / "results"
    shutil.copytree(results, copy)
    old = copy / "covariate-shift" / "synthetic" / "runs" / "none-s0" / "unit_stats.csv"
    pd.read_csv(old).drop(columns="draw").to_csv(old, index=False)
    result = cli("run", "covariate-shift", "--preset", "smoke", "--quiet", "--results-dir", copy)
    assert result.exit_code == 2 and "none-s0" in result.output and "older version" in result.output


def right_labels(fig) -> list[str]:
    """The y labels of the figure's right axes (the unnormalised net's twins)."""
    return [ax.get_ylabel() for ax in fig.axes if ax.yaxis.get_label_position() == "right" and ax.get_ylabel()]


def test_figures_label_the_right_axes_and_the_reference_line(results, drawn, legend_texts):
    covariate_shift.plot(config.load("covariate-shift", preset="smoke", results_dir=str(results)))
    units, population = drawn["covariate_shift"], drawn["population"]
    # one label per row of panels, on its last right axis: what the unnormalised net's axis shows
    assert right_labels(units) == [f"{covariate_shift.RIGHT}\nmean (standard units)"] * 2
    assert right_labels(population) == [f"{covariate_shift.RIGHT}\naverage |mean| (standard units)"]
    # the target mean 0 is a thin black dotted line in every panel, named in the legend; the thin lines too
    texts = legend_texts(units)
    assert covariate_shift.TARGET in texts and any(t.startswith("one probed unit (thin") for t in texts)
    for ax in [a for a in units.axes if a.get_title().startswith("layer")]:
        zero = [line for line in ax.get_lines() if list(line.get_ydata()) == [0.0, 0.0]]
        assert len(zero) == 1 and zero[0].get_color() == "k" and zero[0].get_linewidth() < 1.0
    assert "(standard units)" in population.axes[0].get_ylabel() and "(initial stds)" in population.axes[8].get_ylabel()
