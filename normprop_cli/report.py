"""results/REPORT.md: first a verdict on each of the paper's claims (SPEC §10), then every experiment's
figure and headline numbers beside the paper's, what produced them, and where the run departs from
the paper's protocol. Reads files only, never a model.

A results directory may hold other results trees one level down (results/cpu/ for the cpu preset):
each gets its own verdict table, verdicts.csv and sections, after the top-level ones."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from normprop_cli import config, io, verdicts
from normprop_cli.engine.runs import CONFIG
from normprop_cli.errors import UserError
from normprop_cli.experiments import RUNNERS, runner
from normprop_cli.experiments.results import format_ci
from normprop_cli.verdicts import paper_datasets, provenance, result_dirs


def results_trees(results: Path) -> list[Path]:
    """`results` itself, then each direct subdirectory that is a results tree of its own."""
    results = Path(results)
    nested = [
        d
        for d in sorted(results.iterdir() if results.is_dir() else [])
        if d.is_dir() and d.name not in RUNNERS and any(result_dirs(d, e) for e in RUNNERS)
    ]
    return [results, *nested]


def label(tree: Path, root: Path, preset: str) -> str:
    where = "" if tree == root else f"{tree.relative_to(root).as_posix()}/"
    return f"{preset or 'unknown'} preset (`{where}verdicts.csv`)"


# ---- verdicts -------------------------------------------------------------------------------------


def _effect(row: dict, unit: str) -> str:
    """'1.33 [0.20, 2.46] pp'; '—' where nothing was measured."""
    effect, low, high = (math.nan if row[k] is None else float(row[k]) for k in ("effect", "ci_low", "ci_high"))
    if not math.isfinite(effect):
        return "—"
    return f"{format_ci(effect, low, high, digits=2 if unit == 'pp' else 3)} {unit}".strip()


def verdict_table(frame: pd.DataFrame) -> list[str]:
    """claim | verdict | effect [95% CI] | n seeds | halves a / b | test | budget, and the notes."""
    claims = {c.id: c for c in verdicts.claims()}
    lines = [
        "| claim | verdict | effect [95% CI] | n seeds | halves a / b | test | budget |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    notes = []
    for row in frame.astype(object).where(frame.notna(), None).to_dict("records"):
        c = claims[row["claim"]]
        measured = row["verdict"] not in (verdicts.NOT_MEASURED, verdicts.NOT_YET_MEASURED)
        halves = f"{row['verdict_half_a']} / {row['verdict_half_b']}" if measured else "—"
        effect = _effect(row, c.unit)
        cells = [
            f"{c.id}: {c.claim} ({c.source})",
            f"**{row['verdict']}**",
            effect,
            str(row["n_seeds"]) if row["n_seeds"] is not None else "—",
            halves,
            row["test"] or "—",
            row["budget"] or "—",
        ]
        lines.append("| " + " | ".join(cells) + " |")
        parts = [f"Metric: {row['metric']}" if row["metric"] else "", f"Note: {row['note']}" if row["note"] else ""]
        if any(parts):
            where = f" ({row['dataset']})" if row["dataset"] else ""
            notes.append(f"- **{c.id}**{where}. " + ". ".join(p for p in parts if p) + ".")
    return lines + [""] + notes + [""]


# ---- the experiments' sections ----------------------------------------------------------------------


def departures(experiment: str, prov: dict, directory: Path | None = None) -> list[str]:
    """Plain sentences wherever a run departs from the paper's protocol."""
    if not prov:
        return []
    cfg, out = prov["cfg"], []
    paper_sets = paper_datasets(experiment)
    dataset = cfg.dataset.name
    if dataset not in paper_sets:
        out.append(
            f"Data set: {dataset}, not the paper's {' / '.join(paper_sets)}; the numbers are not "
            "comparable with the paper's, only the trends are."
        )
    paper = verdicts.paper_protocol(experiment, dataset)
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
    if directory is not None and augments(directory):
        out += augmentation(dataset, cfg.dataset.get("augment"))
    return out


def augments(directory: Path) -> bool:
    """Did any run of the sweep train with augmentation (train.augment)?"""
    return any(
        OmegaConf.select(OmegaConf.load(path), "train.augment", default=False)
        for path in sorted((directory / "runs").glob(f"*/{CONFIG}"))
    )


def augmentation(dataset: str, mode: str | None) -> list[str]:
    """The paper flips CIFAR images (section 5.5, SPEC §6.1); what the runs did instead, if not that."""
    if mode is None or mode == "flip" or dataset in ("cifar10", "cifar100"):
        return []
    if mode == "translate":
        why = " (digits are not mirror-symmetric)" if dataset == "digits" else ""
        return [f"Augmentation: small random translations, not the paper's horizontal flips{why}."]
    return [f"Augmentation: {mode}, not the paper's horizontal flips."]


def _title(experiment: str) -> str:
    try:
        return OmegaConf.select(config.load(experiment), "experiment.paper", default=None) or ""
    except UserError:
        return ""


def section(experiment: str, results: Path, root: Path | None = None) -> list[str]:
    """One experiment of one results tree; figure links relative to `root` (where REPORT.md is)."""
    root = Path(root or results)
    title = _title(experiment)
    lines = [f"## {experiment}" + (f" — {title}" if title else ""), ""]
    dirs = result_dirs(results, experiment)
    if not dirs:
        return lines + [f"**Missing**: not run yet. `normprop run {experiment}` produces it.", ""]
    module = runner(experiment)
    for directory in dirs:
        prov = provenance(directory)
        dataset = prov.get("dataset", directory.name if experiment != "theory" else None)
        cfg = config.load(
            experiment,
            preset=prov.get("preset") if prov.get("preset") in config.options("preset") else None,
            dataset=dataset if dataset in config.options("dataset") else None,
            results_dir=results,
        )
        if prov:
            lines.append(
                f"Data set **{prov['dataset']}**, preset **{prov['preset']}**, device {prov['device']}, "
                f"{prov['runs']} run(s)."
            )
            lines.append("")
        for figure in sorted(directory.glob("*.png")):
            lines += [f"![{experiment} {figure.stem}]({figure.relative_to(root).as_posix()})", ""]
        try:
            rows = module.headlines(cfg)
        except UserError as exc:
            rows = []
            lines += [f"Headline numbers unavailable: {exc}", ""]
        if rows:
            lines += ["| quantity | reproduced | paper |", "| --- | --- | --- |"]
            lines += [f"| {r['quantity']} | {_fmt(r['reproduced'])} | {_fmt(r.get('paper', ''))} |" for r in rows]
            lines.append("")
        if hasattr(module, "paragraphs"):
            try:
                lines += [p for text in module.paragraphs(cfg) for p in (text, "")]
            except UserError as exc:
                lines += [f"Findings unavailable: {exc}", ""]
        for sentence in departures(experiment, prov, directory):
            lines.append(f"- {sentence}")
        lines.append("")
    return lines


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def experiments(tree: Path, root: Path) -> list[str]:
    """Every experiment's section of one tree, the missing ones named first."""
    missing = [e for e in RUNNERS if not result_dirs(tree, e)]
    lines = [f"Missing experiments: {', '.join(missing)}.", ""] if missing else []
    for experiment in RUNNERS:
        lines += section(experiment, tree, root)
    return lines


def write_report(results: Path) -> Path:
    """REPORT.md in `results`, and verdicts.csv in every results tree found there."""
    results = Path(results)
    trees = results_trees(results)
    lines = [
        "# NormProp reproduction report",
        "",
        "Every experiment of Arpit et al. (ICML 2016), reproduced by `normprop`; written by "
        "`normprop report` from the CSVs under this directory.",
        "",
        "## Verdicts",
        "",
    ]
    labels = []
    for tree in trees:
        frame = verdicts.table(tree)
        verdicts.write_verdicts(tree, frame)
        presets = frame["preset"].dropna()
        labels.append(str(presets.mode().iloc[0]) if len(presets) else "")
        lines += [f"### {label(tree, results, labels[-1])}", ""] + verdict_table(frame)
    lines += ["### How a verdict is reached", "", verdicts.rule_text(), ""]
    lines += experiments(results, results)
    for tree, preset in zip(trees[1:], labels[1:], strict=True):
        lines += [f"# {preset or tree.name} preset (`{tree.relative_to(results).as_posix()}/`)", ""]
        lines += experiments(tree, results)
    return io.write_text(results / "REPORT.md", "\n".join(lines).rstrip() + "\n")
