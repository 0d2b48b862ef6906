"""results/REPORT.md: every experiment's figure and headline numbers beside the paper's,
what produced them, and where the run departs from the paper's protocol. Reads files only."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from normprop_cli import config, io
from normprop_cli.engine.runs import CONFIG, read_manifest
from normprop_cli.errors import UserError
from normprop_cli.experiments import RUNNERS, runner

PAPER_DATASETS = {"table1": ("cifar10", "cifar100", "svhn")}  # the others: CIFAR-10 (section 5)


def result_dirs(results: Path, experiment: str) -> list[Path]:
    """Where an experiment's results are: results/theory, or results/<exp>/<dataset> per data set."""
    base = results / experiment
    if experiment == "theory":
        return [base] if any(base.glob("*.csv")) else []
    return sorted(d for d in base.glob("*") if (d / "summary.csv").exists())


def provenance(directory: Path) -> dict:
    """Preset, device, data set and the resolved config of one of the sweep's runs."""
    runs = sorted((directory / "runs").glob("*/manifest.json"))
    if not runs:
        return {}
    manifest = read_manifest(runs[0].parent) or {}
    devices = sorted({(read_manifest(r.parent) or {}).get("device", "?") for r in runs})
    cfg = OmegaConf.load(runs[0].parent / CONFIG)
    return {
        "preset": manifest.get("preset", "?"),
        "device": ", ".join(devices),
        "runs": len(runs),
        "dataset": manifest.get("dataset", directory.name),
        "cfg": cfg,
        "seeds": len({(read_manifest(r.parent) or {}).get("seed") for r in runs}),
    }


def departures(experiment: str, prov: dict) -> list[str]:
    """Plain sentences wherever a run departs from the paper's protocol."""
    if not prov:
        return []
    cfg, out = prov["cfg"], []
    paper_sets = PAPER_DATASETS.get(experiment, ("cifar10",))
    dataset = cfg.dataset.name
    if dataset not in paper_sets:
        out.append(
            f"Data set: {dataset}, not the paper's {' / '.join(paper_sets)}; the numbers are not "
            "comparable with the paper's, only the trends are."
        )
    paper = config.load(experiment, preset="paper", dataset=dataset if dataset in paper_sets else paper_sets[0])
    if cfg.train.epochs != paper.train.epochs:
        out.append(f"Epochs: {cfg.train.epochs} per run, the paper's protocol has {paper.train.epochs}.")
    if cfg.train.lr_halve_every != paper.train.lr_halve_every:
        out.append(
            f"The learning rate is halved every {cfg.train.lr_halve_every} epochs, the paper's protocol "
            f"every {paper.train.lr_halve_every}."
        )
    if cfg.model.width != 1.0:
        out.append(f"Width: the NIN's hidden widths are scaled by {cfg.model.width} (the paper: 1.0).")
    if cfg.dataset.get("limit"):
        out.append(f"Only {cfg.dataset.limit} examples per split were used.")
    if prov["seeds"] < int(paper.seeds):
        out.append(f"Seeds: {prov['seeds']}, the paper preset uses {paper.seeds}.")
    return out


def section(experiment: str, results: Path) -> list[str]:
    module = runner(experiment)
    title = config.load(experiment).experiment.paper
    lines = [f"## {experiment} — {title}", ""]
    dirs = result_dirs(results, experiment)
    if not dirs:
        return lines + [f"**Missing**: not run yet. `normprop run {experiment}` produces it.", ""]
    for directory in dirs:
        prov = provenance(directory)
        dataset = prov.get("dataset", directory.name if experiment != "theory" else None)
        cfg = config.load(
            experiment,
            preset=prov.get("preset") if prov.get("preset") in config.options("preset") else None,
            dataset=dataset,
            results_dir=results,
        )
        if prov:
            lines.append(
                f"Data set **{prov['dataset']}**, preset **{prov['preset']}**, device {prov['device']}, "
                f"{prov['runs']} run(s)."
            )
            lines.append("")
        for figure in sorted(directory.glob("*.png")):
            lines += [f"![{experiment} {figure.stem}]({figure.relative_to(results).as_posix()})", ""]
        try:
            rows = module.headlines(cfg)
        except UserError as exc:
            rows = []
            lines += [f"Headline numbers unavailable: {exc}", ""]
        if rows:
            lines += ["| quantity | reproduced | paper |", "| --- | --- | --- |"]
            lines += [f"| {r['quantity']} | {_fmt(r['reproduced'])} | {_fmt(r.get('paper', ''))} |" for r in rows]
            lines.append("")
        for sentence in departures(experiment, prov):
            lines.append(f"- {sentence}")
        lines.append("")
    return lines


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_report(results: Path) -> Path:
    results = Path(results)
    present = [e for e in RUNNERS if result_dirs(results, e)]
    missing = [e for e in RUNNERS if e not in present]
    lines = [
        "# NormProp reproduction report",
        "",
        "Every experiment of Arpit et al. (ICML 2016), reproduced by `normprop`; written by "
        "`normprop report` from the CSVs under this directory.",
        "",
    ]
    if missing:
        lines += [f"Missing experiments: {', '.join(missing)}.", ""]
    for experiment in RUNNERS:
        lines += section(experiment, results)
    return io.write_text(results / "REPORT.md", "\n".join(lines).rstrip() + "\n")
