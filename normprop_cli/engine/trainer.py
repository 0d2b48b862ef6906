"""One run, start to finish (section 4.4): SGD with momentum, the learning rate halved every N epochs,
NormProp's unit-norm constraint after every step, evaluation after every epoch, and after every epoch
an atomic checkpoint, metrics.csv and manifest.json so that a run can always be resumed exactly."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pandas as pd
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from normprop_cli import io
from normprop_cli.data import Dataset, make_data_norm, to_float
from normprop_cli.device import synchronize
from normprop_cli.engine.runs import (CHECKPOINT, CONFIG, MANIFEST, METRICS, RunSpec, check_same_config,
                                      commit, now, read_manifest, run_dir, versions)
from normprop_cli.errors import UserError
from normprop_cli.nn import NIN, constrain_unit_norm_

MODELS = {"nin": NIN}
METRIC_COLUMNS = ["epoch", "lr", "train_loss", "train_acc", "train_seconds", "images_per_second",
                  "val_loss", "val_acc", "test_loss", "test_acc", "epoch_seconds"]


class Observer(Protocol):
    """Something measured on the model before training and after every epoch (e.g. Fig. 2's units)."""

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

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "data_norm": self.data_norm.state_dict(),
                "optimizer": self.optimizer.state_dict(), "history": self.history,
                "extra": self.extra, "epoch": self.epoch}

    def load(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.data_norm.load_state_dict(state["data_norm"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.history, self.extra, self.epoch = state["history"], state["extra"], state["epoch"]


def build_model(model_cfg: DictConfig, data: Dataset) -> torch.nn.Module:
    kwargs = {k: v for k, v in OmegaConf.to_container(model_cfg).items() if k != "arch"}
    return MODELS[model_cfg.arch](num_classes=data.num_classes, in_channels=data.in_channels, **kwargs)


def train_run(spec: RunSpec, data: Dataset, device: torch.device, progress: Progress,
              observers: Sequence[Observer] = ()) -> dict:
    """Train one run to its last epoch, resuming from its checkpoint; return its manifest."""
    cfg, t = spec.cfg, spec.cfg.train
    path = run_dir(cfg, spec.name)
    manifest = read_manifest(path)
    if manifest and manifest.get("status") in ("complete", "diverged"):
        return manifest
    check_same_config(spec, path)

    torch.manual_seed(spec.seed)
    model = build_model(cfg.model, data).to(device)
    run = Run(model=model, data_norm=make_data_norm(t.data_norm, data.train.x).to(device),
              optimizer=torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum,
                                        weight_decay=t.weight_decay),
              history=[], extra={o.name: [] for o in observers})
    normprop = cfg.model.norm == "normprop"
    if (path / CHECKPOINT).exists():
        run.load(torch.load(path / CHECKPOINT, map_location=device, weights_only=True))
    else:
        io.write_text(path / CONFIG, OmegaConf.to_yaml(spec.run_cfg))
        for o in observers:
            run.extra[o.name] += o.observe(model, eval_batches(run, data, cfg), 0)
    manifest = (manifest or {}) | {
        "run": spec.name, "setting": spec.setting, "experiment": cfg.experiment.name,
        "dataset": cfg.dataset.name, "preset": cfg.preset.name, "method": cfg.model.norm,
        "seed": spec.seed, "status": "running",
        "epochs": int(t.epochs), "epochs_done": run.epoch, "device": str(device), "commit": commit(),
        "versions": versions(), "host": _host(), "dataset_info": data.info}
    manifest.setdefault("started", now())
    manifest["resumed_from_epoch"] = run.epoch if run.epoch else None
    io.write_json(path / MANIFEST, manifest)

    steps = steps_per_epoch(len(data.train), t.batch_size)
    progress.start(spec, int(t.epochs), steps, run.epoch)
    while run.epoch < t.epochs:
        row = train_epoch(run, data, cfg, device, progress, normprop)
        if not math.isfinite(row["train_loss"]):
            manifest |= {"status": "diverged", "diverged_at_epoch": run.epoch + 1}
            break
        row |= evaluate(run, data, cfg)
        row["epoch_seconds"] = time.perf_counter() - row.pop("_t0")
        run.history.append(row)
        run.epoch += 1
        for o in observers:
            run.extra[o.name] += o.observe(model, eval_batches(run, data, cfg), run.epoch)
        io.save_torch(path / CHECKPOINT, run.state())
        _write_tables(path, run)
        manifest |= {"epochs_done": run.epoch, "updated": now()}
        io.write_json(path / MANIFEST, manifest)
        progress.epoch(row)
    else:
        manifest["status"] = "complete"
    _write_tables(path, run)
    manifest |= {"finished": now(), "updated": now()}
    io.write_json(path / MANIFEST, manifest)
    progress.finish(manifest)
    return manifest


def steps_per_epoch(n: int, batch_size: int) -> int:
    return n // batch_size if batch_size > 1 else n


def train_epoch(run: Run, data: Dataset, cfg: DictConfig, device: torch.device, progress: Progress,
                normprop: bool) -> dict:
    """One pass over the training set; one host synchronisation, at the end."""
    t = cfg.train
    t0 = time.perf_counter()
    lr = t.lr * 0.5 ** (run.epoch // t.lr_halve_every)  # halved every N epochs (section 4.4)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    # The epoch's shuffle and flips come from (seed, epoch) alone, so a resumed run repeats them.
    gen = torch.Generator().manual_seed(int(cfg.seed) * 1_000_003 + run.epoch)
    n, bs = len(data.train), int(t.batch_size)
    order = torch.randperm(n, generator=gen).to(device)
    flips = (torch.rand(n, generator=gen) < 0.5).to(device) if t.augment else None
    steps = steps_per_epoch(n, bs)
    run.model.train()
    run.data_norm.train()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    for step in range(steps):
        idx = order[step * bs:(step + 1) * bs]
        x = data.train.x[idx]
        if flips is not None:
            x = torch.where(flips[step * bs:(step + 1) * bs, None, None, None], x.flip(-1), x)
        y = data.train.y[idx]
        logits = run.model(run.data_norm(to_float(x)))
        loss = F.cross_entropy(logits, y)
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        run.optimizer.step()
        if normprop:
            constrain_unit_norm_(run.model)  # section 4.4
        loss_sum += loss.detach() * len(idx)
        correct += (logits.detach().argmax(1) == y).sum()
        progress.step(1)
    synchronize(device)
    seen = steps * bs if bs > 1 else n
    train_seconds = time.perf_counter() - t0
    return {"epoch": run.epoch + 1, "lr": lr, "train_loss": loss_sum.item() / seen,
            "train_acc": 100.0 * correct.item() / seen, "train_seconds": train_seconds,
            "images_per_second": seen / train_seconds, "_t0": t0}


def eval_batches(run: Run, data: Dataset, cfg: DictConfig, split: str = "test") -> Callable[[], Iterator]:
    """A callable yielding (normalised input, label) batches of a split, in evaluation mode."""
    part = getattr(data, split)
    bs = int(cfg.train.eval_batch_size)

    def batches():
        run.data_norm.eval()
        for i in range(0, len(part), bs):
            yield run.data_norm(to_float(part.x[i:i + bs])), part.y[i:i + bs]

    return batches


@torch.no_grad()
def evaluate(run: Run, data: Dataset, cfg: DictConfig) -> dict:
    """Loss and accuracy (%) on the validation and test sets (section 4.5)."""
    run.model.eval()
    out = {}
    for split in ("val", "test"):
        loss_sum = torch.zeros((), device=data.test.x.device)
        correct = torch.zeros((), device=data.test.x.device, dtype=torch.long)
        n = 0
        for x, y in eval_batches(run, data, cfg, split)():
            logits = run.model(x)
            loss_sum += F.cross_entropy(logits, y, reduction="sum")
            correct += (logits.argmax(1) == y).sum()
            n += len(y)
        out[f"{split}_loss"] = loss_sum.item() / max(n, 1)
        out[f"{split}_acc"] = 100.0 * correct.item() / max(n, 1)
    return out


def _write_tables(path: Path, run: Run) -> None:
    io.write_csv(path / METRICS, pd.DataFrame(run.history, columns=METRIC_COLUMNS))
    for name, rows in run.extra.items():
        io.write_csv(path / f"{name}.csv", pd.DataFrame(rows))


def _host() -> str:
    import socket

    return socket.gethostname()

