"""The ablation's headlines and paragraphs, every number read from the CSVs (ablation.py): which part of
NormProp the drift comes from, how far gamma and beta moved, and the width-1.0 pair. `ablation_facts`
and its helpers compute what the paragraphs state; the words are templates/drift_ablation*.md.j2."""

from __future__ import annotations

import math

import pandas as pd
from omegaconf import DictConfig

from normprop_cli import prose
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
    facts = ablation_facts(cfg, t, s, c)
    texts = prose.render("drift_ablation", facts)
    texts.append(rate_sentence(cfg, t, by, c))
    texts += oracle_paragraphs(cfg, t, by, c)
    texts.append(steps_paragraph(cfg, t, by))
    texts += prose.render("drift_ablation_affine", facts)
    texts += mean_paragraphs(cfg)
    return [x for x in texts if x]


def ablation_facts(cfg: DictConfig, t: dict | None = None, s: pd.DataFrame | None = None,
                   c: pd.DataFrame | None = None) -> dict:  # fmt: skip
    """Everything the ablation's own paragraphs state: the setup (epochs, rate, probes), the table of
    every setting, each ablation's comparisons, the closing's lists, gamma and beta, the width pairs.
    `t`, `s` and `c` (tables, setting_table, comparisons) are computed where not given."""
    t = t or tables(cfg)
    s = setting_table(cfg, t) if s is None else s
    c = comparisons(cfg, t) if c is None else c
    by = s.set_index("setting")
    population = t["population"]
    taken = c[c["setting"].map(lambda k: rate_scale(cfg, k) is None)]  # the rate's settings: rate_sentence
    return {
        "dataset": cfg.dataset.name,
        "preset": cfg.preset.name,
        "epochs": int(population["epoch"].max()) if len(population) else int(cfg.train.epochs),
        "swept": cfg.experiment.get("lr_sweep") is not None,
        "probe_set": run_tables.probe_set(cfg),
        "table": _markdown(s),
        "ablations": [_ablation(cfg, by, g) for _, g in c.groupby("setting", sort=False)],
        "closing": _closing(cfg, by, taken[taken["quantity"].isin(list(QUANTITIES))], s),
        "oracle_note": oracle_note(cfg, by, c),
        "affine": _affine(t["affine"], s, set(ablation_settings(t["summary"]).values())),
        "widths": _width_pairs(s),
    }


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
    """A difference and its interval, to 3 decimals where it is below 0.1 in size, else 2."""
    return format_ci(r["diff"], r["low"], r["high"], 3 if abs(r["diff"]) < 0.1 else 2)


def _compared(r, name: str) -> dict:
    """One comparison row: the ablation's value, its main setting's, the difference and its reading."""
    return {"name": name, "value": r["value"], "reference_value": r["reference_value"], "diff": _diff(r),
            "reading": r["reading"]}  # fmt: skip


def _ablation(cfg: DictConfig, by: pd.DataFrame, g: pd.DataFrame) -> dict:
    """An ablation against its main setting: the drift (with both seed counts and rates), then |mean|,
    std and MORE where measured."""
    setting, reference = g["setting"].iloc[0], g["reference"].iloc[0]
    a, ref = by.loc[setting], by.loc[reference]
    rows = g.set_index("quantity")
    names = QUANTITIES | MORE
    return {
        "label": a["label"],
        "reference_label": ref["label"],
        "rates": [a["lr"], ref["lr"]] if math.isfinite(a["lr"]) and math.isfinite(ref["lr"]) else [],
        "cause": cause(cfg, setting),
        "seeds": [int(a["n"]), int(ref["n"])],
        "drift": _compared(rows.loc["avg_drift"], names["avg_drift"]),
        "others": [
            _compared(rows.loc[q], names[q])
            for q in ("avg_abs_mean", "avg_std", *MORE)
            if q in rows.index and math.isfinite(rows.loc[q, "value"])
        ],
    }


def _closing(cfg: DictConfig, by: pd.DataFrame, c: pd.DataFrame, s: pd.DataFrame) -> dict:
    """The ablations that account for the drift (named, with their share of NormProp's excess over
    BatchNorm's), those ruled out (raised), those not shown either way (same), and the spread ratios
    (NormProp's only where every setting's is above 1)."""
    named = accounting(c)
    drift = c[c["quantity"] == "avg_drift"]
    rest = drift[~drift["setting"].isin(named["setting"])]
    # Drift is in each unit's initial std, |mean| and std in the N(0, 1) units the paper aims at: an ablation
    # that reduces none of the three and increases one makes the inputs leave N(0, 1) further without it.
    readings = c.groupby("setting")["reading"].agg(set)
    worse = {k for k, r in readings.items() if "increases" in r and "reduces" not in r}
    gap = _gap_to_batchnorm(by, s, named["reference"].iloc[0]) if len(named) else math.nan
    up = rest[rest["setting"].isin(worse)]
    same = rest[~rest["setting"].isin(worse) & rest["reading"].isin(["cannot be told apart", "no interval"])]
    ratios = s[s["setting"].isin(list(ablation_settings(s))) | (s["method"] == "normprop")]["ratio"].dropna()
    bn = s[s["method"] == "batchnorm"]["ratio"].dropna()
    return {
        "named": [
            {
                "cause": cause(cfg, r["setting"]),
                "label": by.loc[r["setting"], "label"],
                "diff": _diff(r),
                "share": _share(r, gap),
            }
            for _, r in named.iterrows()
        ],
        "raised": [
            {
                "cause": cause(cfg, k),
                "increases": [
                    {"name": QUANTITIES[q["quantity"]], "diff": _diff(q)}
                    for _, q in g[g["reading"] == "increases"].iterrows()
                ],
            }
            for k, g in c[c["setting"].isin(up["setting"])].groupby("setting", sort=False)
        ],
        "same": [{"cause": cause(cfg, r["setting"]), "diff": _diff(r)} for _, r in same.iterrows()],
        # the closing sentence says every NormProp setting's filters line up: only where each ratio is above 1
        "ratios": [ratios.min(), ratios.max()] if not len(named) and len(ratios) and ratios.min() > 1 else [],
        "batchnorm_ratios": [bn.min(), bn.max()] if len(bn) else [],
    }


def _gap_to_batchnorm(by: pd.DataFrame, s: pd.DataFrame, reference: str) -> float:
    """The main setting's final average drift minus BatchNorm's at the same width (NaN without one)."""
    ref = by.loc[reference]
    bn = s[(s["method"] == "batchnorm") & (s["width"] == ref["width"])]
    return float(ref["avg_drift"] - bn["avg_drift"].iloc[0]) if len(bn) and ref["method"] != "batchnorm" else math.nan


def _share(r, gap: float) -> float | None:
    """The ablation's reduction as a percentage of the main setting's excess drift over BatchNorm's."""
    return 100.0 * -r["diff"] / gap if math.isfinite(gap) and gap > 0 else None


def _affine(affine: pd.DataFrame, s: pd.DataFrame, mains: set[str]) -> dict:
    """How far gamma and beta moved per setting (`moved`, the width named above the narrowest); the mean
    gamma / f per layer at the start and the end of each NormProp setting that ablations are compared
    with (`gains`)."""
    if not len(affine):
        return {"moved": [], "gains": []}
    narrow = s["width"].min()
    moved = [{"label": r["label"], "width": r["width"] if r["width"] > narrow else None,
              "gamma": r["gamma_change"], "beta": r["beta_change"]}
             for _, r in s.iterrows() if math.isfinite(r["gamma_change"])]  # fmt: skip
    per = []
    for _, r in s[s["setting"].isin(mains) & (s["method"] == "normprop")].iterrows():
        g = gains(affine, r["setting"])
        if len(g):
            layers = [{"layer": int(k), "start": v["start"], "end": v["end"]} for k, v in g.iterrows()]
            per.append({"label": r["label"], "width": r["width"], "layers": layers})
    return {"moved": moved, "gains": per}


def _width_pairs(s: pd.DataFrame) -> dict:
    """NormProp against BatchNorm at each width above the narrowest (`pairs`), each with the sign of its
    drift gap beside the narrowest width's gap where both exist."""
    narrow = s["width"].min()
    main = s[~s["setting"].isin(list(ablation_settings(s)))]
    pair = lambda w: {m: main[(main["method"] == m) & (main["width"] == w)] for m in ("normprop", "batchnorm")}  # noqa: E731
    base = pair(narrow)
    narrow_gap = math.nan
    if len(base["normprop"]) and len(base["batchnorm"]):
        narrow_gap = base["normprop"].iloc[0]["avg_drift"] - base["batchnorm"].iloc[0]["avg_drift"]
    pairs = []
    for width in sorted(w for w in s["width"].unique() if w > narrow):
        p = pair(width)
        if not (len(p["normprop"]) and len(p["batchnorm"])):
            continue
        np_, bn = p["normprop"].iloc[0], p["batchnorm"].iloc[0]
        if not (math.isfinite(np_["avg_drift"]) and math.isfinite(bn["avg_drift"])):
            continue  # a side with no run that learned
        wide_gap = np_["avg_drift"] - bn["avg_drift"]
        pairs.append(
            {
                "width": width,
                "single": int(max(np_["n"], bn["n"])) == 1,
                "numbers": [{"name": QUANTITIES[q], "normprop": np_[q], "batchnorm": bn[q]} for q in QUANTITIES],
                "gaps": [wide_gap, narrow_gap] if math.isfinite(narrow_gap) else [],
                "same_sign": (wide_gap > 0) == (narrow_gap > 0),
            }
        )
    return {"narrow": narrow, "pairs": pairs}
