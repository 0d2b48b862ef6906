"""The rule behind every verdict (SPEC §10): the claims of conf/claims.yaml, the decision on a 95%
interval, and the estimates that give an effect and its interval from a per-seed table (scipy.stats:
a one-sample or paired t interval, or a percentile bootstrap)."""

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

LEVEL = 0.95
RESAMPLES = 9_999  # bootstrap resamples (C3)
BOOTSTRAP_SEED = 2016

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
NOT_MEASURED, NOT_YET_MEASURED = "not measured", "not yet measured"
SUPERIORITY, NON_INFERIORITY = "superiority", "non-inferiority"


# ---- the claims and the rule -----------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    id: str
    claim: str
    source: str
    experiment: str
    kind: str | None  # superiority | non-inferiority; None: no rule yet
    margin: float | None  # non-inferiority: how far below 0 the effect may lie, in `unit`
    unit: str
    metric: str
    relative_to: str | None = None  # the margin is this fraction of the named baseline error (pp)


@lru_cache(maxsize=1)
def claims() -> tuple[Claim, ...]:
    """conf/claims.yaml, in order C1..C8."""
    raw = OmegaConf.to_container(OmegaConf.load(config.conf_dir() / "claims.yaml"))
    return tuple(Claim(id=key, **value) for key, value in raw["claims"].items())


def verdict(kind: str, ci_low: float, ci_high: float, margin: float = 0.0, n_seeds: int = 2) -> str:
    """The rule. Superiority: reproduced if ci_low > 0, not reproduced if ci_high < 0.
    Non-inferiority with margin delta: reproduced if ci_low > -delta, not reproduced if
    ci_high < -delta. Otherwise, and with fewer than 2 seeds (no interval): inconclusive."""
    if n_seeds < 2 or not (math.isfinite(ci_low) and math.isfinite(ci_high)):
        return INCONCLUSIVE
    threshold = -float(margin or 0.0) if kind == NON_INFERIORITY else 0.0
    if ci_low > threshold:
        return REPRODUCED
    if ci_high < threshold:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def halves(seeds) -> tuple[list, list]:
    """The distinct seeds sorted; half a = the first n // 2, half b = the rest."""
    distinct = sorted(set(seeds))
    return distinct[: len(distinct) // 2], distinct[len(distinct) // 2 :]


def final_verdict(all_seeds: str, half_a: str, half_b: str) -> str:
    """The halves must agree (SPEC §10: a verdict must not flip between two disjoint sets of seeds)."""
    return all_seeds if half_a == half_b else INCONCLUSIVE


def rule_text() -> str:
    """The methods paragraph of REPORT.md: the rule above, once, with the claims' margins."""
    margins = ", ".join(
        f"{c.id} {c.margin:g}{' ' + c.unit if c.unit else ''}" for c in claims() if c.kind == NON_INFERIORITY
    )
    return (
        "Each claim's effect is oriented so that a positive value favours the paper; its 95% interval "
        "is over seeds (a Student t interval on per-seed differences, one-sample or paired, or a "
        f"percentile bootstrap with {RESAMPLES:,} resamples for a difference of spreads). A claim that "
        "NormProp is better, faster or more stable (superiority) is **reproduced** when the whole "
        "interval lies above 0 and **not reproduced** when it lies below 0. A claim that it is as good "
        "(non-inferiority, with a margin δ stated beforehand: "
        f"{margins}) is **reproduced** when the interval lies above −δ and **not reproduced** when it "
        "lies below −δ. Anything else is **inconclusive**, and so is a claim measured on fewer than 2 "
        "seeds (no interval). The verdict is computed on all seeds and on each half of them (the "
        "sorted seeds split into the first n // 2 and the rest); where the two halves disagree the "
        "verdict is inconclusive, otherwise it is the all-seeds verdict. A claim whose experiment has "
        "no results yet is **not measured**."
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


def t_interval(values) -> tuple[float, float, float]:
    """Mean and 95% one-sample t interval (NaN interval with fewer than 2 values)."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    mean = float(x.mean()) if len(x) else math.nan
    if len(x) < 2:
        return mean, math.nan, math.nan
    ci = _quietly(lambda: stats.ttest_1samp(x, 0.0).confidence_interval(LEVEL))
    return mean, float(ci.low), float(ci.high)


def paired_interval(x, y) -> tuple[float, float, float]:
    """Mean of x - y and its 95% paired t interval (scipy.stats.ttest_rel)."""
    from scipy import stats

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    mean = float((x - y).mean()) if len(x) else math.nan
    if len(x) < 2:
        return mean, math.nan, math.nan
    ci = _quietly(lambda: stats.ttest_rel(x, y).confidence_interval(LEVEL))
    return mean, float(ci.low), float(ci.high)


def one_sample(sign: int) -> Callable[[pd.DataFrame], Estimate]:
    """Effect = mean over seeds of sign * (normprop - baseline); one-sample t on the per-seed values."""

    def estimate(t: pd.DataFrame) -> Estimate:
        mean, low, high = t_interval(sign * (t["normprop"] - t["baseline"]))
        return Estimate(t["normprop"].mean(), t["baseline"].mean(), mean, low, high, len(t))

    return estimate


def paired(sign: int) -> Callable[[pd.DataFrame], Estimate]:
    """Effect = mean of sign * (normprop - baseline); paired t (ttest_rel) on the two columns."""

    def estimate(t: pd.DataFrame) -> Estimate:
        first, second = (t["normprop"], t["baseline"]) if sign > 0 else (t["baseline"], t["normprop"])
        mean, low, high = paired_interval(first, second)
        return Estimate(t["normprop"].mean(), t["baseline"].mean(), mean, low, high, len(t))

    return estimate


def speedup(t: pd.DataFrame) -> Estimate:
    """C6: paired t on log(seconds BN) - log(seconds NormProp) = x; effect 1 - exp(-x) = 1 - ratio."""
    x, low, high = paired_interval(np.log(t["baseline"]), np.log(t["normprop"]))
    back = lambda v: 1.0 - math.exp(-v) if math.isfinite(v) else math.nan  # noqa: E731
    return Estimate(t["normprop"].mean(), t["baseline"].mean(), back(x), back(low), back(high), len(t))


def spread_difference(t: pd.DataFrame) -> Estimate:
    """C3: sd over seeds of BN's values minus NormProp's, with a percentile bootstrap interval that
    resamples the two methods' per-seed values independently; < 3 seeds per method: no interval."""
    from scipy import stats

    np_values = t.loc[t["method"] == "normprop", "value"].to_numpy(dtype=float)
    bn_values = t.loc[t["method"] == "batchnorm", "value"].to_numpy(dtype=float)
    sd = lambda v: float(np.std(v, ddof=1)) if len(v) > 1 else math.nan  # noqa: E731
    estimate = Estimate(sd(np_values), sd(bn_values), sd(bn_values) - sd(np_values), n_seeds=t["seed"].nunique())
    if min(len(np_values), len(bn_values)) < 3:
        return estimate

    def statistic(bn, normprop, axis):
        return np.std(bn, ddof=1, axis=axis) - np.std(normprop, ddof=1, axis=axis)

    result = _quietly(
        stats.bootstrap,
        (bn_values, np_values),
        statistic,
        paired=False,
        vectorized=True,
        n_resamples=RESAMPLES,
        confidence_level=LEVEL,
        method="percentile",
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    )
    ci = result.confidence_interval
    return Estimate(
        estimate.normprop, estimate.baseline, estimate.effect, float(ci.low), float(ci.high), estimate.n_seeds
    )
