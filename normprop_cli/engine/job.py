"""One run of a grid, below the schedulers: check its settings, load its data, train it.

engine.sweep (one after another), engine.parallel (worker processes) and engine.launch (submitit
jobs) all train a run through `train_one`; none of them imports another to do so.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from normprop_cli.data import DataError, available_datasets, load_dataset
from normprop_cli.data.augment import AUGMENTATIONS
from normprop_cli.engine.runs import RunSpec, read_manifest, run_dir
from normprop_cli.engine.trainer import Observer, Progress, train_run
from normprop_cli.errors import UserError
from normprop_cli.nn import ACTIVATIONS, JACOBIAN_MODES, NORMS
from normprop_cli.nn.nin import option_problem
from normprop_cli.nn.stats import PARAMETRIC

LAUNCHERS = ("none", "local", "slurm")


def validate(spec: RunSpec) -> None:
    """Impossible settings are one-line errors before anything is written."""
    t, name = spec.cfg.train, spec.name
    checks = [
        (int(t.batch_size) >= 1, f"train.batch_size must be at least 1, got {t.batch_size}"),
        (float(t.lr) > 0, f"train.lr must be positive, got {t.lr}"),
        (int(t.epochs) >= 1, f"train.epochs must be at least 1, got {t.epochs}"),
        (int(t.lr_halve_every) >= 1, f"train.lr_halve_every must be at least 1, got {t.lr_halve_every}"),
        (float(t.weight_decay) >= 0, f"train.weight_decay must be >= 0, got {t.weight_decay}"),
        (0 <= float(t.momentum) < 1, f"train.momentum must be in [0, 1), got {t.momentum}"),
        (int(t.eval_batch_size) >= 1, f"train.eval_batch_size must be at least 1, got {t.eval_batch_size}"),
        (float(spec.cfg.model.width) > 0, f"model.width must be positive, got {spec.cfg.model.width}"),
        (
            not (t.data_norm == "batch" and int(t.batch_size) == 1),
            f"run {name}: batch data normalisation needs a batch of 2 or more; use train.data_norm=global "
            "at batch size 1 (as the paper does, section 5.4)",
        ),
    ]
    augment = spec.cfg.dataset.get("augment", "flip")
    checks.append(
        (
            not (t.augment and augment == "none"),
            f"run {name}: train.augment=true, but {spec.cfg.dataset.name} has no augmentation (dataset.augment=none, "
            "as in the paper); drop train.augment=true or set dataset.augment=flip|translate",
        )
    )
    for ok, message in checks:
        if not ok:
            raise UserError(message)
    for key, known in (
        ("model.norm", tuple(NORMS)),
        ("train.data_norm", ("global", "batch")),
        ("model.jacobian", JACOBIAN_MODES),
        ("model.activation", (*ACTIVATIONS, *PARAMETRIC)),
        ("dataset.augment", AUGMENTATIONS),
    ):
        value = OmegaConf.select(spec.cfg, key)
        if value not in known:
            raise UserError(f"{key}={value} is not known; use one of {', '.join(known)}")
    m = spec.cfg.model
    problem = option_problem(m.norm, m.activation, bool(m.get("data_init")))
    if problem:
        raise UserError(f"run {name}: {problem}")


def load_data(cfg: DictConfig, device):
    try:
        data = load_dataset(
            cfg.dataset.name,
            data_dir=cfg.data_dir,
            download=bool(cfg.download),
            split_seed=int(cfg.dataset.split_seed),
            limit=cfg.dataset.limit,
        )
    except DataError as exc:
        raise UserError(str(exc)) from None
    return data.to(device)


def check_data(cfg: DictConfig) -> None:
    """Workers load the data set themselves: fetch it once, or fail on it, before any starts."""
    if cfg.download or not available_datasets(cfg.data_dir).get(cfg.dataset.name, False):
        load_data(cfg, torch.device("cpu"))


def finished(spec: RunSpec) -> bool:
    return (read_manifest(run_dir(spec.cfg, spec.name)) or {}).get("status") in ("complete", "diverged")


def train_one(spec: RunSpec, data, device, progress: Progress, observers: Sequence[Observer]) -> dict:
    """train_run, with BatchNorm's refusal of a single value per channel as a one-line error."""
    try:
        return train_run(spec, data, device, progress, observers)
    except ValueError as exc:
        if "value per channel" in str(exc) or "batch size" in str(exc):
            raise UserError(f"run {spec.name}: {str(exc).splitlines()[0]}") from None
        raise
