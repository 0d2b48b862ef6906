"""`normprop bench`: the NIN training step with each normalisation, timed (paper section 5.6).

    normprop bench        (or make bench) -> results/bench/bench.csv, results/bench/epochs.csv
    normprop bench --methods none,batchnorm,normprop-icml      a subset of the methods

This module chooses what to time and writes the CSVs; timing.py times (each step by its own
engine.step.StepClock), report.py prints the tables.

Methods. Every registered method of `nn.methods.METHODS` (none, batchnorm, batchrenorm, weightnorm,
layernorm, groupnorm, ws-gn, scaledws, frn, evonorm, online, normprop-icml, normprop-arxiv,
normprop-icml-own-classifier, and any registered since), or the subset asked for; the `method`
column holds that name. A method's settings (`norm`, NormProp's `jacobian`, scaled WS's gradient
clipping) come from its registration; NormProp's unit-norm constraint follows every step of a
model with NormProp layers.
`ratio_vs_none` and `ratio_vs_batchnorm` are the median over rounds of a method's step time over
none's (batchnorm's) in the same round, `_low` and `_high` its distribution-free 95% interval
(timing.paired_ratio; empty where that method was not timed). `ratio_vs_fastest_independent` is the same
against `fastest_independent`: of the methods timed at that configuration, the batch-independent normaliser
(`Method.batch_statistics` False, none excepted; NormProp's forms included) with the lowest median step
(timing.reference_ratios; empty where no such method was timed).

Steps. For each width and batch size the methods are built side by side and stepped in turn,
in a new seeded order every round, so that whatever else slows the machine hits all of them alike and
no method always follows the same other one.
A step is the trainer's (engine.step): forward, cross-entropy, backward, SGD and, for NormProp,
the unit-norm constraint, on a batch of digits already normalised and on the device. The figure
is the median of the timed steps after the warm-up ones; `steps=None` times as many rounds (one
step of every method each) as fit in `budget_s` seconds per configuration, but at least 100 at
batch 1 and 30 at other batch sizes (timing.LEAST_STEPS), whatever the number of methods,
and at most 400: with many methods a configuration's rounds can take longer than the budget, so
every ratio rests on enough paired steps to carry an interval. On the CPU the same steps also
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
`ops_per_step` is the operator calls of a method's step (torch.profiler, two untimed steps after the
timed ones; the ATen calls made from Python or autograd, not those inside an operator): at batch 1 a
step's time is mostly a fixed cost per call. `gflop_per_step` is the convolutions' floating-point
operations of one step, forward and backward (torch.utils.flop_counter; the same for every method of a
configuration, since the normalisations' own work is not counted), and `gflops` those over the median step
time: how near the step runs to the hardware's peak (a core's float32 peak: FMA units x float32 lanes x 2 x clock).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from normprop_cli import device as devices
from normprop_cli import io
from normprop_cli.bench.timing import epoch_table, step_table
from normprop_cli.data import Dataset, load_dataset
from normprop_cli.engine.step import StepOptions
from normprop_cli.nn.methods import METHODS

PRECISIONS = ("float32", "bfloat16")


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
    runs = precision_runs(options, precisions)
    data = bench_data(cfg, dev)
    table = step_table(data, cfg, dev, widths, batch_sizes, runs, methods, steps, warmup, budget_s)
    out = Path(results_dir) / "bench"
    io.write_csv(out / "bench.csv", table)
    table.attrs["epochs"] = None
    if epochs:
        tables = [epoch_table(data, cfg, dev, epochs, opts, methods) for opts in runs.values()]
        table.attrs["epochs"] = pd.concat(tables, ignore_index=True)
        io.write_csv(out / "epochs.csv", table.attrs["epochs"])
    if not quiet:
        from normprop_cli.bench.report import show

        show(table)
    return table


def bench_data(cfg, dev: torch.device) -> Dataset:
    """The preset's data set on `dev`: digits (smoke: synthetic), built in, so nothing to download."""
    d = cfg.dataset
    return load_dataset(d.name, split_seed=int(d.split_seed), limit=d.limit).to(dev)


def choose_methods(methods: Sequence[str] | None = None) -> tuple[str, ...]:
    """Some of METHODS, in METHODS' order (default: all of them); ValueError on an unknown name."""
    if methods is None:
        return tuple(METHODS)
    asked = {m.strip() for m in methods}
    unknown = sorted(asked - set(METHODS))
    if unknown or not asked:
        raise ValueError(f"unknown method {', '.join(unknown)!r}; use some of {', '.join(METHODS)}")
    return tuple(m for m in METHODS if m in asked)


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


def precision_runs(options: StepOptions, precisions: Sequence[str]) -> dict[str, StepOptions]:
    """{precision: `options` in it}: bfloat16 is autocast (`amp`), float32 is not."""
    return {p: dataclasses.replace(options, amp=p == "bfloat16") for p in precisions}
