"""Section 4.6: NormProp with other activations, each through its own constants (claim C8).

    normprop run activations [--preset quick|cpu|paper]

NormProp and BatchNorm, each with ReLU, PReLU, tanh and sigmoid, on one protocol. A NormProp layer
uses its activation's c2, c1 (eq. 12; Remark 2 for PReLU, at its current slope) and Jacobian factor
(normprop_cli/nn/stats.py). Before training (epoch 0) and after every epoch, over the evaluation set,
PopulationProbe measures the input of conv k = 2..9 in the standard units of the
activation before it, (x - c2) / c1. On N(0, 1) pre-activations eq. 12 puts NormProp's first layer
output at mean 0 and std 1, or, where the Jacobian factor f divides (ICML), at `first_layer_prediction`.

epochs.csv       every run's metrics, one row per run and epoch, with its activation
curves.csv       method, activation, epoch, n, diverged, mean, sd, ci_low, ci_high: test accuracy (%)
                 over the seeds that did not diverge (95% interval: statistics.proportion_ci)
population.csv   every run's population rows (probes.POPULATION_COLUMNS), with run, setting, method,
                 seed, activation
layer_stats.csv  LAYER_COLUMNS: per method, activation, layer and epoch, the mean over seeds of the
                 layer's average |mean|, average std and average drift
summary.csv      one row per run: engine columns + activation, final_test_acc, best_test_acc
activations.png/.pdf  final test accuracy per activation, NormProp vs BatchNorm (95% CI over seeds);
                 NormProp's per-layer average std and |mean| at initialisation and after training

The ablation settings train tanh and sigmoid NormProp with ReLU's constants in place of their own
(`<name>_reluconst`). C8's measure (verdicts.constants: NormProp's own change from ReLU, and its own
constants against ReLU's) reads its summary.csv.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from omegaconf import DictConfig

from normprop_cli import engine, prose, statistics
from normprop_cli.engine import Stage, expand_grid
from normprop_cli.experiments import plots, tables
from normprop_cli.experiments.base import experiment
from normprop_cli.experiments.probes import PopulationProbe
from normprop_cli.nn import ACTIVATIONS, activation_stats
from normprop_cli.nn.stats import quadrature_stats
from normprop_cli.verdicts import constants as c8
from normprop_cli.verdicts import rule
from normprop_cli.verdicts.gaps import ACCURACY, REFERENCE, paired_gaps

KEYS = ["method", "activation"]
LAYER_COLUMNS = ["method", "activation", "layer", "epoch", "n", "avg_abs_mean", "avg_std", "avg_drift"]
ACTIVATION_LABELS = {"relu": "ReLU", "prelu": "PReLU", "tanh": "tanh", "sigmoid": "sigmoid",
                     "tanh_reluconst": "tanh, ReLU's c", "sigmoid_reluconst": "sigmoid, ReLU's c"}  # fmt: skip
ACTIVATION_COLORS = {"relu": "C0", "prelu": "C2", "tanh": "C3", "sigmoid": "C4", "tanh_reluconst": "C1",
                     "sigmoid_reluconst": "C5"}  # fmt: skip
NOT_IN_PAPER = "no experiment in the paper (section 4.6)"
NAME = "activations"  # the experiment, and so its claim in conf/claims.yaml
POOLING_SECTION = "3.2"  # the paper's section that leaves pooling unnormalised


def first_layer_prediction(activation: str, jacobian: str = "divide") -> tuple[float, float]:
    """Mean and std of NormProp's first layer output (the input of conv 2) at initialisation, in standard
    units, when each unit's W_1 x / ||W_1|| is N(0, 1) (Prop. 1 with white, normalised input, 4.1):
    (sigma(u / f) - c2) / c1 with u ~ N(0, 1) (eq. 12). f is the Jacobian factor where the layer divides
    by it (section 3.4; "init" starts gamma at 1 / f, the same at initialisation), else 1. For PReLU,
    the initial slope 0.25 (Remark 2)."""
    s = activation_stats(activation)
    f = float(s.jacobian_factor) if jacobian in ("divide", "init") else 1.0
    if activation == "prelu":
        fn, kinks = (lambda x: torch.nn.functional.leaky_relu(x, 0.25)), (0.0,)
    else:
        fn, kinks = ACTIVATIONS[activation].fn, ACTIVATIONS[activation].breakpoints
    out = quadrature_stats(lambda x: fn(x / f), breakpoints=kinks)
    c2, c1 = float(s.mean), float(s.std)
    return (float(out.mean) - c2) / c1, float(out.std) / c1


def activation_of(spec) -> dict:
    return {"activation": spec.cfg.model.activation}


def layer_stats(population: pd.DataFrame) -> pd.DataFrame:
    """Per method, activation, layer and epoch: n seeds and the mean over them of the population's
    average |mean|, average std and average drift."""
    if not len(population):
        return pd.DataFrame(columns=LAYER_COLUMNS)
    table = (
        population.groupby([*KEYS, "layer", "epoch"], sort=False)
        .agg(
            n=("seed", "nunique"),
            avg_abs_mean=("avg_abs_mean", "mean"),
            avg_std=("avg_std", "mean"),
            avg_drift=("avg_drift", "mean"),
        )
        .reset_index()
    )
    return table[LAYER_COLUMNS].sort_values([*KEYS, "layer", "epoch"], kind="stable")


# ---- figure ---------------------------------------------------------------------------------------------


def plot(cfg: DictConfig) -> list[Path]:
    """Left: final test accuracy per activation, NormProp vs BatchNorm, the mean over seeds with its 95%
    interval and each seed as a dot. Middle and right: NormProp's average std and average |mean| of
    every hidden layer's input, at initialisation (dashed) and after the last epoch (solid)."""
    plt = plots.pyplot()
    curve, summary = tables.read_curves(cfg, KEYS), tables.read(cfg, "summary")
    stats = tables.read(cfg, "layer_stats")
    order = _activations(summary)
    fig, (acc, std, mean) = plt.subplots(1, 3, figsize=(14.5, 4.4))
    last = tables.last_epoch(curve, KEYS)
    for method, dx in (("normprop", -0.15), ("batchnorm", 0.15)):
        rows = last[last["method"] == method].set_index("activation").reindex(order)
        x = np.arange(len(order)) + dx
        y, low, high = (rows[c].to_numpy(dtype=float) for c in ("mean", "ci_low", "ci_high"))
        color = tables.METHOD_COLORS[method]
        yerr = np.nan_to_num(np.vstack([y - low, high - y]))
        acc.errorbar(x, y, yerr=yerr, fmt="o", capsize=4, color=color, label=tables.method_label(method))
        runs = summary[summary["method"] == method]
        for i, activation in enumerate(order):
            seeds = runs.loc[runs["activation"] == activation, ACCURACY]
            acc.scatter(np.full(len(seeds), i + dx + 0.06), seeds, s=8, color=color, alpha=0.4, linewidths=0)
    epoch = int(last["epoch"].max()) if len(last) else 0
    plots.note_if_empty(acc, last["mean"])
    low, high = acc.get_ylim()
    acc.set_ylim(max(low, 0.0), min(high, 100.0))
    acc.set_xticks(range(len(order)), [ACTIVATION_LABELS.get(a, a) for a in order], rotation=20, ha="right")
    acc.set_ylabel(f"final test accuracy (%), epoch {epoch}")
    acc.set_title("NormProp vs BatchNorm, same activation (95% CI)", fontsize=9)
    acc.legend(frameon=False, fontsize=8)
    normprop = stats[stats["method"] == "normprop"]
    for ax, quantity, ideal, label in (
        (std, "avg_std", 1.0, "average std of the layer's input"),
        (mean, "avg_abs_mean", 0.0, "average |mean| of the layer's input"),
    ):
        ax.axhline(ideal, color="0.6", linewidth=0.8, linestyle=":")
        for activation in order:
            g = normprop[normprop["activation"] == activation]
            if not len(g):
                continue
            color = ACTIVATION_COLORS.get(activation)
            for when, style in ((g["epoch"].min(), "--"), (g["epoch"].max(), "-")):
                d = g[g["epoch"] == when].sort_values("layer")
                ax.plot(d["layer"], d[quantity], linestyle=style, marker="o", markersize=3, color=color)
            ax.plot([], [], color=color, label=ACTIVATION_LABELS.get(activation, activation))
        ax.plot([], [], color="0.3", linestyle="--", label="initialisation")
        ax.plot([], [], color="0.3", linestyle="-", label=f"after epoch {int(normprop['epoch'].max() or 0)}")
        values = normprop[quantity].to_numpy(dtype=float)
        if quantity == "avg_std" and len(values) and np.nanmax(values) > 10 * max(np.nanmin(values), 1e-3):
            ax.set_yscale("log")  # trained layers may reach stds of 10 and more (drift)
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("layer (input of conv k)")
        ax.set_ylabel(label + " (standard units)")
        ax.set_title(f"NormProp: {label}", fontsize=9)
        ax.legend(frameon=False, fontsize=7, ncol=2, loc="best")
    fig.suptitle(plots.title(cfg, "Section 4.6: NormProp with each activation's own constants"), fontsize=10)
    fig.tight_layout()
    return plots.save(fig, cfg, "activations")


def _activations(frame: pd.DataFrame) -> list[str]:
    """The activations in the grid's order."""
    return list(dict.fromkeys(frame["activation"])) if "activation" in frame else []


# ---- the report -----------------------------------------------------------------------------------------


def _name(activation: str) -> str:
    return ACTIVATION_LABELS.get(activation, activation)


def _ci(values, digits: int = 2) -> str:
    return statistics.format_mean_ci(statistics.mean_ci(values), digits)


def _layers(stats: pd.DataFrame, method: str, activation: str) -> dict | None:
    """From layer_stats.csv: layer 2 at epoch 0, and the mean over layers 2..9 of the average std and
    |mean| at epoch 0 and at the last epoch, with the range of the std over layers at epoch 0."""
    g = stats[(stats["method"] == method) & (stats["activation"] == activation)]
    if not len(g):
        return None
    first, last = g[g["epoch"] == g["epoch"].min()], g[g["epoch"] == g["epoch"].max()]
    second = first[first["layer"] == first["layer"].min()].iloc[0]
    return {
        "layer": int(second["layer"]),
        "std_first": second["avg_std"],
        "mean_first": second["avg_abs_mean"],
        "std0": first["avg_std"].mean(),
        "std0_lo": first["avg_std"].min(),
        "std0_hi": first["avg_std"].max(),
        "mean0": first["avg_abs_mean"].mean(),
        "std": last["avg_std"].mean(),
        "mean": last["avg_abs_mean"].mean(),
        "epoch": int(last["epoch"].iloc[0]),
    }


def headlines(cfg: DictConfig) -> list[dict]:
    """Per activation: each method's final accuracy (95% interval over the seeds that did not diverge,
    statistics.proportion_ci; the diverged counted beside it) and NormProp minus BatchNorm paired by seed
    (a t interval, C8's measure); NormProp's layer statistics at initialisation, beside eq. 12's prediction,
    and after training; the worst activation per seed (C8's effect); the runs that did not learn."""
    summary, curve = tables.read(cfg, "summary"), tables.read_curves(cfg, KEYS)
    if ACCURACY not in summary:
        return []
    stats = tables.read(cfg, "layer_stats")
    gaps, last = paired_gaps(summary), tables.last_epoch(curve, KEYS)
    rows = []
    for activation in _activations(summary):
        for method in ("normprop", "batchnorm"):
            c = last[(last["method"] == method) & (last["activation"] == activation)]
            if len(c):
                c = c.iloc[0]
                rows.append(
                    {
                        "quantity": f"final test accuracy (%) [95% CI, n = {int(c['n'])}] at epoch {int(c['epoch'])}, "
                        f"{tables.method_label(method)}, {_name(activation)}",
                        "reproduced": tables.with_diverged(
                            statistics.format_mean_ci(c),
                            summary[(summary["method"] == method) & (summary["activation"] == activation)],
                        ),
                        "paper": "",
                    }
                )
        g = gaps.loc[gaps["activation"] == activation, "gap"]
        if len(g):
            rows.append(
                {
                    "quantity": f"NormProp minus BatchNorm, {_name(activation)}: final test accuracy (pp), paired by "
                    f"seed [95% CI, n = {len(g)}]",
                    "reproduced": _ci(g),
                    "paper": NOT_IN_PAPER,
                }
            )
    jacobian = str(cfg.model.jacobian)
    for activation in _activations(summary):
        s = _layers(stats, "normprop", activation)
        if not s:
            continue
        mean, std = first_layer_prediction(activation, jacobian)
        rows += [
            {
                "quantity": f"NormProp, {_name(activation)}: average std and |mean| of the input of layer {s['layer']} "
                "(the first layer's output) at initialisation, mean over seeds",
                "reproduced": f"std {s['std_first']:.2f}, |mean| {s['mean_first']:.2f}",
                "paper": f"std {std:.2f}, |mean| {abs(mean):.2f} (eq. 12, N(0, 1) pre-activation, f: {jacobian})",
            },
            {
                "quantity": f"NormProp, {_name(activation)}: average std and |mean| of the inputs of layers 2-9 (mean "
                f"over layers and seeds), at initialisation -> after epoch {s['epoch']}",
                "reproduced": f"std {s['std0']:.2f} -> {s['std']:.2f}, |mean| {s['mean0']:.2f} -> {s['mean']:.2f}",
                "paper": "",
            },
        ]
    rows += _parts_rows(summary)
    return rows + tables.not_learned(cfg)


def paragraphs(cfg: DictConfig) -> list[str]:
    """The findings in sentences (templates/activations.md.j2), every number read from layer_stats.csv and
    summary.csv (activation_facts)."""
    return prose.render("activations", activation_facts(cfg))


def activation_facts(cfg: DictConfig) -> dict:
    """What the paragraphs state: per activation, NormProp's (and BatchNorm's) layer statistics at
    initialisation beside eq. 12's prediction and after training; the accuracies against BatchNorm; the
    claim's two parts, (a) against its margin and (b) against 0, each per seed the worst activation
    (`compared`: both the pairs and part (a) have seeds; else the second paragraph is left out)."""
    summary, stats = tables.read(cfg, "summary"), tables.read(cfg, "layer_stats")
    order = _activations(summary)
    jacobian = str(cfg.model.jacobian)
    facts = {
        "claim": rule.claim_of(NAME).id,
        "probe_set": tables.probe_set(cfg),
        "jacobian": jacobian,
        "pooling_section": POOLING_SECTION,
        "normprop": [
            s | {"name": _name(a), "predicted": first_layer_prediction(a, jacobian)[1]}
            for a in order
            if (s := _layers(stats, "normprop", a))
        ],
        "batchnorm": [s | {"name": _name(a)} for a in order if (s := _layers(stats, "batchnorm", a))],
    }
    gaps = paired_gaps(summary)
    wide = c8.normprop_accuracy(summary) if len(summary) and "activation" in summary else pd.DataFrame()
    works = c8.worst(c8.own_changes(wide)) if len(wide) else pd.DataFrame()
    facts["compared"] = bool(len(gaps) and len(works))
    if not facts["compared"]:
        return facts
    gains = c8.constants_gains(wide)
    by = gaps.groupby("activation", sort=False)
    batchnorm = {a: g["batchnorm"].mean() for a, g in by}
    return facts | {
        "epochs": int(summary["epochs_done"].max()) if "epochs_done" in summary else 0,
        "gaps": [
            {
                "name": _name(a),
                "normprop": g["normprop"].mean(),
                "batchnorm": batchnorm[a],
                "gap": statistics.mean_ci(g["gap"]),
            }
            for a, g in by
        ],
        "batchnorm_lowest": _batchnorm_lowest(batchnorm),
        "own": _each(c8.own_changes(wide), sort=True),  # sorted by the activation's key
        "works": statistics.mean_ci(works["change"]),
        "margin": _margin(statistics.mean_ci(works["change"]), wide),
        "constants": _each(gains, sort=False),
        "constants_worst": statistics.mean_ci(c8.worst(gains)["change"]) if len(gains) else None,
    }


def _batchnorm_lowest(batchnorm: dict[str, float]) -> dict | None:
    """Of BatchNorm's mean accuracy per activation (`batchnorm`, the paired runs'), the lowest beside ReLU's
    (`name`, `acc`, `relu`): what a NormProp-against-BatchNorm gap measures of BatchNorm itself at the shared
    rate. None where ReLU has no pair or is itself BatchNorm's lowest."""
    lowest = min(batchnorm, key=batchnorm.get, default=None)
    if "relu" not in batchnorm or lowest == "relu":
        return None
    return {"name": _name(lowest), "acc": float(batchnorm[lowest]), "relu": float(batchnorm["relu"])}


def _each(changes: pd.DataFrame, sort: bool) -> list[dict]:
    """Per activation of a table of per-seed changes (verdicts.constants): its name and mean_ci."""
    return [
        {"name": _name(a), "change": statistics.mean_ci(g["change"])}
        for a, g in changes.groupby("activation", sort=sort)
    ]


def _parts_rows(summary: pd.DataFrame) -> list[dict]:
    """The claim's two parts, per seed the worst activation of each (verdicts.constants), as headline rows."""
    if not len(summary) or "activation" not in summary:
        return []
    wide, rows, cid = c8.normprop_accuracy(summary), [], rule.claim_of(NAME).id
    for what, changes in (
        (f"{cid} (a): per seed, the worst of the activations other than ReLU of NormProp's final test accuracy "
         "minus NormProp's with ReLU (pp)", c8.own_changes(wide)),
        (f"{cid} (b): per seed, the worst of the ablated activations of NormProp with its own constants minus "
         "with ReLU's (pp)", c8.constants_gains(wide)),
    ):  # fmt: skip
        worst = c8.worst(changes)
        if len(worst):
            rows.append({"quantity": f"{what} [95% CI, n = {len(worst)}]", "reproduced": _ci(worst["change"]),
                         "paper": NOT_IN_PAPER})  # fmt: skip
    return rows


def _margin(ci: dict, wide: pd.DataFrame) -> dict:
    """Where part (a)'s interval lies against the claim's margin, a fraction of NormProp's test error (%)
    with ReLU (conf/claims.yaml): `side` above or below it, None where it straddles it; `interval` False
    with fewer than 2 seeds."""
    reference = 100.0 - wide[REFERENCE].mean() if REFERENCE in wide else math.nan
    low, high, margin = ci["ci_low"], ci["ci_high"], rule.absolute_margin(rule.claim_of(NAME), reference)
    side = {rule.REPRODUCED: "above", rule.NOT_REPRODUCED: "below"}.get(
        rule.verdict(rule.NON_INFERIORITY, low, high, margin, ci["n"])
    )
    return {"interval": math.isfinite(low) and math.isfinite(high), "side": side, "value": margin}


def stages(cfg: DictConfig):
    yield Stage(cfg, expand_grid(cfg), lambda spec: [PopulationProbe()])


@experiment(NAME, plot=plot, headlines=headlines, paragraphs=paragraphs, stages=stages)
def analyse(cfg: DictConfig) -> Path:
    specs = expand_grid(cfg)
    manifests = engine.manifests(specs)
    epochs = tables.gather(specs, columns={"activation": "model.activation"})
    population = tables.gather(specs, PopulationProbe.name, columns={"activation": "model.activation"})
    tables.write(cfg, "population", population)
    tables.write(cfg, "layer_stats", layer_stats(population))
    out = tables.write_curves_and_summary(cfg, specs, manifests, epochs, KEYS, columns=activation_of)
    plot(cfg)
    return out
