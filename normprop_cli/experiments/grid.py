"""Grid policy: the grid of an experiment that compares methods, and which overrides a grid honours.

A grid is `cfg.grid`, a list of settings `{id, set: {dotted key: value}}` that `engine.expand_grid`
crosses with the seeds. Most experiments give theirs in YAML; one that lists `experiment.methods`
(the registered methods of `nn.methods`) and `experiment.batch_sizes` gets it built here
(`method_grid`). An override of a key the grid sets is applied to every setting where it is the
learning rate of a grid that fixes one per setting (`HONOURED`), and refused otherwise, naming the key
and where the grid is defined.

    cfg = grid.load("normalizers", preset="quick", overrides=["train.epochs=3"])
"""

from __future__ import annotations

from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf

from normprop_cli import config
from normprop_cli.errors import UserError
from normprop_cli.nn.methods import METHODS, settings

LR = "train.lr"  # the grid key of a setting's learning rate


def load(
    experiment: str,
    preset: str | None = None,
    dataset: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    **options,
) -> DictConfig:
    """`config.load`'s config with its grid: built from `experiment.methods` where the experiment
    lists them, and the overrides of grid keys honoured or refused (`grid_overrides`)."""
    cfg, user = config.compose_checked(experiment, preset, dataset, overrides, **options)
    if cfg.experiment.get("methods") is not None and not cfg.get("grid"):
        cfg.grid = method_grid(cfg.experiment)
    grid_overrides(cfg, user)
    return cfg


# Grid keys that an override replaces in every run: the learning rate of a grid that fixes one per
# setting. Any other grid key (model.norm, train.batch_size, ...) is what the experiment compares,
# and an override of it is refused; so is train.lr where a validation sweep chooses it.
HONOURED = (LR,)


def grid_overrides(cfg: DictConfig, user: list[Override]) -> None:
    """Apply the overrides of HONOURED grid keys to every run of cfg.grid; refuse those of other
    grid keys, naming the key and where the grid is defined."""
    grid = cfg.get("grid") or []
    name = cfg.experiment.name
    for o in user:
        key = o.key_or_group
        clash = sorted({k for e in grid for k in (e.get("set") or {}) if k == key or
                        k.startswith(f"{key}.") or key.startswith(f"{k}.")})  # fmt: skip
        if not clash:
            continue
        if key in HONOURED and cfg.experiment.get("lr_sweep") is None and not o.is_delete():
            for entry in grid:
                if key in (entry.get("set") or {}):
                    entry.set[key] = OmegaConf.select(cfg, key)
            continue
        why = (
            f"{name}'s validation sweep chooses it per setting (experiment.lr_sweep)"
            if key == LR and cfg.experiment.get("lr_sweep") is not None
            else f"the {name} grid sets {', '.join(clash)} per setting, as what it compares"
        )
        where = (
            "choose the grid with experiment.methods=[...], experiment.batch_sizes=[...], experiment.lr=[...] and "
            "experiment.epochs=[...]"
            if cfg.experiment.get("methods") is not None
            else f"change the grid in conf/experiment/{name}.yaml (or its preset file)"
        )
        raise UserError(f"{key} cannot be overridden: {why}; {where} (`normprop config {name}` shows every run)")


def method_grid(experiment: DictConfig) -> list[dict]:
    """The grid of an experiment that compares `methods` (nn.methods.METHODS) at `batch_sizes`: one
    setting <method>-b<batch size> each, at the rate `lr[i]` of its batch size times the method's
    `lr_scale` (default 1), the centre of its learning-rate sweep. Optional `epochs` and
    `lr_halve_every`, one per batch size, set those per batch size (a batch of 50 takes 1/50 of the
    updates of a batch of 1 per epoch); else every setting trains train.epochs. `extra_seeds`, {setting:
    K}, gives a setting K seeds more than the others (e.g. {normprop-icml-b50: 2}: where a comparison at
    batch 50 needs 5 seeds a side); a setting that is not in the grid is refused."""
    methods, sizes, rates = list(experiment.methods), list(experiment.batch_sizes), list(experiment.lr)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise UserError(
            f"experiment.methods: {', '.join(map(str, unknown))} not known; use some of {', '.join(METHODS)}"
        )
    per_size = {"lr": rates} | {k: list(experiment[k]) for k in ("epochs", "lr_halve_every") if experiment.get(k)}
    for key, values in per_size.items():
        if len(values) != len(sizes) or not sizes:
            raise UserError(
                f"experiment.{key} gives {len(values)} values for {len(sizes)} batch sizes ({sizes}); give one per "
                "batch size"
            )
    scale = experiment.get("lr_scale") or {}
    extra = dict(experiment.get("extra_seeds") or {})
    ids = {f"{m}-b{int(bs)}" for m in methods for bs in sizes}
    if unknown := sorted(set(extra) - ids):
        raise UserError(f"experiment.extra_seeds names {', '.join(unknown)}, not settings of the grid; use some of "
                        f"{', '.join(sorted(ids))}")  # fmt: skip
    grid = []
    for i, bs in enumerate(sizes):
        schedule = {f"train.{k}": int(per_size[k][i]) for k in ("epochs", "lr_halve_every") if k in per_size}
        for m in methods:
            lr = float(f"{float(rates[i]) * float(scale.get(m, 1.0)):.6g}")
            sets = {"method": m} | settings(m) | {"train.batch_size": int(bs), LR: lr} | schedule
            entry = {"id": f"{m}-b{int(bs)}", "set": sets}
            grid.append(entry | ({"extra_seeds": int(extra[entry["id"]])} if entry["id"] in extra else {}))
    return grid
