"""The plan of a round (engine.plan.make): which runs ride along which is decided from the runs every
experiment asked for, before anything trains, never by when they come in. Nothing trains here."""

import json
import shutil

import pandas as pd
import pytest

from normprop_cli.cli import compose
from normprop_cli.engine import Stage, expand_grid
from normprop_cli.engine.plan import costliest_first, make
from normprop_cli.engine.runs import METRIC_COLUMNS, run_dir
from normprop_cli.experiments.lr_sweep import sweep_grid

GRID = "grid=[{id: a, set: {model.norm: normprop}}, {id: b, set: {model.norm: batchnorm}}]"


def cfg(results, name, epochs, *more):
    overrides = ["seeds=2", f"train.epochs={epochs}", "train.data_norm=global", GRID, *more]
    return compose(name, "smoke", None, overrides, results_dir=results, quiet=True)


def one_thread(cfg):
    return 1


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    """Covariate-shift's runs (2 epochs) and table1's (3 epochs): four trajectories, two runs each; their results
    directory stays empty (every run fresh) but where a test says otherwise, for its own duration."""
    results = tmp_path_factory.mktemp("results")
    return [Stage(c, expand_grid(c)) for c in (cfg(results, "covariate-shift", 2), cfg(results, "table1", 3))]


def pairs(plan):
    """Each task as (experiment, run) of its members, the trained one first."""
    return [[(str(s.cfg.experiment.name), s.name) for s in t.specs] for t in plan.tasks]


def test_the_plan_pairs_each_run_with_its_twin_the_longest_training(stages):
    plan = make(stages, one_thread)
    assert pairs(plan) == [[("table1", run), ("covariate-shift", run)] for run in ("a-s0", "a-s1", "b-s0", "b-s1")]
    assert plan.riders == 4 and plan.finished == [[], []]
    assert [m.stage for m in plan.tasks[0].members] == [1, 0] and plan.tasks[0].threads == 1
    line = "plan of round 1: 8 run(s) to train as 4 trajectories (4 ride along); 0 finished: reused"
    assert plan.line("round 1") == line


def test_the_order_the_experiments_come_in_changes_no_pair(stages):
    forward, backward = make(stages, one_thread), make(stages[::-1], one_thread)
    assert sorted(map(sorted, pairs(forward))) == sorted(map(sorted, pairs(backward)))
    assert all(task[0][0] == "table1" for task in pairs(backward))  # the most epochs trains, whatever the order


def test_runs_on_other_threads_or_another_config_do_not_ride_together(tmp_path, stages):
    threads = make(stages, lambda c: 1 if c.experiment.name == "table1" else 2)
    assert len(threads.tasks) == 8 and threads.riders == 0  # another thread count rounds otherwise
    other = [stages[0], Stage(c := cfg(tmp_path, "table1", 3, "train.momentum=0.5"), expand_grid(c))]
    assert make(other, one_thread).riders == 0


def test_a_finished_run_is_reused_and_its_twin_trains_alone(stages):
    done = stages[1].specs[0]  # table1's a-s0
    path = run_dir(done.cfg, done.name)
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({"status": "complete", "epochs_done": 3, "epochs": 3}))
    pd.DataFrame([[1.0] * len(METRIC_COLUMNS)] * 3, columns=METRIC_COLUMNS).to_csv(path / "metrics.csv", index=False)
    try:
        plan = make(stages, one_thread)
    finally:
        shutil.rmtree(path)
    assert plan.finished == [[], [done]] and plan.riders == 3
    assert [("covariate-shift", "a-s0")] in pairs(plan)


def test_sweep_runs_train_alone_and_first(tmp_path):
    """A learning-rate sweep's runs never ride (runs.trajectory), and workers take them first."""
    batch = compose("batch-size", "smoke", None, ["seeds=1"], results_dir=tmp_path, quiet=True)
    grid, _ = sweep_grid(batch)
    table1 = cfg(tmp_path, "table1", 3)
    plan = make([Stage(table1, expand_grid(table1)), Stage(grid, expand_grid(grid))], one_thread)
    swept = [t for t in plan.tasks if t.leader.spec.name.startswith("sweep-")]
    assert swept and all(len(t.members) == 1 for t in swept)
    assert {id(t) for t in costliest_first(plan.tasks)[: len(swept)]} == {id(t) for t in swept}
