"""reproduce-all's experiments (experiments.base.reproduce, train_all; engine.sweep.train): the experiment that
times its runs first and alone; the others' stages round by round on one executor, where runs of one
trajectory in several experiments train once, the plan deciding before anything trains which ride, and write
the files of training alone; the first failure stops every experiment with its message; Ctrl-C keeps every
finished epoch and a rerun resumes."""

import multiprocessing
import signal
import threading

import pandas as pd
import pytest

from normprop_cli.cli import compose
from normprop_cli.errors import UserError
from normprop_cli.experiments import EXPERIMENTS, base, reproduce, train_all

TIMING = ["train_seconds", "images_per_second", "epoch_seconds"]


def configs(results, jobs, *named, seeds=1, grid="grid=[{id: a, set: {model.norm: batchnorm}}]"):
    """(experiment, epochs) of `named`, composed on the smoke preset."""
    overrides = [f"jobs={jobs}", f"seeds={seeds}", "train.data_norm=global", grid]
    return [compose(name, "smoke", None, [*overrides, f"train.epochs={epochs}"], results_dir=results, quiet=True)
            for name, epochs in named]  # fmt: skip


def tables(results, experiment):
    """Every CSV of every run of `experiment`, timing aside."""
    runs = sorted((results / experiment / "synthetic" / "runs").iterdir())
    assert runs
    return {(run.name, f.name): pd.read_csv(f).drop(columns=TIMING, errors="ignore")
            for run in runs for f in sorted(run.glob("*.csv"))}  # fmt: skip


@pytest.mark.parametrize("jobs", [1, 2])
def test_twins_train_once_and_write_the_files_of_training_alone(tmp_path, capfd, jobs):
    """Covariate-shift's run (2 epochs, Fig. 2's probes) and table1's of the same config and seed (3 epochs):
    one trains, the other rides along it, here (jobs 1) or in a worker process (jobs 2), on one thread
    either way; each run's tables are those of training it alone, and the rider's line and manifest say so."""
    named = (("covariate-shift", 2), ("table1", 3))
    train_all(configs(tmp_path / "rounds", jobs, *named), workers=jobs)
    along = [line for line in capfd.readouterr().err.splitlines() if "trained along table1/a-s0" in line]
    assert len(along) == 1 and along[0].startswith("[covariate-shift 1/1] a-s0: complete after 2 epochs")
    assert not multiprocessing.active_children()
    for cfg in configs(tmp_path / "alone", 1, *named):
        train_all([cfg])
    for name, _ in named:
        rounds, alone = tables(tmp_path / "rounds", name), tables(tmp_path / "alone", name)
        assert rounds.keys() == alone.keys()
        for key in alone:
            pd.testing.assert_frame_equal(rounds[key], alone[key], check_exact=True)
    rider = tmp_path / "rounds" / "covariate-shift" / "synthetic" / "runs" / "a-s0" / "manifest.json"
    assert '"trained_with": "table1/a-s0"' in rider.read_text()


@pytest.fixture
def fake(monkeypatch):
    """Register a fake experiment `name` (table1's config) with `stages` and `analyse`; `said` records."""
    said = []

    def register(name, stages=None, alone=False):
        real = EXPERIMENTS["table1"]

        def analyse(cfg):
            said.append(("analyse", name))
            return cfg.results_dir

        def recorded(cfg):
            said.append(("stages", name))
            yield from stages(cfg)

        made = base.Experiment(name, analyse, real.plot, real.headlines, alone=alone,
                               stages=recorded if stages else None)  # fmt: skip
        monkeypatch.setitem(EXPERIMENTS, name, made)

    register.said = said
    return register


def named(cfg, name):
    cfg = cfg.copy()
    cfg.experiment.name = name
    return cfg


def nothing(cfg):
    return
    yield


def test_the_experiment_that_times_its_runs_goes_first_and_alone_then_the_others_train_then_analyse(tmp_path, fake):
    fake("timed", alone=True)
    fake("staged", stages=nothing)
    fake("plain")
    [cfg] = configs(tmp_path, 2, ("table1", 2))
    parts = []
    reproduce([named(cfg, "plain"), named(cfg, "staged"), named(cfg, "timed")], 2,
              lambda c, part: parts.append(part(c)))  # fmt: skip
    assert fake.said == [("analyse", "timed"), ("stages", "staged"), ("analyse", "plain"), ("analyse", "staged")]
    assert len(parts) == 3


def test_the_first_failure_stops_every_experiment_with_its_message(tmp_path, fake):
    def broken(cfg):
        raise UserError("broken: what to do")
        yield

    fake("broken", stages=broken)
    cfgs = configs(tmp_path, 2, ("table1", 2))
    with pytest.raises(UserError, match="broken: what to do"):
        train_all([*cfgs, named(cfgs[0], "broken")], workers=2)
    assert not (tmp_path / "table1").exists()  # nothing trained: the round was not made
    assert not multiprocessing.active_children()


def test_ctrl_c_stops_every_worker_and_a_rerun_resumes(tmp_path, capfd):
    """Ctrl-C while runs train in worker processes: exit code 130, one line naming the unfinished runs, the
    workers gone; the same command again finishes every run."""
    import _thread

    done = threading.Event()

    def press_once_a_run_trains():  # as a user would, once a worker has begun a run (it writes its config first)
        while not done.wait(0.005):
            if any(tmp_path.glob("*/synthetic/runs/*/config.yaml")):
                _thread.interrupt_main()
                return

    cfgs = configs(tmp_path, 2, ("table1", 2), seeds=2)
    # Ctrl-C as a user's Python takes it (interrupt_main does nothing under another SIGINT handler)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    presser = threading.Thread(target=press_once_a_run_trains, daemon=True)
    presser.start()
    try:
        with pytest.raises(SystemExit) as stopped:
            train_all(cfgs, workers=2)
    finally:
        done.set()
        presser.join()
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
    assert stopped.value.code == 130
    assert "interrupted: 2 run(s) unfinished" in capfd.readouterr().err
    assert not multiprocessing.active_children()
    train_all(cfgs, workers=2)
    assert len(tables(tmp_path, "table1")) == 2  # a-s0 and a-s1, each complete
