"""`normprop bench`: the NIN training step with each normalisation, timed (paper section 5.6).

    normprop bench        (or make bench) -> results/bench/bench.csv, results/bench/epochs.csv
    normprop bench --methods none,batchnorm,normprop-icml      a subset of the methods

Methods. Every method of `nn.methods.METHODS` (none, batchnorm, batchrenorm, weightnorm,
layernorm, groupnorm, ws-gn, scaledws, frn, normprop-icml, normprop-arxiv), or the subset asked
for; the `method` column holds that name. A method's model options (`norm`, NormProp's
`jacobian`) come from METHODS; NormProp's unit-norm constraint follows every step where `norm`
is normprop. `ratio_vs_none` and `ratio_vs_batchnorm` divide a method's median by that of none
and of batchnorm in the same configuration (empty where that method was not timed).

Steps. For each width and batch size the methods are built side by side and stepped in turn,
the order rotating every round, so that whatever else slows the machine hits all of them alike.
A step is the trainer's (engine.step): forward, cross-entropy, backward, SGD and, for NormProp,
the unit-norm constraint, on a batch of digits already normalised and on the device. The figure
is the median of the timed steps after the warm-up ones; `steps=None` times as many rounds (one
step of every method each) as fit in `budget_s` seconds per configuration, at least 5 and at most
200. The budget covers a configuration's rounds, all methods together, so more methods mean fewer
steps each rather than a longer bench. The default went from 20 s (three methods) to 30 s for the
11: every method gets 5 to about 20 timed steps at width 1.0, batch 50 and 100 (at batch 100 in
float32 a round takes longer than budget/5, so the 5 rounds' floor sets the time), 40 or more in
the other configurations, and the default bench (12 configurations where bfloat16 is native, and
the epochs below) takes about 10 minutes on an idle 2-core CPU. On the CPU the same steps also
say where the time went, by phase: forward (with the loss), backward, optimizer, constraint.

Epochs. Whole epochs through the trainer's own `train_epoch` and `evaluate` on the digits data
set with the quick preset's shapes (width 0.25, batch 50, batch data normalisation), every method
timed in the steps (all of METHODS by default) in turn, after one warm-up epoch each. The step
calls inside are timed, so the share of an epoch outside the steps (data, evaluation,
bookkeeping) is measured, not estimated.

Precision. Every configuration is timed in float32 and, where the device computes in bfloat16
natively (`device.bf16_supported`: CUDA compute capability 8.0 on, a CPU with AMX or
AVX512-BF16), again under bfloat16 autocast (`train.amp`); elsewhere one line says why bfloat16
is left out. The `precision` column says which; `options` the rest of how the step runs.

No normalisation trains at lr 0.0001, as in section 5.2 (larger rates diverge); the learning
rate does not change the work of a step. `finite` is per method: whether all its losses were.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from normprop_cli import device as devices
from normprop_cli import io
from normprop_cli.engine.step import PHASES, Step, StepOptions, make_optimizer, make_step
from normprop_cli.nn.methods import METHODS

PRECISIONS = ("float32", "bfloat16")
COLUMNS = ["method", "batch_size", "width", "precision", "device", "threads", "options", "steps",
           "step_ms_median", "step_ms_p10", "step_ms_p90", "ratio_vs_none", "ratio_vs_batchnorm",
           *(f"{p}_ms_median" for p in PHASES), "flush_denormal", "load_average", "finite"]  # fmt: skip
EPOCH_COLUMNS = ["method", "width", "batch_size", "precision", "device", "epochs", "epoch_s", "train_s",
                 "steps_s", "eval_s", "outside_share", "data_share", "eval_share"]  # fmt: skip


def run_bench(
    batch_sizes: Sequence[int] = (1, 50, 100),
    widths: Sequence[float] = (1.0, 0.25),
    steps: int | None = None,
    warmup: int = 2,
    device: str = "auto",
    results_dir: str | Path = "results",
    epochs: int = 2,
    budget_s: float = 30.0,
    threads: int | None = None,
    options: StepOptions | None = None,
    preset: str = "quick",
    quiet: bool = False,
    precisions: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Time steps and epochs; write results/bench/{bench,epochs}.csv; return the step table.

    The epoch table is also in the returned frame's `attrs["epochs"]`; `epochs=0` skips it.
    `preset` gives the data set and the epochs' shapes (tests use "smoke"); `options` how a step
    runs (default: the config's `train:` options, as the trainer takes them; `amp` comes from the
    precision); `threads` sets torch's CPU threads (default: torch's own choice, all cores);
    `precisions` some of PRECISIONS (default: both where bfloat16 is native, else float32);
    `methods` some of METHODS (default: all). An unknown precision or method is a ValueError,
    raised before anything is timed or written.
    """
    from normprop_cli import config
    from normprop_cli.engine.job import load_data

    methods = choose_methods(methods)
    dev = devices.resolve(device)
    devices.prepare(dev)
    if threads:
        torch.set_num_threads(int(threads))
    cfg = config.load("table1", preset=preset)
    options = options or StepOptions.from_cfg(cfg.train, dev)
    precisions, note = choose_precisions(dev, precisions)
    if note and not quiet:
        print(note)
    runs = {p: dataclasses.replace(options, amp=p == "bfloat16") for p in precisions}
    data = load_data(cfg, dev)
    table = step_table(data, cfg, dev, widths, batch_sizes, runs, methods, steps, warmup, budget_s)
    out = Path(results_dir) / "bench"
    io.write_csv(out / "bench.csv", table)
    table.attrs["epochs"] = None
    if epochs:
        tables = [epoch_table(data, cfg, dev, epochs, opts, methods) for opts in runs.values()]
        table.attrs["epochs"] = pd.concat(tables, ignore_index=True)
        io.write_csv(out / "epochs.csv", table.attrs["epochs"])
    if not quiet:
        show(table)
    return table


def choose_methods(methods: Sequence[str] | None = None) -> tuple[str, ...]:
    """Some of METHODS, in METHODS' order (default: all of them); ValueError on an unknown name."""
    if methods is None:
        return tuple(METHODS)
    asked = {m.strip() for m in methods}
    unknown = sorted(asked - set(METHODS))
    if unknown or not asked:
        raise ValueError(f"unknown method {', '.join(unknown)!r}; use some of {', '.join(METHODS)}")
    return tuple(m for m in METHODS if m in asked)


def method_cfg(cfg, method: str):
    """`cfg` with METHODS[method]'s model options (norm, NormProp's jacobian) and its learning rate."""
    cfg = copy.deepcopy(cfg)
    for key, value in METHODS[method].items():
        cfg.model[key] = value
    if method == "none":
        cfg.train.lr = 1e-4  # section 5.2: larger rates diverge
    return cfg


def step_table(data, cfg, dev, widths, batch_sizes, runs: dict[str, StepOptions], methods=tuple(METHODS),
               steps=None, warmup=2, budget_s=30.0) -> pd.DataFrame:  # fmt: skip
    """COLUMNS' rows: every width x batch size x (precision: options) of `runs`, `methods` side by side."""
    rows = []
    for width in widths:
        for bs in batch_sizes:
            for p, opts in runs.items():
                times, phases, finite = step_times(data, cfg, dev, width, bs, steps, warmup, budget_s, opts, methods)
                rows += _rows(times, phases, finite, width, bs, p, dev, opts)
    return pd.DataFrame(rows, columns=COLUMNS)


def choose_precisions(dev, precisions: Sequence[str] | None = None) -> tuple[tuple[str, ...], str]:
    """The precisions to time on `dev` and a line to print about bfloat16 ("" if none is due):
    by default bfloat16 where `dev` computes in it natively, else only float32 and why."""
    native, why = devices.bf16_supported(dev)
    if precisions is None:
        if native:
            return PRECISIONS, ""
        return ("float32",), f"bfloat16 left out: {why} (ask for it with --precision float32,bfloat16)"
    precisions = tuple(dict.fromkeys(precisions))
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown or not precisions:
        raise ValueError(f"unknown precision {', '.join(unknown)!r}; use some of {', '.join(PRECISIONS)}")
    emulated = "bfloat16" in precisions and not native
    return precisions, f"bfloat16 is emulated here ({why}): its times say nothing of bf16 hardware" if emulated else ""


def step_times(data, cfg, dev, width, batch_size, steps, warmup, budget_s, options,
               methods=tuple(METHODS)):  # fmt: skip
    """{method: [ms per step]}, the methods stepped in turn; {method: {phase: [ms]}} (the CPU's
    eager steps only, where marking a phase's end costs nothing; else empty); {method: whether
    every loss of its steps was finite}."""
    cfg = copy.deepcopy(cfg)
    cfg.model.width = width
    x, y = _batches(data, cfg, dev, batch_size)
    runs = {m: build_step(cfg, data, dev, m, options) for m in methods}
    phased = dev.type == "cpu" and all(type(run) is Step for run in runs.values())
    times = {m: [] for m in methods}
    phases = {m: {p: [] for p in PHASES} for m in methods}
    losses = {m: [] for m in methods}
    order = list(methods)
    rounds, r = (steps or 5) + warmup, 0
    while r < rounds:
        for m in order:
            i = r % len(x)
            devices.synchronize(dev)
            t0 = time.perf_counter()
            if phased:
                loss, _ = runs[m](x[i], y[i], _PhaseClock(phases[m], t0))
            else:
                loss, _ = runs[m](x[i], y[i])
            devices.synchronize(dev)
            times[m].append(1e3 * (time.perf_counter() - t0))
            losses[m].append(loss)
        order = order[1:] + order[:1]  # rotate: no method is always first after another
        r += 1
        if steps is None and r == warmup + 1:  # one timed round: size the rest to the budget
            per_round = sum(t[-1] for t in times.values()) / 1e3
            rounds = warmup + min(200, max(5, int(budget_s / max(per_round, 1e-6))))
    finite = {m: bool(torch.isfinite(torch.stack(v)).all()) for m, v in losses.items()}
    phases = {m: {p: t[warmup:] for p, t in ph.items()} for m, ph in phases.items()} if phased else {}
    return {m: t[warmup:] for m, t in times.items()}, phases, finite


class _PhaseClock:
    """Passed to a `Step`: appends to `into[phase]` the ms since the previous phase ended."""

    def __init__(self, into: dict[str, list[float]], t0: float):
        self.into, self.last = into, t0

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        self.into[phase].append(1e3 * (now - self.last))
        self.last = now


def build_step(cfg, data, dev, method, options):
    """`method`'s model (METHODS' options), SGD and step, the unit-norm constraint where norm is normprop."""
    from normprop_cli.engine.trainer import build_model

    cfg = method_cfg(cfg, method)
    torch.manual_seed(0)
    model = build_model(cfg.model, data).to(dev)
    if options.channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = make_optimizer(model, cfg.train.lr, cfg.train.momentum, cfg.train.weight_decay, dev)
    return make_step(model, torch.nn.Identity(), opt, cfg.model.norm == "normprop", options)


def failing_methods(data, cfg, dev, options: StepOptions, methods=tuple(METHODS), width: float = 0.25,
                    batch_size: int = 8) -> dict[str, str]:  # fmt: skip
    """{method: its error, one line} for each method whose step fails under `options` (e.g. cannot
    be captured in a CUDA graph); two steps each, on a small NIN."""
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


def _rows(times, phases, finite, width, bs, precision, dev, options) -> list[dict]:
    med = {m: statistics.median(t) for m, t in times.items()}
    rows = []
    for m, t in times.items():
        q = statistics.quantiles(t, n=10, method="inclusive") if len(t) > 1 else [t[0]] * 9
        phase_ms = {f"{p}_ms_median": statistics.median(v) if v else float("nan")
                    for p, v in phases.get(m, dict.fromkeys(PHASES, [])).items()}  # fmt: skip
        rows.append({
            "method": m, "batch_size": bs, "width": width, "precision": precision,
            "device": devices.describe(dev),
            "threads": torch.get_num_threads(), "options": describe(options), "steps": len(t),
            "step_ms_median": med[m],
            "step_ms_p10": q[0], "step_ms_p90": q[-1],
            "ratio_vs_none": med[m] / med["none"] if "none" in med else float("nan"),
            "ratio_vs_batchnorm": med[m] / med["batchnorm"] if "batchnorm" in med else float("nan"),
            **phase_ms,
            "flush_denormal": denormals_flushed(dev), "load_average": _load(), "finite": finite[m],
        })  # fmt: skip
    return rows


def epoch_table(data, cfg, dev, epochs: int, options: StepOptions, methods=tuple(METHODS)) -> pd.DataFrame:
    """Whole epochs through the trainer (train_epoch + evaluate), the methods in turn."""
    from normprop_cli.engine.trainer import evaluate, make_run, train_epoch

    runs, clocks = {}, {}
    for m in methods:
        c = method_cfg(cfg, m)
        for key in OPTIONS:
            c.train[key] = getattr(options, key)
        torch.manual_seed(0)
        run = make_run(c, data, dev)
        clocks[m] = _Clock(run.step, dev)
        run.step = clocks[m]
        runs[m] = (run, c)
    quiet = _Silent()
    sums = {m: {"epoch_s": 0.0, "train_s": 0.0, "steps_s": 0.0, "eval_s": 0.0} for m in methods}
    order = list(methods)
    for e in range(epochs + 1):  # epoch 0 warms up
        for m in order:
            run, c = runs[m]
            clocks[m].seconds = 0.0
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
                s["steps_s"] += clocks[m].seconds
        order = order[1:] + order[:1]
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


OPTIONS = ("channels_last", "amp", "compile", "cuda_graph")


def describe(options: StepOptions) -> str:
    """How a step runs, but for its precision (amp: the `precision` column)."""
    return "+".join(k for k in OPTIONS if k != "amp" and getattr(options, k)) or "plain"


class _Clock:
    """Wraps a step and adds up the time spent inside it (with a device sync on CUDA)."""

    def __init__(self, step, dev):
        self.step, self.dev, self.seconds = step, dev, 0.0
        self.logits = step.logits

    def __call__(self, x, y):
        devices.synchronize(self.dev)
        t0 = time.perf_counter()
        out = self.step(x, y)
        devices.synchronize(self.dev)
        self.seconds += time.perf_counter() - t0
        return out


class _Silent:
    def start(self, *a): ...
    def step(self, n): ...
    def epoch(self, row): ...
    def finish(self, manifest): ...


def denormals_flushed(dev: torch.device) -> bool:
    """Whether a float32 product below 1.2e-38 comes out as 0 (flush-to-zero in effect)."""
    tiny = torch.full((64,), 1e-30, device=dev)
    return bool(((tiny * 1e-10) == 0).all())


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def show(table: pd.DataFrame) -> None:
    from rich.console import Console

    console = Console(width=max(Console().width, 100))  # the methods' names in full
    first = table.iloc[0]
    t = _table(f"NIN training step, ms (median of the timed steps), {first['device']}, {first['options']}",
               "width", "batch", "precision", "method", "steps", "median ms", "p10-p90", "/ none", "/ BN")  # fmt: skip
    for r in table.itertuples():
        t.add_row(f"{r.width:g}", str(r.batch_size), r.precision, r.method, str(r.steps),
                  f"{r.step_ms_median:.2f}", f"{r.step_ms_p10:.1f}-{r.step_ms_p90:.1f}",
                  f"{r.ratio_vs_none:.3f}", f"{r.ratio_vs_batchnorm:.3f}")  # fmt: skip
    console.print(t)
    phase_cols = [f"{p}_ms_median" for p in PHASES]
    if table[phase_cols].notna().all(axis=None):
        p = _table("Where a step goes: median ms of each phase", "width", "batch", "precision", "method", *PHASES)
        for r in table.itertuples():
            p.add_row(f"{r.width:g}", str(r.batch_size), r.precision, r.method,
                      *(f"{getattr(r, c):.2f}" for c in phase_cols))  # fmt: skip
        console.print(p)
    epochs = table.attrs.get("epochs")
    if epochs is not None and len(epochs):
        e = _table("Whole epochs (digits, quick preset): seconds and shares of the epoch",
                   "precision", "method", "epoch s", "steps s", "eval s", "outside", "data+books", "eval")  # fmt: skip
        for r in epochs.itertuples():
            e.add_row(r.precision, r.method, f"{r.epoch_s:.2f}", f"{r.steps_s:.2f}", f"{r.eval_s:.2f}",
                      f"{100 * r.outside_share:.1f}%", f"{100 * r.data_share:.1f}%",
                      f"{100 * r.eval_share:.1f}%")  # fmt: skip
        console.print(e)
    flushed = bool(table["flush_denormal"].all())
    console.print(f"flush-to-zero of denormal floats: {'on' if flushed else 'OFF'}; "
                  f"load average {table['load_average'].iloc[-1]:.2f}; "
                  f"threads {table['threads'].iloc[0]}")  # fmt: skip


def _table(title: str, *columns: str):
    """A compact rich table."""
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for col in columns:
        t.add_column(col, justify="right")
    return t
