"""The normalizers section's tables of facts: every number its sentences state and every choice they
branch on, read from normalizers.csv (tables.read_table), summary.csv, the sweep and the config. The
words are in templates/normalizers*.md.j2 (findings.py renders them)."""

from __future__ import annotations

import math

import pandas as pd
from omegaconf import DictConfig

from normprop_cli import outcomes, prose, statistics
from normprop_cli.experiments import tables as run_tables
from normprop_cli.experiments.normalizers.tables import ACCURACY_DIFFERENCE, POWER, label, table

CI = {"final": ("final_acc", "final_low", "final_high"), "best": ("best_val_acc", "best_val_low", "best_val_high"),
      "diff": ("diff_vs_reference", "diff_low", "diff_high"), "drift": ("drift", "drift_low", "drift_high"),
      "train": ("train_mode_acc", "train_mode_low", "train_mode_high"),
      "eval": ("eval_mode_acc", "eval_mode_low", "eval_mode_high"),
      "gap": ("mode_gap", "mode_gap_low", "mode_gap_high"),
      "train_diff": ("train_mode_diff", "train_mode_diff_low", "train_mode_diff_high")}  # fmt: skip
INIT_SECTION = "4.2"  # the paper's section on initialising the classifier's weights (Glorot)


def ci(row, name: str) -> tuple[float, float, float]:
    """(mean, low, high) of one of the table's intervals (CI), for the templates' `ci` filter."""
    return tuple(float(row[k]) for k in CI[name])


def _finite(value) -> float | None:
    return float(value) if math.isfinite(float(value)) else None


def reference(cfg: DictConfig) -> str:
    """The method every other is compared with (`experiment.reference`)."""
    return cfg.experiment.get("reference", "normprop-icml")


def level(t: pd.DataFrame) -> float:
    """The table's corrected level (diff_level), the nominal one where no difference is tested."""
    return float(t["diff_level"].dropna().iloc[0]) if t["diff_level"].notna().any() else statistics.LEVEL


def nominal() -> dict:
    """The nominal confidence (%) and its alpha, the power of the MDD, the bounds of a difference of
    accuracies: what the section's templates state of how it tests."""
    return {"confidence": 100 * statistics.LEVEL, "alpha": 1 - statistics.LEVEL, "power": POWER,
            "power_pct": 100 * POWER, "bounds": ACCURACY_DIFFERENCE}  # fmt: skip


def constants(cfg: DictConfig) -> dict:
    """`nominal`, chance (%) and the margin above it at or below which a run did not learn."""
    return nominal() | {"chance": run_tables.chance(cfg), "margin": outcomes.LEARNED_MARGIN}


def counts(row) -> str:
    """'(2 did not learn, 1 diverged, left out)' for a row of the table, '' when every run learned."""
    failed, gone = int(row["n"]) - int(row["learned"]), int(row["diverged"])
    return "".join(prose.render("normalizers_counts", {"failed": failed, "gone": gone}))


def modes(row, cfg: DictConfig) -> str:
    """Whether a batch-statistics method learns in each mode: its mean final accuracy in that mode
    against chance + outcomes.LEARNED_MARGIN."""
    bar = run_tables.chance(cfg) + outcomes.LEARNED_MARGIN
    learns = {c: float(row[c]) > bar for c in ("train_mode_acc", "eval_mode_acc")}
    facts = constants(cfg) | {"learns_train": learns["train_mode_acc"], "learns_eval": learns["eval_mode_acc"]}
    return "".join(prose.render("normalizers_modes", facts))


def headline_facts(cfg: DictConfig, t: pd.DataFrame) -> dict:
    """Per batch size its best method and the reference's rank; per batch-statistics method at batch 1
    both modes' accuracies."""
    ref = reference(cfg)
    best = []
    for bs, g in t.groupby("batch_size", sort=True):
        top, own = g.iloc[0], g[g["normalizer"] == ref]
        best.append({"batch": int(bs), "n": int(top["n"]), "method": label(top["normalizer"]),
                     "final": ci(top, "final"), "counts": counts(top), "size": len(g),
                     "ref_rank": int(own["rank"].iloc[0]) if len(own) else None})  # fmt: skip
    both = [{"batch": int(r["batch_size"]), "method": label(r["normalizer"]), "n": int(r["n"]),
             "train": ci(r, "train"), "eval": ci(r, "eval"), "modes": modes(r, cfg)}
            for _, r in t[t["train_mode_acc"].notna()].iterrows()]  # fmt: skip
    return constants(cfg) | {"ref": label(ref), "best": best, "both": both}


def intro_facts(cfg: DictConfig) -> dict:
    """The data set, preset, schedule (per batch size where the experiment sets one: `schedule`, else
    `epochs`) and the worker processes the step times were measured beside."""
    e = cfg.experiment
    schedule = []
    if e.get("epochs"):
        halves = list(e.get("lr_halve_every") or [cfg.train.lr_halve_every] * len(e.batch_sizes))
        schedule = [{"batch": int(b), "epochs": int(n), "halve": int(h)}
                    for b, n, h in zip(e.batch_sizes, e.epochs, halves, strict=True)]  # fmt: skip
    return constants(cfg) | {"dataset": cfg.dataset.name, "preset": cfg.preset.name, "schedule": schedule,
                             "epochs": int(cfg.train.epochs), "jobs": int(cfg.get("jobs") or 1)}  # fmt: skip


def correction_facts(t: pd.DataFrame, ref: str) -> dict:
    """The Bonferroni family of the differences from the reference: its size k, its level, and how it
    splits over batch sizes (`uniform`: as many methods at every batch size)."""
    family = t[t["compared"].astype(bool)]
    per = family.groupby("batch_size").size()
    facts = nominal() | {"ref": ref, "k": len(family),
             "per_batch": [{"batch": int(b), "n": int(n)} for b, n in per.items()],
             "uniform": per.nunique() == 1 and len(per) == t["batch_size"].nunique()}  # fmt: skip
    return facts | {"level": 100 * float(family["diff_level"].iloc[0]) if len(family) else math.nan}


def batch_facts(g: pd.DataFrame, bs: int, cfg: DictConfig, at: float) -> dict:
    """A batch size's ranked rows, each cell's number (`modes`: both modes are measured)."""
    ref = reference(cfg)
    rows = [{"rank": int(r["rank"]), "method": label(r["normalizer"]), "lr": float(r["lr"]),
             "final": ci(r, "final"), "modes": math.isfinite(float(r["train_mode_acc"])), "train": ci(r, "train"),
             "counts": counts(r), "best": ci(r, "best"), "reference": r["normalizer"] == ref, "diff": ci(r, "diff"),
             "reading": r["reading"], "mdd": _finite(r["mdd"]), "drift": ci(r, "drift"),
             "step_ms": float(r["step_ms"])} for _, r in g.iterrows()]  # fmt: skip
    return constants(cfg) | {"batch": bs, "ref": label(ref), "level": 100 * at, "rows": rows}


def finding_facts(g: pd.DataFrame, bs: int, ref: str, reference: str) -> dict:
    """Who beat the reference at a batch size, who is worse, who cannot be told apart, and the range of
    the comparisons' MDDs (None where none has one); `diverged`: every run of the reference diverged."""
    own = g[g["normalizer"] == reference]

    def named(reading: str) -> list[dict]:
        rows = g[g["reading"] == reading]
        return [{"method": label(r["normalizer"]), "diff": ci(r, "diff")} for _, r in rows.iterrows()]

    mdd = None
    if "mdd" in g:
        found = g[pd.to_numeric(g["mdd"], errors="coerce").map(math.isfinite)].sort_values("mdd")
        if len(found):
            low, high = found.iloc[0], found.iloc[-1]
            mdd = {"count": len(found), "low": float(low["mdd"]), "low_method": label(low["normalizer"]),
                   "high": float(high["mdd"]), "high_method": label(high["normalizer"])}  # fmt: skip
    return {"batch": bs, "ref": ref, "diverged": bool(len(own)) and not math.isfinite(float(own["final_acc"].iloc[0])),
            "better": named("better"), "worse": named("worse"), "mdd": mdd, "power_pct": 100 * POWER,
            "same": [label(m) for m in g.loc[g["reading"] == "indistinguishable", "normalizer"]]}  # fmt: skip


def gap_facts(t: pd.DataFrame, cfg: DictConfig) -> dict:
    """The batch-statistics methods at batch 1 in both modes, the paired gap, and their training-mode
    accuracy's difference from the reference (None where not measured)."""
    rows = [{"method": label(r["normalizer"]), "train": ci(r, "train"), "eval": ci(r, "eval"), "gap": ci(r, "gap"),
             "modes": modes(r, cfg),
             "train_diff": ci(r, "train_diff") if math.isfinite(float(r.get("train_mode_diff", math.nan))) else None}
            for _, r in t[t["mode_gap"].notna()].iterrows()]  # fmt: skip
    return constants(cfg) | {"rows": rows, "ref": label(reference(cfg)), "level": 100 * level(t)}


def seeds_facts(cfg: DictConfig, t: pd.DataFrame) -> dict | None:
    """Where `experiment.extra_seeds` gives settings more seeds: which, when their runs trained beside
    the first seeds' (the runs' manifests; None where unrecorded), and every comparison at their batch
    sizes on the first seeds alone and on all seeds, with the readings that moved; None where none."""
    from normprop_cli.engine.runs import read_manifest, run_dir

    extra = {str(k): int(v) for k, v in (cfg.experiment.get("extra_seeds") or {}).items() if int(v) > 0}
    if not extra:
        return None
    summary = run_tables.read(cfg, "summary")
    if "seed" not in summary or not summary["setting"].isin(list(extra)).any():
        return None
    n, ref = int(cfg.seeds), reference(cfg)
    first = summary["seed"] < int(cfg.seed) + n
    before = table(cfg, summary[first])

    def when(runs: pd.DataFrame, key: str) -> list[str]:
        found = [(read_manifest(run_dir(cfg, str(r))) or {}).get(key) for r in runs["run"]]
        return sorted(str(v) for v in found if v)

    stamp = lambda s: s[:16].replace("T", " ")  # noqa: E731  (ISO 8601 in UTC, to the minute)
    started, finished = when(summary[~first], "started"), when(summary[first], "finished")
    timing = None
    if started and finished:
        timing = {"after": started[0] > finished[-1], "started": stamp(started[0]), "finished": stamp(finished[-1])}
    setting = lambda s, col: summary.loc[summary["setting"] == s, col].iloc[0]  # noqa: E731
    named = [{"method": label(str(setting(s, "normalizer"))), "batch": int(setting(s, "batch_size")), "added": k}
             for s, k in extra.items() if (summary["setting"] == s).any()]  # fmt: skip
    sizes = sorted({int(b) for b in summary.loc[summary["setting"].isin(list(extra)), "batch_size"]})
    rows = []
    for bs in sizes:
        then = before[(before["batch_size"] == bs) & (before["normalizer"] != ref)]
        now = t[(t["batch_size"] == bs)].set_index("normalizer")
        for _, r in then.iterrows():
            if r["normalizer"] in now.index:
                m = now.loc[r["normalizer"]]
                rows.append({"batch": bs, "method": label(r["normalizer"]), "n_first": int(r["n"]),
                             "n_all": int(m["n"]), "before": ci(r, "diff"), "was": r["reading"],
                             "p": float(r["p_value"]), "after": ci(m, "diff"), "now": m["reading"]})  # fmt: skip
    return {"named": named, "n": n, "timing": timing, "sizes": sizes, "ref": label(ref), "rows": rows,
            "moved": [r for r in rows if r["was"] != r["now"]]}  # fmt: skip


def training_facts(cfg: DictConfig) -> dict:
    """How every method trains, as the config has it, one part per setting that applies."""
    from normprop_cli.nn.methods import METHODS

    t, model, methods = cfg.train, cfg.model, list(cfg.experiment.methods)
    parts = []
    if model.get("classifier", "own") == "plain":
        own = "normprop-icml-own-classifier" in methods
        parts.append({"kind": "classifier", "section": INIT_SECTION,
                      "own": label("normprop-icml-own-classifier") if own else None})  # fmt: skip
    if t.get("decay", "all") == "weights":
        parts.append({"kind": "decay", "weight_decay": float(t.weight_decay)})
    renorm = {k: v for k, v in dict(model.get("renorm") or {}).items() if v is not None}
    if "batchrenorm" in methods and "warmup_epochs" in renorm:
        parts.append({"kind": "renorm"} | renorm)
    parts += [{"kind": "agc", "method": label(m), "factor": METHODS[m].settings["train.agc"]}
              for m in methods if m in METHODS and "train.agc" in METHODS[m].settings]  # fmt: skip
    return {"parts": parts}


def edge_facts(cfg: DictConfig) -> dict:
    """The chosen rates at an edge of their sweep (lr_sweep.edge_choices) and the settings whose every
    rate scored near chance on validation (`flat`); `swept`: the steps policy chose the rates."""
    from normprop_cli.engine import sweep_dir
    from normprop_cli.experiments.lr_sweep import edge_choices, stepped

    if not stepped(cfg) or not (sweep_dir(cfg) / "lr_sweep.csv").exists():
        return {"swept": False}
    sweep = run_tables.read(cfg, "lr_sweep")
    edges = [{"method": label(r["method"]), "batch": int(r["batch_size"]), "lr": float(r["lr"]), "side": r["side"],
              "rates": r["rates"]} for _, r in edge_choices(sweep).iterrows()]  # fmt: skip
    flat = []
    if "score" in sweep:
        best = sweep.groupby("setting").agg(method=("method", "first"), batch_size=("batch_size", "first"),
                                            top=("score", "max"))  # fmt: skip
        flat = [
            {"method": label(r["method"]), "batch": int(r["batch_size"])}
            for _, r in best[best["top"] <= run_tables.chance(cfg) + outcomes.LEARNED_MARGIN].iterrows()
        ]
    return {"swept": True, "edges": edges, "extend": int(cfg.experiment.lr_sweep.extend), "flat": flat,
            "margin": outcomes.LEARNED_MARGIN}  # fmt: skip


def unfinished_facts(cfg: DictConfig) -> dict:
    """The rows of summary.csv whose runs are not finished in runs/, or finished since with other
    numbers (retrained): how many of how many, and their methods."""
    from normprop_cli.engine.runs import read_manifest, run_dir

    summary = run_tables.read(cfg, "summary")
    if not len(summary) or "run" not in summary:
        return {"stale": 0}

    def stale(row) -> bool:
        path = run_dir(cfg, str(row["run"]))
        if (read_manifest(path) or {}).get("status") != "complete":
            return True
        metrics = pd.read_csv(path / "metrics.csv") if (path / "metrics.csv").exists() else pd.DataFrame()
        final = float(metrics["test_acc"].iloc[-1]) if len(metrics) else math.nan
        return "final_test_acc" in row and not math.isclose(final, float(row["final_test_acc"]), abs_tol=1e-9)

    gone = [r["run"] for _, r in summary.iterrows() if stale(r)]
    methods = list(dict.fromkeys(label(str(m)) for m in summary.loc[summary["run"].isin(gone), "normalizer"]))
    return {"stale": len(gone), "rows": len(summary), "methods": methods, "preset": cfg.preset.name}
