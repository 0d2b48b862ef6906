"""The experiments' shared kit: summary.csv (one row per run, from its manifest and metrics), a
sweep's per-epoch metrics in one table, the mean over seeds with its 95% Student-t confidence
interval (the caps of Figs. 3 and 4), and drawing such curves; reading and writing an experiment's
CSVs and figures. Figures read the CSVs written here, never a model."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from normprop_cli import io
from normprop_cli.engine.runs import METRICS, RunSpec, run_dir, sweep_dir
from normprop_cli.errors import UserError

LEVEL = 0.95  # the paper's caps: 95% confidence interval
CURVE_COLUMNS = ["epoch", "n", "mean", "sd", "ci_low", "ci_high"]
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


LEARNED_MARGIN = 5.0  # SPEC §6.1: a run within this many points of chance did not learn
NEAR_CHANCE = f"within {LEARNED_MARGIN:g} points of chance"  # a run that did not learn


def chance(cfg) -> float:
    """Chance accuracy (%) of the run's data set."""
    return 100.0 / int(cfg.dataset.get("num_classes") or 10)


def learned(final_test_acc: float, cfg) -> bool:
    """Did the run learn: a final test accuracy more than LEARNED_MARGIN points above chance (SPEC §6.1)?
    Runs that did not are labelled so and kept out of headlines; their numbers stay in the CSVs."""
    return bool(final_test_acc > chance(cfg) + LEARNED_MARGIN)


def learned_flags(summary: pd.DataFrame, absent: bool = True) -> pd.Series:
    """summary.csv's `learned` column read back: True, False, or NaN for a run without metrics;
    `absent` for every run when the summary has no such column. Compare with .eq(True) / .eq(False)."""
    if "learned" not in summary:
        return pd.Series(absent, index=summary.index, dtype=object)
    return summary["learned"].astype(str).str.lower().map({"true": True, "false": False, "1": True, "0": False})


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


def mean_ci(values: Iterable[float], level: float = LEVEL) -> dict:
    """n, mean, sample sd and the Student-t interval mean -/+ t((1+level)/2, n-1) sd / sqrt(n).

    Non-finite values (a diverged run) are left out; with n = 1 there is no interval (NaN).
    stdtrit(df, p) is scipy.stats.t.ppf(p, df) without importing scipy.stats (seconds)."""
    from scipy.special import stdtrit

    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = len(x)
    mean = float(x.mean()) if n else math.nan
    sd = float(x.std(ddof=1)) if n > 1 else math.nan
    half = float(stdtrit(n - 1, 0.5 + level / 2) * sd / math.sqrt(n)) if n > 1 else math.nan
    return {"n": n, "mean": mean, "sd": sd, "ci_low": mean - half, "ci_high": mean + half}


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
    """epochs.csv, curves.csv (mean and CI over seeds per `keys`, with the `carry` columns) and
    summary.csv: the engine's columns, `columns(spec)` and the run's final and best test accuracy.
    Returns summary.csv."""
    write(cfg, "epochs", epochs)
    write(cfg, "curves", curves(epochs, keys, carry=carry))
    return summarise(cfg, specs, manifests, lambda spec: columns(spec) | accuracy(epochs, spec.name))


def curves(
    epochs: pd.DataFrame, keys: Sequence[str], value: str = "test_acc", carry: Sequence[str] = ()
) -> pd.DataFrame:
    """Per setting (`keys`) and epoch: the mean of `value` over seeds and its 95% interval, after the
    epoch the `carry` columns, which are the same for every seed of a setting's epoch (e.g. updates)."""
    columns = [*keys, "epoch", *carry, *CURVE_COLUMNS[1:]]
    if not len(epochs):
        return pd.DataFrame(columns=columns)
    rows = [
        dict(zip(keys, group, strict=True))
        | {"epoch": int(epoch)}
        | {c: g[c].iloc[0] for c in carry}
        | mean_ci(g[value])
        for (*group, epoch), g in epochs.groupby([*keys, "epoch"], sort=False)
    ]
    return pd.DataFrame(rows, columns=columns).sort_values([*keys, "epoch"], kind="stable")


def last_epoch(curve: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """The last epoch's row of each setting's curve."""
    return curve.sort_values("epoch").groupby(list(keys), sort=False).tail(1)


def plot_curve(ax, curve: pd.DataFrame, label: str, band: bool = False, dodge: float = 0.0, **style) -> None:
    """One mean-over-seeds curve; caps on the markers show the 95% interval (Figs. 3, 4), or a
    shaded band. Where n = 1 there is no interval and only the line is drawn. `dodge` shifts the
    epochs a little so that the caps of several curves do not hide each other."""
    low, high = curve["ci_low"].to_numpy(), curve["ci_high"].to_numpy()
    has_ci = np.isfinite(low).any()
    x, y = curve["epoch"].to_numpy() + (dodge if has_ci else 0.0), curve["mean"].to_numpy()
    style = {"marker": "o", "markersize": 3, "linewidth": 1.2} | style
    if band or not has_ci:
        (line,) = ax.plot(x, y, label=label, **style)
        if has_ci:
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    else:
        yerr = np.vstack([y - low, high - y])
        ax.errorbar(x, y, yerr=np.nan_to_num(yerr), capsize=3, elinewidth=0.8, label=label, **style)


def dodges(k: int, width: float = 0.24) -> list[float]:
    """k small x offsets centred on 0, for k curves with caps at the same epochs."""
    return [0.0] * k if k < 2 else list(np.linspace(-width / 2, width / 2, k))


def accuracy_axes(ax, cfg: DictConfig, what: str) -> None:
    """Epochs on x (integers), test accuracy in % on y, clipped to [0, 100]; the legend below."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    low, high = ax.get_ylim()
    ax.set_ylim(max(low, 0.0), min(high, 100.0))
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title(cfg, what), fontsize=10)
    ax.legend(frameon=False, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, cfg: DictConfig, name: str) -> list[Path]:
    """`<sweep>/<name>.png` and `.pdf`, atomically."""
    paths = io.save_figure(fig, sweep_dir(cfg) / name)
    pyplot().close(fig)
    return paths


def command(cfg: DictConfig) -> str:
    """The command that (re)produces this sweep's CSVs."""
    name, preset, dataset = cfg.experiment.name, cfg.preset.name, cfg.dataset.name
    return f"normprop run {name} --preset {preset} --dataset {dataset}"


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


def paper_value(cfg: DictConfig, value, paper_dataset: str = "cifar10") -> str:
    """The paper's number for the report, labelled "not comparable" beside it when this sweep is not
    on the paper's data set (SPEC §6.1: digits vs CIFAR-10)."""
    if value is None or value == "" or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if cfg.dataset.name == paper_dataset:
        return f"{value}"
    return f"{value} ({paper_dataset}; not comparable with {cfg.dataset.name})"


def not_learned(cfg: DictConfig) -> list[dict]:
    """A headline row naming the runs that did not learn (SPEC §6.1: a final accuracy NEAR_CHANCE), when
    there are any: their numbers stay in the CSVs, this row says so."""
    path = sweep_dir(cfg) / "summary.csv"
    summary = pd.read_csv(path) if path.exists() else pd.DataFrame()
    failed = summary[learned_flags(summary).eq(False)]
    if not len(failed):
        return []
    return [{"quantity": f"runs that did not learn (final test accuracy {NEAR_CHANCE}; kept in the CSVs)",
             "reproduced": f"{len(failed)} of {len(summary)}: {', '.join(failed['run'])}", "paper": ""}]  # fmt: skip


def title(cfg: DictConfig, what: str) -> str:
    return f"{what}, {cfg.dataset.name} ({cfg.preset.name} preset)"
