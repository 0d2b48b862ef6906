"""The ablation's headlines and paragraphs, every number read from the CSVs (ablation.py): which part of
NormProp the drift comes from, how far gamma and beta moved, and the width-1.0 pair."""

from __future__ import annotations

import math

import pandas as pd
from omegaconf import DictConfig

from normprop_cli.experiments import tables as run_tables
from normprop_cli.experiments.drift.ablation import (
    MORE,
    QUANTITIES,
    accounting,
    cause,
    comparisons,
    gains,
    rate_scale,
    setting_table,
    tables,
)
from normprop_cli.experiments.drift.mean_report import mean_paragraphs
from normprop_cli.experiments.drift.oracle_report import oracle_note, oracle_paragraphs, rate_sentence, steps_paragraph
from normprop_cli.experiments.drift.tables import ablation_settings
from normprop_cli.statistics import format_ci, markdown


def ablation_headlines(cfg: DictConfig) -> list[dict]:
    """Per ablation: its final average drift minus its main setting's [95% Welch CI] and the reading;
    the largest reduction among those that account for the drift."""
    t = tables(cfg)
    if not ablation_settings(t["summary"]):
        return []
    s, c = setting_table(cfg, t).set_index("setting"), comparisons(cfg, t)
    rows = []
    for _, r in c[c["quantity"] == "avg_drift"].iterrows():
        rows.append({"quantity": f"final average drift (layers 2-9) of {s.loc[r['setting'], 'label']} minus "
                                 f"{s.loc[r['reference'], 'label']}'s [95% Welch CI over seeds]",
                     "reproduced": f"{_diff(r)}: {r['reading']}", "paper": "not in the paper"})  # fmt: skip
    named = accounting(c)
    if len(named):
        top = named.iloc[0]
        best = f"{s.loc[top['setting'], 'label']} {_diff(top)}"
        rows.append({"quantity": "largest drift reduction among the ablations [95% Welch CI]", "reproduced": best,
                     "paper": "not in the paper"})  # fmt: skip
    return rows


def ablation_paragraphs(cfg: DictConfig) -> list[str]:
    """The ablation section: the table of every setting, a sentence per ablation, the closing sentence
    naming the ablations that account for the drift (or which do not), gamma and beta, the width pair."""
    t = tables(cfg)
    if not ablation_settings(t["summary"]):
        return []
    s, c = setting_table(cfg, t), comparisons(cfg, t)
    by = s.set_index("setting")
    population = t["population"]
    last = int(population["epoch"].max()) if len(population) else int(cfg.train.epochs)
    texts = [_intro(cfg, last), _markdown(s)]
    for _, g in c.groupby("setting", sort=False):
        texts.append(_ablation_sentence(cfg, by, g))
    taken = c[c["setting"].map(lambda k: rate_scale(cfg, k) is None)]  # the rate's settings: rate_sentence
    texts.append(_closing(cfg, by, taken[taken["quantity"].isin(list(QUANTITIES))], s) + oracle_note(cfg, by, c))
    texts.append(rate_sentence(cfg, t, by, c))
    texts += oracle_paragraphs(cfg, t, by, c)
    texts.append(steps_paragraph(cfg, t, by))
    texts += _affine_sentences(t["affine"], s, set(ablation_settings(t["summary"]).values()))
    texts += _width_pairs(s)
    texts += mean_paragraphs(cfg)
    return [x for x in texts if x]


def _intro(cfg: DictConfig, last: int) -> str:
    rate = ("the rate its validation sweep chose (`lr_sweep.csv`, `lr_sweep.png`)" if cfg.experiment.get("lr_sweep")
            is not None else "its grid's rate")  # fmt: skip
    return (
        f"**Ablation ({cfg.dataset.name}, {cfg.preset.name} preset).** Which part of NormProp makes its layer inputs "
        f"leave N(0, 1)? (`ablation.csv`, `affine.csv`, `drift_ablation.png`.) Each setting below trains {last} "
        f"epoch{'s' * (last != 1)} at {rate}, and the probes measure "
        f"{run_tables.probe_set(cfg)}. Drift, |mean| and std are the population's (layers 2-9, mean over layers at the "
        "last epoch), each a mean over seeds with a 95% t interval; accuracy has a 95% interval on the logit scale; "
        "gamma and beta change is the RMS over units of the change since initialisation, mean over layers and seeds. "
        "Each ablation's difference from its main setting is a Welch 95% interval over independent seeds, one per "
        "quantity, not corrected for the number of comparisons: *reduces* or *increases* where it excludes 0, "
        "*cannot be told apart* where it does not. Runs that diverged or did not learn are left out (n counts the "
        "rest)."
    )


def _markdown(s: pd.DataFrame) -> str:
    head = ["setting", "method", "width", "rate", "n", "final test acc. (%)", "avg drift", "avg abs. mean", "avg std",
            "spread ratio", "gamma change", "beta change"]  # fmt: skip
    rows = []
    for _, r in s.iterrows():
        gone = f" ({int(r['diverged'])} diverged)" if r["diverged"] else ""
        cells = [f"`{r['setting']}`", r["label"], f"{r['width']:g}", _num(r["lr"], "g"), f"{int(r['n'])}{gone}",
                 format_ci(r["final_test_acc"], r["acc_low"], r["acc_high"]),
                 *[format_ci(r[q], r[f"{q}_low"], r[f"{q}_high"]) for q in QUANTITIES],
                 format_ci(r["ratio"], r["ratio_low"], r["ratio_high"]) if math.isfinite(r["ratio"]) else "-",
                 _num(r["gamma_change"], ".3f"), _num(r["beta_change"], ".3f")]  # fmt: skip
        rows.append(cells)
    return "\n".join(markdown(rows, head, rule="---"))


def _num(v: float, spec: str = ".2f") -> str:
    return format(v, spec) if isinstance(v, int | float) and math.isfinite(v) else "-"


def _diff(r) -> str:
    return format_ci(r["diff"], r["low"], r["high"], 3 if abs(r["diff"]) < 0.1 else 2)


def _ablation_sentence(cfg: DictConfig, by: pd.DataFrame, g: pd.DataFrame) -> str:
    setting, reference = g["setting"].iloc[0], g["reference"].iloc[0]
    a, ref = by.loc[setting], by.loc[reference]
    rows = g.set_index("quantity")
    d = rows.loc["avg_drift"]
    rate = f" (rate {a['lr']:g}, against {ref['lr']:g})" if math.isfinite(a["lr"]) and math.isfinite(ref["lr"]) else ""
    names = QUANTITIES | MORE
    others = "; ".join(
        f"{names[q]} {rows.loc[q, 'value']:.2f} against {rows.loc[q, 'reference_value']:.2f}, a difference of "
        f"{_diff(rows.loc[q])} ({rows.loc[q, 'reading']})"
        for q in ("avg_abs_mean", "avg_std", *MORE)
        if q in rows.index and math.isfinite(rows.loc[q, "value"])
    )
    n = f"n = {int(a['n'])} and {int(ref['n'])} seeds"
    verdict = {"reduces": "it reduces the drift", "increases": "it increases the drift",
               "cannot be told apart": "the two cannot be told apart",
               "no interval": "no interval at fewer than 2 seeds a side"}[d["reading"]]  # fmt: skip
    return (
        f"{a['label']}{rate}, taking away {cause(cfg, setting)}: final average drift {d['value']:.2f} against "
        f"{ref['label']}'s {d['reference_value']:.2f}, a difference of {_diff(d)} ({n}): {verdict}; {others}."
    )


def _closing(cfg: DictConfig, by: pd.DataFrame, c: pd.DataFrame, s: pd.DataFrame) -> str:
    named = accounting(c)
    drift = c[c["quantity"] == "avg_drift"]
    rest = drift[~drift["setting"].isin(named["setting"])]
    # Drift is in each unit's initial std, |mean| and std in the N(0, 1) units the paper aims at: an ablation
    # that reduces none of the three and increases one makes the inputs leave N(0, 1) further without it.
    readings = c.groupby("setting")["reading"].agg(set)
    worse = {k for k, r in readings.items() if "increases" in r and "reduces" not in r}
    parts = []
    if len(named):
        gap = _gap_to_batchnorm(by, s, named["reference"].iloc[0])
        listed = "; ".join(f"{cause(cfg, r['setting'])} ({by.loc[r['setting'], 'label']}: {_diff(r)}{_share(r, gap)})"
                           for _, r in named.iterrows())  # fmt: skip
        parts.append(
            f"The drift is accounted for by {listed}: taking {'it' if len(named) == 1 else 'each'} away reduces "
            "the final average drift with a 95% interval that excludes 0 (largest reduction first)."
        )
    else:
        parts.append("No ablation reduces the final average drift with a 95% interval that excludes 0.")
    up = rest[rest["setting"].isin(worse)]
    if len(up):
        raised = "; ".join(
            f"{cause(cfg, k)} ("
            + ", ".join(f"{QUANTITIES[q['quantity']]} {_diff(q)}" for _, q in g[g["reading"] == "increases"].iterrows())
            + ")"
            for k, g in c[c["setting"].isin(up["setting"])].groupby("setting", sort=False)
        )
        parts.append(f"Ruled out as causes: {raised}: taking {'it' if len(up) == 1 else 'each'} away "
                     "reduces none of drift, |mean| and std and increases at least one of them (the sentences "
                     "above), so the inputs leave N(0, 1) further without it.")  # fmt: skip
    same = rest[~rest["setting"].isin(worse) & rest["reading"].isin(["cannot be told apart", "no interval"])]
    if len(same):
        parts.append(
            f"Not shown to account for it at this budget: {_list(cfg, same)} (an interval that includes 0, or none); "
            "a smaller effect than these seeds resolve is not excluded."
        )
    ratios = s[s["setting"].isin(list(ablation_settings(s))) | (s["method"] == "normprop")]["ratio"].dropna()
    bn = s[s["method"] == "batchnorm"]["ratio"].dropna()
    if not len(named) and len(ratios):
        parts.append(
            f"What the ablations leave is the mechanism of the spread measurement above: in every NormProp setting, "
            f"ablations included, the trained filters line up with high-variance directions of their input (final "
            f"spread ratio {ratios.min():.2f}-{ratios.max():.2f}, against 1 under Proposition 1's premise), which a "
            "division by ||W_i|| cannot see"
            + (
                f"; BatchNorm's filters line up as much ({bn.min():.2f}-{bn.max():.2f}) but BatchNorm divides by the "
                "measured std."
                if len(bn)
                else "."
            )  # fmt: skip
        )
    return " ".join(parts)


def _list(cfg: DictConfig, rows: pd.DataFrame) -> str:
    return "; ".join(f"{cause(cfg, r['setting'])} ({_diff(r)})" for _, r in rows.iterrows())


def _gap_to_batchnorm(by: pd.DataFrame, s: pd.DataFrame, reference: str) -> float:
    """The main setting's final average drift minus BatchNorm's at the same width (NaN without one)."""
    ref = by.loc[reference]
    bn = s[(s["method"] == "batchnorm") & (s["width"] == ref["width"])]
    return float(ref["avg_drift"] - bn["avg_drift"].iloc[0]) if len(bn) and ref["method"] != "batchnorm" else math.nan


def _share(r, gap: float) -> str:
    if not (math.isfinite(gap) and gap > 0):
        return ""
    return f", {100.0 * -r['diff'] / gap:.0f}% of the excess over BatchNorm's drift"


def _affine_sentences(affine: pd.DataFrame, s: pd.DataFrame, mains: set[str]) -> list[str]:
    """How far gamma and beta moved per setting; the mean gamma / f per layer at the start and the end of
    each NormProp setting that ablations are compared with."""
    if not len(affine):
        return []
    narrow = s["width"].min()
    moved = [f"{r['label']}{f' (width {w:g})' if (w := r['width']) > narrow else ''} {r['gamma_change']:.3f} and "
             f"{r['beta_change']:.3f}" for _, r in s.iterrows() if math.isfinite(r["gamma_change"])]  # fmt: skip
    texts = [f"Gamma and beta moved, by their RMS change since initialisation at the last epoch (mean over layers "
             f"and seeds; BatchNorm: its weight and bias): {'; '.join(moved)}."] if moved else []  # fmt: skip
    for _, r in s[s["setting"].isin(mains) & (s["method"] == "normprop")].iterrows():
        g = gains(affine, r["setting"])
        if len(g):
            per = ", ".join(f"{int(k)}: {v['start']:.2f} -> {v['end']:.2f}" for k, v in g.iterrows())
            texts.append(f"{r['label']}, width {r['width']:g}: the mean over units of the effective gain gamma / f, "
                         f"layer by layer, initialisation -> last epoch: {per}.")  # fmt: skip
    return texts


def _width_pairs(s: pd.DataFrame) -> list[str]:
    """NormProp against BatchNorm at each width above the narrowest, beside the narrowest width's pair."""
    narrow = s["width"].min()
    main = s[~s["setting"].isin(list(ablation_settings(s)))]
    pair = lambda w: {m: main[(main["method"] == m) & (main["width"] == w)] for m in ("normprop", "batchnorm")}  # noqa: E731
    base = pair(narrow)
    texts = []
    for width in sorted(w for w in s["width"].unique() if w > narrow):
        p = pair(width)
        if not (len(p["normprop"]) and len(p["batchnorm"])):
            continue
        np_, bn = p["normprop"].iloc[0], p["batchnorm"].iloc[0]
        if not (math.isfinite(np_["avg_drift"]) and math.isfinite(bn["avg_drift"])):
            continue  # a side with no run that learned
        n = int(max(np_["n"], bn["n"]))
        seeds = "one seed each: single runs, no interval" if n == 1 else "intervals in the table"
        numbers = "; ".join(f"{QUANTITIES[q]} {np_[q]:.2f} against {bn[q]:.2f}" for q in QUANTITIES)
        text = f"At width {width:g} ({seeds}), NormProp against BatchNorm: {numbers}."
        narrow_gap = math.nan
        if len(base["normprop"]) and len(base["batchnorm"]):
            narrow_gap = base["normprop"].iloc[0]["avg_drift"] - base["batchnorm"].iloc[0]["avg_drift"]
        if math.isfinite(narrow_gap):
            wide_gap = np_["avg_drift"] - bn["avg_drift"]
            same = (wide_gap > 0) == (narrow_gap > 0)
            verdict = "the same sign, so the narrow width does not explain it" if same else "opposite signs"
            text += (f" NormProp's drift minus BatchNorm's is {wide_gap:+.2f} at width {width:g} and {narrow_gap:+.2f} "
                     f"at width {narrow:g}: {verdict}.")  # fmt: skip
        texts.append(text)
    return texts
