"""Scale-out: `--jobs N` worker processes, submitit's local executor and a SLURM
job array give the files of a sequential run, and a killed worker's run resumes exactly."""

import json
import os
import signal
import sys

import cloudpickle
import pandas as pd
import pytest

from normprop_cli import config
from normprop_cli.engine import expand_grid, run_sweep
from normprop_cli.engine.runs import METRIC_COLUMNS

GRID = "grid=[{id: a, set: {model.norm: normprop}}, {id: b, set: {model.norm: batchnorm}}]"
SMOKE = ["table1", "--preset", "smoke", "--quiet", "train.epochs=2", GRID]
TIMING = ["train_seconds", "images_per_second", "epoch_seconds"]  # metrics.csv; summary.csv: the median


def sweep(results):
    return results / "table1" / "synthetic"


def numbers(results):
    """summary.csv and every run's metrics.csv, without the timing columns."""
    summary = pd.read_csv(sweep(results) / "summary.csv").drop(columns="median_epoch_seconds")
    summary = summary.set_index("run")
    runs = sweep(results) / "runs"
    metrics = {run: pd.read_csv(runs / run / "metrics.csv").drop(columns=TIMING) for run in summary.index}
    return summary, metrics


def assert_same_numbers(reference, results):
    """Every run of `results` has exactly the numbers of the same run in `reference`."""
    (summary_a, metrics_a), (summary_b, metrics_b) = numbers(reference), numbers(results)
    pd.testing.assert_frame_equal(summary_a.loc[summary_b.index], summary_b, check_exact=True)
    for run in metrics_b:
        pd.testing.assert_frame_equal(metrics_a[run], metrics_b[run], check_exact=True)


@pytest.fixture(scope="module")
def sequential(tmp_path_factory):
    """The grid trained one run after another in this process (torch threads 1, see conftest)."""
    from typer.testing import CliRunner

    from normprop_cli.cli import app

    results = tmp_path_factory.mktemp("sequential") / "results"
    result = CliRunner().invoke(app, ["run", *SMOKE, "--results-dir", str(results)])
    assert result.exit_code == 0, result.output
    return results


def test_two_workers_write_the_numbers_of_a_sequential_run(cli, sequential):
    result = cli("run", *SMOKE, "--jobs", 2, "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    assert result.output.count("complete after 2 epochs") == 2  # one line per finished run
    assert_same_numbers(sequential, cli.results)


class KillAfterEpoch:
    """An Observer that kills its own process, as the OOM killer or a cluster would: after epoch
    `epoch` has trained, before its checkpoint is written."""

    name = "kill"

    def __init__(self, epoch):
        self.epoch = epoch

    def observe(self, model, batches, epoch):
        if epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGKILL)
        return []


@pytest.fixture
def by_value():
    """Observers defined here reach worker processes by value, not as an import of this file."""
    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    yield
    cloudpickle.unregister_pickle_by_value(module)


def test_a_killed_workers_run_resumes_through_the_local_executor(cli, sequential, by_value, capsys):
    only_a = ["train.epochs=2", "grid=[{id: a, set: {model.norm: normprop}}]"]
    cfg = config.load("table1", preset="smoke", overrides=only_a, results_dir=cli.results, jobs=2, quiet=True)
    with pytest.raises(SystemExit) as stopped:  # the worker dies in epoch 2, before its checkpoint
        run_sweep(cfg, expand_grid(cfg), observers=lambda spec: [KillAfterEpoch(2)])
    assert stopped.value.code == 1 and "died (exit code -9)" in capsys.readouterr().err
    manifest = sweep(cli.results) / "runs" / "a-s0" / "manifest.json"
    killed = json.loads(manifest.read_text())
    assert killed["status"] == "running" and killed["epochs_done"] == 1

    result = cli("run", "table1", "--preset", "smoke", *only_a, "--launcher", "local", "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    resumed = json.loads(manifest.read_text())
    assert resumed["status"] == "complete" and resumed["resumed_from_epoch"] == 1
    assert list((cli.results / ".submitit").glob("*_result.pkl"))  # it ran as a submitit job
    assert_same_numbers(sequential, cli.results)


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """sbatch, srun and sacct stand-ins: sbatch keeps each script it is given and answers with a
    new job id; sacct answers with the contents of `sacct.txt`."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "sbatch"
    bin_dir.mkdir()
    calls.mkdir()
    scripts = {
        "sbatch": f'n=$(ls "{calls}" | wc -l)\ncp "$1" "{calls}/$n.sh"\necho "Submitted batch job $((4242 + n))"',
        "srun": "exit 0",
        "sacct": f'echo "JobID|State|NodeList"\ncat "{tmp_path}/sacct.txt" 2>/dev/null || true',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return lambda: [p.read_text() for p in sorted(calls.iterdir(), key=lambda p: int(p.stem))]


def test_slurm_submits_a_job_array_of_the_runs_not_complete_and_not_running(cli, tmp_path, fake_slurm):
    args = [
        "run",
        *SMOKE,
        "--launcher",
        "slurm",
        "launcher.partition=gpu",
        "launcher.timeout_min=30",
        "--results-dir",
        cli.results,
    ]
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert "SLURM job 4242" in result.output and "normprop status table1" in result.output
    [script] = fake_slurm()
    for flag in ("--partition=gpu", "--time=30", "--array=0-1%2", "--gpus-per-node=1", "--cpus-per-task=4"):
        assert f"#SBATCH {flag}" in script
    assert not (sweep(cli.results) / "summary.csv").exists()  # written once every run is complete
    record = json.loads((cli.results / ".submitit" / "table1-synthetic.json").read_text())
    assert record == {"a-s0": "4242_0", "b-s0": "4242_1"}

    # a completes; b is still running: nothing is submitted again.
    run_a = sweep(cli.results) / "runs" / "a-s0"
    run_a.mkdir(parents=True)
    (run_a / "manifest.json").write_text(json.dumps({"status": "complete", "epochs_done": 2, "epochs": 2}))
    pd.DataFrame([[1.0] * len(METRIC_COLUMNS)] * 2, columns=METRIC_COLUMNS).to_csv(run_a / "metrics.csv", index=False)
    (tmp_path / "sacct.txt").write_text("4242_1|RUNNING|node7\n")
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert "1 run(s) still queued or running in SLURM job(s) 4242" in result.output
    assert len(fake_slurm()) == 1

    # b's job was killed: b alone is submitted again, as a single job.
    (tmp_path / "sacct.txt").write_text("4242_1|FAILED|node7\n")
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert "submitted 1 run(s) as SLURM job 4243" in result.output
    assert "--array" not in fake_slurm()[1]
    record = json.loads((cli.results / ".submitit" / "table1-synthetic.json").read_text())
    assert record == {"a-s0": "4242_0", "b-s0": "4243"}


def test_slurm_without_slurm_is_a_one_line_error(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun
    result = cli("run", *SMOKE, "--launcher", "slurm", "--results-dir", cli.results)
    assert result.exit_code == 2
    assert result.output.strip().startswith("error:") and "--launcher local" in result.output


@pytest.mark.parametrize("args,needle", [(["--jobs", 0], "--jobs"), (["--launcher", "cloud"], "unknown launcher")])
def test_bad_jobs_or_launcher_is_a_one_line_error(cli, args, needle):
    result = cli("run", *SMOKE, *args, "--results-dir", cli.results)
    assert result.exit_code == 2 and needle in result.output
    assert not cli.results.exists()


def test_each_worker_has_a_gpu_of_its_own_when_several_are_visible(monkeypatch):
    import torch

    from normprop_cli.device import for_workers as worker_devices
    from normprop_cli.engine.executor import worker_threads

    assert worker_devices("cpu", 2) == ["cpu", "cpu"]
    assert worker_threads(2) == 1  # conftest: 1 thread, never less than 1 per worker
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert worker_devices("auto", 3) == ["cuda:0", "cuda:1", "cuda:0"]
    assert worker_devices("cuda:1", 2) == ["cuda:1", "cuda:1"]  # a GPU named on the command line
