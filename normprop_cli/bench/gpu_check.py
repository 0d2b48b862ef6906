"""`normprop gpu-check` (make gpu-check): what only a CUDA GPU can check, and the steps runs take there timed,
in one command within its own time cap (CAP_S, 5 minutes: an item starts only while the time it needs is left,
NEEDS, else it fails as not run).

    make gpu-check        (or normprop gpu-check [--methods a,b] [--budget S] [--no-tests] [--results-dir DIR])
                          -> results/bench/gpu/{SUMMARY.md, cuda_tests.txt, bench.csv, kernels.csv,
                             step_times.csv, plan.csv, plan_gpu.csv}

The items, in order (bench/gpu_items.py, gpu_bench.py, gpu_fold.py; each passes or fails on its own):
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
  bench           the paired bench of gpu_bench.BENCH_METHODS (none, BatchNorm, NormProp, weight norm, GroupNorm,
                  LayerNorm) in the options runs use (no channels_last, a CUDA graph), float32 and bfloat16,
                  batch 1, 50 and 100, 3x32x32 and 1x32x32, width 1.0, `--budget` seconds a configuration:
                  bench.csv, and the targets read from it (gpu_bench.TARGETS); passes where every configuration
                  is timed and every loss finite
  kernels         kernels per step of each of those methods at batch 1 and 50 (torch.profiler), the ten
                  dearest, beside the count from the ATen operations: kernels.csv
  fold            NormProp's fused weight side against the batched one (gpu_fold): their steps paired, their
                  kernels, their losses within gpu_fold.GAP; "not available" where the package has one fold
  projection      `normprop reproduce-all --preset paper` (plan.csv; passes where it fits in a day) and
                  `--preset gpu` (plan_gpu.csv) planned (experiments.plan) into empty results directories and
                  priced by step times measured here for every configuration they need (bench.step_times.measure)
  deterministic   two runs of each of the bench's methods under --deterministic, 20 steps each: the same
                  losses bit for bit; the median ms of a deterministic step
  resume-table1, resume-covariate-shift   `normprop run table1` (its grid: flips on two of the four runs)
                  and `normprop run covariate-shift` (its probes) on CIFAR-10 python pickles written on the
                  spot (tiny: 1,000 training images), 2 epochs, in a subprocess killed (SIGKILL) as soon as a
                  first epoch's manifest appears, then run again: every run complete

step_times.csv holds the plans' measured configurations and, for those they lack, the bench's float32 medians
(Fashion-MNIST's 1x32x32 at batch 1, 50 and 100 among them). SUMMARY.md gives pass or fail per item with what
was found. Exit status: 0 when every item passed, 1 otherwise; without CUDA one line on stderr, exit status 2,
nothing run and nothing written. `normprop run ... --step-times results/bench/gpu/step_times.csv` prices any
plan with them.
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
from normprop_cli.bench.gpu_bench import BATCH_SIZES, BENCH_METHODS, SHAPES
from normprop_cli.bench.gpu_items import Item
from normprop_cli.errors import UserError
from normprop_cli.statistics import markdown

CAP_S = 300.0  # gpu-check's own time cap, seconds
DAY_S = 86_400.0  # the projection's budget: reproduce-all --preset paper in one GPU-day
PYTEST = ("-m", "pytest", "-q", "-rs", "-k", "cuda", "tests")
# The least seconds each item needs to start (else it fails as not run); the CUDA tests and the runs in
# subprocesses get the time left as their timeout.
NEEDS = {"cuda-tests": 60, "methods": 20, "syncs": 15, "cpu-agreement": 15, "bench": 60, "kernels": 15,
         "deterministic": 15, "fold": 15, "projection": 30, "resume-table1": 45,
         "resume-covariate-shift": 40}  # fmt: skip


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
    batch_sizes: Sequence[int] = BATCH_SIZES,
    widths: Sequence[float] = (1.0,),
    tests: bool = True,
    project: Callable[..., pd.DataFrame] | None = None,
    cap_s: float = CAP_S,
    shapes: Sequence[str] = SHAPES,
    fashion_plan: Callable[..., pd.DataFrame] | None = None,
    precisions: Sequence[str] | None = None,
) -> int:
    """Run the items (module docstring) within `cap_s` seconds; write results/bench/gpu/; the exit status.
    `project(times=..., results_dir=...)` is the plan to price (the CLI's: reproduce-all --preset paper,
    experiments.plan.project), None to leave that item out; `fashion_plan` likewise the gpu preset's;
    `precisions` the bench's (default: float32, and bfloat16 where the device computes in it natively)."""
    from normprop_cli import bench, config
    from normprop_cli.bench import gpu_items as items

    methods = bench.choose_methods(methods)
    benched = tuple(m for m in BENCH_METHODS if m in methods) or methods
    dev = cuda_device()
    precisions = bench.choose_precisions(dev, precisions)[0]
    devices.prepare(dev)
    out = Path(results_dir) / "bench" / "gpu"
    start, found, measured = time.monotonic(), [], {}
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
    for width in widths:
        check("bench", lambda w=width: bench_item(cfg, dev, benched, w, batch_sizes, shapes, precisions, budget_s, out))
    check("kernels", lambda: kernels_item(cfg, dev, benched, widths[0], out))
    check("fold", lambda: fold_item(cfg, dev, widths[0]))
    scratch = Path(tempfile.mkdtemp(prefix="normprop-gpu-check-"))
    try:
        if project is not None:
            plans = {"paper": project} | ({"gpu": fashion_plan} if fashion_plan else {})
            check("projection", lambda: projection(plans, dev, out, scratch / "empty", measured))
        # after the in-process items: an operation without a deterministic kernel raises, mid-step
        check("deterministic", lambda: deterministic_item(cfg, dev, benched, widths[0]))
        data_dir = items.write_cifar10(scratch / "data")
        for experiment in ("table1", "covariate-shift"):
            check(f"resume-{experiment}", lambda e=experiment: items.resumed_run(
                e, data_dir, scratch / "results", str(dev), left()))  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    write_step_times(out, measured, dev)
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


def projection(plans: dict[str, Callable[..., pd.DataFrame]], dev: torch.device, out: Path, empty: Path,
               measured: dict) -> Item:  # fmt: skip
    """Each preset's reproduce-all (`plans`: the paper's first) priced by step times measured here (into
    `measured`): plan.csv (the paper preset's), plan_<preset>.csv for the others."""
    from normprop_cli.bench import step_times
    from normprop_cli.engine.cost import duration

    def times(needed):
        measured.update(step_times.measure({k: c for k, c in needed.items() if k not in measured}, dev))
        return measured

    rows, fits, lines = [], True, []
    for preset, project in plans.items():
        frame = project(times=times, results_dir=empty / preset)
        io.write_csv(out / ("plan.csv" if preset == "paper" else f"plan_{preset}.csv"), frame)
        total = frame.iloc[-1]
        rows += [f"- {preset}: {r.experiment}: {int(r.runs)} runs + {int(r.sweep_runs)} sweep runs, "
                 f"{int(r.sgd_steps):,} steps, {duration(r.est_seconds)} (sweeps at most {duration(r.est_seconds_max)})"
                 for r in frame.itertuples()]  # fmt: skip
        fits &= preset != "paper" or float(total.est_seconds) <= DAY_S
        most = duration(total.est_seconds_max)
        lines.append(f"reproduce-all --preset {preset}: {int(total.runs)} runs + {int(total.sweep_runs)} sweep "
                     f"runs, {duration(total.est_seconds)} on this GPU (at most {most})")  # fmt: skip
    line = f"{'; '.join(lines)}; {len(measured)} step configurations measured; the paper's budget {duration(DAY_S)}"
    return Item("projection", fits, line, rows)


def write_step_times(out: Path, measured: dict, dev: torch.device) -> None:
    """step_times.csv: the plans' measured configurations, and the bench's float32 medians (the default options)
    of every configuration they lack (Fashion-MNIST's 1x32x32 at batch 1, 50 and 100, for one)."""
    from normprop_cli.bench import step_times
    from normprop_cli.engine.cost import StepKey

    times = dict(measured)
    path = out / "bench.csv"
    if path.exists():
        bench = pd.read_csv(path)
        bench = bench[(bench["precision"] == "float32") & bench["step_ms_median"].notna()]
        for r in bench.itertuples():
            times.setdefault(StepKey(r.method, int(r.batch_size), float(r.width), r.shape), float(r.step_ms_median))
    if times:
        step_times.write(out / "step_times.csv", times, dev, "the config's defaults on this device")


def bench_item(cfg, dev, methods, width, batch_sizes, shapes, precisions, budget_s: float, out: Path) -> Item:
    """The paired bench in the default layout (gpu_bench.paired_bench): bench.csv, and the targets read from it."""
    from normprop_cli.bench import gpu_bench
    from normprop_cli.engine.progress import console

    with console.capture():  # a step whose capture fails runs eagerly: the methods item names those
        steps = gpu_bench.paired_bench(cfg, dev, methods, width, shapes, batch_sizes, precisions, budget_s)
    io.write_csv(out / "bench.csv", steps)
    expected = len(methods) * len(batch_sizes) * len(shapes) * steps["precision"].nunique()
    timed = int((steps["step_ms_median"].notna() & (steps["steps"] > 0)).sum())
    unfinite = sorted({f"{r.method} ({r.shape}, batch {r.batch_size}, {r.precision})"
                       for r in steps.itertuples() if not bool(r.finite)})  # fmt: skip
    met = [t for t in gpu_bench.targets(steps) if t[3] is not None]
    line = (f"{timed} of {expected} configurations timed (width {width:g}, default options), bench.csv; targets met: "
            f"{sum(bool(t[3]) for t in met)} of {len(met)} measured" + (
            f"; losses not finite, left out of the ratios: {', '.join(unfinite)}" if unfinite else ""))  # fmt: skip
    details = [*gpu_bench.target_lines(steps), "", "Median ms per step (bench.csv):", "",
               *gpu_bench.bench_table(steps)]  # fmt: skip
    return Item("bench", timed == expected and not unfinite, line, details)


def kernels_item(cfg, dev, methods, width, out: Path) -> Item:
    """Kernels per step per method (gpu_bench.kernel_profile): kernels.csv."""
    from normprop_cli.bench import gpu_bench

    with console_capture():
        frame = gpu_bench.kernel_profile(cfg, dev, methods, width=width)
    io.write_csv(out / "kernels.csv", frame)
    largest = int(frame["batch_size"].max())
    per = "; ".join(f"{r.method} {r.kernels_per_step:g}" for r in frame[frame["batch_size"] == largest].itertuples())
    details = [f"- {r.method}, batch {r.batch_size}: {r.kernels_per_step:g} a step (counted from its ATen "
               f"operations: {r.counted_per_step:g}), {r.device_ms_per_step:.3g} ms of device time; the ten "
               f"dearest: {r.top_kernels}" for r in frame.itertuples()]  # fmt: skip
    line = f"kernels per step at batch {largest} ({frame['source'].iloc[0]}): {per}; kernels.csv"
    return Item("kernels", len(frame) > 0, line, details)


def deterministic_item(cfg, dev, methods, width) -> Item:
    from normprop_cli.bench import gpu_bench

    same, lines = gpu_bench.deterministic_repeat(cfg, dev, methods, width=width)
    line = f"--deterministic, two runs of each of {len(methods)} methods, {gpu_bench.REPEAT_STEPS} steps: " + (
        "the same losses bit for bit" if same else "some differ (details)")  # fmt: skip
    return Item("deterministic", same, line, lines)


def fold_item(cfg, dev, width) -> Item:
    from normprop_cli.bench import gpu_fold

    with console_capture():
        passed, line, details = gpu_fold.item_lines(gpu_fold.compare(cfg, dev, width=width))
    return Item("fold", passed, line, details)


def console_capture():
    from normprop_cli.engine.progress import console

    return console.capture()


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


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip("= ") if lines else "no output"
