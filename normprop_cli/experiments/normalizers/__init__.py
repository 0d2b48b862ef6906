"""Beyond the paper: NormProp against every batch-independent normaliser (and BatchNorm,
Batch Renormalization, no normalisation) on the same NIN, data and protocol, at batch sizes down to 1.

    normprop run normalizers [--preset paper] [--seeds 3]

The grid is `experiment.methods` x `experiment.batch_sizes` (config.method_grid); each setting trains at
the learning rate its validation sweep chose (lr_sweep.py).

lr_sweep.csv     setting, method, batch_size, lr, seed, epochs, val_acc, val_loss, chosen
epochs.csv       every run's metrics per epoch, with `normalizer` and `step_ms` (training seconds per SGD step)
curves.csv       normalizer, batch_size, epoch: test accuracy (%) over the seeds that did not diverge,
                 95% interval on the logit scale (results.proportion_ci), diverged runs counted
summary.csv      one row per run: engine columns + normalizer, batch_size, initial_lr, final_test_acc,
                 best_val_test_acc, step_ms, drift (mean over layers at the final epoch),
                 train_mode_acc, eval_mode_acc (batch-statistics methods at batch 1, final epoch);
                 `learned` is True where the run learned in a mode it is scored in (either mode at
                 batch 1 for batch-statistics methods, results.learned_in_a_mode)
population.csv   every run's population metric per layer and epoch (probes.PopulationProbe)
mode_gap.csv     batch-statistics methods at batch 1: test accuracy per epoch in both modes
normalizers.csv  per batch size and method, over the runs that did not diverge (counted in `diverged`):
                 rank, rate, final and best-validation accuracy with 95% intervals (proportion_ci),
                 the difference from the reference method (Welch interval) and its reading, step
                 time, drift, both modes' accuracy and the train-minus-eval-mode gap (t intervals)
normalizers.png/.pdf  final test accuracy against batch size per method, 95% intervals; step time
"""

from __future__ import annotations

import copy
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig

from normprop_cli.engine import expand_grid, run_sweep
from normprop_cli.experiments import results
from normprop_cli.experiments.batch_size import updates_per_epoch
from normprop_cli.experiments.lr_sweep import choose_rates, with_rates
from normprop_cli.experiments.probes import BATCH_NORMS, PopulationProbe
from normprop_cli.nn.methods import BATCH_STATISTICS, method_of

KEYS = ["setting", "normalizer", "batch_size", "initial_lr"]
TABLE = ["batch_size", "rank", "normalizer", "lr", "n", "diverged", "learned", "final_acc", "final_low",
         "final_high", "best_val_acc", "best_val_low", "best_val_high", "diff_vs_reference", "diff_low", "diff_high",
         "reading", "step_ms", "drift", "drift_low", "drift_high", "train_mode_acc", "train_mode_low",
         "train_mode_high", "eval_mode_acc", "eval_mode_low", "eval_mode_high", "mode_gap", "mode_gap_low",
         "mode_gap_high"]  # fmt: skip
LABELS = {
    "none": "no normalisation",
    "batchnorm": "BatchNorm",
    "batchrenorm": "Batch Renorm",
    "weightnorm": "weight norm",
    "layernorm": "LayerNorm",
    "groupnorm": "GroupNorm",
    "ws-gn": "WS + GroupNorm",
    "scaledws": "scaled WS (NF)",
    "frn": "FRN + TLU",
    "normprop-icml": "NormProp (ICML)",
    "normprop-arxiv": "NormProp (arXiv)",
}


def label(method: str) -> str:
    return LABELS.get(method, method)


class ModeGap:
    """Batch-statistics methods trained at batch 1: test accuracy in evaluation mode (running
    estimates) and in training mode one image at a time (each image normalised by its own spatial
    statistics, as every training step saw it), on a copy of the model whose running estimates are
    left as they were (momentum 0), after every epoch."""

    name = "mode_gap"

    def observe(self, model: torch.nn.Module, batches, epoch: int) -> list[dict]:
        if epoch == 0:
            return []
        probe = copy.deepcopy(model)
        norms = [m for m in probe.modules() if isinstance(m, BATCH_NORMS)]
        right = {"eval": 0, "train": 0}
        total = 0
        with torch.no_grad():
            for x, y in batches():
                probe.eval()
                right["eval"] += int((probe(x).argmax(1) == y).sum())
                for m in norms:
                    m.train()
                    m.momentum = 0.0
                right["train"] += sum(int(probe(x[i : i + 1]).argmax(1).item() == int(y[i])) for i in range(len(x)))
                total += len(x)
        return [{"epoch": epoch, "eval_mode_acc": 100.0 * right["eval"] / total,
                 "train_mode_acc": 100.0 * right["train"] / total}]  # fmt: skip


def observers(spec):
    found = [PopulationProbe()]
    if method_of(spec.cfg.model) in BATCH_STATISTICS and int(spec.cfg.train.batch_size) == 1:
        found.append(ModeGap())
    return found


def run(cfg: DictConfig) -> Path:
    cfg = with_rates(cfg, choose_rates(cfg, method=lambda c: method_of(c.model)))
    specs = expand_grid(cfg)
    manifests = run_sweep(cfg, specs, observers=observers)
    steps = {spec.name: updates_per_epoch(m, spec.cfg) for spec, m in zip(specs, manifests, strict=True)}
    cols = {"normalizer": "model.norm", "batch_size": "train.batch_size", "initial_lr": "train.lr"}
    epochs = results.gather(specs, columns=cols)
    if len(epochs):
        epochs["normalizer"] = epochs["run"].map({s.name: method_of(s.cfg.model) for s in specs})
        epochs["step_ms"] = 1000.0 * epochs["train_seconds"] / epochs["run"].map(steps).clip(lower=1)
    population = results.gather(specs, PopulationProbe.name)
    gaps = results.gather(specs, ModeGap.name)
    results.write(cfg, "population", population)
    results.write(cfg, "mode_gap", gaps)

    def columns(spec):
        runs = results.of_run(epochs, spec.name)
        m = method_of(spec.cfg.model)
        row = {"normalizer": m, "batch_size": int(spec.cfg.train.batch_size), "initial_lr": float(spec.cfg.train.lr),
               "step_ms": runs["step_ms"].median() if len(runs) else math.nan,
               "drift": final_drift(results.of_run(population, spec.name)),
               "best_val_test_acc": best_val_test_acc(runs)}  # fmt: skip
        gap = results.of_run(gaps, spec.name)
        if len(gap):
            train, evaluation = gap["train_mode_acc"].iloc[-1], gap["eval_mode_acc"].iloc[-1]
            row |= {"train_mode_acc": train, "eval_mode_acc": evaluation}
            if len(runs):  # did not learn only where it did not in either mode
                row["learned"] = results.learned(max(runs["test_acc"].iloc[-1], train), spec.cfg)
        return row

    out = results.write_curves_and_summary(cfg, specs, manifests, epochs, KEYS, columns)
    results.write(cfg, "normalizers", table(cfg, results.read(cfg, "summary")))
    plot(cfg)
    return out


def final_drift(population: pd.DataFrame) -> float:
    """The population's average drift at the run's last epoch, averaged over its layers."""
    if not len(population):
        return math.nan
    last = population[population["epoch"] == population["epoch"].max()]
    return float(last["avg_drift"].mean())


def best_val_test_acc(runs: pd.DataFrame) -> float:
    """Test accuracy at the epoch of best validation accuracy (first such epoch)."""
    return float(runs.loc[runs["val_acc"].idxmax(), "test_acc"]) if len(runs) else math.nan


def welch(a, b) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its 95% Welch interval (independent runs, unequal variances)."""
    from scipy import stats

    a = np.asarray([v for v in a if math.isfinite(v)], dtype=float)
    b = np.asarray([v for v in b if math.isfinite(v)], dtype=float)
    diff = float(a.mean() - b.mean()) if len(a) and len(b) else math.nan
    if len(a) < 2 or len(b) < 2 or (a.std() == 0 and b.std() == 0):
        return diff, math.nan, math.nan
    with warnings.catch_warnings():  # near-identical accuracies: scipy warns of precision, the interval stands
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(results.LEVEL)
    return diff, float(ci.low), float(ci.high)


def reading(low: float, high: float) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return "no interval"
    return "better" if low > 0 else "worse" if high < 0 else "indistinguishable"


def table(cfg: DictConfig, summary: pd.DataFrame) -> pd.DataFrame:
    """One row per batch size and method, ranked by mean final test accuracy (best first), over the
    runs that did not diverge (those are counted in `diverged`): accuracies with proportion_ci, drift,
    the mode gap and the difference from the reference with t intervals; `learned` counts the runs
    that learned in a mode they are scored in (results.learned_in_a_mode)."""
    reference = cfg.experiment.get("reference", "normprop-icml")
    rows = []
    for bs, every in summary.groupby("batch_size", sort=True):
        at = results.kept(every)
        ref = at.loc[at["normalizer"] == reference, "final_test_acc"]
        for method, runs in every.groupby("normalizer", sort=False):
            g = results.kept(runs)
            final, best = results.proportion_ci(g["final_test_acc"]), results.proportion_ci(g["best_val_test_acc"])
            drift = results.mean_ci(g["drift"])
            modes = {}  # train_mode_acc, train_mode_low, ..., eval_mode_high
            for column in results.MODES:
                modes |= _ci_columns(column, results.proportion_ci(g[column]) if column in g else {})
            gap = results.mean_ci(g["train_mode_acc"] - g["eval_mode_acc"]) if "train_mode_acc" in g else {}
            diff = welch(g["final_test_acc"], ref) if method != reference and len(ref) else (math.nan,) * 3
            rows.append({"batch_size": int(bs), "normalizer": method, "lr": float(runs["initial_lr"].iloc[0]),
                         "n": final["n"], "diverged": len(runs) - len(g),
                         "learned": int(results.learned_in_a_mode(g, cfg).eq(True).sum()),
                         "final_acc": final["mean"], "final_low": final["ci_low"], "final_high": final["ci_high"],
                         "best_val_acc": best["mean"], "best_val_low": best["ci_low"], "best_val_high": best["ci_high"],
                         "diff_vs_reference": diff[0], "diff_low": diff[1], "diff_high": diff[2],
                         "reading": "reference" if method == reference else reading(diff[1], diff[2]),
                         "step_ms": float(g["step_ms"].median()),
                         "drift": drift["mean"], "drift_low": drift["ci_low"], "drift_high": drift["ci_high"],
                         **modes,
                         "mode_gap": gap.get("mean", math.nan), "mode_gap_low": gap.get("ci_low", math.nan),
                         "mode_gap_high": gap.get("ci_high", math.nan)})  # fmt: skip
    out = pd.DataFrame(rows, columns=[c for c in TABLE if c != "rank"])
    out = out.sort_values(["batch_size", "final_acc"], ascending=[True, False], kind="stable")
    out.insert(1, "rank", out.groupby("batch_size").cumcount() + 1)
    return out.reset_index(drop=True)


def _ci_columns(column: str, ci: dict) -> dict:
    """A mode's columns of the table: `<mode>_acc`, `<mode>_low`, `<mode>_high` of `column` = `<mode>_acc`."""
    mode = column.removesuffix("_acc")
    return {column: ci.get("mean", math.nan), f"{mode}_low": ci.get("ci_low", math.nan),
            f"{mode}_high": ci.get("ci_high", math.nan)}  # fmt: skip


def read_table(cfg: DictConfig) -> pd.DataFrame:
    """normalizers.csv; one written by an earlier version of `table` (other columns) is formed again
    from summary.csv, so that the figure and the report always show this version's numbers."""
    t = results.read(cfg, "normalizers")
    return t if list(t.columns) == TABLE else table(cfg, results.read(cfg, "summary"))


def plot(cfg: DictConfig) -> list[Path]:
    """Final test accuracy against batch size per method (95% intervals), and seconds per step."""
    plt = results.pyplot()
    t = read_table(cfg)
    fig, axes = plt.subplots(1, 2, figsize=(12.0, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    methods = list(dict.fromkeys(cfg.experiment.methods))
    sizes = sorted(t["batch_size"].unique())
    colors = plt.get_cmap("tab20")
    for k, method in enumerate(methods):
        g = t[t["normalizer"] == method].sort_values("batch_size")
        if not len(g):
            continue
        x = np.array([sizes.index(b) for b in g["batch_size"]]) + (k - len(methods) / 2) * 0.03
        y = g["final_acc"].to_numpy()
        err = np.nan_to_num(np.vstack([y - g["final_low"].to_numpy(), g["final_high"].to_numpy() - y]))
        style = {"linewidth": 2.4, "color": "k" if method.endswith("icml") else "0.35"} if method.startswith(
            "normprop") else {"linewidth": 1.0, "color": colors(k % 20)}  # fmt: skip
        axes[0].errorbar(x, y, yerr=err, capsize=3, marker="o", markersize=3, label=label(method), **style)
        axes[1].plot(x, g["step_ms"], marker="o", markersize=3, label=label(method), **style)
    for ax in axes:
        ax.set_xticks(range(len(sizes)), [str(b) for b in sizes])
        ax.set_xlabel("batch size")
    axes[0].set_ylim(-2, 102)  # accuracies and their intervals lie in [0, 100]
    axes[0].set_ylabel("final test accuracy (%)")
    axes[0].set_title(results.title(cfg, "normalisers at their own learning rates, 95% CI"), fontsize=10)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("ms per SGD step (median; parallel workers)")
    axes[1].set_title("step time in the runs (bench times them side by side)", fontsize=10)
    axes[0].legend(fontsize=7, ncol=2, loc="lower left")
    fig.tight_layout()
    return results.save(fig, cfg, "normalizers")


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
    return rows + results.not_learned(cfg)


def _ci(row, prefix: str) -> str:
    key = {"final": ("final_acc", "final_low", "final_high"), "best": ("best_val_acc", "best_val_low", "best_val_high"),
           "diff": ("diff_vs_reference", "diff_low", "diff_high"), "drift": ("drift", "drift_low", "drift_high"),
           "train": ("train_mode_acc", "train_mode_low", "train_mode_high"),
           "eval": ("eval_mode_acc", "eval_mode_low", "eval_mode_high"),
           "gap": ("mode_gap", "mode_gap_low", "mode_gap_high")}[prefix]  # fmt: skip
    return results.format_ci(*(float(row[k]) for k in key))


def _counts(row) -> str:
    """' (2 did not learn, 1 diverged)' for a row of the table, '' when every run learned."""
    failed, gone = int(row["n"]) - int(row["learned"]), int(row["diverged"])
    parts = [f"{failed} did not learn"] * bool(failed) + [f"{gone} diverged, left out"] * bool(gone)
    return f" ({', '.join(parts)})" if parts else ""


def _modes(row, cfg: DictConfig) -> str:
    """'learns in training mode and fails in evaluation mode (mean final accuracy at or below chance + 5
    points; chance is 10%)': each mode's mean final accuracy against chance + results.LEARNED_MARGIN."""
    bar = results.chance(cfg) + results.LEARNED_MARGIN
    learns = {results.MODES[c]: float(row[c]) > bar for c in ("train_mode_acc", "eval_mode_acc")}
    chance = f"chance is {results.chance(cfg):g}%"
    if all(learns.values()):
        return f"learns in both modes (mean final accuracy above chance + {results.LEARNED_MARGIN:g} points; {chance})"
    said = " and ".join(f"{'learns' if ok else 'fails'} in {mode}" for mode, ok in learns.items())
    return f"{said} (fails: mean final accuracy {results.NEAR_CHANCE}; {chance})"


def paragraphs(cfg: DictConfig) -> list[str]:
    """A ranked table per batch size, then which methods beat the reference where, with intervals;
    the batch-statistics methods at batch 1 in both modes."""
    t = read_table(cfg)
    reference = cfg.experiment.get("reference", "normprop-icml")
    ref = label(reference)
    out = [
        f"**Normalisers ({cfg.dataset.name}, {cfg.preset.name} preset, {int(cfg.train.epochs)} epochs).** Each "
        "method at each batch size trains at the rate its validation sweep chose (`lr_sweep.csv`). Accuracy "
        "intervals are 95% t intervals on the logit scale (they stay within [0, 100]); runs that diverged are "
        f"left out of every mean and counted beside it. Differences from {ref} are Welch 95% intervals over "
        "independent seeds: *better* or *worse* where the interval "
        "excludes 0, else *indistinguishable*. Every batch size trains the same epochs, so a batch of 50 takes "
        "1/50 of the SGD updates of a batch of 1: compare methods within a batch size, not across. Step times "
        f"come from the runs ({int(cfg.get('jobs') or 1)} one-thread worker processes side by side), comparable "
        "within this table only; `normprop bench` times the methods in turn in one process."
    ]
    for bs, g in t.groupby("batch_size", sort=True):
        head = f"| rank | method | lr | final acc (%) [95% CI] | best-val acc (%) | vs {ref} (pp) | drift | ms/step |"
        lines = [head, "|---|---|---|---|---|---|---|---|"]
        for _, r in g.iterrows():
            vs = "reference" if r["normalizer"] == reference else f"{_ci(r, 'diff')} {r['reading']}"
            final = _ci(r, "final")
            if math.isfinite(float(r["train_mode_acc"])):
                final += f" in evaluation mode; {_ci(r, 'train')} in training mode"
            lines.append(f"| {int(r['rank'])} | {label(r['normalizer'])} | {r['lr']:g} | {final}{_counts(r)} | "
                         f"{_ci(r, 'best')} | {vs} | {_ci(r, 'drift')} | {r['step_ms']:.1f} |")  # fmt: skip
        out.append(f"*Batch size {int(bs)}:*\n\n" + "\n".join(lines))
        out.append(_finding(g, int(bs), ref))
    gaps = t[t["mode_gap"].notna()]
    if len(gaps):
        parts = [
            f"{label(r['normalizer'])} {_ci(r, 'train')} in training mode and {_ci(r, 'eval')} in evaluation mode, "
            f"a difference of {_ci(r, 'gap')} pp: it {_modes(r, cfg)}"
            for _, r in gaps.iterrows()
        ]
        out.append(
            "At batch 1 the batch-statistics methods normalise each training image by its own spatial statistics. "
            "Tested the same way (training mode, one image at a time) and with their running estimates "
            f"(evaluation mode, the mode of the table above), their final test accuracy (%) is: {'; '.join(parts)} "
            "(95% CI; the difference is training minus evaluation mode)."
        )
    return out


def _finding(g: pd.DataFrame, bs: int, ref: str) -> str:
    def names(reading: str) -> str:
        rows = g[g["reading"] == reading]
        return ", ".join(f"{label(r['normalizer'])} ({_ci(r, 'diff')} pp)" for _, r in rows.iterrows())

    better, worse = names("better"), names("worse")
    same = ", ".join(label(m) for m in g.loc[g["reading"] == "indistinguishable", "normalizer"])
    parts = [f"At batch {bs}, " + (f"{better} beat {ref}" if better else f"no method beats {ref}")]
    if worse:
        parts.append(f"{worse} {'is' if worse.count('(') == 1 else 'are'} worse")
    if same:
        parts.append(f"{same} cannot be told apart from it at these seeds")
    return "; ".join(parts) + "."
