"""The drift's decomposition into mean and spread (drift/moments.py) and the mean rule (drift/mean_report.py)."""

import math

import pandas as pd
import torch

from normprop_cli import config
from normprop_cli.experiments.drift.ablation import is_reference, label
from normprop_cli.experiments.drift.mean_report import _depth, rule
from normprop_cli.experiments.drift.moments import MOMENTS_COLUMNS, MomentsProbe, normalised_map
from normprop_cli.nn.centred import CentredNormPropConv2d
from normprop_cli.nn.layers import NormPropConv2d
from normprop_cli.nn.nin import NIN


def test_the_moments_probe_gives_every_layer_its_decomposition():
    torch.manual_seed(0)
    model = NIN(10, 1, "normprop", 0.125)
    x = torch.randn(16, 1, 32, 32)
    rows = MomentsProbe().observe(model, lambda: iter([(x[:8], None), (x[8:], None)]), epoch=1)
    assert [r["layer"] for r in rows] == list(range(1, 10))
    assert all(list(r) == MOMENTS_COLUMNS for r in rows)
    assert math.isnan(rows[0]["mean_sq"]) and math.isnan(rows[-1]["corr_wx_out"])  # the data; no layer after 9
    for r in rows[1:]:
        assert r["mean_sq"] >= 0 and 0 <= r["share_mean"] <= 1 and r["abs_var_minus_1"] >= abs(r["var_minus_1"]) - 1e-12
    assert model.training  # left as it was


def test_the_normalised_map_is_the_layers_own():
    torch.manual_seed(1)
    plain, centred = NormPropConv2d(2, 3, 3), CentredNormPropConv2d(2, 3, 3)
    with torch.no_grad():
        centred.weight.copy_(plain.weight + 0.3)
        x = torch.randn(2, 2, 6, 6) + 2.0
        w = plain.weight / plain.weight.flatten(1).norm(dim=1).view(-1, 1, 1, 1)
        assert torch.allclose(normalised_map(plain, x), torch.nn.functional.conv2d(x, w), atol=1e-5)
        assert torch.allclose(normalised_map(centred, x), normalised_map(centred, x - 2.0), atol=1e-5)


def _comparisons(values: dict) -> pd.DataFrame:
    rows = []
    for setting, qs in values.items():
        for q, (diff, low, high) in qs.items():
            rows.append({"setting": setting, "quantity": q, "diff": diff, "low": low, "high": high})
    return pd.DataFrame(rows)


def test_the_rule_reads_cause_ruled_out_and_undecided():
    none = {"avg_abs_mean": (0.0, -0.1, 0.1), "avg_std": (0.0, -0.1, 0.1), "final_test_acc": (0.0, -1, 1)}
    removes = {"avg_abs_mean": (-0.5, -0.7, -0.3), "avg_std": (-0.6, -0.9, -0.35), "final_test_acc": (0.1, -1, 1)}
    mean_only = removes | {"avg_std": (0.1, -0.2, 0.4)}
    worse = {"avg_abs_mean": (1.3, 0.5, 2.1), "avg_std": (1.9, 0.9, 2.9), "final_test_acc": (0.3, -0.2, 0.9)}
    reading = lambda c, m: rule(_comparisons({"normprop-centred": c, "normprop-mean-oracle": m}))[0]  # noqa: E731
    assert reading(removes, none).startswith("the mean is named the cause: centred filters")
    assert reading(none, mean_only).startswith("the mean is named a cause: the mean oracle")
    assert reading(none, none) == "the mean is ruled out"
    assert reading(worse, worse) == "undecided"
    assert reading(removes | {"final_test_acc": (-3, -4, -2)}, none).startswith("the mean is named a cause")
    assert rule(_comparisons({"normprop-centred": none}))[0].startswith("not read")


def test_the_decomposition_runs_are_references_not_ablations():
    cfg = config.load("drift", preset="fashion")
    assert is_reference(cfg, "normprop-moments") and is_reference(cfg, "batchnorm-moments")
    assert not is_reference(cfg, "normprop-centred") and not is_reference(cfg, "normprop-mean-oracle")
    assert label(cfg, "batchnorm-moments", "batchnorm").endswith("(decomposition probe)")
    assert label(cfg, "normprop-centred", "normprop") == "NormProp with centred filters"
    assert "mean oracle" in label(cfg, "normprop-mean-sigma-oracle", "normprop")


def _difference(diff: float) -> dict:
    return {"diff": diff, "low": diff - 0.25, "high": diff + 0.25}


def test_the_rule_paragraph_states_its_facts():
    """The rule's paragraph writes each repair's differences, the epoch, seeds and level from its facts,
    and its reading in the rule's own words."""
    from normprop_cli import prose

    differences = {"avg_abs_mean": 1.25, "avg_std": 2.5, "final_test_acc": -0.5}
    repair = {"name": "centred filters"} | {q: _difference(d) for q, d in differences.items()}
    facts = {"decomposition": None, "left": None, "reading": "undecided", "repair": "", "repairs": [repair],
             "both": None, "worse": True, "epoch": 7, "seeds": 4, "level": 0.9}  # fmt: skip
    (text,) = prose.render("drift_mean", facts)
    assert "at epoch 7, 90% Welch intervals over 4 seeds): centred filters +1.25 [+1.00, +1.50] in |mean|," in text
    assert "+2.50 [+2.25, +2.75] in std, -0.50 [-0.75, -0.25] pp in accuracy. Reading: undecided." in text
    assert "by its letter the rule reads undecided" in text
    (text,) = prose.render("drift_mean", facts | {"reading": "a cause", "repair": "the mean oracle"})
    assert "Reading: the mean is named a cause: the mean oracle lower the final average |mean|." in text
    assert "by its letter" not in text


def test_how_a_quantity_goes_with_depth_is_counted_step_by_step():
    by_layer = pd.Series([0.6, 0.9, 2.8, 1.1, 35.2], index=[6, 2, 3, 4, 5])  # out of order: read by layer
    assert _depth(by_layer) == {"first": 0.9, "first_layer": 2, "last": 0.6, "last_layer": 6, "rises": 2, "steps": 4}


def test_the_spread_paragraph_says_how_it_goes_with_depth_and_which_settings_lower_it():
    """The words follow the facts: larger or not in the last layer than the first, the rises counted, and the
    settings that lower the final average std named, where earlier words said "grows with depth" and "no
    setting" whatever the numbers."""
    from normprop_cli import prose

    depth = {"first": 0.5, "first_layer": 2, "last": 3.0, "last_layer": 9, "rises": 5, "steps": 7}
    shrinks = depth | {"first": 3.0, "last": 0.5, "rises": 1}
    ends = [{"layer": 2, "mean_sq": "0.10", "var": "0.60"}, {"layer": 9, "mean_sq": "1.00", "var": "0.40"}]
    decomposition = {"verdict": "spread", "epoch": 6, "layers": "2-9", "share": _ci(0.2), "bn_share": _ci(0.2),
                     "first": None, "start": {"mean_sq": "0.20", "var": "0.80"}, "ends": ends,
                     "depth": {"mean_sq": depth, "var": shrinks}, "corr_low": 0.4, "corr_high": 0.7,
                     "corr_layers": "2-8"}  # fmt: skip
    left = {"var": _ci(6.0), "layers": "2-9", "depth": depth, "lowered": [], "compared": 10, "sigma": shrinks}
    facts = {"decomposition": decomposition, "left": left, "reading": "undecided", "repair": "", "repairs": [],
             "both": None, "worse": False, "epoch": 6, "seeds": 3, "level": 0.95}  # fmt: skip
    first, last = prose.render("drift_mean", facts)[0], prose.render("drift_mean", facts)[-1]
    assert "Only mean^2 is larger in the last hidden layer than in the first: layer 2 ends at 0.10 and 0.60" in first
    assert "mean^2 rises at 5 and |var - 1| at 1 of the 7 steps from one layer to the next." in first
    assert "(above 0; 0.50 at layer 2, 3.00 at layer 9, rising at 5 of the 7 steps" in last
    assert "and none of the 10 settings compared with NormProp lowers the final average std" in last
    assert "sigma^2 is itself not larger in the last layer than in the first (3.00 at layer 2, 0.50 at layer 9" in last
    left |= {"lowered": ["NormProp on ZCA-whitened input"], "var": _ci(0.5, -0.2, 1.2)}
    last = prose.render("drift_mean", facts)[-1]
    assert "(not told apart from 0;" in last
    assert "settings compared with NormProp, NormProp on ZCA-whitened input lowers the final average std" in last


def _ci(mean: float, low: float | None = None, high: float | None = None) -> dict:
    low = mean - 0.1 if low is None else low
    return {"mean": mean, "ci_low": low, "ci_high": mean + 0.1 if high is None else high, "n": 3, "sd": 0.1}
