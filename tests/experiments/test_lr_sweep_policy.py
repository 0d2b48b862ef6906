"""The learning-rate sweep's steps policy: rates a fixed ratio apart around each setting's rate, extended
past an edge until the best is interior, scored as the mean over seeds of its own; the factors policy as
it was. Most tests fabricate the runs' validation accuracies (no training); one trains the smoke preset."""

import math
import re

import pandas as pd
import pytest

from normprop_cli import config
from normprop_cli.engine.runs import METRIC_COLUMNS, run_dir
from normprop_cli.errors import UserError
from normprop_cli.experiments import lr_sweep
from normprop_cli.experiments.lr_sweep import SWEEP

# batch-size on the smoke preset: normprop-b1 (rate 0.002), normprop-b16 (0.02), batchnorm-b1 (0.002);
# reported seeds 0 and 1, 2 epochs
STEPS = {"step": 2.0, "points": 3, "extend": 2, "seeds": [100, 101], "epochs": 1}


def load(tmp_path, sweep=None, **overrides):
    cfg = config.load("batch-size", preset="smoke", results_dir=str(tmp_path / "results"))
    cfg.experiment.lr_sweep = dict(STEPS) | (sweep or {})
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


@pytest.fixture
def fake(monkeypatch):
    """`fake(accuracy, loss)`: the sweep's runs 'train' by writing a metrics.csv whose last epoch has
    validation accuracy accuracy(setting, lr, seed) (NaN: the run diverged) and loss loss(...);
    `fake.rounds` lists each run_sweep call's runs."""

    def install(accuracy, loss=lambda setting, lr, seed: 1.0):
        def run_sweep(cfg, specs, observers=None):
            install.rounds.append(list(specs))
            manifests = []
            for spec in specs:
                setting = spec.setting.removeprefix("sweep-").rsplit("-lr", 1)[0]
                lr, epochs = float(spec.cfg.train.lr), int(spec.cfg.train.epochs)
                acc = accuracy(setting, lr, spec.seed)
                rows = [dict.fromkeys(METRIC_COLUMNS, math.nan) | {"epoch": e, "val_acc": 50.0, "val_loss": 2.0}
                        for e in range(1, epochs + 1)]  # fmt: skip
                rows[-1] |= {"val_acc": acc, "val_loss": loss(setting, lr, spec.seed) if acc == acc else math.nan}
                path = run_dir(spec.cfg, spec.name)
                path.mkdir(parents=True, exist_ok=True)
                pd.DataFrame(rows, columns=METRIC_COLUMNS).to_csv(path / "metrics.csv", index=False)
                manifests.append({"status": "diverged" if math.isnan(acc) else "complete"})
            return manifests

        install.rounds = []
        monkeypatch.setattr(lr_sweep, "run_sweep", run_sweep)

    install.rounds = []
    return install


def peaked(setting, lr, seed):
    """normprop-b1 peaks at its centre, normprop-b16 two steps above its own, batchnorm-b1 keeps
    improving downwards (past any extension)."""
    peak = {"normprop-b1": 0.002, "normprop-b16": 0.08, "batchnorm-b1": 1e-9}[setting]
    return 90.0 - 10.0 * abs(math.log2(lr / peak)) / (10.0 if setting == "batchnorm-b1" else 1.0)


def rates(table, setting):
    return sorted(table.loc[table["setting"] == setting, "lr"].unique())


def test_an_edge_best_is_extended_until_interior_or_the_limit(tmp_path, fake):
    fake(peaked)
    cfg = load(tmp_path)
    table = lr_sweep.choose_rates(cfg)
    assert list(table.columns) == lr_sweep.STEPPED
    written = pd.read_csv(tmp_path / "results" / "batch-size" / "synthetic" / "lr_sweep.csv")
    assert list(written.columns) == lr_sweep.STEPPED and len(written) == len(table)
    assert rates(table, "normprop-b1") == pytest.approx([0.001, 0.002, 0.004])  # interior: not extended
    assert rates(table, "normprop-b16") == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16])  # up to interior
    assert rates(table, "batchnorm-b1") == pytest.approx([0.00025, 0.0005, 0.001, 0.002, 0.004])  # the limit: 2
    chosen = table[table["chosen"]]
    assert len(chosen) == 6 and set(chosen["seed"]) == {100, 101}  # every seed's row of the chosen rate
    assert dict(zip(chosen["setting"], chosen["lr"], strict=True)) == {
        "normprop-b1": 0.002, "normprop-b16": 0.08, "batchnorm-b1": 0.00025}  # fmt: skip
    assert set(table.loc[table["at_edge"], "setting"]) == {"batchnorm-b1"}
    assert not table.loc[~table["chosen"], "at_edge"].any()
    # rounds over every setting at once: 9 rates, then one more for each of two settings, twice
    assert [len(r) for r in fake.rounds] == [18, 4, 4]
    assert {s.setting for s in fake.rounds[1]} == {"sweep-normprop-b16-lr0.08", "sweep-batchnorm-b1-lr0.0005"}
    edges = lr_sweep.edge_choices(table)
    assert list(edges.columns) == lr_sweep.EDGES and edges["setting"].tolist() == ["batchnorm-b1"]
    assert edges.iloc[0]["side"] == "lowest" and edges.iloc[0]["rates"] == "0.00025 0.0005 0.001 0.002 0.004"
    assert edges.iloc[0]["method"] == "batchnorm" and edges.iloc[0]["batch_size"] == 1
    grid = {e.id: e.set["train.lr"] for e in lr_sweep.with_rates(cfg, table).grid}
    assert grid == {"normprop-b1": 0.002, "normprop-b16": 0.08, "batchnorm-b1": 0.00025}


def test_a_rerun_reaches_the_same_rates(tmp_path, fake):
    fake(peaked)
    first = lr_sweep.choose_rates(load(tmp_path))
    names = [[s.name for s in r] for r in fake.rounds]
    fake(peaked)
    again = lr_sweep.choose_rates(load(tmp_path))
    pd.testing.assert_frame_equal(first, again)
    assert [[s.name for s in r] for r in fake.rounds] == names


def test_a_single_first_rate_is_its_own_edge_on_both_sides(tmp_path, fake):
    fake(peaked)
    table = lr_sweep.choose_rates(load(tmp_path, {"points": 1, "extend": 0}))
    assert len(fake.rounds) == 1 and len(table) == 6 and table["chosen"].all() and table["at_edge"].all()
    assert set(lr_sweep.edge_choices(table)["side"]) == {"only"}
    fake(peaked)  # one rate and one extension a side: both sides at once
    table = lr_sweep.choose_rates(load(tmp_path / "again", {"points": 1, "extend": 1}))
    assert [len(r) for r in fake.rounds] == [6, 12]
    assert rates(table, "normprop-b1") == pytest.approx([0.001, 0.002, 0.004])
    assert table.loc[table["chosen"], "lr"].tolist() == pytest.approx([0.002] * 2 + [0.04] * 2 + [0.001] * 2)
    assert table.loc[table["at_edge"], "setting"].tolist() == ["normprop-b16"] * 2 + ["batchnorm-b1"] * 2


def test_the_score_is_the_mean_over_seeds_and_a_diverged_run_scores_chance(tmp_path, fake):
    def accuracy(setting, lr, seed):
        if setting == "normprop-b1" and lr == 0.002 and seed == 101:
            return math.nan  # diverged: its 95 at seed 100 must not win
        centre = 0.02 if setting == "normprop-b16" else 0.002
        top = 95.0 if lr == centre else 80.0 if lr == 2 * centre else 60.0
        return top + (4.0 if seed == 101 else 0.0)

    fake(accuracy)
    cfg = load(tmp_path, {"extend": 0})
    table = lr_sweep.choose_rates(cfg).set_index(["setting", "lr", "seed"])
    chance = 100.0 / int(cfg.dataset.num_classes)
    assert table.loc[("normprop-b16", 0.02, 100), "score"] == pytest.approx(97.0)  # (95 + 99) / 2
    assert table.loc[("normprop-b16", 0.02, 101), "score"] == pytest.approx(97.0)
    assert table.loc[("normprop-b1", 0.002, 100), "score"] == pytest.approx((95.0 + chance) / 2)
    assert math.isnan(table.loc[("normprop-b1", 0.002, 101), "val_acc"])  # recorded as it was
    won = table[table["chosen"]].reset_index()
    assert won.loc[won["setting"] == "normprop-b1", "lr"].tolist() == [0.004, 0.004]


def test_a_tie_goes_to_the_lower_validation_loss(tmp_path, fake):
    fake(lambda setting, lr, seed: 70.0, loss=lambda setting, lr, seed: abs(math.log2(lr / 0.004)))
    table = lr_sweep.choose_rates(load(tmp_path, {"extend": 0}))
    won = table[table["chosen"]].drop_duplicates("setting").set_index("setting")["lr"]
    assert won["normprop-b1"] == 0.004 and won["batchnorm-b1"] == 0.004 and won["normprop-b16"] == 0.01


def test_the_sweep_trains_its_own_seeds_for_its_own_epochs(tmp_path, fake):
    fake(peaked)
    cfg = load(tmp_path, {"seeds": [100, 105]})  # seeds need not be consecutive
    lr_sweep.choose_rates(cfg)
    specs = [s for r in fake.rounds for s in r]
    assert {s.seed for s in specs} == {100, 105} and all(int(s.cfg.seed) == s.seed for s in specs)
    assert all(s.name == f"{s.setting}-s{s.seed}" and s.name.startswith("sweep-") for s in specs)
    assert all(int(s.cfg.train.epochs) == 1 and int(s.cfg.train.lr_halve_every) == 1 for s in specs)
    assert all(s.cfg.train.get("eval_test", False) is False for s in specs)  # the test set unscored, where offered
    runs = {p.name for p in (tmp_path / "results" / "batch-size" / "synthetic" / "runs").iterdir()}
    assert not any(name.endswith(("-s0", "-s1")) for name in runs)


@pytest.mark.parametrize(
    "sweep, more, message",
    [
        ({"seeds": [1, 100]}, {}, "experiment.lr_sweep.seeds=[1, 100]: 1 among the reported runs' seeds 0..1"),
        ({"seeds": [100]}, {}, "must list at least 2 distinct whole-number seeds"),
        ({"seeds": [100, 100]}, {}, "must list at least 2 distinct"),
        ({"epochs": 4}, {"train": {"epochs": 10}}, "epochs=4 is under half the reported runs' 10 epochs"),
        ({"points": 2}, {}, "points=2 must be an odd whole number"),
        ({"step": 1.0}, {}, "step=1.0 must be a ratio above 1"),
        ({"factors": [1.0]}, {}, "has factors beside step"),
    ],
)
def test_a_bad_sweep_is_one_clear_error_before_anything_trains(tmp_path, fake, sweep, more, message):
    fake(peaked)
    cfg = load(tmp_path, sweep)
    for key, value in more.items():
        cfg[key].merge_with(value)
    with pytest.raises(UserError, match=re.escape(message)) as err:
        lr_sweep.choose_rates(cfg)
    assert "\n" not in str(err.value) and fake.rounds == []


def test_the_factors_policy_is_unchanged(tmp_path, fake):
    fake(peaked)
    cfg = load(tmp_path)
    cfg.experiment.lr_sweep = {"factors": [0.5, 1.0, 2.0], "epochs": 1}
    table = lr_sweep.choose_rates(cfg)
    sweep = tmp_path / "results" / "batch-size" / "synthetic"
    assert list(table.columns) == SWEEP and list(pd.read_csv(sweep / "lr_sweep.csv").columns) == SWEEP
    assert len(fake.rounds) == 1 and len(table) == 9 and set(table["seed"]) == {0}  # the first seed
    assert table["setting"].tolist() == ["normprop-b1"] * 3 + ["normprop-b16"] * 3 + ["batchnorm-b1"] * 3
    assert table["lr"].tolist() == pytest.approx([0.001, 0.002, 0.004, 0.01, 0.02, 0.04, 0.001, 0.002, 0.004])
    assert table.loc[table["chosen"], "lr"].tolist() == [0.002, 0.04, 0.001]
    assert not (sweep / "lr_sweep.png").exists()
    assert lr_sweep.edge_choices(table)["setting"].tolist() == ["normprop-b16", "batchnorm-b1"]
    grid = {e.id: e.set["train.lr"] for e in lr_sweep.with_rates(cfg, table).grid}
    assert grid == {"normprop-b1": 0.002, "normprop-b16": 0.04, "batchnorm-b1": 0.001}


def test_plot_sweep_draws_a_panel_per_batch_size(tmp_path, fake, drawn):
    fake(peaked)
    cfg = load(tmp_path)
    lr_sweep.choose_rates(cfg, label=lambda m: m.upper())
    sweep = tmp_path / "results" / "batch-size" / "synthetic"
    assert (sweep / "lr_sweep.png").exists()
    fig = drawn["lr_sweep"]
    assert [ax.get_title() for ax in fig.axes] == ["batch size 1", "batch size 16"]
    assert all(ax.get_xscale() == "log" for ax in fig.axes)
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"NORMPROP", "BATCHNORM", "chosen rate"} <= set(texts)
    assert "mean of 2 seeds" in fig.get_suptitle()
    (sweep / "lr_sweep.png").unlink()
    assert lr_sweep.plot_sweep(cfg)[0].exists()  # from lr_sweep.csv alone


def test_the_steps_policy_trains_on_the_smoke_preset(tmp_path):
    """Real runs: one setting, one rate, two sweep seeds, one epoch."""
    cfg = load(tmp_path, {"points": 1, "extend": 0}, quiet=True)
    cfg.grid = [e for e in cfg.grid if e.id == "normprop-b16"]
    table = lr_sweep.choose_rates(cfg)
    assert table["seed"].tolist() == [100, 101] and (table["epochs"] == 1).all()
    assert table["score"].iloc[0] == pytest.approx(table["val_acc"].mean())
    metrics = pd.read_csv(tmp_path / "results" / "batch-size" / "synthetic" / "runs" /
                          "sweep-normprop-b16-lr0.02-s100" / "metrics.csv")  # fmt: skip
    assert len(metrics) == 1 and metrics["val_acc"].notna().all()
    if "eval_test" in cfg.train:
        assert metrics["test_acc"].isna().all()
