"""The items of `normprop gpu-check` (gpu_check.py runs them in turn, each against the time left): each
is a function of its device, so that every one but the CUDA-only readings also runs on the CPU in tests.
Each returns an `Item`: passed or not, one line of what was found, and the lines SUMMARY.md gives it.

All of them step the trainer's own path (engine.trainer.make_run: data normalisation, the model, the step
under the config's options, the unit-norm constraint), not a copy of it."""

from __future__ import annotations

import math
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from normprop_cli import device as devices
from normprop_cli.bench.timing import method_cfg
from normprop_cli.data import DATA_FILES, load_dataset
from normprop_cli.engine.progress import console
from normprop_cli.engine.step import GraphedStep
from normprop_cli.errors import first_line

AGREEMENT_TOLERANCE = 0.03  # relative, per step's loss: float32 on both, but cuDNN's convolutions in TF32 on CUDA
# The steps compared: few, since at the paper's rate (0.05, batch 50) the NIN's training on the synthetic data
# amplifies rounding within about ten steps; on the CPU alone, weights scaled by 1 + 1e-6 part NormProp's loss
# from the unscaled run's by 2% at step 8, 11% at step 12 and a factor 3.3 at step 16 (docs/gpu.md, "The first
# GPU run").
AGREEMENT_STEPS = 5
# torch's warning for each synchronising CUDA call under set_sync_debug_mode("warn"); its first use also warns
# that the mode is a prototype, a warning that names synchronisation too but is no sync.
SYNC_WARNING = "called a synchronizing CUDA operation"


@dataclass
class Item:
    name: str
    passed: bool
    line: str  # what was found, one line
    details: list[str] = field(default_factory=list)  # SUMMARY.md's lines for it
    seconds: float = 0.0


def attempt(name: str, check: Callable[[], Item | tuple[Item, ...]]) -> list[Item]:
    """`check()`'s item(s), timed; an exception is a failed item naming it, never a crash of gpu-check."""
    t0 = time.perf_counter()
    try:
        found = check()
        found = list(found) if isinstance(found, tuple) else [found]
    except Exception as exc:  # any failure of an item is its result
        found = [Item(name, False, f"{type(exc).__name__}: {first_line(exc, 200)}")]
    for item in found:
        item.seconds = (time.perf_counter() - t0) / len(found)
    return found


def shaped_data(dev: torch.device, n: int = 256, num_classes: int = 10):
    """CIFAR-shaped images (3x32x32, `num_classes` classes), generated: the `synthetic` data set."""
    return load_dataset("synthetic", sizes=(n, n // 4, n // 4), num_classes=num_classes).to(dev)


def trainer_run(cfg, data, dev, method: str):
    """The trainer's run (engine.trainer.make_run) of `method`, seeded, under cfg's options on `dev`."""
    from normprop_cli.engine.trainer import make_run

    c = method_cfg(cfg, method)
    c.method = method
    torch.manual_seed(0)
    return make_run(c, data, dev)


def batches(data, batch_size: int, count: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(len(data.train), (batch_size,), generator=gen) for _ in range(count)]


def method_steps(cfg, dev: torch.device, methods: Sequence[str], batch_size: int = 100) -> tuple[Item, Item]:
    """Every method's step under the config's options on `dev` (CUDA: a CUDA graph by default), three
    steps at the config's width and `batch_size`: "graph", or "eager" with the reason where capture failed
    (not a failure), a failure where the step raises or its loss is not finite. Also the peak memory
    (torch.cuda.max_memory_allocated) of each method's model, SGD state and step, as an item of its own."""
    data = shaped_data(dev, max(256, 2 * batch_size))
    idx = batches(data, batch_size, 3)
    rows, failed, peaks = [], [], {}
    for m in methods:
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        try:
            with console.capture() as said:
                run = trainer_run(cfg, data, dev, m)
                losses = [run.step(data.train.x[i.to(dev)], data.train.y[i.to(dev)])[0].clone() for i in idx]
                devices.synchronize(dev)
            finite = bool(torch.isfinite(torch.stack(losses)).all())
            graphed = isinstance(run.step, GraphedStep) and not run.step.eager
            why = " ".join(said.get().split()) if isinstance(run.step, GraphedStep) and run.step.eager else ""
            mode = "graph" if graphed else f"eager ({why or 'the options ask for no CUDA graph'})"
            rows.append(f"- {m}: {mode}{'' if finite else '; a loss is not finite'}")
            if not finite:
                failed.append(m)
        except Exception as exc:  # reported, then the next method
            rows.append(f"- {m}: fails: {type(exc).__name__}: {first_line(exc, 200)}")
            failed.append(m)
        if dev.type == "cuda":
            peaks[m] = torch.cuda.max_memory_allocated(dev)
    eager = sum("eager" in r for r in rows)
    line = (f"{len(methods) - len(failed)} of {len(methods)} methods step at width {cfg.model.width:g}, batch "
            f"{batch_size} ({eager} eager)" + (f"; failing: {', '.join(failed)}" if failed else ""))  # fmt: skip
    steps = Item("methods", not failed, line, rows)
    if not peaks:
        return steps, Item("memory", True, f"not measured on {devices.describe(dev)} (CUDA only)")
    total = torch.cuda.get_device_properties(dev).total_memory
    top = max(peaks, key=peaks.get)
    memory = Item("memory", peaks[top] < 0.9 * total,
                  f"peak {peaks[top] / 2**20:,.0f} MiB ({top}) of {total / 2**30:.0f} GiB, width "
                  f"{cfg.model.width:g}, batch {batch_size}",
                  [f"- {m}: {b / 2**20:,.0f} MiB" for m, b in peaks.items()])  # fmt: skip
    return steps, memory


def count_syncs(call: Callable[[], object], dev: torch.device) -> int:
    """The host synchronisations that `call()` makes on a CUDA device: torch's sync debug mode set to
    warn, its warnings counted; 0 on the CPU (nothing to wait for)."""
    if dev.type != "cuda":
        call()
        return 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return count_sync_warnings(str(w.message) for w in caught)


def count_sync_warnings(messages) -> int:
    """How many of the warnings' `messages` are torch's one per synchronising call (SYNC_WARNING)."""
    return sum(SYNC_WARNING in m for m in messages)


def host_syncs(cfg, dev: torch.device, methods: Sequence[str], steps: int = 5, batch_size: int = 50) -> Item:
    """Host syncs per training step of every method, warm (after capture): none is the trainer's promise
    (engine.step: a step returns device tensors); and those of one whole epoch and its evaluation."""
    from normprop_cli.engine.progress import QuietProgress
    from normprop_cli.engine.trainer import evaluate, train_epoch

    data = shaped_data(dev, max(256, 2 * batch_size))
    idx = [i.to(dev) for i in batches(data, batch_size, steps + 3)]
    rows, bad = [], []
    for m in methods:
        run = trainer_run(cfg, data, dev, m)
        with console.capture():
            for i in idx[:3]:
                run.step(data.train.x[i], data.train.y[i])
        devices.synchronize(dev)
        n = count_syncs(lambda run=run: [run.step(data.train.x[i], data.train.y[i]) for i in idx[3:]], dev) / steps
        rows.append(f"- {m}: {n:g} per step")
        if n:
            bad.append(m)
    run, c = trainer_run(cfg, data, dev, methods[0]), method_cfg(cfg, methods[0])
    with console.capture():
        epoch = count_syncs(lambda: (train_epoch(run, data, c, dev, QuietProgress(1)), evaluate(run, data, c)), dev)
    rows.append(f"- one epoch of {methods[0]} ({len(data.train) // batch_size} steps) and its evaluation: {epoch}")
    line = (
        f"no host sync in a warm step of {len(methods) - len(bad)} of {len(methods)} methods"
        + (f"; syncing: {', '.join(bad)}" if bad else "")
        + f"; {epoch} in an epoch of {methods[0]} and its evaluation"
    )
    return Item("syncs", not bad, line, rows)


def agreement(cfg, dev: torch.device, reference: torch.device, methods: Sequence[str] = ("normprop-icml", "batchnorm"),
              steps: int = AGREEMENT_STEPS, batch_size: int = 50,
              tolerance: float = AGREEMENT_TOLERANCE) -> Item:  # fmt: skip
    """The same `steps` SGD steps (same initial weights, same batches) on `dev` and on `reference` (the
    CPU), each under its device's default options: every step's loss within `tolerance` (relative). Each
    loss is copied as it comes: a CUDA graph's step returns the same output tensor every replay."""
    rows, worst = [], 0.0
    for m in methods:
        losses = {}
        for d in (dev, reference):
            data = shaped_data(d, max(256, 2 * batch_size))
            run = trainer_run(cfg, data, d, m)
            with console.capture():
                out = [
                    run.step(data.train.x[i.to(d)], data.train.y[i.to(d)])[0].clone()
                    for i in batches(data, batch_size, steps)
                ]
            losses[d] = torch.stack(out).double().cpu()
        a, b = losses[dev], losses[reference]
        gap = float(((a - b).abs() / b.abs().clamp_min(1e-6)).max()) if bool(torch.isfinite(a).all()) else math.inf
        worst = max(worst, gap)
        rows.append(f"- {m}: losses {_losses(a)} on {dev}, {_losses(b)} on {reference}; largest relative gap {gap:.2e}")
    line = (f"{steps} steps at width {cfg.model.width:g}, batch {batch_size}: largest relative loss gap {worst:.2e} "
            f"(tolerance {tolerance:g})")  # fmt: skip
    return Item("cpu-agreement", worst <= tolerance, line, rows)


def _losses(v: torch.Tensor) -> str:
    return ", ".join(f"{x:.4f}" for x in v.tolist())


def write_cifar10(root: Path, per_file: int = 200, n_test: int = 200, seed: int = 0) -> Path:
    """Tiny CIFAR-10 python pickles (torchvision's layout: data_batch_1..5, test_batch; a dict with b"data"
    uint8 [N, 3072] and b"labels") in `root`, for the data loader's real path; returns `root`."""
    rng = np.random.default_rng(seed)
    where = Path(root) / DATA_FILES["cifar10"][0]
    where.mkdir(parents=True, exist_ok=True)
    for name in DATA_FILES["cifar10"][1]:
        n = n_test if name == "test_batch" else per_file
        entry = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"labels": [int(v) for v in rng.integers(0, 10, n)], b"batch_label": name.encode()}  # fmt: skip
        with open(where / name, "wb") as f:
            pickle.dump(entry, f, protocol=2)
    return Path(root)


def manifests(results: Path, experiment: str) -> list[dict]:
    import json

    found = []
    for path in sorted((results / experiment / "cifar10" / "runs").glob("*/manifest.json")):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            found.append({"status": "unreadable"})
    return found


def resumed_run(experiment: str, data_dir: Path, results: Path, device: str, timeout: float,
                overrides: Sequence[str] = (), epochs: int = 2, poll: float = 0.02) -> Item:  # fmt: skip
    """`normprop run EXPERIMENT --preset paper --dataset cifar10` in a subprocess, `epochs` epochs,
    killed (SIGKILL) as soon as the manifest of a first epoch appears, then run again: every run
    complete, and a run the kill left unfinished finished by the second process."""
    command = [sys.executable, "-m", "normprop_cli", "run", experiment, "--preset", "paper", "--dataset", "cifar10",
               "--data-dir", str(data_dir), "--results-dir", str(results), "--device", device, "--quiet",
               f"train.epochs={epochs}", *overrides]  # fmt: skip
    end = time.monotonic() + timeout
    log = tempfile.TemporaryFile("w+")  # the first process's stderr: a file, never a pipe that fills
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, text=True)
    while first.poll() is None and time.monotonic() < end:
        if any(int(m.get("epochs_done") or 0) >= 1 for m in manifests(results, experiment)):
            first.send_signal(signal.SIGKILL)
            break
        time.sleep(poll)
    else:
        first.kill()
    first.wait()
    started = manifests(results, experiment)
    left = [m.get("run") for m in started if m.get("status") != "complete"]
    if first.returncode != -signal.SIGKILL or not left:
        log.seek(0)
        why = f"exit status {first.returncode}: {first_line(log.read() or 'no output', 200)}"
        return Item(f"resume-{experiment}", False, f"the first process was not killed mid-run ({why})")
    again = subprocess.run(command, capture_output=True, text=True, timeout=max(1.0, end - time.monotonic()))
    done = manifests(results, experiment)
    complete = [m for m in done if m.get("status") == "complete" and int(m.get("epochs_done") or 0) == epochs]
    resumed = [m["run"] for m in done if m.get("resumed_from_epoch")]
    ok = again.returncode == 0 and len(complete) == len(done) > 0
    outcome = f"completed all {len(done)}" if ok else f"failed: exit status {again.returncode}"
    line = (f"killed after a first epoch, {len(left)} run(s) unfinished and {len(done) - len(started)} not started; "
            f"the second process {outcome} ({len(resumed)} resumed: {', '.join(resumed) or 'none'})")  # fmt: skip
    details = [f"- `{' '.join(command[1:])}`"] + ([] if ok else [f"- {first_line(again.stderr or 'no output', 300)}"])
    return Item(f"resume-{experiment}", ok, line, details)
