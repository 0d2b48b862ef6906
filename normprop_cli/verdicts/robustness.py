"""How firmly each verdict stands, shown beside it (verdicts.csv and REPORT.md):

- `break_even`: the margin at which the verdict would change, nearest the claim's own, in the claim's
  unit (for a superiority claim, whose margin is 0, the threshold); `break_even_fraction`: that margin
  as a fraction of the baseline's error where the claim's margin is relative (C5's margin is 0.1 x
  BatchNorm's error: a break-even fraction of 0.101 means one more thousandth would flip it).
- `loso_flips`: of the leave-one-seed-out subsets (every seed left out once), how many reach another
  verdict on the remaining seeds than the verdict shown: each subset judged by the whole rule, halves
  rule included, against the all-seeds verdict after the halves rule.
- `verdict_best_val`: the verdict (halves rule included) with each run's test metric at its
  best-validation epoch in place of its final one; "not applicable" where the claim reads no final
  test metric (C2, C3, C6, C7).
- `last_quarter`: the verdict (the whole rule) at every epoch of the last quarter, from epoch
  E - ceil(E / 4) to E, E the last epoch the claim reads (the runs' last; C3: its early window's end;
  C6: rounds), as the results stood after that epoch ("4: reproduced; 5: inconclusive; 6: ..."); `settled`
  is True only where it is the same verdict at each, False where it changes (the budget, not the
  method, decides it), empty where the claim reads no epochs (C7).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pandas as pd

from normprop_cli.verdicts.readings import Measurement, NotMeasured, View
from normprop_cli.verdicts.rule import EQUIVALENCE, NON_INFERIORITY, SUPERIORITY, Claim

COLUMNS = ["break_even", "break_even_fraction", "loso_flips", "verdict_best_val", "last_quarter", "settled"]
NOT_APPLICABLE = "not applicable"
Measure = Callable[[View], Measurement]  # a claim's measurement of its sweep, read in the View it is given


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


def loso_flips(m: Measurement, judge: Callable[[Measurement], dict], shown: str) -> int | None:
    """How many leave-one-seed-out subsets, each judged by the whole rule (`judge`, halves included),
    reach another verdict than `shown`, the all-seeds verdict after the halves rule (None: under 3 seeds)."""
    seeds = sorted(set(m.table["seed"]))
    if len(seeds) < 3:
        return None
    subsets = (dataclasses.replace(m, table=m.table[m.table["seed"] != seed]) for seed in seeds)
    return sum(judge(subset)["verdict"] != shown for subset in subsets)


def quarter(last: int) -> list[int]:
    """The epochs of the last quarter: E - ceil(E / 4) .. E, none before epoch 1."""
    return list(range(max(1, last - math.ceil(last / 4)), last + 1))


def last_quarter(measure: Measure, judge: Callable[[Measurement], dict]) -> dict[int, str]:
    """{epoch: the verdict as the results stood after it} for every epoch of the last quarter; {} where
    the claim reads no epochs, or a reading cannot be measured."""
    seen = View(note_epochs=True)
    try:
        m = measure(seen)
    except NotMeasured:
        return {}
    last = m.last_epoch or (max(seen.last_epochs) if seen.last_epochs else None)
    if not last:
        return {}
    verdicts = {}
    for epoch in quarter(int(last)):
        try:
            verdicts[epoch] = judge(measure(View(epoch=epoch)))["verdict"]
        except NotMeasured:
            verdicts[epoch] = "not measured"
    return verdicts


def best_validation_verdict(measure: Measure, judge: Callable[[Measurement], dict]) -> str:
    """The verdict of the measurement read at each run's best-validation epoch; NOT_APPLICABLE where the
    claim reads no final test metric, or where the runs do not record the best-validation one."""
    best = View(best_validation=True)
    try:
        m = measure(best)
    except NotMeasured:
        return NOT_APPLICABLE
    return judge(m)["verdict"] if best.replaced else NOT_APPLICABLE


def robustness(claim: Claim, m: Measurement, judged: dict, measure: Measure,
               judge: Callable[[Measurement], dict]) -> dict:  # fmt: skip
    """The COLUMNS of one verdict row; `m` is `measure`'s reading of the results as written, `judge` the
    whole rule on a measurement (tabulate.judge)."""
    margin, low, high = judged["margin"], judged["ci_low"], judged["ci_high"]
    point = break_even(claim.kind, low, high, margin)
    fraction = point / m.reference if claim.relative_to and math.isfinite(m.reference) and m.reference else math.nan
    by_epoch = last_quarter(measure, judge)
    return {
        "break_even": point,
        "break_even_fraction": fraction,
        "loso_flips": loso_flips(m, judge, judged["verdict"]),
        "verdict_best_val": best_validation_verdict(measure, judge),
        "last_quarter": "; ".join(f"{e}: {v}" for e, v in by_epoch.items()),
        "settled": len(set(by_epoch.values())) == 1 if by_epoch else None,
    }


def robustness_text(row: dict, unit: str) -> str:
    """'break-even 1.11 pp (0.101 x the error); 4 of 6 leave-one-out flip; best-val: not reproduced;
    epochs 9-12: not settled' for the report's robustness column; '—' where nothing was measured."""
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
    quarter_text = row.get("last_quarter")
    if isinstance(quarter_text, str) and quarter_text:
        settled = row.get("settled")
        state = "settled" if settled is True or str(settled) == "True" else "not settled"
        epochs = [part.split(":")[0] for part in quarter_text.split("; ")]
        parts.append(f"epochs {epochs[0]}-{epochs[-1]}: {state}" if len(epochs) > 1 else f"epoch {epochs[0]}: {state}")
    return "; ".join(parts) or "—"


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
