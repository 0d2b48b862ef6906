"""reproduce-all's experiments at the same time in one pool of workers (experiments.together,
engine.pool): the same numbers as one experiment after another, an experiment that times its runs
alone and first, and the first failure stops every experiment with its own message."""

import multiprocessing
import signal
import threading

import pandas as pd
import pytest

from normprop_cli.cli import compose
from normprop_cli.engine import pool
from normprop_cli.errors import UserError
from normprop_cli.experiments import EXPERIMENTS, base, together

GRID = "grid=[{id: a, set: {model.norm: normprop}}, {id: b, set: {model.norm: batchnorm}}]"
TIMING = ["train_seconds", "images_per_second", "epoch_seconds"]


def configs(results, jobs, *names):
    overrides = [f"jobs={jobs}", "seeds=2", "train.epochs=2", GRID]
    return [compose(name, "smoke", None, overrides, results_dir=results, quiet=True) for name in names]


def metrics(results, experiment):
    runs = sorted((results / experiment / "synthetic" / "runs").iterdir())
    assert runs
    return {run.name: pd.read_csv(run / "metrics.csv").drop(columns=TIMING) for run in runs}


def record():
    """A `run` for run_all that records when each experiment begins and ends."""
    said = []

    def run(cfg):
        said.append(("begin", cfg.experiment.name))
        EXPERIMENTS[cfg.experiment.name].run(cfg)
        said.append(("end", cfg.experiment.name))

    return said, run


def test_experiments_together_train_the_numbers_of_one_after_another(tmp_path, capfd):
    names = ("table1", "convergence")
    said, run = record()
    together.run_all(configs(tmp_path / "together", 2, *names), run, workers=2)
    assert sorted(said) == sorted([("begin", n) for n in names] + [("end", n) for n in names])
    assert pool.active() is None and not multiprocessing.active_children()  # the pool closed with the block
    lines = capfd.readouterr().err.splitlines()
    assert sum(line.startswith("[table1 ") for line in lines) == 4  # each line names its experiment
    for cfg in configs(tmp_path / "sequential", 1, *names):
        EXPERIMENTS[cfg.experiment.name].run(cfg)
    for name in names:
        shared, alone = metrics(tmp_path / "together", name), metrics(tmp_path / "sequential", name)
        assert shared.keys() == alone.keys()
        for run in alone:
            pd.testing.assert_frame_equal(shared[run], alone[run], check_exact=True)


def test_shared_only_where_grids_train_in_local_workers(tmp_path):
    assert together.shared(configs(tmp_path, 2, "table1", "convergence"))
    assert not together.shared(configs(tmp_path, 1, "table1", "convergence"))
    slurm = compose("table1", "smoke", None, ["jobs=2", "launcher=slurm"], results_dir=tmp_path)
    assert not together.shared([slurm])


@pytest.fixture
def fake(monkeypatch):
    """Register a fake experiment `name` whose run calls `body(cfg)` (table1's config)."""

    def register(name, body, alone=False):
        real = EXPERIMENTS["table1"]
        monkeypatch.setitem(EXPERIMENTS, name, base.Experiment(name, body, real.plot, real.headlines, alone=alone))

    return register


def test_an_experiment_that_times_its_runs_runs_first_and_alone(tmp_path, fake):
    seen = []

    def timed(cfg):
        seen.append((pool.active(), threading.current_thread() is threading.main_thread()))
        return tmp_path

    fake("timed", timed, alone=True)
    cfgs = configs(tmp_path, 2, "table1")
    cfgs.append(cfgs[0].copy())
    cfgs[-1].experiment.name = "timed"
    said, run = record()
    together.run_all(cfgs, run, workers=2)
    assert said[:2] == [("begin", "timed"), ("end", "timed")]  # before the others began
    assert seen == [(None, True)]  # no pool, no other thread


def test_the_first_failure_stops_the_others_with_its_message(tmp_path, fake):
    def broken(cfg):
        raise UserError("broken: what to do")

    fake("broken", broken)
    cfgs = configs(tmp_path, 2, "table1")
    cfgs.append(cfgs[0].copy())
    cfgs[-1].experiment.name = "broken"
    said, run = record()
    with pytest.raises(UserError, match="broken: what to do"):
        together.run_all(cfgs, run, workers=2)
    assert ("end", "table1") not in said  # stopped, not finished
    assert pool.active() is None and not multiprocessing.active_children()


def test_ctrl_c_stops_every_experiment_and_a_rerun_resumes_them(tmp_path, capfd):
    """Ctrl-C while the experiments train together: exit code 130, one line naming the unfinished runs,
    the workers gone; the same command again finishes every run."""
    import _thread

    names = ("table1", "convergence")
    said, run = record()
    done = threading.Event()

    def press_once_a_run_trains():  # as a user would, once a worker has begun a run (it writes its config
        # first), whenever that is: a fixed delay came after the end where the workers started fast
        while not done.wait(0.005):
            if any(tmp_path.glob("*/synthetic/runs/*/config.yaml")):
                _thread.interrupt_main()
                return

    # Ctrl-C as a user's Python takes it (interrupt_main does nothing under another SIGINT handler)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    presser = threading.Thread(target=press_once_a_run_trains, daemon=True)
    presser.start()
    try:
        with pytest.raises(SystemExit) as stopped:
            together.run_all(configs(tmp_path, 2, *names), run, workers=2)
    finally:
        done.set()
        presser.join()
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
    assert stopped.value.code == 130
    assert "interrupted" in capfd.readouterr().err
    assert pool.active() is None and not multiprocessing.active_children()
    together.run_all(configs(tmp_path, 2, *names), run, workers=2)
    for name in names:
        assert len(metrics(tmp_path, name)) == 4  # 2 settings x 2 seeds, each complete


def test_runs_of_one_trajectory_train_once_and_write_their_own_files(tmp_path, capfd):
    """Covariate-shift's runs (2 epochs, with probes) and table1's of the same config and seed (3 epochs):
    a worker trains each trajectory once, the shorter run riding along (trainer.train_together); every file
    is the one training each run alone writes, timing aside, and the rider's line and manifest say so. The
    plan pairs the twins before any run is handed out, so every pair rides whichever grid comes in first."""
    names = ("covariate-shift", "table1")

    def cfgs(results, jobs):
        return [
            compose(
                name,
                "smoke",
                None,
                [f"jobs={jobs}", "seeds=2", f"train.epochs={epochs}", "train.data_norm=global", GRID],
                results_dir=results,
                quiet=True,
            )  # fmt: skip
            for name, epochs in zip(names, (2, 3), strict=True)
        ]

    said, run = record()
    together.run_all(cfgs(tmp_path / "together", 2), run, workers=2)
    along = [line for line in capfd.readouterr().err.splitlines() if "trained along table1/" in line]
    assert len(along) == 4 and all(line.startswith("[covariate-shift ") for line in along)  # its 4 twins
    for cfg in cfgs(tmp_path / "sequential", 1):
        EXPERIMENTS[cfg.experiment.name].run(cfg)
    for name in names:
        runs = sorted((tmp_path / "sequential" / name / "synthetic" / "runs").iterdir())
        assert runs
        for alone in runs:
            shared = tmp_path / "together" / alone.relative_to(tmp_path / "sequential")
            tables = sorted(f.name for f in alone.glob("*.csv"))
            assert tables == sorted(f.name for f in shared.glob("*.csv"))
            for table in tables:
                a, b = (pd.read_csv(d / table).drop(columns=TIMING, errors="ignore") for d in (alone, shared))
                pd.testing.assert_frame_equal(a, b, check_exact=True)
    riders = list((tmp_path / "together").glob("covariate-shift/*/runs/*/manifest.json"))
    assert sum('"trained_with": "table1/' in m.read_text() for m in riders) == len(along)
