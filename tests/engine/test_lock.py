"""One run, one trainer: two `normprop run` on one results directory train every run once."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pandas as pd

GRID = "grid=[{id: a, set: {model.norm: normprop}}, {id: b, set: {model.norm: batchnorm}}]"
ARGS = ["run", "table1", "--preset", "smoke", "--quiet", "train.epochs=4", GRID]


def test_two_processes_on_one_results_directory_train_every_run_once(tmp_path):
    command = [sys.executable, "-m", "normprop_cli", *ARGS, "--results-dir", str(tmp_path)]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=600)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    trained = [line for out in outputs for line in out.splitlines() if "complete after 4 epochs" in line]
    assert sorted(line.split()[1] for line in trained) == ["a-s0:", "b-s0:"], outputs
    runs = tmp_path / "table1" / "synthetic" / "runs"
    for name in ("a-s0", "b-s0"):
        assert json.loads((runs / name / "manifest.json").read_text())["status"] == "complete"
        assert len(pd.read_csv(runs / name / "metrics.csv")) == 4
        assert not (runs / name / "train.lock").exists()


def test_the_lock_of_a_killed_process_is_taken_over(cli):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = cli.results / "table1" / "synthetic" / "runs" / "a-s0"
    run.mkdir(parents=True)
    (run / "train.lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": "x"}))
    result = cli(*ARGS, "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    [line] = [line for line in result.output.splitlines() if "its lock" in line]
    assert "a-s0" in line and f"pid {dead.pid}" in line and "taking it over" in line
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"
    assert not (run / "train.lock").exists()


def test_a_lock_of_another_host_is_waited_for_until_released_or_stale(tmp_path, monkeypatch, capsys):
    from normprop_cli.engine import lock

    monkeypatch.setattr(lock, "POLL_SECONDS", 0.05)
    path = tmp_path / lock.LOCK
    other = {"pid": 1, "host": "node7", "started": "2024-05-01T10:00:00+0000"}
    path.write_text(json.dumps(other))
    threading.Timer(0.5, path.unlink).start()
    t0 = time.monotonic()
    with lock.hold(tmp_path, "r-s0"):
        assert time.monotonic() - t0 >= 0.5
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert not path.exists()
    assert capsys.readouterr().err.strip() == "run r-s0 is being trained by pid 1 on node7; waiting"

    path.write_text(json.dumps(other))
    old = time.time() - lock.STALE_SECONDS - 60
    os.utime(path, (old, old))
    with lock.hold(tmp_path, "r-s0"):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert "its lock was left by pid 1 on node7, which is gone; taking it over" in capsys.readouterr().err
