"""The committed reports cannot go stale: `normprop report` over a copy of the committed results
rewrites every REPORT.md and verdicts.csv byte for byte (and adds no rule to a ledger), and the README's
verdict block is what the committed verdicts.csv files give."""

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from normprop_cli import readme
from normprop_cli.cli import app

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
REPORTS = sorted(p.parent for p in RESULTS.rglob("REPORT.md"))


@pytest.mark.parametrize("tree", REPORTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_report_rewrites_the_committed_report_and_verdicts_byte_for_byte(tree, tmp_path, monkeypatch):
    copy = tmp_path / "results"  # the tree alone (results: all of it, as its report reads the nested trees)
    where = copy / tree.relative_to(RESULTS)
    shutil.copytree(tree, where, ignore=shutil.ignore_patterns("*.pt", "*.lock"))
    monkeypatch.chdir(copy.parent)  # as from the repository's root: the commands it suggests name no directory
    relative = where.relative_to(copy.parent).as_posix()
    result = CliRunner().invoke(app, ["report", "--results-dir", relative], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rewritten = [where / "REPORT.md", *where.rglob("verdicts.csv"), *where.rglob("LEDGER.jsonl")]  # no rule unrecorded
    for path in rewritten:
        committed = RESULTS / path.relative_to(copy)
        assert path.read_bytes() == committed.read_bytes(), (
            f"{committed.relative_to(ROOT)} is stale: `normprop report --results-dir "
            f"{tree.relative_to(ROOT)}` rewrites it"
        )


def test_the_readme_verdict_block_is_what_the_committed_verdicts_give():
    text = (ROOT / "README.md").read_text()
    assert readme.START in text and readme.END in text
    assert readme.with_block(text, readme.block(RESULTS)) == text, "`normprop report` rewrites README.md's verdicts"


def test_the_report_updates_the_readme_beside_the_results_and_no_other(tmp_path):
    (tmp_path / "results").mkdir()
    shutil.copy(RESULTS / "verdicts.csv", tmp_path / "results" / "verdicts.csv")
    (tmp_path / "README.md").write_text(f"# x\n\n{readme.START}\nold\n{readme.END}\n\nafter\n")
    assert readme.update(tmp_path / "results") == (tmp_path / "README.md").resolve()
    text = (tmp_path / "README.md").read_text()
    assert "old" not in text and text.endswith(f"{readme.END}\n\nafter\n") and "| C5: " in text
    assert readme.update(tmp_path / "results") is None  # the same block: nothing rewritten
    (tmp_path / "other").mkdir()
    assert readme.update(tmp_path / "other") is None  # no verdicts there
    (tmp_path / "README.md").write_text("no markers\n")
    assert readme.update(tmp_path / "results") is None
