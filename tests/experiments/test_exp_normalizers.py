"""The normalizers experiment: every method at every batch size at the rate its sweep chose, ranked per
batch size against the reference (NormProp), with the population drift and BN's mode gap at batch 1."""

import copy
import math

import pandas as pd
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from normprop_cli import config
from normprop_cli.cli import app
from normprop_cli.errors import UserError
from normprop_cli.experiments import grid, normalizers
from normprop_cli.nn import NIN
from normprop_cli.nn.methods import METHODS

# 24 images keep the batch-1 runs (one step per image) to seconds.
ARGS = ["--preset", "smoke", "--quiet", "dataset.limit=24"]


@pytest.fixture(scope="module")
def sweep(run_experiment):
    return run_experiment("normalizers", *ARGS) / "normalizers" / "synthetic"


def test_every_method_and_batch_size_is_ranked_at_its_chosen_rate(sweep):
    table = pd.read_csv(sweep / "normalizers.csv")
    assert list(table.columns) == normalizers.TABLE
    assert set(zip(table["batch_size"], table["normalizer"], strict=True)) == {
        (b, m) for b in (1, 8) for m in ("batchnorm", "groupnorm", "normprop-icml")
    }
    for _, g in table.groupby("batch_size"):
        assert list(g["rank"]) == [1, 2, 3]
        assert g["final_acc"].is_monotonic_decreasing
        assert g.loc[g["normalizer"] == "normprop-icml", "reading"].tolist() == ["reference"]
        others = g[g["normalizer"] != "normprop-icml"]
        assert set(others["reading"]) <= {"better", "worse", "indistinguishable", "no interval"}
    chosen = pd.read_csv(sweep / "lr_sweep.csv").query("chosen")
    rates = dict(zip(chosen["setting"], chosen["lr"], strict=True))
    summary = pd.read_csv(sweep / "summary.csv")
    assert (summary["initial_lr"] == summary["setting"].map(rates)).all()
    assert len(summary) == 12 and (summary["status"] == "complete").all()
    assert summary["drift"].map(math.isfinite).all() and (summary["step_ms"] > 0).all()


def test_only_batch_statistics_at_batch_1_get_the_mode_gap(sweep):
    gaps = pd.read_csv(sweep / "mode_gap.csv")
    assert set(gaps["setting"]) == {"batchnorm-b1"}
    assert gaps[["eval_mode_acc", "train_mode_acc"]].apply(lambda c: c.between(0, 100)).all().all()
    table = pd.read_csv(sweep / "normalizers.csv").set_index(["batch_size", "normalizer"])
    assert math.isfinite(table.loc[(1, "batchnorm"), "mode_gap"])
    assert math.isnan(table.loc[(1, "groupnorm"), "mode_gap"]) and math.isnan(table.loc[(8, "batchnorm"), "mode_gap"])


def test_the_report_ranks_and_names_who_beats_normprop(sweep):
    cfg = grid.load("normalizers", preset="smoke", overrides=["results_dir=" + str(sweep.parents[1])])
    text = "\n".join(normalizers.paragraphs(cfg))
    assert text.count("| rank | method |") == 2 and "At batch 1, " in text and "At batch 8, " in text
    assert "training minus evaluation mode" in text
    assert len(normalizers.headlines(cfg)) >= 2


def test_method_grid_builds_every_method_from_the_registry():
    cfg = grid.load("normalizers", preset="quick")
    ids = [e.id for e in cfg.grid]
    assert len(ids) == len(METHODS) * 2 and len(set(ids)) == len(ids)  # batch 1 and 10
    by_id = {e.id: e.set for e in cfg.grid}
    assert by_id["normprop-arxiv-b10"]["model.jacobian"] == "init"
    assert by_id["weightnorm-b1"]["model.data_init"] is True
    assert by_id["none-b10"]["train.lr"] == pytest.approx(0.015 * 0.25)  # lr_scale
    assert by_id["groupnorm-b10"]["train.lr"] == pytest.approx(0.015)
    assert (by_id["groupnorm-b1"]["train.epochs"], by_id["groupnorm-b10"]["train.epochs"]) == (2, 4)  # per size
    with pytest.raises(UserError, match="experiment.methods: nope not known"):
        grid.load("normalizers", overrides=["experiment.methods=[nope]"])
    with pytest.raises(UserError, match="one per batch size"):
        grid.load("normalizers", overrides=["experiment.lr=[0.1]"])


def test_welch_reading_matches_the_interval():
    diff, low, high, p = normalizers.welch([90.0, 91.0, 92.0], [80.0, 81.5, 82.0])
    assert diff == pytest.approx(91.0 - 81.1666666) and 0 < low < diff < high and 0 < p < 0.05
    assert normalizers.reading(low, high) == "better"
    assert normalizers.reading(-3.0, -1.0) == "worse" and normalizers.reading(-1.0, 2.0) == "indistinguishable"


def test_bonferroni_widens_every_interval_and_differences_stay_in_range():
    """m comparisons with the reference hold together at 95%: each interval at 1 - 0.05/m is wider than
    at 95%; a difference of accuracies stays within [-100, 100]."""
    a, b = [90.0, 91.0, 92.0], [80.0, 81.5, 82.0]
    _, low, high, _ = normalizers.welch(a, b)
    _, low10, high10, _ = normalizers.welch(a, b, level=1 - 0.05 / 10)
    assert low10 < low and high10 > high
    _, lo, hi, _ = normalizers.welch([99.9, 5.0, 99.0], [1.0, 0.5, 0.2], level=0.999)
    assert -100.0 <= lo and hi <= 100.0
    summary = pd.DataFrame({"batch_size": [1] * 6 + [8] * 6, "normalizer": ["a", "a", "b", "b", "ref", "ref"] * 2,
                            "final_test_acc": [50.0] * 12, "status": ["complete"] * 12})  # fmt: skip
    assert normalizers.comparisons(summary, "ref") == 4  # a and b, at two batch sizes


def test_mode_gap_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    net = NIN(num_classes=10, width=0.0625, norm="batchnorm")
    net.train()
    net(torch.randn(8, 3, 32, 32))  # running estimates away from (0, 1)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x, y = torch.randn(6, 3, 32, 32), torch.randint(0, 10, (6,))
    rows = normalizers.ModeGap().observe(net, lambda: iter([(x, y)]), epoch=1)
    assert set(rows[0]) == {"epoch", "eval_mode_acc", "train_mode_acc"}
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items()) and net.training


def test_mode_gap_counts_on_the_device_and_syncs_once(monkeypatch):
    """ModeGap's counts are those of scoring each image in turn, read back in one host sync at the end
    of its evaluation (not two per test image)."""
    torch.manual_seed(1)
    net = NIN(num_classes=3, width=0.0625, norm="batchrenorm")
    net.train()
    net(torch.randn(8, 3, 32, 32))
    data = [(torch.randn(5, 3, 32, 32), torch.randint(0, 3, (5,))) for _ in range(3)]
    probe, right = copy.deepcopy(net), [0, 0]
    with torch.no_grad():
        for x, y in data:  # the counts as the former code took them, one image (and two syncs) at a time
            right[0] += int((probe.eval()(x).argmax(1) == y).sum())
            for m in probe.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.train()
                    m.momentum = 0.0
            right[1] += sum(int(probe(x[i : i + 1]).argmax(1).item() == int(y[i])) for i in range(len(x)))
    syncs = []
    for name in ("item", "tolist", "cpu", "__bool__", "__int__", "__float__"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda t, *a, _n=name, _r=real, **k: syncs.append(_n) or _r(t, *a, **k))
    [row] = normalizers.ModeGap().observe(net, lambda: iter(data), epoch=1)
    monkeypatch.undo()
    assert syncs == ["tolist"]
    assert row["eval_mode_acc"] == 100.0 * right[0] / 15 and row["train_mode_acc"] == 100.0 * right[1] / 15


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.activation=tanh", "model.norm=frn takes model.activation=relu, not tanh"),
        ("model.data_init=true", None),  # frn with data_init: refused as well
    ],
)
def test_impossible_method_options_are_one_line_errors(tmp_path, override, message):
    args = ["run", "table1", "--preset", "smoke", "--quiet", "--results-dir", str(tmp_path / "r"),
            "model.norm=frn", override, "grid=null"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert (message or "data_init") in result.output
    assert not (tmp_path / "r").exists()


def test_the_report_names_rates_at_an_edge_and_rates_chosen_among_chance_scores(tmp_path):
    """A chosen rate still at an edge is named with the rates tried; a setting whose every rate scored
    near chance is said to have an arbitrary rate."""
    from normprop_cli.experiments.normalizers.findings import edges
    from normprop_cli.experiments.tables import write

    cfg = config.load("normalizers", preset="smoke", results_dir=tmp_path)
    rows = []
    for setting, method, scores in (("groupnorm-b8", "groupnorm", [40.0, 60.0, 70.0]),
                                    ("batchnorm-b1", "batchnorm", [10.0, 11.0, 9.0]),
                                    ("normprop-icml-b8", "normprop-icml", [50.0, 70.0, 60.0])):  # fmt: skip
        for lr, score in zip((0.01, 0.02, 0.04), scores, strict=True):
            top = score == max(scores)
            rows.append({"setting": setting, "method": method, "batch_size": int(setting.rsplit("-b", 1)[1]),
                         "lr": lr, "seed": 100, "epochs": 1, "val_acc": score, "val_loss": 1.0, "chosen": top,
                         "score": score, "at_edge": top and lr in (0.01, 0.04)})  # fmt: skip
    write(cfg, "lr_sweep", pd.DataFrame(rows))
    text = edges(cfg)
    assert "GroupNorm at batch 8: 0.04, the highest rate tried (0.01 0.02 0.04)" in text
    assert "BatchNorm at batch 1" in text and "arbitrary" in text and "NormProp (ICML) at batch 8" not in text


def test_the_finding_says_none_was_shown_to_beat_the_reference_or_that_the_reference_diverged():
    import pandas as pd

    from normprop_cli.experiments.normalizers.findings import _finding

    g = pd.DataFrame(
        {
            "normalizer": ["normprop-icml", "batchnorm", "layernorm"],
            "final_acc": [80.0, 81.0, 70.0],
            "diff_vs_reference": [0.0, 1.0, -10.0],
            "diff_low": [0.0, -1.0, -12.0],
            "diff_high": [0.0, 3.0, -8.0],
            "reading": ["reference", "indistinguishable", "worse"],
        }
    )
    text = _finding(g, 1, "NormProp", "normprop-icml")
    assert text.startswith("At batch 1, no method was shown to beat NormProp") and "beats" not in text
    g.loc[0, "final_acc"] = float("nan")  # every run of the reference diverged
    assert _finding(g, 1, "NormProp", "normprop-icml") == (
        "At batch 1, every run of NormProp diverged: no method is compared with it."
    )
