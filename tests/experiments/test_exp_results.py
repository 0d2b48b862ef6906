"""What Figs. 3 and 4 draw: the mean over seeds and its 95% interval; the experiment YAMLs."""

import inspect
import math
import re
import sys
from collections.abc import Mapping

import pandas as pd
import pytest
from omegaconf import OmegaConf

from normprop_cli import config, statistics
from normprop_cli.experiments import EXPERIMENTS, tables

TRAINING = ["data-norm", "covariate-shift", "convergence", "batch-size", "table1", "timing"]


def test_interval_of_a_known_sample():
    # [1, 2, 3]: mean 2, sd 1, half-width t(0.975, 2) / sqrt(3) = 4.3027 / 1.7321 = 2.484
    ci = statistics.mean_ci([1.0, 2.0, 3.0])
    assert ci["n"] == 3 and ci["mean"] == 2.0 and ci["sd"] == 1.0
    assert ci["ci_high"] - 2.0 == pytest.approx(2.484, abs=5e-4)
    assert 2.0 - ci["ci_low"] == pytest.approx(2.484, abs=5e-4)


def test_one_seed_has_no_interval_and_nonfinite_values_are_left_out():
    one = statistics.mean_ci([5.0])
    assert one["n"] == 1 and one["mean"] == 5.0
    assert math.isnan(one["ci_low"]) and math.isnan(one["ci_high"])
    assert statistics.mean_ci([1.0, float("nan"), 3.0])["n"] == 2


def test_an_interval_is_written_from_mean_ci_or_from_a_curve_row():
    ci = statistics.mean_ci([1.0, 2.0, 3.0])
    assert statistics.format_mean_ci(ci) == statistics.format_ci(ci["mean"], ci["ci_low"], ci["ci_high"])
    assert statistics.format_mean_ci(pd.Series({"mean": 5.0, "ci_low": math.nan, "ci_high": math.nan}), 3) == "5.000"


def published(node) -> list[float]:
    """Every number under a YAML mapping (the paper's values of an experiment)."""
    if isinstance(node, Mapping):
        return [x for value in node.values() for x in published(value)]
    return [node] if isinstance(node, int | float) and not isinstance(node, bool) else []


@pytest.mark.parametrize("experiment", ["data-norm", "covariate-shift", "table1", "timing"])
def test_the_papers_numbers_live_in_the_yaml_alone(experiment):
    """The runner reads the paper's published numbers from experiment.paper_*; its code restates none."""
    paper = OmegaConf.to_container(config.load(experiment).experiment)
    numbers = published({k: v for k, v in paper.items() if k.startswith("paper_")})
    source = inspect.getsource(sys.modules[EXPERIMENTS[experiment].analyse.__module__])
    assert numbers and not [x for x in numbers if re.search(rf"(?<![\d.]){re.escape(f'{x:g}')}(?!\.?\d)", source)]


def test_curves_are_per_setting_and_epoch():
    epochs = pd.DataFrame(
        {
            "method": ["a"] * 6 + ["b"] * 2,
            "epoch": [1, 1, 1, 2, 2, 2, 1, 2],
            "test_acc": [1.0, 2.0, 3.0, 4.0, 4.0, 4.0, 7.0, 8.0],
        }
    )
    c = tables.curves(epochs, ["method"]).set_index(["method", "epoch"])
    assert list(c.columns) == ["n", "diverged", "mean", "sd", "ci_low", "ci_high"]
    assert c.loc[("a", 1), "mean"] == 2.0 and c.loc[("a", 1), "n"] == 3 and (c["diverged"] == 0).all()
    assert c.loc[("a", 1), "ci_low"] == statistics.proportion_ci([1.0, 2.0, 3.0])["ci_low"] > 0.0
    assert c.loc[("a", 2), "ci_low"] == c.loc[("a", 2), "ci_high"] == 4.0  # no spread, no width
    assert c.loc[("b", 2), "n"] == 1 and math.isnan(c.loc[("b", 2), "ci_low"])


@pytest.mark.parametrize("experiment", TRAINING)
def test_each_yaml_names_its_command_figure_and_paper_numbers(experiment):
    text = (config.conf_dir() / "experiment" / f"{experiment}.yaml").read_text()
    comments = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert f"normprop run {experiment} --preset paper" in comments
    assert "Paper" in comments
    cfg = config.load(experiment, preset="paper")
    assert cfg.experiment.name == experiment and cfg.dataset.name == "cifar10"
    assert cfg.model.width == 1.0


@pytest.mark.parametrize("experiment", TRAINING)
def test_plot_without_its_csv_is_one_line_naming_the_run_command(cli, experiment):
    result = cli("plot", experiment, "--preset", "smoke", "--results-dir", cli.results)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert f"normprop run {experiment} --preset smoke" in lines[0]
