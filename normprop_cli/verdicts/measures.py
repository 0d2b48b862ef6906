"""Each claim's measurement: its per-seed table read from the experiment's CSVs, the estimate that
turns the table into an effect with an interval, the test's name and the notes of its row (MEASURES,
by claim id). Each reads its CSVs in the View it is given (None: as written; verdicts/robustness.py asks
for the others). A CSV or column that is not there raises NotMeasured."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from normprop_cli import config
from normprop_cli.statistics import format_ci
from normprop_cli.verdicts.constants import c8_activations
from normprop_cli.verdicts.divergence import summary_of, without_diverged
from normprop_cli.verdicts.gaps import effect_series, epoch_note
from normprop_cli.verdicts.readings import (  # noqa: F401 (NotMeasured, Measurement: this module's API)
    Measurement,
    NotMeasured,
    View,
    diverged_note,
    error_of,
    finished,
    learned_note,
    not_learned,
    per_seed,
    read,
)
from normprop_cli.verdicts.rule import (
    Claim,
    level_of,
    one_sample,
    paired,
    paired_interval,
    speedup,
    spread_ratio,
    t_interval,
)
from normprop_cli.verdicts.sources import paper_protocol, plural

EARLY_EPOCHS = 3  # C3's window when the run's config has no experiment.early_epochs (>= 3)


def c1_data_norm(claim: Claim, sweep: Path, prov: dict, view: View | None = None) -> Measurement:
    summary = read(sweep / "summary.csv", ["seed", "data_norm", "batch_size", "final_test_acc"], view)
    runs = finished(summary, "final_test_acc")
    table = per_seed(runs, "final_test_acc", "data_norm", "global", "batch", within="batch_size")
    reference = error_of(runs[(runs["data_norm"] == "batch") & runs["seed"].isin(table["seed"])])
    sizes = "/".join(str(int(b)) for b in sorted(runs["batch_size"].unique()))
    notes = ["normprop = global data normalisation, baseline = batch data normalisation (both NormProp)"]
    for size, runs_of_size in runs.groupby("batch_size"):  # where the effect comes from
        e = one_sample(+1)(per_seed(runs_of_size, "final_test_acc", "data_norm", "global", "batch"))
        notes.append(f"at batch {int(size)}: {format_ci(e.effect, e.ci_low, e.ci_high)} pp over {e.n_seeds} seeds")
    by_epoch = effect_series(sweep, runs, "data_norm", "global", "batch", within="batch_size")
    return Measurement(
        table,
        one_sample(+1),
        "one-sample t on per-seed differences",
        {"sizes": sizes},
        notes + epoch_note(by_epoch) + learned_note(runs) + diverged_note(summary, "setting"),
        reference,
        by_epoch=by_epoch,
    )


def c2_covariate_shift(claim: Claim, sweep: Path, prov: dict, view: View | None = None) -> Measurement:
    """Per run, each hidden unit's max(|mean|, |std - 1|) in the N(0, 1) units the paper aims at
    (probes.PopulationProbe's avg_deviation), averaged over layers at the final epoch; paired by
    seed, BatchNorm minus NormProp. The epoch-to-epoch shift, the drift from initialisation (in each
    unit's initial std) and the paper's probed-unit metric are notes beside it."""
    population = read(sweep / "population.csv", ["run", "method", "seed", "layer", "epoch", "avg_deviation"], view)
    notes = []
    summary = sweep / "summary.csv"
    if summary.exists():
        s = pd.read_csv(summary)
        compared = s["method"].isin(["normprop", "batchnorm"]) if "method" in s else True
        out = set(s.loc[not_learned(s) & compared, "run"]) if "run" in s else set()
        if "status" in s and "run" in s:
            out |= set(s.loc[(s["status"] == "diverged") & compared, "run"])
        if out:
            population = population[~population["run"].isin(out)]
            notes.append(f"{len(out)} run(s) that diverged or did not learn left out: {', '.join(sorted(out))}")
    last = population["epoch"] == population.groupby("run")["epoch"].transform("max")
    final = population[last]
    runs = final.groupby(["run", "method", "seed"], as_index=False)["avg_deviation"].mean()
    try:
        table = per_seed(runs, "avg_deviation", "method", "normprop", "batchnorm")
    except NotMeasured:
        if not notes:
            raise
        table = pd.DataFrame(columns=["seed", "normprop", "baseline"], dtype=float)  # ran, but nothing learned
        notes.append("no seed where both NormProp and BatchNorm learned")
    notes.append("normprop / baseline = mean over units and layers of max(|mean|, |std - 1|), final epoch")
    for column, what in (
        ("avg_shift", "the shift from the previous epoch, max(|change of mean|, |change of std|) per unit"),
        ("avg_drift", "the drift from initialisation in each unit's own initial std (method-dependent units)"),
    ):
        if column in final:
            by = final.groupby(["method", "run"])[column].mean().groupby("method").mean()
            text = ", ".join(f"{m} {by[m]:.3f}" for m in ("normprop", "batchnorm") if m in by)
            notes.append(f"{what}, final epoch, mean over layers: {text}")
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
    return Measurement(table, paired(-1), "paired t over seeds", {}, notes)


def early_epochs(prov: dict) -> int:
    cfg = prov.get("cfg")
    value = OmegaConf.select(cfg, "experiment.early_epochs", default=None) if cfg is not None else None
    if value is None:
        value = OmegaConf.select(config.load("convergence"), "experiment.early_epochs", default=None)
    return int(value or EARLY_EPOCHS)


LOGIT_CLIP = 1e-3  # errors are clipped to [0.1%, 99.9%] before the logit (a perfect epoch stays finite)


def logit_error(accuracy: pd.Series) -> pd.Series:
    """logit of the test error, log(e / (1 - e)) with e = 1 - accuracy / 100: a scale on which a
    method's spread over seeds is not smaller merely because its accuracy is higher (the binomial sd
    of an error e is proportional to sqrt(e (1 - e)); the logit divides it out to first order)."""
    e = (1.0 - accuracy / 100.0).clip(LOGIT_CLIP, 1.0 - LOGIT_CLIP)
    return np.log(e / (1.0 - e))


def c3_convergence(claim: Claim, sweep: Path, prov: dict, view: View | None = None) -> Measurement:
    summary = summary_of(sweep)  # a diverged run's epochs are counted apart, as every claim counts it
    epochs = without_diverged(read(sweep / "epochs.csv", ["method", "seed", "epoch", "test_acc"], view), summary)
    wanted = early_epochs(prov)
    window = min(wanted, int(epochs["epoch"].max())) if len(epochs) else wanted
    methods = epochs["method"].isin(["normprop", "batchnorm"])
    early = epochs[(epochs["epoch"] >= 1) & (epochs["epoch"] <= window) & methods]
    early = early.assign(value=logit_error(early["test_acc"]))
    table = early.groupby(["method", "seed"], as_index=False)["value"].mean()
    if set(table["method"]) != {"normprop", "batchnorm"}:
        raise NotMeasured("epochs.csv lacks NormProp or BatchNorm runs")
    notes = [
        "normprop / baseline = the sd over seeds of NormProp's / BatchNorm's mean logit(test error) over epochs "
        f"1-{window} (the logit scale does not reward a lower accuracy with a wider spread)"
    ]
    pp = early.groupby(["method", "seed"])["test_acc"].mean().groupby("method").agg(["mean", "std"])
    scale = ", ".join(f"{m} {pp.loc[m, 'mean']:.2f}% ({pp.loc[m, 'std']:.2f} pp)" for m in ("normprop", "batchnorm"))
    notes.append(f"on the accuracy scale, mean (sd over seeds) of the early accuracy: {scale}")
    if window < wanted:
        notes.append(f"the runs have only {window} epoch(s); the window is cut to them")
    notes += learned_note(summary) + diverged_note(summary, "setting")
    test = "Bonett's interval on the ratio of the two sds (independent samples, kurtosis-adjusted, no normality)"
    return Measurement(table, spread_ratio, test, {"window": f"1-{window}"}, notes, last_epoch=window)


def c4_batch_size(claim: Claim, sweep: Path, prov: dict, view: View | None = None) -> Measurement:
    """NormProp at batch 1 minus at the largest batch size, paired by seed, at equal epochs (the paper's
    axis: each batch 1 run with the most updates). Where a batch-1 setting trains with as many updates
    as the largest batch (train.max_steps), the same difference at equal updates is a note, with its
    interval at the claim's level."""
    columns = ["method", "setting", "batch_size", "seed", "final_test_acc", "updates"]
    summary = read(sweep / "summary.csv", columns, view)
    normprop = summary[summary["method"] == "normprop"]
    runs = finished(normprop, "final_test_acc")
    sizes = sorted(int(b) for b in runs["batch_size"].unique())
    if 1 not in sizes or len(sizes) < 2:
        raise NotMeasured("no NormProp runs at batch 1 and at a larger batch size")
    largest = runs[runs["batch_size"] == sizes[-1]]
    ones = runs[runs["batch_size"] == 1]
    per_setting = ones.groupby("setting")["updates"].max()
    epochs_setting = per_setting.idxmax()
    reference = error_of(largest)
    pick = pd.concat([ones[ones["setting"] == epochs_setting], largest])
    table = per_seed(pick, "final_test_acc", "batch_size", 1, sizes[-1])
    top_updates = int(largest["updates"].max())
    notes = [f"normprop = batch 1 ({epochs_setting}, {int(per_setting.max()):,} updates), baseline = batch "
             f"{sizes[-1]} ({top_updates:,} updates), both NormProp, equal epochs"]  # fmt: skip
    equal = [s for s, u in per_setting.items() if s != epochs_setting and int(u) == top_updates]
    if equal:
        same = per_seed(pd.concat([ones[ones["setting"] == equal[0]], largest]), "final_test_acc", "batch_size", 1,
                        sizes[-1])  # fmt: skip
        level = level_of(claim.kind)
        mean, low, high = paired_interval(same["normprop"], same["baseline"], level=level)
        notes.append(f"at equal updates ({equal[0]}: {top_updates:,} updates at batch 1): "
                     f"{format_ci(mean, low, high)} pp ({level:.0%} interval, {len(same)} seeds)")  # fmt: skip
    by_epoch = effect_series(sweep, pick, "batch_size", 1, sizes[-1])
    return Measurement(
        table,
        paired(+1),
        "paired t over seeds",
        {"largest": sizes[-1]},
        notes + epoch_note(by_epoch) + learned_note(runs) + diverged_note(normprop, "setting"),
        reference,
        by_epoch=by_epoch,
    )


def c5_table1(claim: Claim, sweep: Path, prov: dict, view: View | None = None) -> Measurement:
    summary = read(sweep / "summary.csv", ["method", "augment", "seed", "final_test_error"], view)
    runs = finished(summary, "final_test_error")
    table = per_seed(runs, "final_test_error", "method", "normprop", "batchnorm", within="augment")
    reference = float(table["baseline"].mean())
    augment = "/".join(str(a) for a in runs["augment"].unique())
    notes = ["normprop / baseline = test error (%)"]
    by_epoch = effect_series(sweep, runs, "method", "normprop", "batchnorm", within="augment")
    return Measurement(
        table,
        one_sample(-1),
        "one-sample t on per-seed differences",
        {"augment": augment},
        notes + epoch_note(by_epoch) + learned_note(runs) + diverged_note(summary, "setting"),
        reference,
        by_epoch=by_epoch,
    )


def c6_timing(claim: Claim, sweep: Path, prov: dict, view: View | None = None) -> Measurement:
    from normprop_cli.verdicts import rounds  # the pairing of epochs timed in the same round

    summary = read(sweep / "summary.csv", ["run", "method", "seed", "median_train_seconds", "device"], view)
    runs = finished(summary, "median_train_seconds")
    timed = read(sweep / "rounds.csv", rounds.ROUND_COLUMNS, view)
    table = rounds.paired_seconds(timed, "normprop", "batchnorm", runs["run"])
    if not len(table):
        raise NotMeasured("rounds.csv pairs no complete NormProp and BatchNorm runs' epochs in a timed round")
    devices, dataset = sorted(runs["device"].astype(str).unique()), prov.get("dataset", sweep.name)
    notes = ["normprop / baseline = seconds per training epoch (per seed the median over its rounds paired by "
             f"round, {int(table['rounds'].sum())} in all; mean over seeds)"]  # fmt: skip
    if any(not d.startswith("cuda") for d in devices) or dataset != "cifar10":
        notes.append(
            f"{'/'.join(d.upper() if d == 'cpu' else d for d in devices)} seconds on {dataset}: not "
            f"comparable with the paper's {paper_protocol(claim.experiment, dataset).experiment.paper_device} figure"
        )
    return Measurement(table, speedup, rounds.TEST, {}, notes)


def deviations(propagation: pd.DataFrame, jacobian: str, method: str = "normprop") -> pd.DataFrame:
    """Per seed: the largest over the fc net's layers of max(|mean|, |std - 1|) of the layer's output."""
    p = propagation
    p = p[(p["net"] == "fc") & (p["method"] == method) & (p["quantity"] == "output")]
    if jacobian is not None:
        p = p[p["jacobian"].astype(str) == jacobian]
    worst = np.maximum(p["mean"].abs(), (p["std"] - 1.0).abs())
    return p.assign(deviation=worst).groupby("seed", as_index=False)["deviation"].max()


def c7_theory(claim: Claim, sweep: Path, prov: dict, view: View | None = None) -> Measurement:
    columns = ["net", "method", "jacobian", "layer", "quantity", "mean", "std"]
    propagation = read(sweep / "propagation.csv", columns, view)
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
    seeds = plural(table["seed"].nunique(), "seed")
    return Measurement(
        table, one_sample(-1), "one-sample t on per-seed deviations", {"band": f"{band:g}", "depth": depth}, notes,
        dataset="N(0,1) input", budget=f"N(0,1) input, no training, fc net of {depth} layers, {seeds}",
    )  # fmt: skip


MEASURES = {
    "C1": c1_data_norm,
    "C2": c2_covariate_shift,
    "C3": c3_convergence,
    "C4": c4_batch_size,
    "C5": c5_table1,
    "C6": c6_timing,
    "C7": c7_theory,
    "C8": c8_activations,  # verdicts.constants: two parts, both needed
}
