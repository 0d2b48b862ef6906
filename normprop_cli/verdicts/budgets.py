"""The budgets a results tree's runs trained with, from the runs' own files: each run's config.yaml says what
it trained with (epochs, seeds, subsets, width) and its manifest when it started and from which commit. An
experiment without runs (theory) stores its config beside its tables (<experiment>/config.yaml).

What changed after results were seen is not read here: the tree's ledger (engine.ledger, verdicts.ledger)
records it when it happens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from normprop_cli.io import read_json, read_yaml

BUDGET_KEYS = ("train.epochs", "train.lr_halve_every", "train.max_steps", "train.probe_images", "dataset.limit",
               "dataset.train_limit", "model.width", "theory.depth", "theory.width", "theory.batch",
               "theory.propagation_seeds")  # fmt: skip
DIRTY = "+dirty"  # a manifest's commit with uncommitted changes beside it (engine.runs.commit)


@dataclass
class Budget:
    """One experiment of one results tree: its runs (sweep runs aside; `every`: with them), the seeds, each
    budget key's values with how many runs trained with each, the first result (the earliest start, sweep
    runs included), and the runs, sweep runs included, whose manifest names a commit with uncommitted
    changes (`dirty`), with a hash of that diff (`hashed`) or without."""

    experiment: str
    runs: int = 0
    every: int = 0  # sweep runs included
    seeds: set[int] = field(default_factory=set)
    values: dict[str, dict[str, int]] = field(default_factory=dict)
    first_result: datetime | None = None
    dirty: int = 0
    hashed: int = 0
    dirty_commits: set[str] = field(default_factory=set)


def parse_time(text: str) -> datetime | None:
    """An ISO time as an aware datetime (UTC where it names no offset); None where it is no time."""
    try:
        value = datetime.fromisoformat(str(text).strip())
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _flat(data: object, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in (data or {}).items() if isinstance(data, dict) else ():
        out |= _flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
    return out


def _read(path: Path, read) -> dict:
    try:
        data = read(path)
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _count(b: Budget, config: dict) -> None:
    flat = _flat(config)
    for key in BUDGET_KEYS:
        if key in flat:
            value = json.dumps(flat[key])
            b.values.setdefault(key, {})
            b.values[key][value] = b.values[key].get(value, 0) + 1


def first_result(tree: Path, experiment: str) -> datetime | None:
    """The earliest `started` of the experiment's run manifests in the tree, sweep runs included."""
    return budget(tree, experiment).first_result


def budget(tree: Path, experiment: str) -> Budget:
    """One experiment's Budget in one results tree, from its runs' config.yaml and manifest.json."""
    b = Budget(experiment)
    stored = Path(tree) / experiment / "config.yaml"
    if stored.is_file():  # an experiment that trains no run keeps its config here
        _count(b, _read(stored, read_yaml))
    for run in sorted(Path(tree).glob(f"{experiment}/*/runs/*")):
        manifest = _read(run / "manifest.json", read_json)
        if not manifest:
            continue
        started = parse_time(manifest.get("started") or "")
        if started and (b.first_result is None or started < b.first_result):
            b.first_result = started
        b.every += 1
        if str(manifest.get("commit", "")).endswith(DIRTY):
            b.dirty += 1
            b.hashed += bool(manifest.get("diff_sha256"))
            b.dirty_commits.add(str(manifest["commit"]))
        if run.name.startswith("sweep-"):
            continue
        b.runs += 1
        if isinstance(manifest.get("seed"), int):
            b.seeds.add(manifest["seed"])
        _count(b, _read(run / "config.yaml", read_yaml))
    return b


def budgets(tree: Path, experiments: list[str]) -> list[Budget]:
    """Each experiment's Budget in a results tree, sorted by experiment."""
    return [budget(tree, e) for e in sorted(set(experiments))]
