"""gpu-check's `fold` item: NormProp's fused weight side (nn.fused, the "fused" road) against the batched one
(folded.py, the "batched" road), the same model, seed and batches on each.

Per batch size: the two roads' steps under the options a run uses (on CUDA one graph per step, captured on
its road), stepped in turn, in a new order every round, timed by the step's own clock (StepClock), their ratio
paired by round with a 95% interval (timing.paired_ratio); the kernels one step launches on each road
(torch.profiler's CUDA kernels over eager steps, or the count of nn.kernels where there is no CUDA); and the
losses of `steps` SGD steps from the same initial weights on each road, whose largest relative gap says
whether the fused road computes what the batched one does. Where the package has no road to choose, the item
says so and passes: there is nothing to compare."""

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

ROADS = ("batched", "fused")  # the old fold, the new
COLUMNS = ["batch_size", "road", "steps", "step_ms_median", "ratio_vs_batched", "ratio_vs_batched_low",
           "ratio_vs_batched_high", "kernels_per_step", "loss_gap", "finite"]  # fmt: skip
ROUNDS, STEPS, BATCH_SIZES = 200, 20, (1, 50)  # timed rounds, compared steps, batch sizes
GAP = 1e-3  # the losses' largest relative gap the roads may show (float32 rounding, amplified over the steps)


def road_switch():
    """nn.fused.set_road where the package has the roads, else None."""
    try:
        from normprop_cli.nn import fused
    except ImportError:
        return None
    setter = getattr(fused, "set_road", None)
    return setter if callable(setter) and set(ROADS) <= set(getattr(fused, "ROADS", ())) else None


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
        runs = {r: RoadStep(timing.build_step(cfg, data, dev, method, opts), r) for r in ROADS}
        losses = {r: [] for r in ROADS}
        for k in range(steps):  # the same initial weights and batches on each road: their losses
            for r in ROADS:
                losses[r].append(runs[r](xs[k % len(xs)], ys[k % len(xs)])[0].clone())
        clocks = {r: StepClock(dev) for r in ROADS}
        for r in ROADS:
            runs[r].step.clock = clocks[r]
        for k in range(rounds):
            order = list(ROADS)
            random.Random(k).shuffle(order)
            for r in order:
                runs[r](xs[k % len(xs)], ys[k % len(xs)])
        times = {r: clocks[r].steps[2:] for r in ROADS}
        seen = {r: torch.stack(losses[r]).double().cpu() for r in ROADS}
        gap = float(((seen["fused"] - seen["batched"]).abs() / seen["batched"].abs().clamp_min(1e-6)).max())
        for r in ROADS:
            runs[r].step.clock = None
            mid, low, high = timing.paired_ratio(times[r], times["batched"])
            rows.append({"batch_size": bs, "road": r, "steps": len(times[r]),
                         "step_ms_median": statistics.median(times[r]),
                         "ratio_vs_batched": mid, "ratio_vs_batched_low": low, "ratio_vs_batched_high": high,
                         "kernels_per_step": kernels(cfg, data, dev, method, opts, r, xs[0], ys[0]),
                         "loss_gap": gap, "finite": bool(torch.isfinite(seen[r]).all())})  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


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
    fused = frame[frame["road"] == "fused"]
    ok = bool(fused["finite"].all()) and bool((fused["loss_gap"] <= GAP).all())
    parts = [f"batch {int(r.batch_size)}: {r.ratio_vs_batched:.3f} [{r.ratio_vs_batched_low:.3f}, "
             f"{r.ratio_vs_batched_high:.3f}]" for r in fused.itertuples()]  # fmt: skip
    line = (f"fused / batched fold, NormProp's step: {'; '.join(parts)}; largest relative loss gap "
            f"{fused['loss_gap'].max():.1e} (at most {GAP:g})")  # fmt: skip
    details = [f"- batch {int(r.batch_size)}, {r.road}: {r.step_ms_median:.3g} ms a step (median of {int(r.steps)}), "
               f"{_n(r.kernels_per_step)} kernels a step" for r in frame.itertuples()]  # fmt: skip
    return ok, line, details


def _n(v: float) -> str:
    return "?" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:g}"
