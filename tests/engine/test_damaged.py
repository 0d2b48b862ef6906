"""Damaged run files: a truncated checkpoint or manifest never costs a run more than one epoch, and
never its results silently."""

import json
import math

import pandas as pd
import torch

SMOKE = ["--preset", "smoke", "--quiet"]
TIMING = ["train_seconds", "images_per_second", "epoch_seconds"]
ARGS = ["run", "table1", *SMOKE, "train.epochs=3", "grid=[{id: r, set: {model.norm: normprop}}]"]


def run_path(results):
    return results / "table1" / "synthetic" / "runs" / "r-s0"


def finished(trained, results):
    """`ARGS` run to the end in `results`: one finished run, trained once and copied (conftest.trained)."""
    return trained(results, *ARGS[1:])


def truncate(file):
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def test_a_damaged_checkpoint_falls_back_one_epoch_and_retrains_it_exactly(cli, tmp_path, interrupt_at, trained):
    finished(trained, tmp_path / "a")
    a = run_path(tmp_path / "a")
    assert not (a / "train.lock").exists()

    # Ctrl-C in the third epoch, then the newest checkpoint (epoch 2) is cut short.
    assert interrupt_at(10, lambda: cli(*ARGS, "--results-dir", tmp_path / "b")).exit_code == 130
    b = run_path(tmp_path / "b")
    assert json.loads((b / "manifest.json").read_text())["epochs_done"] == 2
    assert torch.load(b / "checkpoint.prev.pt", weights_only=True)["epoch"] == 1  # the one before the newest
    truncate(b / "checkpoint.pt")
    result = cli(*ARGS, "--results-dir", tmp_path / "b")
    assert result.exit_code == 0, result.output
    [line] = [line for line in result.output.splitlines() if "is damaged" in line]
    assert "r-s0" in line and "resuming from epoch 1" in line

    manifest = json.loads((b / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["resumed_from_epoch"] == 1
    metrics_a, metrics_b = (pd.read_csv(p / "metrics.csv").drop(columns=TIMING) for p in (a, b))
    pd.testing.assert_frame_equal(metrics_a, metrics_b, check_exact=True)
    wa, wb = (torch.load(p / "checkpoint.pt", weights_only=True)["model"] for p in (a, b))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_finished_run_keeps_its_checkpoint_but_not_the_one_before(cli, tmp_path, monkeypatch, trained):
    """checkpoint.prev.pt is kept while a run is unfinished (a damaged newest checkpoint falls back to it);
    a complete or a diverged run deletes it, and so does a finished run's next sweep where one is left."""
    from normprop_cli.engine import trainer

    finished(trained, tmp_path / "c")
    epoch = trainer.train_epoch  # the third epoch's loss is NaN: the run diverges there
    monkeypatch.setattr(
        trainer, "train_epoch", lambda run, *a: epoch(run, *a) | ({"train_loss": math.nan} if run.epoch == 2 else {})
    )
    assert cli(*ARGS, "--results-dir", tmp_path / "d").exit_code == 0
    for results, status in (("c", "complete"), ("d", "diverged")):
        path = run_path(tmp_path / results)
        assert json.loads((path / "manifest.json").read_text())["status"] == status
        assert (path / "checkpoint.pt").exists() and not (path / "checkpoint.prev.pt").exists()
    path = run_path(tmp_path / "c")
    (path / "checkpoint.prev.pt").write_bytes((path / "checkpoint.pt").read_bytes())  # as finished runs left it before
    (path / "metrics.csv").unlink()  # a finished run that its sweep opens again (to rebuild its table)
    assert cli(*ARGS, "--results-dir", tmp_path / "c").exit_code == 0
    assert not (path / "checkpoint.prev.pt").exists() and (path / "metrics.csv").exists()


def test_a_run_whose_every_checkpoint_is_damaged_is_a_one_line_error(cli, interrupt_at):
    assert interrupt_at(10, lambda: cli(*ARGS, "--results-dir", cli.results)).exit_code == 130
    path = run_path(cli.results)
    metrics = (path / "metrics.csv").read_text()
    for file in path.glob("checkpoint*.pt"):
        truncate(file)
    result = cli(*ARGS, "--results-dir", cli.results)
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()
    assert line.startswith("error:") and "r-s0" in line and f"delete {path}" in line
    assert (path / "metrics.csv").read_text() == metrics and not (path / "train.lock").exists()


def test_a_finished_run_with_a_damaged_manifest_is_rebuilt_from_its_checkpoint_not_retrained(cli, trained):
    finished(trained, cli.results)
    path = run_path(cli.results)
    before = {file: file.stat().st_mtime_ns for file in path.glob("checkpoint*.pt")}
    metrics = (path / "metrics.csv").read_text()
    (path / "manifest.json").write_text('{"run": "r-s0", "stat')

    status = cli("status", "table1", *ARGS[5:], "--preset", "smoke", "--results-dir", cli.results)
    [row] = [line for line in status.output.splitlines() if "r-s0" in line]
    assert "damaged" in row

    result = cli(*ARGS, "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    [line] = [line for line in result.output.splitlines() if "is damaged" in line]
    assert "r-s0" in line and "manifest.json" in line and "epoch 3 of 3" in line
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["epochs_done"] == 3
    assert {file: file.stat().st_mtime_ns for file in before} == before
    assert (path / "metrics.csv").read_text() == metrics


def test_a_damaged_manifest_without_a_checkpoint_is_a_one_line_error(cli, trained):
    finished(trained, cli.results)
    path = run_path(cli.results)
    for file in path.glob("checkpoint*.pt"):
        file.unlink()
    metrics = (path / "metrics.csv").read_text()
    (path / "manifest.json").write_bytes(b"\x00" * 10)
    result = cli(*ARGS, "--results-dir", cli.results)
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()
    assert "r-s0" in line and "manifest.json" in line and f"delete {path}" in line
    assert (path / "metrics.csv").read_text() == metrics


def test_a_finished_run_with_damaged_metrics_is_rebuilt_from_its_checkpoint_not_retrained(cli, tmp_path, trained):
    finished(trained, tmp_path)
    path = run_path(tmp_path)
    metrics = (path / "metrics.csv").read_text()
    manifest = (path / "manifest.json").read_text()
    summary = tmp_path / "table1" / "synthetic" / "summary.csv"
    before = pd.read_csv(summary)
    truncate(path / "metrics.csv")  # a truncated table still parses: fewer rows than the manifest's epochs
    result = cli(*ARGS, "--results-dir", tmp_path)
    assert result.exit_code == 0, result.output
    [line] = [line for line in result.output.splitlines() if "metrics.csv" in line]
    assert "r-s0" in line and "rebuilt from checkpoint.pt (epoch 3)" in line
    assert (path / "metrics.csv").read_text() == metrics
    assert (path / "manifest.json").read_text() == manifest  # not retrained: the same manifest
    pd.testing.assert_frame_equal(pd.read_csv(summary), before)


def test_damaged_metrics_without_a_checkpoint_is_a_one_line_error(cli, tmp_path, trained):
    finished(trained, tmp_path)
    path = run_path(tmp_path)
    (path / "metrics.csv").write_bytes(b"\xff\xfe\x00garbage")
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        (path / name).unlink(missing_ok=True)  # a finished run keeps no checkpoint.prev.pt
    result = cli(*ARGS, "--results-dir", tmp_path)
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()
    assert line.startswith("error: run r-s0: metrics.csv is") and "delete" in line and str(path) in line


def test_a_nan_loss_in_metrics_is_not_damage(tmp_path):
    """A run about to diverge can evaluate to a NaN loss, written as an empty cell (results/cpu has
    one): the run is finished as it is; only a table that is not one row per epoch of the manifest is
    damaged."""
    from normprop_cli.engine.runs import METRIC_COLUMNS, tables_problem

    rows = pd.DataFrame([[1.0] * len(METRIC_COLUMNS)] * 3, columns=METRIC_COLUMNS)
    rows.loc[2, ["val_loss", "test_loss"]] = float("nan")
    rows.to_csv(tmp_path / "metrics.csv", index=False)
    assert tables_problem(tmp_path, {"status": "diverged", "epochs_done": 3}) is None
    assert "not the 4 complete row(s)" in tables_problem(tmp_path, {"status": "complete", "epochs_done": 4})
