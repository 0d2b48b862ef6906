"""The pre-activation mean's part of the drift (fashion preset): the decomposition of every layer input's
departure from N(0, 1) into its mean and its spread (moments.csv, drift/moments.py), and the rule fixed in
conf/experiment_preset/drift_fashion.yaml before the runs, read on ablation.csv's comparisons. The numbers
the report states are mean_facts; the words are templates/drift_mean.md.j2 (the rule's reading:
drift_mean_reading.md.j2).

decomposition.csv  per setting, epoch (fractions inside epoch 1, with `step`) and layer: the mean over
                   seeds of MOMENTS_COLUMNS' quantities, and the mean's share with its t interval
drift_mean.png/.pdf  the mean's share per layer and setting; NormProp's mean^2 and |var - 1| per layer
                   before and after training and inside epoch 1; each repair's difference from NormProp"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from normprop_cli import prose, statistics
from normprop_cli.experiments import plots
from normprop_cli.experiments import tables as run_tables
from normprop_cli.experiments.drift.ablation import comparisons, label, read_optional
from normprop_cli.experiments.drift.moments import MOMENTS_COLUMNS
from normprop_cli.experiments.drift.tables import learned_rows

QUANTITIES = MOMENTS_COLUMNS[3:]  # mean_sq ... corr_wx_out
REPAIRS = {"normprop-centred": "centred filters", "normprop-mean-oracle": "the mean oracle"}  # the rule's two
BOTH = "normprop-mean-sigma-oracle"
REFERENCES = {"normprop-moments": "NormProp", "batchnorm-moments": "BatchNorm"}
THRESHOLD = 0.30  # the rule's |mean| and std reductions (a third of NormProp's final average |mean|, 0.89)
HIDDEN = range(2, 10)  # layers 2-9, as the population metric
RULED = ("avg_abs_mean", "avg_std", "final_test_acc")  # the quantities the rule reads, in its order


def moments(cfg: DictConfig) -> pd.DataFrame:
    """moments.csv and moments_steps.csv together (the runs that learned and did not diverge); in-epoch rows
    keep their fractional epoch and `step`, epoch rows get step NaN."""
    epochs, steps = (learned_rows(cfg, read_optional(cfg, n)) for n in ("moments", "moments_steps"))
    if len(steps):
        steps = steps[steps["step"] > 0]  # step 0 is epoch 0, already an epoch row
    return pd.concat([t for t in (epochs, steps) if len(t)], ignore_index=True) if len(epochs) else epochs


def decomposition(cfg: DictConfig) -> pd.DataFrame:
    """decomposition.csv's rows (module docstring)."""
    m = moments(cfg)
    if not len(m):
        return pd.DataFrame()
    if "step" not in m:
        m["step"] = np.nan
    keys = ["setting", "epoch", "layer"]
    rows = []
    for (setting, epoch, layer), g in m.groupby(keys, sort=False):
        share = statistics.mean_ci(g["share_mean"])
        rows.append({"setting": setting, "epoch": epoch, "layer": layer, "step": g["step"].iloc[0],
                     "seeds": g["seed"].nunique(), **g[QUANTITIES].mean().to_dict(),
                     "share_low": share["ci_low"], "share_high": share["ci_high"]})  # fmt: skip
    out = pd.DataFrame(rows)
    return out[[*keys, "step", "seeds", *QUANTITIES, "share_low", "share_high"]]


def final_share(m: pd.DataFrame, setting: str) -> dict:
    """The mean's share at the setting's last epoch, each seed's average over layers 2-9, t interval over seeds."""
    g = m[(m["setting"] == setting) & m["layer"].isin(HIDDEN)] if len(m) else m
    if not len(g):
        return statistics.mean_ci([])
    g = g[g["epoch"] == g["epoch"].max()]
    return statistics.mean_ci(g.groupby("seed")["share_mean"].mean())


def _reading(c: pd.DataFrame) -> tuple[str, str | None, dict]:
    """The rule's reading ('not read', 'the cause', 'a cause', 'ruled out', 'undecided'), the repair it
    names (None where it names none) and, per repair, its (|mean|, std, accuracy) comparison rows."""
    rows = {s: {q: c[(c["setting"] == s) & (c["quantity"] == q)] for q in RULED}
            for s in REPAIRS if len(c) and (c["setting"] == s).any()}  # fmt: skip
    found = {s: {q: r.iloc[0] for q, r in qs.items() if len(r)} for s, qs in rows.items()}
    if len(found) < len(REPAIRS) or any(len(v) < 3 for v in found.values()):
        return "not read", None, found

    def lowers(r) -> bool:
        return r["diff"] <= -THRESHOLD and r["high"] < 0

    cause = [s for s, v in found.items() if lowers(v["avg_abs_mean"])]
    whole = [s for s in cause if lowers(found[s]["avg_std"]) and found[s]["final_test_acc"]["high"] >= 0]
    if whole:
        return "the cause", whole[0], found
    if cause:
        return "a cause", cause[0], found
    if all(v["avg_abs_mean"]["low"] <= 0 <= v["avg_abs_mean"]["high"] and v["avg_abs_mean"]["low"] > -THRESHOLD
           for v in found.values()):  # fmt: skip
        return "ruled out", None, found
    return "undecided", None, found


def _reading_facts(reading: str, repair: str | None) -> dict:
    """The reading and the name of the repair it names ('' where none)."""
    return {"reading": reading, "repair": REPAIRS.get(repair, "")}


def rule(c: pd.DataFrame) -> tuple[str, dict]:
    """The rule's reading in words and, per repair, its (|mean|, std, accuracy) comparison rows."""
    reading, repair, found = _reading(c)
    return prose.render("drift_mean_reading", _reading_facts(reading, repair))[0], found


def _difference(r) -> dict:
    """A comparison row's difference from NormProp and its interval."""
    return {"diff": float(r["diff"]), "low": float(r["low"]), "high": float(r["high"])}


def _compared(name: str, v) -> dict:
    """A setting's |mean|, std and accuracy differences from NormProp (a row per quantity in `v`)."""
    return {"name": name, **{q: _difference(v[q]) for q in RULED}}


def mean_facts(cfg: DictConfig) -> dict | None:
    """The decomposition's and the rule's table: `decomposition` and `left` (None without NormProp's
    decomposition runs), the rule's reading (`reading`, `repair`), each repair's differences (`repairs`),
    the two oracles together (`both`, or None), whether both repairs raise the |mean| (`worse`), and the
    epoch, seeds and level the differences are read at; None without moments or the rule's comparisons."""
    m = moments(cfg)
    c = comparisons(cfg)
    if not len(m) or not len(c) or not c["setting"].isin(list(REPAIRS)).any():
        return None
    reading, repair, found = _reading(c)
    both = c[c["setting"] == BOTH].set_index("quantity") if (c["setting"] == BOTH).any() else None
    has_both = both is not None and set(RULED) <= set(both.index)
    return {
        "decomposition": _decomposition(m),
        "left": _left(cfg, m, c),
        **_reading_facts(reading, repair),
        "repairs": [_compared(REPAIRS[s], v) for s, v in found.items() if len(v) == 3],
        "both": _compared("", {q: both.loc[q] for q in RULED}) if has_both else None,
        "worse": all(len(v) == 3 and v["avg_abs_mean"]["low"] > 0 for v in found.values()),
        "epoch": int(cfg.train.epochs),
        "seeds": int(cfg.seeds),
        "level": statistics.LEVEL,
    }


def mean_paragraphs(cfg: DictConfig) -> list[str]:
    """The decomposition and the rule's reading, every number from moments.csv and ablation.csv's comparisons."""
    facts = mean_facts(cfg)
    return prose.render("drift_mean", facts) if facts else []


def _left(cfg: DictConfig, m: pd.DataFrame, c: pd.DataFrame) -> dict | None:
    """What is left once the mean is out: NormProp's final var - 1 over seeds (`var`) and by layer (`depth`),
    the settings whose final average std is lower than NormProp's with an interval below 0 (`lowered`, their
    labels) out of the `compared` ones, and the input variance the Sigma-oracle holds by layer at the last
    epoch (`sigma`, a `_depth`; None without sigma_oracle.csv)."""
    g = m[(m["setting"] == "normprop-moments") & m["layer"].isin(HIDDEN)]
    if not len(g):
        return None
    last = g[g["epoch"] == g["epoch"].max()]
    var = last.groupby("seed")["var_minus_1"].mean()
    std = c[c["quantity"] == "avg_std"]
    lowered = std[std["reading"] == "reduces"]
    oracle = read_optional(cfg, "sigma_oracle")
    o = oracle[oracle["setting"] == "normprop-sigma-oracle"] if len(oracle) else oracle
    sigma = _depth(o[o["epoch"] == o["epoch"].max()].groupby("layer")["input_var"].mean()) if len(o) else None
    return {
        "var": statistics.mean_ci(var),
        "layers": _span(HIDDEN),
        "depth": _depth(last.groupby("layer")["var_minus_1"].mean()),
        "lowered": [label(cfg, r["setting"], r["reference"]) for _, r in lowered.iterrows()],
        "compared": int(std["setting"].nunique()),
        "sigma": sigma,
    }


def _depth(by_layer: pd.Series) -> dict:
    """A quantity by layer (a mean over seeds, indexed by layer): its first and last layer's values, and at how
    many of the steps from one layer to the next it rises (`rises` of `steps`)."""
    values = by_layer.sort_index()
    return {
        "first": float(values.iloc[0]),
        "first_layer": int(values.index[0]),
        "last": float(values.iloc[-1]),
        "last_layer": int(values.index[-1]),
        "rises": int((values.diff().iloc[1:] > 0).sum()),
        "steps": len(values) - 1,
    }


def _span(layers) -> str:
    """'2-9': the first and last of a run of layers."""
    layers = list(layers)
    return f"{layers[0]}-{layers[-1]}"


def _decomposition(m: pd.DataFrame) -> dict | None:
    """NormProp's share of the mean at its last epoch (and BatchNorm's), where it lies against one half
    (`verdict`: 'spread', 'mean' or None), the share after the first in-epoch probe (`first`, or None),
    mean^2 and |var - 1| at initialisation and in the first and last hidden layer at the end (`_f`'s
    strings) and how each goes with depth at the end (`depth`, `_depth`'s), and the correlation of
    W_i^T E[x] / ||W_i|| with the unit's mean over the layers that have it."""
    ref = "normprop-moments"
    if not (m["setting"] == ref).any():
        return None
    share = final_share(m, ref)
    g = m[(m["setting"] == ref) & m["layer"].isin(HIDDEN)]
    last = g[g["epoch"] == g["epoch"].max()].groupby("layer")[["mean_sq", "abs_var_minus_1", "corr_wx_out"]].mean()
    start = g[g["epoch"] == 0].groupby("layer")[["mean_sq", "abs_var_minus_1"]].mean()
    inside = g[g["epoch"].between(0, 1, inclusive="neither")].groupby("step")[["share_mean"]].mean()
    corr = last["corr_wx_out"].dropna()
    return {
        "verdict": "spread" if share["ci_high"] < 0.5 else "mean" if share["ci_low"] > 0.5 else None,
        "epoch": int(g["epoch"].max()),
        "layers": _span(HIDDEN),
        "share": share,
        "bn_share": final_share(m, "batchnorm-moments"),
        "first": {"share": float(inside["share_mean"].iloc[0]), "steps": int(inside.index[0])} if len(inside) else None,
        "start": {"mean_sq": _f(start["mean_sq"].mean()), "var": _f(start["abs_var_minus_1"].mean())},
        "ends": [
            {"layer": int(k), "mean_sq": _f(last.loc[k, "mean_sq"]), "var": _f(last.loc[k, "abs_var_minus_1"])}
            for k in (last.index[0], last.index[-1])
        ],
        "depth": {"mean_sq": _depth(last["mean_sq"]), "var": _depth(last["abs_var_minus_1"])},
        "corr_low": float(last["corr_wx_out"].min()),
        "corr_high": float(last["corr_wx_out"].max()),
        "corr_layers": _span(corr.index if len(corr) else last.index),
    }


def _f(v: float) -> str:
    """Two decimals, none from 100 on (the last layers' units reach thousands), 'n/a' where not finite."""
    return "n/a" if not math.isfinite(v) else f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"


def plot_mean(cfg: DictConfig) -> list[Path]:
    """drift_mean.png/.pdf (module docstring); nothing where no run has the decomposition probe."""
    m = moments(cfg)
    c = comparisons(cfg)
    if not len(m):
        return []
    plt = plots.pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 8.2))
    settings = [s for s in [*REFERENCES, *REPAIRS, BOTH] if (m["setting"] == s).any()]
    final = m[m["epoch"] == m.groupby("setting")["epoch"].transform("max")]
    ax = axes[0, 0]
    width = 0.8 / max(1, len(settings))
    for i, s in enumerate(settings):
        g = final[(final["setting"] == s) & final["layer"].isin(HIDDEN)].groupby("layer")["share_mean"].mean()
        ax.bar(g.index + (i - (len(settings) - 1) / 2) * width, g.values, width, label=_label(s))
    ax.axhline(0.5, color="0.5", lw=0.8, ls=":")
    ax.set(xlabel="layer (its input)", ylabel="mean^2 / (mean^2 + |var - 1|)", title="the mean's share, final epoch")
    ax.legend(fontsize=7, frameon=False)
    ax = axes[0, 1]
    g = m[(m["setting"] == "normprop-moments") & m["layer"].isin(HIDDEN)]
    for epoch, style in ((0, "--"), (int(g["epoch"].max()) if len(g) else 0, "-")):
        e = g[g["epoch"] == epoch].groupby("layer")[["mean_sq", "abs_var_minus_1"]].mean()
        ax.plot(e.index, e["mean_sq"], style, color="C0", label=f"mean^2, epoch {epoch}")
        ax.plot(e.index, e["abs_var_minus_1"], style, color="C3", label=f"|var - 1|, epoch {epoch}")
    ax.set(yscale="log", xlabel="layer (its input)", title="NormProp: mean and spread per layer")
    ax.legend(fontsize=7, frameon=False)
    ax = axes[1, 0]
    early = g[g["epoch"] <= 1].groupby("epoch")[["mean_sq", "abs_var_minus_1"]].mean()
    ax.plot(early.index, early["mean_sq"], "o-", color="C0", label="mean^2")
    ax.plot(early.index, early["abs_var_minus_1"], "o-", color="C3", label="|var - 1|")
    ax.set(xlabel="epoch (probes every 50 steps)", yscale="log", title="NormProp in epoch 1 (layers 2-9)")
    ax.legend(fontsize=7, frameon=False)
    _forest(axes[1, 1], c)
    fig.tight_layout()
    return plots.save(fig, cfg, "drift_mean")


def _label(setting: str) -> str:
    return REFERENCES.get(setting) or REPAIRS.get(setting) or ("mean + Sigma oracles" if setting == BOTH else setting)


def _forest(ax, c: pd.DataFrame) -> None:
    rows = c[c["setting"].isin([*REPAIRS, BOTH]) & c["quantity"].isin(["avg_abs_mean", "avg_std"])] if len(c) else c
    for i, (_, r) in enumerate(rows.iterrows()):
        color = "C0" if r["quantity"] == "avg_abs_mean" else "C3"
        ax.errorbar(r["diff"], i, xerr=[[r["diff"] - r["low"]], [r["high"] - r["diff"]]], fmt="o", color=color)
    names = [f"{_label(s)}: {'|mean|' if q == 'avg_abs_mean' else 'std'}"
             for s, q in zip(rows["setting"], rows["quantity"], strict=True)]  # fmt: skip
    ax.set_yticks(range(len(rows)), names, fontsize=7)
    for x in (0, -THRESHOLD):
        ax.axvline(x, color="0.5", lw=0.8, ls="-" if x == 0 else ":")
    ax.set_xscale("symlog", linthresh=1)
    ax.set(xlabel="difference from NormProp, epoch 6 (95% Welch CI)", title="the rule: lower by 0.30 or more")


def write(cfg: DictConfig) -> None:
    """decomposition.csv, where runs have the decomposition probe."""
    d = decomposition(cfg)
    if len(d):
        run_tables.write(cfg, "decomposition", d)
