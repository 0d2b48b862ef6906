"""Every sentence of a report about when a claim's margin and test were fixed, and whether before its
results, says what the tree's ledger (LEDGER.jsonl) and its runs' manifests say: read here on their own,
from the files, for the committed reports and for a small tree made here."""

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from normprop_cli.verdicts import ledger as rules
from normprop_cli.verdicts.budget_text import budget_section

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(
    r"^- \*\*(?P<claim>C\d+)\*\*(?: \((?P<dataset>[^)]*(?:\([^)]*\)[^)]*)?)\))?: kind and margin \((?P<fields>.*)\) "
    r"fixed at (?P<fixed>[^()]+) \((?P<source>[^)]*)\); test version (?P<test>\w+) fixed at (?P<tested>[^()]+) "
    r"\((?P<test_source>[^)]*)\); first result (?P<first>unknown|[-\d]+ [\d:]+ UTC): (?P<verdict>.*)\.$"
)
EXPERIMENT = {"C1": "data-norm", "C2": "covariate-shift", "C3": "convergence", "C4": "batch-size", "C5": "table1",
              "C6": "timing", "C7": "theory", "C8": "activations"}  # fmt: skip


def minute(text: str) -> str:
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    t = t if t.tzinfo else t.replace(tzinfo=UTC)
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def parsed(text: str) -> datetime:
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def entries(tree: Path) -> list[dict]:
    path = tree / "LEDGER.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def first_started(tree: Path, experiment: str) -> datetime | None:
    times = [json.loads(p.read_text()).get("started") for p in tree.glob(f"{experiment}/*/runs/*/manifest.json")]
    return min((parsed(t) for t in times if t), default=None)


def fields(entry: dict) -> tuple:
    return entry.get("kind"), entry.get("margin"), entry.get("relative_to")


def when_fixed(source: str, at: str, used: list[dict], git: list[dict], key, git_key) -> datetime:
    """Check one 'fixed at TIME (SOURCE)' against the ledger; the exact time it names."""
    current = key(used[-1])
    if source.startswith("git: commit"):
        commit = source.split()[2].rstrip(",")
        assert all(key(e) == current for e in used), "git's account, yet the ledger records a change"
        assert git and git[-1]["commit"] == commit and git_key(git[-1], used[0]), (commit, git[-1:])
        assert minute(git[-1]["date"]) == at
        return parsed(git[-1]["date"])
    assert source == "recorded: first used"
    i = next(i for i in range(len(used)) if all(key(e) == current for e in used[i:]))
    assert minute(used[i]["at"]) == at
    assert i > 0 or not git or not git_key(git[-1], used[0]), "git's account gives this value: the source is git"
    return parsed(used[i]["at"].replace("+0000", "+00:00"))


def check_tree(tree: Path, text: str) -> None:
    """Every claim line of one tree's section, and its summary sentence, against the tree's files."""
    log = entries(tree)
    start = next((e for e in log if e["event"] == "start"), {})
    git = start.get("git") or {}
    late = []
    lines = [line for line in text.splitlines() if line.startswith("- **C")]
    assert lines, "no claim line"
    for line in lines:
        m = LINE.match(line)
        assert m, line
        claim, dataset = m["claim"], m["dataset"] or ""
        used = [e for e in log if e["event"] == "rule" and e["claim"] == claim and (e.get("dataset") or "") == dataset]
        assert used, f"{claim}: no rule entry in the ledger"
        assert m["test"] == used[-1]["test"]
        fixed = when_fixed(m["source"], m["fixed"], used, git.get("rules", {}).get(claim, []), fields,
                           lambda g, e: fields(g) == fields(e))  # fmt: skip
        tested = when_fixed(m["test_source"].replace(", the measure's own code", ""), m["tested"], used,
                            git.get("tests", {}).get(claim, []), lambda e: e["test"],
                            lambda g, e: g["source_sha256"] == e.get("measure"))  # fmt: skip
        first = first_started(tree, EXPERIMENT[claim])
        if first is None:
            assert m["first"] == "unknown" and "neither is compared" in m["verdict"]
            continue
        assert m["first"] == first.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
        margin = "changed after the results" if fixed > first else "fixed before the results"
        test = "changed after the results" if tested > first else "fixed before the results"
        assert m["verdict"] == f"margin {margin}, test {test}", line
        late += [claim] if fixed > first else []
    summary = re.search(r"\*\*Margins changed after their results\*\* \([^)]*\): ([^.]*)\.", text)
    assert (summary.group(1).split(", ") if summary else []) == sorted(set(late))
    if not late:
        assert "Every margin was fixed before the results it judges" in text


def sections(report: Path) -> list[tuple[Path, str]]:
    """(results tree, its *Rules and budgets* section) of a REPORT.md."""
    tree, out, current = report.parent, [], None
    for line in report.read_text().splitlines():
        if m := re.match(r"^# \S+ preset \(`(.+)/`\)$", line):
            tree = report.parent / m.group(1)
        if line.startswith("## "):
            current = [] if line.startswith("## Rules and budgets") else None
            if current is not None:
                out.append((tree, current))
        elif current is not None:
            current.append(line)
    return [(t, "\n".join(lines)) for t, lines in out]


@pytest.mark.parametrize("report", sorted((ROOT / "results").rglob("REPORT.md")), ids=lambda p: p.parent.name)
def test_the_committed_reports_say_what_their_ledgers_say(report):
    assert "fixed before the results they judge" not in report.read_text()  # said per claim, from the ledger
    found = sections(report)
    assert found, f"{report} has no rules and budgets section"
    for tree, text in found:
        check_tree(tree, text)


def test_a_margin_changed_after_the_results_is_said_so_and_a_recorded_one_is_dated_by_the_ledger(tmp_path):
    tree = tmp_path / "results"
    run = tree / "table1" / "digits" / "runs" / "normprop-s0"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"started": "2026-01-02T10:00:00+0000", "seed": 0}))
    git = {"rules": {"C5": [{"commit": "aaaaaaa", "date": "2026-01-01T09:00:00+00:00", "kind": "non-inferiority",
                             "margin": 1.0, "relative_to": None},
                            {"commit": "bbbbbbb", "date": "2026-01-03T09:00:00+00:00", "kind": "non-inferiority",
                             "margin": 0.1, "relative_to": "BatchNorm's test error (%)"}]},
           "tests": {"C5": [{"commit": "aaaaaaa", "date": "2026-01-01T09:00:00", "source_sha256": "m1"}]}}  # fmt: skip
    rule = {"event": "rule", "claim": "C5", "dataset": "digits", "entry": "e1", "test": "t1", "measure": "m1",
            "kind": "non-inferiority", "margin": 0.1, "relative_to": "BatchNorm's test error (%)"}  # fmt: skip
    log = [{"at": "2026-01-04T00:00:00+0000", "event": "start", "git": git, "head": "bbbbbbb"},
           rule | {"at": "2026-01-04T00:01:00+0000"},
           rule | {"at": "2026-01-05T12:30:00+0000", "test": "t2", "measure": "m2"}]  # fmt: skip
    (tree / "LEDGER.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))

    text = "\n".join(budget_section(tree, tmp_path, "quick", ["table1"]))
    check_tree(tree, text)
    assert "fixed at 2026-01-03 09:00 UTC (git: commit bbbbbbb)" in text
    assert "test version t2 fixed at 2026-01-05 12:30 UTC (recorded: first used)" in text
    assert "margin changed after the results, test changed after the results" in text
    assert [f.claim for f in rules.fixed(tree)] == ["C5"]


def test_every_claims_test_code_is_the_code_its_declared_version_was_declared_for():
    """A change to a claim's test code is declared (conf/claim_tests.yaml): a new `id` where it judges
    differently, a new `source` alone where it was only rewritten; never an undeclared change."""
    from normprop_cli.verdicts.ledger import declared, source_version
    from normprop_cli.verdicts.measures import MEASURES

    tests = declared()
    assert sorted(tests) == sorted(MEASURES), "every claim with a measure declares its test's version"
    for claim, version in tests.items():
        now = source_version(claim)
        assert version["source"] == now, (
            f"{claim}'s test code changed (hash {now}, declared for {version['source']}) in conf/claim_tests.yaml: "
            f"set `id: {now}` as well if it judges differently, else only `source: {now}`"
        )


def test_a_rewrite_declared_as_one_keeps_the_ledgers_test_version(tmp_path, monkeypatch):
    from normprop_cli.verdicts import ledger as rules

    (tmp_path / "claim_tests.yaml").write_text("C5: {id: aaaaaaaaaaaa, source: bbbbbbbbbbbb}\n")
    monkeypatch.setattr(rules.config, "conf_dir", lambda: tmp_path)
    assert rules.test_version("C5") == "aaaaaaaaaaaa"  # the ledger's name for it, whatever the code's hash now
    assert rules.test_version("C1") == rules.source_version("C1")  # undeclared: the code's own hash
