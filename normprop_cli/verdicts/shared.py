"""Runs that two experiments share. Training is deterministic: the same config and seed give the same
trajectory, whichever experiment's grid asked for it. Two experiments of one results tree that hold
such a run rest on the same trajectory, and the verdicts they feed are correlated, not independent.

Found from the files alone: a run of one experiment and a run of another share a trajectory where their
seeds and their first epoch's metrics (training loss and accuracy, validation and test accuracy, as
metrics.csv writes them) are identical, which no two different trainings give by chance. Sweep runs
(sweep-*) choose a rate and are left out."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from normprop_cli.verdicts.sources import result_dirs

KEY = ("train_loss", "train_acc", "val_acc", "test_acc")  # identical at epoch 1: the same trajectory


@dataclass(frozen=True)
class Shared:
    """Runs of experiment `a` that repeat runs of experiment `b` (sorted by name)."""

    a: str
    b: str
    pairs: tuple[tuple[str, str, int], ...]  # (run of a, run of b, last epoch through which they agree)
    once: int = 0  # pairs that came from one training, riders along it (engine.riders: `trained_with`)

    def text(self) -> str:
        through = sorted({k for _, _, k in self.pairs})
        epochs = f"epoch {through[0]}" if len(through) == 1 else f"epochs {through[0]}-{through[-1]}"
        runs = "run" if len(self.pairs) == 1 else "runs"
        example = f"e.g. {_of(self.a)} {self.pairs[0][0]} = {_of(self.b)} {self.pairs[0][1]}"
        once = f", {self.once} of them from one training" if self.once else ""
        return f"{self.a} and {self.b}: {len(self.pairs)} {runs} identical through {epochs}{once} ({example})"


def _of(name: str) -> str:
    """The possessive: "table1's", "activations'"."""
    return f"{name}'" if name.endswith("s") else f"{name}'s"


def _rows(run: Path) -> list[dict]:
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _manifest(run: Path) -> dict:
    try:
        manifest = json.loads((run / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _seed(run: Path):
    return _manifest(run).get("seed")


def _training(experiment: str, run: Path) -> str:
    """The training that gave the run: the run it rode along (its manifest's `trained_with`), else its own."""
    return _manifest(run).get("trained_with") or f"{experiment}/{run.name}"


def trajectories(results: Path, experiments) -> dict[tuple, list[tuple[str, Path]]]:
    """(seed, first epoch's KEY) -> [(experiment, run directory)] over the reported runs of the tree."""
    found: dict[tuple, list[tuple[str, Path]]] = {}
    for experiment in experiments:
        for directory in result_dirs(results, experiment):
            for run in sorted((directory / "runs").glob("*")):
                if run.name.startswith("sweep-") or not (run / "metrics.csv").exists():
                    continue
                rows = _rows(run)
                if rows:
                    key = (_seed(run), directory.name, *(rows[0].get(k) for k in KEY))
                    found.setdefault(key, []).append((experiment, run))
    return found


def agree_through(a: Path, b: Path) -> int:
    """The last epoch through which two runs' metrics (KEY) are identical."""
    last = 0
    for ra, rb in zip(_rows(a), _rows(b), strict=False):
        if any(ra.get(k) != rb.get(k) for k in KEY):
            break
        last = int(ra["epoch"])
    return last


def shared_runs(results: Path, experiments) -> list[Shared]:
    """Every pair of experiments of the tree that share runs, with the runs."""
    pairs: dict[tuple[str, str], list[tuple[str, str, int]]] = {}
    once: dict[tuple[str, str], int] = {}
    for group in trajectories(results, experiments).values():
        training = {run: _training(experiment, run) for experiment, run in group}  # once per run, not per pair
        for i, (ea, ra) in enumerate(group):
            for eb, rb in group[i + 1 :]:
                if ea == eb:
                    continue
                (ea2, ra2), (eb2, rb2) = sorted([(ea, ra), (eb, rb)], key=lambda t: t[0])
                pairs.setdefault((ea2, eb2), []).append((ra2.name, rb2.name, agree_through(ra2, rb2)))
                once[(ea2, eb2)] = once.get((ea2, eb2), 0) + (training[ra] == training[rb])
    return [Shared(a, b, tuple(sorted(p)), once[(a, b)]) for (a, b), p in sorted(pairs.items())]


def by_claim(found: list[Shared], claims) -> dict[str, list[str]]:
    """claim id -> the other claims whose experiments share runs with its experiment."""
    linked = {frozenset((s.a, s.b)) for s in found}
    return {
        c.id: [d.id for d in claims if d.id != c.id and frozenset((c.experiment, d.experiment)) in linked]
        for c in claims
    }


def statement(trees: list[tuple[str, Path]], experiments, claims) -> list[str]:
    """The report's paragraph on shared runs, one item per results tree (name, path)."""
    lines = [
        "**Runs shared between experiments.** Training is deterministic: where two experiments' grids hold "
        "the same config and seed, they train the same trajectory, and the verdicts they feed rest on the same "
        "runs, so their evidence is correlated, not independent. Found from the runs' files (the same seed "
        "and identical first-epoch metrics; learning-rate sweeps left out):",
        "",
    ]
    for name, path in trees:
        found = shared_runs(path, experiments)
        if not found:
            lines.append(f"- {name}: no run of one experiment repeats a run of another.")
            continue
        links = by_claim(found, claims)
        named = [f"{c.id} with {', '.join(links[c.id])}" for c in claims if links[c.id]]
        lines.append(f"- {name}: " + ("; ".join(named) or "no two verdicts share runs") + ".")
        lines += [f"  - {s.text()}." for s in found]
    return lines + [""]
