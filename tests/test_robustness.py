"""Robustness beside each verdict: the break-even margin is where the rule's verdict really changes,
leaving one seed out is counted against the rule on all seeds, the best-validation verdict reads the
runs' best-validation test metric, the last quarter's movement, and C3's interval (Bonett's) and its
coverage without normal values."""

import math

import numpy as np
import pandas as pd
import pytest

from normprop_cli import verdicts as V
from normprop_cli.statistics import sd_ratio_interval
from normprop_cli.verdicts import rule
from normprop_cli.verdicts.readings import at_best_validation, read
from normprop_cli.verdicts.robustness import (
    NOT_APPLICABLE,
    best_validation_verdict,
    break_even,
    last_quarter,
    loso_flips,
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
    return V.Measurement(table, V.one_sample(+1), "t")


def test_leaving_out_the_seed_that_carries_the_effect_flips_the_verdict():
    claim = V.Claim("CX", "a claim", "here", "exp", rule.NON_INFERIORITY, 1.0, "pp", "")
    m = measurement([0.1, 0.2, 0.0, 0.15, 0.05, -3.0])  # one bad seed makes all six inconclusive
    full = m.estimate(m.table, 0.95)
    on_all = rule.verdict(claim.kind, full.ci_low, full.ci_high, 1.0, full.n_seeds)
    by_hand = 0
    for seed in range(6):
        e = m.estimate(m.table[m.table["seed"] != seed], 0.95)
        by_hand += rule.verdict(claim.kind, e.ci_low, e.ci_high, 1.0, e.n_seeds) != on_all
    assert on_all == rule.INCONCLUSIVE and by_hand == 1
    assert loso_flips(claim, m, 0.95, 1.0, on_all) == 1
    assert loso_flips(claim, measurement([0.1, 0.2]), 0.95, 1.0, on_all) is None  # under 3 seeds


def test_the_last_quarter_runs_from_epoch_e_minus_a_quarter_to_e():
    effect = pd.Series([-2.6, -3.3, -2.6, -2.0, -2.1, -1.6, -1.9, -1.7, -1.60, -1.61, -1.48, -1.46], index=range(1, 13))
    assert last_quarter(effect) == pytest.approx(-1.46 - -1.60)  # epochs 9 -> 12
    assert last_quarter(pd.Series([1.0, 2.0], index=[1, 2])) == pytest.approx(1.0)
    assert math.isnan(last_quarter(None))


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
    with at_best_validation() as used:
        frame = read(path, ["final_test_error"])
    assert frame["final_test_error"].tolist() == [20.0, 21.0, 22.0, 23.0] and used == [path]
    with at_best_validation() as used:
        read(path, ["seed"])  # no final test metric asked for: nothing replaced
    assert not used

    def measure() -> V.Measurement:
        errors = read(path, ["seed", "final_test_error"])
        table = pd.DataFrame({"seed": errors["seed"], "normprop": errors["final_test_error"], "baseline": 15.0})
        return V.Measurement(table, V.one_sample(-1), "t")

    judge = lambda m: {"verdict": "worse" if m.table["normprop"].mean() > 15 else "better"}  # noqa: E731
    assert judge(measure())["verdict"] == "better"
    assert best_validation_verdict(measure, judge) == "worse"
    untouched = lambda: V.Measurement(pd.DataFrame({"seed": [0]}), V.one_sample(+1), "t")  # noqa: E731
    assert best_validation_verdict(untouched, judge) == NOT_APPLICABLE


def test_the_robustness_cell_says_each_check():
    row = {"break_even": 1.108, "break_even_fraction": 0.1009, "loso_flips": 4, "n_seeds": 6,
           "verdict_best_val": "not reproduced", "last_quarter_change": 0.1425, "settled": True}  # fmt: skip
    text = robustness_text(row, "pp")
    assert text == ("break-even 1.11 pp (0.101 × the error); 4 of 6 leave-one-out flip; best-val: not reproduced; "
                    "last quarter +0.14 pp (settled)")  # fmt: skip
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
