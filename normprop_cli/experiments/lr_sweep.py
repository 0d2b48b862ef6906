"""A learning rate per setting from a small validation sweep (batch-size, normalizers), by the policy
that `experiment.lr_sweep` names. Factors (`factors`, `epochs`): every grid setting trains at its YAML rate
times each factor for `epochs` epochs with the first seed; the best final validation accuracy (ties: the
lower validation loss) picks the rate of the real runs. Steps (`step` present):

    step: 2.0          the ratio between neighbouring rates
    points: 3          the first rates: centre * step**k, k = -(points//2) .. points//2 (odd; centre: train.lr)
    extend: 4          at most this many more rates past each edge
    seeds: [100, 101]  the sweep's own seeds: at least 2, none of the reported runs' (seed .. seed+seeds-1)
    epochs: 4          sweep epochs: at least half the reported runs' train.epochs (rounded up), or `half`:
                       each setting half its own epochs (where the grid sets epochs per setting)

every rate trains at every sweep seed for `epochs` epochs (the run otherwise as reported, its rate halving
included; the test set unscored where the trainer has train.eval_test). A rate's score is the mean over the
seeds of the final validation accuracy, a run that diverged or has no result counting as chance; ties go
to the lower mean final validation loss. While a setting's best rate is the lowest (highest) it has tried
and that side has had fewer than `extend` extensions, the next rate beyond it trains, each round every
setting's new rates together, until none is added: a rerun skips the finished runs and reaches the same
rates. lr_sweep.png/.pdf draws the scores (plot_sweep).

The sweep's runs are named sweep-<setting>-lr<rate>-s<seed>; lr_sweep.csv has one row per run: setting,
method, batch_size, lr, seed, epochs, val_acc, val_loss, chosen (True on the chosen rate's rows); the steps
policy adds `score` (the rate's) and `at_edge` (on the chosen rate's rows where it is still the lowest or
highest rate tried: that side's extensions spent; edge_choices lists them). A grid entry with `rate_of:
<setting>` is not swept: it trains at that setting's chosen rate (e.g. batch 1 with as many updates per
epoch as batch 50, at batch 1's rate), times its `rate_scale` where it has one (e.g. 0.5: half that rate)."""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from normprop_cli.engine import RunSpec, Stage, expand_grid, run_sweep
from normprop_cli.errors import UserError
from normprop_cli.experiments import plots, tables
from normprop_cli.experiments.grid import LR

SWEEP = ["setting", "method", "batch_size", "lr", "seed", "epochs", "val_acc", "val_loss", "chosen"]
STEPPED = [*SWEEP, "score", "at_edge"]  # lr_sweep.csv of the steps policy
EDGES = ["setting", "method", "batch_size", "lr", "side", "rates"]
STEP_KEYS = ("step", "points", "extend", "seeds", "epochs")


def sweep_grid(cfg: DictConfig) -> tuple[DictConfig, dict[str, str]]:
    """The validation sweep as a grid of its own: every setting at each candidate rate, the first
    seed; and which setting each sweep entry belongs to."""
    sweep = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    s = cfg.experiment.lr_sweep
    entries, owner = [], {}
    for entry in cfg.grid:
        if entry.get("rate_of"):
            continue
        base = float(entry.set[LR])
        for factor in s.factors:
            lr = float(f"{base * float(factor):.6g}")
            name = f"sweep-{entry.id}-lr{lr:g}"
            entries.append({"id": name, "set": dict(entry.set) | {LR: lr, "train.epochs": int(s.epochs)}})
            owner[name] = entry.id
    sweep.grid, sweep.seeds = entries, 1
    return sweep, owner


def sweep_stages(
    cfg: DictConfig,
    method: Callable[[DictConfig], str] = lambda c: c.model.norm,
    label: Callable[[str], str] = tables.method_label,
    observers: Callable[[RunSpec], list] = lambda spec: (),
) -> Generator[Stage, list, pd.DataFrame]:
    """The sweep's runs as stages (engine.sweep: each yielded stage is sent its manifests once trained): one
    for the factors policy, one per round for the steps policy (choose_stepped). From their results, per
    setting, the rate with the best final validation accuracy (ties: the lower validation loss) is marked
    chosen, lr_sweep.csv written and its table returned. `method(run_cfg)` names a run's method in
    lr_sweep.csv; the steps policy draws lr_sweep.png with `label(method)` in its legend. `observers(spec)`:
    what a sweep run needs observed to train as the reported runs do (e.g. the drift Sigma-oracle's held-out
    batch)."""
    if stepped(cfg):
        return (yield from choose_stepped(cfg, method, label, observers))
    grid, owner = sweep_grid(cfg)
    specs = expand_grid(grid)
    yield Stage(grid, specs, observers)
    epochs = tables.gather(specs, columns={"batch_size": "train.batch_size", "lr": LR})
    rows = []
    for spec in specs:
        m = tables.of_run(epochs, spec.name)
        last = m.iloc[-1] if len(m) else {"val_acc": float("nan"), "val_loss": float("nan"), "epoch": 0}
        t = spec.cfg.train
        rows.append({"setting": owner[spec.setting], "method": method(spec.cfg), "batch_size": int(t.batch_size),
                     "lr": float(t.lr), "seed": spec.seed, "epochs": int(last["epoch"]), "val_acc": last["val_acc"],
                     "val_loss": last["val_loss"]})  # fmt: skip
    table = pd.DataFrame(rows, columns=SWEEP[:-1])
    best = table.sort_values(["val_acc", "val_loss"], ascending=[False, True], kind="stable")
    winners = set(best.groupby("setting", sort=False).head(1).index)
    table["chosen"] = [i in winners for i in table.index]
    tables.write(cfg, "lr_sweep", table)
    return table


def choose_rates(cfg: DictConfig, *args, **kwargs) -> pd.DataFrame:
    """sweep_stages' sweep trained here, stage after stage (run_sweep); lr_sweep.csv's table."""
    stages, manifests = sweep_stages(cfg, *args, **kwargs), None
    try:
        while True:
            stage = stages.send(manifests)
            manifests = run_sweep(stage.cfg, stage.specs, observers=stage.observers)
    except StopIteration as done:
        return done.value


def chosen(cfg: DictConfig) -> DictConfig:
    """The experiment's grid at the rates its finished sweep chose (lr_sweep.csv, written by sweep_stages)."""
    return with_rates(cfg, tables.read(cfg, "lr_sweep"))


def with_rates(cfg: DictConfig, sweep: pd.DataFrame) -> DictConfig:
    """The experiment's grid with each setting's chosen learning rate (either policy's lr_sweep.csv)."""
    chosen = sweep[sweep["chosen"].astype(bool)].drop_duplicates("setting").set_index("setting")["lr"]
    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    for entry in out.grid:
        lr = float(chosen[entry.get("rate_of") or entry.id])
        scale = entry.get("rate_scale")  # a fixed multiple of the borrowed rate (e.g. 0.5: half NormProp's)
        entry.set[LR] = float(f"{lr * float(scale):.6g}") if scale is not None else lr
    return out


# ---- the steps policy ------------------------------------------------------------------------------


def stepped(cfg: DictConfig) -> bool:
    """Does the experiment choose its rates by the steps policy (`experiment.lr_sweep.step`)?"""
    s = cfg.experiment.get("lr_sweep")
    return s is not None and s.get("step") is not None


def check_stepped(cfg: DictConfig) -> None:
    """The steps policy's settings, each refused with a one-line error before anything trains."""
    s, key = cfg.experiment.lr_sweep, "experiment.lr_sweep"
    missing = [k for k in STEP_KEYS if s.get(k) is None]
    extra = sorted(k for k in set(s) - set(STEP_KEYS) if s.get(k) is not None)  # null: unset by a preset
    if missing or extra:
        what = f"lacks {', '.join(missing)}" if missing else f"has {', '.join(extra)} beside step"
        raise UserError(f"{key} {what}; the steps policy takes exactly {', '.join(STEP_KEYS)}")
    if not isinstance(s.step, int | float) or isinstance(s.step, bool) or float(s.step) <= 1:
        raise UserError(f"{key}.step={s.step} must be a ratio above 1 (e.g. 2.0)")
    for name, ok, what in (("points", _whole(s.points) and s.points % 2 == 1, "an odd whole number (1, 3, 5, ...)"),
                           ("extend", _whole(s.extend) and s.extend >= 0, "a whole number, 0 or more")):  # fmt: skip
        if not ok:
            raise UserError(f"{key}.{name}={s[name]} must be {what}")
    seeds = list(s.seeds) if OmegaConf.is_list(s.seeds) else None
    if seeds is None or len(seeds) < 2 or not all(_whole(x) for x in seeds) or len(set(seeds)) < len(seeds):
        raise UserError(f"{key}.seeds={s.seeds} must list at least 2 distinct whole-number seeds (e.g. [100, 101]) "
                        "so that a rate's score is a mean over seeds")  # fmt: skip
    first, n = int(cfg.seed), int(cfg.seeds)
    clash = [x for x in seeds if first <= x < first + n]
    if clash:
        free = max(100, first + n)
        raise UserError(f"{key}.seeds={seeds}: {', '.join(map(str, clash))} among the reported runs' seeds "
                        f"{first}..{first + n - 1} (seed={first}, seeds={n}); a rate must be chosen on seeds of "
                        f"its own, e.g. [{free}, {free + 1}]")  # fmt: skip
    if s.epochs == "half":
        return
    reported = max(int((e.get("set") or {}).get("train.epochs", cfg.train.epochs)) for e in cfg.grid)
    half = math.ceil(reported / 2)
    if not _whole(s.epochs) or s.epochs < half:
        raise UserError(f"{key}.epochs={s.epochs} is under half the reported runs' {reported} epochs; sweep at least "
                        f"{half} (or `half`: each setting half its own) so that a rate is chosen on runs like the "
                        "reported ones")  # fmt: skip


def sweep_epochs(cfg: DictConfig, settings: dict) -> int:
    """A sweep run's epochs: lr_sweep.epochs, or with `half` half the setting's own (rounded up)."""
    s = cfg.experiment.lr_sweep
    if s.epochs == "half":
        return math.ceil(int(settings.get("train.epochs", cfg.train.epochs)) / 2)
    return int(s.epochs)


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def rate(centre: float, step: float, k: int) -> float:
    """The k-th rate from the centre, rounded as the factors policy rounds its rates."""
    return float(f"{centre * float(step) ** k:.6g}")


def stepped_specs(cfg: DictConfig, todo: list[tuple[str, float]]) -> tuple[DictConfig, list[RunSpec], dict]:
    """The sweep runs of `todo` = [(setting, rate)], one per sweep seed (expand_grid at each seed in
    turn: the seeds need not be consecutive), and which setting each sweep entry belongs to."""
    s, sets = cfg.experiment.lr_sweep, {e.id: dict(e.set) for e in cfg.grid}
    quiet = {"train.eval_test": False} if "eval_test" in cfg.train else {}  # no test set for choosing a rate
    grid = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    grid.grid = [{"id": f"sweep-{setting}-lr{lr:g}",
                  "set": sets[setting] | {LR: lr, "train.epochs": sweep_epochs(cfg, sets[setting])} | quiet}
                 for setting, lr in todo]  # fmt: skip
    specs = []
    for seed in s.seeds:
        grid.seed, grid.seeds = int(seed), 1
        specs += expand_grid(grid)
    return grid, specs, {f"sweep-{setting}-lr{lr:g}": setting for setting, lr in todo}


def stepped_rows(cfg, specs, manifests, owner, method) -> list[dict]:
    """One row per sweep run, with `value` (the final validation accuracy; chance for a run that
    diverged, is unfinished or has no finite result) and `loss` (its validation loss; inf for those)."""
    epochs = tables.gather(specs)
    rows = []
    for spec, manifest in zip(specs, manifests, strict=True):
        m = tables.of_run(epochs, spec.name)
        acc, loss = (float(m["val_acc"].iloc[-1]), float(m["val_loss"].iloc[-1])) if len(m) else (math.nan,) * 2
        ok = (manifest or {}).get("status") == "complete" and math.isfinite(acc) and math.isfinite(loss)
        rows.append({"setting": owner[spec.setting], "method": method(spec.cfg),
                     "batch_size": int(spec.cfg.train.batch_size), "lr": float(spec.cfg.train.lr), "seed": spec.seed,
                     "epochs": int(m["epoch"].iloc[-1]) if len(m) else 0, "val_acc": acc, "val_loss": loss,
                     "value": acc if ok else tables.chance(cfg), "loss": loss if ok else math.inf})  # fmt: skip
    return rows


def scores(table: pd.DataFrame) -> pd.DataFrame:
    """Per setting and rate: score (mean `value` over the seeds) and loss (mean `loss`), best first."""
    per = table.groupby(["setting", "lr"], sort=False)[["value", "loss"]].mean().reset_index()
    per = per.rename(columns={"value": "score"})
    return per.sort_values(["setting", "score", "loss", "lr"], ascending=[True, False, True, True], kind="stable")


def choose_stepped(
    cfg: DictConfig,
    method: Callable[[DictConfig], str],
    label: Callable[[str], str],
    observers: Callable[[RunSpec], list] = lambda spec: (),
) -> Generator[Stage, list, pd.DataFrame]:
    """The steps policy (module docstring), a stage per round: rounds of sweep runs until every setting's best
    rate is interior or its side's extensions are spent; lr_sweep.csv and lr_sweep.png."""
    check_stepped(cfg)
    s, extend = cfg.experiment.lr_sweep, int(cfg.experiment.lr_sweep.extend)
    centres = {e.id: float(e.set[LR]) for e in cfg.grid if not e.get("rate_of")}
    tried = {setting: list(range(-(int(s.points) // 2), int(s.points) // 2 + 1)) for setting in centres}
    spent = {setting: [0, 0] for setting in centres}  # extensions below and above
    todo, rows = [(setting, k) for setting, ks in tried.items() for k in ks], []
    while todo:
        grid, specs, owner = stepped_specs(cfg, [(setting, rate(centres[setting], s.step, k)) for setting, k in todo])
        manifests = yield Stage(grid, specs, observers)
        rows += stepped_rows(cfg, specs, manifests, owner, method)
        best = scores(pd.DataFrame(rows)).groupby("setting", sort=False).head(1).set_index("setting")["lr"]
        edges = [(setting, side, k) for setting, ks in tried.items() for side, k in enumerate((min(ks), max(ks)))]
        todo = [(setting, k + (1 if side else -1)) for setting, side, k in edges
                if best[setting] == rate(centres[setting], s.step, k) and spent[setting][side] < extend]  # fmt: skip
        for setting, k in todo:
            spent[setting][int(k > 0)] += 1  # a rate past the lowest has k < 0, past the highest k > 0
            tried[setting].append(k)
    table = stepped_table(pd.DataFrame(rows), list(centres), list(s.seeds))
    tables.write(cfg, "lr_sweep", table)
    plot_sweep(cfg, label)
    return table


def stepped_table(rows: pd.DataFrame, settings: list[str], seeds: list[int]) -> pd.DataFrame:
    """lr_sweep.csv of the steps policy: rows by setting (grid order), rate and seed; the rate's score,
    chosen and at_edge."""
    per = scores(rows)
    best = per.groupby("setting", sort=False).head(1).set_index("setting")["lr"]
    rows = rows.merge(per[["setting", "lr", "score"]], on=["setting", "lr"], how="left")
    rows["chosen"] = rows["lr"] == rows["setting"].map(best)
    low, high = rows.groupby("setting")["lr"].transform("min"), rows.groupby("setting")["lr"].transform("max")
    rows["at_edge"] = rows["chosen"] & ((rows["lr"] == low) | (rows["lr"] == high))
    order = rows["setting"].map({s: i for i, s in enumerate(settings)}), rows["seed"].map(seeds.index)
    rows = rows.assign(_setting=order[0], _seed=order[1]).sort_values(["_setting", "lr", "_seed"], kind="stable")
    return rows[STEPPED].reset_index(drop=True)


def edge_choices(sweep: pd.DataFrame) -> pd.DataFrame:
    """The settings whose chosen rate is the lowest or highest rate they tried (side: 'lowest',
    'highest', or 'only' where one rate was tried), with the rates tried ('0.001 0.002 0.004'): by
    `at_edge` for the steps policy; for the factors policy, a chosen rate at either end of two or more."""
    rows = []
    for setting, g in sweep.groupby("setting", sort=False):
        rates, won = sorted(g["lr"].unique()), g[g["chosen"].astype(bool)]
        if not len(won):
            continue
        lr = float(won["lr"].iloc[0])
        edge = won["at_edge"].astype(bool).any() if "at_edge" in g else len(rates) > 1 and lr in (rates[0], rates[-1])
        if edge:
            side = "only" if len(rates) == 1 else "lowest" if lr == rates[0] else "highest"
            first = won.iloc[0]
            rows.append({"setting": setting, "method": first["method"], "batch_size": int(first["batch_size"]),
                         "lr": lr, "side": side, "rates": " ".join(f"{r:g}" for r in rates)})  # fmt: skip
    return pd.DataFrame(rows, columns=EDGES)


def plot_sweep(cfg: DictConfig, label: Callable[[str], str] = tables.method_label) -> list[Path]:
    """lr_sweep.png/.pdf from lr_sweep.csv: per batch size, each setting's score (mean final validation
    accuracy over the sweep seeds) against the rate on a log2 axis, each seed's accuracy as a small
    point, the chosen rate as a large marker; chance as a dotted line."""
    plt = plots.pyplot()
    sweep = tables.read(cfg, "lr_sweep")
    note = "; a diverged run counts as chance" if "score" in sweep else ""
    if not note:  # the factors policy's lr_sweep.csv: the mean of the seeds' accuracies
        sweep["score"] = sweep.groupby(["setting", "lr"])["val_acc"].transform("mean")
    sizes = sorted(sweep["batch_size"].unique())
    fig, axes = plt.subplots(1, len(sizes), figsize=(1.0 + 4.2 * len(sizes), 4.6), squeeze=False, sharey=True)
    methods = list(dict.fromkeys(sweep["method"]))
    colors, chance = plt.get_cmap("tab20" if len(methods) > 10 else "tab10"), tables.chance(cfg)
    handles = {}
    for ax, bs in zip(axes[0], sizes, strict=True):
        at = sweep[sweep["batch_size"] == bs]
        shared = at.drop_duplicates("setting")["method"].duplicated(keep=False).to_numpy()
        for (setting, g), twin in zip(at.groupby("setting", sort=False), shared, strict=True):
            m, per = g["method"].iloc[0], g.groupby("lr").agg(score=("score", "first"), chosen=("chosen", "any"))
            color = colors(methods.index(m) % colors.N)
            (handles[f"{label(m)} ({setting})" if twin else label(m)],) = ax.plot(
                per.index, per["score"], marker="o", markersize=3, linewidth=1.2, color=color)  # fmt: skip
            ax.scatter(g["lr"], g["val_acc"], s=8, color=color, alpha=0.5, linewidths=0)
            won = per[per["chosen"].astype(bool)]
            ax.scatter(won.index, won["score"], s=70, color=color, edgecolors="k", zorder=3)
        ax.axhline(chance, color="k", linewidth=0.8, linestyle=":", label=f"chance ({chance:g}%)")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="learning rate (log scale, base 2)", ylim=(-2, 102))
        ax.set_title(f"batch size {int(bs)}", fontsize=10)
    axes[0][0].set_ylabel("final validation accuracy (%)")
    axes[0][0].scatter([], [], s=70, color="0.8", edgecolors="k", label="chosen rate")  # the legend's key
    handles |= {t: h for h, t in zip(*axes[0][0].get_legend_handles_labels(), strict=True) if t not in handles}
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=6, fontsize=7, frameon=False)
    seeds = int(sweep.groupby(["setting", "lr"])["seed"].nunique().max())
    what = f"final validation accuracy, mean of {seeds} seed{'s' * (seeds != 1)} (small points: each seed){note}"
    fig.suptitle(plots.title(cfg, "learning-rate sweep") + f"\n{what}", fontsize=10)
    fig.subplots_adjust(top=0.83, bottom=0.16 + 0.035 * math.ceil(len(handles) / 6), wspace=0.08)
    return plots.save(fig, cfg, "lr_sweep")
