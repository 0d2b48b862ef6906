"""Section 4.6 (claim C8): NormProp and BatchNorm with ReLU, PReLU, tanh and sigmoid, each
NormProp layer through its activation's own constants; the layers' statistics before and after training."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from normprop_cli import config, prose
from normprop_cli import verdicts as V
from normprop_cli.experiments import activations
from normprop_cli.verdicts import INCONCLUSIVE, NOT_MEASURED, NOT_REPRODUCED, REPRODUCED, rule

SMOKE = ["--preset", "smoke", "--quiet"]
ACTS = ["relu", "prelu", "tanh", "sigmoid"]
METHODS = ["normprop", "batchnorm"]


@pytest.fixture(scope="module")
def results(run_experiment):
    return run_experiment("activations", *SMOKE)


def test_the_smoke_run_writes_every_setting(results):
    sweep = results / "activations" / "synthetic"
    summary = pd.read_csv(sweep / "summary.csv")
    assert len(summary) == 10 * 2 and (summary["status"] == "complete").all()
    ablations = {("normprop", "tanh_reluconst"), ("normprop", "sigmoid_reluconst")}  # ReLU's constants: C8 (b)
    assert (
        set(zip(summary["method"], summary["activation"], strict=True))
        == {(m, a) for m in METHODS for a in ACTS} | ablations
    )
    assert {"seed", activations.ACCURACY, "learned"} <= set(summary.columns)
    c = pd.read_csv(sweep / "curves.csv")
    assert list(c.columns) == ["method", "activation", "epoch", "n", "diverged", "mean", "sd", "ci_low", "ci_high"]
    assert len(c) == 10 * 2 and (c["n"] == 2).all()
    layers = pd.read_csv(sweep / "layer_stats.csv")
    assert list(layers.columns) == activations.LAYER_COLUMNS
    assert layers.groupby(["method", "activation"]).ngroups == 10
    assert sorted(layers["epoch"].unique()) == [0, 1, 2] and sorted(layers["layer"].unique()) == list(range(2, 10))
    population = pd.read_csv(sweep / "population.csv")  # layer_stats is its mean over seeds
    one = population[(population["method"] == "normprop") & (population["activation"] == "tanh")]
    one = one[(one["layer"] == 5) & (one["epoch"] == 2)]
    row = layers.set_index(["method", "activation", "layer", "epoch"]).loc[("normprop", "tanh", 5, 2)]
    assert row["avg_std"] == pytest.approx(one["avg_std"].mean()) and row["n"] == 2
    assert (sweep / "activations.png").exists()


def test_at_initialisation_normprop_first_layer_output_is_what_eq12_predicts(results):
    """Eq. 12 with each activation's own c1, c2: when W_1 x / ||W_1|| is N(0, 1) (Prop. 1 on globally
    normalised, near-white input, section 4.1), the first layer's output (sigma(u / f) - c2) / c1 has a
    std of 0.83 (ReLU, the ICML Jacobian factor f = 1.21 divides u), 0.91 (PReLU), 0.96 (tanh), 0.99
    (sigmoid). 15% covers the synthetic images' pixel correlations and the 64 evaluation images; the
    average |mean| over units carries the sampling noise of a mean over 64 images (about 0.1). Deeper
    layers follow pooling, which NormProp does not re-normalise (section 3.2), and divide by f again:
    only their scale is held, within a factor of 10 of 1 (the theory experiment's random NIN on N(0, 1)
    input: 0.29-0.95)."""
    layers = pd.read_csv(results / "activations" / "synthetic" / "layer_stats.csv")
    init = layers[(layers["method"] == "normprop") & (layers["epoch"] == 0)]
    for activation in ACTS:
        mine = init[init["activation"] == activation]
        layer2 = mine[mine["layer"] == 2].iloc[0]
        mean, std = activations.first_layer_prediction(activation)
        assert layer2["avg_std"] == pytest.approx(std, rel=0.15), activation
        assert layer2["avg_abs_mean"] < abs(mean) + 0.3, activation
        assert mine["avg_std"].between(0.1, 10.0).all(), activation
    # the prediction itself: N(0, 1) in standard units without the factor, less than 1 with it
    assert activations.first_layer_prediction("relu", "off") == pytest.approx((0.0, 1.0), abs=1e-9)
    assert activations.first_layer_prediction("relu")[1] == pytest.approx(1 / 1.2112, rel=0.02)


def test_plot_redraws_from_the_csvs_alone(assert_redraws, results):
    assert_redraws("activations", results)


def test_headlines_and_paragraphs_give_each_activations_numbers(results):
    cfg = config.load("activations", preset="smoke", results_dir=str(results))
    rows = activations.headlines(cfg)
    finals = [r for r in rows if r["quantity"].startswith("final test accuracy")]
    assert len(finals) == 10 and all("[" in r["reproduced"] for r in finals)
    assert [r["quantity"][:6] for r in rows if r["quantity"].startswith("C8")] == ["C8 (a)", "C8 (b)"]
    texts = activations.paragraphs(cfg)
    assert len(texts) == 2 and all(name in texts[0] for name in ("ReLU", "PReLU", "tanh", "sigmoid"))
    assert "C8" in texts[1]
    # the margin in pp: C8's fraction of NormProp's test error with ReLU, from the same summary
    summary = pd.read_csv(results / "activations" / "synthetic" / "summary.csv")
    np_relu = summary[(summary["method"] == "normprop") & (summary["activation"] == "relu")]
    margin = 0.2 * (100.0 - np_relu["final_test_acc"].mean())
    assert f"-{margin:.2f} pp, C8's margin" in texts[1]


def test_the_paragraphs_state_the_facts_and_name_the_claim_conf_gives_the_experiment(results, monkeypatch):
    """The sentences state activation_facts' numbers, change with them, and name the claim by the id that
    conf/claims.yaml gives the activations experiment (renumbered there, the prose and headlines follow)."""
    cfg = config.load("activations", preset="smoke", results_dir=str(results))
    facts = activations.activation_facts(cfg)
    texts = activations.paragraphs(cfg)
    assert texts == prose.render("activations", facts) and facts["compared"]
    assert all(f"{a['name']} {a['std_first']:.2f}" in texts[0] for a in facts["normprop"])
    assert all(f"{g['name']} {g['normprop']:.2f} vs {g['batchnorm']:.2f}" in texts[1] for g in facts["gaps"])
    assert f"-{facts['margin']['value']:.2f} pp, {facts['claim']}'s margin" in texts[1]
    assert f"after {facts['epochs']} epochs" in texts[1]
    assert "after 1234 epochs" in prose.render("activations", facts | {"epochs": 1234})[1]
    assert "has no ablation runs here" in prose.render("activations", facts | {"constants": []})[1]
    lowest = {"name": "sigmoid", "acc": 12.345, "relu": 67.891}
    said = prose.render("activations", facts | {"batchnorm_lowest": lowest})[1]
    assert "at the shared rate (BatchNorm 12.35% with sigmoid against 67.89% with ReLU);" in said
    assert "takes to each activation" not in prose.render("activations", facts | {"batchnorm_lowest": None})[1]
    claim = rule.claim_of(activations.NAME)
    assert claim.experiment == "activations" and f"{claim.id} needs both" in texts[1]
    monkeypatch.setattr(rule, "claims", lambda: (dataclasses.replace(claim, id="C42"),))
    renamed = " ".join(activations.paragraphs(cfg))
    assert "C42 does not test these" in renamed and f"{claim.id} " not in renamed
    assert [r["quantity"][:7] for r in activations.headlines(cfg) if r["quantity"].startswith("C42")] == [
        "C42 (a)",
        "C42 (b)",
    ]


# ---- C8 on hand-made summaries: (a) NormProp's own change from ReLU, (b) its own constants vs ReLU's ----

RELU = [90.0, 91.0, 90.5, 90.2]
WOBBLE = [0.1, -0.2, 0.15, -0.05]  # per seed, so that every difference has a spread


def write_summary(results, normprop: dict[str, float], batchnorm: float | None = 90.0, seeds: int = 4):
    """summary.csv: NormProp with each activation at ReLU's accuracy + normprop[activation] (+ a seed's
    wobble past ReLU), BatchNorm with the four activations at `batchnorm` (None: no BatchNorm runs)."""
    rows = []
    for activation, shift in normprop.items():
        for seed in range(seeds):
            acc = RELU[seed] + (shift + WOBBLE[seed] * (activation != "relu") * (1 + len(activation) % 3))
            rows.append({"run": f"normprop-{activation}-s{seed}", "method": "normprop", "activation": activation,
                         "seed": seed, "status": "complete", "final_test_acc": acc, "learned": True})  # fmt: skip
    for activation in ACTS if batchnorm is not None else []:
        for seed in range(seeds):
            rows.append({"run": f"batchnorm-{activation}-s{seed}", "method": "batchnorm", "activation": activation,
                         "seed": seed, "status": "complete", "final_test_acc": batchnorm, "learned": True})  # fmt: skip
    path = results / "activations" / "digits" / "summary.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)
    return pd.DataFrame(rows)


def c8(results):
    table = V.table(results)
    return table[table["claim"] == "C8"].iloc[0]


def t_ci(values):
    x = np.asarray(values, dtype=float)
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean() - half, x.mean() + half


def parts(summary: pd.DataFrame):
    """By hand: per seed, (a) the worst of prelu/tanh/sigmoid minus relu, (b) the worst of tanh/sigmoid
    own minus ReLU's constants."""
    wide = summary[summary["method"] == "normprop"].pivot(index="seed", columns="activation", values="final_test_acc")
    a = wide[["prelu", "tanh", "sigmoid"]].sub(wide["relu"], axis=0).min(axis=1)
    b = pd.concat([wide[n] - wide[f"{n}_reluconst"] for n in ("tanh", "sigmoid")], axis=1).min(axis=1)
    return a.to_numpy(), b.to_numpy(), 0.2 * (100 - wide["relu"].mean())


def test_c8_needs_both_parts_and_its_interval_is_the_smaller_of_a_and_b_minus_m(tmp_path):
    summary = write_summary(tmp_path, {"relu": 0.0, "prelu": 0.3, "tanh": -0.2, "sigmoid": -0.5,
                                       "tanh_reluconst": -5.0, "sigmoid_reluconst": -20.0})  # fmt: skip
    a, b, m = parts(summary)
    r = c8(tmp_path)
    (low_a, high_a), (low_b, high_b) = t_ci(a), t_ci(b)
    assert r["margin"] == pytest.approx(m) and r["test"].startswith("one-sample t")
    assert r["effect"] == pytest.approx(min(a.mean(), b.mean() - m))
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((min(low_a, low_b - m), min(high_a, high_b - m)))
    assert (r["normprop"], r["baseline"]) == pytest.approx((a.mean(), b.mean()))
    assert r["verdict"] == REPRODUCED and r["halves"] == "agree"  # halves of 2 seeds: wide, but on its side
    assert "prelu/tanh/sigmoid" in r["metric"] and "tanh/sigmoid through its own constants" in r["metric"]
    assert "NormProp minus BatchNorm, sigmoid" in r["note"]  # BatchNorm: beside it, not in the test


def test_c8_is_inconclusive_where_the_constants_make_no_difference(tmp_path):
    write_summary(tmp_path, {"relu": 0.0, "prelu": 0.3, "tanh": -0.2, "sigmoid": -0.5,
                             "tanh_reluconst": -0.2, "sigmoid_reluconst": -0.5})  # fmt: skip
    r = c8(tmp_path)
    assert r["verdict"] == INCONCLUSIVE and "part (a)" in r["note"]


@pytest.mark.parametrize(
    "shifts",
    [
        {"sigmoid": -10.0, "tanh_reluconst": -5.0, "sigmoid_reluconst": -20.0},  # (a) below -m
        {"sigmoid": -0.5, "tanh_reluconst": 3.0, "sigmoid_reluconst": 2.0},  # (b) below 0: ReLU's are better
    ],
)
def test_c8_is_not_reproduced_where_either_part_is(tmp_path, shifts):
    write_summary(tmp_path, {"relu": 0.0, "prelu": 0.3, "tanh": -0.2} | shifts)
    assert c8(tmp_path)["verdict"] == NOT_REPRODUCED


def test_c8_without_ablation_runs_has_no_interval_and_without_results_is_not_measured(tmp_path):
    assert c8(tmp_path)["verdict"] == NOT_MEASURED and "normprop run activations" in c8(tmp_path)["note"]
    write_summary(tmp_path, {"relu": 0.0, "prelu": 0.3, "tanh": -0.2, "sigmoid": -0.5})
    r = c8(tmp_path)
    assert math.isnan(r["ci_low"]) and r["verdict"] == INCONCLUSIVE and "no ablation runs" in r["note"]
    assert f"{rule.claim_of(activations.NAME).id} has no interval" in r["note"]  # the id conf/claims.yaml gives


def test_batchnorms_lowest_activation_is_named_beside_relus_only_where_it_is_not_relu():
    lowest = activations._batchnorm_lowest({"relu": 90.5, "tanh": 85.5, "sigmoid": 60.5})  # mean accuracy (%)
    assert lowest == {"name": "sigmoid", "acc": 60.5, "relu": 90.5}
    assert activations._batchnorm_lowest({"relu": 50.5, "sigmoid": 60.5}) is None
    assert activations._batchnorm_lowest({"tanh": 50.5, "sigmoid": 60.5}) is None  # no ReLU to set it beside
    assert activations._batchnorm_lowest({}) is None
