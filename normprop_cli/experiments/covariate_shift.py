"""Fig. 2 (section 5.2): internal covariate shift. Before training and after every epoch, over the
test set, the input of the hidden layers 2..9 at the input of their convolution, in standard units
(experiments.probes): the paper's metric on a few probed units, and the population metric (every
input-dependent unit of each layer's input).

    normprop run covariate-shift [--preset paper]

runs/<run>/unit_stats.csv  probes.UNIT_COLUMNS: layer, draw, channel, row, col, epoch, n, mean, std
runs/<run>/population.csv  probes.POPULATION_COLUMNS: layer, epoch, units, avg_abs_mean, avg_std,
                           avg_drift, units_constant_at_init
unit_stats.csv   every run's unit rows, with run, setting, method, seed, initial_lr
population.csv   every run's population rows, with run, setting, method, seed
probes.csv       one row per run and draw: the paper's metric, the average over layers 2..9 of
                 |final mean| (avg_abs_final_mean), with final_epoch and layers
settling.csv     per run, layer and draw: band, final_epoch, final_mean, settled_after_epoch, settled:
                 the first epoch from which the unit's mean stays within +-band of its final value
summary.csv      one row per run: engine columns + initial_lr, band, probe_draws, avg_abs_final_mean
                 (mean over draws), avg_abs_final_mean_sd (sd over draws), final_population_abs_mean,
                 final_population_drift (final epoch, mean over layers 2..9), last_settled_after_epoch
covariate_shift.png/.pdf  the probed units' means vs epoch, one panel per layer (Fig. 2), the target mean 0 dotted
population.png/.pdf       the population's average |mean| and drift vs epoch, one panel per layer
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
from omegaconf import DictConfig

from normprop_cli import engine, outcomes, statistics
from normprop_cli.engine import Stage, expand_grid
from normprop_cli.engine.runs import sweep_dir
from normprop_cli.errors import UserError
from normprop_cli.experiments import plots, tables
from normprop_cli.experiments.base import experiment
from normprop_cli.experiments.probes import PopulationProbe, UnitProbe
from normprop_cli.outcomes import learned_flags

RUN = ["run", "setting", "method", "seed"]
SETTLING = [*RUN, "layer", "draw", "band", "final_epoch", "final_mean", "settled_after_epoch", "settled"]
PROBES = [*RUN, "initial_lr", "draw", "final_epoch", "layers", "avg_abs_final_mean"]
NOT_IN_PAPER = "not in the paper"
REFERENCE = {"color": "k", "linewidth": 0.8, "linestyle": (0, (1, 2))}  # a reference line: thin, black, dotted
TARGET = "reference: mean 0, the N(0, 1) target"
RIGHT = "no normalisation (grey):"  # the start of a right axis' label


def settling(stats: pd.DataFrame, band: float) -> pd.DataFrame:
    """Per run, layer and draw: the first epoch from which the unit's mean stays within +-band of its
    final value (`settled` is False when only the last epoch is: not settled before the end)."""
    if not len(stats):
        return pd.DataFrame(columns=SETTLING)
    rows = []
    for key, g in stats.groupby([*RUN, "layer", "draw"], sort=False):
        g = g.sort_values("epoch")
        means, epochs = g["mean"].to_numpy(), g["epoch"].to_numpy()
        outside = np.flatnonzero(np.abs(means - means[-1]) > band)
        first = int(epochs[outside[-1] + 1]) if len(outside) else int(epochs[0])
        values = (*key, band, int(epochs[-1]), means[-1], first, bool(first < epochs[-1]))
        rows.append(dict(zip(SETTLING, values, strict=True)))
    return pd.DataFrame(rows, columns=SETTLING)


def paper_metric(stats: pd.DataFrame) -> pd.DataFrame:
    """Per run and draw: the average over layers 2..9 of |final mean| (section 5.2's metric; the paper's
    values are experiment.paper_avg_abs_final_mean)."""
    if not len(stats):
        return pd.DataFrame(columns=PROBES)
    final = stats.sort_values("epoch", kind="stable").groupby(["run", "layer", "draw"], sort=False).tail(1)
    table = (
        final.assign(abs_final_mean=final["mean"].abs())
        .groupby([*RUN, "initial_lr", "draw"], sort=False)
        .agg(final_epoch=("epoch", "max"), layers=("layer", "nunique"), avg_abs_final_mean=("abs_final_mean", "mean"))
        .reset_index()
    )
    return table[PROBES]


def probed(probes: pd.DataFrame, settled: pd.DataFrame, run: str) -> dict:
    """A run's paper metric (mean and sd over draws) and the last epoch at which a probed unit settled."""
    p = tables.of_run(probes, run)
    if not len(p):
        return {}
    return {
        "avg_abs_final_mean": p["avg_abs_final_mean"].mean(),
        "avg_abs_final_mean_sd": p["avg_abs_final_mean"].std(ddof=1),
        "last_settled_after_epoch": int(tables.of_run(settled, run)["settled_after_epoch"].max()),
    }


def final_population(population: pd.DataFrame, run: str) -> dict:
    """A run's population metric at its last epoch, the mean over layers."""
    p = tables.of_run(population, run)
    if not len(p):
        return {}
    last = p[p["epoch"] == p["epoch"].max()]
    return {
        "final_population_abs_mean": last["avg_abs_mean"].mean(),
        "final_population_drift": last["avg_drift"].mean(),
    }


def _refuse_stale(cfg: DictConfig, stats: pd.DataFrame) -> None:
    """Finished runs of an older probe (one unit per layer, BN read after its ReLU, no draw column)
    are skipped by the sweep; their numbers must not be mixed with these."""
    if not len(stats):
        return
    stale = sorted(stats["run"].unique() if "draw" not in stats else stats.loc[stats["draw"].isna(), "run"].unique())
    if stale:
        raise UserError(
            f"run(s) {', '.join(stale)} in {sweep_dir(cfg)} were probed by an older version of this experiment; "
            "remove their runs/<run> directories and run again"
        )


def plot(cfg: DictConfig) -> list[Path]:
    return [*plot_units(cfg), *plot_population(cfg)]


def plot_units(cfg: DictConfig) -> list[Path]:
    """Fig. 2: one panel per hidden layer 2..9; per method, every probed unit of the first seed as a
    thin solid line (dashed would read as a reference) and their mean in bold; the target mean 0 a
    labelled reference line. The unnormalised net, "incomparable due to extreme variations", has its
    own, labelled axis on the right."""
    plt = plots.pyplot()
    stats = tables.read(cfg, "unit_stats")
    first_seed = stats["seed"].min()
    stats = stats[stats["seed"] == first_seed]
    layers = sorted(stats["layer"].unique())
    fig, axes = plt.subplots(2, (len(layers) + 1) // 2, figsize=(13, 5.8), sharex=True, squeeze=False)
    draws = stats["draw"].nunique()
    handles, twins = {}, {}
    for ax, layer in zip(axes.flat, layers, strict=False):
        ax.axhline(0.0, **REFERENCE)
        for method, g in _by_method(stats[stats["layer"] == layer]):
            target, style = _axis(ax, method, twins), _style(method)
            for _, d in g.groupby("draw"):
                target.plot(d["epoch"], d["mean"], linewidth=0.5, alpha=0.45, **(style | {"linestyle": "-"}))
            mean = g.groupby("epoch")["mean"].mean()
            (line,) = target.plot(mean.index, mean.to_numpy(), marker="o", markersize=2, linewidth=1.8, **style)
            handles.setdefault(f"{_label(method, g)}: mean of the {draws} units (bold)", line)
        ax.set_title(f"layer {layer}", fontsize=8)
    handles["one probed unit (thin, solid; its method's colour and axis)"] = Line2D([], [], color="0.3", linewidth=0.5)
    handles[TARGET] = Line2D([], [], **REFERENCE)
    _finish(fig, axes, twins, handles, ncol=3)
    _label_right(axes, twins, f"{RIGHT}\nmean (standard units)")
    fig.supylabel("NormProp, BatchNorm: mean of the input (standard units)", x=0.005, fontsize=9)
    fig.subplots_adjust(left=0.065)
    for ax in list(axes.flat)[len(layers) :]:
        ax.axis("off")
    fig.suptitle(
        plots.title(
            cfg,
            f"Fig. 2: mean over {tables.probe_set(cfg)} of {draws} probed units' inputs per layer "
            f"(thin: each unit, bold: their mean), seed {first_seed}",
        ),
        fontsize=10,
    )
    return plots.save(fig, cfg, "covariate_shift")


def plot_population(cfg: DictConfig) -> list[Path]:
    """The population metric: per layer 2..9, over all input-dependent units, the average |mean| (top) and the
    average drift from initialisation in initial stds (bottom) vs epoch, mean over seeds. The drift
    has no scale, so every method shares its axis; the unnormalised net's |mean| has its own, labelled
    axis on the right."""
    plt = plots.pyplot()
    population = tables.read(cfg, "population")
    layers = sorted(population["layer"].unique())
    fig, axes = plt.subplots(2, len(layers), figsize=(2.4 * len(layers) + 1, 5.4), sharex=True, squeeze=False)
    handles, twins = {}, {}
    for col, layer in enumerate(layers):
        for method, g in _by_method(population[population["layer"] == layer]):
            mean = g.groupby("epoch")[["avg_abs_mean", "avg_drift"]].mean()
            for row, quantity in enumerate(mean.columns):
                target = _axis(axes[row, col], method, twins) if quantity == "avg_abs_mean" else axes[row, col]
                (line,) = target.plot(mean.index, mean[quantity], marker="o", markersize=2, **_style(method))
            handles.setdefault(
                tables.method_label(method) + (" (|mean|: right axis)" if method == "none" else ""), line
            )
        axes[0, col].set_title(f"layer {layer}", fontsize=8)
    axes[0, 0].set_ylabel("NormProp, BatchNorm:\naverage |mean| (standard units)")
    axes[1, 0].set_ylabel("average drift from epoch 0\n(initial stds)")
    _finish(fig, axes, twins, handles, wspace=0.8)  # room between the panels for the right axes' ticks
    _label_right(axes, twins, f"{RIGHT}\naverage |mean| (standard units)")
    seeds = population["seed"].nunique()
    fig.suptitle(
        plots.title(cfg, f"Population metric: all input-dependent units per layer, mean over {seeds} seed(s)"),
        fontsize=10,
    )
    return plots.save(fig, cfg, "population")


def _by_method(frame: pd.DataFrame):
    return sorted(frame.groupby("method", sort=False), key=lambda mg: tables.method_rank(mg[0]))


def _style(method: str) -> dict:
    return {"color": tables.METHOD_COLORS.get(method, "C2"), "linestyle": "--" if method == "none" else "-"}


def _label(method: str, g: pd.DataFrame) -> str:
    where = " (right axis)" if method == "none" else ""
    return f"{tables.method_label(method)}, lr {g['initial_lr'].iloc[0]:g}{where}"


def _axis(ax, method: str, twins: dict):
    """The unnormalised net gets its own axis on the right of `ax`."""
    if method != "none":
        return ax
    if ax not in twins:
        twins[ax] = ax.twinx()
    return twins[ax]


def _label_right(axes, twins: dict, text: str) -> None:
    """The right axis of each row's last panel that has one names what it shows (once per row, like the left)."""
    for row in axes:
        right = [twins[ax] for ax in row if ax in twins]
        if right:
            right[-1].set_ylabel(text, color=tables.METHOD_COLORS["none"], fontsize=8)


def _finish(fig, axes, twins: dict, handles: dict, ncol: int | None = None, wspace: float = 0.45) -> None:
    """Integer epochs, readable y ranges, the x labels and one legend below the panels (`ncol` columns,
    default one row); `wspace` between the panels."""
    for ax in axes.flat:
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        _readable(ax)
    for right in twins.values():
        right.tick_params(axis="y", colors=tables.METHOD_COLORS["none"], labelsize=7)
        _readable(right)
    for ax in axes[-1]:
        ax.set_xlabel("epoch")
    ncol = ncol or len(handles)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=ncol, frameon=False, fontsize=8)
    fig.subplots_adjust(left=0.05, right=0.95, bottom=0.15, top=0.88, wspace=wspace, hspace=0.3)


def _readable(ax) -> None:
    """No offset notation, and a y range of at least 5% of the values' size, so that a near-constant
    line does not fill the panel with digits."""
    lo, hi = ax.get_ylim()
    span = max(hi - lo, 0.05 * max(abs(lo), abs(hi), 0.1))
    middle = (lo + hi) / 2
    ax.set_ylim(middle - span / 2, middle + span / 2)
    ax.ticklabel_format(axis="y", useOffset=False)


def headlines(cfg: DictConfig) -> list[dict]:
    """Per method, over its runs that learned and did not diverge: the paper's metric (mean and 95%
    interval over seeds of each seed's average over draws, and the spread over draws), the population
    metric and the settling epoch; one row per method whose runs did not learn, and one naming the
    diverged runs: both kept out of the other rows, their numbers in the CSVs."""
    summary = tables.read(cfg, "summary")
    if not len(summary) or "avg_abs_final_mean" not in summary:
        return []
    learned = learned_flags(summary).eq(True)
    kept = summary[learned & ~outcomes.diverged(summary)]
    settled = tables.read(cfg, "settling")
    settled = settled[settled["run"].isin(kept["run"])]
    rows = []
    for method, g in _by_method(kept):
        label, draws, spread = (
            tables.method_label(method),
            int(g["probe_draws"].max()),
            g["avg_abs_final_mean_sd"].mean(),
        )
        paper = tables.paper_value(cfg, cfg.experiment.paper_avg_abs_final_mean.get(method, ""))
        what = f"{draws} probed units per layer (sd over draws {spread:.3f})"
        rows += [
            _ci_row(f"average |final mean| over layers 2-9 of {what}, {label}", g["avg_abs_final_mean"], paper),
            _ci_row(
                f"final average |mean| of all units, mean over layers 2-9, {label}", g["final_population_abs_mean"]
            ),
            _ci_row(f"final average drift of all units, mean over layers 2-9, {label}", g["final_population_drift"]),
        ]
    band = float(cfg.experiment.band)
    for method, g in _by_method(settled):
        per_draw = g.groupby(["run", "draw"]).agg(epoch=("settled_after_epoch", "max"), settled=("settled", "all"))
        epochs, moving = int(g["final_epoch"].max()), int((~per_draw["settled"]).sum())
        quantity = (
            f"epoch after which every layer's probed mean stays within +-{band:g} of its final value "
            f"(median over {len(per_draw)} run-draws), {tables.method_label(method)}"
        )
        reproduced = f"{per_draw['epoch'].median():g} of {epochs}; {moving} of {len(per_draw)} still moving"
        paper = tables.paper_value(cfg, cfg.experiment.paper_settled.get(method, ""))
        rows.append({"quantity": quantity, "reproduced": reproduced, "paper": paper})
    for method, g in _by_method(summary[~learned & ~outcomes.diverged(summary)]):  # the diverged: the last row
        if method not in set(kept["method"]):
            accuracy = 100.0 - g["final_test_error"].mean() if "final_test_error" in g else float("nan")
            quantity = (
                f"{tables.method_label(method)}, lr {g['initial_lr'].iloc[0]:g}: did not learn (final test accuracy "
                f"{outcomes.NEAR_CHANCE}); kept out of the rows above"
            )
            reproduced = f"final test accuracy {accuracy:.1f}% (chance is {tables.chance(cfg):g}%)"
            rows.append({"quantity": quantity, "reproduced": reproduced, "paper": ""})
    return rows + tables.diverged_runs(cfg)


def _ci_row(quantity: str, values: pd.Series, paper=NOT_IN_PAPER) -> dict:
    """The mean over seeds with its 95% Student-t interval (statistics.mean_ci)."""
    ci = statistics.mean_ci(values)
    reproduced = statistics.format_mean_ci(ci, 3)
    over = f"95% interval over {ci['n']} seeds" if ci["n"] > 1 else f"{ci['n']} seed, no interval"
    return {"quantity": f"{quantity} ({over})", "reproduced": reproduced, "paper": paper}


def stages(cfg: DictConfig):
    """The grid, each run observed by Fig. 2's probes."""
    draws = int(cfg.experiment.probe_draws)
    yield Stage(cfg, expand_grid(cfg), lambda spec: [UnitProbe(spec.seed, draws), PopulationProbe()])


@experiment("covariate-shift", plot=plot, headlines=headlines, stages=stages)
def analyse(cfg: DictConfig) -> Path:
    specs = expand_grid(cfg)
    draws = int(cfg.experiment.probe_draws)
    manifests = engine.manifests(specs)
    stats = tables.gather(specs, UnitProbe.name, columns={"initial_lr": "train.lr"})
    _refuse_stale(cfg, stats)
    population = tables.gather(specs, PopulationProbe.name)
    band = float(cfg.experiment.band)
    probes, settled = paper_metric(stats), settling(stats, band)
    for name, table in (("unit_stats", stats), ("population", population), ("probes", probes), ("settling", settled)):
        tables.write(cfg, name, table)

    def columns(spec) -> dict:
        return ({"initial_lr": spec.cfg.train.lr, "band": band, "probe_draws": draws}
                | probed(probes, settled, spec.name) | final_population(population, spec.name))  # fmt: skip

    out = tables.summarise(cfg, specs, manifests, columns)
    plot(cfg)
    return out
