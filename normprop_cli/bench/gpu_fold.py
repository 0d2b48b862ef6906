"""gpu-check's `fold` item: NormProp's fewer-kernel weight sides (nn.fused's "fused" road, and its "triton" road
where Triton is installed) against the batched one (folded.py, the "batched" road), the same model, seed and
batches on each.

Per batch size: the two roads' steps under the options a run uses (on CUDA one graph per step, captured on
its road), stepped in turn, in a new order every round, timed by the step's own clock (StepClock), their ratio
paired by round with a 95% interval (timing.paired_ratio); the kernels one step launches on each road
(torch.profiler's CUDA kernels over eager steps, or the count of nn.kernels where there is no CUDA); and the
losses of `steps` SGD steps from the same initial weights on each road, whose gaps say whether each road
computes what the batched one does.

A few SGD steps amplify any difference in the last bits: at batch 1 on the CPU, where the two roads give the
same losses bit for bit, weights perturbed by 1e-4 of their value move the 20th step's loss by 38%, and a
GPU's TF32 convolutions round at about 5e-4. So the gap over the steps is judged against a noise floor, the
batched road against itself with every weight perturbed by one float32 rounding (2^-24 of its value, seeded):
a road passes where its first step's loss (the same weights and batch, nothing amplified yet) is
within FIRST_GAP of the batched road's, and its gap over the steps within GAP or FLOOR_TIMES the floor's.
Where the package has no road to choose, the item says so and passes: there is nothing to compare."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import statistics

import pandas as pd
import torch

from normprop_cli import device as devices
from normprop_cli.bench import gpu_bench, timing
from normprop_cli.bench import step_times as st
from normprop_cli.engine.step import StepClock

ROADS = ("batched", "fused", "triton")  # the reference fold, then the fewer-kernel roads compared with it
COLUMNS = ["batch_size", "road", "steps", "step_ms_median", "ratio_vs_batched", "ratio_vs_batched_low",
           "ratio_vs_batched_high", "kernels_per_step", "loss_gap", "first_gap", "floor_gap", "finite"]  # fmt: skip
ROUNDS, STEPS, BATCH_SIZES = 200, 20, (1, 50)  # timed rounds, compared steps, batch sizes
GAP = 1e-3  # a gap over the steps that passes whatever the floor (module docstring)
FIRST_GAP = 1e-4  # the first step's relative loss gap: float32 reductions in another order, TF32 convolutions
FLOOR_TIMES = 10.0  # the gap over the steps may be this many times the noise floor's
ROUNDING = 2.0**-24  # the noise floor's perturbation of each weight, relative: one float32 rounding


def road_switch():
    """nn.fused.set_road where the package has the roads, else None."""
    try:
        from normprop_cli.nn import fused
    except ImportError:
        return None
    setter = getattr(fused, "set_road", None)
    return setter if callable(setter) and set(ROADS[:2]) <= set(getattr(fused, "ROADS", ())) else None


def roads() -> tuple[str, ...]:
    """The roads this package and machine can compare: the triton one where the package has it and Triton is
    installed."""
    from normprop_cli.nn import fused

    has = "triton" in getattr(fused, "ROADS", ()) and getattr(fused, "triton_installed", lambda: False)()
    return ROADS if has else ROADS[:2]


@contextlib.contextmanager
def on_road(road: str):
    set_road = road_switch()
    before = set_road(road)
    try:
        yield
    finally:
        set_road(before)


class RoadStep:
    """A training step that takes `road` whenever it runs (also when a CUDA graph captures it)."""

    def __init__(self, step, road: str):
        self.step, self.road = step, road

    def __call__(self, x, y):
        with on_road(self.road):
            return self.step(x, y)


def compare(cfg, dev, width: float = 1.0, method: str = gpu_bench.NORMPROP) -> pd.DataFrame | None:
    """COLUMNS' rows, a row per batch size (BATCH_SIZES) and road; None where the package has no roads."""
    if road_switch() is None:
        return None
    batch_sizes, rounds, steps = BATCH_SIZES, ROUNDS, STEPS
    cfg = timing._at_width(gpu_bench.bench_cfg(cfg), width)
    opts = gpu_bench.default_options(cfg, dev)
    rows = []
    for bs in batch_sizes:
        data = st.timing_data(st.DEFAULT_SHAPE, bs, dev)
        xs, ys = timing._batches(data, cfg, dev, bs)
        runs = {r: RoadStep(timing.build_step(cfg, data, dev, method, opts), r) for r in roads()}
        floor = RoadStep(timing.build_step(cfg, data, dev, method, opts), "batched")
        perturb_(floor.step.model)
        losses = {r: [] for r in (*runs, "floor")}
        for k in range(steps):  # the same initial weights and batches on each road: their losses
            for r, run in (*runs.items(), ("floor", floor)):
                losses[r].append(run(xs[k % len(xs)], ys[k % len(xs)])[0].clone())
        del floor
        clocks = {r: StepClock(dev) for r in runs}
        for r in runs:
            runs[r].step.clock = clocks[r]
        for k in range(rounds):
            order = list(runs)
            random.Random(k).shuffle(order)
            for r in order:
                runs[r](xs[k % len(xs)], ys[k % len(xs)])
        times = {r: clocks[r].steps[2:] for r in runs}
        seen = {r: torch.stack(losses[r]).double().cpu() for r in losses}
        floor_gap = relative_gap(seen["floor"], seen["batched"])
        for r in runs:
            runs[r].step.clock = None
            gap, first = relative_gap(seen[r], seen["batched"]), relative_gap(seen[r][:1], seen["batched"][:1])
            mid, low, high = timing.paired_ratio(times[r], times["batched"])
            rows.append({"batch_size": bs, "road": r, "steps": len(times[r]),
                         "step_ms_median": statistics.median(times[r]),
                         "ratio_vs_batched": mid, "ratio_vs_batched_low": low, "ratio_vs_batched_high": high,
                         "kernels_per_step": kernels(cfg, data, dev, method, opts, r, xs[0], ys[0]),
                         "loss_gap": gap, "first_gap": first, "floor_gap": floor_gap,
                         "finite": bool(torch.isfinite(seen[r]).all())})  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest |a - b| / |b| over the steps (|b| at least 1e-6)."""
    return float(((a - b).abs() / b.abs().clamp_min(1e-6)).max())


@torch.no_grad()
def perturb_(model: torch.nn.Module, relative: float = ROUNDING, seed: int = 1) -> None:
    """Every parameter times (1 + relative x N(0, 1)), from a seeded generator: the noise floor's weights."""
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.mul_(1 + relative * torch.randn(p.shape, generator=gen).to(p.device, p.dtype))


def passes(row) -> bool:
    """A compared road's row: finite, its first step within FIRST_GAP, its steps within GAP or FLOOR_TIMES the floor."""
    steps_ok = row["loss_gap"] <= GAP or row["loss_gap"] <= FLOOR_TIMES * row["floor_gap"]
    return bool(row["finite"]) and row["first_gap"] <= FIRST_GAP and bool(steps_ok)


def kernels(cfg, data, dev, method, opts, road, x, y) -> float:
    """The kernels of one eager step on `road`: torch.profiler's on CUDA, nn.kernels' count elsewhere."""
    eager = dataclasses.replace(opts, cuda_graph=False)
    step = RoadStep(timing.build_step(cfg, data, dev, method, eager), road)
    if dev.type != "cuda":
        with on_road(road):
            return gpu_bench.counted(step.step, x, y)
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step(x, y)
    devices.synchronize(dev)
    with timing._silenced(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step(x, y)
        devices.synchronize(dev)
    return len(gpu_bench.device_kernels(prof.events(), True)) / 3


def item_lines(frame: pd.DataFrame | None) -> tuple[bool, str, list[str]]:
    """(passed, one line, SUMMARY.md's lines) of the comparison."""
    if frame is None:
        return True, "not available: this package has no choice of NormProp's fold (nn.fused.set_road)", []
    others = frame[frame["road"] != "batched"]
    ok = all(passes(r) for _, r in others.iterrows())
    lines = []
    for road, g in others.groupby("road", sort=False):
        parts = [f"batch {int(r.batch_size)}: {r.ratio_vs_batched:.3f} [{r.ratio_vs_batched_low:.3f}, "
                 f"{r.ratio_vs_batched_high:.3f}]" for r in g.itertuples()]  # fmt: skip
        lines.append(f"{road} / batched fold, NormProp's step: {'; '.join(parts)}; relative loss gap at the first "
                     f"step {g['first_gap'].max():.1e}, over {STEPS} steps {g['loss_gap'].max():.1e} against a "
                     f"float32-rounding floor of {g['floor_gap'].max():.1e}")  # fmt: skip
    line = (
        "; ".join(lines) + f" (first step at most {FIRST_GAP:g}; steps at most {GAP:g} or {FLOOR_TIMES:g} x the floor)"
    )
    details = [f"- batch {int(r.batch_size)}, {r.road}: {r.step_ms_median:.3g} ms a step (median of {int(r.steps)}), "
               f"{_n(r.kernels_per_step)} kernels a step" for r in frame.itertuples()]  # fmt: skip
    return ok, line, details


def _n(v: float) -> str:
    return "?" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:g}"
