"""A learning rate per setting from a small validation sweep (batch-size, normalizers): every grid
setting trains at its YAML rate times `experiment.lr_sweep.factors` for `lr_sweep.epochs` epochs with
the first seed; the best final validation accuracy (ties: the lower validation loss) picks the rate of
the real runs. The sweep's runs are named sweep-<setting>-lr<rate>-s<seed>; lr_sweep.csv records them.
A grid entry with `rate_of: <setting>` is not swept: it trains at that setting's chosen rate (e.g. batch
1 with as many updates per epoch as batch 50, at batch 1's rate)."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from normprop_cli.engine import expand_grid, run_sweep
from normprop_cli.experiments import results

SWEEP = ["setting", "method", "batch_size", "lr", "seed", "epochs", "val_acc", "val_loss", "chosen"]


def sweep_grid(cfg: DictConfig) -> tuple[DictConfig, dict[str, str]]:
    """The validation sweep as a grid of its own: every setting at each candidate rate, the first
    seed; and which setting each sweep entry belongs to."""
    sweep = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    s = cfg.experiment.lr_sweep
    entries, owner = [], {}
    for entry in cfg.grid:
        if entry.get("rate_of"):
            continue
        base = float(entry.set["train.lr"])
        for factor in s.factors:
            lr = float(f"{base * float(factor):.6g}")
            name = f"sweep-{entry.id}-lr{lr:g}"
            entries.append({"id": name, "set": dict(entry.set) | {"train.lr": lr, "train.epochs": int(s.epochs)}})
            owner[name] = entry.id
    sweep.grid, sweep.seeds = entries, 1
    return sweep, owner


def choose_rates(cfg: DictConfig, method: Callable[[DictConfig], str] = lambda c: c.model.norm) -> pd.DataFrame:
    """Train the sweep; per setting, mark the rate with the best final validation accuracy (ties: the
    lower validation loss). `method(run_cfg)` names a run's method in lr_sweep.csv."""
    grid, owner = sweep_grid(cfg)
    specs = expand_grid(grid)
    run_sweep(grid, specs)
    epochs = results.gather(specs, columns={"batch_size": "train.batch_size", "lr": "train.lr"})
    rows = []
    for spec in specs:
        m = results.of_run(epochs, spec.name)
        last = m.iloc[-1] if len(m) else {"val_acc": float("nan"), "val_loss": float("nan"), "epoch": 0}
        t = spec.cfg.train
        rows.append({"setting": owner[spec.setting], "method": method(spec.cfg), "batch_size": int(t.batch_size),
                     "lr": float(t.lr), "seed": spec.seed, "epochs": int(last["epoch"]), "val_acc": last["val_acc"],
                     "val_loss": last["val_loss"]})  # fmt: skip
    table = pd.DataFrame(rows, columns=SWEEP[:-1])
    best = table.sort_values(["val_acc", "val_loss"], ascending=[False, True], kind="stable")
    winners = set(best.groupby("setting", sort=False).head(1).index)
    table["chosen"] = [i in winners for i in table.index]
    results.write(cfg, "lr_sweep", table)
    return table


def with_rates(cfg: DictConfig, sweep: pd.DataFrame) -> DictConfig:
    """The experiment's grid with each setting's chosen learning rate."""
    chosen = sweep[sweep["chosen"]].set_index("setting")["lr"]
    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    for entry in out.grid:
        entry.set["train.lr"] = float(chosen[entry.get("rate_of") or entry.id])
    return out
