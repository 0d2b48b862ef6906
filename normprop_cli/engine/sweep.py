"""Run an experiment's grid: validate, load the data once, train each run, skip what is done.

Where the runs train is the config's choice: here one after another (the default), in `jobs`
worker processes (engine.parallel), or as submitit jobs, `launcher: local | slurm` (engine.launch).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from normprop_cli import device as devices
from normprop_cli.data import DataError, available_datasets, load_dataset
from normprop_cli.data.augment import AUGMENTATIONS
from normprop_cli.engine.progress import QuietProgress, console, make_progress
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


def run_sweep(
    cfg: DictConfig, specs: Sequence[RunSpec], observers: Callable[[RunSpec], Sequence[Observer]] = lambda spec: ()
) -> list[dict]:
    """Train every run of the grid; return their manifests.

    Complete and diverged runs are skipped; unfinished ones resume from their checkpoint.
    Ctrl-C keeps every finished epoch and says how to resume. `jobs` > 1 trains the runs in
    that many worker processes; `launcher: local` runs them as submitit jobs and waits for them;
    `launcher: slurm` submits them as a SLURM job array and exits (engine.launch).
    """
    jobs, launcher = int(cfg.get("jobs") or 1), OmegaConf.select(cfg, "launcher.name", default="none")
    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}")
    if launcher not in LAUNCHERS:
        raise UserError(f"unknown launcher '{launcher}'; known: {', '.join(LAUNCHERS)}")
    for spec in specs:
        validate(spec)
    # The jobs of a SLURM array pick their device on their node; a login node may have no GPU.
    device = devices.resolve(cfg.device) if launcher != "slurm" else None
    todo = [s for s in specs if not finished(s)]
    pending = {s.name for s in todo}
    if todo and (jobs > 1 or launcher != "none"):
        from normprop_cli.engine import launch, parallel

        check_data(cfg)
        progress = QuietProgress(len(specs))  # one line per finished run
        for spec in specs:
            if spec.name not in pending:
                progress.skip(spec, read_manifest(run_dir(spec.cfg, spec.name)))
        if launcher == "slurm":
            launch.submit_slurm(cfg, todo, observers)  # exits: the jobs run on the cluster
        elif launcher == "local":
            launch.run_local(cfg, todo, observers, progress)
        else:
            parallel.run_pool(cfg, todo, observers, progress)
        return [read_manifest(run_dir(s.cfg, s.name)) for s in specs]

    devices.prepare(device)
    data = load_data(cfg, device) if todo else None
    manifests = []
    with make_progress(len(specs), bool(cfg.quiet)) as progress:
        for spec in specs:
            if spec.name not in pending:
                manifest = read_manifest(run_dir(spec.cfg, spec.name))
                progress.skip(spec, manifest)
                manifests.append(manifest)
                continue
            try:
                manifests.append(train_one(spec, data, device, progress, observers(spec)))
            except KeyboardInterrupt:
                done = (read_manifest(run_dir(spec.cfg, spec.name)) or {}).get("epochs_done", 0)
                console.print(
                    f"interrupted: run {spec.name} kept {done} finished epoch(s); run the same command again to resume"
                )
                sys.exit(130)
    return manifests
