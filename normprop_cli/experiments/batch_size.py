"""Fig. 4 (section 5.4): NormProp (global data normalisation) at batch sizes down to 1, several
seeds; plus BatchNorm at batch size 1, where the paper says BN does not apply.

    normprop run batch-size [--preset paper] [--seeds 3]

epochs.csv   every run's metrics, one row per run and epoch
curves.csv   setting, method, batch_size, initial_lr, label, epoch, n, mean, sd, ci_low, ci_high:
             test accuracy (%) over seeds with its 95% Student-t interval
summary.csv  one row per run: engine columns + batch_size, initial_lr, data_norm, label,
             final_test_acc, best_test_acc
batch_size.png/.pdf  test accuracy vs epoch per batch size, caps showing the 95% interval
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from normprop_cli.engine import expand_grid, run_sweep
from normprop_cli.experiments import curves

KEYS = ["setting", "method", "batch_size", "initial_lr", "label"]
BN_NOTE = "the paper: BN not applicable"


def label(method: str, batch_size: int, lr: float) -> str:
    note = f" ({BN_NOTE})" if method == "batchnorm" and int(batch_size) == 1 else ""
    return f"{curves.method_label(method)}, batch {int(batch_size)}, lr {float(lr):g}{note}"


def run(cfg: DictConfig) -> Path:
    specs = expand_grid(cfg)
    manifests = run_sweep(cfg, specs)
    epochs = curves.gather(specs, columns={"batch_size": "train.batch_size", "initial_lr": "train.lr"})
    if len(epochs):
        epochs.insert(
            6,
            "label",
            [label(*r) for r in zip(epochs["method"], epochs["batch_size"], epochs["initial_lr"], strict=True)],
        )

    def columns(spec):
        t = spec.cfg.train
        return {"batch_size": t.batch_size, "initial_lr": t.lr, "data_norm": t.data_norm,
                "label": label(spec.cfg.model.norm, t.batch_size, t.lr)}  # fmt: skip

    out = curves.write_curves_and_summary(cfg, specs, manifests, epochs, KEYS, columns)
    plot(cfg)
    return out


def plot(cfg: DictConfig) -> list[Path]:
    """Fig. 4: one curve per batch size (NormProp solid; BN at batch 1 dashed, grey)."""
    plt = curves.pyplot()
    curve = curves.read(cfg, "curves")
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    normprop_sizes = sorted(curve.loc[curve["method"] == "normprop", "batch_size"].unique())
    curve = curve.sort_values(["method", "batch_size"], ascending=[False, True], kind="stable")
    groups = list(curve.groupby(KEYS, sort=False))
    for ((_, method, batch_size, _, text), c), dodge in zip(groups, curves.dodges(len(groups)), strict=True):
        if method == "normprop":
            style = {"color": f"C{normprop_sizes.index(batch_size)}"}
        else:
            style = {"color": "0.4", "linestyle": "--", "marker": "x"}
        curves.plot_curve(ax, c, text, dodge=dodge, **style)
    curves.accuracy_axes(ax, cfg, "Fig. 4: batch size, NormProp (global data norm), 95% CI")
    return curves.save(fig, cfg, "batch_size")


def headlines(cfg: DictConfig) -> list[dict]:
    """Final mean accuracy with its 95% interval per batch size; the trend the paper describes."""
    curve = curves.read(cfg, "curves")
    last = curves.last_epoch(curve, KEYS)
    rows = [
        {
            "quantity": f"final test accuracy (%) [95% CI, n = {int(r['n'])}] at epoch {int(r['epoch'])}, {r['label']}",
            "reproduced": curves.format_ci(r["mean"], r["ci_low"], r["ci_high"]),
            "paper": "",
        }
        for _, r in last.sort_values(["method", "batch_size"], ascending=[False, True]).iterrows()
    ]
    normprop = last[last["method"] == "normprop"].sort_values("batch_size")
    if len(normprop) > 1:
        best = normprop.loc[normprop["mean"].idxmax()]
        spread = normprop["mean"].max() - normprop["mean"].min()
        rows.append(
            {
                "quantity": "NormProp: best batch size by final accuracy; spread over batch sizes (pp)",
                "reproduced": f"batch {int(best['batch_size'])}; {spread:.2f}",
                "paper": cfg.experiment.paper_claim,
            }
        )
    return rows
