"""Each claim's measurement: its per-seed table read from the experiment's CSVs, the estimate that
turns the table into an effect with an interval, the test's name and the notes of its row (MEASURES,
by claim id). A CSV or column that is not there raises NotMeasured."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from normprop_cli import config
from normprop_cli.experiments.results import NEAR_CHANCE, format_ci, learned_flags
from normprop_cli.verdicts.rule import (
    RESAMPLES,
    Claim,
    Estimate,
    one_sample,
    paired,
    speedup,
    spread_difference,
    t_interval,
)
from normprop_cli.verdicts.sources import paper_protocol, plural

EARLY_EPOCHS = 3  # C3's window when the run's config has no experiment.early_epochs (SPEC §6.1: >= 3)


class NotMeasured(Exception):
    """The claim's CSV, or the columns it needs, are not there: its verdict is "not measured"."""


@dataclass
class Measurement:
    table: pd.DataFrame  # per seed (or per seed and method); a `seed` column
    estimate: Callable[[pd.DataFrame], Estimate]
    test: str
    metric: dict = field(default_factory=dict)  # values for the claim's {placeholders}
    notes: list[str] = field(default_factory=list)


def read(path: Path, columns) -> pd.DataFrame:
    """A CSV with the columns the claim needs, else NotMeasured naming what is missing."""
    if not path.exists():
        raise NotMeasured(f"no {path.name}")
    frame = pd.read_csv(path)
    lacking = [c for c in columns if c not in frame.columns]
    if lacking:
        raise NotMeasured(f"{path.name} has no column(s) {', '.join(lacking)}: rerun the experiment")
    return frame


def finished(summary: pd.DataFrame, value: str) -> pd.DataFrame:
    """Runs that ended (complete or diverged: a diverged run keeps its last finite metrics), with a
    finite `value`."""
    done = summary[summary["status"].isin(["complete", "diverged"])] if "status" in summary else summary
    return done[np.isfinite(pd.to_numeric(done[value], errors="coerce"))]


def not_learned(summary: pd.DataFrame) -> pd.Series:
    """True where the summary says the run did not learn (SPEC §6.1); False where it says nothing."""
    return learned_flags(summary).eq(False)


def learned_note(runs: pd.DataFrame) -> list[str]:
    """Accuracy claims keep runs that did not learn (failing to learn is an outcome); say how many."""
    k = int(not_learned(runs).sum())
    if not k:
        return []
    return [f"{k} of {len(runs)} runs did not learn (final accuracy {NEAR_CHANCE}); they count"]


def diverged_note(runs: pd.DataFrame) -> list[str]:
    k = int((runs["status"] == "diverged").sum()) if "status" in runs else 0
    return [f"{k} run(s) diverged; their last finite metrics count"] if k else []


def per_seed(runs: pd.DataFrame, value: str, column: str, normprop, baseline, within: str | None = None):
    """seed, normprop, baseline: `value` where `column` == normprop / baseline, paired by seed (and by
    `within`, then averaged over it); only the pairs where both exist."""
    index = ["seed"] + ([within] if within else [])
    wide = runs.pivot_table(index=index, columns=column, values=value, aggfunc="mean")
    if normprop not in wide or baseline not in wide:
        raise NotMeasured(f"no runs with {column} = {normprop} and {column} = {baseline}")
    wide = wide[[normprop, baseline]].dropna().groupby("seed").mean()
    return pd.DataFrame({"seed": wide.index, "normprop": wide[normprop].values, "baseline": wide[baseline].values})


def c1_data_norm(claim: Claim, sweep: Path, prov: dict) -> Measurement:
    summary = read(sweep / "summary.csv", ["seed", "data_norm", "batch_size", "final_test_acc"])
    runs = finished(summary, "final_test_acc")
    table = per_seed(runs, "final_test_acc", "data_norm", "global", "batch", within="batch_size")
    sizes = "/".join(str(int(b)) for b in sorted(runs["batch_size"].unique()))
    notes = ["normprop = global data normalisation, baseline = batch data normalisation (both NormProp)"]
    for size, runs_of_size in runs.groupby("batch_size"):  # where the effect comes from
        e = one_sample(+1)(per_seed(runs_of_size, "final_test_acc", "data_norm", "global", "batch"))
        stopped = int((runs_of_size.get("status") == "diverged").sum()) if "status" in runs_of_size else 0
        notes.append(f"at batch {int(size)}: {format_ci(e.effect, e.ci_low, e.ci_high)} pp over {e.n_seeds} seeds"
                     + (f", {stopped} run(s) diverged" if stopped else ""))  # fmt: skip
    return Measurement(
        table,
        one_sample(+1),
        "one-sample t on per-seed differences",
        {"sizes": sizes},
        notes + learned_note(runs) + diverged_note(runs),
    )


def c2_covariate_shift(claim: Claim, sweep: Path, prov: dict) -> Measurement:
    population = read(sweep / "population.csv", ["run", "method", "seed", "layer", "epoch", "avg_drift"])
    notes = []
    summary = sweep / "summary.csv"
    if summary.exists():
        s = pd.read_csv(summary)
        compared = s["method"].isin(["normprop", "batchnorm"]) if "method" in s else True
        out = set(s.loc[not_learned(s) & compared, "run"]) if "run" in s else set()
        if out:
            population = population[~population["run"].isin(out)]
            notes.append(f"{len(out)} run(s) that did not learn left out: {', '.join(sorted(out))}")
    last = population["epoch"] == population.groupby("run")["epoch"].transform("max")
    runs = population[last].groupby(["run", "method", "seed"], as_index=False)["avg_drift"].mean()
    try:
        table = per_seed(runs, "avg_drift", "method", "normprop", "batchnorm")
    except NotMeasured:
        if not notes:
            raise
        table = pd.DataFrame(columns=["seed", "normprop", "baseline"], dtype=float)  # ran, but nothing learned
        notes.append("no seed where both NormProp and BatchNorm learned")
    probes = sweep / "probes.csv"
    if probes.exists():
        p = pd.read_csv(probes)
        if {"method", "avg_abs_final_mean"} <= set(p.columns):
            mean = p.groupby("method")["avg_abs_final_mean"].mean()
            cfg = prov.get("cfg")
            paper = OmegaConf.select(cfg, "experiment.paper_avg_abs_final_mean", default=None) if cfg else None
            paper = paper or {}
            text = ", ".join(
                f"{m} {mean[m]:.2f}" + (f" (paper {paper[m]})" if m in paper else "")
                for m in ("normprop", "batchnorm")
                if m in mean
            )
            draws = int(p["draw"].nunique()) if "draw" in p else 1
            notes.append(f"the paper's metric, average |final mean| of a probed unit per layer ({draws} draws): {text}")
    if "median_drift" in population:
        medians = population[last].groupby("method")["median_drift"].mean()
        text = ", ".join(f"{m} {medians[m]:.2f}" for m in ("normprop", "batchnorm") if m in medians)
        notes.append(f"the median over units instead of the mean, final epoch, mean over layers: {text}")
    return Measurement(table, paired(-1), "paired t over seeds", {}, notes)


def early_epochs(prov: dict) -> int:
    cfg = prov.get("cfg")
    value = OmegaConf.select(cfg, "experiment.early_epochs", default=None) if cfg is not None else None
    if value is None:
        value = OmegaConf.select(config.load("convergence"), "experiment.early_epochs", default=None)
    return int(value or EARLY_EPOCHS)


def c3_convergence(claim: Claim, sweep: Path, prov: dict) -> Measurement:
    epochs = read(sweep / "epochs.csv", ["method", "seed", "epoch", "test_acc"])
    wanted = early_epochs(prov)
    window = min(wanted, int(epochs["epoch"].max()))
    early = epochs[
        (epochs["epoch"] >= 1) & (epochs["epoch"] <= window) & epochs["method"].isin(["normprop", "batchnorm"])
    ]
    table = early.groupby(["method", "seed"], as_index=False)["test_acc"].mean().rename(columns={"test_acc": "value"})
    if set(table["method"]) != {"normprop", "batchnorm"}:
        raise NotMeasured("epochs.csv lacks NormProp or BatchNorm runs")
    notes = ["normprop / baseline = the sd over seeds (pp) of NormProp's / BatchNorm's early accuracy"]
    if window < wanted:
        notes.append(f"the runs have only {window} epoch(s); the window is cut to them")
    if (sweep / "summary.csv").exists():
        notes += learned_note(pd.read_csv(sweep / "summary.csv"))
    test = f"percentile bootstrap, {RESAMPLES:,} resamples, methods resampled independently"
    return Measurement(table, spread_difference, test, {"window": f"1-{window}"}, notes)


def c4_batch_size(claim: Claim, sweep: Path, prov: dict) -> Measurement:
    summary = read(sweep / "summary.csv", ["method", "batch_size", "seed", "final_test_acc"])
    runs = finished(summary[summary["method"] == "normprop"], "final_test_acc")
    sizes = sorted(int(b) for b in runs["batch_size"].unique())
    if 1 not in sizes or len(sizes) < 2:
        raise NotMeasured("no NormProp runs at batch 1 and at a larger batch size")
    runs = runs[runs["batch_size"].isin([1, sizes[-1]])]
    table = per_seed(runs, "final_test_acc", "batch_size", 1, sizes[-1])
    notes = [f"normprop = batch 1, baseline = batch {sizes[-1]} (both NormProp)"]
    return Measurement(
        table,
        paired(+1),
        "paired t over seeds",
        {"largest": sizes[-1]},
        notes + learned_note(runs) + diverged_note(runs),
    )


def c5_table1(claim: Claim, sweep: Path, prov: dict) -> Measurement:
    summary = read(sweep / "summary.csv", ["method", "augment", "seed", "final_test_error"])
    runs = finished(summary, "final_test_error")
    table = per_seed(runs, "final_test_error", "method", "normprop", "batchnorm", within="augment")
    augment = "/".join(str(a) for a in runs["augment"].unique())
    notes = ["normprop / baseline = test error (%)"]
    return Measurement(
        table,
        one_sample(-1),
        "one-sample t on per-seed differences",
        {"augment": augment},
        notes + learned_note(runs) + diverged_note(runs),
    )


def c6_timing(claim: Claim, sweep: Path, prov: dict) -> Measurement:
    summary = read(sweep / "summary.csv", ["method", "seed", "median_train_seconds", "device"])
    runs = finished(summary, "median_train_seconds")
    table = per_seed(runs, "median_train_seconds", "method", "normprop", "batchnorm")
    devices = sorted(runs["device"].astype(str).unique())
    dataset = prov.get("dataset", sweep.name)
    notes = ["normprop / baseline = seconds per training epoch (mean over seeds)"]
    if any(not d.startswith("cuda") for d in devices) or dataset != "cifar10":
        notes.append(
            f"{'/'.join(d.upper() if d == 'cpu' else d for d in devices)} seconds on {dataset}: not "
            f"comparable with the paper's {paper_protocol(claim.experiment, dataset).experiment.paper_device} figure"
        )
    return Measurement(table, speedup, "paired t on log seconds, mapped back to 1 - ratio", {}, notes)


def deviations(propagation: pd.DataFrame, jacobian: str, method: str = "normprop") -> pd.DataFrame:
    """Per seed: the largest over the fc net's layers of max(|mean|, |std - 1|) of the layer's output."""
    p = propagation
    p = p[(p["net"] == "fc") & (p["method"] == method) & (p["quantity"] == "output")]
    if jacobian is not None:
        p = p[p["jacobian"].astype(str) == jacobian]
    worst = np.maximum(p["mean"].abs(), (p["std"] - 1.0).abs())
    return p.assign(deviation=worst).groupby("seed", as_index=False)["deviation"].max()


def c7_theory(claim: Claim, sweep: Path, prov: dict) -> Measurement:
    propagation = read(sweep / "propagation.csv", ["net", "method", "jacobian", "layer", "quantity", "mean", "std"])
    if "seed" not in propagation:
        propagation = propagation.assign(seed=0)  # written before the seed column: one seed
    theory = config.load("theory")
    band, factor = float(theory.theory.band), theory.experiment.published.activation.relu.jacobian_factor[0]
    dev = deviations(propagation, "off")
    if not len(dev):
        raise NotMeasured("propagation.csv has no fully connected NormProp net without the Jacobian factor")
    table = pd.DataFrame({"seed": dev["seed"], "normprop": dev["deviation"], "baseline": band})
    notes = [
        f"normprop = largest deviation per seed, baseline = the band {band:g}; section 3.3 states the "
        "propagation without the Jacobian factor (jacobian=off)"
    ]
    divide = deviations(propagation, "divide")
    if len(divide):
        mean, low, high = t_interval(divide["deviation"])
        text = f"{mean:.3f}" + (f" [{low:.3f}, {high:.3f}]" if math.isfinite(low) else "")
        low, high = (low, high) if math.isfinite(low) else (mean, mean)
        where = "inside" if high < band else "outside" if low > band else "across"
        notes.append(f"with the ICML form (divide by {factor:g}) the largest deviation is {text}, {where} the band")
    plain = deviations(propagation, None, "none")
    if len(plain):
        notes.append(f"a plain Glorot ReLU net: largest deviation {plain['deviation'].mean():.3g}")
    depth = int(propagation.loc[propagation["net"] == "fc", "layer"].max())
    return Measurement(
        table, one_sample(-1), "one-sample t on per-seed deviations", {"band": f"{band:g}", "depth": depth}, notes
    )


# ---- C8 (normprop run activations): NormProp minus BatchNorm, same activation, paired by seed -------

ACCURACY = "final_test_acc"  # the column C8 compares, in summary.csv
GAP_COLUMNS = ["seed", "activation", "normprop", "batchnorm", "gap"]
WORST_COLUMNS = [*GAP_COLUMNS, "reference_gap", "relative"]
REFERENCE = "relu"  # C8 measures every other activation against NormProp's standing with ReLU


def paired_gaps(summary: pd.DataFrame, value: str = ACCURACY) -> pd.DataFrame:
    """GAP_COLUMNS: per seed and activation, the final test accuracy (%) of NormProp and of BatchNorm and
    gap = NormProp minus BatchNorm; runs that ended (complete, or diverged with their last finite
    metrics) only, and only the (seed, activation) pairs where both methods have one. `value`: another
    accuracy column (epochs.csv's test_acc, one epoch's rows)."""
    if not len(summary) or value not in summary:
        return pd.DataFrame(columns=GAP_COLUMNS)
    ended = summary["status"].isin(["complete", "diverged"]) if "status" in summary else True
    runs = summary[ended & np.isfinite(pd.to_numeric(summary[value], errors="coerce"))]
    wide = runs.pivot_table(index=["seed", "activation"], columns="method", values=value, aggfunc="mean")
    if not {"normprop", "batchnorm"} <= set(wide.columns):
        return pd.DataFrame(columns=GAP_COLUMNS)
    wide = wide[["normprop", "batchnorm"]].dropna().reset_index()
    order = {a: i for i, a in enumerate(dict.fromkeys(summary["activation"]))}  # the grid's order
    wide = wide.sort_values(["seed", "activation"], key=lambda c: c.map(order) if c.name == "activation" else c)
    return wide.assign(gap=wide["normprop"] - wide["batchnorm"])[GAP_COLUMNS].reset_index(drop=True)


def worst_per_seed(gaps: pd.DataFrame, reference: str = REFERENCE) -> pd.DataFrame:
    """WORST_COLUMNS: per seed that has a pair for every activation of `gaps`, the activation other than
    `reference` whose gap (NormProp minus BatchNorm) falls furthest below the reference's gap of that
    seed: relative = gap - reference_gap. So C8 asks what moving off ReLU costs NormProp against
    BatchNorm, not C5's question of how the two compare with ReLU. Its mean over seeds is at most the
    smallest of the activations' mean relative gaps (E[min] <= min E): a conservative effect."""
    if not len(gaps) or reference not in set(gaps["activation"]):
        return pd.DataFrame(columns=WORST_COLUMNS)
    k = gaps["activation"].nunique()
    g = gaps[gaps.groupby("seed")["activation"].transform("nunique") == k]
    ref = g[g["activation"] == reference].set_index("seed")["gap"]
    others = g[g["activation"] != reference].assign(reference_gap=lambda d: d["seed"].map(ref))
    if not len(others):
        return pd.DataFrame(columns=WORST_COLUMNS)
    others = others.assign(relative=others["gap"] - others["reference_gap"])
    return others.loc[others.groupby("seed")["relative"].idxmin(), WORST_COLUMNS].reset_index(drop=True)


def c8_activations(claim: Claim, sweep: Path, prov: dict) -> Measurement:
    """Per seed, the smallest over the activations other than ReLU of (NormProp minus BatchNorm with that
    activation) minus (NormProp minus BatchNorm with ReLU): what leaving ReLU costs NormProp, apart from
    how it compares with BatchNorm on ReLU (C5). paired_gaps and worst_per_seed read the
    columns the runner writes."""
    summary = read(sweep / "summary.csv", ["method", "activation", "seed", ACCURACY])
    runs = finished(summary, ACCURACY)
    gaps = paired_gaps(runs)
    worst = worst_per_seed(gaps)
    if not len(worst):
        raise NotMeasured(f"no seed with NormProp and BatchNorm runs of every activation, {REFERENCE} included")
    table = pd.DataFrame({"seed": worst["seed"], "normprop": worst["gap"], "baseline": worst["reference_gap"]})
    names = [a for a in dict.fromkeys(gaps["activation"]) if a != REFERENCE]
    notes = [f"normprop / baseline = NormProp minus BatchNorm (pp) with the worst other activation / with "
             f"{REFERENCE}, per seed"]  # fmt: skip
    for name, g in gaps.groupby("activation", sort=False):  # where the worst case comes from
        mean, low, high = t_interval(g["gap"])
        notes.append(f"{name}: NormProp minus BatchNorm {format_ci(mean, low, high)} pp over {len(g)} seeds")
    counts = worst["activation"].value_counts()
    notes.append("the worst activation: " + ", ".join(f"{a} for {plural(n, 'seed')}" for a, n in counts.items()))
    dropped = gaps["seed"].nunique() - len(worst)
    if dropped:
        notes.append(f"{plural(dropped, 'seed')} without a pair for every activation left out")
    return Measurement(
        table,
        one_sample(+1),
        "one-sample t on per-seed worst differences",
        {"activations": "/".join(names), "reference": REFERENCE},
        notes + learned_note(runs) + diverged_note(runs),
    )


MEASURES = {
    "C1": c1_data_norm,
    "C2": c2_covariate_shift,
    "C3": c3_convergence,
    "C4": c4_batch_size,
    "C5": c5_table1,
    "C6": c6_timing,
    "C7": c7_theory,
    "C8": c8_activations,
}
