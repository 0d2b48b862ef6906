"""The theory experiment (sections 3.2-3.4, Remarks 1-2, Prop. 1) on a smoke-sized config."""

import math
import shutil

import pandas as pd
import pytest

from normprop_cli import config
from normprop_cli.errors import UserError
from normprop_cli.experiments import theory

SMALL = [
    "theory.samples=20000",
    "theory.prelu_slopes=[-0.5,0.0,0.25,1.0]",
    "theory.jacobian_width=64",
    "theory.jacobian_inputs=32",
    "theory.jacobian_activations=[relu,prelu,tanh]",
    "theory.prop1_m=16",
    "theory.prop1_n=64",
    "theory.prop1_samples=5000",
    # the band holds for 20 layers at this width; it narrows with width (Prop. 1's coherence)
    "theory.depth=20",
    "theory.width=1024",
    "theory.batch=64",
    "theory.propagation_jacobian=[off]",
    "theory.propagation_seeds=2",
    "theory.nin_width=0.0625",
    "theory.nin_batch=4",
]
COLUMNS = {
    "activation_stats": {
        "quantity",
        "name",
        "param",
        "statistic",
        "closed_form",
        "quadrature",
        "monte_carlo",
        "mc_stderr",
        "abs_err_quadrature",
        "abs_err_mc",
    },
    "jacobian": {
        "activation",
        "jacobian",
        "sv_mean",
        "sv_rms",
        "sv_median",
        "sv_min",
        "sv_max",
        "predicted",
    },
    "jacobian_histogram": {"activation", "jacobian", "bin_left", "bin_right", "count"},
    "proposition1": {
        "case",
        "row_norms",
        "m",
        "coherence",
        "exact",
        "printed_bound",
        "corrected_bound",
        "printed_fails",
        "printed_undefined",
        "corrected_fails",
    },
    "propagation": {"net", "method", "jacobian", "seed", "layer", "quantity", "mean", "std"},
}
FIGURES = ("activation_stats", "jacobian", "proposition1", "propagation")


def small_cfg(results_dir):
    return config.load("theory", preset="smoke", overrides=[*SMALL, f"results_dir={results_dir}"])


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cfg = small_cfg(tmp_path_factory.mktemp("results"))
    out = theory.run(cfg)
    return cfg, out


def table(results, name):
    return pd.read_csv(results[1] / f"{name}.csv", keep_default_na=False, na_values=[""])


def printed(results, quantity, name, statistic) -> float:
    """A number the paper or the note prints: experiment.published in conf/experiment/theory.yaml."""
    return results[0].experiment.published[quantity][name][statistic][0]


def test_run_writes_every_csv_and_figure(results):
    cfg, out = results
    assert out == theory.out_dir(cfg)
    for name, columns in COLUMNS.items():
        assert columns <= set(table(results, name).columns), name
    for stem in FIGURES:
        assert (out / f"{stem}.png").stat().st_size > 0


def test_quadrature_matches_every_closed_form_and_monte_carlo_its_error_bars(results):
    df = table(results, "activation_stats")
    both = df.dropna(subset=["closed_form", "quadrature"])
    assert len(both) >= 12  # ReLU, PReLU slopes, symmetric means of tanh and sigmoid
    assert (both["abs_err_quadrature"] < 1e-4).all()
    assert (df["mc_stderr"] > 0).all()
    assert (df["abs_err_mc"] < 5 * df["mc_stderr"]).all()
    relu = df[df["name"] == "relu"].set_index("statistic")["closed_form"]
    assert relu["mean"] == pytest.approx(1 / math.sqrt(2 * math.pi))  # Remark 1
    assert relu["std"] == pytest.approx(math.sqrt((1 - 1 / math.pi) / 2))
    assert relu["jacobian_factor"] == pytest.approx(
        printed(results, "activation", "relu", "jacobian_factor"), abs=0.005
    )
    avg3 = df[(df["name"] == "avg 3x3") & (df["statistic"] == "std")]
    assert avg3["closed_form"].item() == pytest.approx(1 / 3)  # the note: 1/s
    max3 = df[(df["name"] == "max 3x3")].set_index("statistic")["quadrature"]
    for statistic in ("mean", "std"):  # the note's Monte Carlo estimates
        assert max3[statistic] == pytest.approx(printed(results, "pooling", "max 3x3", statistic), abs=2e-3)
    rescaled = df[(df["quantity"] == "dropout") & (df["name"] == "1/sqrt(p)") & (df["statistic"] == "std")]
    assert (rescaled["closed_form"] == 1.0).all()


def test_jacobian_rms_singular_value_is_the_factor_without_it_and_1_with_it(results):
    df = table(results, "jacobian").set_index(["activation", "jacobian"])
    factor = printed(results, "activation", "relu", "jacobian_factor")  # section 3.4
    assert df.loc[("relu", "off"), "sv_rms"] == pytest.approx(factor, abs=0.05)
    assert df.loc[("relu", "divide"), "sv_rms"] == pytest.approx(1.0, abs=0.05)
    # the RMS is sqrt(E[f'(z)^2]) / c1 for any W: every activation lands on its own prediction
    assert (df["sv_rms"] - df["predicted_exact"]).abs().max() < 0.05
    # half the ReLU units are off at any x: half the singular values are 0, the median is not the factor
    assert df.loc[("relu", "off"), "sv_zero_fraction"] == pytest.approx(0.5, abs=0.1)


def test_proposition1_corrected_bound_holds_and_printed_one_does_not(results):
    df = table(results, "proposition1")
    assert not df["corrected_fails"].any() and not df["coherence_bound_fails"].any()
    assert (df["corrected_bound"] >= df["exact"] * (1 - 1e-9)).all()
    over_one = df["row_norm_max"] > 1.0 + 1e-9
    assert (df["printed_undefined"] & over_one).any()
    assert not (df["printed_undefined"] & (df["row_norm_max"] < 1.0 - 1e-9)).any()
    assert df["printed_fails"].any()  # m = 2, rho = 0.65, rows of norm 1.5: defined yet too small
    orthonormal = df[df["structure"] == "orthonormal"]
    assert (orthonormal["exact"] < 1e-10).all() and (orthonormal["coherence"] < 1e-10).all()
    # the closed form agrees with a numerical minimisation over alpha
    assert ((df["exact_numerical"] - df["exact"]).abs() < 1e-5 * (1 + df["exact"])).all()


def test_normprop_fc_layers_stay_normalised_and_a_plain_net_collapses(results):
    df = table(results, "propagation")
    fc = df[(df["net"] == "fc") & (df["quantity"] == "output")]
    normprop = fc[(fc["method"] == "normprop") & (fc["jacobian"] == "off")]
    assert sorted(df["seed"].unique()) == [0, 1]  # theory.propagation_seeds: each seed its own weights
    assert normprop.groupby("seed").size().tolist() == [20, 20]
    assert normprop.groupby("seed")["mean"].first().nunique() == 2
    normprop = normprop[normprop["seed"] == 0]
    assert (normprop["mean"].abs() <= 0.1).all() and ((normprop["std"] - 1).abs() <= 0.1).all()
    assert normprop["in_band"].all()
    plain = fc[(fc["method"] == "none") & (fc["seed"] == 0)].sort_values("layer")
    assert not plain["in_band"].iloc[-1] and plain["std"].iloc[-1] < 0.01
    nin = df[(df["net"] == "nin") & (df["method"] == "normprop") & (df["quantity"] == "output")]
    assert set(nin["name"]) >= {"conv1", "pool1", "conv9", "pool3"}


def test_plot_redraws_from_the_csvs_and_needs_them(results, tmp_path):
    cfg, out = results
    copy = tmp_path / "theory"
    shutil.copytree(out, copy)
    for figure in copy.glob("*.png"):
        figure.unlink()
    cfg2 = small_cfg(tmp_path)
    paths = theory.plot(cfg2)
    assert sorted(p.name for p in paths) == sorted(f"{s}.png" for s in FIGURES)
    assert all(p.exists() and p.parent == copy for p in paths)
    (copy / "proposition1.csv").unlink()
    with pytest.raises(UserError, match="normprop run theory"):
        theory.plot(cfg2)


def test_a_second_run_under_the_same_settings_reuses_the_tables_and_writes_nothing(results, tmp_path):
    """`reproduce-all` on committed results leaves the tree clean: theory is skipped like a finished run
    (its numbers would move in the last digits if computed again on other threads), and computed anew
    when a setting changes."""
    cfg, out = results
    copy = tmp_path / "theory"
    shutil.copytree(out, copy)
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in copy.iterdir()}
    assert theory.run(small_cfg(tmp_path)) == copy
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in copy.iterdir()} == before
    (copy / "jacobian.png").unlink()  # a missing figure is redrawn from the CSVs
    theory.run(small_cfg(tmp_path))
    assert (copy / "jacobian.png").exists() and (copy / "jacobian.csv").stat().st_mtime_ns == before["jacobian.csv"][0]
    changed = config.load("theory", preset="smoke", overrides=[*SMALL, "theory.prop1_m=8", f"results_dir={tmp_path}"])
    assert not theory.complete(changed)
    theory.run(changed)
    assert (copy / "proposition1.csv").read_bytes() != before["proposition1.csv"][1]
    assert theory.complete(changed) and not theory.complete(small_cfg(tmp_path))
