"""The package's statistics, below the experiments and the verdicts: one `LEVEL`, one t interval
(`t_interval`, scipy's one-sample t; `paired_interval` is it on paired differences, `mean_ci` is it as
a table's row: n, mean, sd, ci_low, ci_high) for the verdicts' per-seed effects and for the experiments'
quantities that are not proportions (seconds, drift, differences in pp), `proportion_ci`, which stays
inside [0, 100] for accuracies and errors in %, `welch`, the difference of two groups of independent
seeds; how they are written ("88.10 [86.93, 89.27]"), and markdown tables."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

LEVEL = 0.95  # the paper's caps, and the verdicts' superiority and non-inferiority: 95% confidence interval
PROPORTION_EPS = 1e-6  # a mean proportion is kept this far inside (0, 1) before its logit


def t_interval(values: Iterable[float], level: float = LEVEL) -> tuple[float, float, float]:
    """The mean and its one-sample Student-t interval at `level` (scipy.stats.ttest_1samp), the
    interval of a verdict's per-seed effects. Non-finite values (a diverged run) are left out; with
    fewer than 2 values there is no interval (NaN)."""
    from scipy import stats

    x = _finite(values)
    mean = float(x.mean()) if len(x) else math.nan
    if len(x) < 2:
        return mean, math.nan, math.nan
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # identical values (zero variance): the interval is the mean
        ci = stats.ttest_1samp(x, 0.0).confidence_interval(level)
    return mean, float(ci.low), float(ci.high)


def paired_interval(x, y, level: float = LEVEL) -> tuple[float, float, float]:
    """Mean of x - y (paired by position) and its paired t interval at `level`: t_interval of the
    differences, which is scipy.stats.ttest_rel's interval. A non-finite difference makes the mean
    non-finite and the interval NaN (pairs are not dropped)."""
    d = np.asarray(x, dtype=float) - np.asarray(y, dtype=float)
    if not np.isfinite(d).all():
        return float(d.mean()), math.nan, math.nan
    return t_interval(d, level)


def mean_ci(values: Iterable[float], level: float = LEVEL) -> dict:
    """t_interval as a row of the experiments' tables, for quantities that are not proportions (seconds,
    drift, differences of accuracies in pp): n, mean, sample sd, ci_low and ci_high. The same numbers
    as t_interval's, so a quantity in a table and in a verdict has one interval. Non-finite values (a
    diverged run) are left out; with n = 1 there is no interval (NaN)."""
    x = _finite(values)
    mean, low, high = t_interval(x, level)
    sd = float(x.std(ddof=1)) if len(x) > 1 else math.nan
    return {"n": len(x), "mean": mean, "sd": sd, "ci_low": low, "ci_high": high}


class Difference(NamedTuple):
    """A difference of two means, its interval and the two-sided p-value of no difference (welch)."""

    diff: float
    low: float
    high: float
    p: float


def welch(
    a: Iterable[float], b: Iterable[float], level: float = LEVEL, bounds: tuple[float, float] | None = None
) -> Difference:
    """mean(a) - mean(b), its Welch interval at `level` (independent seeds, unequal variances) and the
    two-sided p-value. Non-finite values are left out; with fewer than 2 on a side the interval and p
    are NaN; with no spread on either side the interval is the difference itself and p is NaN. Where the
    difference has `bounds` (two accuracies in %: (-100, 100)), the interval is kept within them, and with
    no spread on either side (an interval of no width) there is none: near-identical accuracies say nothing
    about a difference."""
    from scipy.special import stdtr, stdtrit

    x, y = _finite(a), _finite(b)
    diff = float(x.mean() - y.mean()) if len(x) and len(y) else math.nan
    if len(x) < 2 or len(y) < 2:
        return Difference(diff, math.nan, math.nan, math.nan)
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    if vx + vy == 0:
        low, high, p = diff, diff, math.nan
    else:
        df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
        se = math.sqrt(vx + vy)
        half = float(stdtrit(df, 0.5 + level / 2)) * se
        low, high, p = diff - half, diff + half, float(2 * stdtr(df, -abs(diff) / se))
    if bounds is None:
        return Difference(diff, low, high, p)
    if low == high:
        return Difference(diff, math.nan, math.nan, math.nan)
    return Difference(diff, max(low, bounds[0]), min(high, bounds[1]), p)


def proportion_ci(values: Iterable[float], level: float = LEVEL, scale: float = 100.0) -> dict:
    """n, mean, sample sd and a `level` (95%) interval of the mean that stays inside [0, scale]: the
    interval of every accuracy and error in % (scale 100) over seeds.

    The method: the Student-t interval of the mean, formed on the logit scale of the mean proportion
    p = mean / scale and mapped back (the delta method, as for a logit-transformed interval of a
    proportion): logit(p) -/+ t((1+level)/2, n-1) se / (p (1 - p)), with se = sd / (scale sqrt(n)),
    then scale x logistic(.) of both ends. Away from 0 and 100 with a narrow spread it is the plain
    t interval of mean_ci; near a bound, or on bimodal outcomes (runs that learned beside runs that
    did not), it is asymmetric and never passes the bound. The centre stays the arithmetic mean,
    which the interval always contains (a t interval of the seeds' own logits would be centred on
    another mean, and on bimodal outcomes could miss the arithmetic one). p is kept within
    [PROPORTION_EPS, 1 - PROPORTION_EPS] before its logit; with no spread (sd 0) the interval is the
    mean itself. Non-finite values are left out; with n = 1 there is no interval (NaN)."""
    from scipy.special import expit, logit, stdtrit

    x = _finite(values)
    n = len(x)
    mean = float(x.mean()) if n else math.nan
    sd = float(x.std(ddof=1)) if n > 1 else math.nan
    if n < 2:
        return {"n": n, "mean": mean, "sd": sd, "ci_low": math.nan, "ci_high": math.nan}
    if sd == 0.0:
        return {"n": n, "mean": mean, "sd": sd, "ci_low": mean, "ci_high": mean}
    p = min(max(mean / scale, PROPORTION_EPS), 1.0 - PROPORTION_EPS)
    half = float(stdtrit(n - 1, 0.5 + level / 2)) * sd / (scale * math.sqrt(n)) / (p * (1.0 - p))
    centre = float(logit(p))
    low, high = scale * float(expit(centre - half)), scale * float(expit(centre + half))
    return {"n": n, "mean": mean, "sd": sd, "ci_low": min(low, mean), "ci_high": max(high, mean)}


def _finite(values: Iterable[float]) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)


def format_ci(mean: float, low: float, high: float, digits: int = 2) -> str:
    """'88.10 [86.93, 89.27]', or '88.10' without an interval."""
    if not math.isfinite(mean):
        return "n/a"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def format_mean_ci(ci: Mapping, digits: int = 2) -> str:
    """format_ci of a mean_ci result or of a curves.csv row (mean, ci_low, ci_high)."""
    return format_ci(ci["mean"], ci["ci_low"], ci["ci_high"], digits)


def markdown(table, header: Sequence[str] | None = None, rule: str = " --- ") -> list[str]:
    """A markdown table's lines: the header, its rule (`rule` between the bars of every column: " --- "
    or "---"), a line per row, each cell as str() gives it (format the numbers first). `table` is a
    DataFrame, whose columns are the header unless `header` names them, or a sequence of rows with
    `header`. Every table of the report, the findings and gpu-check's summary."""
    if isinstance(table, pd.DataFrame):
        header = list(table.columns) if header is None else header
        table = table.itertuples(index=False, name=None)
    if header is None:
        raise ValueError("markdown: rows need a header")
    return [
        "| " + " | ".join(map(str, header)) + " |",
        "|" + f"{rule}|" * len(header),
        *("| " + " | ".join(map(str, row)) + " |" for row in table),
    ]


def sd_ratio_interval(x, y, level: float = LEVEL) -> tuple:
    """sd(x) / sd(y) of two independent samples and Bonett's interval at `level` on that ratio (Bonett
    2006, "Robust confidence interval for a ratio of standard deviations"), whose coverage does not
    rest on normal values: the F interval's does, and with t(5) tails it covers ~0.86 at 12 values a
    side, where this one covers ~0.94. On the log of the variance ratio,
        log(c s_x^2 / s_y^2) -/+ z sqrt((k - (n_x - 3) / n_x) / (n_x - 1) + (k - (n_y - 3) / n_y) / (n_y - 1)),
    k the pooled kurtosis estimate (n_x + n_y) sum (v - m)^4 / ((n_x - 1) s_x^2 + (n_y - 1) s_y^2)^2 with
    each sample's m its mean trimmed by 1 / (2 sqrt(n - 4)) (untrimmed at n <= 4), z the normal
    quantile and c = (n_x / (n_x - z)) / (n_y / (n_y - z)); square roots of the ends give the sd ratio.
    x, y: 1-d samples, or 2-d arrays of samples by row (vectorised; then each returned value is an
    array). Non-finite values of a 1-d sample are left out; under 3 values a side, or a zero spread
    in y, there is no interval (NaN)."""
    from scipy import stats
    from scipy.special import ndtri

    one = np.ndim(x) == 1
    x, y = (np.atleast_2d(_finite(v) if one else np.asarray(v, dtype=float)) for v in (x, y))
    (n_x, n_y), z = (x.shape[-1], y.shape[-1]), float(ndtri(0.5 + level / 2))
    with np.errstate(all="ignore"):
        v_x, v_y = x.var(axis=-1, ddof=1), y.var(axis=-1, ddof=1)
        ratio = np.sqrt(v_x / v_y)
        if min(n_x, n_y) < 3:
            nan = np.full_like(ratio, math.nan)
            return _unwrap(one, ratio, nan, nan)
        centre = lambda v, n: stats.trim_mean(v, 1 / (2 * math.sqrt(n - 4)), axis=-1) if n > 4 else v.mean(-1)  # noqa: E731
        fourth = ((x - centre(x, n_x)[:, None]) ** 4).sum(-1) + ((y - centre(y, n_y)[:, None]) ** 4).sum(-1)
        kurtosis = (n_x + n_y) * fourth / ((n_x - 1) * v_x + (n_y - 1) * v_y) ** 2
        se = np.sqrt((kurtosis - (n_x - 3) / n_x) / (n_x - 1) + (kurtosis - (n_y - 3) / n_y) / (n_y - 1))
        log_c = math.log(n_x / (n_x - z)) - math.log(n_y / (n_y - z))
        mid = log_c + np.log(v_x / v_y)
        low, high = np.exp((mid - z * se) / 2), np.exp((mid + z * se) / 2)
    bad = ~(np.isfinite(low) & np.isfinite(high)) | (v_y == 0)
    low, high = np.where(bad, math.nan, low), np.where(bad, math.nan, high)
    return _unwrap(one, ratio, low, high)


def _unwrap(one: bool, *arrays):
    return tuple(float(a[0]) for a in arrays) if one else arrays
