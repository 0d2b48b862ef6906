"""C8, "NormProp works with other activations through their own constants": two parts, both needed.

(a) it works: per seed, the smallest over the activations other than ReLU of NormProp's final test
    accuracy (%) with that activation minus with ReLU (`own_changes`): NormProp's own change from
    ReLU, judged against -m, m the claim's margin (non-inferiority).
(b) through their own constants: per seed, the smallest over the ablated activations of NormProp's
    accuracy with the activation's own c2, c1 and Jacobian factor minus with ReLU's in their place,
    the same function and budget (`constants_gains`; the ablated layers are nn.stats' `<name>_reluconst`),
    judged against 0 (superiority): the constants are what make it work.

Both must hold (an intersection-union test): C8's interval is [min(low_a, low_b - m), min(high_a,
high_b - m)] with each part's own 95% t interval over seeds, read by the non-inferiority rule at -m. So
C8 is reproduced only where (a) lies above -m and (b) above 0, and not reproduced where (a) lies below
-m or (b) below 0; each decision errs at most 2.5% one-sided per part. The effect, min(mean_a,
mean_b - m), is the part nearer its threshold. The per-seed worst over activations is conservative for
"reproduced" (E[min] <= min E). Without ablation runs part (b), and so C8, has no interval.
NormProp against BatchNorm with the same activation is a note beside it (gaps.paired_gaps).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from normprop_cli.statistics import format_ci, t_interval
from normprop_cli.verdicts.gaps import ACCURACY, REFERENCE, paired_gaps
from normprop_cli.verdicts.readings import (
    Measurement,
    NotMeasured,
    View,
    diverged_note,
    finished,
    learned_note,
    read,
)
from normprop_cli.verdicts.rule import Claim, Estimate, absolute_margin
from normprop_cli.verdicts.sources import plural

ABLATION = "_reluconst"  # nn.stats: "<name>_reluconst" is <name>'s function with ReLU's constants


def ablated(activation: str) -> bool:
    return str(activation).endswith(ABLATION)


def normprop_accuracy(summary: pd.DataFrame, value: str = ACCURACY) -> pd.DataFrame:
    """seed x activation: NormProp's `value` (complete runs with a finite value), the grid's order."""
    runs = summary[summary["method"] == "normprop"] if "method" in summary else summary
    wide = finished(runs, value).pivot_table(index="seed", columns="activation", values=value, aggfunc="mean")
    return wide[[a for a in dict.fromkeys(summary["activation"]) if a in wide.columns]]


def own_changes(wide: pd.DataFrame) -> pd.DataFrame:
    """seed, activation, change: NormProp with each activation (ablations aside) minus with ReLU."""
    others = [a for a in wide.columns if a != REFERENCE and not ablated(a)]
    if REFERENCE not in wide or not others:
        return pd.DataFrame(columns=["seed", "activation", "change"])
    d = wide[others].sub(wide[REFERENCE], axis=0)
    return d.reset_index().melt(id_vars="seed", var_name="activation", value_name="change").dropna()


def constants_gains(wide: pd.DataFrame) -> pd.DataFrame:
    """seed, activation, change: NormProp with each ablated activation's own constants minus with ReLU's."""
    pairs = [(a[: -len(ABLATION)], a) for a in wide.columns if ablated(a) and a[: -len(ABLATION)] in wide]
    if not pairs:
        return pd.DataFrame(columns=["seed", "activation", "change"])
    d = pd.DataFrame({own: wide[own] - wide[ablation] for own, ablation in pairs}, index=wide.index)
    return d.reset_index().melt(id_vars="seed", var_name="activation", value_name="change").dropna()


def worst(changes: pd.DataFrame) -> pd.DataFrame:
    """seed, activation, change: per seed that has every activation of `changes`, the smallest change."""
    if not len(changes):
        return pd.DataFrame(columns=["seed", "activation", "change"])
    k = changes["activation"].nunique()
    full = changes[changes.groupby("seed")["activation"].transform("nunique") == k]
    return full.loc[full.groupby("seed")["change"].idxmin()].reset_index(drop=True)


def both_parts(margin: float):
    """The estimate of C8 on a per-seed table (seed, works, constants) with the absolute margin m fixed
    (the same m judges all seeds, each half and each subset): the module's intersection-union interval."""

    def estimate(t: pd.DataFrame, level: float = 0.95) -> Estimate:
        a, b = t_interval(t["works"], level), t_interval(t["constants"], level)
        shifted = (b[0] - margin, b[1] - margin, b[2] - margin)
        pairs = zip(a, shifted, strict=True)
        combined = [min(x, y) if math.isfinite(x) and math.isfinite(y) else math.nan for x, y in pairs]
        return Estimate(a[0], b[0], *combined, n_seeds=int(t["seed"].nunique()))

    return estimate


def c8_activations(claim: Claim, sweep: Path, prov: dict, view: View | None = None) -> Measurement:
    summary = read(sweep / "summary.csv", ["method", "activation", "seed", ACCURACY], view)
    wide = normprop_accuracy(summary)
    works, constants = worst(own_changes(wide)), worst(constants_gains(wide))
    if not len(works):
        raise NotMeasured(f"no seed with NormProp runs of every activation, {REFERENCE} included")
    table = works[["seed"]].assign(works=works["change"].to_numpy(dtype=float))
    table = table.merge(constants[["seed", "change"]].rename(columns={"change": "constants"}), on="seed", how="left")
    reference = float(100.0 - wide.loc[table["seed"], REFERENCE].mean())
    m = absolute_margin(claim, reference)
    names = [a for a in wide.columns if a != REFERENCE and not ablated(a)]
    with_ablation = sorted(set(constants_gains(wide)["activation"]), key=names.index)
    notes = [
        "normprop = part (a), NormProp's own change from ReLU: per seed the worst of "
        f"{'/'.join(names)} of NormProp's accuracy minus with ReLU (pp), against -m; baseline = part (b), "
        "the constants: per seed the worst of "
        f"{'/'.join(with_ablation) or 'no activation'} of NormProp with its own constants minus with ReLU's "
        "(pp), against 0; the effect and interval are the smaller of (a) and (b) - m (both parts must hold)"
    ]
    for label, part, against in (("(a)", table["works"], f"-{m:.3g}"), ("(b)", table["constants"], "0")):
        mean, low, high = t_interval(part)
        n = int(part.notna().sum())
        notes.append(f"part {label}: {format_ci(mean, low, high)} pp over {n} seeds, against {against}")
    for label, changes in (("(a)", own_changes(wide)), ("(b)", constants_gains(wide))):
        for name, g in changes.groupby("activation", sort=False):
            mean, low, high = t_interval(g["change"])
            notes.append(f"{label} {name}: {format_ci(mean, low, high)} pp over {len(g)} seeds")
    if not len(constants):
        notes.append(
            f"no ablation runs (NormProp with ReLU's constants): part (b) is not measured, {claim.id} has no interval"
        )
    counts = works["activation"].value_counts()
    notes.append("(a)'s worst activation: " + ", ".join(f"{a} for {plural(n, 'seed')}" for a, n in counts.items()))
    for name, g in paired_gaps(summary).groupby("activation", sort=False):  # against BatchNorm: context
        mean, low, high = t_interval(g["gap"])
        notes.append(f"NormProp minus BatchNorm, {name}: {format_ci(mean, low, high)} pp over {len(g)} seeds")
    runs = finished(summary, ACCURACY)
    return Measurement(
        table,
        both_parts(m),
        "one-sample t on per-seed worst differences, per part; both parts must hold (intersection-union)",
        {"activations": "/".join(names), "reference": REFERENCE, "ablated": "/".join(with_ablation) or "none"},
        notes + learned_note(runs) + diverged_note(summary, "setting"),
        reference,
    )
