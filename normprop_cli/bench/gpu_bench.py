"""gpu-check's measurements of the steps runs take: the paired bench in the default layout, the targets it is
read against, a kernel profile per method, and `--deterministic` repeated.

Paired bench (bench.csv). The trainer's step of each method under the options a run uses on the device
(StepOptions.from_cfg: on CUDA no channels_last and one CUDA graph per step), float32 and bfloat16 autocast,
for every image shape (SHAPES: CIFAR's 3x32x32 and Fashion-MNIST's 1x32x32, its 28x28 images zero-padded) and
batch size, at width 1.0. The methods are stepped in rounds, in a new order every round (timing.step_times),
on learnable batches (the synthetic set's class prototypes, a few fixed batches) at BENCH_LR, a rate at which
no method's loss runs away; a method whose loss was not finite all the same is marked (`finite` False) and
left out of every ratio, its own and the others'. The ratios are paired by round with a distribution-free
95% interval (timing.paired_ratio): against none, BatchNorm, the fastest batch-independent normaliser, and
`independent_reference`, the cheapest (median) of weight norm, GroupNorm and LayerNorm. `images_per_s` is
the batch over the median step.

Kernel profile (kernels.csv). Per method and batch size, the kernels one step launches, from torch.profiler's
CUDA activity over a few eager steps (a CUDA graph replays the same kernels), and the ten with the most GPU
time; where the package can count kernels from the dispatched ATen operations (nn.kernels), that count too.
On the CPU, the top-level ATen operations stand in for kernels.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import time
from collections.abc import Sequence

import pandas as pd
import torch

from normprop_cli import device as devices
from normprop_cli.bench import step_times as st
from normprop_cli.bench import timing
from normprop_cli.engine.step import StepOptions

BENCH_METHODS = ("none", "batchnorm", "normprop-icml", "weightnorm", "groupnorm", "layernorm")
REFERENCE_INDEPENDENT = ("weightnorm", "groupnorm", "layernorm")  # the batch-1 target's references
SHAPES = ("3x32x32", "1x32x32")
BATCH_SIZES = (1, 50, 100)
BENCH_LR = 0.01  # the learnable batches' rate for every method but none (timing.method_cfg: 0.0001)
REFERENCE_COLUMNS = ["independent_reference", "ratio_vs_independent_reference",
                     "ratio_vs_independent_reference_low", "ratio_vs_independent_reference_high"]  # fmt: skip
COLUMNS = ["shape", *timing.COLUMNS, *REFERENCE_COLUMNS, "images_per_s"]
RATIOS = [c for c in COLUMNS if c.startswith("ratio_vs_")] + ["fastest_independent", "independent_reference"]
PROFILE_COLUMNS = ["method", "batch_size", "shape", "width", "source", "kernels_per_step", "counted_per_step",
                   "device_ms_per_step", "top_kernels"]  # fmt: skip
# The targets, read at width 1.0, float32, the default layout with the CUDA graph, 3x32x32: (batch size,
# column, its bound, what it says). Each is met where the upper end of NormProp's 95% interval is within it.
TARGETS = (
    (50, "ratio_vs_batchnorm_high", 1.00, "NormProp / BatchNorm at batch 50"),
    (100, "ratio_vs_batchnorm_high", 1.00, "NormProp / BatchNorm at batch 100"),
    (50, "ratio_vs_none_high", 1.05, "NormProp / none at batch 50"),
    (1, "ratio_vs_independent_reference_high", 1.00,
     "NormProp / the cheapest of weight norm, GroupNorm and LayerNorm at batch 1"),
)  # fmt: skip
NORMPROP = "normprop-icml"
BENCH_STEPS = None  # timed rounds per configuration: None sizes them to the budget (timing.step_times)
PROFILE_BATCHES = (1, 50)  # the kernel profile's batch sizes
REPEAT_STEPS, REPEAT_BATCH = 20, 50  # --deterministic: two runs of this many steps at this batch size


def bench_cfg(cfg):
    """`cfg` at BENCH_LR (the rate does not change a step's work; it keeps every loss finite)."""
    cfg = copy.deepcopy(cfg)
    cfg.train.lr = BENCH_LR
    return cfg


def default_options(cfg, dev: torch.device) -> StepOptions:
    """The options a run's step takes on `dev` (the config's `auto`s resolved), in float32."""
    return dataclasses.replace(StepOptions.from_cfg(cfg.train, dev), amp=False)


def paired_bench(cfg, dev, methods: Sequence[str], width: float = 1.0, shapes: Sequence[str] = SHAPES,
                 batch_sizes: Sequence[int] = BATCH_SIZES, precisions: Sequence[str] = ("float32", "bfloat16"),
                 budget_s: float = 5.0) -> pd.DataFrame:  # fmt: skip
    """COLUMNS' rows: every shape x batch size x precision, `methods` side by side (module docstring)."""
    from normprop_cli.bench import precision_runs

    cfg = bench_cfg(cfg)
    runs = precision_runs(default_options(cfg, dev), precisions)
    rows = []
    for shape in shapes:
        for bs in batch_sizes:
            data = st.timing_data(shape, bs, dev)
            for precision, opts in runs.items():
                times, phases, finite, counts = timing.step_times(data, cfg, dev, width, bs, BENCH_STEPS, 2, budget_s,
                                                                  opts, tuple(methods))  # fmt: skip
                rows += finite_rows(times, phases, finite, counts, width, bs, precision, dev, opts, shape)
    return pd.DataFrame(rows, columns=COLUMNS)


def finite_rows(times, phases, finite, counts, width, bs, precision, dev, opts, shape) -> list[dict]:
    """timing's rows with every ratio formed from the methods whose losses were all finite alone."""
    kept = {m: t for m, t in times.items() if finite[m]}
    ratios = timing.reference_ratios(kept)
    reference = min((m for m in REFERENCE_INDEPENDENT if m in kept),
                    key=lambda m: statistics.median(kept[m]), default=None)  # fmt: skip
    rows = timing._rows(times, phases, finite, counts, width, bs, precision, dev, opts)
    for row in rows:
        m = row["method"]
        for col in RATIOS:
            row[col] = math.nan
        if m in kept:
            row.update(ratios[m])
            low_mid_high = timing.paired_ratio(kept[m], kept[reference]) if reference else (math.nan,) * 3
            row.update(dict(zip(REFERENCE_COLUMNS, [reference, *low_mid_high], strict=True)))
        row["independent_reference"] = reference
        row["shape"] = shape
        row["images_per_s"] = bs / (row["step_ms_median"] / 1e3)
    return rows


def targets(bench: pd.DataFrame) -> list[tuple[str, float, float, bool | None]]:
    """(what, NormProp's upper end, its bound, met: None where not measured) of each of TARGETS, from bench.csv's
    rows at width 1.0, float32, 3x32x32 and the default options."""
    rows = bench[(bench["method"] == NORMPROP) & (bench["precision"] == "float32") & (bench["width"] == 1.0)]
    rows = rows[rows["shape"] == st.DEFAULT_SHAPE] if "shape" in rows else rows
    found = []
    for bs, column, bound, what in TARGETS:
        at = rows.loc[rows["batch_size"] == bs, column].dropna()
        value = float(at.iloc[0]) if len(at) else math.nan
        found.append((what, value, bound, None if math.isnan(value) else value <= bound))
    return found


def target_lines(bench: pd.DataFrame) -> list[str]:
    """SUMMARY.md's table of the targets, each met or not, computed from bench.csv."""
    from normprop_cli.statistics import markdown

    rows = [[what, f"<= {bound:.2f}", "not measured" if met is None else f"{value:.3f}",
             "not measured" if met is None else "met" if met else "not met"]
            for what, value, bound, met in targets(bench)]  # fmt: skip
    lead = ("Targets, read from bench.csv (width 1.0, float32, 3x32x32, the default layout and options): the "
            "upper end of NormProp's paired 95% interval.")  # fmt: skip
    return [lead, "", *markdown(rows, ["target", "bound", "upper end", "result"])]


def bench_table(bench: pd.DataFrame) -> list[str]:
    """Median ms per step, a row per shape x batch x precision, a column per method; NormProp's ratios."""
    from normprop_cli.statistics import markdown

    methods = list(dict.fromkeys(bench["method"]))
    rows = []
    for (shape, bs, precision), g in bench.groupby(["shape", "batch_size", "precision"], sort=False):
        by = g.set_index("method")
        cells = [_ms(by, m) for m in methods]
        np_row = by.loc[NORMPROP] if NORMPROP in by.index else None
        ratios = [_ratio(np_row, "ratio_vs_batchnorm"), _ratio(np_row, "ratio_vs_none")]
        rows.append([shape, str(bs), precision, *cells, *ratios])
    return markdown(rows, ["shape", "batch", "precision", *methods, "NormProp / BN", "NormProp / none"])


def _ratio(row, column: str) -> str:
    from normprop_cli.statistics import format_ci

    if row is None or pd.isna(row[column]):
        return ""
    return format_ci(row[column], row[f"{column}_low"], row[f"{column}_high"], digits=3)


def _ms(by: pd.DataFrame, m: str) -> str:
    if m not in by.index:
        return ""
    r = by.loc[m]
    return f"{r['step_ms_median']:.3g}" + ("" if bool(r["finite"]) else " (not finite)")


def kernel_profile(cfg, dev, methods: Sequence[str], width: float = 1.0, shape: str = st.DEFAULT_SHAPE,
                   steps: int = 3) -> pd.DataFrame:  # fmt: skip
    """PROFILE_COLUMNS' rows: per method and batch size, the kernels of one eager step under the default
    options (module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    cfg = timing._at_width(bench_cfg(cfg), width)
    opts = dataclasses.replace(default_options(cfg, dev), cuda_graph=False)
    cuda = dev.type == "cuda"
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    rows = []
    for bs in PROFILE_BATCHES:
        data = st.timing_data(shape, bs, dev)
        xs, ys = timing._batches(data, cfg, dev, bs, count=1)
        for m in methods:
            step = timing.build_step(cfg, data, dev, m, opts)
            for _ in range(3):
                step(xs[0], ys[0])
            devices.synchronize(dev)
            with timing._silenced(), profile(activities=activities) as prof:
                for _ in range(steps):
                    step(xs[0], ys[0])
                devices.synchronize(dev)
            kernels = device_kernels(prof.events(), cuda)
            spent: dict[str, float] = {}
            for name, us in kernels:
                spent[name] = spent.get(name, 0.0) + us / steps
            top = sorted(spent.items(), key=lambda kv: -kv[1])[:10]
            rows.append({"method": m, "batch_size": bs, "shape": shape, "width": width,
                         "source": "torch.profiler, CUDA kernels" if cuda else "torch.profiler, top-level ATen ops",
                         "kernels_per_step": len(kernels) / steps, "counted_per_step": counted(step, xs[0], ys[0]),
                         "device_ms_per_step": sum(spent.values()) / 1e3,
                         "top_kernels": "; ".join(f"{_short(n)} {us:.1f} us" for n, us in top)})  # fmt: skip
    return pd.DataFrame(rows, columns=PROFILE_COLUMNS)


def device_kernels(events, cuda: bool) -> list[tuple[str, float]]:
    """(name, microseconds) of each kernel (CUDA) or top-level ATen operation (CPU) among profiler events."""
    from torch.autograd import DeviceType

    if cuda:
        return [(e.name, e.time_range.elapsed_us()) for e in events if e.device_type == DeviceType.CUDA]
    found = []
    for e in events:
        if e.name.startswith("aten::"):
            parent = e.cpu_parent
            while parent is not None and not parent.name.startswith("aten::"):
                parent = parent.cpu_parent
            if parent is None:
                found.append((e.name, e.self_cpu_time_total))
    return found


def counted(step, x, y) -> float:
    """The kernels one warm step would launch on CUDA, counted from its ATen operations (nn.kernels), or
    NaN where the package has no such count."""
    try:
        from normprop_cli.nn.kernels import step_kernels
    except ImportError:
        return math.nan
    with timing._silenced():
        return float(step_kernels(step, x, y).total)


def _short(name: str, width: int = 60) -> str:
    name = " ".join(name.split())
    return name if len(name) <= width else name[: width - 3] + "..."


def deterministic_repeat(cfg, dev, methods: Sequence[str], width: float = 1.0) -> tuple[bool, list[str]]:
    """Two runs of each method, the same seed and batches, REPEAT_STEPS steps each under `--deterministic`
    (device.prepare): whether every method's losses came out the same bit for bit, and a line per method
    with the median ms of a deterministic step. The device's default settings are put back after."""
    from normprop_cli.bench.gpu_items import batches, trainer_run
    from normprop_cli.engine.progress import console

    steps, batch_size = REPEAT_STEPS, REPEAT_BATCH
    cfg = timing._at_width(bench_cfg(cfg), width)
    data = st.timing_data(st.DEFAULT_SHAPE, batch_size, dev)
    idx = [i.to(dev) for i in batches(data, batch_size, steps)]
    same, lines = True, []
    devices.prepare(dev, deterministic=True)
    try:
        for m in methods:
            losses, ms = [], []
            for _ in range(2):
                with console.capture():
                    run = trainer_run(cfg, data, dev, m)
                    out = []
                    for i in idx:
                        t0 = time.perf_counter()
                        out.append(run.step(data.train.x[i], data.train.y[i])[0].clone())
                        devices.synchronize(dev)
                        ms.append((time.perf_counter() - t0) * 1e3)
                losses.append(torch.stack(out).cpu())
            equal = torch.equal(losses[0], losses[1])
            finite = bool(torch.isfinite(losses[0]).all())
            same &= equal and finite
            lines.append(f"- {m}: {'the same bit for bit' if equal else 'differ'} over {steps} steps"
                         f"{'' if finite else ' (a loss not finite)'}; last loss {float(losses[0][-1]):.4f}; "
                         f"{statistics.median(ms[3:] or ms):.3g} ms a step (median, warm)")  # fmt: skip
    finally:
        devices.prepare(dev)
    return same, lines
