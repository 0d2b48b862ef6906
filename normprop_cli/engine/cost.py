"""What a run of a grid still costs, counted without training or loading data: its SGD steps, the images
it trains on and evaluates, its checkpoints' bytes, and the step configuration (`StepKey`) whose time
prices it. `normprop run --dry-run` (experiments.plan) adds these up; the seconds come from step times
measured on a device or read from a file, per StepKey (bench.step_times).

A step's time depends on the method, the batch size, the NIN's width and the image's shape; a run whose
model is no registered method (an ablation: NormProp without its Jacobian factor, with frozen gains) is
priced as the registered method of its norm, and an activation other than ReLU as ReLU. Evaluation
(validation, test, the probes' passes) is priced per image at a third of a training step's time per image
at the largest batch timed for that method, width and shape (a backward pass costs about two forwards)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
from omegaconf import DictConfig, OmegaConf

from normprop_cli.data.sizes import SplitSizes, split_sizes
from normprop_cli.engine.job import finished
from normprop_cli.engine.runs import RunSpec, read_manifest, run_dir
from normprop_cli.engine.trainer import build_model, epoch_steps
from normprop_cli.errors import UserError
from normprop_cli.nn.methods import METHODS, method_of

FORWARD_SHARE = 3.0  # a training step costs about this many forward passes (forward + a backward of two)
CHECKPOINTS_KEPT = 1  # a finished run keeps checkpoint.pt (an unfinished one also checkpoint.prev.pt)


class StepKey(NamedTuple):
    """What a training step's time depends on: method, batch size, NIN width, image shape ("3x32x32")."""

    method: str
    batch_size: int
    width: float
    shape: str


@dataclass(frozen=True)
class RunCost:
    """The work a run has left: `epochs` to train, `steps` SGD steps over `train_images` images,
    `eval_images` scored in batches (validation, test, probes) and `single_images` one at a time
    (normalizers' training-mode score at batch 1), and the bytes of the checkpoints it keeps."""

    run: str
    sweep: bool
    key: StepKey
    epochs: int
    steps: int
    train_images: int
    eval_images: int
    single_images: int
    checkpoint_bytes: int


# (spec, first epoch, epochs left) -> (images the run's observers score in batches, images one at a time)
Observed = Callable[[RunSpec, int, int], tuple[int, int]]


def no_observers(spec: RunSpec, first: int, left: int) -> tuple[int, int]:
    return 0, 0


def sizes(cfg: DictConfig) -> SplitSizes:
    """The run's data set's split sizes and image shape, from constants (data.sizes): nothing loaded."""
    d = cfg.dataset
    try:
        return split_sizes(d.name, d.get("limit"), d.get("train_limit"))
    except ValueError as exc:
        raise UserError(str(exc)) from None


def step_method(cfg: DictConfig) -> str:
    """The registered method whose step prices a run: the grid's `method`, else the model's
    (nn.methods.method_of), else the first method of the model's norm."""
    name = cfg.get("method") or method_of(cfg.model)
    if name in METHODS:
        return name
    same = [m.name for m in METHODS.values() if m.norm == cfg.model.norm]
    return same[0] if same else name


def step_key(cfg: DictConfig) -> StepKey:
    return StepKey(step_method(cfg), int(cfg.train.batch_size), float(cfg.model.width), sizes(cfg).shape_text)


def epochs_done(spec: RunSpec) -> int | None:
    """The epochs a run has finished on disk; None where it needs no more (complete or diverged, as
    engine.job.finished says, which is what the sweep skips)."""
    if finished(spec):
        return None
    manifest = read_manifest(run_dir(spec.cfg, spec.name)) or {}
    return int(manifest.get("epochs_done") or 0) if manifest.get("status") != "damaged" else 0


def run_cost(spec: RunSpec, sweep: bool = False, observed: Observed = no_observers) -> RunCost | None:
    """What `spec` has left to do; None where it is finished."""
    done = epochs_done(spec)
    if done is None:
        return None
    t, s = spec.cfg.train, sizes(spec.cfg)
    left = max(0, int(t.epochs) - done)
    steps = left * epoch_steps(t, s.train)
    scored = s.val + (s.test if t.get("eval_test", True) else 0)
    batched, single = observed(spec, done, left)
    return RunCost(
        run=spec.name,
        sweep=sweep,
        key=step_key(spec.cfg),
        epochs=left,
        steps=steps,
        train_images=steps * int(t.batch_size),
        eval_images=left * scored + batched,
        single_images=single,
        checkpoint_bytes=checkpoint_bytes(spec.cfg, s) if left else 0,
    )


def checkpoint_bytes(cfg: DictConfig, s: SplitSizes) -> int:
    """A run's checkpoints on disk: the model's state and SGD's momentum (one per learnt parameter),
    times the checkpoints kept."""
    return CHECKPOINTS_KEPT * _state_bytes(OmegaConf.to_yaml(cfg.model), int(cfg.dataset.num_classes), s.shape[0])


@functools.lru_cache(maxsize=64)
def _state_bytes(model_yaml: str, num_classes: int, in_channels: int) -> int:
    class Shapes:  # what build_model reads of a data set
        pass

    data = Shapes()
    data.num_classes, data.in_channels = num_classes, in_channels
    torch.manual_seed(0)
    model = build_model(OmegaConf.create(model_yaml), data, 1)  # a renorm schedule's steps: no parameters
    tensors = [v for v in model.state_dict().values() if torch.is_tensor(v)]  # an oracle's extra state is a dict
    state = sum(v.numel() * v.element_size() for v in tensors)
    momentum = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return state + momentum


def forward_ms_per_image(key: StepKey, step_ms: Mapping[StepKey, float]) -> float:
    """The time of one image's forward pass in evaluation: a third of a step's time per image at the
    largest batch timed for the key's method, width and shape."""
    same = [k for k in step_ms if (k.method, k.width, k.shape) == (key.method, key.width, key.shape)]
    widest = max(same, key=lambda k: k.batch_size, default=key)
    return step_ms[widest] / widest.batch_size / FORWARD_SHARE


def seconds(cost: RunCost, step_ms: Mapping[StepKey, float]) -> float:
    """The run's time: its steps at its key's step time, its evaluation at forward_ms_per_image, its
    one-at-a-time images at a third of a batch-1 step."""
    ms = step_ms.get(cost.key, math.nan)
    batched = cost.eval_images * forward_ms_per_image(cost.key, step_ms) if cost.eval_images else 0.0
    single = cost.single_images * ms / cost.key.batch_size / FORWARD_SHARE if cost.single_images else 0.0
    return (cost.steps * ms + batched + single) / 1e3


def duration(s: float) -> str:
    """Seconds as a person reads them: 45 s, 12 min, 3.4 h."""
    if s != s:
        return "unknown"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"
