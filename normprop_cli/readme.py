"""The README's results at a glance: the verdict on each claim (C1-C8) by preset, one word and the
effect per cell, written by `normprop report` between two marker comments of the README.md beside the
results directory (the repository's, for results/), from the verdicts.csv files the report writes."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pandas as pd

from normprop_cli import io, verdicts
from normprop_cli.report import UNMEASURED, Tree, column_names, ordered, results_trees
from normprop_cli.smoke import leave_out
from normprop_cli.statistics import format_ci, markdown

START, END = "<!-- verdicts:start -->", "<!-- verdicts:end -->"


def read_verdicts(tree: Path) -> pd.DataFrame:
    return pd.read_csv(tree / "verdicts.csv", keep_default_na=False, na_values=[""])


def cell(rows: list[dict], unit: str) -> str:
    """'**reproduced** 0.01 [-0.60, 0.63] pp'; 'not measured'; one line per data set where there are several."""
    if not rows:
        return verdicts.NOT_MEASURED
    texts = []
    for row in rows:
        effect = row["effect"]
        if row["verdict"] in UNMEASURED or effect is None or not math.isfinite(float(effect)):
            text = str(row["verdict"])
        else:
            digits = 2 if unit == "pp" else 3
            ci = format_ci(float(effect), float(row["ci_low"]), float(row["ci_high"]), digits=digits)
            text = f"**{row['verdict']}** {ci} {unit}".strip()
            flips, n = row.get("loso_flips"), row.get("n_seeds")
            if flips is not None and not pd.isna(flips):
                text += f", {int(flips)}/{int(n)} leave-one-out flips"
        texts.append(f"{row['dataset']}: {text}" if len(rows) > 1 else text)
    return "<br>".join(texts)


def block(results: Path) -> str:
    """The markdown between the markers: the table and one line on what a cell holds."""
    results = Path(results)
    trees = [Tree(p, read_verdicts(p)) for p in results_trees(results) if (p / "verdicts.csv").exists()]
    trees, _ = leave_out(trees, results)
    trees = ordered(trees, results)
    names = column_names(trees, results)
    table = [
        [f"{c.id}: {c.claim}", *(cell([r for r in t.rows() if r["claim"] == c.id], c.unit) for t in trees)]
        for c in verdicts.claims()
    ]
    equivalence = [c.id for c in verdicts.claims() if c.kind == verdicts.EQUIVALENCE]
    level = f"95%; 90% for {' and '.join(equivalence)}, tested for equivalence" if equivalence else "95%"
    report = f"{results.name}/REPORT.md"
    note = (
        f"Each cell: the verdict and the effect with its interval ({level}), oriented so that a positive "
        "effect favours the paper, and how many of the subsets that leave one seed out reach another verdict. "
        f"[{report}]({report}) gives the margins, the seeds, both halves of the seeds, each verdict's "
        "break-even margin and its verdict at the best-validation epoch, and every experiment."
    )
    lines = [*markdown(table, ["claim", *names]), "", *textwrap.wrap(note, 110, break_on_hyphens=False)]
    return "\n".join(lines)


def with_block(text: str, content: str) -> str:
    """`text` with what lies between the markers replaced by `content`."""
    head, start, rest = text.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"README has no {START} ... {END} block")
    return f"{head}{START}\n{content}\n{END}{tail}"


def readme_of(results: Path) -> Path | None:
    """The README.md beside `results` that holds the markers, else None."""
    readme = Path(results).resolve().parent / "README.md"
    return readme if readme.exists() and START in readme.read_text() and END in readme.read_text() else None


def update(results: Path) -> Path | None:
    """Rewrite the README's block from `results`' verdicts.csv files; the README where that changed it,
    None where it did not (no README, no verdicts, or the block already says the same)."""
    readme = readme_of(results)
    if readme is None or not any((p / "verdicts.csv").exists() for p in results_trees(Path(results))):
        return None
    text = readme.read_text()
    new = with_block(text, block(results))
    if new == text:
        return None
    return io.write_text(readme, new)
