"""Fig. 4 (section 5.4): NormProp (global data normalisation) at batch sizes down to 1, several
seeds; plus BatchNorm at batch size 1, where the paper says BN does not apply.

    normprop run batch-size [--preset paper] [--seeds 3]

Every batch size trains on the full training split, and its learning rate comes from a
small sweep on the validation split: each setting's YAML rate times `experiment.lr_sweep.factors`,
`lr_sweep.epochs` epochs, the first seed; the best final validation accuracy wins.

lr_sweep.csv  setting, method, batch_size, lr, seed, epochs, val_acc, val_loss, chosen
epochs.csv   every run's metrics, one row per run and epoch, with `updates` (SGD steps so far)
curves.csv   setting, method, batch_size, initial_lr, label, epoch, updates, n, mean, sd, ci_low,
             ci_high, diverged: test accuracy (%) over seeds with its 95% interval (statistics.proportion_ci)
summary.csv  one row per run: engine columns + batch_size, initial_lr, data_norm, label, updates,
             final_test_acc, best_test_acc
batch_size.png/.pdf  test accuracy vs epoch (the paper) and vs SGD updates, per batch size: mean over seeds, 95%
                     interval; chance and a note where a setting did not learn
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from normprop_cli import engine, outcomes, statistics
from normprop_cli.engine import Stage, expand_grid
from normprop_cli.engine.runs import sweep_dir
from normprop_cli.engine.trainer import epoch_steps
from normprop_cli.experiments import plots, tables
from normprop_cli.experiments.base import experiment
from normprop_cli.experiments.lr_sweep import chosen, sweep_stages, with_rates
from normprop_cli.outcomes import learned_flags

KEYS = ["setting", "method", "batch_size", "initial_lr", "label"]
BN_NOTE = "the paper: BN not applicable"


CAPPED = "updates/epoch"  # in the label of a run whose epochs are cut to train.max_steps updates


def label(method: str, batch_size: int, lr: float, max_steps: int | None = None) -> str:
    note = f" ({BN_NOTE})" if method == "batchnorm" and int(batch_size) == 1 else ""
    capped = f", {int(max_steps)} {CAPPED}" if max_steps else ""
    return f"{tables.method_label(method)}, batch {int(batch_size)}, lr {float(lr):g}{capped}{note}"


def spec_label(spec) -> str:
    t = spec.cfg.train
    return label(spec.cfg.model.norm, t.batch_size, t.lr, t.get("max_steps"))


def updates_per_epoch(manifest: dict | None, cfg: DictConfig) -> int:
    """SGD steps per epoch: the training split's size (from the run's manifest) over the batch size, or
    train.max_steps where that is fewer."""
    n = ((manifest or {}).get("dataset_info") or {}).get("sizes", {}).get("train", 0)
    return epoch_steps(cfg.train, int(n))


def plot(cfg: DictConfig) -> list[Path]:
    """Fig. 4: one curve per batch size (NormProp solid; BN at batch 1 dashed, grey), against epochs
    (the paper's axis) and against SGD updates (a batch of 1 takes 50 times the steps of a batch of 50);
    the seeds behind each mean and the interval's meaning in the title. Chance is a labelled line where
    a setting did not learn or chance lies in view, and each setting that did not learn is named in a
    note below the figure (not_learned_notes)."""
    plt = plots.pyplot()
    curve = tables.read_curves(cfg, KEYS, carry=["updates"])
    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.4))
    normprop_sizes = sorted(curve.loc[curve["method"] == "normprop", "batch_size"].unique())
    curve = curve.sort_values(["method", "batch_size"], ascending=[False, True], kind="stable")
    groups = list(curve.groupby(KEYS, sort=False))
    for ((_, method, batch_size, _, text), c), dodge in zip(groups, plots.dodges(len(groups)), strict=True):
        if method == "normprop":
            style = {"color": f"C{normprop_sizes.index(batch_size)}"} | ({"linestyle": ":"} if CAPPED in text else {})
        else:
            style = {"color": "0.4", "linestyle": "--", "marker": "x"}
        plots.plot_curve(axes[0], c, text, dodge=dodge, **style)
        if "updates" in c:
            plots.plot_curve(axes[1], c.assign(epoch=c["updates"]), text, **style)
    for ax in axes:
        plots.note_if_empty(ax, curve["mean"])
    notes = not_learned_notes(cfg)
    chance = tables.chance(cfg)
    if notes or axes[0].get_ylim()[0] <= chance:
        for ax in axes:
            ax.axhline(chance, color="k", linewidth=0.8, linestyle=":", label=f"chance ({chance:g}%)")
    plots.accuracy_axes(axes[0], cfg, "")
    axes[0].set_title("against epochs (the paper's axis)", fontsize=10)  # the data set and preset: in the suptitle
    fig.suptitle(
        plots.title(cfg, "Fig. 4: test accuracy by batch size, NormProp (global data norm)")
        + f"\neach point: mean of {seed_count(curve)}; error bars: 95% interval of the mean",
        fontsize=10,
    )
    axes[1].set_ylim(axes[0].get_ylim())  # accuracy in [0, 100], as on the left
    axes[1].set_xscale("log")
    axes[1].set_xlabel("SGD updates (log scale)")
    axes[1].set_ylabel("test accuracy (%)")
    axes[1].set_title("the same runs against the number of SGD updates", fontsize=10)
    fig.subplots_adjust(top=0.84, bottom=0.3, wspace=0.25)
    if notes:
        fig.canvas.draw()  # where the legend below the left panel ends: the note goes under it
        below = axes[0].get_legend().get_window_extent().transformed(fig.transFigure.inverted()).y0
        fig.text(0.02, below - 0.02, "\n".join(notes), ha="left", va="top", fontsize=7.5, wrap=True)
    return plots.save(fig, cfg, "batch_size")


def seed_count(curve) -> str:
    """'8 seeds', '1 seed' or '4-8 seeds (n per setting in curves.csv)': the seeds behind each setting's
    last point (curves.csv's n, the diverged runs left out)."""
    n = tables.last_epoch(curve, KEYS)["n"].astype(int) if len(curve) else [0]
    lo, hi = min(n), max(n)
    return f"{lo} seed{'s' * (lo != 1)}" if lo == hi else f"{lo}-{hi} seeds (n per setting in curves.csv)"


def not_learned_notes(cfg: DictConfig) -> list[str]:
    """One sentence per setting whose every kept run did not learn (summary.csv's `learned`: a final test
    accuracy, scored in evaluation mode, at or below chance + outcomes.LEARNED_MARGIN), with its training
    accuracy (epochs.csv's train_acc in the last epoch, in training mode): e.g. BatchNorm at batch 1 learns
    in training mode (each image normalised by its own statistics) and fails in evaluation mode."""
    summary = tables.kept(tables.read(cfg, "summary"))
    epochs = tables.read(cfg, "epochs") if (sweep_dir(cfg) / "epochs.csv").exists() else None
    bar, chance = tables.chance(cfg) + outcomes.LEARNED_MARGIN, tables.chance(cfg)
    notes = []
    for _, g in summary.groupby("setting", sort=False):
        if not len(g) or not learned_flags(g).eq(False).all():
            continue
        test = f"final test accuracy {g['final_test_acc'].mean():.1f}%, chance {chance:g}%"
        text = f"{g['label'].iloc[0]}: did not learn in evaluation mode ({test})"
        if epochs is not None and "train_acc" in epochs:
            last = epochs[epochs["run"].isin(g["run"])].sort_values("epoch").groupby("run").tail(1)
            train = last["train_acc"].mean()
            own = ", each image normalised by its own statistics" if int(g["batch_size"].iloc[0]) == 1 else ""
            if train > bar:
                text += (
                    f"; it learns in training mode (training accuracy {train:.1f}% in its last epoch{own}) "
                    "and fails in evaluation mode (running estimates), the mode of every test accuracy here"
                )
            else:
                text += f"; nor in training mode (training accuracy {train:.1f}% in its last epoch{own})"
        notes.append(text)
    return notes


def headlines(cfg: DictConfig) -> list[dict]:
    """Final mean accuracy with its 95% interval per batch size, at its chosen learning rate (the
    diverged runs left out and counted beside it); the trend the paper describes. Every run is scored
    in evaluation mode alone, so BatchNorm at batch 1 "did not learn in evaluation mode"."""
    curve = tables.read_curves(cfg, KEYS, carry=["updates"])
    summary = tables.read(cfg, "summary")
    last = tables.last_epoch(curve, KEYS)
    rows = []
    for _, r in last.sort_values(["method", "batch_size"], ascending=[False, True]).iterrows():
        runs = summary[summary["setting"] == r["setting"]]
        done = tables.kept(runs)
        if len(done) and learned_flags(done).eq(False).all():
            text = tables.did_not_learn(r["mean"], cfg, "evaluation mode")
        else:
            text = statistics.format_mean_ci(r)
        updates = f", {int(r['updates'])} updates" if "updates" in r else ""
        rows.append({"quantity": f"final test accuracy (%) [95% CI, n = {int(r['n'])}] at epoch {int(r['epoch'])}"
                                 f"{updates}, {r['label']}",
                     "reproduced": tables.with_diverged(text, runs), "paper": ""})  # fmt: skip
    normprop = last[last["method"] == "normprop"].sort_values("batch_size")
    if len(normprop) > 1:
        best = normprop.loc[normprop["mean"].idxmax()]
        spread = normprop["mean"].max() - normprop["mean"].min()
        rows.append(
            {
                "quantity": "NormProp: best batch size by final accuracy; spread over batch sizes (pp)",
                "reproduced": f"batch {int(best['batch_size'])}; {spread:.2f}",
                "paper": f"{cfg.experiment.paper_claim} (CIFAR-10)",
            }
        )
    return rows + tables.not_learned(cfg)


def stages(cfg: DictConfig):
    """The rate sweep's runs, then the grid at the rates they chose."""
    cfg = with_rates(cfg, (yield from sweep_stages(cfg)))
    yield Stage(cfg, expand_grid(cfg))


@experiment("batch-size", plot=plot, headlines=headlines, stages=stages)
def analyse(cfg: DictConfig) -> Path:
    cfg = chosen(cfg)
    specs = expand_grid(cfg)
    manifests = engine.manifests(specs)
    epochs = tables.gather(specs, columns={"batch_size": "train.batch_size", "initial_lr": "train.lr"})
    per_epoch = {
        spec.name: updates_per_epoch(manifest, spec.cfg) for spec, manifest in zip(specs, manifests, strict=True)
    }
    if len(epochs):
        epochs.insert(6, "label", epochs["run"].map({spec.name: spec_label(spec) for spec in specs}))
        epochs.insert(7, "updates", epochs["epoch"] * epochs["run"].map(per_epoch))

    def columns(spec):
        t = spec.cfg.train
        return {"batch_size": t.batch_size, "initial_lr": t.lr, "data_norm": t.data_norm,
                "label": spec_label(spec),
                "updates": per_epoch[spec.name] * int(t.epochs)}  # fmt: skip

    out = tables.write_curves_and_summary(cfg, specs, manifests, epochs, KEYS, columns, carry=["updates"])
    plot(cfg)
    return out
