"""One run, start to finish (section 4.4): SGD with momentum, the learning rate halved every N epochs,
NormProp's unit-norm constraint after every step, evaluation after every epoch, and after every epoch
an atomic checkpoint, metrics.csv and manifest.json so that a run can always be resumed exactly.

While a run is unfinished the checkpoint before the newest is kept (checkpoint.prev.pt): a damaged newest
one costs one epoch, retrained exactly. A finished run (complete or diverged) deletes it: its checkpoint.pt,
written before its manifest says it finished, is what its tables are rebuilt from (a damaged one is a one-line
error: delete the run to train it again). A run trains under its lock (engine.lock): one process at a time."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from normprop_cli import io
from normprop_cli.data import Dataset, make_data_norm, to_float
from normprop_cli.data.augment import augment_batch, draw_augmentation
from normprop_cli.device import describe, synchronize
from normprop_cli.engine import ledger, lock
from normprop_cli.engine.riders import Rider, finish, observe
from normprop_cli.engine.runs import (
    CHECKPOINT,
    CONFIG,
    DAMAGED,
    FINISHED,
    MANIFEST,
    PREVIOUS,
    RunSpec,
    check_same_config,
    commit,
    extends,
    identity,
    load_checkpoint,
    now,
    read_manifest,
    run_dir,
    say,
    tables_problem,
    versions,
    write_tables,
)
from normprop_cli.engine.step import StepOptions, make_optimizer, make_step, set_lr
from normprop_cli.nn import NIN
from normprop_cli.nn.layers import has_normprop_layers
from normprop_cli.nn.methods import method_of
from normprop_cli.nn.nin import NINConfig
from normprop_cli.nn.normalizers import renorm_in_steps

MODELS = {"nin": (NIN, NINConfig)}  # arch: (model, its typed config)
DATA_INIT_IMAGES = 256  # the batch of weight normalisation's data-dependent initialisation


class Observer(Protocol):
    """Something measured on the model before training and after every epoch (e.g. Fig. 2's units).

    An observer that must remember something across epochs (e.g. each unit's value at
    initialisation) may also define `state_dict() -> dict` and `load_state_dict(state)`: the trainer
    keeps that state in the run's checkpoint, so a resumed run observes exactly as an uninterrupted
    one (tensors, numbers, strings, lists and dicts only: checkpoints load with weights_only=True)."""

    name: str  # rows go to runs/<run>/<name>.csv

    def observe(self, model: torch.nn.Module, batches: Callable[[], Iterator], epoch: int) -> list[dict]: ...


class Progress(Protocol):
    def start(self, spec: RunSpec, epochs: int, steps_per_epoch: int, done: int) -> None: ...
    def step(self, n: int) -> None: ...
    def epoch(self, row: dict) -> None: ...
    def finish(self, manifest: dict) -> None: ...


@dataclass
class Run:
    """Everything a run's epochs change; a checkpoint is exactly this."""

    model: torch.nn.Module
    data_norm: torch.nn.Module
    optimizer: torch.optim.Optimizer
    history: list[dict]
    extra: dict[str, list[dict]]
    epoch: int = 0
    step: Callable | None = None  # engine.step.make_step; not part of the checkpoint
    observers: Sequence[Observer] = ()

    def state(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "data_norm": self.data_norm.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "history": self.history,
            "extra": self.extra,
            "epoch": self.epoch,
            "observers": {o.name: o.state_dict() for o in self.observers if hasattr(o, "state_dict")},
        }

    def load(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.data_norm.load_state_dict(state["data_norm"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.history, self.extra, self.epoch = state["history"], state["extra"], state["epoch"]
        for o in self.observers:
            if hasattr(o, "load_state_dict") and o.name in state.get("observers", {}):
                o.load_state_dict(state["observers"][o.name])


def model_config(model_cfg: DictConfig) -> NINConfig:
    """The YAML's model as its architecture's typed config; an unknown arch or option is a ValueError."""
    options = OmegaConf.to_container(model_cfg, resolve=True)
    arch = options.pop("arch", "nin")
    if arch not in MODELS:
        raise ValueError(f"model.arch={arch} is not known; use one of {', '.join(MODELS)}")
    return MODELS[arch][1].from_dict(options)


def build_model(model_cfg: DictConfig, data: Dataset, steps_per_epoch: int | None = None) -> torch.nn.Module:
    """The model of `model_cfg` for `data`; `steps_per_epoch` turns a Batch Renormalization schedule
    given in epochs into steps (normalizers.renorm_in_steps)."""
    model, _ = MODELS[model_cfg.get("arch", "nin")]
    config = model_config(model_cfg)
    if getattr(config, "renorm", None):
        config = replace(config, renorm=renorm_in_steps(config.renorm, steps_per_epoch))
    return model(num_classes=data.num_classes, in_channels=data.in_channels, config=config)


def train_run(
    spec: RunSpec, data: Dataset, device: torch.device, progress: Progress, observers: Sequence[Observer] = (),
    riders: Sequence[Rider] = (),
) -> dict:  # fmt: skip
    """Train one run to its last epoch, resuming from its checkpoint; return its manifest. A run another
    process holds is waited for; one it finished is returned as it is.

    `riders` (engine.plan's choice): fresh runs of its trajectory with no more epochs than it, trained along
    it (Rider: each one's manifest lands in its `manifest`). A rider that is no longer fresh once the locks
    are held (another process began it meanwhile) trains on its own afterwards, as does every rider of a run
    that is itself no longer fresh."""
    if any(int(r.spec.cfg.train.epochs) > int(spec.cfg.train.epochs) for r in riders):
        raise ValueError(f"a rider of run {spec.name} has more epochs than it")
    path = run_dir(spec.cfg, spec.name)
    with contextlib.ExitStack() as held:
        for r in riders:
            held.enter_context(lock.hold(r.path, r.spec.name))
        held.enter_context(lock.hold(path, spec.name))
        along = [r for r in riders if read_manifest(r.path) is None] if read_manifest(path) is None else []
        for r in along:
            ledger.keep_earlier(Path(r.spec.cfg.results_dir), r.path, None)
        manifest = _train_locked(spec, path, data, device, progress, observers, along)
    for r in riders:
        if r not in along:
            r.manifest = train_run(r.spec, data, device, r.progress, r.observers)
    return manifest


def _train_locked(
    spec: RunSpec, path: Path, data: Dataset, device: torch.device, progress: Progress, observers: Sequence[Observer],
    riders: Sequence[Rider] = (),
) -> dict:  # fmt: skip
    cfg, t = spec.cfg, spec.cfg.train
    manifest = read_manifest(path)
    if manifest and manifest.get("status") in FINISHED and not extends(spec, path, manifest):
        problem = tables_problem(path, manifest)
        if problem:  # a finished run's tables are rebuilt from its checkpoint, never trained again
            state = load_checkpoint(spec.name, path, device, f"{problem}, and ")
            write_tables(path, state["history"], state["extra"])
            say(f"run {spec.name}: {problem}; rebuilt from {CHECKPOINT} (epoch {state['epoch']})")
        (path / PREVIOUS).unlink(missing_ok=True)  # left by a run that finished before finished runs dropped it
        return manifest
    check_same_config(spec, path)
    ledger.keep_earlier(Path(cfg.results_dir), path, manifest)

    torch.manual_seed(spec.seed)
    run = make_run(cfg, data, device, observers)
    batches = partial(probe_batches, run, data)  # what a run's observers see, by its config
    damaged = bool(manifest) and manifest.get("status") == DAMAGED
    needed = f"{MANIFEST} is damaged ({manifest['problem']}), and " if damaged else ""
    state = load_checkpoint(spec.name, path, device, needed)  # a damaged manifest needs one to rebuild from
    if damaged:
        say(
            f"run {spec.name}: {MANIFEST} is damaged ({manifest['problem']}); rebuilt from {CHECKPOINT} "
            f"(epoch {state['epoch']} of {t.epochs})"
        )
        manifest = None
    if state is not None:
        run.load(state)
        write_tables(path, run.history, run.extra)  # those of the epoch resumed from, whatever came after
    else:
        io.write_text(path / CONFIG, OmegaConf.to_yaml(spec.run_cfg))
        observe(run, observers, riders, batches, cfg)
    manifest = (
        (manifest or {})
        | identity(spec)
        | {
            "status": "running",
            "epochs_done": run.epoch,
            "device": str(device),
            "device_name": describe(device),
            "deterministic": bool(cfg.get("deterministic", False)),  # --deterministic (device.prepare)
            "commit": commit(),
            "diff_sha256": ledger.diff_hash(),  # what the code differs from that commit by (None: nothing)
            "versions": versions(),
            "host": _host(),
            "dataset_info": data.info,
        }
    )
    manifest.setdefault("started", now())
    manifest["resumed_from_epoch"] = run.epoch if run.epoch else None
    io.write_json(path / MANIFEST, manifest)

    steps = epoch_steps(t, len(data.train))
    progress.start(spec, int(t.epochs), steps, run.epoch)
    while run.epoch < t.epochs:
        row = train_epoch(run, data, cfg, device, progress)
        if not math.isfinite(row["train_loss"]):
            manifest |= {"status": "diverged", "diverged_at_epoch": run.epoch + 1}
            break
        row |= evaluate(run, data, cfg)
        row["epoch_seconds"] = time.perf_counter() - row.pop("_t0")
        run.history.append(row)
        run.epoch += 1
        observe(run, observers, riders, batches, cfg)
        finish(run, path, manifest, riders)
        io.save_torch(path / CHECKPOINT, run.state(), keep=path / PREVIOUS)
        write_tables(path, run.history, run.extra)
        manifest |= {"epochs_done": run.epoch, "updated": now()}
        io.write_json(path / MANIFEST, manifest)
        progress.epoch(row)
    else:
        manifest["status"] = "complete"
    finish(run, path, manifest, riders)  # those left where the run diverged
    write_tables(path, run.history, run.extra)
    manifest |= {"finished": now(), "updated": now()}
    io.write_json(path / MANIFEST, manifest)
    (path / PREVIOUS).unlink(missing_ok=True)  # kept only while the run is unfinished (module docstring)
    progress.finish(manifest)
    return manifest


def make_run(cfg: DictConfig, data: Dataset, device: torch.device, observers: Sequence[Observer] = ()) -> Run:
    """A fresh run: the model, its data normalisation, SGD (section 4.4) and the training step."""
    t, options = cfg.train, StepOptions.from_cfg(cfg.train, device)
    model = build_model(cfg.model, data, epoch_steps(t, len(data.train))).to(device)
    if options.channels_last:
        model = model.to(memory_format=torch.channels_last)
    data_norm = make_data_norm(t.data_norm, data.train.x).to(device)
    if getattr(model, "data_init", False):  # weight normalisation's data-dependent initialisation
        gen = torch.Generator().manual_seed(int(cfg.seed))
        pick = torch.randperm(len(data.train), generator=gen)[:DATA_INIT_IMAGES].to(data.train.x.device)
        saved = {k: v.clone() for k, v in data_norm.state_dict().items()}
        with torch.no_grad():  # the batch as training sees it; batch data normalisation's estimates kept
            model.initialize(data_norm(to_float(data.train.x[pick])))
        data_norm.load_state_dict(saved)
    optimizer = make_optimizer(model, t.lr, t.momentum, t.weight_decay, device, t.get("decay", "all"))
    name = cfg.get("method") or method_of(cfg.model)
    step = make_step(model, data_norm, optimizer, has_normprop_layers(model), options, t.get("agc"), name)
    return Run(
        model=model,
        data_norm=data_norm,
        optimizer=optimizer,
        history=[],
        extra={o.name: [] for o in observers},
        step=step,
        observers=tuple(observers),
    )


def steps_per_epoch(n: int, batch_size: int) -> int:
    return n // batch_size if batch_size > 1 else n


def epoch_steps(train: DictConfig, n: int) -> int:
    """SGD steps in an epoch of n training images: n // batch_size (the last, shorter batch dropped),
    at most `train.max_steps` where that is set (then each epoch takes the first max_steps batches of
    its own permutation: e.g. batch 1 with as many updates as a larger batch, C4 at equal updates)."""
    steps = steps_per_epoch(n, int(train.batch_size))
    cap = train.get("max_steps")
    return min(steps, int(cap)) if cap else steps


def train_epoch(run: Run, data: Dataset, cfg: DictConfig, device: torch.device, progress: Progress) -> dict:
    """One pass over the training set; one host synchronisation, at the end."""
    t = cfg.train
    t0 = time.perf_counter()
    lr = t.lr * 0.5 ** (run.epoch // t.lr_halve_every)  # halved every N epochs (section 4.4)
    set_lr(run.optimizer, lr)
    # The epoch's shuffle and augmentation come from (seed, epoch) alone, so a resumed run repeats them.
    gen = torch.Generator().manual_seed(int(cfg.seed) * 1_000_003 + run.epoch)
    n, bs = len(data.train), int(t.batch_size)
    order = torch.randperm(n, generator=gen).to(device)
    drawn = augmentation(cfg, n, gen, device)
    max_shift = int(cfg.dataset.get("translate_pixels", 0))  # the translations' bound: no read-back per batch
    steps = epoch_steps(t, n)
    run.model.train()
    run.data_norm.train()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    for step in range(steps):
        idx = order[step * bs : (step + 1) * bs]
        x = data.train.x[idx]
        if drawn is not None:
            x = augment_batch(x, drawn[step * bs : (step + 1) * bs], max_shift)
        loss, right = run.step(x, data.train.y[idx])
        loss_sum += loss * len(idx)
        correct += right
        progress.step(1)
    synchronize(device)
    seen = steps * bs
    train_seconds = time.perf_counter() - t0
    loss_total, right_total = torch.stack([loss_sum.double(), correct.double()]).tolist()
    return {
        "epoch": run.epoch + 1,
        "lr": lr,
        "train_loss": loss_total / seen,
        "train_acc": 100.0 * right_total / seen,
        "train_seconds": train_seconds,
        "images_per_second": seen / train_seconds,
        "_t0": t0,
    }


def augmentation(cfg: DictConfig, n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor | None:
    """The epoch's draws (on the CPU generator) of the data set's augmentation, `dataset.augment`:
    flips for CIFAR, translations for digits; only when `train.augment` is true."""
    if not cfg.train.augment:
        return None
    kind = cfg.dataset.get("augment", "flip")
    drawn = draw_augmentation(kind, n, gen, int(cfg.dataset.get("translate_pixels", 0)))
    return None if drawn is None else drawn.to(device)


def eval_batches(
    run: Run, data: Dataset, cfg: DictConfig, split: str = "test", limit: int | None = None
) -> Callable[[], Iterator]:
    """A callable yielding (normalised input, label) batches of a split, in evaluation mode: its first
    `limit` images where that is set."""
    part = getattr(data, split)
    bs = int(cfg.train.eval_batch_size)
    n = len(part) if limit is None else min(int(limit), len(part))

    def batches():
        run.model.eval()  # observers see the evaluation-mode model; train_epoch switches back
        run.data_norm.eval()
        for i in range(0, n, bs):
            j = min(i + bs, n)
            yield run.data_norm(to_float(part.x[i:j])), part.y[i:j]

    return batches


def probe_batches(run: Run, data: Dataset, cfg: DictConfig) -> Callable[[], Iterator]:
    """What the observers (probes) see: the test set, or its first train.probe_images images (a
    per-unit mean and std needs a few thousand, not 10,000, and a probe pass costs an evaluation)."""
    return eval_batches(run, data, cfg, limit=cfg.train.get("probe_images"))


@torch.inference_mode()
def evaluate(run: Run, data: Dataset, cfg: DictConfig) -> dict:
    """Loss and accuracy (%) on the validation and test sets (section 4.5); one host sync."""
    run.model.eval()
    run.data_norm.eval()
    logits_of = run.step.logits if run.step is not None else lambda x: run.model(run.data_norm(x))
    sums, sizes, bs = [], [], int(cfg.train.eval_batch_size)
    scored = ("val", "test") if cfg.train.get("eval_test", True) else ("val",)
    for split in scored:
        part = getattr(data, split)
        loss_sum = torch.zeros((), device=part.x.device)
        correct = torch.zeros((), device=part.x.device, dtype=torch.long)
        for i in range(0, len(part), bs):
            logits, y = logits_of(part.x[i : i + bs]), part.y[i : i + bs]
            loss_sum += F.cross_entropy(logits, y, reduction="sum")
            correct += (logits.argmax(1) == y).sum()
        sums += [loss_sum.double(), correct.double()]
        sizes.append(max(len(part), 1))
    if len(scored) == 1:  # train.eval_test=false: the test set is not scored (NaN)
        sums, sizes = sums + [torch.tensor(math.nan, dtype=torch.float64, device=sums[0].device)] * 2, sizes + [1]
    (vl, vc, tl, tc), (nv, nt) = torch.stack(sums).tolist(), sizes
    return {"val_loss": vl / nv, "val_acc": 100.0 * vc / nv, "test_loss": tl / nt, "test_acc": 100.0 * tc / nt}


def _host() -> str:
    import socket

    return socket.gethostname()
