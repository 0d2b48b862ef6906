"""The experiments' tables: summary.csv (one row per run, from its manifest and metrics), a sweep's
per-epoch metrics in one table, the mean over seeds with its 95% confidence interval (the caps of
Figs. 3 and 4); reading and writing an experiment's CSVs; the labels and rows of the report.
Figures (plots.py) read the CSVs written here, never a model.

Two intervals (normprop_cli.statistics): `proportion_ci` for accuracies and errors in % (a Student-t
interval on the logit scale, always inside [0, 100]) and `mean_ci` for everything else (seconds,
drift, differences in pp: the plain Student-t interval). Runs whose status is "diverged" are left
out of every mean over seeds of an accuracy and counted beside it (`kept`, `diverged_note`, the
`diverged` column of curves.csv); their rows stay in epochs.csv and summary.csv."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from normprop_cli import hints, io
from normprop_cli.engine.runs import METRICS, RunSpec, run_dir, sweep_dir
from normprop_cli.errors import UserError
from normprop_cli.outcomes import DIVERGED, LEARNED_MARGIN, NEAR_CHANCE, diverged, learned_flags
from normprop_cli.statistics import proportion_ci

CURVE_COLUMNS = ["epoch", "n", "diverged", "mean", "sd", "ci_low", "ci_high"]
MODES = {"eval_mode_acc": "evaluation mode", "train_mode_acc": "training mode"}
METHOD_LABELS = {"normprop": "NormProp", "batchnorm": "BatchNorm", "none": "no normalisation"}
METHOD_COLORS = {"normprop": "C0", "batchnorm": "C1", "none": "C7"}


# ---- summary.csv: one row per run, read back from each run's manifest and metrics.csv ----------------


def metrics(spec: RunSpec) -> pd.DataFrame:
    path = run_dir(spec.cfg, spec.name) / METRICS
    return pd.read_csv(path) if path.exists() and path.stat().st_size > 1 else pd.DataFrame()


def run_row(spec: RunSpec, manifest: dict | None) -> dict:
    """The columns every experiment's summary shares; errors are in percent."""
    manifest = manifest or {"status": "missing"}
    m = metrics(spec)
    row = {
        "run": spec.name,
        "setting": spec.setting,
        "method": spec.cfg.model.norm,
        "seed": spec.seed,
        "status": manifest.get("status"),
        "epochs_done": manifest.get("epochs_done", 0),
        "device": manifest.get("device"),
    }
    if len(m):
        best = m.loc[m["val_acc"].idxmax()]
        row |= {
            "final_test_error": 100.0 - m["test_acc"].iloc[-1],
            "final_val_error": 100.0 - m["val_acc"].iloc[-1],
            "best_val_epoch": int(best["epoch"]),
            "best_val_test_error": 100.0 - best["test_acc"],
            "median_epoch_seconds": m["epoch_seconds"].median(),
            "learned": learned(m["test_acc"].iloc[-1], spec.cfg),
        }
    return row


def chance(cfg) -> float:
    """Chance accuracy (%) of the run's data set."""
    return 100.0 / int(cfg.dataset.get("num_classes") or 10)


def learned(final_test_acc: float, cfg) -> bool:
    """Did the run learn: a final test accuracy more than LEARNED_MARGIN points above chance?
    Runs that did not are labelled so and kept out of headlines; their numbers stay in the CSVs."""
    return bool(final_test_acc > chance(cfg) + LEARNED_MARGIN)


def learned_in_a_mode(summary: pd.DataFrame, cfg) -> pd.Series:
    """learned_flags, and True where a run scored in training mode too (a `train_mode_acc` column:
    batch-statistics methods at batch 1, each image normalised by its own statistics) learned there:
    a run did not learn only when its final accuracy is at or below chance + LEARNED_MARGIN in every
    mode it is scored in."""
    flags = learned_flags(summary)
    if "train_mode_acc" not in summary:
        return flags
    train = pd.to_numeric(summary["train_mode_acc"], errors="coerce")
    return flags.mask(train > chance(cfg) + LEARNED_MARGIN, True)


def did_not_learn(accuracy: float, cfg, mode: str = "evaluation mode") -> str:
    """'did not learn in evaluation mode (4.50%; chance is 10%)': the final accuracy (mean over the
    runs) of runs at or below chance + LEARNED_MARGIN, which may lie below chance."""
    where = f" in {mode}" if mode else ""
    return f"did not learn{where} ({accuracy:.2f}%; chance is {chance(cfg):g}%)"


def kept(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows of summary.csv that a mean over seeds of an accuracy keeps: every run but the diverged."""
    return runs[~diverged(runs)]


def with_columns(runs: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """`runs` with each of `columns` it lacks added, empty (NaN): the summary of runs that all diverged
    in their first epoch has no metric columns, and a mean over none of them is NaN, not a KeyError."""
    return runs.assign(**{c: math.nan for c in columns if c not in runs})


def diverged_note(runs: pd.DataFrame) -> str:
    """'2 of 10 runs diverged (left out)' for the rows of summary.csv behind one number; '' when none did."""
    k = int(diverged(runs).sum())
    return f"{k} of {len(runs)} runs diverged (left out)" if k else ""


def with_diverged(text: str, runs: pd.DataFrame) -> str:
    """A number's text, with diverged_note(runs) beside it where runs diverged."""
    note = diverged_note(runs)
    return f"{text}; {note}" if note else text


def summarise(cfg, specs: Sequence[RunSpec], manifests: Sequence[dict | None], columns=lambda spec: {}) -> Path:
    """summary.csv, one row per run: the engine's columns (run_row), then the experiment's `columns(spec)`."""
    rows = [run_row(s, m) | columns(s) for s, m in zip(specs, manifests, strict=True)]
    return io.write_csv(sweep_dir(cfg) / "summary.csv", pd.DataFrame(rows))


def read_csv(path: Path, command: str) -> pd.DataFrame:
    """A CSV that a figure or the report needs; missing is a one-line error naming the command."""
    if not path.exists():
        raise UserError(f"{path} is missing; `{command}` produces it")
    return pd.read_csv(path)


# ---- curves: the mean over seeds with its confidence interval, and drawing it ------------------------


def gather(specs: Sequence[RunSpec], name: str = "metrics", columns: Mapping[str, str] = {}) -> pd.DataFrame:
    """Every run's `runs/<run>/<name>.csv` (its metrics, or an Observer's rows) in one long table,
    with the run's name, setting, method and seed, and `columns` = {column: dotted config key}."""
    frames = []
    for spec in specs:
        path = run_dir(spec.cfg, spec.name) / f"{name}.csv"
        if not path.exists() or path.stat().st_size <= 1:
            continue
        head = {"run": spec.name, "setting": spec.setting, "method": spec.cfg.model.norm, "seed": spec.seed}
        head |= settings(spec, columns)
        table = pd.read_csv(path)
        frames.append(table.assign(**head)[list(head) + list(table.columns)])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def settings(spec: RunSpec, columns: Mapping[str, str]) -> dict:
    """The run's values of `columns` = {column: dotted config key}, e.g. {"initial_lr": "train.lr"}."""
    return {col: OmegaConf.select(spec.cfg, key) for col, key in columns.items()}


def of_run(epochs: pd.DataFrame, run: str) -> pd.DataFrame:
    """One run's rows of a table that `gather` made (empty when the run has none)."""
    return epochs[epochs["run"] == run] if len(epochs) else epochs


def accuracy(epochs: pd.DataFrame, run: str) -> dict:
    """A run's final and best test accuracy (%), for its summary row; {} before its first epoch."""
    m = of_run(epochs, run)
    return {"final_test_acc": m["test_acc"].iloc[-1], "best_test_acc": m["test_acc"].max()} if len(m) else {}


def write_curves_and_summary(cfg, specs, manifests, epochs, keys, columns=lambda spec: {}, carry=()) -> Path:
    """epochs.csv, curves.csv (mean and interval over seeds per `keys`, with the `carry` columns; the
    diverged runs left out and counted) and summary.csv: the engine's columns, `columns(spec)` and the
    run's final and best test accuracy. Returns summary.csv."""
    write(cfg, "epochs", epochs)
    gone = {spec.name for spec, m in zip(specs, manifests, strict=True) if (m or {}).get("status") == DIVERGED}
    write(cfg, "curves", curves(epochs, keys, carry=carry, diverged=gone))
    return summarise(cfg, specs, manifests, lambda spec: columns(spec) | accuracy(epochs, spec.name))


def curves(
    epochs: pd.DataFrame,
    keys: Sequence[str],
    value: str = "test_acc",
    carry: Sequence[str] = (),
    diverged: Collection[str] = (),
) -> pd.DataFrame:
    """Per setting (`keys`) and epoch: the mean over seeds of `value`, an accuracy in %, and its 95%
    interval (proportion_ci), after the epoch the `carry` columns, which are the same for every seed
    of a setting's epoch (e.g. updates). The runs named in `diverged` are left out of every epoch of
    their setting, also the epochs before they diverged, and counted in the `diverged` column (those
    with a row in `epochs`); a setting whose every run diverged keeps its epochs with n = 0."""
    columns = [*keys, "epoch", *carry, *CURVE_COLUMNS[1:]]
    if not len(epochs):
        return pd.DataFrame(columns=columns)
    gone = epochs["run"].isin(set(diverged)) if "run" in epochs and diverged else pd.Series(False, index=epochs.index)
    counted = epochs["run"].where(gone) if "run" in epochs else pd.Series(math.nan, index=epochs.index)
    per_setting = counted.groupby([epochs[k] for k in keys], sort=False, dropna=False).transform("nunique")
    rows = [
        dict(zip(keys, group, strict=True))
        | {"epoch": int(epoch)}
        | {c: g[c].iloc[0] for c in carry}
        | proportion_ci(g.loc[~gone[g.index], value])
        | {"diverged": int(per_setting[g.index].iloc[0])}
        for (*group, epoch), g in epochs.groupby([*keys, "epoch"], sort=False)
    ]
    return pd.DataFrame(rows, columns=columns).sort_values([*keys, "epoch"], kind="stable")


def read_curves(cfg: DictConfig, keys: Sequence[str], carry: Sequence[str] = ()) -> pd.DataFrame:
    """curves.csv; one written before diverged runs were left out (no `diverged` column) is formed
    again from epochs.csv and summary.csv's statuses, so that figures and the report never show it."""
    curve = read(cfg, "curves")
    if "diverged" in curve:
        return curve
    summary = read(cfg, "summary")
    gone = set(summary.loc[diverged(summary), "run"]) if "run" in summary else set()
    return curves(read(cfg, "epochs"), keys, carry=carry, diverged=gone)


def last_epoch(curve: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """The last epoch's row of each setting's curve."""
    return curve.sort_values("epoch").groupby(list(keys), sort=False).tail(1)


def command(cfg: DictConfig) -> str:
    """The command that (re)produces this sweep's CSVs, with the user's preset, data set and results directory."""
    return hints.of(cfg, "run", cfg.experiment.name)


def read(cfg: DictConfig, name: str) -> pd.DataFrame:
    """`<sweep>/<name>.csv`; missing is a one-line error naming the command that writes it."""
    return read_csv(sweep_dir(cfg) / f"{name}.csv", command(cfg))


def write(cfg: DictConfig, name: str, frame: pd.DataFrame) -> Path:
    return io.write_csv(sweep_dir(cfg) / f"{name}.csv", frame)


def method_label(method: str) -> str:
    return METHOD_LABELS.get(method, method)


def method_rank(method: str) -> int:
    """NormProp first, then BatchNorm, then none (the order of METHOD_LABELS)."""
    order = list(METHOD_LABELS)
    return order.index(method) if method in order else len(order)


def paper_value(cfg: DictConfig, value, paper_dataset: str = "cifar10") -> str:
    """The paper's number for the report, labelled "not comparable" beside it when this sweep is not
    on the paper's data set (e.g. digits vs CIFAR-10)."""
    if value is None or value == "" or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if cfg.dataset.name == paper_dataset:
        return f"{value}"
    return f"{value} ({paper_dataset}; not comparable with {cfg.dataset.name})"


def not_learned(cfg: DictConfig) -> list[dict]:
    """A headline row naming the runs that did not learn (learned_in_a_mode: a final accuracy at or
    below chance + LEARNED_MARGIN in every mode the run is scored in), when there are any: their
    numbers stay in the CSVs, this row says so; a diverged one is marked."""
    path = sweep_dir(cfg) / "summary.csv"
    summary = pd.read_csv(path) if path.exists() else pd.DataFrame()
    failed = summary[learned_in_a_mode(summary, cfg).eq(False)]
    if not len(failed):
        return []
    if "train_mode_acc" in summary:
        modes = "in every mode it is scored in: training and evaluation mode at batch 1, else evaluation mode"
    else:
        modes = "in evaluation mode, the only mode scored here"
    marks = diverged(failed).map({True: " (diverged)", False: ""})
    names = [f"{run}{mark}" for run, mark in zip(failed["run"], marks, strict=True)]
    quantity = f"runs that did not learn (final test accuracy {NEAR_CHANCE} {modes}; chance is {chance(cfg):g}%)"
    return [{"quantity": f"{quantity}; kept in the CSVs",
             "reproduced": f"{len(failed)} of {len(summary)}: {', '.join(names)}", "paper": ""}]  # fmt: skip


def diverged_runs(cfg: DictConfig) -> list[dict]:
    """A headline row naming the diverged runs, when there are any, for headlines that leave them
    out without a count beside each number; their numbers stay in the CSVs."""
    path = sweep_dir(cfg) / "summary.csv"
    summary = pd.read_csv(path) if path.exists() else pd.DataFrame()
    gone = summary[diverged(summary)]
    if not len(gone):
        return []
    return [{"quantity": "runs that diverged (left out of the means above; kept in the CSVs)",
             "reproduced": f"{len(gone)} of {len(summary)}: {', '.join(gone['run'])}", "paper": ""}]  # fmt: skip


def probe_set(cfg: DictConfig) -> str:
    """What the probes measured: 'the test set', or 'the first 2,000 test images' (train.probe_images)."""
    n = cfg.train.get("probe_images")
    return f"the first {int(n):,} test images" if n else "the test set"
