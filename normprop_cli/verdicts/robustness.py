"""How firmly each verdict stands, shown beside it (verdicts.csv and REPORT.md):

- `break_even`: the margin at which the verdict would change, nearest the claim's own, in the claim's
  unit (for a superiority claim, whose margin is 0, the threshold); `break_even_fraction`: that margin
  as a fraction of the baseline's error where the claim's margin is relative (C5's margin is 0.1 x
  BatchNorm's error: a break-even fraction of 0.101 means one more thousandth would flip it).
- `loso_flips`: of the leave-one-seed-out subsets (every seed left out once), how many reach another
  verdict on the remaining seeds than all seeds do (before the halves rule, which a subset has no
  room for: the verdict on all seeds against the verdict on each subset, by the same rule).
- `verdict_best_val`: the verdict (halves rule included) with each run's test metric at its
  best-validation epoch in place of its final one; "not applicable" where the claim reads no final
  test metric (C2, C3, C6, C7).
- `last_quarter_change`: how much the effect (mean over seeds) moved over the last quarter of the
  epochs, from epoch E - ceil(E / 4) to E; `settled` is whether that is less than half the width of
  the verdict's interval (otherwise the budget, not the method, stops the effect where it is).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd

from normprop_cli.verdicts.readings import Measurement, NotMeasured, at_best_validation
from normprop_cli.verdicts.rule import EQUIVALENCE, NON_INFERIORITY, SUPERIORITY, Claim, verdict

COLUMNS = ["break_even", "break_even_fraction", "loso_flips", "verdict_best_val", "last_quarter_change", "settled"]
NOT_APPLICABLE = "not applicable"


def break_even(kind: str, ci_low: float, ci_high: float, margin: float) -> float:
    """The margin m (>= 0; the threshold for superiority) at which verdict(kind, ci_low, ci_high, m)
    changes, the one nearest `margin`; NaN where no margin changes it (or no interval)."""
    if not (math.isfinite(ci_low) and math.isfinite(ci_high)):
        return math.nan
    if kind == SUPERIORITY:  # reproduced while the threshold is below ci_low, not reproduced above ci_high
        points = [ci_low, ci_high]
    elif kind == NON_INFERIORITY:  # reproduced for m > -ci_low, not reproduced for m < -ci_high
        points = [-ci_low, -ci_high]
    elif kind == EQUIVALENCE:  # reproduced for m > max |bound|, not reproduced for m < the gap to 0
        points = [max(abs(ci_low), abs(ci_high)), max(ci_low, -ci_high)]
    else:
        return math.nan
    if kind != SUPERIORITY:
        points = [p for p in points if p > 0]
    return min(points, key=lambda p: (abs(p - margin), p)) if points else math.nan


def loso_flips(claim: Claim, m: Measurement, level: float, margin: float, on_all: str) -> int | None:
    """How many leave-one-seed-out subsets reach another verdict than all seeds (None: under 3 seeds)."""
    seeds = sorted(set(m.table["seed"]))
    if len(seeds) < 3 or not math.isfinite(margin):
        return None
    flips = 0
    for seed in seeds:
        e = m.estimate(m.table[m.table["seed"] != seed], level)
        flips += verdict(claim.kind, e.ci_low, e.ci_high, margin, e.n_seeds) != on_all
    return flips


def last_quarter(by_epoch: pd.Series | None) -> float:
    """The effect at the last epoch minus at epoch E - ceil(E / 4); NaN without per-epoch effects."""
    if by_epoch is None or len(by_epoch) < 2:
        return math.nan
    last = int(by_epoch.index.max())
    start = last - math.ceil(last / 4)
    if start not in by_epoch.index:
        return math.nan
    return float(by_epoch.loc[last] - by_epoch.loc[start])


def best_validation_verdict(measure: Callable[[], Measurement], judge: Callable[[Measurement], dict]) -> str:
    """The verdict of `measure()` read at each run's best-validation epoch; NOT_APPLICABLE where the
    claim reads no final test metric, or where the runs do not record the best-validation one."""
    try:
        with at_best_validation() as used:
            m = measure()
    except NotMeasured:
        return NOT_APPLICABLE
    return judge(m)["verdict"] if used else NOT_APPLICABLE


def robustness(
    claim: Claim, m: Measurement, judged: dict, level: float, on_all: str, at_best: Callable[[], str]
) -> dict:
    """The COLUMNS of one verdict row."""
    margin, low, high = judged["margin"], judged["ci_low"], judged["ci_high"]
    point = break_even(claim.kind, low, high, margin)
    fraction = point / m.reference if claim.relative_to and math.isfinite(m.reference) and m.reference else math.nan
    moved = last_quarter(m.by_epoch)
    settled = abs(moved) < (high - low) / 2 if math.isfinite(moved) and math.isfinite(high - low) else None
    return {
        "break_even": point,
        "break_even_fraction": fraction,
        "loso_flips": loso_flips(claim, m, level, margin, on_all),
        "verdict_best_val": at_best(),
        "last_quarter_change": moved,
        "settled": settled,
    }


def robustness_text(row: dict, unit: str) -> str:
    """'break-even 1.11 pp (0.101 x the error); 4 of 6 leave-one-out flip; best-val: not reproduced;
    last quarter +0.14 pp (settled)' for the report's robustness column; '—' where nothing was measured."""
    parts = []
    point = _number(row.get("break_even"))
    if math.isfinite(point):
        fraction = _number(row.get("break_even_fraction"))
        parts.append(f"break-even {point:.3g}{' ' + unit if unit else ''}"
                     + (f" ({fraction:.3g} × the error)" if math.isfinite(fraction) else ""))  # fmt: skip
    flips, n = row.get("loso_flips"), row.get("n_seeds")
    if flips is not None and not pd.isna(flips):
        parts.append(f"{int(flips)} of {int(n)} leave-one-out flip")
    best = row.get("verdict_best_val")
    if best and not pd.isna(best) and best != NOT_APPLICABLE:
        parts.append(f"best-val: {best}")
    moved = _number(row.get("last_quarter_change"))
    if math.isfinite(moved):
        settled = row.get("settled")
        state = "settled" if settled is True or str(settled) == "True" else "still moving"
        parts.append(f"last quarter {moved:+.2f}{' ' + unit if unit else ''} ({state})")
    return "; ".join(parts) or "—"


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
