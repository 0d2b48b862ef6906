"""The ablation section's parts on the Sigma-oracle, the learning rate and the in-epoch probes, every number
read from the CSVs (ablation.py's tables and comparisons; sigma_oracle.csv; spread_steps.csv and
population_steps.csv): whether dividing by the measured input covariance removes the drift (and then what
the ReLU constants leave), whether the drift follows the rate, and when in epoch 1 the ratio jumps.

Each part is a table of facts (`note_facts`, `oracle_facts`, `rate_facts`, `steps_facts`: numbers, the
readings the prose branches on, per-setting rows) that a template of templates/drift_oracle*.md.j2 puts
into words. An interval is kept as the string format_ci writes, since its digits follow its size."""

from __future__ import annotations

import math

import pandas as pd
from omegaconf import DictConfig

from normprop_cli import prose, statistics
from normprop_cli.experiments.drift.ablation import (
    QUANTITIES,
    entry_get,
    is_reference,
    per_seed,
    rate_scale,
    read_optional,
    seeds_of,
)
from normprop_cli.experiments.drift.oracle import HELD_OUT
from normprop_cli.experiments.drift.tables import ablation_settings, learned_rows
from normprop_cli.statistics import format_ci


def oracle_note(cfg: DictConfig, by: pd.DataFrame, c: pd.DataFrame) -> str:
    """After the closing sentence (it starts with the space that parts them): whether a division that sees
    the input covariance (any Sigma-oracle setting) reduced the drift, and what neither division controls,
    the pre-activation's mean."""
    return "".join(" " + text for text in prose.render("drift_oracle_note", note_facts(cfg, by, c)))


def oracle_paragraphs(cfg: DictConfig, t: dict, by: pd.DataFrame, c: pd.DataFrame) -> list[str]:
    """Per Sigma-oracle setting: its filters' alignment and its divisor, its drift against NormProp's and
    BatchNorm's and the verdict, where its layers' scale grows instead (gamma, the held-out input variance
    layer by layer); then what its residual |mean| says of the ReLU constants."""
    return prose.render("drift_oracle", oracle_facts(cfg, t, by, c))


def rate_sentence(cfg: DictConfig, t: dict, by: pd.DataFrame, c: pd.DataFrame) -> str:
    """NormProp at fixed multiples of its swept rate against it; and where an ablation trained at another
    rate than its main setting, the ablation against the rate setting of the same rate."""
    return prose.text("drift_oracle_rate", rate_facts(cfg, t, by, c))


def steps_paragraph(cfg: DictConfig, t: dict, by: pd.DataFrame) -> str:
    """When in the first epoch the spread ratio and the drift rise, per setting with in-epoch probes."""
    return prose.text("drift_oracle_steps", steps_facts(cfg, t, by))


def _ci(diff: float, low: float, high: float) -> str:
    return format_ci(diff, low, high, 3 if abs(diff) < 0.1 else 2)


def _reading(low: float, high: float) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return "no interval"
    return "lower" if high < 0 else "higher" if low > 0 else "cannot be told apart"


def _against(a: pd.Series, b: pd.Series) -> dict:
    """a's per-seed values minus b's as the prose states them: the Welch interval and its reading."""
    diff, low, high, _ = statistics.welch(a, b)
    return {"ci": _ci(diff, low, high), "reading": _reading(low, high)}


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


def note_facts(cfg: DictConfig, by: pd.DataFrame, c: pd.DataFrame) -> dict:
    """The oracle settings' drift readings; where none reduces it, whether each ends further from mean 0
    than its main setting (average |mean|), and whether the grid also takes the mean away in settings none of
    which reduces the drift (`mean_no_better`)."""
    found = [k for k in oracle_settings(cfg, by) if _quantity(c, k, "avg_drift") is not None]
    drifts = {k: _quantity(c, k, "avg_drift") for k in found}
    means = {k: _quantity(c, k, "avg_abs_mean") for k in found}
    further = bool(means) and all(m is not None and m["reading"] == "increases" for m in means.values())
    mean_drifts = [_quantity(c, k, "avg_drift") for k in by.index if _takes_mean(entry_get(cfg, k))]
    return {
        "shown": bool(found),
        "reduced": [
            {"label": by.loc[k, "label"], "ci": _ci(d["diff"], d["low"], d["high"])}
            for k, d in drifts.items()
            if d["reading"] == "reduces"
        ],
        "further": further,
        "means": [
            {"label": by.loc[k, "label"], "value": m["value"], "ci": _ci(m["diff"], m["low"], m["high"])}
            for k, m in means.items()
        ]
        if further
        else [],
        "reference_mean": next(iter(means.values()))["reference_value"] if further else None,
        "mean_no_better": bool(mean_drifts) and all(d is not None and d["reading"] != "reduces" for d in mean_drifts),
    }


def oracle_facts(cfg: DictConfig, t: dict, by: pd.DataFrame, c: pd.DataFrame) -> dict:
    """Per Sigma-oracle setting with a drift comparison: its rate and refresh, its divisor (`_divisor`), its
    final drift against its main setting's and BatchNorm's, the verdict (removes: reduced to where BatchNorm
    cannot be told apart; reduces; increases; none), its gain (`_gains`) and its moments beside theirs."""
    population, mains = t["population"], ablation_settings(t["summary"])
    divisors = learned_rows(cfg, read_optional(cfg, "sigma_oracle"))
    settings = []
    for setting in oracle_settings(cfg, by):
        ref, d = mains.get(setting), _quantity(c, setting, "avg_drift")
        if ref is None or d is None:
            continue
        a, r, get = by.loc[setting], by.loc[ref], entry_get(cfg, setting)
        frozen = bool(get("model.freeze_affine"))
        bn = _batchnorm(by, a["width"])
        verdict = {"reduces": "reduces", "increases": "increases"}.get(d["reading"], "none")
        against_bn = None
        if bn is not None:
            diff, low, high, _ = statistics.welch(
                per_seed(population, setting, "avg_drift"), per_seed(population, bn, "avg_drift")
            )
            against_bn = {"drift": by.loc[bn, "avg_drift"], "ci": _ci(diff, low, high)}
            if verdict == "reduces" and math.isfinite(high) and low <= 0:
                verdict = "removes"
        settings.append({
            "setting": setting, "label": a["label"], "lr": a["lr"], "frozen": frozen,
            "every": get("model.sigma_oracle_every"), "held_out": HELD_OUT, "reference": r["label"],
            "divisor": _divisor(setting, _quantity(c, setting, "ratio"), divisors),
            "drift": d["value"], "reference_drift": d["reference_value"], "ci": _ci(d["diff"], d["low"], d["high"]),
            "batchnorm": against_bn, "verdict": verdict,
            "gains": None if frozen else _gains(t["affine"], setting, ref),
            "moments": _moments(a, r, by.loc[bn] if bn is not None else None),
        })  # fmt: skip
    return {"settings": settings}


def _divisor(setting: str, ratio: pd.Series | None, divisors: pd.DataFrame) -> dict | None:
    """The oracle's filters' alignment (spread ratio against its main setting's) beside its divisor, and its
    measured input variance layer by layer (sigma_oracle.csv, last epoch, means over seeds)."""
    g = divisors[divisors["setting"] == setting] if len(divisors) else divisors
    if ratio is None or not len(g):
        return None
    last = g[g["epoch"] == g["epoch"].max()]
    var = last.groupby("layer")["input_var"].mean()
    return {
        "ratio": ratio["value"], "reference_ratio": ratio["reference_value"],
        "ci": _ci(ratio["diff"], ratio["low"], ratio["high"]),
        "divisor_ratio": last.groupby("seed")["divisor_ratio"].mean().mean(),
        "input_var": list(var.to_numpy()), "first_layer": int(var.index[0]), "last_layer": int(var.index[-1]),
    }  # fmt: skip


def _gains(affine: pd.DataFrame, setting: str, ref: str) -> dict | None:
    """gamma / f at the first and last epoch (mean over layers and seeds) beside the main setting's
    (affine.csv), and how the two moved: grows_against (the setting's grows, the main one's shrinks),
    grows_more, or no_further."""
    if not len(affine):
        return None
    at = {}
    for k in (setting, ref):
        g = affine[affine["setting"] == k]
        if not len(g) or g["gain_mean"].isna().all():
            return None
        at[k] = (
            g[g["epoch"] == g["epoch"].min()]["gain_mean"].mean(),
            g[g["epoch"] == g["epoch"].max()]["gain_mean"].mean(),
        )
    (a0, a1), (r0, r1) = at[setting], at[ref]
    moved = "grows_against" if a1 > a0 and r1 < r0 else "grows_more" if a1 > r1 else "no_further"
    return {"moved": moved, "start": a0, "end": a1, "reference_start": r0, "reference_end": r1}


def _moments(a: pd.Series, r: pd.Series, bn: pd.Series | None) -> dict:
    """The average |mean| and std of the oracle, its main setting and BatchNorm (ablation.csv), and the
    oracle's |mean| as a percentage of the main setting's excess over BatchNorm's (None without an excess):
    an upper bound on what the ReLU constants leave, once the oracle sets each spread."""
    pair = lambda row: {"mean": row["avg_abs_mean"], "std": row["avg_std"]}  # noqa: E731
    excess = r["avg_abs_mean"] - bn["avg_abs_mean"] if bn is not None else math.nan
    share = 100 * ((a["avg_abs_mean"] - bn["avg_abs_mean"]) / excess) if excess > 0 else None
    return {"own": pair(a), "reference": pair(r), "batchnorm": pair(bn) if bn is not None else None, "share": share}


def rate_facts(cfg: DictConfig, t: dict, by: pd.DataFrame, c: pd.DataFrame) -> dict:
    """Per rate setting (by its multiple of the swept rate): its drift, spread ratio and accuracy against
    the swept rate's; whether the drift follows the rate (follows, unresolved, partly), whether the spread
    ratio does, and the ablations trained at another rate (`_confounds`)."""
    scaled = sorted((rate_scale(cfg, k), k) for k in c["setting"].unique() if rate_scale(cfg, k) is not None)
    if not scaled:
        return {"shown": False}
    rows, signs = [], {}
    for scale, setting in scaled:
        d, ratio = _quantity(c, setting, "avg_drift"), _quantity(c, setting, "ratio")
        acc = _quantity(c, setting, "final_test_acc")
        signs[scale] = _reading(d["low"], d["high"])
        rows.append({
            "scale": scale, "lr": by.loc[setting, "lr"], "drift": d["value"], "reading": signs[scale],
            "ci": _ci(d["diff"], d["low"], d["high"]),
            "ratio": None if ratio is None else {"value": ratio["value"], "ci": _ci(*ratio[["diff", "low", "high"]])},
            "accuracy": None if acc is None else {"value": acc["value"], "ci": _ci(*acc[["diff", "low", "high"]])},
        })  # fmt: skip
    ref = c.loc[c["setting"] == scaled[0][1], "reference"].iloc[0]
    resolved = {k: v for k, v in signs.items() if v in ("lower", "higher")}
    low, high = min(signs), max(signs)
    if low < 1 < high and signs[low] == "lower" and signs[high] == "higher":
        finding = "follows"
    else:
        finding = "partly" if resolved else "unresolved"
    ratios = {k: _quantity(c, setting, "ratio") for k, setting in scaled}
    ratio_follows = (
        all(v is not None for v in ratios.values())
        and min(ratios) < 1 < max(ratios)
        and ratios[min(ratios)]["high"] < 0
        and ratios[max(ratios)]["low"] > 0
    )
    return {
        "shown": True, "reference": by.loc[ref, "label"], "reference_lr": by.loc[ref, "lr"],
        "reference_drift": by.loc[ref, "avg_drift"], "scales": rows, "finding": finding,
        "ratio_follows": bool(ratio_follows),
        "resolved": [{"scale": k, "reading": v} for k, v in resolved.items()],
        "unresolved": [k for k in signs if k not in resolved],
        "confounds": _confounds(cfg, t, by, c, scaled),
    }  # fmt: skip


def _confounds(cfg: DictConfig, t: dict, by: pd.DataFrame, c: pd.DataFrame, scaled: list) -> list[dict]:
    """An ablation at another rate than its main setting, against the rate setting at its own rate: what
    the ablation changes apart from its rate (the differences in QUANTITIES and the spread ratio)."""
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
        other = same[0]
        out.append({
            "lr": lr, "label": by.loc[setting, "label"], "other": by.loc[other, "label"],
            "quantities": [{"name": name} | _against(seeds_of(t, setting, q), seeds_of(t, other, q))
                           for q, name in QUANTITIES.items()],
            "ratio": _against(seeds_of(t, setting, "ratio"), seeds_of(t, other, "ratio")),
        })  # fmt: skip
    return out


def steps_facts(cfg: DictConfig, t: dict, by: pd.DataFrame) -> dict:
    """The in-epoch probes: their step, the epochs they fall at (written as the shortest decimal, a format
    that follows the data), per setting the ratio and drift curves over epoch 1, each setting against the
    reference after the first probe (`_first_probe`), and each reference setting beside its main setting."""
    spread_steps = learned_rows(cfg, read_optional(cfg, "spread_steps"))
    population_steps = learned_rows(cfg, read_optional(cfg, "population_steps"))
    if not len(spread_steps):
        return {"shown": False}
    curves = []
    for setting, g in spread_steps.groupby("setting", sort=False):
        ratio = _curve(g, t["spread"], setting, "ratio")
        p = population_steps[population_steps["setting"] == setting] if len(population_steps) else population_steps
        drift = _curve(p, t["population"], setting, "avg_drift") if len(p) else pd.Series(dtype=float)
        label = by.loc[setting, "label"] if setting in by.index else setting
        curves.append({"label": label, "ratio": list(ratio.to_numpy()), "drift": list(drift.to_numpy())})
    every = int(spread_steps.loc[spread_steps["step"] > 0, "step"].min())
    mains, again = ablation_settings(t["summary"]), []
    for setting in spread_steps["setting"].unique():
        main = mains.get(setting)
        if is_reference(cfg, setting) and main in by.index and setting in by.index:
            a, m = by.loc[setting], by.loc[main]
            again.append({
                "label": a["label"], "main": m["label"], "drift": a["avg_drift"], "accuracy": a["final_test_acc"],
                "main_drift": m["avg_drift"], "main_accuracy": m["final_test_acc"],
            })  # fmt: skip
    return {
        "shown": True, "every": every, "curves": curves,
        "epochs": [f"{e:.2f}".rstrip("0").rstrip(".") for e in ratio.index],
        "first": _first_probe(cfg, spread_steps, population_steps, by, every), "again": again,
    }  # fmt: skip


def _first_probe(cfg: DictConfig, spread: pd.DataFrame, population: pd.DataFrame, by: pd.DataFrame, step: int):
    """Each setting with in-epoch probes minus the reference setting (is_reference) after the first `step`
    SGD steps: the population's average drift, |mean| and std and the spread ratio, Welch 95% over seeds;
    None without a reference setting, without another setting to hold against it or without population probes."""
    refs = [k for k in spread["setting"].unique() if is_reference(cfg, k)]
    if not refs or not len(population):
        return None
    ref, settings = refs[0], []
    at = lambda table, k, q: table[(table["setting"] == k) & (table["step"] == step)].groupby("seed")[q].mean()  # noqa: E731

    def cell(table: pd.DataFrame, setting: str, q: str) -> dict:
        return {"value": at(table, setting, q).mean()} | _against(at(table, setting, q), at(table, ref, q))

    for setting in spread["setting"].unique():
        if setting != ref:
            settings.append({
                "label": by.loc[setting, "label"] if setting in by.index else setting,
                "quantities": [{"name": name} | cell(population, setting, q) for q, name in QUANTITIES.items()],
                "ratio": cell(spread, setting, "ratio"),
            })  # fmt: skip
    if not settings:
        return None
    return {
        "step": step, "reference": by.loc[ref, "label"] if ref in by.index else ref,
        "reference_moments": [at(population, ref, q).mean() for q in QUANTITIES],
        "reference_ratio": at(spread, ref, "ratio").mean(), "settings": settings,
    }  # fmt: skip


def _curve(steps: pd.DataFrame, epochs: pd.DataFrame, setting: str, column: str) -> pd.Series:
    """Per fraction of an epoch: the mean over layers, then over seeds, of `column`; the in-epoch rows,
    then the epoch-level rows up to the last epoch the in-epoch rows reach (rounded up)."""
    inside = steps.groupby(["epoch", "seed"])[column].mean().groupby("epoch").mean()
    e = epochs[(epochs["setting"] == setting) & (epochs["epoch"] > inside.index.max())] if len(epochs) else epochs
    e = e[e["epoch"] <= math.ceil(inside.index.max() + 1e-9)] if len(e) else e
    after = e.groupby(["epoch", "seed"])[column].mean().groupby("epoch").mean() if len(e) else pd.Series(dtype=float)
    return pd.concat([inside, after]).sort_index()
