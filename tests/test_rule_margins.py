"""Relative margins: a claim's margin is a fraction of the baseline's error (Measurement.reference),
in judge(), in the note, in verdicts.csv and in the report's rule paragraph."""

import math

import pandas as pd
import pytest

from normprop_cli import verdicts as V
from normprop_cli.verdicts import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, rule, tabulate

NONINF, EQUIV = V.NON_INFERIORITY, V.EQUIVALENCE


def relative(kind, fraction, relative_to="the baseline's test error (%)"):
    return V.Claim("CX", "a claim", "here", "exp", kind, fraction, "pp", "", relative_to)


def measured(diffs, reference):
    table = pd.DataFrame({"seed": range(len(diffs)), "normprop": diffs, "baseline": 0.0})
    return V.Measurement(table, V.one_sample(+1), "t", reference=reference)


def test_judge_uses_the_fraction_times_the_reference_error():
    diffs = [-1.0, -1.1, -0.9, -1.05, -0.95, -1.0]  # about -1 pp, tightly
    # 0.1 of a 20% error is 2 pp: the interval lies above -2, reproduced
    row = V.judge(relative(NONINF, 0.1), measured(diffs, 20.0))
    assert row["margin"] == pytest.approx(2.0) and row["verdict"] == REPRODUCED
    # 0.1 of a 5% error is 0.5 pp: the same interval lies below -0.5, not reproduced
    row = V.judge(relative(NONINF, 0.1), measured(diffs, 5.0))
    assert row["margin"] == pytest.approx(0.5) and row["verdict"] == NOT_REPRODUCED
    # equivalence: 0.2 of 10% is ±2 pp (inside); 0.2 of 4% is ±0.8 pp (wholly outside, below)
    assert V.judge(relative(EQUIV, 0.2), measured(diffs, 10.0))["verdict"] == REPRODUCED
    assert V.judge(relative(EQUIV, 0.2), measured(diffs, 4.0))["verdict"] == NOT_REPRODUCED
    # the halves are judged against the same absolute margin: estimates around -1 pp, both inside ±2
    row = V.judge(relative(EQUIV, 0.2), measured(diffs, 10.0))
    assert row["verdict_half_a"] == row["verdict_half_b"] == REPRODUCED and row["halves"] == V.AGREE
    # an absolute margin stays what the claim says, whatever the reference
    absolute = V.Claim("CX", "a claim", "here", "exp", NONINF, 2.0, "pp", "")
    assert V.judge(absolute, measured(diffs, 5.0))["margin"] == 2.0


def test_without_a_reference_error_the_verdict_is_inconclusive_and_the_note_says_why():
    diffs = [-1.0, -1.1, -0.9, -1.05, -0.95, -1.0]
    c = relative(NONINF, 0.1, "BatchNorm's test error (%)")
    row = V.judge(c, measured(diffs, math.nan))
    assert math.isnan(row["margin"]) and row["verdict"] == INCONCLUSIVE
    assert tabulate.margin_note(c, measured(diffs, math.nan)) == [
        "the margin could not be computed: no BatchNorm's test error (%); the verdict is inconclusive"
    ]
    assert tabulate.margin_note(c, measured(diffs, 8.35)) == [
        "margin 0.1 × 8.35% (BatchNorm's test error (%)) = 0.835 pp"
    ]


def test_verdicts_csv_has_the_margin_after_the_test_and_halves_after_half_b():
    columns = V.COLUMNS
    assert columns[columns.index("test") + 1] == "margin"
    assert columns[columns.index("verdict_half_b") + 1] == "halves"
    assert columns.index("verdict_half_a") + 1 == columns.index("verdict_half_b")


def test_the_rule_paragraph_is_written_from_the_claims(monkeypatch):
    made_up = (
        V.Claim("C1", "x", "s", "e", EQUIV, 0.3, "pp", "", "the error of the foo"),
        V.Claim("C2", "y", "s", "e", NONINF, 1.5, "pp", ""),
    )
    monkeypatch.setattr(rule, "claims", lambda: made_up)
    text = V.rule_text()
    assert "C1 0.3 × the error of the foo; C2 1.5 pp" in text
    assert "(equivalence: C1) reads the 90% interval" in text and "(non-inferiority: C2) reads the 95%" in text
    assert "(superiority) reads the 95% interval" in text  # a kind without claims is still stated
