"""C6's pairing: two methods' epochs timed in the same round of the timing experiment (its rounds.csv).

The timing experiment trains epoch r of every method's run of a seed one after another, in an order
shuffled per round, before any method trains epoch r + 1 (experiments.interleave): a slow spell of a
shared machine then falls on every method of a round alike. A round pairs two methods' `train_seconds`
where both epochs are timed (after the warm-up), finite, and had their turns from the same command
(`process`: a round finished by another command after a kill is not a pair).

    pairs = paired_seconds(rounds, "normprop", "batchnorm")   # seed, rounds, normprop, baseline
    ratio, seeds, n = paired_ratio(rounds, "normprop", "batchnorm")

A seed's paired ratio is the geometric mean over its paired rounds of method / base seconds, which
is the ratio of the two methods' geometric mean seconds over those rounds; the ratio over seeds is
the geometric mean of the seeds' ratios, and C6's effect is 1 - it (rule.speedup on paired_seconds).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

# rounds.csv: one row per timed or warm-up epoch of a run trained in rounds
ROUND_COLUMNS = ["run", "method", "seed", "round", "position", "order", "process", "timed", "train_seconds",
                 "finished"]  # fmt: skip
PAIR = ["seed", "round", "process"]  # what two methods' epochs share to be a pair
TEST = (
    "paired t over seeds on log(BatchNorm / NormProp seconds per epoch), each seed's ratio the geometric mean "
    "over its timed rounds of BatchNorm's / NormProp's train_seconds in the same round (the methods' epochs "
    "interleaved in a shuffled order); mapped back to 1 - ratio"
)


def usable(rounds: pd.DataFrame, runs=None) -> pd.DataFrame:
    """The timed rounds with finite, positive seconds, of the runs named in `runs` where given
    (e.g. the complete ones: a diverged run's epochs are left out, as from every C6 estimate)."""
    if not len(rounds):
        return pd.DataFrame(columns=ROUND_COLUMNS)
    seconds = pd.to_numeric(rounds["train_seconds"], errors="coerce")
    keep = rounds["timed"].astype(str).str.lower().isin(["true", "1"]) & np.isfinite(seconds) & (seconds > 0)
    if runs is not None:
        keep &= rounds["run"].isin(set(runs))
    return rounds[keep].assign(train_seconds=seconds[keep])


def paired_seconds(rounds: pd.DataFrame, method: str, base: str, runs=None) -> pd.DataFrame:
    """seed, rounds, normprop, baseline: per seed, the number of rounds in which both `method` and
    `base` have a usable epoch, and the geometric means over those rounds of `method`'s seconds
    (the `normprop` column) and of `base`'s (`baseline`). Seeds with no such round are left out."""
    t = usable(rounds, runs)
    one = lambda m: t.loc[t["method"] == m, [*PAIR, "train_seconds"]]  # noqa: E731
    pairs = one(method).merge(one(base), on=PAIR, suffixes=("_m", "_b"))
    columns = ["seed", "rounds", "normprop", "baseline"]
    if not len(pairs):
        return pd.DataFrame(columns=columns)
    logs = pairs.assign(m=np.log(pairs["train_seconds_m"]), b=np.log(pairs["train_seconds_b"]))
    g = logs.groupby("seed")
    out = pd.DataFrame({"rounds": g.size(), "normprop": np.exp(g["m"].mean()), "baseline": np.exp(g["b"].mean())})
    return out.reset_index()[columns]


def paired_ratio(rounds: pd.DataFrame, method: str, base: str, runs=None) -> tuple[float, int, int]:
    """(ratio, seeds, rounds): the geometric mean over seeds of each seed's paired ratio of `method`'s
    seconds to `base`'s (paired_seconds), the seeds and the rounds behind it; NaN, 0, 0 without a pair."""
    p = paired_seconds(rounds, method, base, runs)
    if not len(p):
        return math.nan, 0, 0
    ratio = float(np.exp((np.log(p["normprop"]) - np.log(p["baseline"])).mean()))
    return ratio, len(p), int(p["rounds"].sum())
