"""The rule behind every verdict: the claims of conf/claims.yaml, the three kinds of test (each on an
interval at its own level), the margins (relative to a baseline's error where a claim says so), the
halves rule, and the estimates that give an effect and its interval from a per-seed table
(scipy.stats: a one-sample or paired t interval, or Bonett's interval on a ratio of standard deviations)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from normprop_cli import config
from normprop_cli.statistics import (  # LEVEL: superiority and non-inferiority
    LEVEL,
    paired_interval,
    sd_ratio_interval,
    t_interval,
)

EQUIVALENCE_LEVEL = 0.90  # equivalence: two one-sided tests at 5%

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
NOT_MEASURED, NOT_YET_MEASURED = "not measured", "not yet measured"
SUPERIORITY, NON_INFERIORITY, EQUIVALENCE = "superiority", "non-inferiority", "equivalence"
AGREE, OPPOSITE_VERDICTS, NO_HALVES = "agree", "opposite verdicts", "no halves"  # the `halves` column


# ---- the claims ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    id: str
    claim: str
    source: str
    experiment: str
    kind: str | None  # superiority | non-inferiority | equivalence; None: no rule yet
    margin: float | None  # in `unit`, or the fraction of the baseline's error named by relative_to
    unit: str
    metric: str
    relative_to: str | None = None  # the margin is this fraction of the named baseline error (pp)


@lru_cache(maxsize=1)
def claims() -> tuple[Claim, ...]:
    """conf/claims.yaml, in order C1..C8."""
    raw = OmegaConf.to_container(OmegaConf.load(config.conf_dir() / "claims.yaml"))
    return tuple(Claim(id=key, **value) for key, value in raw["claims"].items())


def claim_of(experiment: str) -> Claim:
    """The claim of conf/claims.yaml that `experiment` measures: how a sentence names it, never by a spelt id."""
    return next(c for c in claims() if c.experiment == experiment)


def level_of(kind: str | None) -> float:
    """The level of the interval a kind of test reads: 90% for equivalence (two one-sided tests at
    5%), 95% otherwise."""
    return EQUIVALENCE_LEVEL if kind == EQUIVALENCE else LEVEL


def absolute_margin(claim: Claim, reference: float = math.nan) -> float:
    """The margin in the claim's unit: claim.margin itself, or, where the claim's margin is relative
    (relative_to), claim.margin * reference, the baseline's error (%) measured on all seeds; NaN
    where such a reference is missing."""
    margin = float(claim.margin or 0.0)
    return margin * float(reference) if claim.relative_to else margin


# ---- the rule -----------------------------------------------------------------------------------------


def verdict(kind: str, ci_low: float, ci_high: float, margin: float = 0.0, n_seeds: int = 2) -> str:
    """The rule on an interval (at level_of(kind)) and an absolute margin m >= 0.
    Superiority: reproduced if ci_low > 0, not reproduced if ci_high < 0.
    Non-inferiority: reproduced if ci_low > -m, not reproduced if ci_high < -m.
    Equivalence: reproduced if -m < ci_low and ci_high < m, not reproduced if ci_low > m or
    ci_high < -m. Otherwise inconclusive, and so with fewer than 2 seeds, no finite interval, or
    (non-inferiority, equivalence) no finite margin."""
    margin = float(0.0 if margin is None else margin)
    finite = math.isfinite(ci_low) and math.isfinite(ci_high) and (kind == SUPERIORITY or math.isfinite(margin))
    if n_seeds < 2 or not finite:
        return INCONCLUSIVE
    if kind == EQUIVALENCE:
        if -margin < ci_low and ci_high < margin:
            return REPRODUCED
        return NOT_REPRODUCED if ci_low > margin or ci_high < -margin else INCONCLUSIVE
    threshold = -margin if kind == NON_INFERIORITY else 0.0
    if ci_low > threshold:
        return REPRODUCED
    return NOT_REPRODUCED if ci_high < threshold else INCONCLUSIVE


def side(kind: str, estimate: float, margin: float = 0.0) -> int:
    """Where a point estimate lies against the test's threshold: +1 on the paper's side (superiority:
    above 0; non-inferiority: above -margin; equivalence: inside (-margin, +margin)), -1 on the other,
    0 on the threshold itself or where there is no estimate or margin."""
    margin = float(0.0 if margin is None else margin)
    if not math.isfinite(estimate) or (kind != SUPERIORITY and not math.isfinite(margin)):
        return 0
    if kind == EQUIVALENCE:
        return int(np.sign(margin - abs(estimate)))
    return int(np.sign(estimate - (-margin if kind == NON_INFERIORITY else 0.0)))


def threshold_text(kind: str, margin: float = 0.0, unit: str = "") -> str:
    """The test's threshold in words: '0', '-0.84 pp', '±0.84 pp'."""
    if kind == SUPERIORITY:
        return "0"
    sign = "±" if kind == EQUIVALENCE else "-"
    return f"{sign}{float(margin or 0.0):.3g}{' ' + unit if unit else ''}"


def halves(seeds) -> tuple[list, list]:
    """The distinct seeds sorted; half a = the first n // 2, half b = the rest."""
    distinct = sorted(set(seeds))
    return distinct[: len(distinct) // 2], distinct[len(distinct) // 2 :]


def halves_check(kind: str, half_a: Estimate, half_b: Estimate, margin: float = 0.0, unit: str = "") -> str:
    """How the two halves of the seeds compare (the `halves` column): NO_HALVES where a half has fewer
    than 2 seeds; OPPOSITE_VERDICTS where one half is reproduced and the other not reproduced;
    'estimates on opposite sides of <threshold>' where their point estimates lie on opposite sides of
    the test's threshold; AGREE otherwise (one conclusive and one inconclusive half, or two
    inconclusive halves on the same side, agree)."""
    if min(half_a.n_seeds, half_b.n_seeds) < 2:
        return NO_HALVES
    verdicts = {verdict(kind, h.ci_low, h.ci_high, margin, h.n_seeds) for h in (half_a, half_b)}
    if verdicts == {REPRODUCED, NOT_REPRODUCED}:
        return OPPOSITE_VERDICTS
    if side(kind, half_a.effect, margin) * side(kind, half_b.effect, margin) < 0:
        return f"estimates on opposite sides of {threshold_text(kind, margin, unit)}"
    return AGREE


def final_verdict(
    kind: str, on_all: str, half_a: Estimate, half_b: Estimate, margin: float = 0.0, unit: str = ""
) -> tuple[str, str]:
    """The verdict on all seeds, and why it stands or falls: it is downgraded to inconclusive only
    where the halves disagree (halves_check: opposite verdicts, or estimates on opposite sides of
    the threshold)."""
    check = halves_check(kind, half_a, half_b, margin, unit)
    return (on_all if check in (AGREE, NO_HALVES) else INCONCLUSIVE), check


KIND_WORDS = {  # the words of a claim that call for each kind of test
    SUPERIORITY: "that NormProp is better, faster, more stable or closer",
    NON_INFERIORITY: "that it matches or beats the baseline, or works",
    EQUIVALENCE: "that it is as good as the baseline, or unaffected",
}
KIND_RULE = {  # reproduced / not reproduced, with m the claim's margin
    SUPERIORITY: "**reproduced** when it lies wholly above 0 and **not reproduced** when it lies wholly below 0",
    NON_INFERIORITY: "**reproduced** when it lies wholly above −m and **not reproduced** when it lies wholly below −m",
    EQUIVALENCE: "**reproduced** when it lies inside (−m, +m) and **not reproduced** when it lies wholly outside it "
    "(above +m or below −m)",
}


def _kind_sentence(kind: str) -> str:
    ids = ", ".join(c.id for c in claims() if c.kind == kind)
    level = f"{level_of(kind):.0%} interval" + (" (two one-sided tests at 5%)" if kind == EQUIVALENCE else "")
    return f"A claim {KIND_WORDS[kind]} ({kind}{': ' + ids if ids else ''}) reads the {level}: {KIND_RULE[kind]}."


def margins_text() -> str:
    """Each margin of claims(), in words: 'C1 0.1 × the test error (%) of ...', or 'C9 1 pp'."""
    parts = []
    for c in claims():
        if c.relative_to:
            parts.append(f"{c.id} {float(c.margin or 0.0):g} × {c.relative_to}")
        elif c.kind in (NON_INFERIORITY, EQUIVALENCE):
            parts.append(f"{c.id} {float(c.margin or 0.0):g}{' ' + c.unit if c.unit else ''}")
    return "; ".join(parts)


def _final_test() -> str:
    """The claims whose metric is a final test accuracy or error, which the best-validation check re-reads."""
    return ", ".join(c.id for c in claims() if "final test" in c.metric) or "none"


def _own_epochs() -> str:
    """'; C3: its early window, C6: its rounds': the claims whose epochs are not the run's last quarter."""
    own = {"convergence": "its early window", "timing": "its rounds"}
    parts = [f"{c.id}: {own[c.experiment]}" for c in claims() if c.experiment in own]
    return "; " + ", ".join(parts) if parts else ""


def rule_text() -> str:
    """The methods paragraph of REPORT.md: the rule, once, with each claim's kind and margin."""
    return " ".join(
        [
            "Each claim's effect is oriented so that a positive value favours the paper, and has an interval "
            "over seeds (a Student t interval on per-seed differences, one-sample or paired, or, for a difference "
            "of spreads, Bonett's kurtosis-adjusted interval on the ratio of two standard deviations, which does "
            "not assume normal values). The kind of test follows the claim's words.",
            *(_kind_sentence(kind) for kind in (SUPERIORITY, NON_INFERIORITY, EQUIVALENCE)),
            "Anything else is **inconclusive**, and so is a claim measured on fewer than 2 seeds (no interval).",
            f"The margins m were fixed before the results they judge: {margins_text()}. A margin given as a "
            "fraction of a baseline's test error is that fraction of the error's mean over all seeds of the same "
            "data set and preset, in pp like the effect, and the same m judges both halves; where that error "
            "cannot be measured, neither can m, and the verdict is **inconclusive**.",
            "The verdict is also computed on each half of the seeds (sorted, split into the first n // 2 and "
            "the rest), and the all-seeds verdict is downgraded to **inconclusive** only when the halves reach "
            "opposite conclusive verdicts (one reproduced, one not reproduced) or when their point estimates "
            "lie on opposite sides of the test's threshold (superiority: 0; non-inferiority: −m; equivalence: "
            "one half's estimate inside ±m and the other's outside). One conclusive and one inconclusive half "
            "do not disagree, nor do two inconclusive halves on the same side; a half of fewer than 2 seeds "
            "leaves no halves to compare.",
            "A claim whose experiment has no results yet is **not measured**.",
            "Beside each verdict, how firmly it stands (the robustness column, and verdicts.csv): the "
            "break-even margin, the margin nearest the claim's own at which the verdict would change (for a "
            "superiority claim the threshold; as a fraction of the baseline's error where the margin is "
            "relative); how many of the leave-one-seed-out subsets, each judged by this whole rule (halves "
            "included), reach another verdict than the one shown; the verdict with each run's test metric at its "
            f"best-validation epoch instead of its last (for the claims on a final test metric: {_final_test()}); "
            "and the verdict, by this whole rule, at every epoch of the last quarter (epochs E − ⌈E/4⌉ to E of "
            f"the E the claim reads{_own_epochs()}), "
            "*settled* only where it is the same verdict at each.",
        ]
    )


# ---- estimates: an effect and its interval from a per-seed table ------------------------------------


@dataclass(frozen=True)
class Estimate:
    normprop: float = math.nan  # the two compared values, means over seeds
    baseline: float = math.nan
    effect: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    n_seeds: int = 0


def _quietly(fn, *args, **kwargs):
    """scipy warns on identical values (zero variance) and on tiny samples; the numbers stand."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def one_sample(sign: int) -> Callable[..., Estimate]:
    """Effect = mean over seeds of sign * (normprop - baseline); one-sample t on the per-seed values."""

    def estimate(t: pd.DataFrame, level: float = LEVEL) -> Estimate:
        mean, low, high = t_interval(sign * (t["normprop"] - t["baseline"]), level)
        return Estimate(t["normprop"].mean(), t["baseline"].mean(), mean, low, high, len(t))

    return estimate


def paired(sign: int) -> Callable[..., Estimate]:
    """Effect = mean of sign * (normprop - baseline); paired t (ttest_rel) on the two columns."""

    def estimate(t: pd.DataFrame, level: float = LEVEL) -> Estimate:
        first, second = (t["normprop"], t["baseline"]) if sign > 0 else (t["baseline"], t["normprop"])
        mean, low, high = paired_interval(first, second, level)
        return Estimate(t["normprop"].mean(), t["baseline"].mean(), mean, low, high, len(t))

    return estimate


def speedup(t: pd.DataFrame, level: float = LEVEL) -> Estimate:
    """C6: per seed, `ratio` = NormProp's / BatchNorm's seconds (the median over its rounds of the
    same round's ratio, rounds.paired_seconds); a one-sample t on x = -log(ratio) over seeds, mapped
    back to 1 - exp(-x) = 1 - the geometric mean ratio. `normprop`, `baseline`: each method's median
    seconds per epoch, shown beside it."""
    x, low, high = t_interval(-np.log(t["ratio"].to_numpy(dtype=float)), level)
    back = lambda v: 1.0 - math.exp(-v) if math.isfinite(v) else math.nan  # noqa: E731
    return Estimate(t["normprop"].mean(), t["baseline"].mean(), back(x), back(low), back(high), len(t))


def spread_ratio(t: pd.DataFrame, level: float = LEVEL) -> Estimate:
    """C3: 1 - (sd over seeds of NormProp's values) / (BatchNorm's): the fraction by which NormProp's
    spread is narrower (> 0 favours the paper), with Bonett's interval at `level` on the ratio of the
    two sds (statistics.sd_ratio_interval: two independent samples, kurtosis-adjusted), mapped to
    1 - ratio. It does not assume normal values, which a spread's F interval does: per-seed values
    with heavier tails than normal (Shapiro rejects some) make an F interval too narrow at a dozen
    seeds. Fewer than 3 seeds per method: no interval."""
    np_values = t.loc[t["method"] == "normprop", "value"].to_numpy(dtype=float)
    bn_values = t.loc[t["method"] == "batchnorm", "value"].to_numpy(dtype=float)
    sd = lambda v: float(np.std(v, ddof=1)) if len(v) > 1 else math.nan  # noqa: E731
    s_np, s_bn, n_seeds = sd(np_values), sd(bn_values), t["seed"].nunique()
    if not (math.isfinite(s_np) and math.isfinite(s_bn)) or s_bn == 0:
        return Estimate(s_np, s_bn, math.nan, n_seeds=n_seeds)
    _, low, high = sd_ratio_interval(np_values, bn_values, level)
    return Estimate(s_np, s_bn, 1.0 - s_np / s_bn, 1.0 - high, 1.0 - low, n_seeds)
