"""What `normprop bench` and `normprop gpu-check` time: the methods' steps side by side, and whole
epochs through the trainer. Every step is timed by its own clock (engine.step.StepClock), which
synchronises the device as a step starts and ends; the package (bench/__init__.py) says what the tables mean."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence

import pandas as pd
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from normprop_cli import device as devices
from normprop_cli.engine.step import PHASES, StepClock, StepOptions, make_optimizer, make_step
from normprop_cli.nn.layers import has_normprop_layers
from normprop_cli.nn.methods import METHODS, settings

COLUMNS = ["method", "batch_size", "width", "precision", "device", "threads", "options", "steps",
           "step_ms_median", "step_ms_p10", "step_ms_p90", "ratio_vs_none", "ratio_vs_none_low", "ratio_vs_none_high",
           "ratio_vs_batchnorm", "ratio_vs_batchnorm_low", "ratio_vs_batchnorm_high", "fastest_independent",
           "ratio_vs_fastest_independent", "ratio_vs_fastest_independent_low", "ratio_vs_fastest_independent_high",
           *(f"{p}_ms_median" for p in PHASES), "ops_per_step", "gflop_per_step", "gflops",
           "flush_denormal", "load_average", "finite"]  # fmt: skip
LEAST_STEPS = {1: 100}  # timed steps per method at least, by batch size; 30 at the others
LEAST_OTHERWISE = 30
MOST_STEPS = 400
EPOCH_COLUMNS = ["method", "width", "batch_size", "precision", "device", "epochs", "epoch_s", "train_s",
                 "steps_s", "eval_s", "outside_share", "data_share", "eval_share"]  # fmt: skip
OPTIONS = tuple(f.name for f in dataclasses.fields(StepOptions))


def describe(options: StepOptions) -> str:
    """How a step runs, but for its precision (amp: the `precision` column)."""
    return "+".join(k for k in OPTIONS if k != "amp" and getattr(options, k)) or "plain"


def method_cfg(cfg, method: str):
    """`cfg` with METHODS[method]'s settings (norm, NormProp's jacobian, scaled WS's gradient clipping)
    and its learning rate."""
    cfg = copy.deepcopy(cfg)
    for key, value in settings(method).items():
        OmegaConf.update(cfg, key, value, force_add=True)
    if method == "none":
        cfg.train.lr = 1e-4  # section 5.2: larger rates diverge
    return cfg


def build_step(cfg, data, dev, method, options):
    """`method`'s model (METHODS' options), SGD and step, the unit-norm constraint where it has NormProp layers."""
    from normprop_cli.engine.trainer import build_model

    cfg = method_cfg(cfg, method)
    torch.manual_seed(0)
    model = build_model(cfg.model, data).to(dev)
    if options.channels_last:
        model = model.to(memory_format=torch.channels_last)
    t = cfg.train
    opt = make_optimizer(model, t.lr, t.momentum, t.weight_decay, dev, t.get("decay", "all"))
    return make_step(model, torch.nn.Identity(), opt, has_normprop_layers(model), options, t.get("agc"))


def step_table(data, cfg, dev, widths, batch_sizes, runs: dict[str, StepOptions], methods=None,
               steps=None, warmup=2, budget_s=30.0) -> pd.DataFrame:  # fmt: skip
    """COLUMNS' rows: every width x batch size x (precision: options) of `runs`, `methods` (default: every
    registered one) side by side."""
    rows = []
    for width in widths:
        for bs in batch_sizes:
            for p, opts in runs.items():
                times, phases, finite, counts = step_times(data, cfg, dev, width, bs, steps, warmup, budget_s,
                                                           opts, methods)  # fmt: skip
                rows += _rows(times, phases, finite, counts, width, bs, p, dev, opts)
    return pd.DataFrame(rows, columns=COLUMNS)


def step_times(data, cfg, dev, width, batch_size, steps, warmup, budget_s, options,
               methods=None, counted=True, own=None):  # fmt: skip
    """{method: [ms per step]}, the methods stepped in turn; {method: {phase: [ms]}} (the CPU's
    steps only, see StepClock; else empty); {method: whether every loss of its steps was finite};
    {method: (its operator calls per step, `ops_per_step`; its GFLOP per step, `gflop_per_step`)}, NaN
    without `counted` (a plan's timing, bench.step_times, needs only the times). `own`: {method: its run's
    config} to build a method's model from instead of `cfg` (a plan's runs: a method's settings, such as
    weight norm's data_init, are no other method's)."""
    methods = tuple(METHODS) if methods is None else methods
    cfg = _at_width(cfg, width)
    x, y = _batches(data, cfg, dev, batch_size)
    runs = {m: build_step(_at_width(own[m], width) if own and m in own else cfg, data, dev, m, options)
            for m in methods}  # fmt: skip
    clocks = {m: StepClock(dev) for m in methods}
    for m, run in runs.items():
        run.clock = clocks[m]
    losses = {m: [] for m in methods}
    rounds, r = (steps or 5) + warmup, 0
    while r < rounds:
        for m in shuffled(methods, r):  # no method always first, nor always after the same other one
            loss, _ = runs[m](x[r % len(x)], y[r % len(x)])
            losses[m].append(loss.clone())  # a CUDA graph's step returns one output tensor at every replay
        r += 1
        if steps is None and r == warmup + 1:  # one timed round: size the rest to the budget, the least kept
            per_round = sum(c.steps[-1] for c in clocks.values()) / 1e3
            least = LEAST_STEPS.get(int(batch_size), LEAST_OTHERWISE)
            rounds = warmup + max(least, min(MOST_STEPS, int(budget_s / max(per_round, 1e-6))))
    finite = {m: bool(torch.isfinite(torch.stack(v)).all()) for m, v in losses.items()}
    phases = {m: {p: t[warmup:] for p, t in c.phases.items()} for m, c in clocks.items()}
    for run in runs.values():
        run.clock = None
    nan = (float("nan"), float("nan"))
    counts = {m: (ops_per_step(run, x[0], y[0]), gflop_per_step(run, x[0], y[0])) if counted else nan
              for m, run in runs.items()}  # fmt: skip
    return {m: c.steps[warmup:] for m, c in clocks.items()}, phases, finite, counts


def _at_width(cfg, width):
    """A copy of `cfg` with the NIN at `width`."""
    cfg = copy.deepcopy(cfg)
    cfg.model.width = width
    return cfg


@contextlib.contextmanager
def _silenced():
    """Standard output and error sent to /dev/null at the file-descriptor level: the profiler's C++
    library logs a line as each profile starts and stops, which would bury the bench's own output."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def shuffled(methods, round_: int) -> list[str]:
    """`methods` in round `round_`'s order: a seeded permutation, new each round. A rotation would keep each
    method after the same other one every round: with it, NormProp (ICML), always stepped after Online
    Norm's heavy step, measured 1.24 times BatchNorm at width 0.25, batch 1, against 1.09-1.11 for two
    NormProp settings of the same cost; in a new order each round all three measured 1.17-1.18."""
    order = list(methods)
    random.Random(round_).shuffle(order)
    return order


def ops_per_step(step, x, y, steps: int = 2) -> float:
    """The operator calls of one step, counted by torch.profiler over `steps` untimed steps: the ATen
    calls made from Python or from autograd, not those an operator makes inside (a fixed cost each,
    which is what a batch-1 step pays for)."""
    from torch.profiler import ProfilerActivity, profile

    with _silenced(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step(x, y)
    count = 0
    for event in prof.events():
        if event.name.startswith("aten::"):
            parent = event.cpu_parent
            while parent is not None and not parent.name.startswith("aten::"):
                parent = parent.cpu_parent
            count += parent is None
    return count / steps


def gflop_per_step(step, x, y) -> float:
    """The floating-point operations of a step's model, forward and backward on one batch, in GFLOP, as
    torch.utils.flop_counter counts them: the convolutions' and matrix products' multiply-adds (two each),
    and nothing else (no normalisation, activation, loss or optimizer work). They depend on the NIN's
    shapes alone, not on its normalisation; over a step's time they say how near it runs to the hardware's
    peak. Counted on the eager model (a compiled or CUDA-graphed step runs no operator the counter sees),
    with no SGD step, and the parameters' gradients put back as they were (some normalisers' backward hooks
    refuse torch.autograd.grad)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = getattr(step, "step", step).model  # a GraphedStep's captured Step
    params = [p for p in model.parameters() if p.requires_grad]
    kept = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        with FlopCounterMode(display=False) as counter:
            F.cross_entropy(model(x), y).backward()
    finally:
        for p, g in zip(params, kept, strict=True):
            p.grad = g
    return counter.get_total_flops() / 1e9


def failing_methods(data, cfg, dev, options: StepOptions, methods=None, width: float = 0.25,
                    batch_size: int = 8) -> dict[str, str]:  # fmt: skip
    """{method: its error, one line} for each method whose step fails under `options` (e.g. cannot
    be captured in a CUDA graph); two steps each, on a small NIN."""
    methods = tuple(METHODS) if methods is None else methods
    cfg = copy.deepcopy(cfg)
    cfg.model.width = width
    x, y = _batches(data, cfg, dev, batch_size, count=1)
    failed = {}
    for m in methods:
        try:
            step = build_step(cfg, data, dev, m, options)
            for _ in range(2):
                step(x[0], y[0])
            devices.synchronize(dev)
        except Exception as exc:  # any failure is reported beside the timings, not raised
            failed[m] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return failed


def _batches(data, cfg, dev, batch_size, count: int = 16):
    """`count` batches of training digits, normalised (global, section 4.1) and on the device."""
    from normprop_cli.data import make_data_norm

    norm = make_data_norm("global", data.train.x)
    gen = torch.Generator().manual_seed(0)
    idx = [torch.randint(len(data.train), (batch_size,), generator=gen) for _ in range(count)]
    idx = [i.to(dev) for i in idx]
    return [norm(data.train.x[i]) for i in idx], [data.train.y[i] for i in idx]


def paired_ratio(steps: list[float], reference: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """The median over rounds of a method's step time over the reference's in the same round, and its
    distribution-free `level` interval (order statistics of the ratios: the median's binomial interval).
    Each round steps every method once, in a new order, so a drift in the machine's speed moves both
    sides of a round's ratio alike."""
    from scipy.stats import binom

    ratios = sorted(a / b for a, b in zip(steps, reference, strict=True))
    n = len(ratios)
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    below = int(binom.ppf((1.0 - level) / 2.0, n, 0.5))  # x_(below) .. x_(n + 1 - below), 1-indexed
    low, high = (ratios[below - 1], ratios[n - below]) if below >= 1 else (float("nan"), float("nan"))
    return statistics.median(ratios), low, high


def fastest_independent(times: Mapping[str, Sequence[float]]) -> str | None:
    """Of the timed methods, the batch-independent normaliser (a registered method whose
    `Method.batch_statistics` is False, none's plain network excepted) with the lowest median step;
    the first in `times`' order on a tie; None where no such method was timed."""
    independent = [m for m in times if m in METHODS and not METHODS[m].batch_statistics and METHODS[m].norm != "none"]
    return min(independent, key=lambda m: statistics.median(times[m]), default=None)


def reference_ratios(times: Mapping[str, Sequence[float]]) -> dict[str, dict[str, object]]:
    """{method: its ratio columns}: `ratio_vs_{none, batchnorm, fastest_independent}` with their `_low` and
    `_high` (paired_ratio of its per-round steps over the reference's; NaN where the reference was not
    timed) and `fastest_independent`, that reference's name (None where there is none)."""
    nan3 = (float("nan"),) * 3
    fastest = fastest_independent(times)
    refs = {"none": "none", "batchnorm": "batchnorm", "fastest_independent": fastest}
    columns = {}
    for m, t in times.items():
        vs = {col: paired_ratio(t, times[ref]) if ref in times else nan3 for col, ref in refs.items()}
        columns[m] = {"fastest_independent": fastest,
                      **{f"ratio_vs_{col}{end}": v for col, (mid, lo, hi) in vs.items()
                         for end, v in (("", mid), ("_low", lo), ("_high", hi))}}  # fmt: skip
    return columns


def _rows(times, phases, finite, counts, width, bs, precision, dev, options) -> list[dict]:
    ratios = reference_ratios(times)
    rows = []
    for m, t in times.items():
        q = statistics.quantiles(t, n=10, method="inclusive") if len(t) > 1 else [t[0]] * 9
        phase_ms = {f"{p}_ms_median": statistics.median(phases[m][p]) if phases[m].get(p) else float("nan")
                    for p in PHASES}  # fmt: skip
        rows.append({
            "method": m, "batch_size": bs, "width": width, "precision": precision,
            "device": devices.describe(dev),
            "threads": torch.get_num_threads(), "options": describe(options), "steps": len(t),
            "step_ms_median": statistics.median(t),
            "step_ms_p10": q[0], "step_ms_p90": q[-1],
            **ratios[m],
            **phase_ms, "ops_per_step": counts[m][0], "gflop_per_step": counts[m][1],
            "gflops": counts[m][1] / (statistics.median(t) / 1e3),
            "flush_denormal": denormals_flushed(dev), "load_average": _load(), "finite": finite[m],
        })  # fmt: skip
    return rows


def epoch_table(data, cfg, dev, epochs: int, options: StepOptions, methods=None) -> pd.DataFrame:
    """Whole epochs through the trainer (train_epoch + evaluate), the methods in turn; the steps
    inside are timed by each run's step clock, so the rest of an epoch is measured too."""
    from normprop_cli.engine.progress import QuietProgress
    from normprop_cli.engine.trainer import evaluate, make_run, train_epoch

    methods = tuple(METHODS) if methods is None else methods
    runs = {}
    for m in methods:
        c = method_cfg(cfg, m)
        for key in OPTIONS:
            c.train[key] = getattr(options, key)
        torch.manual_seed(0)
        runs[m] = (make_run(c, data, dev), c)
    quiet = QuietProgress(len(methods))  # silent: train_epoch only counts steps on it
    sums = {m: {"epoch_s": 0.0, "train_s": 0.0, "steps_s": 0.0, "eval_s": 0.0} for m in methods}
    for e in range(epochs + 1):  # epoch 0 warms up
        for m in shuffled(methods, e):
            run, c = runs[m]
            run.step.clock = clock = StepClock(dev)
            t0 = time.perf_counter()
            train_epoch(run, data, c, dev, quiet)
            t1 = time.perf_counter()
            evaluate(run, data, c)
            t2 = time.perf_counter()
            run.epoch += 1
            if e:
                s = sums[m]
                s["epoch_s"] += t2 - t0
                s["train_s"] += t1 - t0
                s["eval_s"] += t2 - t1
                s["steps_s"] += sum(clock.steps) / 1e3
    rows = []
    for m, s in sums.items():
        epoch = s["epoch_s"]
        rows.append({
            "method": m, "width": float(cfg.model.width), "batch_size": int(cfg.train.batch_size),
            "precision": "bfloat16" if options.amp else "float32", "device": devices.describe(dev), "epochs": epochs,
            **{k: v / epochs for k, v in s.items()},
            "outside_share": (epoch - s["steps_s"]) / epoch,
            "data_share": (s["train_s"] - s["steps_s"]) / epoch, "eval_share": s["eval_s"] / epoch,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=EPOCH_COLUMNS)


def denormals_flushed(dev: torch.device) -> bool:
    """Whether a float32 product below 1.2e-38 comes out as 0 (flush-to-zero in effect)."""
    tiny = torch.full((64,), 1e-30, device=dev)
    return bool(((tiny * 1e-10) == 0).all())


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
