"""The plateau table: from each run's metrics.csv, the best validation epoch and the validation gain
over the last quarter of the epochs, per setting; the learning-rate sweep's runs left out."""

import json

import pandas as pd
import pytest

from normprop_cli.experiments.plateau import PLATEAU_COLUMNS, plateau_lines, run_plateau, sweep_plateau


def write_run(sweep, name, setting, val_acc, status="complete"):
    run = sweep / "runs" / name
    run.mkdir(parents=True)
    epochs = range(1, len(val_acc) + 1)
    pd.DataFrame({"epoch": list(epochs), "val_acc": val_acc}).to_csv(run / "metrics.csv", index=False)
    (run / "manifest.json").write_text(json.dumps({"experiment": "table1", "setting": setting, "status": status}))


def test_run_plateau_finds_the_best_epoch_and_the_last_quarters_gain():
    climbing = run_plateau(pd.DataFrame({"epoch": range(1, 9), "val_acc": [50, 60, 70, 75, 80, 84, 86, 88]}))
    assert climbing == {"epochs": 8, "best_val_epoch": 8, "at_last_epoch": True, "last_quarter_gain": 88 - 84}
    flat = run_plateau(pd.DataFrame({"epoch": range(1, 9), "val_acc": [50, 80, 85, 86, 87, 88, 87.5, 87.9]}))
    assert flat["best_val_epoch"] == 6 and not flat["at_last_epoch"]
    assert flat["last_quarter_gain"] == pytest.approx(87.9 - 88)


def test_sweep_plateau_summarises_each_setting_and_skips_sweep_runs(tmp_path):
    write_run(tmp_path, "a-s0", "a", [50, 60, 70, 80])
    write_run(tmp_path, "a-s1", "a", [50, 70, 72, 71])
    write_run(tmp_path, "sweep-a-lr0.1-s0", "a", [10, 10, 10, 10])
    write_run(tmp_path, "b-s0", "b", [50, 60, 70, 10], status="diverged")
    table = sweep_plateau(tmp_path)
    assert list(table.columns) == PLATEAU_COLUMNS
    assert table["setting"].tolist() == ["a"]
    row = table.iloc[0]
    assert row["runs"] == 2 and row["at_last_epoch"] == 1 and row["best_val_epoch"] == 3.5
    assert row["last_quarter_gain"] == pytest.approx(((80 - 70) + (71 - 72)) / 2)
    assert len(plateau_lines(table)) == 3
