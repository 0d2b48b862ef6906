"""SPEC §10: one verdict per claim of the paper (conf/claims.yaml), from the experiments' CSVs alone.

    table(results)          one row per claim (and data set) of one results tree, COLUMNS
    write_verdicts(results) <results>/verdicts.csv

Each claim has an effect oriented so that a positive effect favours the paper, a 95% interval over
seeds (scipy.stats: a t interval, or a bootstrap one) and a kind. `verdict` turns the interval into
reproduced / not reproduced / inconclusive; `judge` applies it to all seeds and to each half of them.
REPORT.md's "How a verdict is reached" says the same rule in words (`rule_text`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from normprop_cli import config, io
from normprop_cli.engine.runs import CONFIG, read_manifest
from normprop_cli.experiments import activations
from normprop_cli.experiments.results import format_ci, learned_flags

LEVEL = 0.95
RESAMPLES = 9_999  # bootstrap resamples (C3)
BOOTSTRAP_SEED = 2016
EARLY_EPOCHS = 3  # C3's window when the run's config has no experiment.early_epochs (SPEC §6.1: >= 3)

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
NOT_MEASURED, NOT_YET_MEASURED = "not measured", "not yet measured"
SUPERIORITY, NON_INFERIORITY = "superiority", "non-inferiority"

COLUMNS = ["dataset", "preset", "claim", "source", "experiment", "metric", "normprop", "baseline",
           "effect", "ci_low", "ci_high", "test", "n_seeds", "verdict", "verdict_half_a",
           "verdict_half_b", "budget", "note"]  # fmt: skip


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


# ---- measurements: each claim's per-seed table from the CSVs ----------------------------------------


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
    return [f"{k} of {len(runs)} runs did not learn (final accuracy within 5 points of chance); they count"]


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
            "comparable with the paper's GTX Titan X figure"
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
    band = float(config.load("theory").theory.band)
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
        notes.append(f"with the ICML form (divide by 1.21) the largest deviation is {text}, {where} the band")
    plain = deviations(propagation, None, "none")
    if len(plain):
        notes.append(f"a plain Glorot ReLU net: largest deviation {plain['deviation'].mean():.3g}")
    depth = int(propagation.loc[propagation["net"] == "fc", "layer"].max())
    return Measurement(
        table, one_sample(-1), "one-sample t on per-seed deviations", {"band": f"{band:g}", "depth": depth}, notes
    )


def c8_activations(claim: Claim, sweep: Path, prov: dict) -> Measurement:
    """Per seed, the smallest over the activations other than ReLU of (NormProp minus BatchNorm with that
    activation) minus (NormProp minus BatchNorm with ReLU): what leaving ReLU costs NormProp, apart from
    how it compares with BatchNorm on ReLU (C5). activations.paired_gaps and worst_per_seed read the
    columns the runner writes."""
    summary = read(sweep / "summary.csv", ["method", "activation", "seed", activations.ACCURACY])
    runs = finished(summary, activations.ACCURACY)
    gaps = activations.paired_gaps(runs)
    worst = activations.worst_per_seed(gaps)
    if not len(worst):
        raise NotMeasured(
            f"no seed with NormProp and BatchNorm runs of every activation, {activations.REFERENCE} included"
        )
    table = pd.DataFrame({"seed": worst["seed"], "normprop": worst["gap"], "baseline": worst["reference_gap"]})
    names = [a for a in dict.fromkeys(gaps["activation"]) if a != activations.REFERENCE]
    notes = [f"normprop / baseline = NormProp minus BatchNorm (pp) with the worst other activation / with "
             f"{activations.REFERENCE}, per seed"]  # fmt: skip
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
        {"activations": "/".join(names), "reference": activations.REFERENCE},
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


# ---- where the results are and how they were made ---------------------------------------------------


def result_dirs(results: Path, experiment: str) -> list[Path]:
    """Where an experiment's results are: results/theory, or results/<exp>/<dataset> per data set."""
    base = Path(results) / experiment
    if experiment == "theory":
        return [base] if any(base.glob("*.csv")) else []
    return sorted(d for d in base.glob("*") if (d / "summary.csv").exists())


def provenance(directory: Path) -> dict:
    """Preset, device, data set and the resolved config of one of the sweep's runs."""
    runs = sorted((directory / "runs").glob("*/manifest.json"))
    if not runs:
        return {}
    manifests = [read_manifest(r.parent) or {} for r in runs]
    cfg = OmegaConf.load(runs[0].parent / CONFIG)
    return {
        "preset": manifests[0].get("preset", "?"),
        "device": ", ".join(sorted({m.get("device", "?") for m in manifests})),
        "runs": len(runs),
        "dataset": manifests[0].get("dataset", directory.name),
        "cfg": cfg,
        "seeds": len({m.get("seed") for m in manifests}),
    }


PAPER_DATASETS = {"table1": ("cifar10", "cifar100", "svhn")}  # the others: CIFAR-10 (section 5)


@lru_cache(maxsize=32)
def paper_protocol(experiment: str, dataset: str) -> DictConfig:
    """The paper preset's config of an experiment, on `dataset` where the paper used it."""
    paper_sets = PAPER_DATASETS.get(experiment, ("cifar10",))
    return config.load(experiment, preset="paper", dataset=dataset if dataset in paper_sets else paper_sets[0])


def budget(prov: dict) -> str:
    """Data set, preset, epochs, seeds, width, device."""
    cfg = prov["cfg"]
    return (
        f"{prov['dataset']}, {prov['preset']}, {cfg.train.epochs} epochs, {plural(prov['seeds'], 'seed')}, "
        f"width {float(cfg.model.width):g}, {prov['device']}"
    )


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def protocol_note(experiment: str, prov: dict) -> list[str]:
    """What differs from the paper's protocol, in a few words."""
    cfg, dataset = prov["cfg"], prov["dataset"]
    paper = paper_protocol(experiment, dataset)
    out = []
    if dataset != paper.dataset.name:
        out.append(f"{dataset}, not {paper.dataset.name}: the effect's size is not comparable with the paper's")
    if cfg.train.epochs != paper.train.epochs:
        out.append(f"{cfg.train.epochs} of the paper's {paper.train.epochs} epochs")
    if float(cfg.model.width) != 1.0:
        out.append(f"width {float(cfg.model.width):g}")
    return out


# ---- the table ------------------------------------------------------------------------------------


def judge(claim: Claim, m: Measurement) -> dict:
    """The estimate on all seeds and the verdicts on all seeds and on each half."""
    full = m.estimate(m.table)
    a, b = halves(m.table["seed"])

    def verdict_of(e: Estimate) -> str:
        return verdict(claim.kind, e.ci_low, e.ci_high, claim.margin, e.n_seeds)

    on_all = verdict_of(full)
    half_a, half_b = (verdict_of(m.estimate(m.table[m.table["seed"].isin(h)])) for h in (a, b))
    return {
        "normprop": full.normprop,
        "baseline": full.baseline,
        "effect": full.effect,
        "ci_low": full.ci_low,
        "ci_high": full.ci_high,
        "test": m.test,
        "n_seeds": full.n_seeds,
        "verdict": final_verdict(on_all, half_a, half_b),
        "verdict_half_a": half_a,
        "verdict_half_b": half_b,
    }


def rows_of(claim: Claim, results: Path, preset: str) -> list[dict]:
    """One row per data set the claim's experiment ran on; one "not measured" row if none."""
    head = {"claim": claim.id, "source": claim.source, "experiment": claim.experiment}
    if claim.id not in MEASURES:
        note = f"no verdict rule yet: an `{claim.experiment}` experiment (SPEC §11) will measure it"
        if result_dirs(results, claim.experiment):
            note = f"`{claim.experiment}` results exist, but no verdict rule reads them yet"
        return [head | {"dataset": "", "preset": preset, "verdict": NOT_YET_MEASURED, "note": note}]
    dirs = result_dirs(results, claim.experiment)
    if not dirs:
        note = f"`normprop run {claim.experiment}` produces it"
        return [head | {"dataset": "", "preset": preset, "verdict": NOT_MEASURED, "note": note}]
    rows = []
    for sweep in dirs:
        prov = provenance(sweep)
        theory = claim.experiment == "theory"
        dataset = "N(0,1) input" if theory else prov.get("dataset", sweep.name)
        row = head | {"dataset": dataset, "preset": preset if theory else prov.get("preset", preset)}
        try:
            m = MEASURES[claim.id](claim, sweep, prov)
        except NotMeasured as exc:
            note = f"{exc}; `normprop run {claim.experiment}` with this version produces it"
            rows.append(row | {"verdict": NOT_MEASURED, "note": note})
            continue
        notes = list(m.notes)
        if theory:
            seeds = m.table["seed"].nunique()
            row["budget"] = f"N(0,1) input, no training, fc net of {m.metric['depth']} layers, {plural(seeds, 'seed')}"
        elif prov:
            row["budget"] = budget(prov)
            notes += protocol_note(claim.experiment, prov)
        rows.append(row | {"metric": claim.metric.format(**m.metric)} | judge(claim, m) | {"note": "; ".join(notes)})
    return rows


def tree_preset(results: Path) -> str:
    """The preset most of a results tree's sweeps ran with ('' when none says)."""
    presets = [provenance(d).get("preset") for e in {c.experiment for c in claims()} for d in result_dirs(results, e)]
    presets = [p for p in presets if p]
    return max(set(presets), key=presets.count) if presets else ""


def table(results: Path) -> pd.DataFrame:
    """One row per claim (per data set where a claim's experiment ran on several), COLUMNS."""
    results = Path(results)
    preset = tree_preset(results)
    rows = [row for claim in claims() for row in rows_of(claim, results, preset)]
    frame = pd.DataFrame(rows).reindex(columns=COLUMNS)
    return frame.astype({"n_seeds": "Int64"})


def write_verdicts(results: Path, frame: pd.DataFrame | None = None) -> Path:
    """<results>/verdicts.csv."""
    return io.write_csv(Path(results) / "verdicts.csv", table(results) if frame is None else frame)
