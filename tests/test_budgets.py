"""verdicts.budgets: the budgets and the rule each experiment is judged by, and what changed after its
first result, read from a small git repository built here (and once from this checkout's own history)."""

import json
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from normprop_cli.verdicts import budget_text as t
from normprop_cli.verdicts import budgets as b

CONFIG = """defaults:
  - _self_
  - model: nin
seed: 0
seeds: 1
train:
  epochs: 10
  lr: 0.05
"""
PRESET = """# @package _global_
# The tiny preset.
train:
  epochs: 4
seeds: 2
"""
EXPERIMENT = """# @package _global_
train:
  lr_halve_every: 2
grid:
  - {id: a, set: {train.batch_size: 10, train.lr: 0.1}}
  - {id: b, seeds: 1, set: {train.batch_size: 50}}
"""
CLAIMS = """claims:
  C1: {experiment: exp, kind: equivalence, margin: 0.1, relative_to: "a's error", unit: pp}
  C2: {experiment: other, kind: superiority, margin: 0.0}
"""


def git(repo: Path, *args: str, date: str | None = None) -> str:
    env = os.environ | ({"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date} if date else {})
    config = ["-c", "user.email=t@example.com", "-c", "user.name=t", "-c", "commit.gpgsign=false",
              "-c", "core.hooksPath=/dev/null"]  # fmt: skip
    done = subprocess.run(["git", *config, *args], cwd=repo, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def commit(repo: Path, date: str, files: dict[str, str], message: str = "change") -> str:
    """Write the files, commit them at `date`; the short hash."""
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message, date=date)
    return git(repo, "rev-parse", "--short=7", "HEAD")


def manifest(tree: Path, run: str, started: str, experiment: str = "exp") -> None:
    path = tree / experiment / "digits" / "runs" / run / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run": run, "started": started}))


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A checkout: conf/ committed at 10:00, seeds 2 -> 3 at 11:00, runs from 11:30 (a sweep run) and
    12:00, then epochs 4 -> 6 at 13:00, a comment-only edit at 14:00, C1's margin 0.1 -> 0.2 at 15:00."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    git(tmp_path, "init", "-q")
    conf = {"conf/config.yaml": CONFIG, "conf/model/nin.yaml": "width: 1.0\n", "conf/preset/tiny.yaml": PRESET,
            "conf/experiment/exp.yaml": EXPERIMENT, "conf/claims.yaml": CLAIMS}  # fmt: skip
    hashes = {"first": commit(tmp_path, "2026-01-01T10:00:00+00:00", conf)}
    hashes["seeds"] = commit(tmp_path, "2026-01-01T11:00:00+00:00", {"conf/preset/tiny.yaml": PRESET.replace("2", "3")})
    tree = tmp_path / "results" / "tiny"
    manifest(tree, "a-s0", "2026-01-01T12:00:00+0000")
    manifest(tree, "sweep-a-lr0.1-s100", "2026-01-01T13:30:00+0200")  # 11:30 UTC: the first result
    preset = PRESET.replace("2", "3").replace("epochs: 4", "epochs: 6")
    hashes["epochs"] = commit(tmp_path, "2026-01-01T13:00:00+00:00", {"conf/preset/tiny.yaml": preset})
    comment = preset.replace("# The tiny preset.", "# The tiny preset, reworded.") + "# a trailing comment\n"
    hashes["comment"] = commit(tmp_path, "2026-01-01T14:00:00+00:00", {"conf/preset/tiny.yaml": comment})
    hashes["margin"] = commit(tmp_path, "2026-01-01T15:00:00+00:00", {"conf/claims.yaml": CLAIMS.replace("0.1", "0.2")})
    return tmp_path, tree, hashes


def test_a_value_changed_after_the_first_result_is_listed_and_one_before_is_not(repo):
    root, tree, hashes = repo
    (found,) = b.budgets(tree, root / "results", "tiny", ["exp"])
    assert found.first_result == datetime(2026, 1, 1, 11, 30, tzinfo=UTC)  # the sweep run counts
    assert [(c.key, c.old, c.new, c.commit) for c in found.changes] == [
        ("train.epochs", 4, 6, hashes["epochs"]),
        ("claims.C1.margin", 0.1, 0.2, hashes["margin"]),
    ]
    assert (found.commit, found.uncommitted) == (hashes["margin"], False)  # the comment edit changed no value
    lines = t.budget_section(tree, root / "results", "tiny", ["exp"])
    text = "\n".join(lines)
    assert lines[0] == t.HEADING
    assert f"{hashes['epochs']} (2026-01-01 13:00 UTC): `train.epochs` 4 -> 6" in text
    assert "`seeds`" not in text and hashes["seeds"] not in text and hashes["comment"] not in text
    assert f"| exp | {hashes['margin']}, 2026-01-01 15:00 UTC | 2026-01-01 11:30 UTC |" in text
    assert lines[-2] == "**Changed after results were seen** (tiny preset): exp (claims.C1.*, train.epochs)."
    assert str(root) not in text


def test_a_comment_only_edit_is_no_change(repo):
    root, tree, hashes = repo
    history = b.History(root, root / "conf")
    before = b.values(history, hashes["epochs"], "exp", "tiny", ["digits"])
    assert before == b.values(history, hashes["comment"], "exp", "tiny", ["digits"])
    assert before["grid.ids"] == ["a", "b"] and before["grid.b.seeds"] == 1 and before["grid.a.train.batch_size"] == 10
    assert "grid.a.train.lr" not in before and "train.lr" not in before  # rates are no budget
    assert before["model.width"] == 1.0 and before["claims.C1.relative_to"] == "a's error"
    assert not any(k.startswith("claims.C2") for k in before)  # another experiment's claim


def test_nothing_changed_after_the_first_result_says_so(repo):
    root, tree, _ = repo
    manifest(tree, "b-s0", "2026-01-01T16:00:00+00:00", experiment="late")
    (found,) = b.budgets(tree, root / "results", "tiny", ["late"])
    assert found.changes == () and found.first_result == datetime(2026, 1, 1, 16, tzinfo=UTC)
    lines = t.budget_section(tree, root / "results", "tiny", ["late"])
    assert lines[-2] == "No budget or rule value was changed after the first result it judges (tiny preset)."


def test_an_uncommitted_edit_is_a_change_after_every_result(repo):
    root, tree, _ = repo
    preset = root / "conf" / "preset" / "tiny.yaml"
    preset.write_text(preset.read_text().replace("seeds: 3", "seeds: 5"))
    (found,) = b.budgets(tree, root / "results", "tiny", ["exp"])
    assert found.uncommitted and (found.changes[-1].key, found.changes[-1].commit) == ("seeds", b.UNCOMMITTED)
    assert "uncommitted: `seeds` 3 -> 5" in "\n".join(t.budget_section(tree, root / "results", "tiny", ["exp"]))


def test_runs_removed_and_rerun_show_the_changes_made_after_them(repo):
    root, tree, hashes = repo
    git(root, "rm", "-q", "-r", "--cached", "results")  # the fixture's runs stay on disk, untracked
    manifest(tree, "old-s0", "2026-01-01T10:30:00+00:00", experiment="redo")
    commit(root, "2026-01-01T16:00:00+00:00", {}, "old runs")
    git(root, "rm", "-q", "-r", "results/tiny/redo")
    gone = commit(root, "2026-01-01T17:00:00+00:00", {}, "old runs removed")
    manifest(tree, "new-s0", "2026-01-01T18:00:00+00:00", experiment="redo")
    (found,) = b.budgets(tree, root / "results", "tiny", ["redo"])
    assert found.changes == () and found.removed_in == (gone,)
    assert [c.key for c in found.before_rerun] == ["seeds", "train.epochs"]  # made after 10:30, before 18:00
    assert "after the removed runs, before the rerun" in "\n".join(t.budget_section(tree, root, "tiny", ["redo"]))


def test_without_git_history_one_line_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text(CONFIG)
    manifest(tmp_path / "results", "a-s0", "2026-01-01T12:00:00+00:00")
    lines = t.budget_section(tmp_path / "results", tmp_path / "results", "tiny", ["exp"])
    assert lines == [t.HEADING, "", lines[2], ""] and "unavailable" in lines[2] and "git checkout" in lines[2]
    monkeypatch.setenv("PATH", "")  # no git at all
    assert "unavailable" in t.budget_section(tmp_path / "results", tmp_path, "tiny", ["exp"])[2]


def test_a_shallow_clone_says_so(repo, tmp_path_factory):
    root, _, _ = repo
    clone = tmp_path_factory.mktemp("clone") / "shallow"
    git(root, "clone", "-q", "--depth", "1", f"file://{root}", str(clone))
    lines = t.budget_section(clone / "results" / "tiny", clone / "results", "tiny", ["exp"])
    assert "shallow clone" in lines[2] and len(lines) == 4


REPO = Path(__file__).resolve().parents[1]


def test_fashion_table1_epochs_were_raised_after_its_first_result():
    """The fashion preset's Table 1 ran first at 8 epochs (2026-11-24 09:17 UTC); 6817790 raised them to
    12 at 10:20 (conf/experiment_preset/table1_fashion.yaml)."""
    tree = REPO / "results" / "fashion"
    if not (REPO / ".git").exists() or not (tree / "table1").is_dir():
        pytest.skip("needs this checkout's git history and results/fashion")
    found = b.budgets(tree, REPO / "results", "fashion", ["table1"])
    if isinstance(found, str):
        pytest.skip(found)
    (table1,) = found
    raised = [c for c in table1.changes if (c.key, c.old, c.new) == ("train.epochs", 8, 12)]
    assert [(c.commit, t.when(c.date)) for c in raised] == [("6817790", "2026-11-24 10:20 UTC")]
    assert table1.first_result < raised[0].date
    lines = t.budget_section(tree, REPO / "results", "fashion", ["table1", "convergence"])
    assert any(line.startswith("| table1 |") and "6817790 (2026-11-24 10:20 UTC): `train.epochs` 8 -> 12" in line
               for line in lines)  # fmt: skip
    assert lines[-2].startswith("**Changed after results were seen** (fashion preset): ")
    assert "table1 (train.epochs)" in lines[-2]
