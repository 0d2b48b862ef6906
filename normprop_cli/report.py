"""results/REPORT.md: first one table of verdicts on the paper's claims, a column per preset, then each
preset's verdict table in full with the rule, then every experiment's figure and headline numbers
beside the paper's, what produced them, and where the run departs from the paper's protocol. Reads
files only, never a model.

A results directory may hold other results trees one level down (results/cpu/ for the cpu preset,
results/fashion/ for Fashion-MNIST, results/gpu/ for the gpu preset): each gets a column of the first
table, its own verdict table, verdicts.csv and sections, after the top-level ones."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from normprop_cli import config, hints, io, smoke, verdicts
from normprop_cli.errors import UserError
from normprop_cli.experiments import EXPERIMENTS, grid
from normprop_cli.experiments.plateau import plateau_section
from normprop_cli.statistics import format_ci, markdown
from normprop_cli.verdicts import ledger as rule_ledger
from normprop_cli.verdicts import provenance, result_dirs
from normprop_cli.verdicts.budget_text import budget_section, methods_text
from normprop_cli.verdicts.departures import augmentation, departures  # noqa: F401 (augmentation: report's API)
from normprop_cli.verdicts.robustness import robustness_text
from normprop_cli.verdicts.shared import statement

PRESET_ORDER = ("quick", "cpu", "fashion", "gpu")  # the first table's columns; other presets follow by name
CONCLUSIVE = (verdicts.REPRODUCED, verdicts.NOT_REPRODUCED)
UNMEASURED = (verdicts.NOT_MEASURED, verdicts.NOT_YET_MEASURED)


def results_trees(results: Path) -> list[Path]:
    """`results` itself, then each direct subdirectory that is a results tree of its own."""
    results = Path(results)
    nested = [
        d
        for d in sorted(results.iterdir() if results.is_dir() else [])
        if d.is_dir() and d.name not in EXPERIMENTS and any(result_dirs(d, e) for e in EXPERIMENTS)
    ]
    return [results, *nested]


def label(tree: Path, root: Path, preset: str) -> str:
    where = "" if tree == root else f"{tree.relative_to(root).as_posix()}/"
    return f"{preset or 'unknown'} preset (`{where}verdicts.csv`)"


# ---- verdicts -------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Tree:
    """One results tree and its verdicts (verdicts.table)."""

    path: Path
    frame: pd.DataFrame

    @property
    def preset(self) -> str:
        """The preset most of its rows ran with ('' when none says)."""
        presets = self.frame["preset"].dropna()
        presets = presets[presets != ""]
        return str(presets.mode().iloc[0]) if len(presets) else ""

    def rows(self) -> list[dict]:
        """The verdict rows as dicts, None where a value is missing."""
        return self.frame.astype(object).where(self.frame.notna(), None).to_dict("records")

    def datasets(self) -> list[str]:
        """The data sets its trained experiments ran on."""
        trains = self.frame["experiment"].map(lambda e: e in EXPERIMENTS and EXPERIMENTS[e].trains)
        trained = self.frame[trains & ~self.frame["verdict"].isin(UNMEASURED)]
        return sorted(d for d in trained["dataset"].dropna().unique() if d)


def ordered(trees: list[Tree], root: Path) -> list[Tree]:
    """quick, cpu, fashion, gpu, then any other preset by name; the same preset: `root` first, then by path."""

    def key(tree: Tree):
        rank = PRESET_ORDER.index(tree.preset) if tree.preset in PRESET_ORDER else len(PRESET_ORDER)
        return rank, tree.preset, tree.path != root, tree.path.as_posix()

    return sorted(trees, key=key)


def _effect(row: dict, unit: str) -> str:
    """'1.33 [0.20, 2.46] pp'; '—' where nothing was measured."""
    effect, low, high = (math.nan if row[k] is None else float(row[k]) for k in ("effect", "ci_low", "ci_high"))
    if not math.isfinite(effect):
        return "—"
    return f"{format_ci(effect, low, high, digits=2 if unit == 'pp' else 3)} {unit}".strip()


def _halves(row: dict) -> str:
    """'reproduced / inconclusive', with the halves rule's outcome where it is not plain agreement."""
    check = row.get("halves")
    text = f"{row['verdict_half_a']} / {row['verdict_half_b']}"
    return text if check in (None, verdicts.AGREE) else f"{text}, {check}"


def unmeasured(row: dict) -> bool:
    """Nothing measured: not (yet) measured, or "inconclusive: N of M runs diverged" (no seed left)."""
    return row["verdict"] in UNMEASURED or verdicts.is_diverged_verdict(row["verdict"])


def cell(row: dict, unit: str) -> str:
    """'**reproduced** 0.52 [0.21, 0.83] pp, n=6 (halves: reproduced / inconclusive)'; 'not measured';
    'inconclusive: 3 of 3 runs diverged'."""
    if unmeasured(row):
        return row["verdict"]
    halves = "no halves" if row.get("halves") == verdicts.NO_HALVES else f"halves: {_halves(row)}"
    return f"**{row['verdict']}** {_effect(row, unit)}, n={row['n_seeds']} ({halves})"


def column_names(trees: list[Tree], root: Path) -> list[str]:
    """'quick (digits)'; where two trees share a preset, where each is too: 'smoke (synthetic, `cpu/`)'."""
    presets = [t.preset or t.path.name or "results" for t in trees]
    names = []
    for tree, preset in zip(trees, presets, strict=True):
        where = [] if presets.count(preset) == 1 else [f"`{tree.path.relative_to(root).as_posix() or '.'}/`"]
        names.append(f"{preset} ({', '.join(tree.datasets() + where)})" if tree.datasets() or where else preset)
    return names


def claims_cell(rows: list[dict], unit: str) -> str:
    """One tree's rows of one claim: one cell, the data set named where there are several."""
    if not rows:
        return verdicts.NOT_MEASURED
    if len(rows) == 1:
        return cell(rows[0], unit)
    return "<br>".join(f"{r['dataset']}: {cell(r, unit)}" for r in rows)


def summary_table(trees: list[Tree], root: Path) -> list[str]:
    """The first table of REPORT.md: a row per claim, a column per tree (preset)."""
    names = column_names(trees, root)
    rows = [t.rows() for t in trees]
    table = [[f"{c.id}: {c.claim} ({c.source})",
              *(claims_cell([r for r in tree_rows if r["claim"] == c.id], c.unit) for tree_rows in rows)]
             for c in verdicts.claims()]  # fmt: skip
    return markdown(table, ["claim", *names]) + [""]


def conclusive(trees: list[Tree], claim_id: str) -> list[tuple[str, str, str]]:
    """(data set, preset, verdict) of every conclusive verdict on a claim, over the trees."""
    return [
        (r["dataset"], t.preset, r["verdict"])
        for t in trees
        for r in t.rows()
        if r["claim"] == claim_id and r["verdict"] in CONCLUSIVE and r["dataset"]
    ]


def disagreement(claim_id: str, entries: list[tuple[str, str, str]]) -> str | None:
    """'C4 (digits: not reproduced; fashion-mnist: reproduced)' where two conclusive verdicts on
    different data sets differ (a data set with several presets is named with each); None otherwise."""
    if not any(a[0] != b[0] and a[2] != b[2] for a, b in combinations(entries, 2)):
        return None
    datasets = [d for d, _, _ in entries]
    names = [d if datasets.count(d) == 1 else f"{d} ({p})" for d, p, _ in entries]
    return f"{claim_id} ({'; '.join(f'{n}: {v}' for n, (_, _, v) in zip(names, entries, strict=True))})"


def disagreements(trees: list[Tree]) -> str:
    """One sentence: the claims whose conclusive verdicts differ between presets on different data sets."""
    found = [d for c in verdicts.claims() if (d := disagreement(c.id, conclusive(trees, c.id)))]
    if found:
        return f"The data sets disagree on {', '.join(found[:-1]) + ' and ' if len(found) > 1 else ''}{found[-1]}."
    measured = sorted({d for t in trees for d in t.datasets()})
    where = f" ({', '.join(measured)})" if measured else ""
    return f"No conclusive verdicts disagree between the data sets{where}."


def _kind(row: dict, claim: verdicts.Claim) -> str:
    """'equivalence, 90%: ±0.84 pp': the test's kind, its interval's level and its threshold."""
    if unmeasured(row) or not claim.kind:
        return "—"
    margin = math.nan if row.get("margin") is None else float(row["margin"])
    threshold = verdicts.threshold_text(claim.kind, margin, claim.unit)
    if claim.kind != verdicts.SUPERIORITY and not math.isfinite(margin):
        threshold = "no margin"
    return f"{claim.kind}, {verdicts.level_of(claim.kind):.0%}: {threshold}"


def verdict_table(frame: pd.DataFrame) -> list[str]:
    """claim | verdict | effect [interval] | n seeds | kind, level: threshold | halves a / b | test |
    budget, and the notes."""
    claims = {c.id: c for c in verdicts.claims()}
    table, notes = [], []
    for row in Tree(Path(), frame).rows():
        c = claims[row["claim"]]
        measured = not unmeasured(row)
        cells = [
            f"{c.id}: {c.claim} ({c.source})",
            f"**{row['verdict']}**",
            _effect(row, c.unit),
            str(row["n_seeds"]) if row["n_seeds"] is not None else "—",
            _kind(row, c),
            _halves(row) if measured else "—",
            robustness_text(row, c.unit) if measured else "—",
            row["test"] or "—",
            row["budget"] or "—",
        ]
        table.append(cells)
        parts = [f"Metric: {row['metric']}" if row["metric"] else "", f"Note: {row['note']}" if row["note"] else ""]
        if any(parts):
            where = f" ({row['dataset']})" if row["dataset"] else ""
            notes.append(f"- **{c.id}**{where}. " + ". ".join(p for p in parts if p) + ".")
    head = [
        "claim",
        "verdict",
        "effect [interval]",
        "n seeds",
        "kind, level: threshold",
        "halves a / b",
        "robustness",
        "test",
        "budget",
    ]
    return markdown(table, head) + [""] + notes + [""]


BY_EPOCH = re.compile(r"the effect after each epoch \(mean over seeds\): ([^;]*)")


def disagreement_epochs(trees: list[Tree], root: Path) -> list[str]:
    """Under the sentence on the data sets: for each claim they disagree on, its effect after every
    epoch in each preset (from the verdict's note), so a reader sees whether the budget, not the data
    set, set the verdicts apart (a gap that is still closing at the last epoch)."""
    names = dict(zip((id(t) for t in trees), column_names(trees, root), strict=True))
    lines = []
    for c in verdicts.claims():
        if not disagreement(c.id, conclusive(trees, c.id)):
            continue
        found = [
            f"{names[id(t)]}: {m.group(1)}"
            for t in trees
            for r in t.rows()
            if r["claim"] == c.id and (m := BY_EPOCH.search(r.get("note") or ""))
        ]
        if found:
            lines.append(f"- {c.id}, the effect after each epoch ({c.unit}): " + "; ".join(found) + ".")
    return lines + [""] if lines else []


def verdicts_section(trees: list[Tree], root: Path) -> list[str]:
    """'## Verdicts': the table of every preset, the sentence on the data sets, each preset's table in
    full, the rule."""
    lines = ["## Verdicts", "", *summary_table(trees, root), disagreements(trees), ""]
    lines += disagreement_epochs(trees, root)
    lines += [
        "Each cell: the verdict, the effect with its interval (95%, 90% for an equivalence claim) in the "
        "claim's unit, the number of seeds, and the verdicts on the two halves of the seeds. Each preset's "
        "table in full, with the margins, the halves rule's outcome, each verdict's robustness and the notes, "
        "follows; the rule and the robustness checks are under *How a verdict is reached*.",
        "",
    ]
    names = column_names(trees, root)
    lines += statement([(n, t.path) for n, t in zip(names, trees, strict=True)], EXPERIMENTS, verdicts.claims())
    for tree in trees:
        lines += [f"### {label(tree.path, root, tree.preset)}", "", *verdict_table(tree.frame)]
    return lines + ["### How a verdict is reached", "", methods_text(verdicts.rule_text()), ""]


# ---- the experiments' sections ----------------------------------------------------------------------


def _title(experiment: str) -> str:
    try:
        return OmegaConf.select(config.load(experiment), "experiment.paper", default=None) or ""
    except UserError:
        return ""


def section(experiment: str, results: Path, root: Path | None = None, preset: str = "") -> list[str]:
    """One experiment of one results tree (of `preset`); figure links relative to `root` (where REPORT.md is)."""
    root = Path(root or results)
    title = _title(experiment)
    lines = [f"## {experiment}" + (f" — {title}" if title else ""), ""]
    dirs = result_dirs(results, experiment)
    if not dirs:
        command = hints.command("run", experiment, preset=preset, results_dir=results)
        return lines + [f"**Missing**: not run yet. `{command}` produces it.", ""]
    module = EXPERIMENTS[experiment]
    for directory in dirs:
        prov = provenance(directory)
        dataset = prov.get("dataset", directory.name if module.trains else None)
        cfg = grid.load(
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
        gone = verdicts.divergence(directory)
        if gone:
            kept = "no headline numbers: no run is left to average" if gone.every else "left out of the means below"
            lines += [f"**Diverged**: {gone.text()}; {kept}.", ""]
        for figure in sorted(directory.glob("*.png")):
            lines += [f"![{experiment} {figure.stem}]({figure.relative_to(root).as_posix()})", ""]
        if gone.every:
            lines += [f"- {s}" for s in departures(experiment, prov, directory)] + [""]
            continue
        try:
            rows = module.headlines(cfg)
        except UserError as exc:
            rows = []
            lines += [f"Headline numbers unavailable: {exc}", ""]
        if rows:
            cells = [[r["quantity"], _fmt(r["reproduced"]), _fmt(r.get("paper", ""))] for r in rows]
            lines += markdown(cells, ["quantity", "reproduced", "paper"])
            lines.append("")
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


def preset_experiments(preset: str) -> list[str]:
    """The experiments a preset runs: its own list (preset.experiments), or every one."""
    if preset not in config.options("preset"):
        return list(EXPERIMENTS)
    return list(config.root(preset).preset.get("experiments") or EXPERIMENTS)


def experiments(tree: Path, root: Path, preset: str = "") -> list[str]:
    """Every experiment's section of one tree (of those its preset runs), the missing ones named first."""
    names = [e for e in EXPERIMENTS if e in preset_experiments(preset)]
    missing = [e for e in names if not result_dirs(tree, e)]
    lines = [f"Missing experiments: {', '.join(missing)}.", ""] if missing else []
    for experiment in names:
        lines += section(experiment, tree, root, preset)
    return lines


def write_report(results: Path) -> Path:
    """REPORT.md in `results`, and verdicts.csv in every results tree found there."""
    results = Path(results)
    trees, left_out = smoke.leave_out([Tree(path, verdicts.table(path)) for path in results_trees(results)], results)
    for tree in trees:
        verdicts.write_verdicts(tree.path, tree.frame)
        rule_ledger.record(tree.path, tree.frame)  # before the sections that read it
    lines = [
        "# NormProp reproduction report",
        "",
        "Every experiment of Arpit et al. (ICML 2016), reproduced by `normprop`; written by "
        "`normprop report` from the CSVs under this directory.",
        "",
        *[line for note in left_out for line in (note, "")],
    ]
    lines += verdicts_section(ordered(trees, results), results)
    first = trees[0].preset
    lines += budget_section(results, results, first, preset_experiments(first))
    lines += plateau_section(results) + experiments(results, results, first)
    for tree in trees[1:]:
        lines += [f"# {tree.preset or tree.path.name} preset (`{tree.path.relative_to(results).as_posix()}/`)", ""]
        lines += budget_section(tree.path, results, tree.preset, preset_experiments(tree.preset))
        lines += plateau_section(tree.path) + experiments(tree.path, results, tree.preset)
    return io.write_text(results / "REPORT.md", "\n".join(lines).rstrip() + "\n")
