"""Robustness beside each verdict: the break-even margin is where the rule's verdict really changes,
leaving one seed out is counted against the verdict shown, the best-validation verdict reads the
runs' best-validation test metric, the verdict at every epoch of the last quarter, and C3's interval (Bonett's) and its
coverage without normal values."""

import math

import numpy as np
import pandas as pd
import pytest

from normprop_cli import verdicts as V
from normprop_cli.statistics import sd_ratio_interval
from normprop_cli.verdicts import rule
from normprop_cli.verdicts.readings import View, read
from normprop_cli.verdicts.robustness import (
    NOT_APPLICABLE,
    best_validation_verdict,
    break_even,
    last_quarter,
    loso_flips,
    quarter,
    robustness,
    robustness_text,
)

KINDS = (rule.SUPERIORITY, rule.NON_INFERIORITY, rule.EQUIVALENCE)


def test_c5_on_fashion_breaks_even_a_hundredth_of_a_point_past_its_margin():
    """The numbers a reviewer found by hand: C5's interval [-1.802, -1.108] against a margin of 1.098."""
    assert break_even(rule.NON_INFERIORITY, -1.802, -1.108, 1.098) == pytest.approx(1.108)


@pytest.mark.parametrize("kind", KINDS)
def test_the_verdict_changes_at_the_break_even_margin_and_nowhere_nearer(kind):
    rng = np.random.default_rng(7)
    for _ in range(300):
        low = float(rng.normal(0, 2))
        high = low + float(rng.uniform(0.1, 3))
        margin = 0.0 if kind == rule.SUPERIORITY else float(rng.uniform(0.05, 3))
        point = break_even(kind, low, high, margin)
        if kind == rule.SUPERIORITY:  # the threshold t: reproduced iff low > t
            at = lambda t, lo=low, hi=high: rule.verdict(kind, lo - t, hi - t, 0.0, 6)  # noqa: E731
        else:
            at = lambda m, lo=low, hi=high: rule.verdict(kind, lo, hi, m, 6)  # noqa: E731
        if math.isnan(point):
            continue
        eps = 1e-6
        assert at(point - eps) != at(point + eps), (kind, low, high, margin, point)
        # no change between the claim's margin and the break-even point
        grid = np.linspace(min(margin, point) + eps, max(margin, point) - eps, 25)
        if kind != rule.SUPERIORITY and len(grid) and grid[0] < grid[-1]:
            assert len({at(float(m)) for m in grid}) == 1


def measurement(values: list[float]) -> V.Measurement:
    table = pd.DataFrame({"seed": range(len(values)), "normprop": values, "baseline": 0.0})
    return measurement_of(table)


def measurement_of(table: pd.DataFrame) -> V.Measurement:
    return V.Measurement(table, V.one_sample(+1), "t")


def test_leave_one_out_counts_subsets_whose_whole_rule_verdict_differs_from_the_one_shown():
    claim = V.Claim("CX", "a claim", "here", "exp", rule.NON_INFERIORITY, 1.0, "pp", "")
    m = measurement([0.1, 0.2, 0.0, 0.15, 0.05, -3.0])  # one bad seed makes all six inconclusive
    judge = lambda mm: V.judge(claim, mm)  # noqa: E731
    shown = judge(m)["verdict"]
    by_hand = sum(judge(measurement_of(m.table[m.table["seed"] != seed]))["verdict"] != shown for seed in range(6))
    assert shown == rule.INCONCLUSIVE and by_hand == 1
    assert loso_flips(m, judge, shown) == 1
    assert loso_flips(measurement([0.1, 0.2]), judge, shown) is None  # under 3 seeds


def test_leave_one_out_compares_with_the_verdict_after_the_halves_rule():
    """All seeds reproduce, but the halves reach opposite verdicts: shown inconclusive.
    Subsets that are themselves inconclusive are not flips against it."""
    claim = V.Claim("CX", "a claim", "here", "exp", rule.SUPERIORITY, 0.0, "", "")
    m = measurement([-0.2, -0.1, -0.15, -0.05, -0.1, 2.0, 2.1, 2.2, 1.9, 2.05])
    judge = lambda mm: V.judge(claim, mm)  # noqa: E731
    judged = judge(m)
    assert (judged["verdict"], judged["halves"]) == (rule.INCONCLUSIVE, rule.OPPOSITE_VERDICTS)
    flips = loso_flips(m, judge, judged["verdict"])
    subsets = (measurement_of(m.table[m.table["seed"] != s]) for s in range(10))
    by_hand = sum(judge(subset)["verdict"] != rule.INCONCLUSIVE for subset in subsets)
    on_all = rule.verdict(claim.kind, judged["ci_low"], judged["ci_high"], 0.0, 10)
    assert on_all == rule.REPRODUCED and flips == by_hand < 10


def test_the_last_quarter_runs_from_epoch_e_minus_a_quarter_to_e():
    assert quarter(12) == [9, 10, 11, 12] and quarter(4) == [3, 4] and quarter(6) == [4, 5, 6] and quarter(1) == [1]


def test_stability_judges_the_claim_at_every_epoch_of_the_last_quarter(tmp_path):
    """Runs' metrics.csv: NormProp's accuracy overtakes the baseline's only at the last epoch of 8."""
    rows = []
    for seed in range(4):
        for arm, accs in (("np", [50, 60, 70, 75, 80, 85, 86, 95]), ("bn", [50, 61, 72, 78, 84, 88, 90, 90])):
            run = f"{arm}-s{seed}"
            (tmp_path / "runs" / run).mkdir(parents=True)
            epochs = pd.DataFrame({"epoch": range(1, 9), "test_acc": np.add(accs, 0.1 * seed * (arm == "np"))})
            epochs.to_csv(tmp_path / "runs" / run / "metrics.csv", index=False)
            rows.append({"run": run, "arm": arm, "seed": seed, "final_test_acc": float(epochs["test_acc"].iloc[-1])})
    pd.DataFrame(rows).to_csv(tmp_path / "summary.csv", index=False)
    claim = V.Claim("CX", "a claim", "here", "exp", rule.SUPERIORITY, 0.0, "pp", "")

    def measure(view: View | None = None) -> V.Measurement:
        s = read(tmp_path / "summary.csv", ["run", "arm", "seed", "final_test_acc"], view)
        wide = s.pivot(index="seed", columns="arm", values="final_test_acc")
        table = pd.DataFrame({"seed": wide.index, "normprop": wide["np"].values, "baseline": wide["bn"].values})
        return V.Measurement(table, V.one_sample(+1), "t")

    judge = lambda m: V.judge(claim, m)  # noqa: E731
    assert judge(measure())["verdict"] == rule.REPRODUCED  # at epoch 8
    at_7 = read(tmp_path / "summary.csv", ["final_test_acc"], View(epoch=7))
    assert at_7["final_test_acc"].tolist()[:2] == [86.0, 90.0]
    assert read(tmp_path / "summary.csv", ["final_test_acc"])["final_test_acc"].tolist()[:2] == [95.0, 90.0]
    verdicts = last_quarter(measure, judge)
    assert verdicts == {6: rule.NOT_REPRODUCED, 7: rule.NOT_REPRODUCED, 8: rule.REPRODUCED}
    row = robustness(claim, measure(), judge(measure()), measure, judge)
    assert row["settled"] is False and row["last_quarter"] == "6: not reproduced; 7: not reproduced; 8: reproduced"
    assert last_quarter(lambda view: V.Measurement(pd.DataFrame({"seed": [0]}), V.one_sample(+1), "t"), judge) == {}


def test_the_best_validation_verdict_reads_each_runs_best_validation_test_metric(tmp_path):
    summary = pd.DataFrame(
        {
            "run": [f"r{i}" for i in range(4)],
            "seed": range(4),
            "final_test_error": [10.0, 11.0, 12.0, 13.0],
            "best_val_test_error": [20.0, 21.0, 22.0, 23.0],
        }
    )
    path = tmp_path / "summary.csv"
    summary.to_csv(path, index=False)
    assert read(path, ["final_test_error"])["final_test_error"].tolist() == [10.0, 11.0, 12.0, 13.0]
    best = View(best_validation=True)
    frame = read(path, ["final_test_error"], best)
    assert frame["final_test_error"].tolist() == [20.0, 21.0, 22.0, 23.0] and best.replaced == [path]
    best = View(best_validation=True)
    read(path, ["seed"], best)  # no final test metric asked for: nothing replaced
    assert not best.replaced

    def measure(view: View | None = None) -> V.Measurement:
        errors = read(path, ["seed", "final_test_error"], view)
        table = pd.DataFrame({"seed": errors["seed"], "normprop": errors["final_test_error"], "baseline": 15.0})
        return V.Measurement(table, V.one_sample(-1), "t")

    judge = lambda m: {"verdict": "worse" if m.table["normprop"].mean() > 15 else "better"}  # noqa: E731
    assert judge(measure())["verdict"] == "better"
    assert best_validation_verdict(measure, judge) == "worse"
    untouched = lambda view: V.Measurement(pd.DataFrame({"seed": [0]}), V.one_sample(+1), "t")  # noqa: E731
    assert best_validation_verdict(untouched, judge) == NOT_APPLICABLE


def test_the_robustness_cell_says_each_check():
    row = {"break_even": 1.108, "break_even_fraction": 0.1009, "loso_flips": 4, "n_seeds": 6,
           "verdict_best_val": "not reproduced", "last_quarter": "9: not reproduced; 10: inconclusive; "
           "11: not reproduced; 12: not reproduced", "settled": False}  # fmt: skip
    text = robustness_text(row, "pp")
    assert text == ("break-even 1.11 pp (0.101 × the error); 4 of 6 leave-one-out flip; best-val: not reproduced; "
                    "epochs 9-12: not settled")  # fmt: skip
    assert robustness_text({}, "pp") == "—"


def spreads(np_values, bn_values) -> pd.DataFrame:
    n, b = len(np_values), len(bn_values)
    return pd.DataFrame(
        {
            "seed": [*range(n), *range(b)],
            "method": ["normprop"] * n + ["batchnorm"] * b,
            "value": [*np_values, *bn_values],
        }  # fmt: skip
    )


def test_c3s_interval_is_bonetts_on_the_ratio_of_sds():
    """Bonett's interval by hand: the pooled kurtosis about trimmed means, the small-sample c (1 at equal n)."""
    from scipy import stats

    rng = np.random.default_rng(3)
    a, b = rng.normal(0, 1, 12), rng.normal(0, 1.5, 12)
    e = rule.spread_ratio(spreads(a, b), 0.95)
    va, vb, z = np.var(a, ddof=1), np.var(b, ddof=1), stats.norm.ppf(0.975)
    ma, mb = stats.trim_mean(a, 1 / (2 * math.sqrt(8))), stats.trim_mean(b, 1 / (2 * math.sqrt(8)))
    k = 24 * (((a - ma) ** 4).sum() + ((b - mb) ** 4).sum()) / (11 * va + 11 * vb) ** 2
    se = math.sqrt(2 * (k - 9 / 12) / 11)
    low, high = math.exp((math.log(va / vb) - z * se) / 2), math.exp((math.log(va / vb) + z * se) / 2)
    assert e.effect == pytest.approx(1 - math.sqrt(va / vb))
    assert (e.ci_low, e.ci_high) == pytest.approx((1 - high, 1 - low))
    assert math.isnan(rule.spread_ratio(spreads(a[:2], b[:2]), 0.95).ci_low)  # under 3 seeds a side


@pytest.mark.parametrize(("n", "tails"), [(12, "t5"), (12, "normal"), (40, "t5")])
def test_c3s_interval_covers_the_true_ratio_without_normal_values(n, tails):
    """20,000 seeded pairs of samples of n values, sds 1 and 2; with t(5) tails an F interval covers
    ~0.86 at n = 12 and ~0.81 at n = 40."""
    rng = np.random.default_rng(11)
    draw = (lambda size: rng.standard_t(5, size)) if tails == "t5" else rng.standard_normal
    x, y = draw((20_000, n)), 2.0 * draw((20_000, n))
    _, low, high = sd_ratio_interval(x, y, 0.95)
    coverage = float(((low < 0.5) & (0.5 < high)).mean())
    assert 0.93 <= coverage <= 0.97, coverage
