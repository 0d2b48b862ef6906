"""The three kinds of test on constructed intervals, and the level of the interval each reads (90% for
equivalence, 95% otherwise), in the estimators and in judge()."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from normprop_cli import verdicts as V
from normprop_cli.verdicts import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, rule

SUP, NONINF, EQUIV = V.SUPERIORITY, V.NON_INFERIORITY, V.EQUIVALENCE


def test_equivalence_is_reproduced_only_inside_the_margin_and_refuted_only_wholly_outside():
    assert V.verdict(EQUIV, -0.5, 0.5, margin=1.0) == REPRODUCED  # inside (-1, 1)
    assert V.verdict(EQUIV, 0.2, 0.9, margin=1.0) == REPRODUCED  # inside, off-centre
    assert V.verdict(EQUIV, 1.2, 2.0, margin=1.0) == NOT_REPRODUCED  # wholly above +1
    assert V.verdict(EQUIV, -3.0, -1.5, margin=1.0) == NOT_REPRODUCED  # wholly below -1
    assert V.verdict(EQUIV, 0.5, 1.5, margin=1.0) == INCONCLUSIVE  # straddles +1
    assert V.verdict(EQUIV, -1.5, 0.0, margin=1.0) == INCONCLUSIVE  # straddles -1
    assert V.verdict(EQUIV, -2.0, 2.0, margin=1.0) == INCONCLUSIVE  # straddles both
    assert V.verdict(EQUIV, 0.0, 1.0, margin=1.0) == INCONCLUSIVE  # touches +1: not inside
    assert V.verdict(EQUIV, 1.0, 2.0, margin=1.0) == INCONCLUSIVE  # touches +1: not wholly outside
    # the same intervals under the other kinds: equivalence is not superiority nor non-inferiority
    assert V.verdict(SUP, 1.2, 2.0) == REPRODUCED and V.verdict(NONINF, 1.2, 2.0, margin=1.0) == REPRODUCED
    assert V.verdict(NONINF, -1.5, 0.0, margin=1.0) == INCONCLUSIVE
    assert V.verdict(EQUIV, -0.5, 0.5, margin=1.0, n_seeds=1) == INCONCLUSIVE
    assert V.verdict(EQUIV, -0.5, 0.5, margin=math.nan) == INCONCLUSIVE  # no margin, no verdict
    assert V.verdict(EQUIV, math.nan, 0.5, margin=1.0) == INCONCLUSIVE


def test_superiority_and_non_inferiority_on_their_thresholds():
    assert V.verdict(SUP, 0.0, 1.0) == INCONCLUSIVE and V.verdict(SUP, -1.0, 0.0) == INCONCLUSIVE
    assert V.verdict(SUP, 0.01, 1.0) == REPRODUCED and V.verdict(SUP, -1.0, -0.01) == NOT_REPRODUCED
    assert V.verdict(SUP, 0.5, 1.5, margin=math.nan) == REPRODUCED  # superiority has no margin
    assert V.verdict(NONINF, -0.99, 3.0, margin=1.0) == REPRODUCED  # above -1, however wide above
    assert V.verdict(NONINF, -5.0, -1.01, margin=1.0) == NOT_REPRODUCED
    assert V.verdict(NONINF, -1.0, 3.0, margin=1.0) == INCONCLUSIVE  # touches -1
    assert V.verdict(NONINF, -0.5, 0.5, margin=math.nan) == INCONCLUSIVE


def test_equivalence_reads_the_90_percent_interval_the_others_the_95_percent_one():
    assert V.level_of(EQUIV) == 0.90
    assert V.level_of(SUP) == V.level_of(NONINF) == rule.LEVEL == 0.95
    x = np.array([0.3, -0.1, 0.5, 0.2, 0.0, 0.4])
    table = pd.DataFrame({"seed": range(6), "normprop": x, "baseline": 0.0})
    wide, narrow = V.one_sample(+1)(table), V.one_sample(+1)(table, V.level_of(EQUIV))
    assert narrow.ci_low > wide.ci_low and narrow.ci_high < wide.ci_high  # narrower, same centre
    assert narrow.effect == wide.effect == pytest.approx(x.mean())
    half = stats.t.ppf(0.95, 5) * x.std(ddof=1) / math.sqrt(6)  # two one-sided tests at 5%
    assert (narrow.ci_low, narrow.ci_high) == pytest.approx((x.mean() - half, x.mean() + half))
    assert V.one_sample(+1)(table, 0.95) == wide  # the default is the 95% interval


def test_every_estimator_takes_the_level():
    rng = np.random.default_rng(1)
    pairs = pd.DataFrame({"seed": range(6), "normprop": 1 + rng.random(6), "baseline": 1.5 + rng.random(6)})
    spreads = pd.DataFrame(
        {"seed": [*range(6)] * 2, "method": ["normprop"] * 6 + ["batchnorm"] * 6, "value": rng.normal(size=12)}
    )
    for estimate, table in (
        (V.one_sample(-1), pairs),
        (V.paired(+1), pairs),
        (rule.speedup, pairs.assign(ratio=pairs["normprop"] / pairs["baseline"])),
        (rule.spread_ratio, spreads),
    ):
        e95, e90 = estimate(table), estimate(table, 0.90)
        assert e90.ci_low > e95.ci_low and e90.ci_high < e95.ci_high, estimate
    for interval, args in (
        (rule.t_interval, (pairs["normprop"],)),
        (rule.paired_interval, (pairs["normprop"], pairs["baseline"])),
    ):
        _, low95, high95 = interval(*args)
        _, low90, high90 = interval(*args, level=0.90)
        assert low90 > low95 and high90 < high95


def claim(kind, margin):
    return V.Claim("CX", "a claim", "here", "exp", kind, margin, "pp", "")


def test_judge_reads_each_claims_interval_at_its_level():
    # per-seed differences whose 95% interval crosses +1 but whose 90% interval lies inside (-1, 1)
    x = np.array([0.2, 1.3, 0.5, -0.5, 0.9, 0.0])
    table = pd.DataFrame({"seed": range(6), "normprop": x, "baseline": 0.0})
    m = V.Measurement(table, V.one_sample(+1), "t")
    e95, e90 = V.one_sample(+1)(table), V.one_sample(+1)(table, 0.90)
    assert e95.ci_high > 1.0 > e90.ci_high and e90.ci_low > -1.0
    row = V.judge(claim(EQUIV, 1.0), m)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((e90.ci_low, e90.ci_high))
    assert row["verdict_half_a"] == row["verdict_half_b"] == INCONCLUSIVE  # three seeds each: wide
    assert (row["verdict"], row["halves"], row["margin"]) == (REPRODUCED, V.AGREE, 1.0)
    row = V.judge(claim(NONINF, 1.0), m)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((e95.ci_low, e95.ci_high))
