"""Progress of a sweep: a rich bar per run, or one line per finished run with --quiet."""

from __future__ import annotations

import math
import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True)


class RichProgress:
    """One bar per run: epoch, last loss and accuracy, time left."""

    def __init__(self, total_runs: int):
        self.total_runs, self.index = total_runs, 0
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.task = None
        self.steps_per_epoch = 1

    def __enter__(self):
        self.bar.start()
        return self

    def __exit__(self, *exc):
        self.bar.stop()

    def start(self, spec, epochs, steps_per_epoch, done):
        self.index += 1
        self.steps_per_epoch = steps_per_epoch
        self.task = self.bar.add_task(
            f"[{self.index}/{self.total_runs}] {spec.name}",
            total=epochs * steps_per_epoch,
            completed=done * steps_per_epoch,
            status=f"epoch {done}/{epochs}",
        )
        self.epochs = epochs

    def step(self, n):
        self.bar.advance(self.task, n)

    def epoch(self, row):
        self.bar.update(
            self.task,
            status=f"epoch {row['epoch']}/{self.epochs} loss {row['train_loss']:.3f} {accuracy(row, 1)}",
        )

    def finish(self, manifest):
        if manifest["status"] != "complete":
            self.bar.update(self.task, status=f"[red]{manifest['status']}")
        self.bar.stop_task(self.task)

    def skip(self, spec, manifest):
        self.index += 1
        self.bar.console.print(f"[{self.index}/{self.total_runs}] {spec.name}: {manifest['status']}, skipped")


class QuietProgress:
    """One line per finished run, for logs and CI."""

    def __init__(self, total_runs: int, experiment: str = ""):
        """`experiment`: named in each line, where several experiments' lines interleave (engine.sweep)."""
        self.total_runs, self.index, self.last = total_runs, 0, None
        self.of = f"{experiment} " if experiment else ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def start(self, spec, epochs, steps_per_epoch, done):
        self.index += 1
        self.name = spec.name

    def step(self, n):
        pass

    def epoch(self, row):
        self.last = row

    def finish(self, manifest):
        last = self.last or {}
        acc = f", {accuracy(last, 2)}" if "test_acc" in last else ""
        along = f", trained along {manifest['trained_with']}" if manifest.get("trained_with") else ""
        line(
            f"[{self.of}{self.index}/{self.total_runs}] {self.name}: {manifest['status']} after "
            f"{manifest['epochs_done']} epochs{acc}{along}"
        )
        self.last = None

    def skip(self, spec, manifest):
        self.index += 1
        line(f"[{self.of}{self.index}/{self.total_runs}] {spec.name}: {manifest['status']}, skipped")


def line(text: str) -> None:
    """One whole line on stderr."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def make_progress(total_runs: int, quiet: bool, experiment: str = ""):
    """A bar per run on a terminal; one line per finished run with `quiet`, off a terminal, or where the lines
    name their `experiment`."""
    if quiet or experiment or not sys.stderr.isatty():
        return QuietProgress(total_runs, experiment)
    return RichProgress(total_runs)


def accuracy(row: dict, digits: int) -> str:
    """'test acc 91.2%', or 'val acc 90.8%' for a run that does not score the test set (train.eval_test)."""
    split = "test" if math.isfinite(float(row.get("test_acc", math.nan))) else "val"
    return f"{split} acc {float(row.get(f'{split}_acc', math.nan)):.{digits}f}%"
