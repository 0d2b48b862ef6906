"""Where an experiment's results are, how they were made (preset, device, data set, config) and how
that departs from the paper's protocol: the budget and notes of a verdict's row."""

from __future__ import annotations

from functools import cache, lru_cache
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from normprop_cli import config
from normprop_cli.engine.runs import CONFIG, read_manifest
from normprop_cli.io import read_yaml


def result_dirs(results: Path, experiment: str) -> list[Path]:
    """Where an experiment's results are: results/<exp>/<dataset> per data set it trained on (those
    with a summary.csv), or results/<exp> itself where its CSVs lie there (an experiment that trains
    nothing, as theory)."""
    base = Path(results) / experiment
    trained = sorted(d for d in base.glob("*") if (d / "summary.csv").exists())
    return trained or ([base] if any(base.glob("*.csv")) else [])


def provenance(directory: Path) -> dict:
    """Preset, device, data set, the resolved config of one of the reported runs, their seeds, and
    their schedules: each distinct (epochs, lr_halve_every), where a grid sets them per batch size.
    A learning-rate sweep's runs (sweep-*) are counted in `runs` alone."""
    runs = sorted((directory / "runs").glob("*/manifest.json"))
    if not runs:
        return {}
    reported = [r for r in runs if not r.parent.name.startswith("sweep-")] or runs
    manifests = [read_manifest(r.parent) or {} for r in reported]
    # plain YAML, not OmegaConf: no node per key, and a report reads every run's config
    trains = [read_yaml(r.parent / CONFIG).get("train") or {} for r in reported]
    return {
        "preset": manifests[0].get("preset", "?"),
        "device": ", ".join(sorted({m.get("device", "?") for m in manifests})),
        "runs": len(runs),
        "dataset": manifests[0].get("dataset", directory.name),
        "cfg": OmegaConf.load(reported[0].parent / CONFIG),
        "seeds": len({m.get("seed") for m in manifests}),
        "schedules": sorted({(int(t["epochs"]), int(t["lr_halve_every"])) for t in trains}),
    }


def epochs_text(prov: dict) -> str:
    """The reported runs' epochs: "8", or "2, 4 and 8" where the grid sets them per setting."""
    epochs = sorted({e for e, _ in prov["schedules"]})
    return str(epochs[0]) if len(epochs) == 1 else ", ".join(map(str, epochs[:-1])) + f" and {epochs[-1]}"


@cache
def paper_datasets(experiment: str) -> tuple[str, ...]:
    """The data sets the paper reports `experiment` on: those of its published errors
    (experiment.paper_test_error, table1's three), else CIFAR-10 alone (section 5)."""
    published = config.load(experiment).experiment.get("paper_test_error") or {}
    return tuple(published) or ("cifar10",)


@lru_cache(maxsize=32)
def paper_protocol(experiment: str, dataset: str) -> DictConfig:
    """The paper preset's config of an experiment, on `dataset` where the paper used it."""
    paper_sets = paper_datasets(experiment)
    return config.load(experiment, preset="paper", dataset=dataset if dataset in paper_sets else paper_sets[0])


def budget(prov: dict) -> str:
    """Data set, preset, epochs, seeds, width, device."""
    cfg = prov["cfg"]
    return (
        f"{prov['dataset']}, {prov['preset']}, {epochs_text(prov)} epochs, {plural(prov['seeds'], 'seed')}, "
        f"width {float(cfg.model.width):g}, {prov['device']}"
    )


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
