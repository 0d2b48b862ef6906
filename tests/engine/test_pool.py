"""The shared pool's plan (engine.pool.Plan): which runs ride along which is decided from the runs every
experiment will hand in, not by when they come in. No worker process starts here: the tests read what the
pool hands its worker."""

import pytest

from normprop_cli.cli import compose
from normprop_cli.engine import expand_grid, pool

GRID = "grid=[{id: a, set: {model.norm: normprop}}, {id: b, set: {model.norm: batchnorm}}]"
THREADS = 1


def grid(results, name, epochs):
    overrides = ["jobs=2", "seeds=2", f"train.epochs={epochs}", "train.data_norm=global", GRID]
    return expand_grid(compose(name, "smoke", None, overrides, results_dir=results, quiet=True))


@pytest.fixture(scope="module")
def grids(tmp_path_factory):
    """Covariate-shift's runs (2 epochs) and table1's (3 epochs): four trajectories, two runs each."""
    results = tmp_path_factory.mktemp("results")  # stays empty: every run is fresh
    return {"covariate-shift": grid(results, "covariate-shift", 2), "table1": grid(results, "table1", 3)}


@pytest.fixture
def opened(monkeypatch, grids):
    """A pool of one worker with the plan of `grids`; its worker process never starts."""
    monkeypatch.setattr(pool.Pool, "_start", lambda self: setattr(self, "started", True))
    made = []

    def make(plan=None):
        plan = plan or pool.Plan.of({name: (specs, THREADS) for name, specs in grids.items()})
        made.append(pool.Pool(1, "cpu", plan, list(grids)))
        return made[-1]

    yield make
    for p in made:
        p.close("finished")


def handed(p):
    """The runs the worker was given: (experiment, run) of each, the trained one first."""
    return [(t.experiment, t.spec.name) for t in p.running.get(0, [])]


def test_the_plan_pairs_each_run_with_its_twin(grids):
    plan = pool.Plan.of({name: (specs, THREADS) for name, specs in grids.items()})
    assert len(plan.groups) == 4 and all(len(runs) == 2 for runs in plan.groups.values())
    assert sorted(plan.owner.values()) == ["covariate-shift"] * 4 + ["table1"] * 4


def test_a_run_waits_for_its_planned_twin_then_trains_it_along(opened, grids):
    p = opened()
    p.submit(grids["table1"], lambda spec: (), THREADS, "table1")
    assert handed(p) == [] and len(p.held) == 4  # table1's runs came first: none trains without its twin
    p.submit(grids["covariate-shift"], lambda spec: (), THREADS, "covariate-shift")
    trained, rider = handed(p)
    assert trained[0] == "table1" and rider == ("covariate-shift", trained[1])  # the most epochs trains
    assert len(p.waiting) == 6 and not p.held


def test_the_order_the_grids_come_in_changes_no_pair(opened, grids):
    p = opened()
    p.submit(grids["covariate-shift"], lambda spec: (), THREADS, "covariate-shift")
    p.submit(grids["table1"], lambda spec: (), THREADS, "table1")
    trained, rider = handed(p)
    assert trained[0] == "table1" and rider == ("covariate-shift", trained[1])


def test_a_run_whose_twin_will_not_come_trains_alone(opened, grids):
    p = opened()
    p.submit(grids["table1"], lambda spec: (), THREADS, "table1")
    p.ended("covariate-shift")  # it stopped before handing in its grid
    assert len(handed(p)) == 1 and handed(p)[0][0] == "table1" and not p.held


def test_runs_outside_the_plan_train_alone(opened, grids):
    p = opened(pool.Plan())
    p.submit(grids["table1"], lambda spec: (), THREADS, "table1")
    p.submit(grids["covariate-shift"], lambda spec: (), THREADS, "covariate-shift")
    assert len(handed(p)) == 1 and len(p.waiting) == 7


def test_hand_ins_the_plan_did_not_foresee_do_not_wait_forever(opened, grids):
    """Each experiment hands in one run whose twin the other hands in only later: once both wait and
    nothing else is left to train, the held runs train as they are."""
    p = opened()
    p.submit(grids["table1"][:1], lambda spec: (), THREADS, "table1")
    assert handed(p) == []  # covariate-shift is still at its own work: its twin may come
    p.submit(grids["covariate-shift"][1:2], lambda spec: (), THREADS, "covariate-shift")
    assert len(handed(p)) == 1 and len(p.waiting) == 1 and not p.held
