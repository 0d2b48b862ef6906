"""The halves rule on constructed halves: the all-seeds verdict falls to inconclusive only where the
halves reach opposite verdicts or their estimates lie on opposite sides of the test's threshold."""

import pandas as pd

from normprop_cli import verdicts as V
from normprop_cli.verdicts import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Estimate

SUP, NONINF, EQUIV = V.SUPERIORITY, V.NON_INFERIORITY, V.EQUIVALENCE


def half(effect, low, high, n=3):
    return Estimate(effect=effect, ci_low=low, ci_high=high, n_seeds=n)


def test_opposite_conclusive_verdicts_make_it_inconclusive():
    a, b = half(1.0, 0.5, 1.5), half(-1.0, -1.5, -0.5)  # reproduced, not reproduced
    assert V.final_verdict(SUP, REPRODUCED, a, b) == (INCONCLUSIVE, V.OPPOSITE_VERDICTS)
    assert V.final_verdict(SUP, NOT_REPRODUCED, b, a) == (INCONCLUSIVE, V.OPPOSITE_VERDICTS)
    # equivalence: inside the margin against wholly outside it
    a, b = half(0.0, -0.5, 0.5), half(2.0, 1.5, 2.5)
    assert V.final_verdict(EQUIV, REPRODUCED, a, b, margin=1.0) == (INCONCLUSIVE, V.OPPOSITE_VERDICTS)


def test_estimates_on_opposite_sides_of_the_threshold_make_it_inconclusive():
    # superiority: 0; both halves inconclusive
    a, b = half(0.3, -1.0, 1.6), half(-0.2, -1.0, 0.6)
    assert V.final_verdict(SUP, REPRODUCED, a, b) == (INCONCLUSIVE, "estimates on opposite sides of 0")
    # one conclusive half and one inconclusive half whose estimate lies on the other side
    a, b = half(1.0, 0.5, 1.5), half(-0.1, -2.0, 1.8)
    assert V.final_verdict(SUP, REPRODUCED, a, b) == (INCONCLUSIVE, "estimates on opposite sides of 0")
    # non-inferiority: -margin, not 0
    a, b = half(-0.5, -2.0, 1.0), half(-1.5, -3.0, 0.0)
    assert V.final_verdict(NONINF, REPRODUCED, a, b, 1.0, "pp") == (
        INCONCLUSIVE,
        "estimates on opposite sides of -1 pp",
    )
    a, b = half(0.5, -1.0, 2.0), half(-0.5, -2.0, 1.0)  # opposite signs, both above -1: no disagreement
    assert V.final_verdict(NONINF, REPRODUCED, a, b, 1.0, "pp") == (REPRODUCED, V.AGREE)
    # equivalence: one estimate inside (-margin, +margin), the other outside
    a, b = half(0.5, -0.9, 1.9), half(1.5, 0.1, 2.9)
    assert V.final_verdict(EQUIV, REPRODUCED, a, b, 1.0, "pp") == (INCONCLUSIVE, "estimates on opposite sides of ±1 pp")
    a, b = half(-0.5, -1.9, 0.9), half(0.5, -0.9, 1.9)  # opposite signs, both inside: no disagreement
    assert V.final_verdict(EQUIV, REPRODUCED, a, b, 1.0, "pp") == (REPRODUCED, V.AGREE)


def test_one_conclusive_and_one_inconclusive_half_keep_the_verdict():
    a, b = half(1.0, 0.5, 1.5), half(0.8, -0.5, 2.1)  # reproduced, inconclusive, same side
    assert V.final_verdict(SUP, REPRODUCED, a, b) == (REPRODUCED, V.AGREE)
    a, b = half(-2.0, -3.0, -1.5), half(-1.5, -2.5, -0.5)  # not reproduced, inconclusive, below -1
    assert V.final_verdict(NONINF, NOT_REPRODUCED, a, b, 1.0) == (NOT_REPRODUCED, V.AGREE)
    a, b = half(0.1, -0.5, 0.7), half(-0.3, -1.5, 0.9)  # equivalence: reproduced, inconclusive, inside
    assert V.final_verdict(EQUIV, REPRODUCED, a, b, 1.0) == (REPRODUCED, V.AGREE)


def test_two_inconclusive_halves_on_the_same_side_keep_the_verdict():
    a, b = half(0.4, -0.5, 1.3), half(0.6, -0.2, 1.4)
    assert V.final_verdict(SUP, REPRODUCED, a, b) == (REPRODUCED, V.AGREE)
    a, b = half(1.4, -0.5, 3.3), half(-1.6, -3.2, 0.0)  # equivalence: both outside ±1 (either side)
    assert V.final_verdict(EQUIV, NOT_REPRODUCED, a, b, 1.0) == (NOT_REPRODUCED, V.AGREE)
    # an inconclusive all-seeds verdict stays inconclusive, whatever the halves
    assert V.final_verdict(SUP, INCONCLUSIVE, half(1.0, 0.5, 1.5), half(0.8, 0.2, 1.4)) == (INCONCLUSIVE, V.AGREE)


def test_halves_of_fewer_than_two_seeds_are_not_compared():
    a, b = half(-1.0, -1.5, -0.5, n=1), half(1.0, 0.5, 1.5, n=2)
    assert V.final_verdict(SUP, REPRODUCED, a, b) == (REPRODUCED, V.NO_HALVES)
    table = pd.DataFrame({"seed": [0, 1, 2], "normprop": [5.0, 5.1, 4.9], "baseline": 0.0})
    claim = V.Claim("CX", "a claim", "here", "exp", SUP, 0.0, "pp", "")
    row = V.judge(claim, V.Measurement(table, V.one_sample(+1), "t"))
    assert (row["verdict"], row["halves"]) == (REPRODUCED, V.NO_HALVES)


def test_the_side_of_an_estimate_against_each_threshold():
    assert (V.side(SUP, 0.1), V.side(SUP, -0.1), V.side(SUP, 0.0)) == (1, -1, 0)
    assert (V.side(NONINF, -0.9, 1.0), V.side(NONINF, -1.1, 1.0)) == (1, -1)
    assert (V.side(EQUIV, -0.9, 1.0), V.side(EQUIV, 1.1, 1.0), V.side(EQUIV, -1.1, 1.0)) == (1, -1, -1)
    assert V.side(EQUIV, float("nan"), 1.0) == V.side(NONINF, 0.0, float("nan")) == 0
    assert [V.threshold_text(k, 0.835, "pp") for k in (SUP, NONINF, EQUIV)] == ["0", "-0.835 pp", "±0.835 pp"]
