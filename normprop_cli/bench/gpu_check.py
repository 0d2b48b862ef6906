"""`normprop gpu-check` (make gpu-check): what only a CUDA GPU can check, in one command.

    make gpu-check        (or normprop gpu-check [--methods a,b] [--budget S] [--results-dir DIR])
                          -> results/bench/gpu/{cuda_tests.txt, bench.csv, epochs.csv, SUMMARY.md}

1. The CUDA tests: `python -m pytest -q -rs -k cuda tests` in a subprocess, from the checkout the
   package runs from: every test with `cuda` in its name or parameters (a CUDA graph replays the
   eager steps exactly, NormProp's folded bfloat16 path on the GPU); their output goes to
   cuda_tests.txt.
2. Steps (bench.csv, timing.COLUMNS): every method of nn.methods.METHODS stepped side by side, as
   `normprop bench` does, at widths 1.0 and 0.25 and batches 1, 50 and 100, under two sets of
   options: `plain` (NCHW, eager: what the trainer does on CUDA by default) and
   `channels_last+cuda_graph` (the whole step one CUDA graph), each in float32 and, where the GPU
   has bf16 tensor cores (`device.bf16_supported`), under bfloat16 autocast. `budget_s` seconds
   of timed rounds per configuration (all methods together).
3. Epochs (epochs.csv, timing.EPOCH_COLUMNS + options, train_images_per_s): one epoch of the
   paper's CIFAR-10 protocol (section 5: NIN width 1.0, batch 50, batch data normalisation, SGD
   with momentum, then evaluation of 5,000 validation and 10,000 test images) after one warm-up
   epoch, every method in turn, plain float32 and with the fastest options (channels_last, a CUDA
   graph and bfloat16 where native). The data are CIFAR-shaped and synthetic (the `synthetic`
   data set with 45,000 / 5,000 / 10,000 images of 3x32x32 in 10 classes, generated in memory):
   an epoch's work does not depend on the pixels, and nothing needs downloading.
4. SUMMARY.md: the device and versions, the tests' outcome, the step medians (ms, one column per
   method) and the epochs.

The data of 2 and 3 are the same CIFAR-shaped images. A method whose step fails under a set of
options (say, one that cannot be captured in a CUDA graph) is left out of those rows and named,
with its error, in SUMMARY.md. torch.compile is not timed (minutes of compiling per method).
Exit status: 0 when the tests passed and every method ran, 1 otherwise. Without CUDA: one line
on stderr, exit status 2, nothing run and nothing written.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from normprop_cli import device as devices
from normprop_cli import io
from normprop_cli.engine.step import StepOptions
from normprop_cli.errors import UserError
from normprop_cli.statistics import markdown

CIFAR_SIZES = (45_000, 5_000, 10_000)  # train / val / test, the paper's CIFAR-10 split (section 5)
PYTEST = ("-m", "pytest", "-q", "-rs", "-k", "cuda", "tests")
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
    batch_sizes: Sequence[int] = (1, 50, 100),
    widths: Sequence[float] = (1.0, 0.25),
    tests: bool = True,
) -> int:
    """Run the CUDA tests, time steps and CIFAR-10 epochs; write results/bench/gpu/; exit status."""
    from normprop_cli import bench, config
    from normprop_cli.bench.timing import COLUMNS, describe, epoch_table, failing_methods, step_table
    from normprop_cli.data import load_dataset
    from normprop_cli.engine.trainer import steps_per_epoch

    methods = bench.choose_methods(methods)
    dev = cuda_device()
    devices.prepare(dev)
    out = Path(results_dir) / "bench" / "gpu"
    tested = run_cuda_tests(out) if tests else None

    cfg = config.load("table1", preset="paper")  # width 1.0, batch 50, batch data normalisation
    data = load_dataset("synthetic", sizes=CIFAR_SIZES, num_classes=10).to(dev)
    precisions, _ = bench.choose_precisions(dev)
    print(f"{devices.describe(dev)}: {len(methods)} methods, precisions {', '.join(precisions)}", flush=True)
    runs, failed = {}, {}
    for label, opts in OPTION_SETS.items():
        for p, options in bench.precision_runs(StepOptions(**opts), precisions).items():
            broken = failing_methods(data, cfg, dev, options, methods)
            failed |= {(label, p, m): why for m, why in broken.items()}
            runs[(label, p)] = (options, tuple(m for m in methods if m not in broken))

    steps = []
    for (_, p), (options, ok) in runs.items():
        if ok:
            print(f"steps: {describe(options)}, {p}", flush=True)
            steps.append(step_table(data, cfg, dev, widths, batch_sizes, {p: options}, ok, budget_s=budget_s))
    steps = pd.concat(steps, ignore_index=True) if steps else pd.DataFrame(columns=COLUMNS)
    io.write_csv(out / "bench.csv", steps)

    fastest = ("channels_last+cuda_graph", precisions[-1])
    epochs = []
    for key in (("plain", "float32"), fastest):
        options, ok = runs[key]
        if ok:
            print(f"CIFAR-10 epochs: {describe(options)}, {key[1]}", flush=True)
            table = epoch_table(data, cfg, dev, 1, options, ok)
            table["options"] = describe(options)
            bs = int(cfg.train.batch_size)
            table["train_images_per_s"] = steps_per_epoch(len(data.train), bs) * bs / table["train_s"]
            epochs.append(table)
    epochs = pd.concat(epochs, ignore_index=True) if epochs else pd.DataFrame()
    io.write_csv(out / "epochs.csv", epochs)

    protocol = (
        f"NIN width {cfg.model.width:g}, batch {cfg.train.batch_size}, {len(data.train):,} CIFAR-shaped synthetic "
        f"training images, then evaluation of {len(data.val):,} + {len(data.test):,}; after one warm-up epoch"
    )
    summary = io.write_text(out / "SUMMARY.md", summarise(dev, tested, steps, epochs, failed, protocol))
    print(f"wrote {out / 'bench.csv'}, {out / 'epochs.csv'}, {summary}")
    passed = tested is None or tested[0] == 0
    return 0 if passed and not failed else 1


def run_cuda_tests(out: Path) -> tuple[int, str] | None:
    """`pytest -k cuda` in the checkout beside the package: (exit status, output), also written to
    cuda_tests.txt; None where there is no tests/ directory (an installed wheel)."""
    root = Path(__file__).resolve().parents[2]  # the checkout: normprop_cli/bench/gpu_check.py
    if not ((root / "tests").is_dir() and (root / "pyproject.toml").is_file()):
        io.write_text(out / "cuda_tests.txt", f"no tests/ directory in {root}: the CUDA tests were not run\n")
        return None
    command = [sys.executable, *PYTEST]
    print(f"$ {' '.join(command[1:])}  (in {root})", flush=True)
    done = subprocess.run(command, cwd=root, capture_output=True, text=True)
    text = f"$ python {' '.join(PYTEST)}\n{done.stdout}{done.stderr}exit status {done.returncode}\n"
    io.write_text(out / "cuda_tests.txt", text)
    print(_last_line(done.stdout), flush=True)
    return done.returncode, done.stdout


def summarise(dev, tested, steps: pd.DataFrame, epochs: pd.DataFrame, failed: dict, protocol: str) -> str:
    """SUMMARY.md: device, versions, tests, step medians per method, CIFAR-10 epochs, failures."""
    lines = [
        f"# gpu-check: {devices.describe(dev)}",
        "",
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}; "
        f"{devices.bf16_supported(dev)[1]}.",
        "",
        "## CUDA tests",
        "",
    ]
    if tested is None:
        lines.append("Not run (no tests/ directory beside the package, or --no-tests).")
    else:
        code, output = tested
        lines.append(f"`python {' '.join(PYTEST)}`: {_last_line(output)} (exit status {code}); cuda_tests.txt.")
    lines += ["", "## Training steps (bench.csv): median ms per step, methods side by side", ""]
    if len(steps):
        table = steps.pivot_table(
            index=["width", "batch_size", "precision", "options"], columns="method", values="step_ms_median", sort=False
        )
        cols = [m for m in dict.fromkeys(steps["method"]) if m in table.columns]
        rows = [[f"{w:g}", str(bs), p, o, *(_ms(r[m]) for m in cols)] for (w, bs, p, o), r in table[cols].iterrows()]
        lines += markdown(rows, ["width", "batch", "precision", "options", *cols])
    lines += ["", "## One epoch of the CIFAR-10 protocol (epochs.csv)", ""]
    lines += [f"{protocol}. epoch s = train s + eval s.", ""]
    if len(epochs):
        rows = [
            [r.method, r.precision, r.options, f"{r.epoch_s:.2f}", f"{r.train_s:.2f}", f"{r.eval_s:.2f}",
             f"{r.train_images_per_s:,.0f}"]
            for r in epochs.itertuples()
        ]  # fmt: skip
        lines += markdown(rows, ["method", "precision", "options", "epoch s", "train s", "eval s", "train images/s"])
    if failed:
        lines += ["", "## Left out: the step failed", ""]
        lines += [f"- {m} ({label}, {p}): {why}" for (label, p, m), why in failed.items()]
    return "\n".join(lines) + "\n"


def _ms(value: float) -> str:
    return "" if pd.isna(value) else f"{value:.3g}"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip("= ") if lines else "no output"
