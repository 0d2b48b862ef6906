"""A run is one (setting, seed) of an experiment: its config, its directory, its manifest, its
checkpoint (with the previous one to fall back to) and its tables."""

from __future__ import annotations

import copy
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

import normprop_cli
from normprop_cli import io
from normprop_cli.engine.progress import console
from normprop_cli.errors import UserError, first_line
from normprop_cli.nn.methods import method_of

MANIFEST, CONFIG, METRICS, CHECKPOINT = "manifest.json", "config.yaml", "metrics.csv", "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"  # the checkpoint before the newest: what a damaged newest one falls back to
FINISHED = ("complete", "diverged")
DAMAGED = "damaged"  # the status read_manifest gives a manifest.json that cannot be read
# Keys of a run's config that say what is computed; the rest (device, paths, ...) may change on resume.
RUN_KEYS = ("experiment", "run", "seed", "method", "dataset", "model", "train")
METRIC_COLUMNS = [
    "epoch",
    "lr",
    "train_loss",
    "train_acc",
    "train_seconds",
    "images_per_second",
    "val_loss",
    "val_acc",
    "test_loss",
    "test_acc",
    "epoch_seconds",
]


@dataclass
class RunSpec:
    name: str  # e.g. "normprop-flip-s0"
    setting: str  # the grid entry's id, e.g. "normprop-flip"
    seed: int
    cfg: DictConfig  # the resolved config of this one run

    @property
    def run_cfg(self) -> DictConfig:
        return OmegaConf.masked_copy(self.cfg, [k for k in RUN_KEYS if k in self.cfg])


def identity(spec: RunSpec) -> dict:
    """The manifest's keys that say which run it is: the trainer's for the run it trains, and for each run
    riding along it (engine.riders)."""
    cfg = spec.cfg
    return {
        "run": spec.name,
        "setting": spec.setting,
        "experiment": cfg.experiment.name,
        "dataset": cfg.dataset.name,
        "preset": cfg.preset.name,
        "method": cfg.get("method") or method_of(cfg.model),
        "seed": spec.seed,
        "epochs": int(cfg.train.epochs),
    }


def sweep_dir(cfg: DictConfig) -> Path:
    """results/<experiment>/<dataset>/"""
    return Path(cfg.results_dir) / cfg.experiment.name / cfg.dataset.name


def run_dir(cfg: DictConfig, name: str) -> Path:
    return sweep_dir(cfg) / "runs" / name


def expand_grid(cfg: DictConfig) -> list[RunSpec]:
    """The experiment's `grid` (settings, each a few dotted overrides) times its seeds. An entry's
    own `seeds: N` keeps only the first N of them (e.g. one costly full-width run); its `extra_seeds: K`
    adds the K seeds after them (e.g. where a comparison needs more seeds than the rest)."""
    specs = []
    tree = OmegaConf.to_container(cfg, resolve=True)
    tree.pop("grid", None)
    base = OmegaConf.create(tree)  # once, without the grid: a deep copy per run is far cheaper than a creation
    for entry in cfg.get("grid") or [{"id": "default", "set": {}}]:
        n = min(int(cfg.seeds), int(entry.get("seeds") or cfg.seeds)) + int(entry.get("extra_seeds") or 0)
        for k in range(n):
            seed = int(cfg.seed) + k
            run = copy.deepcopy(base)
            for key, value in (entry.get("set") or {}).items():
                if OmegaConf.select(run, key, default="<missing>") == "<missing>":
                    raise UserError(
                        f"grid entry '{entry['id']}' sets unknown key '{key}' in experiment {cfg.experiment.name}"
                    )
                OmegaConf.update(run, key, value, merge=False)
            name = f"{entry['id']}-s{seed}"
            run.run = {"name": name, "setting": entry["id"]}
            run.seed = seed
            specs.append(RunSpec(name=name, setting=entry["id"], seed=seed, cfg=run))
    if not specs:
        raise UserError(f"experiment {cfg.experiment.name} expands to no runs; use --seeds 1 or more")
    return specs


def submitit_folder(cfg: DictConfig) -> Path:
    """<results_dir>/.submitit/: submitit's files, and which job each run was submitted as."""
    return Path(cfg.results_dir) / ".submitit"


def record_path(cfg: DictConfig) -> Path:
    return submitit_folder(cfg) / f"{cfg.experiment.name}-{cfg.dataset.name}.json"


def submitted(cfg: DictConfig) -> dict[str, str]:
    """{run: SLURM job id} of the sweep's last submissions."""
    try:
        return io.read_json(record_path(cfg))
    except (OSError, ValueError):
        return {}


@lru_cache(maxsize=4)
def commit(where: Path | None = None) -> str:
    """The checkout's commit, with "+dirty" where tracked code or configs differ from it (results aside), so
    that a manifest never names a commit whose code did not train the run; "unknown" outside a checkout."""
    where = where or Path(normprop_cli.__file__).parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=where, timeout=5
        )
        head = out.stdout.strip()
        if not head:
            return "unknown"
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ":/", ":(exclude,top)results"],
            capture_output=True, text=True, cwd=where, timeout=5,
        )  # fmt: skip
        return f"{head}+dirty" if changed.stdout.strip() else head
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict:
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "normprop": normprop_cli.__version__,
        "platform": platform.platform(),
    }


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def say(message: str) -> None:
    """One line on the sweep's console (stderr): never wrapped, nor read as rich markup (paths and
    error texts hold brackets)."""
    console.print(message, markup=False, highlight=False, soft_wrap=True)


def read_manifest(path: Path) -> dict | None:
    """The run's manifest; None where it has none. One that cannot be read is {"status": "damaged",
    "problem": ...}, so that no caller takes a damaged run for a missing one (train_run rebuilds it)."""
    try:
        manifest = io.read_json(path / MANIFEST)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"status": DAMAGED, "problem": first_line(exc)}
    if not isinstance(manifest, dict):
        return {"status": DAMAGED, "problem": f"a JSON {type(manifest).__name__}, not an object"}
    return manifest


def load_checkpoint(name: str, path: Path, device: torch.device, needed: str = "") -> dict | None:
    """The newest readable checkpoint of a run; None for a run that has none (a UserError where
    `needed` says why one is needed). A damaged (or missing) checkpoint.pt falls back to
    checkpoint.prev.pt, one epoch older, which becomes the newest."""
    newest, previous = path / CHECKPOINT, path / PREVIOUS
    if not newest.exists() and not previous.exists():
        if needed:
            raise UserError(f"run {name}: {needed}there is no checkpoint: delete {path} to train it from scratch")
        return None
    problems = []
    for file in (newest, previous):
        try:
            state = torch.load(file, map_location=device, weights_only=True)
        except FileNotFoundError:
            problems.append(f"{file.name} is missing")
            continue
        except Exception as exc:  # torch.load fails on damage as RuntimeError, EOFError, OSError, UnpicklingError...
            problems.append(f"{file.name} is damaged ({first_line(exc, 80)})")
            continue
        if file == previous:
            os.replace(previous, newest)
            say(f"run {name}: {problems[0]}; resuming from epoch {state['epoch']} ({PREVIOUS})")
        return state
    raise UserError(
        f"run {name}: {needed}{'; '.join(problems)}; nothing to resume from: delete {path} to train it from scratch"
    )


def write_tables(path: Path, history: list[dict], extra: dict[str, list[dict]]) -> None:
    """metrics.csv (one row per finished epoch) and each observer's <name>.csv."""
    io.write_csv(path / METRICS, pd.DataFrame(history, columns=METRIC_COLUMNS))
    for name, rows in extra.items():
        io.write_csv(path / f"{name}.csv", pd.DataFrame(rows))


def tables_problem(path: Path, manifest: dict) -> str | None:
    """Why a finished run's metrics.csv is not what its manifest says (missing, unreadable, not one
    row per finished epoch), or None."""
    try:
        metrics = pd.read_csv(path / METRICS)
    except FileNotFoundError:
        return f"{METRICS} is missing"
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return f"{METRICS} is damaged ({first_line(exc, 80)})"
    epochs = int(manifest.get("epochs_done", 0))
    if list(metrics.columns) != METRIC_COLUMNS or len(metrics) != epochs:  # a NaN loss is a result, not damage
        return f"{METRICS} is damaged (not the {epochs} complete row(s) the manifest has)"
    return None


# The paper's text and numbers, for the report, not for training (experiment.paper, paper_test_error,
# paper_expects, ...): a rewording of them leaves the runs as they are.
PROSE = "experiment.paper"


def prose(key: str) -> bool:
    return key.startswith(PROSE)


# How the experiment chose a run's settings, not what the run computes: the learning-rate sweep's policy
# (lr_sweep.py) and the number of seeds a setting gets. The rate it chose, train.lr, is part of the run.
CHOICE = ("experiment.lr_sweep.", "experiment.extra_seeds")


def choice(key: str) -> bool:
    return key.startswith(CHOICE)


EXTENDABLE = "train.epochs"  # the one key a run may change: more epochs continue it where it stopped
# How a step runs, not what it computes (engine/step.py: the float32 numbers, up to rounding, as on another
# device): like the device, these may change when a run resumes, and a new default for one of them leaves
# every run resumable.
# So may the batch size of evaluation: in evaluation mode an image's logits depend on that image alone (no
# batch statistics), up to the rounding of the kernels that a batch size selects.
EXECUTION = ("train.channels_last", "train.compile", "train.cuda_graph", "train.eval_batch_size")


def config_differences(spec: RunSpec, path: Path) -> list[str]:
    """The keys of the run directory's config.yaml whose values differ in the spec's config (the
    paper's text and numbers, PROSE, how a step runs, EXECUTION, and how its settings were chosen, CHOICE,
    aside)."""
    stored_file = path / CONFIG
    if not stored_file.exists():
        return []
    stored, new = _flat(OmegaConf.load(stored_file)), _flat(spec.run_cfg)
    # A key the stored config lacks came after the run trained, with a default that keeps what it did.
    return sorted(k for k in stored if not (prose(k) or choice(k)) and k not in EXECUTION and stored[k] != new.get(k))


def extends(spec: RunSpec, path: Path, manifest: dict | None) -> bool:
    """Does the spec ask a complete run for more epochs, with its config otherwise the same? Then it
    continues from its last checkpoint: the learning-rate schedule and each epoch's shuffle depend on
    the epoch alone, so the longer run ends exactly as one trained to that many epochs at once."""
    if not manifest or manifest.get("status") != "complete":
        return False
    more = int(spec.cfg.train.epochs) > int(manifest.get("epochs_done") or 0)
    return more and config_differences(spec, path) == [EXTENDABLE]


def check_same_config(spec: RunSpec, path: Path, write: bool = True) -> None:
    """A run directory belongs to one config; a different one must not silently mix with it, whether
    the run is unfinished (it would resume) or finished (it would be skipped and answer with its old
    numbers): refused with the keys that differ. The paper's text (PROSE) aside, the one change allowed
    is more epochs (EXTENDABLE): an unfinished or complete run goes on, and, with `write`, its
    config.yaml says so; a diverged one stays as it is."""
    differ = config_differences(spec, path)
    if not differ:
        return
    manifest = read_manifest(path) or {}
    status = manifest.get("status")
    if differ == [EXTENDABLE]:
        floor = manifest.get("epochs") if status == "diverged" else manifest.get("epochs_done")
        if int(spec.cfg.train.epochs) >= int(floor or 0):
            if write and status != "diverged":
                io.write_text(path / CONFIG, OmegaConf.to_yaml(spec.run_cfg))
            return
    finished = status in FINISHED
    fewer = " (a finished run's epochs can only grow)" if finished and differ == [EXTENDABLE] else ""
    raise UserError(
        f"{path} holds {'finished run' if finished else 'run'} {spec.name} with another config "
        f"({', '.join(differ[:4])} differ{fewer}); pass another --results-dir or delete that run directory"
    )


def _flat(cfg) -> dict:
    out = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            out[prefix[:-1]] = node

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return out


# What a run's training depends on beyond its run config: the same keys, seeds and threads give the same
# trajectory on one machine (engine.plan makes such runs of several experiments one task, trained once).
TRAJECTORY_ASIDE = ("experiment.", "run.")


def trajectory(spec: RunSpec, threads: int) -> str | None:
    """A key that two runs share when they train the same trajectory, epoch for epoch, on `threads` CPU
    threads: their run configs equal but for the experiment's own keys (what it observes and reports: the
    trainer reads none of them), the run's name and the number of epochs (each epoch's rate and shuffle
    depend on the epoch alone, so a shorter run is the longer one's first epochs). None for a run that
    is not fresh (it has a manifest: it resumes or is finished) or a rate sweep's, which train alone."""
    if spec.name.startswith("sweep-") or read_manifest(run_dir(spec.cfg, spec.name)) is not None:
        return None
    flat = _flat(spec.run_cfg)
    kept = {k: v for k, v in flat.items() if not k.startswith(TRAJECTORY_ASIDE) and k != EXTENDABLE}
    where = (str(spec.cfg.get("device")), str(spec.cfg.get("data_dir")), bool(spec.cfg.get("deterministic", False)))
    return repr((sorted(kept.items(), key=lambda kv: kv[0]), where, threads))
