"""The report's section on whether a results tree's rules and budgets were fixed before the results they
judge, from the tree's ledger (engine.ledger, verdicts.ledger) and its runs' own files (verdicts.budgets).
Where the ledger's record begins, its "start" entry says what git showed of the time before; the section
gives that once, as git's account. Each claim's line has one form, so that a test can check it against the
ledger: `- **C4** (digits): kind and margin (...) fixed at TIME (SOURCE); test version HASH fixed at TIME
(SOURCE); first result TIME: margin fixed before|changed after the results, test fixed before|changed
after the results.`"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from normprop_cli.engine import ledger
from normprop_cli.statistics import markdown
from normprop_cli.verdicts import earlier
from normprop_cli.verdicts import ledger as rules
from normprop_cli.verdicts.budgets import Budget, budgets, first_result, parse_time
from normprop_cli.verdicts.rule import claims

HEADING = "## Rules and budgets: fixed before the results?"
BEFORE, AFTER = "fixed before the results", "changed after the results"


FIXED_CLAIM = "The margins m were fixed before the results they judge: "


def methods_text(rule: str) -> str:
    """The rule's paragraph, with its margins named and whether each came before its results left to the
    ledger's account (each preset's section), not asserted."""
    return rule.replace(FIXED_CLAIM, "The margins m (whether each was fixed before the results it judges: each "
                        "preset's *Rules and budgets* section): ")  # fmt: skip


def when(date: datetime | None) -> str:
    return date.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if date else "unknown"


def fields_text(entry: dict) -> str:
    """'equivalence, 0.2 × the test error (%) of NormProp ...'; 'superiority'."""
    kind, margin, relative = entry.get("kind"), entry.get("margin"), entry.get("relative_to")
    if kind == "superiority" and not margin:
        return str(kind)
    unit = f" × {relative}" if relative else " (absolute)"
    return f"{kind}, {float(margin or 0):g}{unit}"


def same_fields(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in rules.RULE_FIELDS)


def since(fixed: rules.Fixed, used: list[dict], key) -> tuple[datetime | None, str]:
    """(when the current value of `key` (the rule's fields, or its test version) took effect, where that comes
    from). Recorded: the first rule entry from which every later one has the current value. Where that value
    was in force when the record began (the first entry) and git's account ends with the same value (the same
    fields; the same text of the measure function), the commit that gave it."""
    current = key(fixed.now)
    i = len(used)
    while i > 0 and key(used[i - 1]) == current:
        i -= 1
    entry = used[i] if i < len(used) else fixed.now
    if i == 0 and key is fields_key and fixed.git_rules and same_fields(fixed.git_rules[-1], entry):
        return parse_time(fixed.git_rules[-1]["date"]), f"git: commit {fixed.git_rules[-1]['commit']}"
    if i == 0 and key is test_key and fixed.git_tests and fixed.git_tests[-1]["source_sha256"] == entry.get("measure"):
        last = fixed.git_tests[-1]
        return parse_time(last["date"]), f"git: commit {last['commit']}, the measure's own code"
    return parse_time(entry["at"]), "recorded: first used"


def fields_key(entry: dict) -> tuple:
    return tuple(entry.get(k) for k in rules.RULE_FIELDS)


def test_key(entry: dict) -> str:
    return entry.get("test", "")


def claim_lines(tree: Path) -> tuple[list[str], list[str], list[str]]:
    """Each claim's line, the claims whose margin and whose test changed after their results."""
    experiments = {c.id: c.experiment for c in claims()}
    entries = [e for e in ledger.read(tree) if e.get("event") == rules.RULE]
    lines, margins, tests = [], [], []
    for f in rules.fixed(tree):
        used = [e for e in entries if e["claim"] == f.claim and (e.get("dataset") or "") == f.dataset]
        first = first_result(tree, experiments.get(f.claim, ""))
        at_fields, from_fields = since(f, used, fields_key)
        at_test, from_test = since(f, used, test_key)
        late_fields = bool(first and at_fields and at_fields > first)
        late_test = bool(first and at_test and at_test > first)
        compared = (f"margin {AFTER if late_fields else BEFORE}, test {AFTER if late_test else BEFORE}" if first
                    else "no run manifest says when its results were made, so neither is compared")  # fmt: skip
        margins += [f.claim] if late_fields else []
        tests += [f.claim] if late_test else []
        where = f" ({f.dataset})" if f.dataset else ""
        lines.append(
            f"- **{f.claim}**{where}: kind and margin ({fields_text(f.now)}) fixed at {when(at_fields)} "
            f"({from_fields}); test version {f.now['test']} fixed at {when(at_test)} ({from_test}); "
            f"first result {when(first)}: {compared}."
        )
    return lines, sorted(set(margins)), sorted(set(tests))


def replaced_rows(tree: Path) -> list[list[str]]:
    """Runs trained again in place: recorded ("replaced" entries) and, from before the record, git's account."""
    rows = []
    begun = rules.start(tree) or {}
    for experiment, found in sorted(((begun.get("git") or {}).get("replaced") or {}).items()):
        for r in found:
            rows.append([experiment, when(parse_time(r["date"])), str(r["runs"]), f"git: commit {r['commit']}",
                         verdicts_text(r.get("verdicts_before") or [])])  # fmt: skip
    groups: dict[tuple, list[dict]] = {}  # the runs one command replaced, with the same verdict before
    for e in (e for e in ledger.read(tree) if e.get("event") == "replaced"):
        before = verdicts_text(e.get("verdicts") or [])
        key = (str(e.get("experiment")), when(parse_time(e["at"])), e.get("why"), before)
        groups.setdefault(key, []).append(e)
    for (experiment, at, why, before), found in groups.items():
        runs = ", ".join(str(e.get("run")) for e in found)
        kept = {Path(str(e.get("kept"))).relative_to(Path(str(e.get("kept"))).parents[1]).as_posix() for e in found}
        where = f"`{found[0]['kept']}/`" if len(found) == 1 else f"each run's `{'`, `'.join(sorted(kept))}/`"
        rows.append([experiment, at, f"{len(found)} ({runs}; {why})", f"recorded: {where}", before])
    return rows


def verdicts_text(rows: list[dict]) -> str:
    """'C6 inconclusive 0.0776 [-0.222, 0.303]'; 'no verdict recorded'."""
    out = []
    for r in rows:
        numbers = [r.get(k) for k in ("effect", "ci_low", "ci_high")]
        try:
            effect, low, high = (float(x) for x in numbers)
            shown = f" {effect:.3g} [{low:.3g}, {high:.3g}]"
        except (TypeError, ValueError):
            shown = ""
        out.append(f"{r.get('claim')} {r.get('verdict')}{shown}")
    return "; ".join(out) or "no verdict recorded"


def budget_row(b: Budget, git: dict) -> list[str]:
    values = []
    for key, counts in b.values.items():
        shown = ", ".join(v + (f" ({n} run{'s' * (n != 1)})" if len(counts) > 1 else "") for v, n in counts.items())
        values.append(f"`{key}` {shown}")
    seeds = f"{b.runs} runs, seeds {min(b.seeds)}-{max(b.seeds)}" if b.seeds else "no runs"
    dirty = "none"
    if b.dirty:
        hashed = f"{b.hashed} with a hash of the diff" if b.hashed else "no diff recorded: no commit holds their code"
        names = sorted(b.dirty_commits)
        listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        dirty = f"{b.dirty} of {b.every}, sweep runs included ({listed}; {hashed})"
    told = ((git.get("budgets") or {}).get(b.experiment) or {}).get("changed_after") or "none"
    return [b.experiment, "; ".join([seeds, *values]), when(b.first_result), dirty, told.replace("|", "\\|")]


def budget_section(tree: Path, root: Path, preset: str, experiments: list[str]) -> list[str]:
    """'## Rules and budgets: fixed before the results?' for one results tree (`root`: where REPORT.md is)."""
    name = f"{preset or 'this'} preset"
    begun = rules.start(tree)
    if begun is None:
        record = (f"Nothing of this tree's past was recorded: it has no `{ledger.LEDGER}`. The ledger is written "
                  "from the first run trained again in place or the first verdict the report computes.")  # fmt: skip
    else:
        record = (f"The ledger (`{ledger.LEDGER}` in this tree) records every run trained again in place and every "
                  f"rule first used against these results, when it happens, from {when(parse_time(begun['at']))} "
                  f"on. Nothing before that was recorded when it happened: what git showed of it then (at commit "
                  f"{begun.get('head')}) is marked *git* below; a change git cannot see (a file edited and "
                  "trained from before it was committed) is missing from it.")  # fmt: skip
    lines, margins, tests = claim_lines(tree)
    out = [HEADING, "", record, "", "Each claim's rule: its kind and margin (conf/claims.yaml) and the version of "
           "its test (a hash of its measure's code and the rule's), when each took the value it has now, and "
           "whether that was before the first result it judges (the earliest start of the experiment's runs).",
           "", *lines, ""]  # fmt: skip
    if margins:
        out.append(f"**Margins changed after their results** ({name}): {', '.join(margins)}.")
    else:
        out.append(f"Every margin was fixed before the results it judges ({name}).")
    if tests:
        out.append(f"**Tests changed after their results** ({name}): {', '.join(tests)}.")
    out += ["", *earlier.section(tree)]
    git = (begun or {}).get("git") or {}
    found = budgets(tree, experiments)
    head = ["experiment", "the runs' own configs", "first result", "runs from uncommitted code",
            "budget or rule values changed after the first result (*git*, before the record)"]  # fmt: skip
    out += ["The budgets, as the runs' own config.yaml files give them (values with more than one run count "
            "say how many runs trained with each), and the runs whose manifest names a commit with uncommitted "
            "changes (`+dirty`).", "", *markdown([budget_row(b, git) for b in found], head), ""]  # fmt: skip
    dirty = [f"{b.experiment} ({b.dirty} of {b.every} runs{'' if b.hashed == b.dirty else ', no diff recorded'})"
             for b in found if b.dirty]  # fmt: skip
    if dirty:
        out += [f"**Runs from uncommitted code** ({name}): {'; '.join(dirty)}. Where no diff was recorded, no commit "
                "is known to hold the code that trained them.", ""]  # fmt: skip
    replaced = replaced_rows(tree)
    head = ["experiment", "when", "runs", "where the earlier run is", "the verdict before"]
    if replaced:
        out += ["Runs trained again in place (a run's `started` changed; *git*: from the committed manifests), "
                "with the verdict the tree's verdicts.csv gave on the experiment's claim just before.", "",
                *markdown(replaced, head), ""]  # fmt: skip
    else:
        out += [f"No run was trained again in place ({name}).", ""]
    return out
