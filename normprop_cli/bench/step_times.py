"""Step times per configuration (engine.cost.StepKey: method, batch size, width, image shape) for a plan
(`normprop run --dry-run`, experiments.plan): measured here, a few steps of each configuration by the
bench's own clock (timing.step_times), or read from a CSV so that one machine projects another's time
(`--step-times FILE`, or NORMPROP_STEP_TIMES): a CPU projects a GPU from a committed GPU measurement.

The CSV is the bench's shape: `method`, `batch_size`, `width`, `step_ms` (or the bench's `step_ms_median`),
optionally `shape` ("3x32x32" where absent) and `precision` (only float32 rows are read); lines starting
with # are comments. One row per configuration. A configuration the file lacks is interpolated linearly
in the batch size between the two rows of the same method, width and shape around it (a step's time is
close to a fixed cost plus a cost per image), extrapolated from the two largest above them, and given the
smallest one's time below them; with fewer than two such rows it is an error naming it.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig

from normprop_cli import device as devices
from normprop_cli import io
from normprop_cli.engine.cost import StepKey
from normprop_cli.engine.step import StepOptions
from normprop_cli.errors import UserError

ENV = "NORMPROP_STEP_TIMES"  # the file --step-times reads, where the option is not given
COLUMNS = ["method", "batch_size", "width", "shape", "step_ms", "device", "options"]
DEFAULT_SHAPE = "3x32x32"


def read(path: str | Path) -> dict[StepKey, float]:
    """{StepKey: ms} of a step-times CSV (the module docstring's format); a UserError for a file that
    cannot be read, lacks a column or has two rows for one configuration."""
    path = Path(path)
    try:
        table = pd.read_csv(path, comment="#", skipinitialspace=True)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"--step-times {path}: cannot read it ({' '.join(str(exc).split())[:120]})") from None
    ms = "step_ms" if "step_ms" in table else "step_ms_median"
    lacking = [c for c in ("method", "batch_size", "width", ms) if c not in table]
    if lacking:
        raise UserError(f"--step-times {path}: no column {', '.join(lacking)}; it needs method, batch_size, width, "
                        "step_ms (or step_ms_median) and optionally shape")  # fmt: skip
    if "precision" in table:
        table = table[table["precision"] == "float32"]
    shapes = table["shape"] if "shape" in table else pd.Series(DEFAULT_SHAPE, index=table.index)
    known: dict[StepKey, float] = {}
    for row, shape in zip(table.itertuples(), shapes, strict=True):
        key = StepKey(str(row.method), int(row.batch_size), float(row.width), str(shape))
        if key in known:
            raise UserError(f"--step-times {path}: two rows for {describe_key(key)}; keep one per configuration")
        known[key] = float(getattr(row, ms))
    return known


def describe_key(key: StepKey) -> str:
    return f"{key.method} at batch {key.batch_size}, width {key.width:g}, {key.shape}"


def lookup(known: Mapping[StepKey, float], keys, source: str = "the step times") -> dict[StepKey, float]:
    """{key: ms} for every key of `keys`: the known time, else interpolated in the batch size (module
    docstring); a UserError naming the keys that cannot be."""
    out, missing = {}, []
    for key in keys:
        if key in known:
            out[key] = known[key]
            continue
        near = sorted((k for k in known if (k.method, k.width, k.shape) == (key.method, key.width, key.shape)),
                      key=lambda k: k.batch_size)  # fmt: skip
        if len(near) < 2:
            missing.append(key)
            continue
        below = [k for k in near if k.batch_size < key.batch_size]
        above = [k for k in near if k.batch_size > key.batch_size]
        if not below:
            out[key] = known[near[0]]
            continue
        a, b = (below[-1], above[0]) if above else (near[-2], near[-1])
        slope = (known[b] - known[a]) / (b.batch_size - a.batch_size)
        out[key] = known[a] + slope * (key.batch_size - a.batch_size)
    if missing:
        named = "; ".join(describe_key(k) for k in missing[:4]) + (
            f"; and {len(missing) - 4} more" * (len(missing) > 4)
        )
        raise UserError(f"{source} has no step time for {len(missing)} configuration(s) ({named}): add rows (two "
                        "batch sizes of a method, width and shape are interpolated), or leave out --step-times to "
                        "time them here")  # fmt: skip
    return out


def timing_data(shape: str, batch_size: int, dev: torch.device):
    """Synthetic images of `shape` ("CxHxW", 32x32) on `dev`, enough for the bench's batches."""
    from normprop_cli.data import load_dataset

    channels, *size = (int(v) for v in shape.split("x"))
    if size != [32, 32] or channels not in (1, 3):
        raise UserError(f"cannot time steps on images of shape {shape}: the NIN takes 1x32x32 or 3x32x32")
    data = load_dataset("synthetic", sizes=(max(64, 2 * batch_size), 1, 1))
    if channels != 3:
        data = replace(data, train=type(data.train)(data.train.x[:, :channels].contiguous(), data.train.y),
                       in_channels=channels)  # fmt: skip
    return data.to(dev)


def measure(needed: Mapping[StepKey, DictConfig], dev: torch.device, steps: int = 5, warmup: int = 2,
            options: StepOptions | None = None) -> dict[StepKey, float]:  # fmt: skip
    """{key: median ms of `steps` timed steps after `warmup`} on `dev`, each key's method stepped by the
    bench (timing.step_times, the methods of a batch size, width and shape side by side) on the model and
    options of its run config in `needed` (`options`: these instead, e.g. gpu-check's)."""
    from normprop_cli.bench.timing import step_times

    devices.prepare(dev)  # as a run does: on the CPU, denormals flushed (else a step can take many times longer)
    groups: dict[tuple, dict[str, DictConfig]] = {}
    for key, cfg in needed.items():
        groups.setdefault((key.batch_size, key.width, key.shape), {}).setdefault(key.method, cfg)
    out = {}
    for (bs, width, shape), own in groups.items():
        cfg = next(iter(own.values()))
        opts = options or StepOptions.from_cfg(cfg.train, dev)
        data, cfg = timing_data(shape, bs, dev), schedule_in_steps(cfg)
        own = {m: schedule_in_steps(c) for m, c in own.items()}  # each method on its own run's config
        times = step_times(data, cfg, dev, width, bs, steps, warmup, 0.0, opts, tuple(own), counted=False,
                           own=own)[0]  # fmt: skip
        out |= {StepKey(m, bs, width, shape): statistics.median(t) for m, t in times.items()}
    return out


def schedule_in_steps(cfg: DictConfig) -> DictConfig:
    """`cfg` with Batch Renormalization's schedule in steps where it is given in epochs (the bench builds
    a model without a run's steps per epoch; the schedule does not change a step's work)."""
    from omegaconf import OmegaConf

    from normprop_cli.nn.normalizers import renorm_in_steps

    renorm = cfg.model.get("renorm")
    if renorm is None:
        return cfg
    cfg = cfg.copy()
    cfg.model = cfg.model.copy()
    cfg.model.renorm = renorm_in_steps(OmegaConf.to_container(renorm, resolve=True), 1)
    return cfg


class StepTimes:
    """The step times of a plan: read from `file` (default: $NORMPROP_STEP_TIMES where set) or measured
    on `device`. Called with {key: a run config of that key}, it answers {key: ms}."""

    def __init__(self, file: str | Path | None = None, device: str = "auto", steps: int = 5):
        file = file or os.environ.get(ENV) or None
        self.file, self.steps = (Path(file) if file else None), steps
        self.known = read(self.file) if self.file else None
        self.dev = None if self.file else devices.resolve(device)

    @property
    def source(self) -> str:
        return f"step times from {self.file}" if self.file else f"{self.steps} steps of each timed on {self.where}"

    @property
    def where(self) -> str:
        return devices.describe(self.dev) if self.dev is not None else str(self.file)

    def __call__(self, needed: Mapping[StepKey, DictConfig]) -> dict[StepKey, float]:
        if self.known is not None:
            return lookup(self.known, needed, f"--step-times {self.file}")
        return measure(needed, self.dev, self.steps)


def write(path: str | Path, times: Mapping[StepKey, float], dev: torch.device, options: str) -> Path:
    """A step-times CSV (COLUMNS) of measured times, readable by `read`."""
    rows = [{"method": k.method, "batch_size": k.batch_size, "width": k.width, "shape": k.shape, "step_ms": ms,
             "device": devices.describe(dev), "options": options}
            for k, ms in sorted(times.items())]  # fmt: skip
    return io.write_csv(Path(path), pd.DataFrame(rows, columns=COLUMNS))
