"""`normprop gpu-check` (make gpu-check): what only a CUDA GPU can check, in one command, within its own
time cap (CAP_S, 8 minutes: an item starts only while the time it needs is left, else it fails as not run).

    make gpu-check        (or normprop gpu-check [--methods a,b] [--budget S] [--no-tests] [--results-dir DIR])
                          -> results/bench/gpu/{SUMMARY.md, cuda_tests.txt, step_times.csv, plan.csv, bench.csv}

The items, in order (bench/gpu_items.py; each passes or fails on its own):
  cuda-tests      `python -m pytest -q -rs -k cuda tests` in a subprocess, from the checkout the package
                  runs from (every test with `cuda` in its name or parameters); output in cuda_tests.txt
  methods         every method of nn.methods.METHODS stepped by the trainer (engine.trainer.make_run) under
                  the default options on CUDA (a CUDA graph): "graph", or "eager" with the reason where
                  capture failed and the run goes on eagerly (not a failure); a failure where it raises or
                  its loss is not finite. Width 1.0 (the paper preset's NIN), batch 100 (its largest)
  memory          the peak of torch.cuda.max_memory_allocated over those methods' steps: under 90% of the GPU
  syncs           host synchronisations per warm step of every method, counted with
                  torch.cuda.set_sync_debug_mode("warn") (its warnings caught, gpu_items.SYNC_WARNING): none;
                  and those of an epoch
  cpu-agreement   5 SGD steps of NormProp and BatchNorm on the GPU and the same 5 (weights, batches) on the
                  CPU: every loss within gpu_items.AGREEMENT_TOLERANCE (3%, relative; cuDNN's convolutions
                  run in TF32 on the GPU, the CPU's in float32); 5, since later steps amplify rounding
                  (gpu_items.AGREEMENT_STEPS)
  resume-table1, resume-covariate-shift   `normprop run table1` (its grid: flips on two of the four runs)
                  and `normprop run covariate-shift` (its probes) on CIFAR-10 python pickles written on the
                  spot (tiny: 1,000 training images), 2 epochs, in a subprocess killed (SIGKILL) as soon as a
                  first epoch's manifest appears, then run again: every run complete
  projection      `normprop reproduce-all --preset paper` planned (experiments.plan) into an empty results
                  directory and priced by this GPU's step times, measured for every step configuration the
                  plan needs (bench.step_times.measure: 5 timed steps each, default options): step_times.csv,
                  plan.csv; passes where the total fits in a day (24 hours)
  bench           the methods' steps side by side (timing.step_table), `plain` against
                  `channels_last+cuda_graph`, float32, widths x batch sizes: bench.csv (informative: passes
                  where every configuration is timed; losses that are not finite are named, not failed: the
                  bench trains on random labels at the preset's rate, where NormProp diverges at batch 1 on
                  the CPU too, results/bench/bench.csv)

SUMMARY.md gives pass or fail per item with what was found. Exit status: 0 when every item passed, 1
otherwise; without CUDA one line on stderr, exit status 2, nothing run and nothing written.
`python -m normprop_cli run ... --step-times results/bench/gpu/step_times.csv` prices any plan with them.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
import torch

from normprop_cli import device as devices
from normprop_cli import io
from normprop_cli.bench.gpu_items import Item
from normprop_cli.engine.step import StepOptions
from normprop_cli.errors import UserError
from normprop_cli.statistics import markdown

CAP_S = 480.0  # gpu-check's own time cap, seconds
DAY_S = 86_400.0  # the projection's budget: reproduce-all --preset paper in one GPU-day
PYTEST = ("-m", "pytest", "-q", "-rs", "-k", "cuda", "tests")
# The least seconds each item needs to start (else it fails as not run); the CUDA tests and the runs in
# subprocesses get the time left as their timeout.
NEEDS = {"cuda-tests": 60, "methods": 20, "syncs": 15, "cpu-agreement": 15, "resume-table1": 60,
         "resume-covariate-shift": 45, "projection": 60, "bench": 30}  # fmt: skip
OPTION_SETS = {
    "plain": {},
    "channels_last+cuda_graph": {"channels_last": True, "cuda_graph": True},
}


def cuda_device() -> torch.device:
    """The GPU that gpu-check runs on, chosen in device.py; a UserError (exit 2) without one."""
    try:
        dev = devices.resolve("cuda")
    except UserError:
        raise UserError(
            "gpu-check needs a CUDA GPU and torch sees none on this machine; nothing was run or written"
        ) from None
    return dev


def run_gpu_check(
    results_dir: str | Path = "results",
    methods: Sequence[str] | None = None,
    budget_s: float = 5.0,
    batch_sizes: Sequence[int] = (1, 50),
    widths: Sequence[float] = (1.0,),
    tests: bool = True,
    project: Callable[..., pd.DataFrame] | None = None,
    cap_s: float = CAP_S,
) -> int:
    """Run the items (module docstring) within `cap_s` seconds; write results/bench/gpu/; the exit status.
    `project(times=..., results_dir=...)` is the plan to price (the CLI's: reproduce-all --preset paper,
    experiments.plan.project), None to leave that item out."""
    from normprop_cli import bench, config
    from normprop_cli.bench import gpu_items as items

    methods = bench.choose_methods(methods)
    dev = cuda_device()
    devices.prepare(dev)
    out = Path(results_dir) / "bench" / "gpu"
    start, found = time.monotonic(), []
    left = lambda: cap_s - (time.monotonic() - start)  # noqa: E731
    cfg = config.load("table1", preset="paper")  # the paper's NIN (width 1.0), its options on this device
    print(f"gpu-check on {devices.describe(dev)}: {len(methods)} methods, {cap_s:.0f} s at most", flush=True)

    def check(name: str, run: Callable[[], Item | tuple[Item, ...]]) -> None:
        if left() < NEEDS.get(name, 0):
            found.append(Item(name, False, f"not run: the {cap_s:.0f} s cap left {max(left(), 0):.0f} s"))
        else:
            found.extend(items.attempt(name, run))
        for item in found[-2 if name == "methods" else -1 :]:
            print(f"{'pass' if item.passed else 'FAIL'}  {item.name}: {item.line}", flush=True)

    if tests:
        check("cuda-tests", lambda: cuda_tests_item(out, left()))
    check("methods", lambda: items.method_steps(cfg, dev, methods))
    check("syncs", lambda: items.host_syncs(cfg, dev, methods))
    check("cpu-agreement", lambda: items.agreement(cfg, dev, torch.device("cpu")))
    scratch = Path(tempfile.mkdtemp(prefix="normprop-gpu-check-"))
    try:
        data_dir = items.write_cifar10(scratch / "data")
        for experiment in ("table1", "covariate-shift"):
            check(f"resume-{experiment}", lambda e=experiment: items.resumed_run(
                e, data_dir, scratch / "results", str(dev), left()))  # fmt: skip
        if project is not None:
            check("projection", lambda: projection(project, dev, out, scratch / "empty"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    check("bench", lambda: bench_item(cfg, dev, methods, widths, batch_sizes, budget_s, out))
    summary = io.write_text(out / "SUMMARY.md", summarise(dev, found, cap_s, time.monotonic() - start))
    passed = sum(i.passed for i in found)
    print(f"{passed} of {len(found)} items passed; wrote {summary}", flush=True)
    return 0 if passed == len(found) else 1


def cuda_tests_item(out: Path, timeout: float) -> Item:
    tested = run_cuda_tests(out, timeout)
    if tested is None:
        return Item("cuda-tests", True, "not run: no tests/ directory beside the package (an installed wheel)")
    code, output = tested
    return Item("cuda-tests", code == 0, f"`python {' '.join(PYTEST)}`: {_last_line(output)} (exit status {code})")


def projection(project: Callable[..., pd.DataFrame], dev: torch.device, out: Path, empty: Path) -> Item:
    """reproduce-all --preset paper (project) priced by step times measured here: step_times.csv, plan.csv."""
    from normprop_cli.bench import step_times
    from normprop_cli.engine.cost import duration

    measured = {}

    def times(needed):
        measured.update(step_times.measure(needed, dev))
        return measured

    frame = project(times=times, results_dir=empty)
    step_times.write(out / "step_times.csv", measured, dev, "the config's defaults on this device")
    io.write_csv(out / "plan.csv", frame)
    total = frame.iloc[-1]
    rows = [
        f"- {r.experiment}: {int(r.runs)} runs + {int(r.sweep_runs)} sweep runs, {int(r.sgd_steps):,} steps, "
        f"{duration(r.est_seconds)} (sweeps at most {duration(r.est_seconds_max)})"
        for r in frame.itertuples()
    ]
    line = (
        f"reproduce-all --preset paper: {int(total.runs)} runs + {int(total.sweep_runs)} sweep runs, "
        f"{duration(total.est_seconds)} on this GPU ({len(measured)} step configurations measured; "
        f"at most {duration(total.est_seconds_max)} if every sweep extends); budget {duration(DAY_S)}"
    )
    return Item("projection", float(total.est_seconds) <= DAY_S, line, rows)


def bench_item(cfg, dev, methods, widths, batch_sizes, budget_s: float, out: Path) -> Item:
    """The methods' steps side by side under OPTION_SETS, float32: bench.csv (timing.COLUMNS)."""
    from normprop_cli.bench.timing import step_table
    from normprop_cli.engine.progress import console

    with console.capture():  # a step whose capture fails runs eagerly: the methods item names those
        runs = [step_table(items_data(dev), cfg, dev, widths, batch_sizes, {"float32": StepOptions(**opts)}, methods,
                           budget_s=budget_s) for opts in OPTION_SETS.values()]  # fmt: skip
    steps = pd.concat(runs, ignore_index=True)
    io.write_csv(out / "bench.csv", steps)
    table = steps.pivot_table(index=["width", "batch_size", "options"], columns="method", values="step_ms_median",
                              sort=False)  # fmt: skip
    cols = [m for m in dict.fromkeys(steps["method"]) if m in table.columns]
    rows = [[f"{w:g}", str(bs), o, *(_ms(r[m]) for m in cols)] for (w, bs, o), r in table[cols].iterrows()]
    expected = len(methods) * len(widths) * len(batch_sizes) * len(OPTION_SETS)
    timed = int((steps["step_ms_median"].notna() & (steps["steps"] > 0)).sum())
    unfinite = sorted(set(steps.loc[~steps["finite"].astype(bool), "method"]))
    line = f"{timed} of {expected} configurations timed, median ms per step in bench.csv" + (
        f"; losses not finite, timed all the same: {', '.join(unfinite)}" if unfinite else "")  # fmt: skip
    return Item("bench", timed == expected, line, markdown(rows, ["width", "batch", "options", *cols]))


def items_data(dev: torch.device):
    from normprop_cli.bench.gpu_items import shaped_data

    return shaped_data(dev, 512)


def run_cuda_tests(out: Path, timeout: float | None = None) -> tuple[int, str] | None:
    """`pytest -k cuda` in the checkout beside the package: (exit status, output), also written to
    cuda_tests.txt; None where there is no tests/ directory (an installed wheel)."""
    root = Path(__file__).resolve().parents[2]  # the checkout: normprop_cli/bench/gpu_check.py
    if not ((root / "tests").is_dir() and (root / "pyproject.toml").is_file()):
        io.write_text(out / "cuda_tests.txt", f"no tests/ directory in {root}: the CUDA tests were not run\n")
        return None
    command = [sys.executable, *PYTEST]
    print(f"$ {' '.join(command[1:])}  (in {root})", flush=True)
    try:
        done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        text = f"{exc.stdout or ''}{exc.stderr or ''}" if isinstance(exc.stdout, str) else ""
        done = subprocess.CompletedProcess(command, 124, f"{text}\ntimed out after {timeout:.0f} s\n", "")
    text = f"$ python {' '.join(PYTEST)}\n{done.stdout}{done.stderr}exit status {done.returncode}\n"
    io.write_text(out / "cuda_tests.txt", text)
    print(_last_line(done.stdout), flush=True)
    return done.returncode, done.stdout


def summarise(dev, found: Sequence[Item], cap_s: float, elapsed: float) -> str:
    """SUMMARY.md: the device and versions, pass or fail per item with what was found, then each item's lines."""
    passed = sum(i.passed for i in found)
    lines = [
        f"# gpu-check: {devices.describe(dev)}",
        "",
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}; {devices.bf16_supported(dev)[1]}.",
        "",
        f"**{passed} of {len(found)} items passed** (exit status {0 if passed == len(found) else 1}) in "
        f"{elapsed:.0f} s of the {cap_s:.0f} s cap.",
        "",
    ]
    lines += markdown([[i.name, "pass" if i.passed else "FAIL", f"{i.seconds:.0f}", i.line] for i in found],
                      ["item", "result", "s", "what was found"])  # fmt: skip
    for item in found:
        if item.details:
            lines += ["", f"## {item.name}", "", *item.details]
    return "\n".join(lines) + "\n"


def _ms(value: float) -> str:
    return "" if pd.isna(value) else f"{value:.3g}"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip("= ") if lines else "no output"
