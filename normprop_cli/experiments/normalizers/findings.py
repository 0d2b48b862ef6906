"""The report's headlines and paragraphs for the normalizers experiment, every number read from
normalizers.csv (tables.read_table)."""

from __future__ import annotations

import math

import pandas as pd
from omegaconf import DictConfig

from normprop_cli import outcomes, statistics
from normprop_cli.experiments import tables as run_tables
from normprop_cli.experiments.normalizers.tables import POWER, label, read_table, table
from normprop_cli.statistics import markdown


def headlines(cfg: DictConfig) -> list[dict]:
    """Per batch size: the best method, and where the reference (NormProp) ranks; per batch-statistics
    method at batch 1, its final accuracy in training and in evaluation mode; the runs that did not
    learn in any mode they are scored in."""
    t = read_table(cfg)
    reference = cfg.experiment.get("reference", "normprop-icml")
    rows = []
    for bs, g in t.groupby("batch_size", sort=True):
        top = g.iloc[0]
        ref = g[g["normalizer"] == reference]
        rank = f"; {label(reference)} ranks {int(ref['rank'].iloc[0])} of {len(g)}" if len(ref) else ""
        rows.append({"quantity": f"batch {int(bs)}: best final test accuracy (%) [95% CI, n = {int(top['n'])}]",
                     "reproduced": f"{label(top['normalizer'])} {_ci(top, 'final')}{_counts(top)}{rank}",
                     "paper": ""})  # fmt: skip
    for _, r in t[t["train_mode_acc"].notna()].iterrows():
        rows.append({"quantity": f"batch {int(r['batch_size'])}, {label(r['normalizer'])}: final test accuracy (%) "
                                 f"[95% CI, n = {int(r['n'])}] in training mode (each image normalised by its own "
                                 "statistics) / in evaluation mode (running estimates)",
                     "reproduced": f"{_ci(r, 'train')} / {_ci(r, 'eval')}: {_modes(r, cfg)}", "paper": ""})  # fmt: skip
    return rows + run_tables.not_learned(cfg)


def _ci(row, prefix: str) -> str:
    key = {"final": ("final_acc", "final_low", "final_high"), "best": ("best_val_acc", "best_val_low", "best_val_high"),
           "diff": ("diff_vs_reference", "diff_low", "diff_high"), "drift": ("drift", "drift_low", "drift_high"),
           "train": ("train_mode_acc", "train_mode_low", "train_mode_high"),
           "eval": ("eval_mode_acc", "eval_mode_low", "eval_mode_high"),
           "gap": ("mode_gap", "mode_gap_low", "mode_gap_high")}[prefix]  # fmt: skip
    return statistics.format_ci(*(float(row[k]) for k in key))


def _counts(row) -> str:
    """' (2 did not learn, 1 diverged)' for a row of the table, '' when every run learned."""
    failed, gone = int(row["n"]) - int(row["learned"]), int(row["diverged"])
    parts = [f"{failed} did not learn"] * bool(failed) + [f"{gone} diverged, left out"] * bool(gone)
    return f" ({', '.join(parts)})" if parts else ""


def _modes(row, cfg: DictConfig) -> str:
    """'learns in training mode and fails in evaluation mode (mean final accuracy at or below chance + 5
    points; chance is 10%)': each mode's mean final accuracy against chance + outcomes.LEARNED_MARGIN."""
    bar = run_tables.chance(cfg) + outcomes.LEARNED_MARGIN
    learns = {run_tables.MODES[c]: float(row[c]) > bar for c in ("train_mode_acc", "eval_mode_acc")}
    chance = f"chance is {run_tables.chance(cfg):g}%"
    if all(learns.values()):
        return f"learns in both modes (mean final accuracy above chance + {outcomes.LEARNED_MARGIN:g} points; {chance})"
    said = " and ".join(f"{'learns' if ok else 'fails'} in {mode}" for mode, ok in learns.items())
    return f"{said} (fails: mean final accuracy {outcomes.NEAR_CHANCE}; {chance})"


def paragraphs(cfg: DictConfig) -> list[str]:
    """A ranked table per batch size, then which methods beat the reference where, with intervals;
    the batch-statistics methods at batch 1 in both modes."""
    t = read_table(cfg)
    reference = cfg.experiment.get("reference", "normprop-icml")
    ref = label(reference)
    level = float(t["diff_level"].dropna().iloc[0]) if t["diff_level"].notna().any() else statistics.LEVEL
    out = [
        f"**Normalisers ({cfg.dataset.name}, {cfg.preset.name} preset, {schedule(cfg)}).** Each "
        "method at each batch size trains at the rate its validation sweep chose (`lr_sweep.csv`, "
        "`lr_sweep.png`). Accuracy intervals are 95% Student-t intervals of the mean over seeds, formed on the "
        "logit scale and mapped back (they stay within [0, 100]); runs that diverged are left out of every mean "
        f"and counted beside it. {correction(t, ref)} `normalizers.png` draws every difference with its "
        "interval, per batch size, methods ranked by the difference. Batch sizes differ in their SGD updates (a "
        "batch of 50 takes 1/50 of the updates of a batch of 1 per epoch): compare methods within a batch size, "
        f"not across. Step times come from the runs ({int(cfg.get('jobs') or 1)} one-thread worker processes side "
        "by side), comparable within this table only; `normprop bench` times the methods in turn in one process.",
        training_details(cfg),
        edges(cfg),
        unfinished(cfg),
    ]
    out = [part for part in out if part]  # no empty paragraph where every run is finished
    for bs, g in t.groupby("batch_size", sort=True):
        head = ["rank", "method", "lr", "final acc (%) [95% CI]", "best-val acc (%)",
                f"vs {ref} (pp) [{100 * level:.2f}% Welch CI]", "MDD (pp)", "drift", "ms/step"]  # fmt: skip
        rows = []
        for _, r in g.iterrows():
            vs = "reference" if r["normalizer"] == reference else f"{_ci(r, 'diff')} {r['reading']}"
            final = _ci(r, "final")
            if math.isfinite(float(r["train_mode_acc"])):
                final += f" in evaluation mode; {_ci(r, 'train')} in training mode"
            rows.append([int(r["rank"]), label(r["normalizer"]), f"{r['lr']:g}", f"{final}{_counts(r)}",
                         _ci(r, "best"), vs, _pp(r["mdd"]), _ci(r, "drift"), f"{r['step_ms']:.1f}"])  # fmt: skip
        out.append(f"*Batch size {int(bs)}:*\n\n" + "\n".join(markdown(rows, head, rule="---")))
        out.append(_finding(g, int(bs), ref, reference))
    out.append(seeds_added(cfg, t))
    out = [part for part in out if part]
    gaps = t[t["mode_gap"].notna()]
    if len(gaps):
        parts = [
            f"{label(r['normalizer'])} {_ci(r, 'train')} in training mode and {_ci(r, 'eval')} in evaluation mode, "
            f"a difference of {_ci(r, 'gap')} pp: it {_modes(r, cfg)}{_train_vs(r, ref, level)}"
            for _, r in gaps.iterrows()
        ]
        out.append(
            "At batch 1 the batch-statistics methods normalise each training image by its own spatial statistics. "
            "Tested the same way (training mode, one image at a time) and with their running estimates "
            f"(evaluation mode, the mode of the table above), their final test accuracy (%) is: {'; '.join(parts)} "
            "(accuracies and their difference at 95%; the difference is training minus evaluation mode, a t "
            "interval of the seeds' paired differences)."
        )
    return out


def seeds_added(cfg: DictConfig, t: pd.DataFrame) -> str:
    """Where `experiment.extra_seeds` gives some settings more seeds than the preset's `seeds`: when their
    runs trained beside the first seeds' (from the runs' manifests), and every comparison at their batch
    sizes on the first seeds alone beside all seeds, so that a reading the added seeds moved shows as
    such; '' where no setting has added seeds."""
    from normprop_cli.engine.runs import read_manifest, run_dir

    extra = {str(k): int(v) for k, v in (cfg.experiment.get("extra_seeds") or {}).items() if int(v) > 0}
    if not extra:
        return ""
    summary = run_tables.read(cfg, "summary")
    if "seed" not in summary or not summary["setting"].isin(list(extra)).any():
        return ""
    n, reference = int(cfg.seeds), cfg.experiment.get("reference", "normprop-icml")
    first = summary["seed"] < int(cfg.seed) + n
    before = table(cfg, summary[first])

    def when(runs: pd.DataFrame, key: str) -> list[str]:
        found = [(read_manifest(run_dir(cfg, str(r))) or {}).get(key) for r in runs["run"]]
        return sorted(str(v) for v in found if v)

    added_start, first_end = when(summary[~first], "started"), when(summary[first], "finished")
    stamp = lambda s: s[:16].replace("T", " ") + " UTC"  # noqa: E731  (ISO 8601 in UTC: '2026-11-25 19:23 UTC')
    if added_start and first_end:
        order = "after" if added_start[0] > first_end[-1] else "while some of"
        timing = (f"Their runs trained {order} the first {n} seeds of every setting had finished (the added "
                  f"seeds' first run started {stamp(added_start[0])}; the last of the first {n} seeds' finished "
                  f"{stamp(first_end[-1])}).")  # fmt: skip
    else:
        timing = "The runs' manifests do not record when they trained."
    named = ", ".join(f"{label(str(summary.loc[summary['setting'] == s, 'normalizer'].iloc[0]))} at batch "
                      f"{int(summary.loc[summary['setting'] == s, 'batch_size'].iloc[0])} (+{k})"
                      for s, k in extra.items() if (summary["setting"] == s).any())  # fmt: skip
    sizes = sorted({int(b) for b in summary.loc[summary["setting"].isin(list(extra)), "batch_size"]})
    head = ["batch", "method", "seeds", f"vs {label(reference)}, first {n} seeds (pp)", "p (uncorrected)",
            "vs it, all seeds (pp)", "reading"]  # fmt: skip
    rows, moved = [], []
    for bs in sizes:
        then = before[(before["batch_size"] == bs) & (before["normalizer"] != reference)]
        now = t[(t["batch_size"] == bs)].set_index("normalizer")
        for _, r in then.iterrows():
            m = r["normalizer"]
            if m not in now.index:
                continue
            a, b = r["reading"], now.loc[m, "reading"]
            change = f"{a} -> {b}" if a != b else a
            if a != b:
                moved.append(f"{label(m)} at batch {bs} ({change})")
            rows.append([str(bs), label(m), f"{int(r['n'])} / {int(now.loc[m, 'n'])}", f"{_ci(r, 'diff')} {a}",
                         f"{float(r['p_value']):.3f}", f"{_ci(now.loc[m], 'diff')} {b}", change])  # fmt: skip
    changed = (
        f"The added seeds change {len(moved)} reading{'s' * (len(moved) != 1)}: {'; '.join(moved)}. A reading that "
        f"changed only with seeds added after the first {n} seeds' results rests on a sample size chosen after "
        f"seeing them: read it beside its {n}-seed reading."
        if moved
        else "No reading changes with the added seeds."
    )
    return (
        f"*Seeds added after results.* The preset gives {named} more seeds than the {n} of every other setting "
        f"(`experiment.extra_seeds`), where more seeds could settle a comparison that the first {n} left open. "
        f"{timing} Each comparison at {'batch ' if len(sizes) == 1 else 'batches '}"
        f"{', '.join(map(str, sizes))} on the first {n} seeds alone (each method's and {label(reference)}'s) beside "
        f"all seeds, at the same corrected level:\n\n" + "\n".join(markdown(rows, head, rule="---")) + f"\n\n{changed}"
    )


def correction(t: pd.DataFrame, ref: str) -> str:
    """What the differences from the reference are, as tables.table computes them: the Welch test, the pp
    scale, the Bonferroni correction over the comparisons that `compared` marks, and the MDD."""
    family = t[t["compared"].astype(bool)]
    k = len(family)
    if not k:
        return (f"No method has 2 runs or more beside 2 or more of {ref}'s at any batch size that did not "
                "diverge: no difference from it is tested.")  # fmt: skip
    level = float(family["diff_level"].iloc[0])
    per = family.groupby("batch_size").size()
    sizes = [int(b) for b in sorted(t["batch_size"].unique())]
    if per.nunique() == 1 and len(per) == len(sizes):
        breakdown = f"{int(per.iloc[0])} methods x {len(per)} batch sizes"
    else:
        breakdown = ", ".join(f"{int(n)} at batch {int(b)}" for b, n in per.items())
    return (
        f"Differences from {ref} are a method's mean final test accuracy minus {ref}'s, in pp (percentage "
        "points of test accuracy, not on the logit scale), each with a two-sided Welch t interval over "
        "independent seeds (unequal variances, Welch's degrees of freedom), Bonferroni-corrected over the "
        f"{k} comparisons with {ref} in the table ({breakdown}): each interval is at level 1 - 0.05/{k} = "
        f"{100 * level:.2f}%, so that all {k} hold together with at least 95% confidence, its ends clipped to "
        "[-100, 100] pp; *better* or *worse* where it excludes 0, else *indistinguishable* (the p-values in "
        "`normalizers.csv` are uncorrected). MDD is each comparison's minimum detectable difference: the "
        f"smallest true difference the two-sided Welch test at that level detects with {100 * POWER:.0f}% power, "
        f"given its seeds, (t(1 - 0.05/(2 x {k})) + t({POWER:g})) x sqrt(s1^2/n1 + s2^2/n2), both t quantiles at "
        "Welch's degrees of freedom."
    )


def _pp(value) -> str:
    return f"{float(value):.2f}" if math.isfinite(float(value)) else ""


def _train_vs(row, ref: str, level: float) -> str:
    """'; in training mode it is -5.00 [-20.00, 10.00] pp from NormProp' (Welch, the table's level)."""
    if not math.isfinite(float(row.get("train_mode_diff", math.nan))):
        return ""
    ci = statistics.format_ci(*(float(row[k]) for k in ("train_mode_diff", "train_mode_diff_low",
                                                            "train_mode_diff_high")))  # fmt: skip
    return (f"; its training-mode accuracy minus {ref}'s final accuracy is {ci} pp (Welch, at the same "
            f"{100 * level:.2f}% level, not one of the comparisons counted above)")  # fmt: skip


def _power(g: pd.DataFrame) -> str:
    """' ... the MDD ranges from 1.20 pp (A) to 9.00 pp (B)' over a batch size's comparisons; '' where none has one."""
    if "mdd" not in g:
        return ""
    found = g[pd.to_numeric(g["mdd"], errors="coerce").map(math.isfinite)].sort_values("mdd")
    if not len(found):
        return ""
    low, high = found.iloc[0], found.iloc[-1]
    span = (f"is {low['mdd']:.2f} pp ({label(low['normalizer'])})" if len(found) == 1 else
            f"ranges from {low['mdd']:.2f} pp ({label(low['normalizer'])}) to {high['mdd']:.2f} pp "
            f"({label(high['normalizer'])})")  # fmt: skip
    return f"the smallest difference each comparison could detect with {100 * POWER:.0f}% power (MDD) {span}"


def _finding(g: pd.DataFrame, bs: int, ref: str, reference: str = "normprop-icml") -> str:
    """One sentence per batch size: who beat the reference, who is worse, who cannot be told apart; where
    every run of the reference diverged, that, and no comparison."""
    own = g[g["normalizer"] == reference]
    if len(own) and not math.isfinite(float(own["final_acc"].iloc[0])):
        return f"At batch {bs}, every run of {ref} diverged: no method is compared with it."

    def names(reading: str) -> str:
        rows = g[g["reading"] == reading]
        return ", ".join(f"{label(r['normalizer'])} ({_ci(r, 'diff')} pp)" for _, r in rows.iterrows())

    better, worse = names("better"), names("worse")
    same = ", ".join(label(m) for m in g.loc[g["reading"] == "indistinguishable", "normalizer"])
    power = _power(g)
    if better:
        first = f"At batch {bs}, {better} beat {ref}" + (f" ({power})" if power else "")
    else:
        first = f"At batch {bs}, no method was shown to beat {ref}" + (
            f", which means only that none was shown to at these seeds, not that none does: {power}" if power else ""
        )
    parts = [first]
    if worse:
        parts.append(f"{worse} {'is' if (g['reading'] == 'worse').sum() == 1 else 'are'} worse")
    if same:
        parts.append(f"{same} cannot be told apart from it at these seeds")
    return "; ".join(parts) + "."


def training_details(cfg: DictConfig) -> str:
    """How every method trains, as the config has it: the classifier, the weight decay, Batch
    Renormalization's schedule and its limits at batch 1, scaled WS's gradient clipping."""
    from normprop_cli.nn.methods import METHODS

    t, model, methods = cfg.train, cfg.model, list(cfg.experiment.methods)
    parts = []
    if model.get("classifier", "own") == "plain":
        own = "normprop-icml-own-classifier" in methods
        parts.append("Every method ends in the same classifier, a plain 1x1 conv with a bias (Glorot weights, "
                     "section 4.2's initialisation) and no normalisation"
                     + (f"; {label('normprop-icml-own-classifier')} is the ablation row with NormProp's own, "
                        "normalised classifier (eq. 11 without activation)" if own else ""))  # fmt: skip
    if t.get("decay", "all") == "weights":
        parts.append(f"weight decay {float(t.weight_decay):g} applies to the kernels alone (the conv filters, as "
                     "each method declares them in the registry), not to gains, biases or other per-unit "
                     "parameters whatever their shape (weight norm's g, scaled WS's gain), for every method (on a "
                     "scale-invariant conv, decay on the normalisation's gain would change the effective learning "
                     "rate)")  # fmt: skip
    renorm = {k: v for k, v in dict(model.get("renorm") or {}).items() if v is not None}
    if "batchrenorm" in methods and "warmup_epochs" in renorm:
        parts.append(
            f"Batch Renorm keeps r = 1, d = 0 (BatchNorm exactly) for the first {renorm['warmup_epochs']:g} "
            f"epoch(s), then relaxes its limits linearly, to rmax = {renorm['rmax']:g} at epoch "
            f"{renorm['rmax_epochs']:g} and dmax = {renorm['dmax']:g} at epoch {renorm['dmax_epochs']:g}, "
            "counted in epochs so that every batch size relaxes them at the same point of training; at "
            "batch 1, r = sigma_B / sigma and d = (mu_B - mu) / sigma take sigma_B and mu_B from the one "
            "image's own spatial statistics per channel, clipped to [1/rmax, rmax] and [-dmax, dmax]"
        )
    agc = {m: METHODS[m].settings["train.agc"] for m in methods if m in METHODS and "train.agc" in METHODS[m].settings}
    for m, factor in agc.items():
        parts.append(f"{label(m)} clips its gradients adaptively (NFNets' unit-wise clipping, factor {factor:g}, "
                     "the classifier exempt)")  # fmt: skip
    return ("*Training.* " + "; ".join(parts) + ".") if parts else ""


def schedule(cfg: DictConfig) -> str:
    """'8 epochs', or per batch size where the experiment sets them: 'batch 1: 2 epochs, ...'."""
    e = cfg.experiment
    if not e.get("epochs"):
        return f"{int(cfg.train.epochs)} epochs"
    halves = list(e.get("lr_halve_every") or [cfg.train.lr_halve_every] * len(e.batch_sizes))
    return ", ".join(f"batch {int(b)}: {int(n)} epochs, rate halved every {int(h)}"
                     for b, n, h in zip(e.batch_sizes, e.epochs, halves, strict=True))  # fmt: skip


def edges(cfg: DictConfig) -> str:
    """Which chosen rates sit at an edge of their sweep, and why (lr_sweep.edge_choices); '' where none does."""
    from normprop_cli.engine import sweep_dir
    from normprop_cli.experiments.lr_sweep import edge_choices, stepped

    if not stepped(cfg) or not (sweep_dir(cfg) / "lr_sweep.csv").exists():
        return ""
    sweep = run_tables.read(cfg, "lr_sweep")
    found, flat = edge_choices(sweep), flat_choices(cfg, sweep)
    if not len(found):
        return "*Rates.* Every chosen rate is interior to the rates its sweep tried (`lr_sweep.csv`)." + flat
    extend = int(cfg.experiment.lr_sweep.extend)
    why = {"only": "the only rate tried", "lowest": "the lowest rate tried", "highest": "the highest rate tried"}
    names = "; ".join(f"{label(r['method'])} at batch {int(r['batch_size'])}: {r['lr']:g}, {why[r['side']]} "
                      f"({r['rates']})" for _, r in found.iterrows())  # fmt: skip
    return (
        f"*Rates at an edge.* {len(found)} chosen rate(s) sit at an edge of the rates tried, after the sweep "
        f"extended that side {extend} time(s) (`experiment.lr_sweep.extend`), so a better rate may lie beyond "
        f"it: {names}.{flat}"
    )


def flat_choices(cfg: DictConfig, sweep: pd.DataFrame) -> str:
    """' X at batch 1 was chosen among scores all within 5 points of chance ...' for the settings whose
    every rate scored near chance on validation (evaluation mode): their choice says nothing; '' if none."""
    if "score" not in sweep:
        return ""
    bar = run_tables.chance(cfg) + outcomes.LEARNED_MARGIN
    best = sweep.groupby("setting").agg(method=("method", "first"), batch_size=("batch_size", "first"),
                                        top=("score", "max"))  # fmt: skip
    flat = best[best["top"] <= bar]
    if not len(flat):
        return ""
    names = ", ".join(f"{label(r['method'])} at batch {int(r['batch_size'])}" for _, r in flat.iterrows())
    return (
        f" For {names}, every rate tried scored within {outcomes.LEARNED_MARGIN:g} points of chance on "
        "validation (evaluation mode, the mode the sweep scores), so the rate chosen among them is arbitrary "
        "(the batch-statistics methods' training-mode accuracy at batch 1 is given beside the table)."
    )


def unfinished(cfg: DictConfig) -> str:
    """A sentence where rows of summary.csv name runs that are not finished in runs/ (removed to retrain,
    or still training): their numbers, and every table and figure built from them, are from the earlier
    training until the experiment's command finishes them; '' where every row's run is finished."""
    from normprop_cli.engine.runs import read_manifest, run_dir

    summary = run_tables.read(cfg, "summary")
    if not len(summary) or "run" not in summary:
        return ""

    def stale(row) -> bool:  # not finished, or finished with other numbers than the row's (retrained since)
        path = run_dir(cfg, str(row["run"]))
        if (read_manifest(path) or {}).get("status") != "complete":
            return True
        metrics = pd.read_csv(path / "metrics.csv") if (path / "metrics.csv").exists() else pd.DataFrame()
        final = float(metrics["test_acc"].iloc[-1]) if len(metrics) else math.nan
        return "final_test_acc" in row and not math.isclose(final, float(row["final_test_acc"]), abs_tol=1e-9)

    gone = [r["run"] for _, r in summary.iterrows() if stale(r)]
    if not gone:
        return ""
    methods = ", ".join(dict.fromkeys(label(str(m)) for m in summary.loc[summary["run"].isin(gone), "normalizer"]))
    return (f"*Not yet retrained.* {len(gone)} of the {len(summary)} rows of `summary.csv` ({methods}) name runs "
            "that are not finished in `runs/`, or that finished since with other numbers (removed to retrain "
            "after a change to how they train, or still training): their numbers here, and the tables and "
            "figure built from them, come from their earlier training; "
            f"`normprop run normalizers --preset {cfg.preset.name}` retrains them.")  # fmt: skip
