"""Run an experiment's grid: validate, load the data once, train each run, skip what is done."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from omegaconf import DictConfig, OmegaConf

from normprop_cli import device as devices
from normprop_cli.data import DataError, load_dataset
from normprop_cli.engine.progress import console, make_progress
from normprop_cli.engine.runs import RunSpec, read_manifest, run_dir
from normprop_cli.engine.trainer import Observer, train_run
from normprop_cli.errors import UserError


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
        (not (t.data_norm == "batch" and int(t.batch_size) == 1),
         f"run {name}: batch data normalisation needs a batch of 2 or more; use train.data_norm=global "
         "at batch size 1 (as the paper does, section 5.4)"),
    ]
    for ok, message in checks:
        if not ok:
            raise UserError(message)
    for key, known in (("model.norm", ("none", "batchnorm", "normprop")), ("train.data_norm", ("global", "batch")),
                       ("model.jacobian", ("divide", "init", "off"))):
        value = OmegaConf.select(spec.cfg, key)
        if value not in known:
            raise UserError(f"{key}={value} is not known; use one of {', '.join(known)}")


def load_data(cfg: DictConfig, device):
    try:
        data = load_dataset(cfg.dataset.name, data_dir=cfg.data_dir, download=bool(cfg.download),
                            split_seed=int(cfg.dataset.split_seed), limit=cfg.dataset.limit)
    except DataError as exc:
        raise UserError(str(exc)) from None
    return data.to(device)


def run_sweep(cfg: DictConfig, specs: Sequence[RunSpec],
              observers: Callable[[RunSpec], Sequence[Observer]] = lambda spec: ()) -> list[dict]:
    """Train every run of the grid in order; return their manifests.

    Complete and diverged runs are skipped; unfinished ones resume from their checkpoint.
    Ctrl-C keeps every finished epoch and says how to resume.
    """
    for spec in specs:
        validate(spec)
    device = devices.resolve(cfg.device)
    devices.prepare(device)
    todo = [s for s in specs if (read_manifest(run_dir(s.cfg, s.name)) or {}).get("status")
            not in ("complete", "diverged")]
    data = load_data(cfg, device) if todo else None
    manifests = []
    with make_progress(len(specs), bool(cfg.quiet)) as progress:
        for spec in specs:
            if spec not in todo:
                manifest = read_manifest(run_dir(spec.cfg, spec.name))
                progress.skip(spec, manifest)
                manifests.append(manifest)
                continue
            try:
                manifests.append(train_run(spec, data, device, progress, observers(spec)))
            except KeyboardInterrupt:
                done = (read_manifest(run_dir(spec.cfg, spec.name)) or {}).get("epochs_done", 0)
                console.print(f"interrupted: run {spec.name} kept {done} finished epoch(s); "
                              "run the same command again to resume")
                sys.exit(130)
            except ValueError as exc:  # e.g. BatchNorm asked to normalise a single value per channel
                if "value per channel" in str(exc) or "batch size" in str(exc):
                    raise UserError(f"run {spec.name}: {str(exc).splitlines()[0]}") from None
                raise
    return manifests
