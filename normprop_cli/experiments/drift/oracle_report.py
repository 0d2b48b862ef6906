"""The ablation section's parts on the Sigma-oracle, the learning rate and the in-epoch probes, every number
read from the CSVs (ablation.py's tables and comparisons; sigma_oracle.csv; spread_steps.csv and
population_steps.csv): whether dividing by the measured input covariance removes the drift (and then what
the ReLU constants leave), whether the drift follows the rate, and when in epoch 1 the ratio jumps."""

from __future__ import annotations

import math

import pandas as pd
from omegaconf import DictConfig

from normprop_cli import statistics
from normprop_cli.experiments.drift.ablation import (
    QUANTITIES,
    entry_get,
    is_reference,
    per_seed,
    rate_scale,
    read_optional,
    seeds_of,
)
from normprop_cli.experiments.drift.tables import ablation_settings, learned_rows
from normprop_cli.statistics import format_ci


def _ci(diff: float, low: float, high: float) -> str:
    return format_ci(diff, low, high, 3 if abs(diff) < 0.1 else 2)


def _reading(low: float, high: float) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return "no interval"
    return "lower" if high < 0 else "higher" if low > 0 else "cannot be told apart"


def _quantity(c: pd.DataFrame, setting: str, q: str) -> pd.Series | None:
    rows = c[(c["setting"] == setting) & (c["quantity"] == q)]
    return rows.iloc[0] if len(rows) else None


def _batchnorm(by: pd.DataFrame, width: float) -> str | None:
    """The main BatchNorm setting at `width` (the one named batchnorm, else the first)."""
    bn = [k for k, r in by.iterrows() if r["method"] == "batchnorm" and r["width"] == width]
    return "batchnorm" if "batchnorm" in bn else (bn[0] if bn else None)


def oracle_settings(cfg: DictConfig, by: pd.DataFrame) -> list[str]:
    out = []
    for setting in by.index:
        get = entry_get(cfg, setting)
        every = get("model.sigma_oracle_every") if get else None
        if isinstance(every, int) and every > 0 and not _takes_mean(get):  # the mean's settings: mean_report
            out.append(setting)
    return out


def _takes_mean(get) -> bool:
    """Does a setting take the pre-activation's mean away (centred filters, the mean oracle)?"""
    every = get("model.mean_oracle_every") if get else None
    return bool(get and (get("model.center") is True or (isinstance(every, int) and every > 0)))


def oracle_paragraphs(cfg: DictConfig, t: dict, by: pd.DataFrame, c: pd.DataFrame) -> list[str]:
    """Per Sigma-oracle setting: its filters' alignment and its divisor, its drift against NormProp's and
    BatchNorm's and the verdict, where its layers' scale grows instead (gamma, the held-out input variance
    layer by layer); then what its residual |mean| says of the ReLU constants."""
    population, mains = t["population"], ablation_settings(t["summary"])
    divisors = learned_rows(cfg, read_optional(cfg, "sigma_oracle"))
    texts = []
    for setting in oracle_settings(cfg, by):
        ref, d = mains.get(setting), _quantity(c, setting, "avg_drift")
        if ref is None or d is None:
            continue
        a, r, get = by.loc[setting], by.loc[ref], entry_get(cfg, setting)
        frozen = bool(get("model.freeze_affine"))
        text = (
            f"**Sigma-oracle{', gamma and beta frozen' if frozen else ''}.** {a['label']} (`{setting}`, rate "
            f"{a['lr']:g}) divides each filter by the std its pre-activation has on 500 held-out validation images, "
            f"refreshed every {get('model.sigma_oracle_every')} SGD steps, in every layer: Proposition 1's white-input "
            "premise is no longer needed. "
        )
        text += _divisor(setting, r, _quantity(c, setting, "ratio"), divisors, frozen)
        text += (
            f"Final average drift {d['value']:.2f} against {r['label']}'s {d['reference_value']:.2f}, a difference of "
            f"{_ci(d['diff'], d['low'], d['high'])} (`population.csv`, Welch 95% over seeds)"
        )
        bn = _batchnorm(by, a["width"])
        verdict = {"reduces": "reduces", "increases": "increases"}.get(d["reading"], "none")
        if bn is not None:
            diff, low, high, _ = statistics.welch(
                per_seed(population, setting, "avg_drift"), per_seed(population, bn, "avg_drift")
            )
            text += f"; against BatchNorm's {by.loc[bn, 'avg_drift']:.2f}, {_ci(diff, low, high)}"
            if verdict == "reduces" and math.isfinite(high) and low <= 0:
                verdict = "removes"
        text += ". " + VERDICTS[verdict]
        if not frozen:
            text += _gains(t["affine"], setting, ref)
        texts.append(text)
        texts.append(_constants(a, r, by.loc[bn] if bn is not None else None, verdict, frozen))
    return texts


VERDICTS = {
    "removes": "Dividing by the measured input covariance removes the drift: the input-covariance term of "
    "Proposition 1, which dividing by ||W_i|| cannot see, accounts for it.",
    "reduces": "Dividing by the measured input covariance reduces the drift but leaves more than BatchNorm's: the "
    "input-covariance term accounts for part of it.",
    "increases": "Dividing by the measured input covariance does not reduce the drift; it increases it: the "
    "input-covariance term alone does not account for the drift.",
    "none": "Dividing by the measured input covariance does not reduce the drift beyond what these seeds resolve: "
    "the input-covariance term of Proposition 1 is not shown to account for it.",
}


def oracle_note(cfg: DictConfig, by: pd.DataFrame, c: pd.DataFrame) -> str:
    """After the closing sentence: whether a division that sees the input covariance (any Sigma-oracle
    setting) reduced the drift, and what neither division controls, the pre-activation's mean."""
    found = [k for k in oracle_settings(cfg, by) if _quantity(c, k, "avg_drift") is not None]
    if not found:
        return ""
    reduced = [k for k in found if _quantity(c, k, "avg_drift")["reading"] == "reduces"]
    if reduced:
        return (
            " A division that sees the input covariance reduces it: "
            + "; ".join(
                f"{by.loc[k, 'label']} ({_ci(*_quantity(c, k, 'avg_drift')[['diff', 'low', 'high']])})" for k in reduced
            )
            + " (the Sigma-oracle paragraph below)."
        )
    means = [(k, _quantity(c, k, "avg_abs_mean")) for k in found]
    text = (
        " A division that sees the input covariance, the Sigma-oracle's, does not reduce the final drift "
        "(the Sigma-oracle paragraphs below)"
    )
    if means and all(m is not None and m["reading"] == "increases" for _, m in means):
        text += (
            "; its layer inputs end further from mean 0 than NormProp's (average |mean| "
            + "; ".join(
                f"{by.loc[k, 'label']} {m['value']:.2f}, {_ci(m['diff'], m['low'], m['high'])}" for k, m in means
            )
            + f", against {means[0][1]['reference_value']:.2f}). Neither division controls the "
            "pre-activation's mean: W_i^T E[x] passes through ||W_i|| and sqrt(W_i^T Sigma W_i) alike, and the "
            "activation's constants c2, c1 centre and scale its output only for a zero-mean N(0, 1) pre-activation "
            "(Remark 1)"
        )
        tested = any(_takes_mean(entry_get(cfg, k)) for k in by.index)
        text += (
            "; the settings that take that mean away (centred filters, the mean oracle) do not reduce the drift "
            "either (the decomposition and the rule below)"
            if tested
            else ""
        )
    return text + "."


def _divisor(setting: str, r: pd.Series, ratio: pd.Series | None, divisors: pd.DataFrame, frozen: bool) -> str:
    """The oracle's filters' alignment (spread ratio) beside its divisor, and its measured input variance
    layer by layer (sigma_oracle.csv, last epoch, means over seeds)."""
    g = divisors[divisors["setting"] == setting] if len(divisors) else divisors
    if ratio is None or not len(g):
        return ""
    last = g[g["epoch"] == g["epoch"].max()]
    div = last.groupby("seed")["divisor_ratio"].mean().mean()
    var = last.groupby("layer")["input_var"].mean()
    return (
        f"Its filters still line up with their inputs' high-variance directions (final spread ratio "
        f"{ratio['value']:.2f} against {r['label']}'s {ratio['reference_value']:.2f}, a difference of "
        f"{_ci(ratio['diff'], ratio['low'], ratio['high'])}; `spread.csv`), and its divisor follows them: "
        f"sqrt(W_i^T A W_i) / ||W_i|| averages {div:.2f} over layers at the last epoch (`sigma_oracle.csv`). The "
        f"input variance sigma^2 it measures on the held-out images goes from {var.iloc[0]:.2f} at layer "
        f"{int(var.index[0])} to {var.iloc[-1]:.2f} at layer {int(var.index[-1])} ("
        + ", ".join(f"{v:.2f}" for v in var.to_numpy())
        + "): each pre-activation keeps its input's variance, so what changes it from layer to layer enters after the "
        + (
            "division: 1 / f, the activation's standardisation by c2 and c1, and pooling. "
            if frozen
            else "division: gamma / f, beta, the activation's standardisation by c2 and c1, and pooling. "
        )
    )


def _gains(affine: pd.DataFrame, setting: str, ref: str) -> str:
    """gamma / f at the last epoch (mean over layers and seeds) beside the main setting's (affine.csv)."""
    if not len(affine):
        return ""
    at = {}
    for k in (setting, ref):
        g = affine[affine["setting"] == k]
        if not len(g) or g["gain_mean"].isna().all():
            return ""
        at[k] = (
            g[g["epoch"] == g["epoch"].min()]["gain_mean"].mean(),
            g[g["epoch"] == g["epoch"].max()]["gain_mean"].mean(),
        )
    (a0, a1), (r0, r1) = at[setting], at[ref]
    grows = "grows where NormProp's shrinks" if a1 > a0 and r1 < r0 else "grows more than NormProp's" if a1 > r1 else (
        "moves no further than NormProp's")  # fmt: skip
    return (
        f" Its gamma {grows}: the mean gain gamma / f over layers goes from {a0:.2f} to {a1:.2f}, NormProp's from "
        f"{r0:.2f} to {r1:.2f} (`affine.csv`)."
    )


def _constants(a: pd.Series, r: pd.Series, bn: pd.Series | None, verdict: str, frozen: bool) -> str:
    """What the ReLU constants leave, read from the oracle's residual |mean| (only where it cuts the drift)."""
    if verdict in ("none", "increases"):
        return (
            "With the drift not reduced by the oracle, its residual |mean| does not isolate the ReLU constants "
            f"c2, c1 (its average |mean| {a['avg_abs_mean']:.2f}, average std {a['avg_std']:.2f}; NormProp's "
            f"{r['avg_abs_mean']:.2f} and {r['avg_std']:.2f}; `ablation.csv`)."
        )
    text = (
        f"What the oracle leaves: its layer inputs' average |mean| is {a['avg_abs_mean']:.2f} and average std "
        f"{a['avg_std']:.2f} (NormProp's {r['avg_abs_mean']:.2f} and {r['avg_std']:.2f}"
    )
    if bn is None:
        return text + ")."
    text += f"; BatchNorm's {bn['avg_abs_mean']:.2f} and {bn['avg_std']:.2f}; `ablation.csv`)."
    excess = r["avg_abs_mean"] - bn["avg_abs_mean"]
    if excess > 0:
        share = (a["avg_abs_mean"] - bn["avg_abs_mean"]) / excess
        beta = "" if frozen else ", the learnt beta"
        text += (
            f" With each pre-activation's spread set from the measured covariance, the |mean| that remains comes "
            f"from what the oracle does not correct: the ReLU constants c2, c1 (Remark 1: exact for an N(0, 1) "
            f"pre-activation only){beta} and the input's mean. That is {100 * share:.0f}% of NormProp's excess "
            "average |mean| over BatchNorm's, an upper bound on the constants' share."
        )
    return text


def rate_sentence(cfg: DictConfig, t: dict, by: pd.DataFrame, c: pd.DataFrame) -> str:
    """NormProp at fixed multiples of its swept rate against it; and where an ablation trained at another
    rate than its main setting, the ablation against the rate setting of the same rate."""
    scaled = sorted((rate_scale(cfg, k), k) for k in c["setting"].unique() if rate_scale(cfg, k) is not None)
    if not scaled:
        return ""
    parts, signs = [], {}
    for scale, setting in scaled:
        d, ratio = _quantity(c, setting, "avg_drift"), _quantity(c, setting, "ratio")
        acc = _quantity(c, setting, "final_test_acc")
        signs[scale] = _reading(d["low"], d["high"])
        part = (f"at {scale:g} times the rate ({by.loc[setting, 'lr']:g}) the final average drift is {d['value']:.2f}, "
                f"a difference of {_ci(d['diff'], d['low'], d['high'])} ({signs[scale]})")  # fmt: skip
        if ratio is not None:
            part += f", the spread ratio {ratio['value']:.2f} ({_ci(ratio['diff'], ratio['low'], ratio['high'])})"
        if acc is not None:
            part += f", the final test accuracy {acc['value']:.2f}% ({_ci(acc['diff'], acc['low'], acc['high'])} pp)"
        parts.append(part)
    ref = c.loc[c["setting"] == scaled[0][1], "reference"].iloc[0]
    text = (f"**The learning rate.** Against {by.loc[ref, 'label']} at its swept rate {by.loc[ref, 'lr']:g} "
            f"(final average drift {by.loc[ref, 'avg_drift']:.2f}; Welch 95% over seeds, `population.csv`, "
            f"`spread.csv`, `summary.csv`): " + "; ".join(parts) + ". ")  # fmt: skip
    resolved = {k: v for k, v in signs.items() if v in ("lower", "higher")}
    if min(signs) < 1 < max(signs) and signs[min(signs)] == "lower" and signs[max(signs)] == "higher":
        text += "The drift follows the rate: lower at the lower rate, higher at the higher."
    elif not resolved:
        text += ("No other rate moves the drift beyond what these seeds resolve: the rate is not shown to drive "
                 "it.")  # fmt: skip
        ratios = {k: _quantity(c, setting, "ratio") for k, setting in scaled}
        if all(v is not None for v in ratios.values()):
            lo, hi = ratios[min(ratios)], ratios[max(ratios)]
            if min(ratios) < 1 < max(ratios) and lo["high"] < 0 and hi["low"] > 0:
                text += (" The spread ratio does follow it, lower at the lower rate and higher at the higher: the rate "
                         "sets how far the filters line up, while the drift is not shown to follow it.")  # fmt: skip
    else:
        rest = [f"{k:g}" for k in signs if k not in resolved]
        found = " and ".join(f"{v} at {k:g} times the rate" for k, v in resolved.items())
        tail = f"; at {' and '.join(rest)} times it cannot be told apart from the swept rate's" if rest else ""
        text += f"Beyond what these seeds resolve, the drift is {found}{tail}."
    return text + _confound(cfg, t, by, c, scaled)


def _confound(cfg: DictConfig, t: dict, by: pd.DataFrame, c: pd.DataFrame, scaled: list) -> str:
    """An ablation at another rate than its main setting, against the rate setting at its own rate: what
    the ablation changes apart from its rate."""
    out = []
    for setting in dict.fromkeys(c["setting"]):
        if rate_scale(cfg, setting) is not None or is_reference(cfg, setting):
            continue
        ref = c.loc[c["setting"] == setting, "reference"].iloc[0]
        lr, main_lr = by.loc[setting, "lr"], by.loc[ref, "lr"]
        if not (math.isfinite(lr) and math.isfinite(main_lr)) or math.isclose(lr, main_lr):
            continue
        same = [k for _, k in scaled if math.isclose(by.loc[k, "lr"], lr)]
        if not same:
            continue
        names = QUANTITIES | {"ratio": "spread ratio"}
        diffs = []
        for q, name in names.items():
            diff, low, high, _ = statistics.welch(seeds_of(t, setting, q), seeds_of(t, same[0], q))
            diffs.append(f"{name} {_ci(diff, low, high)} ({_reading(low, high)})")
        out.append(
            f" At the same rate {lr:g}, {by.loc[setting, 'label']} minus {by.loc[same[0], 'label']}: "
            + "; ".join(diffs)
            + ": what that ablation changes apart from its rate."
        )
    return "".join(out)


def steps_paragraph(cfg: DictConfig, t: dict, by: pd.DataFrame) -> str:
    """When in the first epoch the spread ratio and the drift rise, per setting with in-epoch probes."""
    spread_steps = learned_rows(cfg, read_optional(cfg, "spread_steps"))
    population_steps = learned_rows(cfg, read_optional(cfg, "population_steps"))
    if not len(spread_steps):
        return ""
    parts = []
    for setting, g in spread_steps.groupby("setting", sort=False):
        ratio = _curve(g, t["spread"], setting, "ratio")
        p = population_steps[population_steps["setting"] == setting] if len(population_steps) else population_steps
        drift = _curve(p, t["population"], setting, "avg_drift") if len(p) else pd.Series(dtype=float)
        label = by.loc[setting, "label"] if setting in by.index else setting
        part = f"{label}: ratio " + ", ".join(f"{v:.2f}" for v in ratio.to_numpy())
        if len(drift):
            part += "; average drift " + ", ".join(f"{v:.2f}" for v in drift.to_numpy())
        parts.append(part)
    at = ", ".join(f"{e:.2f}".rstrip("0").rstrip(".") for e in ratio.index)
    every = int(spread_steps.loc[spread_steps["step"] > 0, "step"].min())
    text = (
        f"**Inside epoch 1.** The probes every {every} SGD steps of the first epoch (`spread_steps.csv`, "
        "`population_steps.csv`; the end of the epoch from `spread.csv` and `population.csv`), at epochs "
        f"{at}, means over layers and seeds: " + "; ".join(parts) + "."
    )
    text += _first_probe(cfg, spread_steps, population_steps, by, every)
    mains = ablation_settings(t["summary"])
    for setting in spread_steps["setting"].unique():
        main = mains.get(setting)
        if is_reference(cfg, setting) and main in by.index and setting in by.index:
            a, m = by.loc[setting], by.loc[main]
            text += (
                f" {a['label']} is {m['label']} again with the probes, which change no weight: final average drift "
                f"{a['avg_drift']:.2f} and test accuracy {a['final_test_acc']:.2f}% against {m['avg_drift']:.2f} and "
                f"{m['final_test_acc']:.2f}% (`ablation.csv`; the same seeds)."
            )
    return text


def _first_probe(cfg: DictConfig, spread: pd.DataFrame, population: pd.DataFrame, by: pd.DataFrame, step: int) -> str:
    """Each setting with in-epoch probes minus the reference setting (is_reference) after the first `step`
    SGD steps: the population's average drift, |mean| and std and the spread ratio, Welch 95% over seeds."""
    refs = [k for k in spread["setting"].unique() if is_reference(cfg, k)]
    if not refs or not len(population):
        return ""
    ref, parts = refs[0], []
    at = lambda table, k, q: table[(table["setting"] == k) & (table["step"] == step)].groupby("seed")[q].mean()  # noqa: E731
    for setting in spread["setting"].unique():
        if setting == ref:
            continue
        cells = []
        for table, q, name in [*((population, q, name) for q, name in QUANTITIES.items()), (spread, "ratio", "ratio")]:
            diff, low, high, _ = statistics.welch(at(table, setting, q), at(table, ref, q))
            cells.append(f"{name} {at(table, setting, q).mean():.2f}, {_ci(diff, low, high)} ({_reading(low, high)})")
        parts.append(f"{by.loc[setting, 'label'] if setting in by.index else setting}: " + "; ".join(cells))
    return (
        f" After the first {step} steps, each setting's value and its difference from "
        f"{by.loc[ref, 'label'] if ref in by.index else ref}'s (average drift, |mean|, std "
        + ", ".join(f"{at(population, ref, q).mean():.2f}" for q in QUANTITIES)
        + f", ratio {at(spread, ref, 'ratio').mean():.2f}; Welch 95% over seeds): "
        + "; ".join(parts)
        + "."
    )


def _curve(steps: pd.DataFrame, epochs: pd.DataFrame, setting: str, column: str) -> pd.Series:
    """Per fraction of an epoch: the mean over layers, then over seeds, of `column`; the in-epoch rows,
    then the epoch-level rows up to the last epoch the in-epoch rows reach (rounded up)."""
    inside = steps.groupby(["epoch", "seed"])[column].mean().groupby("epoch").mean()
    e = epochs[(epochs["setting"] == setting) & (epochs["epoch"] > inside.index.max())] if len(epochs) else epochs
    e = e[e["epoch"] <= math.ceil(inside.index.max() + 1e-9)] if len(e) else e
    after = e.groupby(["epoch", "seed"])[column].mean().groupby("epoch").mean() if len(e) else pd.Series(dtype=float)
    return pd.concat([inside, after]).sort_index()
