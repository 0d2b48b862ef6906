"""The drift ablation: gamma and beta per layer (AffineProbe), the reading of each ablation against plain
NormProp on fabricated CSVs, the presets' grids, and the whole path (sweep, probe, ablation) on the smoke preset."""

import copy
import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from normprop_cli import config, io, prose, statistics
from normprop_cli.engine.runs import sweep_dir
from normprop_cli.engine.step import make_optimizer
from normprop_cli.experiments import EXPERIMENTS, drift
from normprop_cli.experiments.drift import AFFINE_COLUMNS, AffineProbe
from normprop_cli.experiments.drift.ablation import kind_label, setting_kind
from normprop_cli.experiments.drift.ablation_report import ablation_facts, ablation_paragraphs
from normprop_cli.experiments.drift.tables import ablation_settings, main_rows
from normprop_cli.experiments.lr_sweep import check_stepped
from normprop_cli.nn import NIN

RUN = ["run", "setting", "method", "seed", "width"]


def trained(model: NIN, steps: int = 3) -> None:
    """A few SGD steps (section 4.4's optimizer, weight decay on every parameter it trains) on noise."""
    gen = torch.Generator().manual_seed(0)
    optimizer = make_optimizer(model, 0.05, 0.9, 0.0005, torch.device("cpu"))
    model.train()
    for _ in range(steps):
        x, y = torch.randn(8, 1, 32, 32, generator=gen), torch.randint(10, (8,), generator=gen)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


@pytest.mark.parametrize("norm, layers", [("normprop", list(range(1, 10))), ("batchnorm", list(range(1, 9)))])
def test_affine_probe_rows_at_initialisation(norm, layers):
    model = NIN(10, 1, norm, 0.0625)
    rows = AffineProbe().observe(model, lambda: iter(()), epoch=0)
    assert [r["layer"] for r in rows] == layers  # BatchNorm's classifier is a plain conv: no gamma
    assert all(list(r) == AFFINE_COLUMNS for r in rows)
    for r in rows:
        assert r["gamma_mean"] == r["gamma_min"] == r["gamma_max"] == 1.0 and r["gamma_std"] == 0.0
        assert r["beta_mean"] == 0.0 and r["gamma_change"] == 0.0 and r["beta_change"] == 0.0
    if norm == "normprop":
        hidden, classifier = rows[0], rows[-1]
        assert hidden["divisor"] > 1.0 and hidden["gain_mean"] == pytest.approx(1.0 / hidden["divisor"])
        assert classifier["divisor"] == 1.0 and classifier["gain_mean"] == 1.0  # no activation: f = 1
    else:
        assert all(math.isnan(r["divisor"]) and math.isnan(r["gain_mean"]) for r in rows)


@pytest.mark.parametrize("norm", ["normprop", "batchnorm"])
def test_frozen_gamma_and_beta_do_not_move_and_learnt_ones_do(norm):
    for freeze in (True, False):
        torch.manual_seed(0)
        model, probe = NIN(10, 1, norm, 0.0625, freeze_affine=freeze), AffineProbe()
        probe.observe(model, lambda: iter(()), epoch=0)
        trained(model)
        rows = probe.observe(model, lambda: iter(()), epoch=1)
        gamma, beta = (np.array([r[c] for r in rows]) for c in ("gamma_change", "beta_change"))
        if freeze:
            assert (gamma == 0).all() and (beta == 0).all()
        else:
            assert (gamma > 0).all() and (beta > 0).all()
            assert gamma.max() < 0.5  # three small steps


def test_the_change_survives_a_resume_through_the_probe_state():
    torch.manual_seed(0)
    model, probe = NIN(10, 1, "normprop", 0.0625), AffineProbe()
    probe.observe(model, lambda: iter(()), epoch=0)
    state = probe.state_dict()
    trained(model)
    resumed = AffineProbe()
    resumed.load_state_dict(state)
    expected = probe.observe(model, lambda: iter(()), epoch=1)
    assert resumed.observe(model, lambda: iter(()), epoch=1) == expected
    lost = AffineProbe().observe(model, lambda: iter(()), epoch=1)  # no epoch-0 values: no change, not a wrong one
    assert all(math.isnan(r["gamma_change"]) and math.isnan(r["beta_change"]) for r in lost)
    assert [r["gamma_mean"] for r in lost] == [r["gamma_mean"] for r in expected]


def test_welch_matches_scipy():
    from scipy import stats

    a, b = [1.0, 1.3, 0.8, 1.1], [2.0, 2.6, 1.7]
    diff, low, high, _ = statistics.welch(a, b)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx(np.mean(a) - np.mean(b))
    assert (low, high) == pytest.approx((ci.low, ci.high))
    assert math.isnan(statistics.welch([1.0], b)[1])  # one seed: no interval


def test_setting_kinds_name_each_ablation():
    get = lambda given: lambda key: given.get(key)  # noqa: E731
    assert setting_kind(get({"model.norm": "normprop", "model.jacobian": "off"})) == "normprop-no-jacobian"
    assert setting_kind(get({"model.norm": "normprop", "train.data_norm": "zca"})) == "normprop-zca"
    assert setting_kind(get({"model.norm": "batchnorm", "model.freeze_affine": True})) == "batchnorm-frozen-affine"
    assert kind_label("normprop-no-jacobian") == "NormProp without the Jacobian factor"
    assert kind_label("batchnorm") == "BatchNorm"


# ---- the presets -------------------------------------------------------------------------------------


COMMITTED = ["normprop-w1", "normprop", "batchnorm"]


@pytest.mark.parametrize(
    "preset, ids, seeds, epochs",
    [("quick", COMMITTED, 2, 4), ("cpu", COMMITTED, 4, 10), ("smoke", ["normprop", "batchnorm", "wide"], 1, 2)],
)
def test_the_committed_presets_are_as_they_were(preset, ids, seeds, epochs):
    cfg = config.load("drift", preset=preset)
    assert [e.id for e in cfg.grid] == ids and int(cfg.seeds) == seeds and int(cfg.train.epochs) == epochs
    assert cfg.experiment.get("lr_sweep") is None and not cfg.experiment.affine_probe
    assert all("train.lr" not in e.set for e in cfg.grid) and float(cfg.train.lr) == 0.05
    width = lambda e: e.set.get("model.width", cfg.model.width)  # noqa: E731
    grid = pd.DataFrame([{"setting": e.id, "method": e.set["model.norm"], "width": width(e)} for e in cfg.grid])
    assert not ablation_settings(grid)


def test_the_fashion_preset_is_the_ablation_grid():
    cfg = config.load("drift", preset="fashion")
    ids = [e.id for e in cfg.grid]
    assert ids[:7] == [
        "normprop-w1",
        "batchnorm-w1",
        "normprop",
        "normprop-no-jacobian",
        "normprop-frozen-affine",
        "normprop-zca",
        "batchnorm",
    ]  # fmt: skip  (the Sigma-oracle and the rates after them)
    assert [int(e.get("seeds") or cfg.seeds) for e in cfg.grid] == [1, 1] + [3] * (len(ids) - 2)
    t = cfg.train
    assert (int(t.epochs), int(t.lr_halve_every), int(t.batch_size), t.data_norm) == (6, 2, 50, "global")
    assert int(t.probe_images) == 2000 and int(cfg.dataset.train_limit) == 10000 and cfg.model.width == 0.25
    assert cfg.experiment.affine_probe and int(cfg.experiment.lr_sweep.epochs) == 3
    check_stepped(cfg)  # the steps policy takes it as it is
    sets = {e.id: dict(e.set) for e in cfg.grid}
    assert sets["normprop-no-jacobian"]["model.jacobian"] == "off"  # a string, not YAML's boolean
    assert sets["normprop-no-jacobian"]["train.lr"] == 0.0125 and sets["normprop"]["train.lr"] == 0.05
    assert sets["normprop-frozen-affine"]["model.freeze_affine"] is True
    assert sets["normprop-zca"]["train.data_norm"] == "zca"
    assert {sets[i]["model.width"] for i in ("normprop-w1", "batchnorm-w1")} == {1.0}


# ---- the findings on fabricated CSVs ------------------------------------------------------------------

# final average drift per seed: no-jacobian clearly lower than NormProp, zca overlapping, frozen clearly higher
DRIFT = {"normprop": [1.50, 1.62, 1.41], "normprop-no-jacobian": [0.61, 0.55, 0.70],
         "normprop-frozen-affine": [2.31, 2.45, 2.20], "normprop-zca": [1.35, 1.70, 1.52],
         "batchnorm": [0.30, 0.35, 0.28], "normprop-w1": [1.9], "batchnorm-w1": [0.4]}  # fmt: skip


SPREAD = {"input_std": 1.0, "proj_std": 1.0, "coherence_max": 0.3, "coherence_mean": 0.05, "coherence_random": 0.04,
          "input_top_eig_fraction": 0.4, "input_effective_rank": 3.0, "patch_dim": 600,
          "patch_samples": 1200}  # fmt: skip


def fabricated(tmp_path, shift: dict | None = None, final_ratio: dict | None = None) -> DictConfig:
    """The fashion preset's CSVs with chosen numbers, no training; `shift` adds to a setting's final
    |mean| and std (in N(0, 1) units) without moving its drift; `final_ratio`: a setting's spread ratio at the
    last epoch (else 2)."""
    shift, final_ratio = shift or {}, final_ratio or {}
    cfg = config.load("drift", preset="fashion", results_dir=str(tmp_path))
    summary, population, spread, affine, sweep = [], [], [], [], []
    for setting, drifts in DRIFT.items():
        method = setting.split("-")[0]
        width = 1.0 if setting.endswith("-w1") else 0.25
        sweep.append({"setting": setting, "method": method, "lr": 0.0125 if "jacobian" in setting else 0.05,
                      "chosen": True})  # fmt: skip
        for seed, d in enumerate(drifts):
            head = {"run": f"{setting}-s{seed}", "setting": setting, "method": method, "seed": seed, "width": width}
            summary.append(head | {"status": "complete", "learned": True, "final_test_acc": 88.0 + seed})
            for epoch, layer in itertools.product((0, 6), range(1, 10)):
                ratio = final_ratio.get(setting, 2.0) if epoch else 1.0
                spread.append(head | {"layer": layer, "epoch": epoch, "ratio": ratio} | SPREAD)
                frozen = setting == "normprop-frozen-affine" or epoch == 0
                gamma = 1.0 if frozen else 0.9
                gain = gamma / 1.21 if method == "normprop" else math.nan
                moved = {"gamma_change": 1.0 - gamma, "beta_change": 0.0 if frozen else 0.05}
                affine.append(head | {"layer": layer, "epoch": epoch, "gain_mean": gain} | moved)
                if layer > 1:
                    up = shift.get(setting, 0.0) if epoch else 0.0
                    at = {"avg_drift": d if epoch else 0.0, "avg_abs_mean": (0.1 + d / 2 if epoch else 0.1) + up}
                    population.append(head | {"layer": layer, "epoch": epoch, "avg_std": 1.0 + d + up} | at)
    for name, rows in (("summary", summary), ("population", population), ("spread", spread), ("affine", affine),
                       ("lr_sweep", sweep)):  # fmt: skip
        io.write_csv(sweep_dir(cfg) / f"{name}.csv", pd.DataFrame(rows))
    return cfg


def test_ablations_are_the_settings_that_share_a_method_and_width():
    table = pd.DataFrame([{"setting": s, "method": s.split("-")[0], "width": 1.0 if s.endswith("w1") else 0.25}
                          for s in DRIFT])  # fmt: skip
    assert ablation_settings(table) == {s: "normprop" for s in ("normprop-no-jacobian", "normprop-frozen-affine",
                                                                 "normprop-zca")}  # fmt: skip
    assert list(main_rows(table)["setting"]) == ["normprop", "batchnorm", "normprop-w1", "batchnorm-w1"]


def test_the_findings_name_what_accounts_for_the_drift(tmp_path):
    cfg = fabricated(tmp_path)
    texts = drift.paragraphs(cfg)
    table = next(t for t in texts if t.startswith("| setting"))
    assert table.count("\n") == 1 + len(DRIFT) and "`normprop-zca`" in table and "0.0125" in table
    closing = next(t for t in texts if t.startswith("The drift is accounted for by"))
    accounted, _, rest = closing.partition("Ruled out")
    assert "the Jacobian factor f" in accounted and "correlated" not in accounted and "learnt gamma" not in accounted
    assert "learnt gamma and beta" in rest.split("Not shown")[0]  # frozen: higher drift, ruled out
    assert "correlated (not whitened) input" in rest.split("Not shown")[1]  # overlapping: not shown
    diff = np.mean(DRIFT["normprop-no-jacobian"]) - np.mean(DRIFT["normprop"])
    sentence = next(t for t in texts if t.startswith("NormProp without the Jacobian factor (rate 0.0125"))
    assert f"{diff:.2f} [" in sentence and "it reduces the drift" in sentence
    zca = next(t for t in texts if t.startswith("NormProp on ZCA-whitened input"))
    assert "the two cannot be told apart" in zca
    everything = " ".join(texts)
    assert "one seed each: single runs, no interval" in everything and "+1.50" in everything  # 1.9 - 0.4
    assert "0.83 -> 0.74" in everything  # gamma / f of layer 1: 1 / 1.21 -> 0.9 / 1.21
    rows = drift.headlines(cfg)
    best = next(r for r in rows if r["quantity"].startswith("largest drift reduction"))
    assert best["reproduced"].startswith("NormProp without the Jacobian factor " + f"{diff:.2f}")
    assert sum("minus NormProp's" in r["quantity"] for r in rows) == 3
    figures = drift.plot(cfg)  # drift.png from the main settings, drift_ablation.png beside it
    assert {p.name for p in figures} >= {"drift_ablation.png", "drift.png"}


def test_no_ablation_reducing_the_drift_is_said_so(tmp_path):
    DRIFT_SAVED = dict(DRIFT)
    try:
        DRIFT["normprop-no-jacobian"] = [1.40, 1.70, 1.55]
        DRIFT["normprop-frozen-affine"] = [1.45, 1.62, 1.50]
        texts = drift.paragraphs(fabricated(tmp_path))
    finally:
        DRIFT.clear()
        DRIFT.update(DRIFT_SAVED)
    closing = next(t for t in texts if t.startswith("No ablation reduces"))
    assert "the Jacobian factor f" in closing and "Not shown to account for it" in closing
    assert "in every NormProp setting, ablations included, the trained filters line up" in closing
    assert "BatchNorm's filters line up too (2.00-2.00)" in closing


def test_filters_are_said_to_line_up_only_where_every_spread_ratio_is_above_1(tmp_path):
    """The closing's mechanism sentence says every NormProp setting's filters line up with high-variance
    directions only where each setting's final spread ratio is above 1, and BatchNorm's only where its are."""
    saved = dict(DRIFT)
    try:
        DRIFT["normprop-no-jacobian"] = [1.40, 1.70, 1.55]  # no ablation reduces the drift: the sentence's case
        bn_below = {"batchnorm": 0.8, "batchnorm-w1": 0.95}
        closings = [
            next(t for t in drift.paragraphs(fabricated(tmp_path / name, final_ratio=ratios))
                 if t.startswith("No ablation reduces"))
            for name, ratios in (("zca", {"normprop-zca": 0.9} | bn_below), ("bn", bn_below))
        ]  # fmt: skip
    finally:
        DRIFT.clear()
        DRIFT.update(saved)
    assert "line up" not in closings[0] and "What the ablations leave" not in closings[0]
    assert "in every NormProp setting, ablations included, the trained filters line up" in closings[1]
    assert "BatchNorm's filters have spread ratios (0.80-0.95) but" in closings[1]


def test_an_ablation_without_which_the_inputs_leave_n01_further_is_ruled_out(tmp_path):
    """ZCA's drift overlaps NormProp's, but its |mean| and std (in N(0, 1) units) are clearly higher: taking
    correlated input away makes things worse, so correlation is ruled out, not merely 'not shown'."""
    texts = drift.paragraphs(fabricated(tmp_path, shift={"normprop-zca": 0.5}))
    closing = next(t for t in texts if t.startswith("The drift is accounted for by"))
    ruled = closing.partition("Ruled out")[2].split("Not shown")[0]
    assert "correlated (not whitened) input (average |mean| 0.5" in ruled and "average std 0.5" in ruled


def test_the_ablation_paragraphs_state_the_facts_and_follow_them(tmp_path):
    """Each ablation's sentence states its facts' drift, its main setting's and their difference; a fact
    changed changes the sentence, and the closing follows the facts' list of ablations that account."""
    cfg = fabricated(tmp_path)
    facts = ablation_facts(cfg)
    texts = ablation_paragraphs(cfg)
    assert prose.render("drift_ablation", facts) == texts[: len(prose.render("drift_ablation", facts))]
    assert {a["label"] for a in facts["ablations"]} == {"NormProp without the Jacobian factor",
                                                        "NormProp with gamma and beta frozen",
                                                        "NormProp on ZCA-whitened input"}  # fmt: skip
    for a in facts["ablations"]:
        d = a["drift"]
        sentence = next(t for t in texts if t.startswith(a["label"]))
        assert f"final average drift {d['value']:.2f} against NormProp's {d['reference_value']:.2f}" in sentence
        assert f"a difference of {d['diff']} (n = {a['seeds'][0]} and {a['seeds'][1]} seeds)" in sentence
        assert all(f"{o['name']} {o['value']:.2f} against {o['reference_value']:.2f}" in sentence for o in a["others"])
    changed = copy.deepcopy(facts)
    changed["ablations"][0]["drift"] |= {"value": 12.345, "reading": "increases"}
    changed["closing"]["named"] = []
    again = prose.render("drift_ablation", changed)
    assert "final average drift 12.35 against" in again[2] and ": it increases the drift;" in again[2]
    assert sum(t.startswith("No ablation reduces the final average drift") for t in again) == 1
    widths = prose.render("drift_ablation_affine", facts)
    pair = facts["widths"]["pairs"][0]
    assert f"is {pair['gaps'][0]:+.2f} at width 1 and {pair['gaps'][1]:+.2f} at width 0.25" in " ".join(widths)


# ---- the whole path on the smoke preset ---------------------------------------------------------------


def test_smoke_ablation_with_a_sweep_and_the_affine_probe(tmp_path):
    cfg = config.load("drift", preset="smoke", results_dir=str(tmp_path), quiet=True)
    cfg.seeds = 2
    cfg.train.epochs = 1
    cfg.experiment.affine_probe = True
    cfg.experiment.lr_sweep = {"step": 2.0, "points": 1, "extend": 0, "seeds": [100, 101], "epochs": 1}
    cfg.grid = [{"id": "normprop", "set": {"model.norm": "normprop", "train.lr": 0.02}},
                {"id": "normprop-frozen-affine", "set": {"model.norm": "normprop", "model.freeze_affine": True,
                                                         "train.lr": 0.02}},
                {"id": "batchnorm", "set": {"model.norm": "batchnorm", "train.lr": 0.02}}]  # fmt: skip
    EXPERIMENTS["drift"].run(cfg)
    out = sweep_dir(cfg)
    sweep = pd.read_csv(out / "lr_sweep.csv")
    assert set(sweep["setting"]) == {"normprop", "normprop-frozen-affine", "batchnorm"} and len(sweep) == 6
    assert (out / "lr_sweep.png").exists()
    assert set(sweep["method"]) == {"normprop", "normprop-frozen-affine", "batchnorm"}
    affine = pd.read_csv(out / "affine.csv")
    assert list(affine.columns) == RUN + AFFINE_COLUMNS and sorted(affine["epoch"].unique()) == [0, 1]
    frozen = affine[affine["setting"] == "normprop-frozen-affine"]
    assert (frozen["gamma_change"] == 0).all() and (frozen["beta_change"] == 0).all()
    summary = pd.read_csv(out / "summary.csv")
    assert {"final_gamma_change", "final_beta_change"} <= set(summary)
    assert (summary.loc[summary["setting"] == "normprop-frozen-affine", "final_gamma_change"] == 0).all()
    assert (summary.loc[summary["setting"] == "normprop", "final_gamma_change"] > 0).all()
    assert len(pd.read_csv(out / "ablation.csv")) == 3 and (out / "drift_ablation.png").exists()
    assert all(isinstance(t, str) and t for t in drift.paragraphs(cfg))
