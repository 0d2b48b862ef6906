"""The report's section on budgets (verdicts/budgets.py): were they fixed before the results they judge?"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from normprop_cli.statistics import markdown
from normprop_cli.verdicts.budgets import UNSET, Budget, Change, budgets

HEADING = "## Budgets: fixed before the results?"


def when(date: datetime | None) -> str:
    return date.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if date else ""


def value_text(value: object) -> str:
    """A value on one line, as JSON writes it: 12, null, true, [1, 10, 50], "text"; "unset"."""
    return "unset" if value is UNSET else json.dumps(value, ensure_ascii=False, default=str)


def family(key: str) -> str:
    """The name a key is listed under: itself, or its family where one commit may change many of them
    (`experiment.lr_sweep.*`, `grid.*`, `claims.C4.*`)."""
    if key.startswith("claims."):
        return ".".join(key.split(".")[:2]) + ".*"
    return next(
        (f"{p}*" for p in ("experiment.lr_sweep.", "experiment.extra_seeds.", "grid.") if key.startswith(p)), key
    )


def changes_text(changes: tuple[Change, ...]) -> str:
    """'6817790 (2026-11-24 10:20 UTC): `train.epochs` 8 -> 12; ...': the changes by commit, oldest first;
    a family of keys (family) as '`grid.*` (7 values)'."""
    groups: dict[str, dict[str, list[Change]]] = {}
    for c in changes:
        where = f"{c.commit} ({when(c.date)})" if c.date else c.commit
        groups.setdefault(where, {}).setdefault(family(c.key), []).append(c)

    def text(name: str, found: list[Change]) -> str:
        if len(found) == 1 and found[0].key == name:
            return f"`{name}` {value_text(found[0].old)} -> {value_text(found[0].new)}"
        return f"`{name}` ({len(found)} value{'s' if len(found) > 1 else ''})"

    parts = [f"{where}: {', '.join(text(n, f) for n, f in by.items())}" for where, by in groups.items()]
    return "; ".join(parts).replace("|", "\\|")


def row(b: Budget) -> list[str]:
    fixed = f"{b.commit}, {when(b.date)}" if b.commit else "never committed"
    if b.uncommitted:
        fixed = f"uncommitted edits on {fixed}"
    first = when(b.first_result) if b.first_result else "no run manifest"
    if b.removed_first:
        first += f" (earlier runs, from {when(b.removed_first)}, removed in {', '.join(b.removed_in)})"
    changed = [changes_text(b.changes)] if b.changes else []
    if b.before_rerun:
        changed.insert(0, f"after the removed runs, before the rerun: {changes_text(b.before_rerun)}")
    return [b.experiment, fixed, first, "<br>".join(changed) or "none"]


def budget_section(tree: Path, root: Path, preset: str, experiments: list[str], repo: Path | None = None) -> list[str]:
    """'## Budgets: fixed before the results?' for one results tree: a row per experiment (the commit
    and date of the values it is judged by, its first result, the values changed after it), then one
    line naming the experiments whose budget or rule changed after their first result, or saying none
    did. Deterministic: no current time, no absolute path."""
    found = budgets(tree, root, preset, experiments, repo)
    if isinstance(found, str):
        return [HEADING, "", found, ""]
    intro = (
        "The budgets (epochs, seeds, subsets, rate-sweep settings) and the rule (conf/claims.yaml's kinds "
        "and margins) each experiment is judged by: the commit that last changed their values, the start "
        "of its first run (sweep runs included), and every value changed after it (old -> new, commit)."
    )
    head = ["experiment", "rule and budgets as of", "first result judged", "changed after the first result"]
    lines = [HEADING, "", intro, "", *markdown([row(b) for b in found], head), ""]
    late = [(b.experiment, sorted({family(c.key) for c in b.before_rerun + b.changes})) for b in found]
    late = [f"{e} ({', '.join(keys)})" for e, keys in late if keys]
    name = f"{preset or 'this'} preset"
    if late:
        lines.append(f"**Changed after results were seen** ({name}): {'; '.join(late)}.")
    else:
        lines.append(f"No budget or rule value was changed after the first result it judges ({name}).")
    return lines + [""]
