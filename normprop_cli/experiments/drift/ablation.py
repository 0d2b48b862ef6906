"""The ablation's numbers, from the CSVs alone: per setting (tables.ablation_settings) the final test
accuracy, the population's drift, |mean| and std, the spread ratio and how far gamma and beta moved;
per ablation, its difference from its main setting with a Welch interval over seeds.

ablation.csv  one row per setting (SETTING_COLUMNS); `normprop run drift` writes it where the grid has
              ablations, the report recomputes the same numbers from the CSVs it reads."""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from normprop_cli import outcomes, statistics
from normprop_cli.engine.runs import sweep_dir
from normprop_cli.experiments import tables as run_tables
from normprop_cli.experiments.drift.tables import ablation_settings, learned_rows

POSITIVE = "> 0"  # an ABLATIONS value that any positive number matches
RATE_SCALE = "rate_scale"  # a grid entry's multiple of the rate it borrows (`rate_of`), read as a key here
PROBE_KEY = "experiment.probe_every_steps"  # in-epoch probes (drift.steps): they change nothing of training
MOMENTS_KEY = "experiment.moments_probe"  # the decomposition probe (drift.moments): nor does it
# What a grid entry's `set` (or its rate_scale) can change beside the method: (key, value) -> (name suffix,
# label, the part of NormProp that the ablation takes away, as the findings name it)
ABLATIONS = {
    ("model.jacobian", "off"): ("no-jacobian", "without the Jacobian factor", "the Jacobian factor f"),
    ("model.jacobian", "init"): ("arxiv", "gamma starting at 1/f (arXiv form)", "dividing by f (ICML form)"),
    ("model.freeze_affine", True): ("frozen-affine", "with gamma and beta frozen", "learnt gamma and beta"),
    ("train.data_norm", "zca"): ("zca", "on ZCA-whitened input", "correlated (not whitened) input"),
    ("model.sigma_oracle_every", POSITIVE): ("sigma-oracle", "with the Sigma-oracle divisor",
                                             "the division by ||W_i||, blind to the input's covariance"),
    ("model.mean_oracle_every", POSITIVE): ("mean-oracle", "with the mean oracle",
                                            "the pre-activation mean W_i^T E[x], left to the fixed c2"),
    ("model.center", True): ("centred", "with centred filters",
                             "uncentred filters, whose W_i^T E[x] moves with the filter's sum"),
    (RATE_SCALE, 0.5): ("half-rate", "at half its swept rate", "the swept rate (halved here)"),
    (RATE_SCALE, 2.0): ("double-rate", "at twice its swept rate", "the swept rate (doubled here)"),
}  # fmt: skip
QUANTITIES = {"avg_drift": "average drift", "avg_abs_mean": "average |mean|", "avg_std": "average std"}
# compared beside QUANTITIES (comparisons), but no part of which ablations account for the drift
MORE = {"ratio": "spread ratio", "final_test_acc": "final test accuracy (%)"}
SETTING_COLUMNS = [
    "setting", "method", "width", "label", "lr", "n", "diverged", "final_test_acc", "acc_low", "acc_high",
    *[f"{q}{s}" for q in QUANTITIES for s in ("", "_low", "_high")], "ratio", "ratio_low", "ratio_high",
    "gamma_change", "beta_change",
]  # fmt: skip
COMPARISON_COLUMNS = ["setting", "reference", "quantity", "value", "reference_value", "diff", "low", "high",
                      "reading"]  # fmt: skip


def matches(found: object, value: object) -> bool:
    """Does a setting's value `found` match an ABLATIONS value (POSITIVE: any number above 0)?"""
    if value == POSITIVE:
        return isinstance(found, int | float) and not isinstance(found, bool) and found > 0
    return found == value


def setting_kind(get: Callable[[str], object]) -> str:
    """A run's kind from its settings (`get(dotted key)`): the method, then each ablation's suffix,
    e.g. 'normprop-no-jacobian': lr_sweep.csv's `method`, so that each ablation has its own colour."""
    parts = [str(get("model.norm"))]
    parts += [suffix for (key, value), (suffix, _, _) in ABLATIONS.items() if matches(get(key), value)]
    return "-".join(parts)


def kind_label(kind: str) -> str:
    """'NormProp without the Jacobian factor' for 'normprop-no-jacobian'."""
    parts, stripped = [], True
    while stripped:  # suffixes in any order (setting_kind joins them in ABLATIONS' order)
        stripped = False
        for suffix, label, _ in ABLATIONS.values():
            if kind.endswith(f"-{suffix}"):
                kind, stripped = kind.removesuffix(f"-{suffix}"), True
                parts.insert(0, label)
    return " ".join([run_tables.method_label(kind), ", ".join(parts)]).strip()


def entry(cfg: DictConfig, setting: str):
    return next((e for e in cfg.get("grid") or [] if e.id == setting), None)


def entry_get(cfg: DictConfig, setting: str) -> Callable[[str], object] | None:
    found = entry(cfg, setting)
    if found is None:
        return None
    given = dict(found.get("set") or {})
    if found.get(RATE_SCALE) is not None:
        given[RATE_SCALE] = float(found[RATE_SCALE])
    return lambda key: given[key] if key in given else OmegaConf.select(cfg, key, default=None)


def is_reference(cfg: DictConfig, setting: str) -> bool:
    """A setting that changes nothing ABLATIONS names but adds in-epoch or decomposition probes (e.g. `normprop-steps`):
    its main setting again, so that the in-epoch rows have a reference; no ablation."""
    get = entry_get(cfg, setting)
    if get is None or not (matches(get(PROBE_KEY), POSITIVE) or get(MOMENTS_KEY) is True):
        return False
    return not any(matches(get(key), value) for key, value in ABLATIONS)


def label(cfg: DictConfig, setting: str, method: str) -> str:
    """A setting's name in the report: its kind's label from the grid, or the method and the setting's id."""
    get = entry_get(cfg, setting)
    if get and is_reference(cfg, setting):
        probes = "decomposition probe" if get(MOMENTS_KEY) is True else "in-epoch probes"
        return f"{kind_label(setting_kind(get))} ({probes})"
    return kind_label(setting_kind(get)) if get else f"{run_tables.method_label(method)} ({setting})"


def cause(cfg: DictConfig, setting: str) -> str:
    """What the ablation takes away, from its grid entry: 'the Jacobian factor f'; else its id."""
    get = entry_get(cfg, setting)
    found = [part for (key, value), (_, _, part) in ABLATIONS.items() if get and matches(get(key), value)]
    return " and ".join(found) if found else f"what {setting} changes"


def rate_scale(cfg: DictConfig, setting: str) -> float | None:
    """The setting's rate_scale (its rate as a multiple of the setting it borrows it from), or None."""
    found = entry(cfg, setting)
    return float(found[RATE_SCALE]) if found is not None and found.get(RATE_SCALE) is not None else None


def reading(diff: float, low: float, high: float) -> str:
    """'reduces' / 'increases' where the interval excludes 0, else 'cannot be told apart'."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return "no interval"
    return "reduces" if high < 0 else "increases" if low > 0 else "cannot be told apart"


def per_seed(table: pd.DataFrame, setting: str, column: str) -> pd.Series:
    """Each seed's mean over layers of `column` at the setting's last epoch."""
    g = table[table["setting"] == setting] if len(table) else table
    if not len(g) or column not in g:
        return pd.Series(dtype=float)
    g = g[g["epoch"] == g["epoch"].max()]
    return g.groupby("seed")[column].mean()


def read_optional(cfg: DictConfig, name: str) -> pd.DataFrame:
    path = sweep_dir(cfg) / f"{name}.csv"
    return pd.read_csv(path) if path.exists() and path.stat().st_size > 1 else pd.DataFrame()


def rates(cfg: DictConfig) -> dict[str, float]:
    """Each setting's rate: the one its validation sweep chose (lr_sweep.csv), else (not swept: no sweep,
    or a `rate_of` setting) its first epoch's."""
    out, sweep, epochs = {}, read_optional(cfg, "lr_sweep"), read_optional(cfg, "epochs")
    if len(epochs) and "lr" in epochs:
        out = epochs.sort_values("epoch", kind="stable").drop_duplicates("setting").set_index("setting")["lr"].to_dict()
    if len(sweep):
        out |= sweep[sweep["chosen"].astype(bool)].drop_duplicates("setting").set_index("setting")["lr"].to_dict()
    return out


def tables(cfg: DictConfig) -> dict[str, pd.DataFrame]:
    """summary, population, spread and affine (empty where missing), the runs that learned and did not diverge."""
    summary = run_tables.read(cfg, "summary")
    out = {"summary": summary}
    for name in ("population", "spread", "affine"):
        out[name] = learned_rows(cfg, read_optional(cfg, name))
    return out


def setting_table(cfg: DictConfig, t: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    """One row per setting (SETTING_COLUMNS), in the summary's order: accuracy with its logit-scale 95%
    interval, the population's quantities (mean over layers 2-9 at the last epoch) with t intervals over
    seeds, the mean spread ratio over layers 1-9, gamma's and beta's RMS change (mean over layers)."""
    t = t or tables(cfg)
    summary, population, spread, affine = t["summary"], t["population"], t["spread"], t["affine"]
    lr = rates(cfg)
    rows = []
    for setting, g in summary.groupby("setting", sort=False):
        kept = run_tables.kept(g)
        kept = kept[outcomes.learned_flags(kept).eq(True)] if "learned" in kept else kept
        method, width = g["method"].iloc[0], float(g["width"].iloc[0]) if "width" in g else math.nan
        acc = statistics.proportion_ci(kept["final_test_acc"]) if "final_test_acc" in kept else statistics.mean_ci([])
        row = {"setting": setting, "method": method, "width": width, "label": label(cfg, setting, method),
               "lr": lr.get(setting, math.nan), "n": len(kept), "diverged": int(outcomes.diverged(g).sum()),
               "final_test_acc": acc["mean"], "acc_low": acc["ci_low"], "acc_high": acc["ci_high"]}  # fmt: skip
        for q in QUANTITIES:
            ci = statistics.mean_ci(per_seed(population, setting, q))
            row |= {q: ci["mean"], f"{q}_low": ci["ci_low"], f"{q}_high": ci["ci_high"]}
        ratio = statistics.mean_ci(per_seed(spread, setting, "ratio"))
        row |= {"ratio": ratio["mean"], "ratio_low": ratio["ci_low"], "ratio_high": ratio["ci_high"]}
        row["gamma_change"] = per_seed(affine, setting, "gamma_change").mean()
        row["beta_change"] = per_seed(affine, setting, "beta_change").mean()
        rows.append(row)
    return pd.DataFrame(rows, columns=SETTING_COLUMNS)


def accuracy_per_seed(summary: pd.DataFrame, setting: str) -> pd.Series:
    """Each seed's final test accuracy, the runs that learned and did not diverge (setting_table's)."""
    g = summary[summary["setting"] == setting] if len(summary) else summary
    if not len(g) or "final_test_acc" not in g:
        return pd.Series(dtype=float)
    kept = run_tables.kept(g)
    kept = kept[outcomes.learned_flags(kept).eq(True)] if "learned" in kept else kept
    return kept.set_index("seed")["final_test_acc"]


def seeds_of(t: dict[str, pd.DataFrame], setting: str, quantity: str) -> pd.Series:
    """A quantity per seed: the population's and the ratio at the last epoch, or the final test accuracy."""
    if quantity == "final_test_acc":
        return accuracy_per_seed(t["summary"], setting)
    return per_seed(t["spread"] if quantity == "ratio" else t["population"], setting, quantity)


def comparisons(cfg: DictConfig, t: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    """Per ablation and quantity (QUANTITIES, then MORE): the ablation's value minus its main setting's,
    Welch 95% interval over seeds, and its reading (COMPARISON_COLUMNS). Reference settings (is_reference)
    are no ablations and have no rows."""
    t = t or tables(cfg)
    rows = []
    for setting, reference in ablation_settings(t["summary"]).items():
        if is_reference(cfg, setting):
            continue
        for q in [*QUANTITIES, *MORE]:
            a, b = seeds_of(t, setting, q), seeds_of(t, reference, q)
            diff, low, high, _ = statistics.welch(a, b)
            rows.append({"setting": setting, "reference": reference, "quantity": q, "value": a.mean(),
                         "reference_value": b.mean(), "diff": diff, "low": low, "high": high,
                         "reading": reading(diff, low, high)})  # fmt: skip
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def accounting(comparison: pd.DataFrame) -> pd.DataFrame:
    """The ablations whose average drift is lower than their main setting's with an interval that
    excludes 0, the largest reduction first: those that account for the drift."""
    drift = comparison[comparison["quantity"] == "avg_drift"] if len(comparison) else comparison
    if not len(drift):
        return drift
    return drift[drift["reading"] == "reduces"].sort_values("diff", kind="stable")


def gains(affine: pd.DataFrame, setting: str) -> pd.DataFrame:
    """Per layer: the mean over units of gamma / f at the first and the last epoch (mean over seeds),
    columns start and end; empty where the setting has no gain (not NormProp) or no affine rows."""
    g = affine[affine["setting"] == setting] if len(affine) else affine
    if not len(g) or g["gain_mean"].isna().all():
        return pd.DataFrame(columns=["start", "end"])
    first, last = g["epoch"].min(), g["epoch"].max()
    at = lambda e: g[g["epoch"] == e].groupby("layer")["gain_mean"].mean()  # noqa: E731
    return pd.DataFrame({"start": at(first), "end": at(last)})
