"""The budgets a results tree's runs trained with, read from the runs' own config.yaml and manifest.json:
the values and how many runs had each, the first result, and the runs from uncommitted code."""

import json
from datetime import UTC, datetime

from normprop_cli.verdicts.budget_text import budget_row
from normprop_cli.verdicts.budgets import budget


def write_run(tree, name, epochs, started, commit="abc1234", diff=None, seed=0):
    run = tree / "table1" / "digits" / "runs" / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"seed: {seed}\ntrain:\n  epochs: {epochs}\nmodel:\n  width: 0.25\n")
    manifest = {"started": started, "seed": seed, "commit": commit} | ({"diff_sha256": diff} if diff else {})
    (run / "manifest.json").write_text(json.dumps(manifest))


def test_the_budget_is_what_the_runs_configs_say_and_the_dirty_runs_are_counted(tmp_path):
    write_run(tmp_path, "normprop-s0", 6, "2026-01-02T10:00:00+0000")
    write_run(tmp_path, "normprop-s1", 8, "2026-01-03T10:00:00+0000", "abc1234+dirty", seed=1)
    write_run(tmp_path, "sweep-lr0.1-s100", 3, "2026-01-01T10:00:00+0000", "abc1234+dirty", "f" * 64, seed=100)
    b = budget(tmp_path, "table1")
    assert (b.runs, b.every, b.seeds) == (2, 3, {0, 1})  # the sweep's run: not a budget, but a result
    assert b.values["train.epochs"] == {"6": 1, "8": 1} and b.values["model.width"] == {"0.25": 2}
    assert b.first_result == datetime(2026, 1, 1, 10, tzinfo=UTC)
    assert (b.dirty, b.hashed, b.dirty_commits) == (2, 1, {"abc1234+dirty"})
    row = budget_row(b, {"budgets": {"table1": {"changed_after": "c (date): `seeds` 2 -> 4"}}})
    assert row[1] == "2 runs, seeds 0-1; `train.epochs` 6 (1 run), 8 (1 run); `model.width` 0.25"
    assert row[3] == "2 of 3, sweep runs included (abc1234+dirty; 1 with a hash of the diff)"
    assert row[4] == "c (date): `seeds` 2 -> 4"


def test_an_experiment_without_runs_reads_its_stored_config(tmp_path):
    (tmp_path / "theory").mkdir()
    (tmp_path / "theory" / "config.yaml").write_text("theory:\n  depth: 20\n  width: 1024\n")
    b = budget(tmp_path, "theory")
    assert b.runs == 0 and b.first_result is None
    assert b.values == {"theory.depth": {"20": 1}, "theory.width": {"1024": 1}}
