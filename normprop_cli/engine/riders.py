"""Runs that ride along another run's training (trainer.train_run's `riders`): runs of several experiments
that train one trajectory (runs.trajectory: the same config, seed and threads; their own epochs and observers)
are trained once, by the one with the most epochs (engine.plan decides which ride). A rider's observers read
the model at epoch 0 and after each of its epochs, and at its last epoch it writes what its own training would
have written: its config, checkpoint, tables and manifest, the manifest naming the run it rode along
(`trained_with`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from omegaconf import DictConfig, OmegaConf

from normprop_cli import io
from normprop_cli.engine.runs import CHECKPOINT, CONFIG, MANIFEST, RunSpec, identity, now, run_dir, write_tables

Batches = Callable[[DictConfig], Callable[[], Iterator]]  # a run's config -> what its observers see


class Run(Protocol):
    """What riders read of the run they ride along: trainer.Run, which imports this module."""

    model: torch.nn.Module
    data_norm: torch.nn.Module
    history: list[dict]
    extra: dict[str, list[dict]]
    epoch: int

    def state(self) -> dict: ...


@dataclass(eq=False)
class Rider:
    """A fresh run of the trained run's trajectory with as many epochs or fewer (module docstring)."""

    spec: RunSpec
    observers: Sequence[Any]  # trainer.Observer, which this module cannot import (trainer imports it)
    progress: Any  # trainer.Progress, likewise
    extra: dict[str, list[dict]] = field(init=False)  # its observers' rows
    manifest: dict | None = field(init=False, default=None)  # once written

    def __post_init__(self) -> None:
        self.extra = {o.name: [] for o in self.observers}

    @property
    def path(self) -> Path:
        return run_dir(self.spec.cfg, self.spec.name)


def observe(run: Run, observers: Sequence[Any], riders: Sequence[Rider], batches: Batches, cfg: DictConfig) -> None:
    """The run's observers on the model at epoch `run.epoch`, then those of every rider still to finish. A
    rider trained alone would have been observed on the state the epoch left, so where riders go along no
    observer may change it (the model's and data normalisation's tensors, the CPU random generator): a
    RuntimeError, the fault of that observer."""
    pending = [r for r in riders if r.manifest is None]
    state = _state_now(run) if pending else None
    for name, observing, extra, run_cfg in [(cfg.run.name, observers, run.extra, cfg)] + [
        (r.spec.name, r.observers, r.extra, r.spec.cfg) for r in pending
    ]:
        for o in observing:
            extra.setdefault(o.name, []).extend(o.observe(run.model, batches(run_cfg), run.epoch))
        if state is not None and not _same_state(state, _state_now(run)):
            raise RuntimeError(f"an observer of run {name} changed the model it observed, so no run can ride along")


def _state_now(run: Run) -> list[torch.Tensor]:
    tensors = [*run.model.state_dict().values(), *run.data_norm.state_dict().values(), torch.get_rng_state()]
    return [t.detach().clone() for t in tensors]


def _same_state(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def finish(run: Run, path: Path, manifest: dict, riders: Sequence[Rider]) -> None:
    """Write each rider whose last epoch is `run.epoch`, or, once the run (in `path`) has diverged, every rider
    not yet written: its config, checkpoint, tables and manifest, as its own training would have left them (a
    diverged rider the run's last checkpoint, from before the epoch that diverged)."""
    diverged = manifest.get("status") == "diverged"
    for r in riders:
        epochs = int(r.spec.cfg.train.epochs)
        if r.manifest is not None or not (diverged or epochs == run.epoch):
            continue
        observed = {o.name: o.state_dict() for o in r.observers if hasattr(o, "state_dict")}
        if not diverged:
            state = run.state()
        elif (path / CHECKPOINT).exists():
            state = torch.load(path / CHECKPOINT, map_location="cpu", weights_only=True)
        else:
            state = None  # diverged in its first epoch: no checkpoint, as on its own
        io.write_text(r.path / CONFIG, OmegaConf.to_yaml(r.spec.run_cfg))
        history = [dict(row) for row in run.history]
        if state is not None:
            io.save_torch(r.path / CHECKPOINT, state | {"history": history, "extra": r.extra, "observers": observed})
        write_tables(r.path, history, r.extra)
        stamp = now()
        r.manifest = (
            manifest
            | identity(r.spec)
            | {
                "status": manifest["status"] if diverged else "complete",
                "epochs_done": run.epoch,
                "resumed_from_epoch": None,
                "trained_with": f"{manifest['experiment']}/{manifest['run']}",
                "finished": stamp,
                "updated": stamp,
            }
        )
        io.write_json(r.path / MANIFEST, r.manifest)
        if history:
            r.progress.epoch(history[-1])
        r.progress.finish(r.manifest)
