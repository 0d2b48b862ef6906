"""The pre-activation mean's part of the drift (fashion preset): the decomposition of every layer input's
departure from N(0, 1) into its mean and its spread (moments.csv, drift/moments.py), and the rule fixed in
conf/experiment_preset/drift_fashion.yaml before the runs, read on ablation.csv's comparisons.

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

from normprop_cli import statistics
from normprop_cli.experiments import plots
from normprop_cli.experiments import tables as run_tables
from normprop_cli.experiments.drift.ablation import comparisons, read_optional
from normprop_cli.experiments.drift.moments import MOMENTS_COLUMNS
from normprop_cli.experiments.drift.tables import learned_rows

QUANTITIES = MOMENTS_COLUMNS[3:]  # mean_sq ... corr_wx_out
REPAIRS = {"normprop-centred": "centred filters", "normprop-mean-oracle": "the mean oracle"}  # the rule's two
BOTH = "normprop-mean-sigma-oracle"
REFERENCES = {"normprop-moments": "NormProp", "batchnorm-moments": "BatchNorm"}
THRESHOLD = 0.30  # the rule's |mean| and std reductions (a third of NormProp's final average |mean|, 0.89)
HIDDEN = range(2, 10)  # layers 2-9, as the population metric


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


def rule(c: pd.DataFrame) -> tuple[str, dict]:
    """The rule's reading and, per repair, its (|mean|, std, accuracy) comparison rows."""
    rows = {s: {q: c[(c["setting"] == s) & (c["quantity"] == q)] for q in ("avg_abs_mean", "avg_std", "final_test_acc")}
            for s in REPAIRS if len(c) and (c["setting"] == s).any()}  # fmt: skip
    found = {s: {q: r.iloc[0] for q, r in qs.items() if len(r)} for s, qs in rows.items()}
    if len(found) < len(REPAIRS) or any(len(v) < 3 for v in found.values()):
        return "not read: a repair's runs are missing", found

    def lowers(r) -> bool:
        return r["diff"] <= -THRESHOLD and r["high"] < 0

    cause = [s for s, v in found.items() if lowers(v["avg_abs_mean"])]
    whole = [s for s in cause if lowers(found[s]["avg_std"]) and found[s]["final_test_acc"]["high"] >= 0]
    if whole:
        return f"the mean is named the cause: {REPAIRS[whole[0]]} remove the drift", found
    if cause:
        return f"the mean is named a cause: {REPAIRS[cause[0]]} lower the final average |mean|", found
    if all(v["avg_abs_mean"]["low"] <= 0 <= v["avg_abs_mean"]["high"] and v["avg_abs_mean"]["low"] > -THRESHOLD
           for v in found.values()):  # fmt: skip
        return "the mean is ruled out", found
    return "undecided", found


def _d(r, digits: int = 2) -> str:
    return f"{r['diff']:+.{digits}f} [{r['low']:+.{digits}f}, {r['high']:+.{digits}f}]"


def mean_paragraphs(cfg: DictConfig) -> list[str]:
    """The decomposition and the rule's reading, every number from moments.csv and ablation.csv's comparisons."""
    m = moments(cfg)
    c = comparisons(cfg)
    if not len(m) or not len(c) or not c["setting"].isin(list(REPAIRS)).any():
        return []
    texts = [_decomposition_text(m)]
    reading, found = rule(c)
    parts = []
    for s, v in found.items():
        if len(v) == 3:
            parts.append(f"{REPAIRS[s]} {_d(v['avg_abs_mean'])} in |mean|, {_d(v['avg_std'])} in std, "
                         f"{_d(v['final_test_acc'])} pp in accuracy")  # fmt: skip
    both = c[c["setting"] == BOTH].set_index("quantity") if (c["setting"] == BOTH).any() else None
    has_both = both is not None and {"avg_abs_mean", "avg_std", "final_test_acc"} <= set(both.index)
    extra = (f" The mean and Sigma oracles together: {_d(both.loc['avg_abs_mean'])} in |mean|, "
             f"{_d(both.loc['avg_std'])} in std, {_d(both.loc['final_test_acc'])} pp." if has_both else "")  # fmt: skip
    worse = all(len(v) == 3 and v["avg_abs_mean"]["low"] > 0 for v in found.values())
    gloss = (" The rule's 'ruled out' clause expected no effect; here both repairs raise the |mean| and the std "
             "with intervals wholly above 0, which that clause does not cover, so by its letter the rule reads "
             "undecided. In the ablation table's terms (taking a part away increases the drift) the mean is ruled "
             "out like the parts above: the evidence points away from it, since taking the pre-activation's mean "
             "away makes the layer inputs leave N(0, 1) further, not less. No repaired method follows from it."
             if reading == "undecided" and worse else "")  # fmt: skip
    texts.append(_left(cfg, m))
    texts.insert(
        -1,
        f"The rule fixed before these runs (drift_fashion.yaml; differences from plain NormProp at epoch 6, 95% "
        f"Welch intervals over 3 seeds): {'; '.join(parts)}.{extra} Reading: {reading}.{gloss}",
    )
    return [t for t in texts if t]


def _left(cfg: DictConfig, m: pd.DataFrame) -> str:
    """What is left once the mean is out: the spread, and the one division no setting has tried."""
    g = m[(m["setting"] == "normprop-moments") & m["layer"].isin(HIDDEN)]
    if not len(g):
        return ""
    last = g[g["epoch"] == g["epoch"].max()]
    var = last.groupby("seed")["var_minus_1"].mean()
    oracle = read_optional(cfg, "sigma_oracle")
    o = oracle[oracle["setting"] == "normprop-sigma-oracle"] if len(oracle) else oracle
    sigma = ""
    if len(o):
        end = o[o["epoch"] == o["epoch"].max()].groupby("layer")["input_var"].mean()
        sigma = (f" The Sigma-oracle keeps each pre-activation at its input's average variance sigma^2 rather "
                 f"than at 1, and that sigma^2 itself grows with depth ({end.iloc[0]:.2f} at layer 1, "
                 f"{end.iloc[-1]:.2f} at layer {int(end.index[-1])}, last epoch; `sigma_oracle.csv`).")  # fmt: skip
    return (
        f"What is left is the spread: NormProp's var - 1, averaged over layers 2-9, ends at "
        f"{statistics.format_mean_ci(statistics.mean_ci(var))} over seeds, positive and growing with depth, and no "
        f"setting (without the Jacobian factor, gamma and beta frozen, half or twice the rate, whitened input, the "
        f"Sigma-oracle, the mean's removal) lowers the final average std with an interval below 0 "
        f"(`ablation.csv`).{sigma} Untested: a division by each "
        f"pre-activation's own measured std (an oracle that resets the variance to 1 in every layer, as BatchNorm "
        f"does with batch statistics), which no batch-independent method gives without an estimate of it."
    )


def _decomposition_text(m: pd.DataFrame) -> str:
    ref = "normprop-moments" if (m["setting"] == "normprop-moments").any() else None
    if ref is None:
        return ""
    share = final_share(m, ref)
    bn = final_share(m, "batchnorm-moments")
    g = m[(m["setting"] == ref) & m["layer"].isin(HIDDEN)]
    last = g[g["epoch"] == g["epoch"].max()].groupby("layer")[["mean_sq", "abs_var_minus_1", "corr_wx_out"]].mean()
    start = g[g["epoch"] == 0].groupby("layer")[["mean_sq", "abs_var_minus_1"]].mean()
    inside = g[g["epoch"].between(0, 1, inclusive="neither")].groupby("step")[["share_mean"]].mean()
    verdict = ("mostly in the spread" if share["ci_high"] < 0.5 else "mostly in the mean" if share["ci_low"] > 0.5
               else "not told apart between mean and spread")  # fmt: skip
    first = f"{inside['share_mean'].iloc[0]:.2f} after {int(inside.index[0])} steps, " if len(inside) else ""
    return (
        f"Decomposition (moments.csv, decomposition.csv): for a layer input x in standard units, E[x^2] - 1 = "
        f"mean^2 + (var - 1). NormProp's drift is {verdict}: at epoch 6 the mean's share mean^2 / (mean^2 + "
        f"|var - 1|), averaged over layers 2-9, is {statistics.format_mean_ci(share)} over seeds ({first}"
        f"{_f(start['mean_sq'].mean())} mean^2 against {_f(start['abs_var_minus_1'].mean())} |var - 1| at "
        f"initialisation; BatchNorm's share {statistics.format_mean_ci(bn)}). Both parts grow with depth: "
        f"layer 2 ends at {_f(last['mean_sq'].iloc[0])} and {_f(last['abs_var_minus_1'].iloc[0])}, layer 9 at "
        f"{_f(last['mean_sq'].iloc[-1])} and {_f(last['abs_var_minus_1'].iloc[-1])} (units' averages, which a "
        f"few wide units dominate in the last layers). The measured W_i^T E[x] / ||W_i|| follows the mean of the "
        f"unit it feeds (correlation over filters {last['corr_wx_out'].min():.2f} to "
        f"{last['corr_wx_out'].max():.2f} in layers 2-8), yet removing it does not hold the units: see the rule."
    )


def _f(v: float) -> str:
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
