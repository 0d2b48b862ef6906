"""Section 5.6: seconds per training epoch of NormProp vs BatchNorm (and no normalisation).

    normprop run timing [--preset paper]

The methods' runs train in rounds (experiments.interleave): per seed, round r trains epoch r of every
method's run, one after another in an order shuffled per round by a generator seeded with the seed and
the round, before any run trains epoch r + 1. A slow spell of a shared machine then falls on every method
of a round alike. The first round is a warm-up (allocator, cuDNN autotuning); the later ones are timed,
each epoch by its `train_seconds` (the training pass alone, no evaluation). One worker process per method
trains its runs, one epoch per turn, with this command's threads; this process hands out the turns (no
--jobs, no --launcher); a killed sweep resumes from each run's last finished epoch.

The ratio of two methods (`ratio_vs_batchnorm`, `ratio_vs_none`) pairs their epochs round by round
(verdicts.rounds): per seed, the median over its timed rounds of the method's seconds over the base's in
the same round (no single disturbed round decides it); over seeds, the geometric mean of those per-seed
ratios (`seeds_vs_*` seeds, `rounds_vs_*` rounds in all). It is the ratio behind the verdict on C6 (its
effect is 1 - this ratio, with a t interval over seeds on the log of the per-seed ratios).
`pooled_ratio_vs_batchnorm` is the ratio of the two methods' `median_epoch_seconds`, the medians of all
their runs' timed epochs pooled: not paired, shown for reference.

rounds.csv   one row per epoch trained in a round: run, method, seed, round, position (1 = first in the
             round's order), order (the round's order of the settings), process (the command's process
             that handed out the turns: a round finished by another command after a kill pairs none of
             its epochs), timed (false for the warm-up), train_seconds, finished (Unix seconds at the
             epoch's end); gathered from each run's runs/<run>/rounds.csv, which its checkpoint keeps
timing.csv   method, device, host, runs, epochs_timed, median_epoch_seconds, images_per_second,
             ratio_vs_batchnorm, seeds_vs_batchnorm, rounds_vs_batchnorm, ratio_vs_none, seeds_vs_none,
             rounds_vs_none, pooled_ratio_vs_batchnorm, paper_seconds, paper_ratio_vs_batchnorm
summary.csv  one row per run: engine columns + initial_lr, batch_size, epochs_timed, median_train_seconds,
             images_per_second
timing.png/.pdf  seconds per epoch beside the paper's (experiment.paper_seconds, on experiment.paper_device),
             and the ratio to BatchNorm
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from normprop_cli import prose
from normprop_cli.engine import expand_grid
from normprop_cli.engine.runs import say, sweep_dir
from normprop_cli.errors import UserError
from normprop_cli.experiments import plots, tables
from normprop_cli.experiments.base import experiment
from normprop_cli.experiments.interleave import OBSERVER, train_in_rounds
from normprop_cli.verdicts import rule
from normprop_cli.verdicts.rounds import ROUND_COLUMNS, paired_ratio

COLUMNS = ["method", "device", "host", "runs", "epochs_timed", "median_epoch_seconds", "images_per_second",
           "ratio_vs_batchnorm", "seeds_vs_batchnorm", "rounds_vs_batchnorm", "ratio_vs_none", "seeds_vs_none",
           "rounds_vs_none", "pooled_ratio_vs_batchnorm", "paper_seconds", "paper_ratio_vs_batchnorm"]  # fmt: skip
SECONDS = "median_train_seconds"  # summary.csv: a run's median training seconds over its timed epochs
SETTINGS = {"initial_lr": "train.lr", "batch_size": "train.batch_size"}
NAME = "timing"  # the experiment, and so its claim in conf/claims.yaml


def timed(epochs: pd.DataFrame, warmup: int) -> pd.DataFrame:
    """The epochs after the warm-up; all of them when there is nothing after it (e.g. one epoch)."""
    later = epochs[epochs["epoch"] > warmup]
    return later if len(later) else epochs


def run_timing(epochs: pd.DataFrame, run: str, warmup: int) -> dict:
    """A run's summary columns: its timed epochs, their median training seconds and images per second."""
    m = tables.of_run(epochs, run)
    if not len(m):
        return {}
    t = timed(m, warmup)
    return {"epochs_timed": len(t), "median_train_seconds": t["train_seconds"].median(),
            "images_per_second": t["images_per_second"].median()}  # fmt: skip


def rounds_table(marks: pd.DataFrame, epochs: pd.DataFrame, warmup: int) -> pd.DataFrame:
    """rounds.csv: each run's turns (`marks`, its runs/<run>/rounds.csv gathered) with the epoch's
    train_seconds (epochs.csv); `timed` after the warm-up, as `timed` reads it, per run."""
    if not len(marks) or not len(epochs):
        return pd.DataFrame(columns=ROUND_COLUMNS)
    seconds = epochs[["run", "epoch", "train_seconds"]].rename(columns={"epoch": "round"})
    t = marks.merge(seconds, on=["run", "round"], how="inner")
    last = t.groupby("run")["round"].transform("max")
    t["timed"] = (t["round"] > warmup) | (last <= warmup)
    return t.sort_values(["seed", "round", "position"], kind="stable")[ROUND_COLUMNS].reset_index(drop=True)


def complete(summary: pd.DataFrame) -> list[str]:
    """The runs summary.csv says are complete: a diverged run's epochs pair with none."""
    if not len(summary) or "run" not in summary:
        return []
    return list(summary.loc[summary["status"] == "complete", "run"]) if "status" in summary else list(summary["run"])


def timing_table(
    epochs: pd.DataFrame, warmup: int, paper: dict, summary: pd.DataFrame, rounds: pd.DataFrame
) -> pd.DataFrame:
    """One row per method: the median over its runs' timed epochs pooled, and the methods' ratios
    paired by round (verdicts.rounds.paired_ratio on rounds.csv, complete runs), beside the ratio of
    the pooled medians (pooled_ratio_vs_batchnorm)."""
    if not len(epochs):
        return pd.DataFrame(columns=COLUMNS)
    done = complete(summary)
    rows = []
    for method, g in epochs.groupby("method", sort=False):
        t = timed(g, warmup)
        row = {
            "method": method,
            "device": ", ".join(sorted(t["device"].astype(str).unique())),
            "host": ", ".join(sorted(t["host"].astype(str).unique())),
            "runs": t["run"].nunique(),
            "epochs_timed": len(t),
            "median_epoch_seconds": t["train_seconds"].median(),
            "images_per_second": t["images_per_second"].median(),
            "paper_seconds": paper.get(method, math.nan),
        }
        for base in ("batchnorm", "none"):
            row[f"ratio_vs_{base}"], row[f"seeds_vs_{base}"], row[f"rounds_vs_{base}"] = paired_ratio(
                rounds, method, base, done
            )
        rows.append(row)
    table = pd.DataFrame(rows)
    seconds = table.set_index("method")["median_epoch_seconds"]
    table["pooled_ratio_vs_batchnorm"] = table["median_epoch_seconds"] / seconds.get("batchnorm", math.nan)
    table["paper_ratio_vs_batchnorm"] = table["paper_seconds"] / paper.get("batchnorm", math.nan)
    table = table.sort_values("method", key=lambda s: s.map(tables.method_rank))
    return table[COLUMNS]


def read_rounds(cfg: DictConfig) -> pd.DataFrame:
    """rounds.csv; none (no pairs) in a sweep written before the methods trained in rounds."""
    path = sweep_dir(cfg) / "rounds.csv"
    return pd.read_csv(path) if path.exists() else pd.DataFrame(columns=ROUND_COLUMNS)


def read_table(cfg: DictConfig) -> pd.DataFrame:
    """timing.csv; one written before the ratios were paired by round (other columns) is formed again
    from epochs.csv, summary.csv and rounds.csv (none: no pairs), so that the figure and the report
    never show a ratio paired otherwise under the verdict's name."""
    table = tables.read(cfg, "timing")
    if list(table.columns) == COLUMNS:
        return table
    epochs, summary = tables.read(cfg, "epochs"), tables.read(cfg, "summary")
    warmup, paper = int(cfg.experiment.warmup_epochs), dict(cfg.experiment.paper_seconds)
    return timing_table(epochs, warmup, paper, summary, read_rounds(cfg))


def paper_source(cfg: DictConfig) -> str:
    """Where the paper's seconds were measured: experiment.paper_device, on CIFAR-10."""
    return f"{cfg.experiment.paper_device}, CIFAR-10"


def paired_bars(ax, table: pd.DataFrame, mine: str, paper: str, mine_label: str, paper_label: str) -> None:
    """Per method, the reproduced value (left, the method's colour) beside the paper's (right, hatched)."""
    x = range(len(table))
    colors = [tables.METHOD_COLORS.get(m, "C2") for m in table["method"]]
    ax.bar([i - 0.2 for i in x], table[mine], width=0.4, color=colors, label=mine_label)
    ax.bar([i + 0.2 for i in x], table[paper], width=0.4, color="0.8", hatch="//", label=paper_label)


def plot(cfg: DictConfig) -> list[Path]:
    """Seconds per training epoch (reproduced beside the paper's), and each method relative to BN"""
    plt = plots.pyplot()
    table = read_table(cfg)
    fig, (ax, rel) = plt.subplots(1, 2, figsize=(9.0, 3.6))
    x = range(len(table))
    names = [tables.method_label(m) for m in table["method"]]
    device = ", ".join(table["device"].astype(str).unique())
    paired_bars(ax, table, "median_epoch_seconds", "paper_seconds", f"reproduced ({device})",
                f"paper ({paper_source(cfg)})")  # fmt: skip
    for i, (mine, paper) in enumerate(zip(table["median_epoch_seconds"], table["paper_seconds"], strict=True)):
        ax.annotate(f"{mine:.3g}", (i - 0.2, mine), ha="center", va="bottom", fontsize=7)
        if math.isfinite(paper):
            ax.annotate(f"{paper:g}", (i + 0.2, paper), ha="center", va="bottom", fontsize=7)
    finite = table[["median_epoch_seconds", "paper_seconds"]].stack()
    if len(finite) and finite.max() / finite.min() > 20:
        ax.set_yscale("log")  # a CPU epoch of digits beside a GPU epoch of CIFAR-10
    ax.set_xticks(list(x), names)
    ax.set_ylabel("seconds per training epoch (median)")
    ax.legend(frameon=False, fontsize=7)
    seconds = cfg.experiment.paper_seconds
    paper_ratio = f"paper ({seconds.normprop:g} / {seconds.batchnorm:g} = {seconds.normprop / seconds.batchnorm:.3f})"
    paired_bars(rel, table, "ratio_vs_batchnorm", "paper_ratio_vs_batchnorm", "reproduced", paper_ratio)
    rel.axhline(1.0, color="0.5", linewidth=0.8, linestyle=":")
    rel.set_xticks(list(x), names)
    rel.set_ylabel("epoch time / BatchNorm's (paired by round, median over rounds)", fontsize=8)
    rel.legend(frameon=False, fontsize=7)
    for panel, values in ((ax, table["median_epoch_seconds"]), (rel, table["ratio_vs_batchnorm"])):
        plots.note_if_empty(panel, values)
    fig.suptitle(plots.title(cfg, "Section 5.6: training speed"), fontsize=10)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.12, top=0.88, wspace=0.3)
    return plots.save(fig, cfg, "timing")


def headlines(cfg: DictConfig) -> list[dict]:
    """Seconds per epoch of each method and the NormProp / BatchNorm ratio (paired by round, the C6
    verdict's; and the ratio of the pooled medians, labelled), beside the paper's
    (experiment.paper_seconds): a GPU's seconds on CIFAR-10, labelled not comparable unless this sweep
    ran on CUDA with CIFAR-10."""
    table = read_table(cfg).set_index("method")
    comparable = cfg.dataset.name == "cifar10" and table["device"].astype(str).str.startswith("cuda").all()
    note = "" if comparable else f" ({paper_source(cfg)}; not comparable with {cfg.dataset.name} on this device)"
    rows = []
    for method, r in table.iterrows():
        paper = r["paper_seconds"]
        rows.append(
            {
                "quantity": f"seconds per training epoch (median of {int(r['epochs_timed'])} epochs over "
                f"{int(r['runs'])} run(s) pooled), {tables.method_label(method)}, {r['device']}",
                "reproduced": round(float(r["median_epoch_seconds"]), 3),
                "paper": f"{paper:g}{note}" if math.isfinite(paper) else "",
            }
        )
    if "normprop" in table.index and "batchnorm" in table.index:
        r = table.loc["normprop"]
        if r["seeds_vs_batchnorm"]:
            rows.append(
                {
                    "quantity": "epoch time ratio NormProp / BatchNorm, paired by round: geometric mean over "
                    f"{int(r['seeds_vs_batchnorm'])} seeds of each seed's median, over its timed rounds "
                    f"({int(r['rounds_vs_batchnorm'])} in all), of NormProp's / BatchNorm's seconds in the same "
                    f"round (the {rule.claim_of(NAME).id} verdict's ratio, its effect 1 - ratio)",
                    "reproduced": round(float(r["ratio_vs_batchnorm"]), 3),
                    "paper": f"{r['paper_ratio_vs_batchnorm']:.3f}{note}",
                }
            )
        rows.append(
            {
                "quantity": "ratio of the pooled medians above, NormProp / BatchNorm (all runs' timed epochs "
                "together; not paired by round, not the verdict's)",
                "reproduced": round(float(r["pooled_ratio_vs_batchnorm"]), 3),
                "paper": "",
            }
        )
    return rows + tables.not_learned(cfg)


def paragraphs(cfg: DictConfig) -> list[str]:
    """How the methods were timed and paired, and why the ratio of the seconds above differs
    (templates/timing.md.j2)."""
    facts = timing_facts(cfg)
    return prose.render("timing", facts) if facts else []


def timing_facts(cfg: DictConfig) -> dict:
    """What the paragraph states: NormProp / BatchNorm paired by round (its seeds, the ratio and the
    claim's effect 1 - ratio) and the ratio of the pooled medians; {} where no round paired the two."""
    table = read_table(cfg).set_index("method")
    if not {"normprop", "batchnorm"} <= set(table.index) or not table.loc["normprop", "seeds_vs_batchnorm"]:
        return {}  # no round with both methods' epochs of a complete run (e.g. every NormProp run diverged)
    r = table.loc["normprop"]
    ratio = float(r["ratio_vs_batchnorm"])
    return {"claim": rule.claim_of(NAME).id, "seeds": int(r["seeds_vs_batchnorm"]), "ratio": ratio,
            "effect": 1.0 - ratio, "pooled": float(r["pooled_ratio_vs_batchnorm"])}  # fmt: skip


@experiment(NAME, plot=plot, headlines=headlines, paragraphs=paragraphs, alone=True)
def run(cfg: DictConfig) -> Path:
    if OmegaConf.select(cfg, "launcher.name", default="none") != "none":
        raise UserError(
            "timing trains its runs in rounds in one process, the methods' epochs interleaved: run it "
            "without --launcher (on a cluster, inside one job on one device)"
        )
    cfg.jobs = 1  # one epoch at a time: runs sharing one machine would time each other
    specs = expand_grid(cfg)
    manifests = train_in_rounds(cfg, specs)
    epochs = tables.gather(specs)
    if len(epochs):
        where = {spec.name: manifest or {} for spec, manifest in zip(specs, manifests, strict=True)}
        epochs["device"] = epochs["run"].map(lambda r: where[r].get("device_name", where[r].get("device")))
        epochs["host"] = epochs["run"].map(lambda r: where[r].get("host"))
    tables.write(cfg, "epochs", epochs)
    warmup = int(cfg.experiment.warmup_epochs)
    paper = dict(cfg.experiment.paper_seconds)
    out = tables.summarise(
        cfg, specs, manifests, lambda spec: tables.settings(spec, SETTINGS) | run_timing(epochs, spec.name, warmup)
    )
    rounds = rounds_table(tables.gather(specs, OBSERVER), epochs, warmup)
    tables.write(cfg, "rounds", rounds)
    unpaired = sorted(set(epochs["run"]) - set(rounds["run"])) if len(epochs) else []
    if unpaired:
        say(
            f"{len(unpaired)} run(s) ({', '.join(unpaired[:3])}{', ...' if len(unpaired) > 3 else ''}) have no "
            f"rounds.csv: trained before the methods' epochs were interleaved, they pair with none; delete "
            f"{sweep_dir(cfg) / 'runs'} to train them in rounds"
        )
    tables.write(cfg, "timing", timing_table(epochs, warmup, paper, pd.read_csv(out), rounds))
    plot(cfg)
    return out
