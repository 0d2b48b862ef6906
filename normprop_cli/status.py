"""`normprop status EXPERIMENT`: where a sweep stands, read from its run directories alone; and
`normprop info`: versions, the device, the data sets present and how to get those that are not.

Every run of the grid with its state (missing, running, stopped, complete, diverged), its last epoch
out of its total, where it ran (host, device) and, for a SLURM submission, its job. A run whose
manifest says running but whose lock no live process holds (Ctrl-C, a kill) is "stopped, resumable".
Where none of the grid's runs is there, the presets and data sets whose runs are, with the command
that shows them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from normprop_cli import config, hints
from normprop_cli.engine import expand_grid, run_dir, sweep_dir
from normprop_cli.engine.lock import held
from normprop_cli.engine.runs import read_manifest, submitted

STOPPED = "stopped, resumable"  # the manifest says running, but no live process holds the run's lock
STATE_STYLES = {"missing": "dim", "running": "yellow", STOPPED: "magenta", "complete": "green", "diverged": "red",
                "damaged": "red"}  # fmt: skip
COUNTED = {STOPPED: "stopped (resumable)"}  # a state's words in the line of counts, where they hold a comma


def state(path: Path, manifest: dict) -> str:
    """The manifest's status; STOPPED for a "running" run that no live process holds."""
    status = manifest.get("status", "missing")
    return STOPPED if status == "running" and not held(path) else status


def rows(cfg: DictConfig) -> list[dict]:
    """One row per run of the grid, in the grid's order."""
    jobs = submitted(cfg)
    out = []
    for spec in expand_grid(cfg):
        path = run_dir(spec.cfg, spec.name)
        manifest = read_manifest(path) or {}
        out.append(
            {
                "run": spec.name,
                "state": state(path, manifest),
                "epoch": manifest.get("epochs_done", 0),
                "epochs": manifest.get("epochs", int(spec.cfg.train.epochs)),
                "host": manifest.get("host", ""),
                "device": manifest.get("device", ""),
                "updated": manifest.get("updated", manifest.get("started", ""))[:16].replace("T", " "),
                "job": jobs.get(spec.name, ""),
            }
        )
    return out


def elsewhere(cfg: DictConfig) -> list[tuple[str, str, Path]]:
    """(preset, data set, results tree) of the runs of cfg's experiment under its results directory
    and the trees one level down (results/smoke/, results/cpu/), one manifest read per sweep."""
    root = Path(cfg.results_dir)
    trees = [root, *sorted(d for d in root.iterdir() if d.is_dir())] if root.is_dir() else []
    found = []
    for tree in trees:
        for sweep in sorted((tree / cfg.experiment.name).glob("*/runs")):
            first = next(iter(sorted(sweep.glob("*/manifest.json"))), None)
            manifest = (read_manifest(first.parent) or {}) if first else {}
            if manifest.get("preset"):
                found.append((manifest["preset"], manifest.get("dataset", sweep.parent.name), tree))
    return found


def where_they_are(cfg: DictConfig, overrides: Sequence[str] = ()) -> list[str]:
    """Where none of the grid's runs is in the results directory: the commands that show the runs of
    the experiment that are there (another preset, data set or results tree), or what to give."""
    name, here = cfg.experiment.name, (cfg.preset.name, cfg.dataset.name, Path(cfg.results_dir))
    found = elsewhere(cfg)
    if not found:
        return [f"no run of {name} in {cfg.results_dir}: `{hints.of(cfg, 'run', name, extra=overrides)}` trains them"]
    if here in found:
        return [f"{sweep_dir(cfg)} holds other runs of {name}: give status the overrides (seeds=N, grid, ...) "
                "that they were trained with"]  # fmt: skip
    out = [f"none of these runs is in {cfg.results_dir}; runs of {name} that are:"]
    for preset, dataset, tree in dict.fromkeys(found):
        command = hints.command("status", name, preset=preset, results_dir=tree, dataset=dataset, extra=overrides)
        out.append(f"  {preset} preset on {dataset} ({tree}): {command}")
    return out


def show(cfg: DictConfig, console: Console | None = None, overrides: Sequence[str] = ()) -> list[dict]:
    """Print the sweep's runs as a table and a count per state, and what to do where runs stopped or
    none is there; return the rows. `overrides`: those the command was given, for the commands it suggests."""
    if console is None:
        console = Console()
        if not console.is_terminal:  # a log or a pipe: no need to squeeze the table into 80 columns
            console.width = max(console.width, 140)
    runs = rows(cfg)
    table = Table()
    columns = ["run", "state", "epoch", "host", "device", "updated"]
    columns += ["job"] if any(r["job"] for r in runs) else []
    for name in columns:
        table.add_column(name, no_wrap=True)
    for r in runs:
        cells = {
            **r,
            "state": f"[{STATE_STYLES.get(r['state'], 'default')}]{r['state']}",
            "epoch": f"{r['epoch']}/{r['epochs']}",
        }
        table.add_row(*(str(cells[name]) for name in columns))
    console.print(
        f"{cfg.experiment.name} on {cfg.dataset.name}, {cfg.preset.name} preset: {sweep_dir(cfg)}", highlight=False
    )
    console.print(table)
    counts = Counter(r["state"] for r in runs)
    states = [s for s in STATE_STYLES if counts[s]] + [s for s in counts if s not in STATE_STYLES]
    console.print(f"{len(runs)} run(s): " + ", ".join(f"{counts[s]} {COUNTED.get(s, s)}" for s in states))
    lines = []
    if counts[STOPPED]:
        lines.append(f"`{hints.of(cfg, 'run', cfg.experiment.name, extra=overrides)}` resumes the stopped run(s)")
    if counts["missing"] == len(runs) and not any(r["job"] for r in runs):  # a job not yet started: wait
        lines += where_they_are(cfg, overrides)
    for line in lines:
        console.print(escape(line), highlight=False, soft_wrap=True)
    return runs


def rows_of(pairs: list[tuple[str, str]], indent: str = "") -> list[str]:
    """`name  text` lines whose texts start at one column: the longest name plus two spaces."""
    width = max((len(name) for name, _ in pairs), default=0) + 2
    return [f"{indent}{name:<{width}}{text}" for name, text in pairs]


def info_lines(data_dir: Path) -> list[str]:
    """`normprop info`: versions, the device `auto` picks, where configs and data are, and each data set
    present or missing with every way to get it, in aligned columns."""
    import sys

    import hydra
    import numpy
    import torch
    import torchvision

    import normprop_cli
    from normprop_cli import device as devices
    from normprop_cli.data import available_datasets

    device = devices.resolve("auto")
    head = [("normprop", normprop_cli.__version__), ("python", sys.version.split()[0])]
    head += [(module.__name__, module.__version__) for module in (torch, torchvision, numpy, hydra)]
    head += [("device", f"{devices.describe(device)} (cuda available: {torch.cuda.is_available()})"),
             ("configs", str(config.conf_dir())), ("data dir", str(data_dir.resolve()))]  # fmt: skip
    present = available_datasets(data_dir)
    sets = [(name, "present" if there else f"missing: {fetch_hint(name)}") for name, there in present.items()]
    return [*rows_of(head), "data sets:", *rows_of(sets, indent="  ")]


def fetch_hint(dataset: str) -> str:
    """How a missing data set is got: every way there is."""
    from normprop_cli.data.fashion import NAME as FASHION

    download = f"`normprop run EXPERIMENT --dataset {dataset} --download`"
    if dataset == FASHION:
        return f"`apt-get install dataset-fashion-mnist` (Debian/Ubuntu), or {download}"
    return download
