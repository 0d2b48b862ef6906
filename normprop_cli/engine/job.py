"""One run of a grid, below the executors: check its settings (`validate`), load and check its data
(`load_data`, `check_ready`), say whether it is finished, train it (`train_one`).

engine.plan checks every run (`validate`, `finished`) before it plans; engine.executor's executors (in process, in
worker processes, and engine.launch's submitit jobs) load and check the data through this module and train
each task through the trainer; the timing experiment's rounds (experiments.interleave) train each run
through `train_one`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from omegaconf import DictConfig

from normprop_cli import io
from normprop_cli.data import DATA_NORMS, DataError, load_dataset
from normprop_cli.data.augment import AUGMENTATIONS
from normprop_cli.engine.runs import FINISHED, RunSpec, extends, read_manifest, run_dir, sweep_dir, tables_problem
from normprop_cli.engine.step import DECAY, SWITCHES
from normprop_cli.engine.trainer import Observer, Progress, model_config, train_run
from normprop_cli.errors import UserError
from normprop_cli.nn.nin import values_per_channel


def validate(spec: RunSpec) -> None:
    """Impossible settings are one-line errors before anything is written. The config's schema has
    checked the type of every key a user gives (normprop_cli/schema.py); here are the ranges and choices
    that a type cannot say, in one table. The registries decide what is known: nn's norms, Jacobian modes
    and activations (NINConfig.problem), data's normalisations and augmentations."""
    t, name = spec.cfg.train, spec.name
    augment = spec.cfg.dataset.get("augment", "flip")
    checks = [
        (int(t.batch_size) >= 1, f"train.batch_size must be at least 1, got {t.batch_size}"),
        (0 < float(t.lr) < math.inf, f"train.lr must be a positive finite number, got {t.lr}"),
        (int(t.epochs) >= 1, f"train.epochs must be at least 1, got {t.epochs}"),
        (int(t.lr_halve_every) >= 1, f"train.lr_halve_every must be at least 1, got {t.lr_halve_every}"),
        (float(t.weight_decay) >= 0, f"train.weight_decay must be >= 0, got {t.weight_decay}"),
        (0 <= float(t.momentum) < 1, f"train.momentum must be in [0, 1), got {t.momentum}"),
        (t.get("decay", "all") in DECAY, f"train.decay={t.get('decay')} is not known; use one of {', '.join(DECAY)}"),
        (t.get("agc") is None or float(t.agc) > 0, f"train.agc must be a positive factor or null, got {t.agc}"),
        (int(t.eval_batch_size) >= 1, f"train.eval_batch_size must be at least 1, got {t.eval_batch_size}"),
        *(
            (t.get(key, False) in SWITCHES, f"train.{key} must be true, false or auto, got {t.get(key)}")
            for key in ("channels_last", "cuda_graph")
        ),
        (
            not (t.data_norm == "batch" and int(t.batch_size) == 1),
            f"run {name}: batch data normalisation needs a batch of 2 or more; use train.data_norm=global "
            "at batch size 1 (as the paper does, section 5.4)",
        ),
        (
            not (t.augment and augment == "none"),
            f"run {name}: train.augment=true, but {spec.cfg.dataset.name} has no augmentation (dataset.augment=none, "
            "as in the paper); drop train.augment=true or set dataset.augment=flip|translate",
        ),
        *(
            (value in known, f"{key}={value} is not known; use one of {', '.join(known)}")
            for key, value, known in (
                ("train.data_norm", t.data_norm, tuple(DATA_NORMS)),
                ("dataset.augment", spec.cfg.dataset.get("augment"), AUGMENTATIONS),
            )
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise UserError(message)
    try:
        model = model_config(spec.cfg.model)
    except ValueError as exc:
        raise UserError(f"run {name}: {exc}") from None
    problem = model.problem()
    if problem:
        raise UserError(f"run {name}: {problem}")
    values = values_per_channel(model.norm, int(t.batch_size))
    if values is not None and values < 2:
        raise UserError(
            f"run {name}: model.norm={model.norm} at train.batch_size={t.batch_size} normalises {values} value per "
            "channel: no variance to divide by; use a larger batch or a batch-independent norm"
        )


def check_split(spec: RunSpec, data) -> None:
    """A training split smaller than one batch is refused before any run trains (no step to take)."""
    n, bs = len(data.train), int(spec.cfg.train.batch_size)
    if n < bs:
        raise UserError(
            f"run {spec.name}: the training split of {spec.cfg.dataset.name} has {n} image(s), fewer than "
            f"train.batch_size={bs}; lower train.batch_size or raise dataset.limit"
        )


def load_data(cfg: DictConfig, device):
    try:
        data = load_dataset(
            cfg.dataset.name,
            data_dir=cfg.data_dir,
            download=bool(cfg.download),
            split_seed=int(cfg.dataset.split_seed),
            limit=cfg.dataset.limit,
            train_limit=cfg.dataset.get("train_limit"),
        )
    except DataError as exc:
        raise UserError(str(exc)) from None
    return data.to(device)


def check_ready(cfg: DictConfig, specs: Sequence[RunSpec], data) -> None:
    """Before any run of `specs` trains: each one's training split holds a batch, and the results
    directory can be written."""
    for spec in specs:
        check_split(spec, data)
    io.check_writable(sweep_dir(cfg))


def check_data(cfg: DictConfig, specs: Sequence[RunSpec]) -> None:
    """Workers load the data set themselves: fetch it once, or fail on it, and check_ready, before
    any starts."""
    check_ready(cfg, specs, load_data(cfg, torch.device("cpu")))


def finished(spec: RunSpec) -> bool:
    """Complete or diverged, with the metrics.csv its manifest promises; a finished run whose tables
    are damaged goes to train_run, which rebuilds them from its checkpoint."""
    path = run_dir(spec.cfg, spec.name)
    manifest = read_manifest(path) or {}
    done = manifest.get("status") in FINISHED and not extends(spec, path, manifest)
    return done and tables_problem(path, manifest) is None


def train_one(spec: RunSpec, data, device, progress: Progress, observers: Sequence[Observer]) -> dict:
    """Train one run of the grid (resuming it), on the data set `data` loaded on `device`; the
    scheduler has checked it (check_ready) before any run started."""
    return train_run(spec, data, device, progress, observers)
