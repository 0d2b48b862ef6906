"""Fig. 2 (section 5.2): the input of one fixed unit per hidden layer 2..9, over training."""

import pandas as pd
import pytest
import torch

from normprop_cli import config
from normprop_cli.experiments import covariate_shift
from normprop_cli.experiments.covariate_shift import UnitProbe, settling
from normprop_cli.nn import NIN

UNIT = ["channel", "row", "col"]


@pytest.fixture(scope="module")
def results(run_experiment):
    return run_experiment("covariate-shift", "--preset", "smoke", "--quiet")


def layer_inputs(model: NIN, x: torch.Tensor) -> dict[int, torch.Tensor]:
    """The input of each conv layer (1-based), by walking the network by hand."""
    convs = {id(m): k for k, m in enumerate(model.hidden_layers(), start=1)}
    inputs = {}
    for module in model.features:
        if id(module) in convs:
            inputs[convs[id(module)]] = x
        x = module(x)
    return inputs


@pytest.mark.parametrize("norm", ["normprop", "batchnorm"])
def test_probe_measures_mean_and_std_of_the_layer_input_and_leaves_the_model_alone(norm):
    torch.manual_seed(0)
    model = NIN(norm=norm, width=0.0625)
    x = torch.randn(24, 3, 32, 32)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rows = UnitProbe(seed=3).observe(model, lambda: iter([(x[:10], None), (x[10:], None)]), epoch=0)
    assert [r["layer"] for r in rows] == list(range(2, 10))
    assert model.training  # restored after the probe's evaluation pass
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())  # BN statistics untouched
    model.eval()
    with torch.no_grad():
        inputs = layer_inputs(model, x)
    for r in rows:
        v = inputs[r["layer"]][:, r["channel"], r["row"], r["col"]].double()
        assert r["n"] == 24 and r["epoch"] == 0
        assert r["mean"] == pytest.approx(v.mean().item(), abs=1e-6)
        assert r["std"] == pytest.approx(v.std(unbiased=False).item(), abs=1e-6)


def test_units_come_from_the_seed_alone():
    shape = torch.Size([12, 16, 16])
    assert UnitProbe(5).unit(3, shape) == UnitProbe(5).unit(3, shape)
    assert len({UnitProbe(s).unit(3, shape) for s in range(10)}) > 1


def test_settling_is_the_first_epoch_from_which_the_mean_stays_in_the_band():
    stats = pd.DataFrame(
        {
            "run": "r",
            "setting": "s",
            "method": "normprop",
            "seed": 0,
            "layer": 2,
            "epoch": range(5),
            "mean": [1.0, 0.5, 0.32, 0.25, 0.3],
        }
    )
    row = settling(stats, band=0.1).iloc[0]
    assert row["settled_after_epoch"] == 2 and row["settled"] and row["final_mean"] == 0.3
    moving = stats.assign(mean=[0.0, 1.0, 2.0, 3.0, 4.0])
    row = settling(moving, band=0.1).iloc[0]
    assert row["settled_after_epoch"] == 4 and not row["settled"]


def test_every_method_of_a_seed_probes_the_same_recorded_units_from_epoch_0(results):
    sweep = results / "covariate-shift" / "synthetic"
    stats = pd.read_csv(sweep / "unit_stats.csv")
    assert {"method", "seed", "layer", *UNIT, "epoch", "mean", "std"} <= set(stats.columns)
    assert sorted(stats["method"].unique()) == ["batchnorm", "none", "normprop"]
    assert sorted(stats["layer"].unique()) == list(range(2, 10))
    units = stats.groupby(["seed", "layer"])[UNIT].nunique()
    assert (units == 1).all().all()
    for (_, _), g in stats.groupby(["run", "layer"]):
        assert sorted(g["epoch"]) == [0, 1, 2]
    per_run = pd.read_csv(sweep / "runs" / "normprop-s0" / "unit_stats.csv")
    assert list(per_run.columns) == ["layer", *UNIT, "epoch", "n", "mean", "std"]


def test_summary_settling_and_figures(results):
    sweep = results / "covariate-shift" / "synthetic"
    settled = pd.read_csv(sweep / "settling.csv")
    assert {
        "method",
        "seed",
        "layer",
        "band",
        "final_mean",
        "settled_after_epoch",
        "settled",
    } <= set(settled)
    assert (settled["band"] == 0.1).all() and len(settled) == 3 * 8
    summary = pd.read_csv(sweep / "summary.csv")
    assert {"avg_abs_final_mean", "last_settled_after_epoch", "band", "initial_lr"} <= set(summary.columns)
    assert summary.set_index("setting")["initial_lr"].to_dict() == {
        "normprop": 0.05,
        "batchnorm": 0.05,
        "none": 0.0001,
    }
    assert (sweep / "covariate_shift.png").exists() and (sweep / "covariate_shift.pdf").exists()


def test_plot_redraws_from_the_csvs_alone(assert_redraws, results):
    assert_redraws("covariate-shift", results)


def test_headlines_put_the_average_final_mean_beside_the_papers(results):
    rows = covariate_shift.headlines(config.load("covariate-shift", preset="smoke", results_dir=str(results)))
    papers = {r["quantity"].rsplit(", ", 1)[-1]: r["paper"] for r in rows if "average" in r["quantity"]}
    assert papers["NormProp"] == 0.19 and papers["BatchNorm"] == 0.33
    assert any("+-0.1" in r["quantity"] for r in rows)
