"""C6's pairing: two methods' epochs timed in the same round of the timing experiment (its rounds.csv).

The timing experiment trains epoch r of every method's run of a seed one after another, in an order
shuffled per round, before any method trains epoch r + 1 (experiments.interleave): a slow spell of a
shared machine then falls on every method of a round alike. A round pairs two methods' `train_seconds`
where both epochs are timed (after the warm-up), finite, and had their turns from the same command
(`process`: a round finished by another command after a kill is not a pair).

    pairs = paired_seconds(rounds, "normprop", "batchnorm")   # seed, rounds, ratio, normprop, baseline
    ratio, seeds, n = paired_ratio(rounds, "normprop", "batchnorm")

A seed's paired ratio is the median over its paired rounds of the round's method / base seconds: with
three or more rounds no single disturbed round (a slow spell that hit one method's turn and not the
other's) decides it, where a mean over rounds follows it. The ratio over seeds is the geometric mean of
the seeds' ratios, and C6's effect is 1 - it (rule.speedup on paired_seconds).
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
    "one-sample t over seeds on log(BatchNorm / NormProp seconds per epoch), each seed's ratio the median over "
    "its timed rounds of NormProp's / BatchNorm's train_seconds in the same round (the methods' epochs "
    "interleaved in a shuffled order); mapped back to 1 - the geometric mean ratio"
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
    """seed, rounds, ratio, normprop, baseline: per seed, the number of rounds in which both `method`
    and `base` have a usable epoch, the median over those rounds of the round's `method` / `base`
    seconds (`ratio`), and each one's median seconds over them (`normprop` for `method`, `baseline`
    for `base`). Seeds with no such round are left out."""
    t = usable(rounds, runs)
    one = lambda m: t.loc[t["method"] == m, [*PAIR, "train_seconds"]]  # noqa: E731
    pairs = one(method).merge(one(base), on=PAIR, suffixes=("_m", "_b"))
    columns = ["seed", "rounds", "ratio", "normprop", "baseline"]
    if not len(pairs):
        return pd.DataFrame(columns=columns)
    g = pairs.assign(ratio=pairs["train_seconds_m"] / pairs["train_seconds_b"]).groupby("seed")
    out = pd.DataFrame({"rounds": g.size(), "ratio": g["ratio"].median(), "normprop": g["train_seconds_m"].median(),
                        "baseline": g["train_seconds_b"].median()})  # fmt: skip
    return out.reset_index()[columns]


def paired_ratio(rounds: pd.DataFrame, method: str, base: str, runs=None) -> tuple[float, int, int]:
    """(ratio, seeds, rounds): the geometric mean over seeds of each seed's paired ratio of `method`'s
    seconds to `base`'s (paired_seconds), the seeds and the rounds behind it; NaN, 0, 0 without a pair."""
    p = paired_seconds(rounds, method, base, runs)
    if not len(p):
        return math.nan, 0, 0
    ratio = float(np.exp(np.log(p["ratio"].to_numpy(dtype=float)).mean()))
    return ratio, len(p), int(p["rounds"].sum())
