"""Smoke results (the smoke preset: a tiny NIN on synthetic images, for tests) stay out of the verdicts
of a report of real results. A results tree of the smoke preset beside real ones (results/smoke/) is
left out, and a smoke sweep inside a real tree (`--preset smoke --results-dir results`) gives none of
its verdicts; the report says so in a sentence each. A report whose top-level tree is of the smoke
preset (a test's results directory) is of smoke results, and keeps them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from normprop_cli import hints, verdicts

SMOKE = "smoke"
WHY = "synthetic images, for tests"


def leave_out(trees: list, root: Path) -> tuple[list, list[str]]:
    """The trees (report.Tree, the top-level one first) with the smoke results taken out, and a sentence
    for each thing taken out."""
    if not trees or trees[0].preset == SMOKE:
        return trees, []
    kept, notes = [], []
    for tree in trees:
        where = f"`{tree.path.relative_to(root).as_posix()}/`" if tree.path != root else "this directory"
        if tree.path != root and tree.preset == SMOKE:
            command = hints.command("report", preset=SMOKE, results_dir=tree.path)
            notes.append(f"Left out: {where}, smoke-preset results ({WHY}); `{command}` reports them alone.")
            continue
        frame, sweeps = without_smoke(tree.frame, tree.preset)
        if sweeps:
            notes.append(f"Left out of the verdicts: the smoke-preset results ({WHY}) of {sweeps} in {where}.")
        kept.append(dataclasses.replace(tree, frame=frame))
    return kept, notes


def without_smoke(frame: pd.DataFrame, preset: str) -> tuple[pd.DataFrame, str]:
    """A tree's verdict rows less those of smoke sweeps (a claim left with none is "not measured"), and
    the sweeps taken out ('table1 on synthetic'; '' when none)."""
    smoke = frame["preset"].eq(SMOKE)
    if not smoke.any():
        return frame, ""
    measured = set(frame.loc[~smoke, "claim"])
    rows, filled = [], set()
    for row, is_smoke in zip(frame.to_dict("records"), smoke, strict=True):
        if not is_smoke:
            rows.append(row)
        elif row["claim"] not in measured | filled:
            filled.add(row["claim"])
            note = f"only smoke-preset results ({WHY}), left out"
            head = {k: row[k] for k in ("claim", "source", "experiment")}
            rows.append(head | {"dataset": "", "preset": preset, "verdict": verdicts.NOT_MEASURED, "note": note})
    sweeps = frame.loc[smoke, ["experiment", "dataset"]].drop_duplicates()
    names = ", ".join(f"{e} on {d}" for e, d in sweeps.itertuples(index=False))
    return pd.DataFrame(rows).reindex(columns=frame.columns).astype({"n_seeds": "Int64"}), names
