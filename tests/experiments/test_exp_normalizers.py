"""The normalizers experiment: every method at every batch size at the rate its sweep chose, ranked per
batch size against the reference (NormProp), with the population drift and BN's mode gap at batch 1."""

import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import open_dict
from torch import nn
from typer.testing import CliRunner

from normprop_cli import config, statistics
from normprop_cli.cli import app
from normprop_cli.errors import UserError
from normprop_cli.experiments import grid, normalizers
from normprop_cli.experiments.normalizers.tables import ACCURACY_DIFFERENCE
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


def test_rows_whose_runs_are_not_finished_are_named_as_from_an_earlier_training(sweep, tmp_path):
    import shutil

    copy = tmp_path / "results" / "normalizers" / "synthetic"
    shutil.copytree(sweep, copy, ignore=shutil.ignore_patterns("*.pt", "*.lock"))
    cfg = grid.load("normalizers", preset="smoke", overrides=["results_dir=" + str(copy.parents[1])])
    assert "Not yet retrained" not in "\n".join(normalizers.paragraphs(cfg))
    for run in ("groupnorm-b1-s0", "groupnorm-b8-s0"):
        shutil.rmtree(copy / "runs" / run)  # removed to retrain
    text = "\n".join(normalizers.paragraphs(cfg))
    assert "*Not yet retrained.* 2 of the 12 rows of `summary.csv` (GroupNorm) name runs" in text
    metrics = copy / "runs" / "batchnorm-b1-s0" / "metrics.csv"  # retrained since: other numbers
    m = pd.read_csv(metrics)
    m.loc[m.index[-1], "test_acc"] += 1.0
    m.to_csv(metrics, index=False)
    text = "\n".join(normalizers.paragraphs(cfg))
    assert "*Not yet retrained.* 3 of the 12 rows of `summary.csv` (BatchNorm, GroupNorm) name runs" in text


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


def test_extra_seeds_give_one_setting_more_seeds_and_an_unknown_setting_is_refused():
    """experiment.extra_seeds (set in a preset's YAML, e.g. normalizers_fashion.yaml)."""
    from omegaconf import OmegaConf

    from normprop_cli.engine import expand_grid

    cfg = grid.load("normalizers", preset="quick")
    with open_dict(cfg):
        cfg.experiment.extra_seeds = {"normprop-icml-b10": 2}
        cfg.grid = OmegaConf.create(grid.method_grid(cfg.experiment))
    seeds = {}
    for spec in expand_grid(cfg):
        seeds.setdefault(spec.setting, []).append(spec.seed)
    n = int(cfg.seeds)
    assert seeds["normprop-icml-b10"] == list(range(n + 2))  # the seeds after the others', not new ones
    assert all(v == list(range(n)) for k, v in seeds.items() if k != "normprop-icml-b10")
    with open_dict(cfg):
        cfg.experiment.extra_seeds = {"nope-b10": 2}
    with pytest.raises(UserError, match="experiment.extra_seeds names nope-b10, not settings of the grid"):
        grid.method_grid(cfg.experiment)


def test_welch_reading_matches_the_interval():
    diff, low, high, p = statistics.welch([90.0, 91.0, 92.0], [80.0, 81.5, 82.0], bounds=ACCURACY_DIFFERENCE)
    assert diff == pytest.approx(91.0 - 81.1666666) and 0 < low < diff < high and 0 < p < 0.05
    assert normalizers.reading(low, high) == "better"
    assert normalizers.reading(-3.0, -1.0) == "worse" and normalizers.reading(-1.0, 2.0) == "indistinguishable"


def test_bonferroni_widens_every_interval_and_differences_stay_in_range():
    """m comparisons with the reference hold together at 95%: each interval at 1 - 0.05/m is wider than
    at 95%; a difference of accuracies stays within [-100, 100]."""
    a, b = [90.0, 91.0, 92.0], [80.0, 81.5, 82.0]
    _, low, high, _ = statistics.welch(a, b, bounds=ACCURACY_DIFFERENCE)
    _, low10, high10, _ = statistics.welch(a, b, level=1 - 0.05 / 10, bounds=ACCURACY_DIFFERENCE)
    assert low10 < low and high10 > high
    _, lo, hi, _ = statistics.welch([99.9, 5.0, 99.0], [1.0, 0.5, 0.2], level=0.999, bounds=ACCURACY_DIFFERENCE)
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


def summary_of(accuracies: dict, train_mode: dict | None = None) -> pd.DataFrame:
    """summary.csv's rows for {(batch size, method): [final test accuracy per seed]}, no training; None is a
    run that diverged. `train_mode`: {(batch size, method): [training-mode accuracy per seed]}."""
    rows = []
    for (bs, method), values in accuracies.items():
        for seed, acc in enumerate(values):
            gone = acc is None
            row = {"run": f"{method}-b{bs}-s{seed}", "setting": f"{method}-b{bs}", "normalizer": method,
                   "batch_size": bs, "initial_lr": 0.01, "status": "diverged" if gone else "complete",
                   "learned": not gone, "final_test_acc": math.nan if gone else acc,
                   "best_val_test_acc": math.nan if gone else acc, "step_ms": 1.0, "drift": 0.5}  # fmt: skip
            if train_mode and (bs, method) in train_mode:
                row |= {"train_mode_acc": train_mode[bs, method][seed], "eval_mode_acc": acc}
            rows.append(row)
    return pd.DataFrame(rows)


REF, GN, LN = [80.0, 81.0, 83.0], [84.0, 86.0, 85.0], [70.0, 72.0, 71.0]


def written(tmp_path, summary: pd.DataFrame):
    """The smoke config on `tmp_path`, with normalizers.csv formed from `summary` (tables.table)."""
    from normprop_cli.experiments.tables import write

    cfg = config.load("normalizers", preset="smoke", results_dir=tmp_path)
    write(cfg, "summary", summary)
    write(cfg, "normalizers", normalizers.table(cfg, summary))
    return cfg


def test_the_correction_sentence_says_welch_in_pp_bonferroni_over_the_tables_comparisons(tmp_path):
    """3 comparisons: two at batch 1, one at batch 8 (LayerNorm there has one run that did not diverge, so it
    is not compared); the report says Welch, pp, Bonferroni and 3 as the table has them, and no Holm."""
    once = [None, None, 75.0]
    summary = summary_of({(1, "normprop-icml"): REF, (1, "groupnorm"): GN, (1, "layernorm"): LN,
                          (8, "normprop-icml"): REF, (8, "groupnorm"): GN, (8, "layernorm"): once})  # fmt: skip
    cfg = written(tmp_path, summary)
    table = normalizers.read_table(cfg)
    assert int(table["compared"].sum()) == 3 == normalizers.comparisons(summary, "normprop-icml")
    assert table["diff_level"].eq(1 - 0.05 / 3).all()
    text = "\n".join(normalizers.paragraphs(cfg))
    assert "Welch" in text and "in pp" in text and "Bonferroni-corrected over the 3 comparisons" in text
    assert "(2 at batch 1, 1 at batch 8)" in text and "1 - 0.05/3 = 98.33%" in text
    assert "Holm" not in text and "MDD (pp)" in text
    assert "[98.33% Welch CI]" in text
    assert "At batch 8, no method was shown to beat NormProp (ICML), which means only that none was shown to" in text
    everywhere = summary_of({(b, m): a for b in (1, 8) for m, a in (("normprop-icml", REF), ("groupnorm", GN),
                                                                     ("layernorm", LN))})  # fmt: skip
    text = "\n".join(normalizers.paragraphs(written(tmp_path / "b", everywhere)))
    assert "(2 methods x 2 batch sizes)" in text and "1 - 0.05/4 = 98.75%" in text


def test_mdd_is_the_welch_power_formula_at_the_corrected_level(tmp_path):
    from scipy import stats

    summary = summary_of({(1, "normprop-icml"): REF, (1, "groupnorm"): GN, (1, "layernorm"): [None, 71.0, 75.0]})
    cfg = written(tmp_path, summary)
    table = normalizers.read_table(cfg).set_index("normalizer")
    a, b, k = np.array(GN), np.array(REF), 2
    va, vb = a.var(ddof=1) / 3, b.var(ddof=1) / 3
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    hand = (stats.t.ppf(1 - 0.05 / (2 * k), df) + stats.t.ppf(0.8, df)) * math.sqrt(va + vb)
    assert table.loc["groupnorm", "mdd"] == pytest.approx(hand, rel=1e-9)
    assert table.loc["groupnorm", "diff_high"] - table.loc["groupnorm", "diff_vs_reference"] < hand  # wider than CI
    assert math.isnan(table.loc["normprop-icml", "mdd"])
    assert table.loc["layernorm", "mdd"] == pytest.approx(normalizers.tables.mdd([71.0, 75.0], REF, 1 - 0.05 / k))
    text = "\n".join(normalizers.paragraphs(cfg))
    assert f"{hand:.2f}" in text and "(MDD) ranges from" in text


def test_forest_plot_has_a_panel_per_batch_size_ranked_by_difference_and_survives_a_diverged_method(tmp_path, drawn):
    """One panel per batch size, methods bottom to top by their difference from NormProp, a line at 0;
    BatchNorm at batch 1 in both modes (two markers); LayerNorm, every run diverged at batch 8, left out
    and named."""
    from normprop_cli.experiments.normalizers.figures import forest

    summary = summary_of({(1, "normprop-icml"): REF, (1, "groupnorm"): GN, (1, "layernorm"): LN,
                          (1, "batchnorm"): [40.0, 45.0, 35.0], (8, "normprop-icml"): REF, (8, "groupnorm"): LN,
                          (8, "batchnorm"): GN, (8, "layernorm"): [None, None, None]},
                         train_mode={(1, "batchnorm"): [70.0, 75.0, 72.0]})  # fmt: skip
    cfg = written(tmp_path, summary)
    cfg.figures = ["png", "pdf"]  # what every preset but smoke saves
    paths = forest(cfg)
    assert [p.suffix for p in paths] == [".png", ".pdf"] and all(p.exists() for p in paths)
    fig = drawn["normalizers"]
    panels = [ax for ax in fig.axes if ax.get_title().startswith("batch")]
    assert [ax.get_title().splitlines()[0] for ax in panels] == ["batch 1", "batch 8"]
    one, eight = panels
    assert [t.get_text() for t in one.get_yticklabels()] == ["BatchNorm", "LayerNorm", "GroupNorm"]
    assert [t.get_text() for t in eight.get_yticklabels()] == ["GroupNorm", "BatchNorm"]
    assert "left out" in eight.get_title() and "LayerNorm" in eight.get_title()
    markers = {line.get_marker() for line in one.get_lines()}
    assert {"s", "^", "o"} <= markers and "^" not in {line.get_marker() for line in eight.get_lines()}
    assert any(list(line.get_xdata()) == [0.0, 0.0] for line in one.get_lines())  # the line at 0
    assert "Bonferroni over 5 comparisons" in fig._suptitle.get_text()  # 3 at batch 1, 2 at 8


def test_forest_plot_of_a_table_whose_reference_diverged_says_so(tmp_path, drawn):
    from normprop_cli.experiments.normalizers.figures import forest

    summary = summary_of({(1, "normprop-icml"): [None, None, None], (1, "groupnorm"): GN})
    forest(written(tmp_path, summary))
    (ax,) = [ax for ax in drawn["normalizers"].axes if ax.get_title().startswith("batch")]
    assert "every run of NormProp (ICML) diverged" in ax.get_title()
    assert any("diverged" in t.get_text() for t in ax.texts)  # plots.note_if_empty
