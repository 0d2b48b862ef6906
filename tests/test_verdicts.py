"""The verdict rule, the halves rule, and each claim's effect on small constructed CSVs (the rule's
edge cases, the relative margins and the interval levels: test_rule_*.py)."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from normprop_cli import verdicts as V
from normprop_cli.verdicts import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED

SUP, NONINF = V.SUPERIORITY, V.NON_INFERIORITY


# ---- the rule -------------------------------------------------------------------------------------


def test_superiority_needs_the_whole_interval_on_one_side_of_zero():
    assert V.verdict(SUP, 0.5, 1.5) == REPRODUCED  # a clear win
    assert V.verdict(SUP, -2.0, -1.0) == NOT_REPRODUCED  # a clear loss
    assert V.verdict(SUP, -1.0, 1.0) == INCONCLUSIVE  # overlaps 0


def test_non_inferiority_compares_the_interval_with_minus_the_margin():
    assert V.verdict(NONINF, -0.5, 0.5, margin=1.0) == REPRODUCED  # as good, within 1
    assert V.verdict(SUP, -0.5, 0.5) == INCONCLUSIVE  # the same interval is no win
    assert V.verdict(NONINF, -2.5, -1.5, margin=1.0) == NOT_REPRODUCED  # worse by more than 1
    assert V.verdict(NONINF, -1.5, 0.5, margin=1.0) == INCONCLUSIVE  # straddles -1
    assert V.verdict(NONINF, -1.5, 0.5, margin=2.0) == REPRODUCED


def test_fewer_than_two_seeds_or_no_interval_is_inconclusive():
    assert V.verdict(SUP, 0.5, 1.5, n_seeds=1) == INCONCLUSIVE
    assert V.verdict(SUP, math.nan, math.nan) == INCONCLUSIVE


def test_halves_split_the_sorted_distinct_seeds():
    assert V.halves([3, 1, 2, 2, 0]) == ([0, 1], [2, 3])
    assert V.halves([4, 0, 1, 2, 3]) == ([0, 1], [2, 3, 4])
    assert V.halves([7]) == ([], [7])


def claim(kind=SUP, margin=0.0):
    return V.Claim("CX", "a claim", "here", "exp", kind, margin, "pp", "")


def judged(half_a, half_b=(5.0, 5.1, 4.9, 5.2)):
    """judge() of a superiority claim on 8 seeds: per-seed differences half_a (seeds 0-3), half_b (4-7)."""
    table = pd.DataFrame({"seed": range(8), "normprop": [*half_a, *half_b], "baseline": 0.0})
    return V.judge(claim(), V.Measurement(table, V.one_sample(+1), "t"))


def test_the_halves_rule_in_judge_downgrades_only_a_real_disagreement():
    # all eight seeds: an interval above 0; seeds 0-3 alone lie below 0 on average (inconclusive)
    row = judged([-0.2, -0.1, -0.3, 0.0])
    assert (
        V.one_sample(+1)(
            pd.DataFrame({"normprop": [-0.2, -0.1, -0.3, 0.0, 5.0, 5.1, 4.9, 5.2], "baseline": 0.0})
        ).ci_low
        > 0
    )
    assert (row["verdict_half_a"], row["verdict_half_b"]) == (INCONCLUSIVE, REPRODUCED)
    assert (row["verdict"], row["halves"]) == (INCONCLUSIVE, "estimates on opposite sides of 0")
    # the same with seeds 0-3 above 0 on average: one conclusive and one inconclusive half agree
    row = judged([0.2, 0.1, 0.3, 0.0])
    assert (row["verdict_half_a"], row["verdict_half_b"]) == (INCONCLUSIVE, REPRODUCED)
    assert (row["verdict"], row["halves"]) == (REPRODUCED, V.AGREE)
    # seeds 0-3 clearly below 0: opposite conclusive verdicts, though all seeds lie above 0
    row = judged([-0.5, -0.51, -0.49, -0.5], [10.0, 10.1, 9.9, 10.2])
    assert (row["verdict_half_a"], row["verdict_half_b"]) == (NOT_REPRODUCED, REPRODUCED)
    assert (row["verdict"], row["halves"]) == (INCONCLUSIVE, V.OPPOSITE_VERDICTS)
    # halves that agree keep the all-seeds verdict
    row = judged([10.0, 10.2, 9.8, 10.1], [9.9, 10.0, 10.3, 9.7])
    assert row["verdict"] == row["verdict_half_a"] == row["verdict_half_b"] == REPRODUCED
    assert row["halves"] == V.AGREE and row["margin"] == 0.0


def test_rule_text_states_every_kind_level_and_margin():
    text = V.rule_text()
    for c in V.claims():
        if c.relative_to:
            assert f"{c.id} {c.margin:g} × {c.relative_to}" in text
    for kind in (SUP, NONINF, V.EQUIVALENCE):
        ids = ", ".join(c.id for c in V.claims() if c.kind == kind)
        assert f"({kind}: {ids}) reads the {V.level_of(kind):.0%} interval" in text
    assert "(two one-sided tests at 5%)" in text and "opposite conclusive verdicts" in text
    assert [c.id for c in V.claims()] == [f"C{i}" for i in range(1, 9)]


# ---- each claim on a constructed results tree --------------------------------------------------------


def t_ci(values, level=0.95):
    """The Student t interval at `level` (95% unless said), by hand."""
    x = np.asarray(values, dtype=float)
    half = stats.t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean() - half, x.mean() + half


def write(results, experiment, name, rows, dataset="digits"):
    path = results / experiment / dataset / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)
    if name != "summary.csv" and not (path.parent / "summary.csv").exists():
        pd.DataFrame({"run": []}).to_csv(path.parent / "summary.csv", index=False)


def row_of(results, claim_id):
    table = V.table(results)
    assert list(table.columns) == V.COLUMNS
    rows = table[table["claim"] == claim_id]
    assert len(rows) == 1
    return rows.iloc[0]


ACC = {  # seed -> (global b50, batch b50, global b100, batch b100)
    0: (90.0, 89.0, 88.0, 88.5),
    1: (91.0, 90.5, 89.0, 88.0),
    2: (90.5, 90.0, 88.5, 88.5),
    3: (89.5, 90.0, 88.0, 87.0),
}


def test_c1_data_norm_is_the_mean_over_batch_sizes_of_global_minus_batch(tmp_path):
    rows = [
        {
            "seed": s,
            "data_norm": norm,
            "batch_size": bs,
            "final_test_acc": acc[i],
            "status": "complete",
            "learned": True,
        }
        for s, acc in ACC.items()
        for i, (norm, bs) in enumerate([("global", 50), ("batch", 50), ("global", 100), ("batch", 100)])
    ]
    rows.append({"seed": 4, "data_norm": "global", "batch_size": 50, "final_test_acc": 99.0, "status": "running"})
    write(tmp_path, "data-norm", "summary.csv", rows)
    per_seed = [((g50 - b50) + (g100 - b100)) / 2 for g50, b50, g100, b100 in ACC.values()]
    r = row_of(tmp_path, "C1")
    assert r["effect"] == pytest.approx(np.mean(per_seed))
    assert (r["ci_low"], r["ci_high"]) == pytest.approx(t_ci(per_seed, 0.90))  # equivalence: the 90% interval
    assert r["normprop"] == pytest.approx(np.mean([(a[0] + a[2]) / 2 for a in ACC.values()]))
    assert r["n_seeds"] == 4  # the unfinished run of seed 4 is not counted
    # the margin: 0.1 of batch data normalisation's test error over all seeds, 100 - 88.9375
    assert r["margin"] == pytest.approx(0.1 * (100 - np.mean([a[1::2] for a in ACC.values()])))
    assert "margin 0.1 × 11.06% (the test error (%) of batch data normalisation) = 1.11 pp" in r["note"]
    # all seeds: inside ±1.11 pp; seeds {0, 1} alone span -1.1..2.1 while seeds {2, 3} agree exactly:
    # one inconclusive and one reproduced half, both estimates inside the margin, is no disagreement
    assert -r["margin"] < r["ci_low"] and r["ci_high"] < r["margin"]
    assert (r["verdict_half_a"], r["verdict_half_b"], r["halves"]) == (INCONCLUSIVE, REPRODUCED, V.AGREE)
    assert r["verdict"] == REPRODUCED
    assert r["dataset"] == "digits" and r["experiment"] == "data-norm"


def test_c3_convergence_is_one_minus_the_ratio_of_early_spreads(tmp_path):
    window = V.early_epochs({})
    assert window >= 3
    rng = np.random.default_rng(0)
    rows, early = [], {"normprop": [], "batchnorm": []}
    for method, spread in (("normprop", 0.2), ("batchnorm", 6.0)):
        for seed in range(6):
            accs = 60 + spread * rng.standard_normal(window + 2) + np.arange(window + 2)
            rows += [{"method": method, "seed": seed, "epoch": e + 1, "test_acc": a} for e, a in enumerate(accs)]
            error = 1 - accs[:window] / 100  # the spreads are taken of the mean logit(test error)
            early[method].append(np.log(error / (1 - error)).mean())
    write(tmp_path, "convergence", "epochs.csv", rows)
    r = row_of(tmp_path, "C3")
    sd_np, sd_bn = np.std(early["normprop"], ddof=1), np.std(early["batchnorm"], ddof=1)
    assert (r["normprop"], r["baseline"]) == pytest.approx((sd_np, sd_bn))
    assert r["effect"] == pytest.approx(1 - sd_np / sd_bn)
    assert r["ci_low"] < r["effect"] < r["ci_high"]
    assert f"1-{window}" in r["metric"] and "Bonett" in r["test"]
    assert r["verdict"] == REPRODUCED  # BN spreads 30x more: both halves of 3 seeds agree
    # 3 seeds per method: a wider interval; 2: no kurtosis to adjust by, no interval, inconclusive
    small, width = pd.DataFrame(rows), r["ci_high"] - r["ci_low"]
    write(tmp_path, "convergence", "epochs.csv", small[small["seed"] < 3])
    r = row_of(tmp_path, "C3")
    assert r["ci_high"] - r["ci_low"] > width
    write(tmp_path, "convergence", "epochs.csv", small[small["seed"] < 2])
    r = row_of(tmp_path, "C3")
    assert math.isnan(r["ci_low"]) and r["verdict"] == INCONCLUSIVE
    # one seed per method: no spread, no interval
    write(tmp_path, "convergence", "epochs.csv", small[small["seed"] < 1])
    r = row_of(tmp_path, "C3")
    assert math.isnan(r["ci_low"]) and r["verdict"] == INCONCLUSIVE


def test_c5_table1_is_bn_minus_normprop_error_averaged_over_augmentation(tmp_path):
    err = {  # seed -> {(method, augment): error}
        s: {
            ("normprop", "none"): 9.0 + d,
            ("batchnorm", "none"): 9.5,
            ("normprop", "translate"): 7.0 + d,
            ("batchnorm", "translate"): 7.2,
        }
        for s, d in enumerate([0.1, -0.2, 0.3, 0.0])
    }
    rows = [
        {"method": m, "augment": a, "seed": s, "final_test_error": e, "status": "complete", "learned": True}
        for s, errs in err.items()
        for (m, a), e in errs.items()
    ]
    rows[0]["learned"] = False
    write(tmp_path, "table1", "summary.csv", rows)
    per_seed = [
        (
            (e[("batchnorm", "none")] - e[("normprop", "none")])
            + (e[("batchnorm", "translate")] - e[("normprop", "translate")])
        )
        / 2
        for e in err.values()
    ]
    r = row_of(tmp_path, "C5")
    assert r["effect"] == pytest.approx(np.mean(per_seed))
    assert (r["ci_low"], r["ci_high"]) == pytest.approx(t_ci(per_seed))
    assert "1 of 16 runs did not learn" in r["note"]  # counted, and kept in (an outcome of the method)
    # non-inferiority against 0.1 of BatchNorm's test error, mean over seeds and augmentation: 8.35%
    assert r["margin"] == pytest.approx(0.1 * 8.35)
    assert "margin 0.1 × 8.35% (BatchNorm's test error (%)) = 0.835 pp" in r["note"]
    assert r["ci_low"] > -r["margin"] and r["verdict"] == REPRODUCED


def test_c4_batch_size_pairs_batch_1_with_the_largest_batch(tmp_path):
    acc = {1: [80.0, 82.0, 81.0], 16: [50.0, 50.0, 50.0], 50: [81.0, 81.5, 80.0]}
    rows = [
        {"method": "normprop", "setting": f"normprop-b{b}", "batch_size": b, "seed": s, "final_test_acc": a,
         "updates": 500 // b, "status": "complete"}
        for b, values in acc.items()
        for s, a in enumerate(values)
    ]  # fmt: skip
    rows.append({"method": "batchnorm", "setting": "batchnorm-b100", "batch_size": 100, "seed": 0,
                 "final_test_acc": 10.0, "updates": 5, "status": "complete"})  # fmt: skip
    write(tmp_path, "batch-size", "summary.csv", rows)
    r = row_of(tmp_path, "C4")
    diffs = np.subtract(acc[1], acc[50])
    assert r["effect"] == pytest.approx(diffs.mean())
    assert (r["ci_low"], r["ci_high"]) == pytest.approx(t_ci(diffs, 0.90))  # equivalence: the 90% interval
    assert r["margin"] == pytest.approx(0.2 * (100 - np.mean(acc[50])))  # of NormProp's error at batch 50
    assert "batch 50" in r["metric"]


def test_c6_timing_is_one_minus_the_geometric_mean_over_seeds_of_each_seeds_median_round_ratio(tmp_path):
    # per seed, rounds 2-4 (round 1 is the warm-up): NormProp's and BatchNorm's seconds in each; seed 0's
    # round 3 was disturbed (NormProp 5.0 s), which its median ratio leaves aside
    seconds = {"normprop": [(1.5, 5.0, 1.4), (1.6, 1.5, 1.55), (1.4, 1.3, 1.35), (1.55, 1.6, 1.5)],
               "batchnorm": [(1.8, 1.9, 1.7), (1.9, 1.7, 1.8), (1.7, 1.6, 1.65), (1.8, 1.85, 1.9)]}  # fmt: skip
    rounds = [
        {"run": f"{m}-s{s}", "method": m, "seed": s, "round": r, "position": 1, "order": "", "process": "a",
         "timed": r > 1, "train_seconds": 9.0 if r == 1 else values[r - 2], "finished": 0.0}
        for m, per_seed in seconds.items()
        for s, values in enumerate(per_seed)
        for r in (1, 2, 3, 4)
    ]  # fmt: skip
    write(tmp_path, "timing", "rounds.csv", rounds)
    rows = [
        {"run": f"{m}-s{s}", "method": m, "seed": s, "median_train_seconds": 1.0, "device": "cpu", "status": "complete"}
        for m, values in seconds.items()
        for s in range(len(values))
    ]
    write(tmp_path, "timing", "summary.csv", rows)
    r = row_of(tmp_path, "C6")
    ratios = np.median(np.divide(seconds["normprop"], seconds["batchnorm"]), axis=1)  # per seed, over rounds
    assert ratios[0] == pytest.approx(1.5 / 1.8)  # not the disturbed round's 5.0 / 1.9
    logs = -np.log(ratios)  # per seed: log(BatchNorm / NormProp)
    assert r["effect"] == pytest.approx(1 - math.exp(-logs.mean()))
    low, high = t_ci(logs)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((1 - math.exp(-low), 1 - math.exp(-high)))
    assert r["normprop"] == pytest.approx(np.median(seconds["normprop"], axis=1).mean()) and r["n_seeds"] == 4
    assert "same round" in r["test"] and "median" in r["test"] and "12 in all" in r["note"]
    assert "not comparable with the paper's GTX Titan X figure" in r["note"]


def test_c2_covariate_shift_pairs_final_deviations_and_leaves_out_runs_that_did_not_learn(tmp_path):
    drift = {"normprop": [0.5, 0.6, 0.4], "batchnorm": [1.5, 1.4, 1.7]}  # final deviations from N(0, 1)
    rows = [
        {
            "run": f"{m}-s{s}",
            "method": m,
            "seed": s,
            "layer": layer,
            "epoch": epoch,
            "avg_deviation": d * (1 + layer / 10) if epoch == 2 else 0.0,
        }
        for m, values in drift.items()
        for s, d in enumerate(values)
        for layer in (2, 3)
        for epoch in (0, 1, 2)
    ]
    sweep = tmp_path / "covariate-shift" / "digits"
    write(tmp_path, "covariate-shift", "population.csv", rows)
    summary = [{"run": f"{m}-s{s}", "learned": not (m == "batchnorm" and s == 2)} for m in drift for s in range(3)]
    pd.DataFrame(summary).to_csv(sweep / "summary.csv", index=False)
    r = row_of(tmp_path, "C2")
    diffs = [(bn - n) * 1.25 for n, bn in zip(drift["normprop"][:2], drift["batchnorm"][:2], strict=True)]
    assert r["effect"] == pytest.approx(np.mean(diffs)) and r["n_seeds"] == 2
    assert "batchnorm-s2" in r["note"]


def test_c7_theory_is_the_band_minus_the_largest_layer_deviation(tmp_path):
    rows, worst = [], []
    head = {"net": "fc", "method": "normprop", "quantity": "output"}
    for seed in range(4):
        devs = [0.01 * (seed + 1), 0.02 + 0.005 * seed]  # per layer: |std - 1| (the mean is half of it)
        worst.append(max(devs))
        for layer, d in enumerate(devs, start=1):
            rows.append(head | {"jacobian": "off", "seed": seed, "layer": layer, "mean": d / 2, "std": 1 + d})
            # the ICML form divides by 1.21 once more in every layer of this made-up net
            rows.append(head | {"jacobian": "divide", "seed": seed, "layer": layer, "mean": 0.0, "std": 1.21**-layer})
    path = tmp_path / "theory" / "propagation.csv"
    path.parent.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(path, index=False)
    r = row_of(tmp_path, "C7")
    band = 0.1
    assert r["effect"] == pytest.approx(band - np.mean(worst))
    assert (r["ci_low"], r["ci_high"]) == pytest.approx(tuple(band - h for h in reversed(t_ci(worst))))
    assert r["verdict"] == REPRODUCED
    assert "outside the band" in r["note"]


def test_an_empty_results_tree_has_nothing_measured(tmp_path):
    table = V.table(tmp_path)
    assert list(table["claim"]) == [f"C{i}" for i in range(1, 9)]
    assert set(table["verdict"]) == {V.NOT_MEASURED}
    path = V.write_verdicts(tmp_path)
    assert list(pd.read_csv(path).columns) == V.COLUMNS


def test_a_claim_whose_experiment_the_preset_does_not_run_says_so_not_which_command_would(tmp_path):
    from normprop_cli.verdicts.rule import claims
    from normprop_cli.verdicts.tabulate import rows_of

    by_id = {c.id: c for c in claims()}
    (row,) = rows_of(by_id["C1"], tmp_path, "gpu")  # data-norm: not one of the gpu preset's experiments
    assert row["verdict"] == V.NOT_MEASURED
    assert row["note"] == "the gpu preset does not run `data-norm` (it runs table1, timing)"
    (row,) = rows_of(by_id["C5"], tmp_path, "gpu")  # table1 is, and has no results here: the command that runs it
    assert "normprop run table1 --preset gpu" in row["note"]
