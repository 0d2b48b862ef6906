"""Intervals of accuracies stay inside [0, 100], diverged runs are counted apart, "did not learn" holds
only where a run failed in every mode it is scored in, and the timing table's ratio (paired by round) is the
verdict's."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from normprop_cli import config, outcomes, statistics
from normprop_cli.engine.runs import sweep_dir
from normprop_cli.experiments import batch_size, data_norm, normalizers, table1, tables, timing
from normprop_cli.verdicts import measures, rule
from normprop_cli.verdicts import rounds as pairing

BIMODAL = [[10.0, 10.0, 95.0, 96.0, 97.0], [0.0, 100.0, 100.0], [97.0, 99.0, 100.0, 100.0], [0.0, 0.0, 5.0]]


# ---- the interval of a proportion ------------------------------------------------------------------


@pytest.mark.parametrize("values", BIMODAL)
def test_the_interval_of_an_accuracy_stays_within_0_and_100_and_holds_its_mean(values):
    ci = statistics.proportion_ci(values)
    assert 0.0 <= ci["ci_low"] <= ci["mean"] <= ci["ci_high"] <= 100.0
    assert ci["ci_low"] < ci["ci_high"]
    assert ci["mean"] == pytest.approx(np.mean(values)) and ci["n"] == len(values)


def test_the_student_t_interval_of_the_same_bimodal_values_leaves_the_range():
    """Why accuracies need their own interval: the plain t interval passes 0 and 100 here."""
    t = statistics.mean_ci(BIMODAL[0])
    assert t["ci_high"] > 100.0
    assert statistics.mean_ci(BIMODAL[1])["ci_low"] < 0.0


def test_the_interval_is_the_t_interval_on_the_logit_scale_of_the_mean():
    x = np.array(BIMODAL[0]) / 100.0
    p, se = x.mean(), x.std(ddof=1) / math.sqrt(len(x))
    half = stats.t.ppf(0.975, len(x) - 1) * se / (p * (1 - p))
    logit = math.log(p / (1 - p))
    expected = [100.0 / (1.0 + math.exp(-(logit + s * half))) for s in (-1, 1)]
    ci = statistics.proportion_ci(BIMODAL[0])
    assert [ci["ci_low"], ci["ci_high"]] == pytest.approx(expected, rel=1e-9)


def test_far_from_the_bounds_it_is_close_to_the_t_interval():
    values = [50.0, 50.5, 51.0, 49.5, 50.2]
    logit, t = statistics.proportion_ci(values), statistics.mean_ci(values)
    assert logit["ci_low"] == pytest.approx(t["ci_low"], abs=0.01)
    assert logit["ci_high"] == pytest.approx(t["ci_high"], abs=0.01)


def test_the_t_intervals_of_the_verdicts_and_the_tables_are_scipys_to_the_last_bit():
    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 10):
        x, y = rng.normal(1.0, 3.0, n), rng.normal(0.0, 3.0, n)
        one, rel = stats.ttest_1samp(x, 0.0).confidence_interval(0.95), stats.ttest_rel(x, y).confidence_interval(0.9)
        assert statistics.t_interval(x) == (float(x.mean()), float(one.low), float(one.high))
        row = statistics.mean_ci(x, 0.9)  # a table's row: the same interval as a verdict's
        assert (row["mean"], row["ci_low"], row["ci_high"]) == statistics.t_interval(x, 0.9) and row["n"] == n
        assert statistics.paired_interval(x, y, 0.9) == (float((x - y).mean()), float(rel.low), float(rel.high))
    mean, low, high = statistics.paired_interval([1.0, math.nan, 3.0], [0.0, 1.0, 1.0])
    assert math.isnan(mean) and math.isnan(low) and math.isnan(high)  # a pair is never dropped


def test_one_markdown_table_from_a_frame_or_from_rows():
    rows = [["a", 1], ["b", 2]]
    lines = ["| x | y |", "| --- | --- |", "| a | 1 |", "| b | 2 |"]
    assert statistics.markdown(rows, ["x", "y"]) == lines
    frame = pd.DataFrame(rows, columns=["x", "y"])
    assert statistics.markdown(frame, rule="---") == [lines[0], "|---|---|", *lines[2:]]


def test_one_value_has_no_interval_and_equal_values_have_no_width():
    assert math.isnan(statistics.proportion_ci([80.0])["ci_low"])
    assert statistics.proportion_ci([100.0, 100.0, 100.0]) == {
        "n": 3,
        "mean": 100.0,
        "sd": 0.0,
        "ci_low": 100.0,
        "ci_high": 100.0,
    }


# ---- curves and headlines: diverged runs left out and counted -------------------------------------------


def bimodal_epochs() -> pd.DataFrame:
    """Setting a: five seeds, s0 diverged after epoch 1; setting b: two learned, one failed."""
    rows = []
    for epoch in (1, 2):
        for seed, acc in enumerate([12.0, 90.0, 91.0, 93.0, 95.0]):
            if seed == 0 and epoch == 2:
                continue  # the diverged run has no rows after it diverged
            rows.append({"run": f"a-s{seed}", "method": "a", "epoch": epoch, "test_acc": acc + epoch})
        for seed, acc in enumerate([0.0, 99.0, 99.0]):
            rows.append({"run": f"b-s{seed}", "method": "b", "epoch": epoch, "test_acc": acc})
    return pd.DataFrame(rows)


def test_curves_leave_diverged_runs_out_of_every_epoch_and_count_them():
    c = tables.curves(bimodal_epochs(), ["method"], diverged={"a-s0"}).set_index(["method", "epoch"])
    assert list(c.columns) == tables.CURVE_COLUMNS[1:]
    assert c.loc[("a", 1), "n"] == 4 and c.loc[("a", 1), "diverged"] == 1  # its epoch before diverging too
    assert c.loc[("a", 1), "mean"] == pytest.approx(np.mean([91.0, 92.0, 94.0, 96.0]))
    assert c.loc[("a", 2), "n"] == 4 and c.loc[("a", 2), "diverged"] == 1
    assert (c.loc["b", "diverged"] == 0).all() and (c.loc["b", "n"] == 3).all()
    assert ((c["ci_low"] >= 0.0) & (c["ci_high"] <= 100.0)).all()
    everything = tables.curves(bimodal_epochs(), ["method"]).set_index(["method", "epoch"])
    assert everything.loc[("a", 1), "n"] == 5 and everything.loc[("a", 1), "diverged"] == 0


def test_a_setting_whose_every_run_diverged_keeps_its_epochs_with_no_mean():
    c = tables.curves(bimodal_epochs(), ["method"], diverged={"b-s0", "b-s1", "b-s2"}).set_index(["method", "epoch"])
    assert (c.loc["b", "n"] == 0).all() and (c.loc["b", "diverged"] == 3).all() and c.loc["b", "mean"].isna().all()


def summary_of(epochs: pd.DataFrame, diverged: set[str], **columns) -> pd.DataFrame:
    last = epochs.sort_values("epoch").groupby("run").tail(1)
    last = last if "setting" in last else last.assign(setting=last["method"])
    status = ["diverged" if run in diverged else "complete" for run in last["run"]]
    return last.assign(status=status, seed=last["run"].str[-1].astype(int),
                       final_test_acc=last["test_acc"], learned=last["test_acc"] > 15.0, **columns)  # fmt: skip


def write(cfg, name: str, frame: pd.DataFrame) -> None:
    sweep_dir(cfg).mkdir(parents=True, exist_ok=True)
    frame.to_csv(sweep_dir(cfg) / f"{name}.csv", index=False)


def test_curves_written_before_diverged_runs_were_left_out_are_formed_again(tmp_path):
    cfg = config.load("convergence", preset="smoke", results_dir=str(tmp_path))
    epochs = bimodal_epochs()
    write(cfg, "epochs", epochs)
    write(cfg, "summary", summary_of(epochs, {"a-s0"}))
    old = tables.curves(epochs, ["method"]).drop(columns="diverged")
    write(cfg, "curves", old)
    c = tables.read_curves(cfg, ["method"]).set_index(["method", "epoch"])
    assert c.loc[("a", 1), "n"] == 4 and c.loc[("a", 1), "diverged"] == 1


def test_data_norm_headlines_leave_diverged_runs_out_and_say_how_many(tmp_path):
    cfg = config.load("data-norm", preset="smoke", results_dir=str(tmp_path))
    accs = [96.0, 97.0, 8.0, 95.0]  # the third run diverged
    rows = [{"run": f"global-b100-s{s}", "setting": "global-b100", "method": "normprop", "seed": s,
             "status": "diverged" if s == 2 else "complete", "learned": acc > 15.0, "data_norm": "global",
             "batch_size": 100, "initial_lr": 0.08, "final_test_acc": acc, "best_test_acc": acc}
            for s, acc in enumerate(accs)]  # fmt: skip
    write(cfg, "summary", pd.DataFrame(rows))
    final = next(r for r in data_norm.headlines(cfg) if r["quantity"].startswith("final test accuracy"))
    ci = statistics.proportion_ci([96.0, 97.0, 95.0])
    assert "n = 3" in final["quantity"]
    assert final["reproduced"] == f"{statistics.format_mean_ci(ci)}; 1 of 4 runs diverged (left out)"
    assert "96.00" in final["reproduced"]


def test_table1_counts_diverged_runs_beside_the_error(tmp_path):
    cfg = config.load("table1", preset="smoke", results_dir=str(tmp_path))
    errors = [2.0, 3.0, 91.0]
    rows = [{"run": f"normprop-s{s}", "method": "normprop", "seed": s, "augment": "none",
             "status": "diverged" if s == 2 else "complete", "final_test_error": e, "learned": e < 85.0,
             "paper_test_error": math.nan} for s, e in enumerate(errors)]  # fmt: skip
    write(cfg, "summary", pd.DataFrame(rows))
    (row,) = [r for r in table1.headlines(cfg) if r["quantity"].startswith("final test error")]
    assert "n = 2" in row["quantity"] and row["reproduced"].startswith("2.50 [")
    assert row["reproduced"].endswith("; 1 of 3 runs diverged (left out)")


# ---- "did not learn" ----------------------------------------------------------------------------------


def test_a_run_that_learns_in_training_mode_only_did_learn():
    cfg = config.load("normalizers", preset="smoke")
    summary = pd.DataFrame({"run": ["bn-s0", "bn-s1", "none-s0"], "learned": [False, False, False],
                            "train_mode_acc": [97.0, 12.0, math.nan]})  # fmt: skip
    assert tables.learned_in_a_mode(summary, cfg).tolist() == [True, False, False]
    assert outcomes.learned_flags(summary).tolist() == [False, False, False]


def normalizer_summary() -> pd.DataFrame:
    """BatchNorm at batch 1: 98% in training mode, at or below chance in evaluation mode."""
    rows = []
    for s, (train, evaluation) in enumerate([(98.0, 4.5), (97.0, 9.0), (99.0, 6.0)]):
        rows.append({"run": f"batchnorm-b1-s{s}", "setting": "batchnorm-b1", "method": "batchnorm", "seed": s,
                     "status": "complete", "learned": False, "normalizer": "batchnorm", "batch_size": 1,
                     "initial_lr": 0.01, "step_ms": 1.0, "drift": 0.5, "best_val_test_acc": evaluation,
                     "final_test_acc": evaluation, "train_mode_acc": train, "eval_mode_acc": evaluation})  # fmt: skip
        rows.append({"run": f"normprop-icml-b1-s{s}", "setting": "normprop-icml-b1", "method": "normprop",
                     "seed": s, "status": "complete", "learned": True, "normalizer": "normprop-icml",
                     "batch_size": 1, "initial_lr": 0.01, "step_ms": 1.0, "drift": 5.0,
                     "best_val_test_acc": 95.0 + s, "final_test_acc": 95.0 + s, "train_mode_acc": math.nan,
                     "eval_mode_acc": math.nan})  # fmt: skip
    return pd.DataFrame(rows)


def test_normalizers_say_bn_at_batch_1_learns_in_training_mode_and_fails_in_evaluation_mode(tmp_path):
    cfg = config.load("normalizers", preset="smoke", results_dir=str(tmp_path))
    summary = normalizer_summary()
    write(cfg, "summary", summary)
    write(cfg, "normalizers", normalizers.table(cfg, summary))
    t = normalizers.table(cfg, summary).set_index("normalizer")
    assert t.loc["batchnorm", "learned"] == t.loc["batchnorm", "n"] == 3
    assert t.loc["batchnorm", "train_mode_acc"] == pytest.approx(98.0)
    assert t.loc["batchnorm", "eval_mode_acc"] == pytest.approx(6.5)
    assert t.loc["batchnorm", "eval_mode_low"] >= 0.0 and t.loc["batchnorm", "train_mode_high"] <= 100.0
    assert tables.not_learned(cfg) == []  # the BN runs learned in training mode
    rows = normalizers.headlines(cfg)
    assert not any("did not learn" in r["quantity"] for r in rows)
    (modes,) = [r for r in rows if "in training mode" in r["quantity"]]
    assert "learns in training mode and fails in evaluation mode" in modes["reproduced"]
    assert modes["reproduced"].startswith("98.00 [") and " / 6.50 [" in modes["reproduced"]
    text = "\n".join(normalizers.paragraphs(cfg))
    assert "did not learn" not in text
    assert "BatchNorm 98.00 [" in text and "in training mode and 6.50 [" in text


def test_the_runs_that_did_not_learn_are_named_with_the_right_words(tmp_path):
    cfg = config.load("normalizers", preset="smoke", results_dir=str(tmp_path))
    summary = normalizer_summary()
    summary.loc[summary["run"] == "batchnorm-b1-s1", "train_mode_acc"] = 11.0  # fails in both modes
    write(cfg, "summary", summary)
    (row,) = tables.not_learned(cfg)
    assert row["reproduced"] == "1 of 6: batchnorm-b1-s1"
    assert "at or below chance + 5 points in every mode" in row["quantity"] and "chance is 10%" in row["quantity"]
    assert "within" not in row["quantity"]


def test_batch_size_says_bn_at_batch_1_did_not_learn_in_evaluation_mode_below_chance(tmp_path):
    cfg = config.load("batch-size", preset="smoke", results_dir=str(tmp_path))
    rows = []
    for s, acc in enumerate([4.0, 5.0]):
        rows.append({"run": f"batchnorm-b1-s{s}", "setting": "batchnorm-b1", "method": "batchnorm", "seed": s,
                     "batch_size": 1, "initial_lr": 0.01, "label": batch_size.label("batchnorm", 1, 0.01),
                     "epoch": 1, "updates": 24, "test_acc": acc})  # fmt: skip
    epochs = pd.DataFrame(rows)
    write(cfg, "curves", tables.curves(epochs, batch_size.KEYS, carry=["updates"]))
    write(cfg, "summary", summary_of(epochs, set()))
    (row,) = [r for r in batch_size.headlines(cfg) if r["quantity"].startswith("final test accuracy")]
    assert row["reproduced"] == "did not learn in evaluation mode (4.50%; chance is 10%)"


# ---- C6: the timing table's ratio is the verdict's, paired round by round ---------------------------------


def rounds_of(seconds: dict, process: dict | None = None) -> pd.DataFrame:
    """rounds.csv of {(method, seed): [seconds of round 1 (the warm-up), 2, ...]}, every round in one
    process but those named in `process` = {(method, seed, round): process}."""
    rows = [{"run": f"{m}-s{s}", "method": m, "seed": s, "round": r, "position": 1, "order": "", "timed": r > 1,
             "process": (process or {}).get((m, s, r), "a"), "train_seconds": v, "finished": 0.0}
            for (m, s), values in seconds.items() for r, v in enumerate(values, 1)]  # fmt: skip
    return pd.DataFrame(rows)[pairing.ROUND_COLUMNS]


def epochs_of(rounds: pd.DataFrame) -> pd.DataFrame:
    epochs = rounds.rename(columns={"round": "epoch"})[["run", "method", "seed", "epoch", "train_seconds"]]
    return epochs.assign(images_per_second=1 / epochs["train_seconds"], device="cpu", host="h")


def summary_of_rounds(rounds: pd.DataFrame, diverged=()) -> pd.DataFrame:
    runs = rounds.drop_duplicates("run")[["run", "method", "seed"]]
    status = runs["run"].map(lambda r: "diverged" if r in diverged else "complete")
    return runs.assign(status=status, device="cpu", median_train_seconds=1.0)


def c6(tmp_path, rounds: pd.DataFrame, summary: pd.DataFrame):
    rounds.to_csv(tmp_path / "rounds.csv", index=False)
    summary.to_csv(tmp_path / "summary.csv", index=False)
    claim = next(c for c in rule.claims() if c.id == "C6")
    measured = measures.c6_timing(claim, tmp_path, {"dataset": "digits"})
    return measured, measured.estimate(measured.table)


def test_the_paired_ratio_of_a_hand_made_rounds_table_is_the_hand_computation(tmp_path):
    """Round 1 is the warm-up. Seed 2's round 3 was finished by another process (process b): no pair.
    Seed 3's BatchNorm run diverged: that seed has no pair."""
    seconds = {("normprop", 0): [9.0, 1.0, 1.2], ("batchnorm", 0): [9.0, 1.5, 1.6],
               ("normprop", 1): [9.0, 0.8, 0.9], ("batchnorm", 1): [9.0, 1.0, 1.2],
               ("normprop", 2): [9.0, 2.0, 1.0], ("batchnorm", 2): [9.0, 2.2, 1.4],
               ("normprop", 3): [9.0, 0.1, 0.1], ("batchnorm", 3): [9.0, 5.0, 5.0],
               ("none", 0): [9.0, 1.0, 1.0]}  # fmt: skip
    rounds = rounds_of(seconds, process={("normprop", 2, 3): "b"})
    summary = summary_of_rounds(rounds, diverged={"batchnorm-s3"})
    per_seed = [(1.0 / 1.5 + 1.2 / 1.6) / 2, (0.8 / 1.0 + 0.9 / 1.2) / 2, 2.0 / 2.2]  # NormProp / BN, median
    ratio = math.prod(per_seed) ** (1 / 3)
    assert pairing.paired_ratio(rounds, "normprop", "batchnorm", summary["run"][summary["status"] == "complete"]) == (
        pytest.approx(ratio, rel=1e-12), 3, 5)  # fmt: skip
    table = timing.timing_table(epochs_of(rounds), 1, {"normprop": 84.0, "batchnorm": 96.0}, summary, rounds)
    table = table.set_index("method")
    assert table.loc["normprop", "ratio_vs_batchnorm"] == pytest.approx(ratio, rel=1e-12)
    assert table.loc["normprop", ["seeds_vs_batchnorm", "rounds_vs_batchnorm"]].tolist() == [3, 5]
    assert table.loc["batchnorm", "ratio_vs_batchnorm"] == pytest.approx(1.0)
    assert table.loc["none", "seeds_vs_batchnorm"] == 1  # no normalisation ran on seed 0 alone
    measured, estimate = c6(tmp_path, rounds, summary)
    logs = -np.log(per_seed)  # log(BatchNorm / NormProp) per seed
    half = stats.t.ppf(0.975, 2) * logs.std(ddof=1) / math.sqrt(3)
    assert estimate.n_seeds == 3 and estimate.effect == pytest.approx(1 - ratio, rel=1e-12)
    assert (estimate.ci_low, estimate.ci_high) == pytest.approx(
        (1 - math.exp(-(logs.mean() - half)), 1 - math.exp(-(logs.mean() + half))), rel=1e-12)  # fmt: skip
    assert measured.test == pairing.TEST and "same round" in measured.test


def test_a_slowdown_common_to_a_round_leaves_the_paired_ratio_and_moves_the_unpaired_one(tmp_path):
    """The machine slows down three-fold during seed 0's round 2, for every method of that round: the
    ratio paired by round stays, the ratio of the runs' median seconds (unpaired) and of the pooled
    medians move."""
    seconds = {("normprop", 0): [2.0, 1.0, 1.1, 1.2], ("batchnorm", 0): [2.0, 1.5, 1.3, 1.4],
               ("normprop", 1): [2.0, 0.9, 1.0, 1.1], ("batchnorm", 1): [2.0, 1.2, 1.2, 1.3],
               ("normprop", 2): [2.0, 1.1, 1.0, 1.0], ("batchnorm", 2): [2.0, 1.3, 1.2, 1.1]}  # fmt: skip
    calm = rounds_of(seconds)
    slow = rounds_of({key: [v * (3.0 if key[1] == 0 and r == 2 else 1.0) for r, v in enumerate(values, 1)]
                      for key, values in seconds.items()})  # fmt: skip
    paper = {"normprop": 84.0, "batchnorm": 96.0}
    paired, unpaired, pooled, effects = [], [], [], []
    for rounds in (calm, slow):
        summary = summary_of_rounds(rounds)
        table = timing.timing_table(epochs_of(rounds), 1, paper, summary, rounds).set_index("method")
        paired.append(table.loc["normprop", "ratio_vs_batchnorm"])
        pooled.append(table.loc["normprop", "pooled_ratio_vs_batchnorm"])
        medians = rounds[rounds["timed"]].groupby(["method", "seed"])["train_seconds"].median()
        unpaired.append(np.exp(np.log(medians["normprop"] / medians["batchnorm"]).mean()))
        effects.append(c6(tmp_path, rounds, summary)[1].effect)
    assert paired[0] == pytest.approx(paired[1], rel=1e-12) and effects[0] == pytest.approx(effects[1], rel=1e-12)
    assert abs(unpaired[1] - unpaired[0]) > 0.01 and abs(pooled[1] - pooled[0]) > 0.01
