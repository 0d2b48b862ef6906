"""Runs of two experiments that train one trajectory (the same config and seed, their own epochs and
observers) train once: the others ride along (trainer.train_run's riders, engine.plan). A rider's files are
those its own training writes, its observers' tables and its checkpoint included, timing aside; its
manifest names the run it rode along; a diverged trajectory diverges for its riders too; an observer
that changes the model it observes is refused; a rider that is no longer fresh trains on its own."""

import math

import pandas as pd
import pytest
import torch

from normprop_cli.cli import compose
from normprop_cli.engine import expand_grid
from normprop_cli.engine.executor import LastEpoch
from normprop_cli.engine.job import load_data
from normprop_cli.engine.riders import Rider
from normprop_cli.engine.runs import read_manifest, run_dir, trajectory
from normprop_cli.engine.trainer import train_run
from normprop_cli.experiments.probes import PopulationProbe, UnitProbe

GRID = "grid=[{id: normprop, set: {model.norm: normprop}}, {id: batchnorm, set: {model.norm: batchnorm}}]"
TIMING = ["train_seconds", "images_per_second", "epoch_seconds"]
CPU = torch.device("cpu")


def spec(results, experiment, epochs, run="batchnorm-s0", *more):
    cfg = compose(experiment, "smoke", None, ["seeds=1", f"train.epochs={epochs}", "train.data_norm=global", GRID,
                                              *more], results_dir=results, quiet=True)  # fmt: skip
    return next(s for s in expand_grid(cfg) if s.name == run)


def probes(s):
    return [UnitProbe(s.seed, 2), PopulationProbe()]


def same(a, b) -> bool:
    """Equal, tensors bit for bit and NaN equal to NaN, timing columns aside."""
    if isinstance(a, dict):
        keys = [k for k in a if k not in TIMING]
        return keys == [k for k in b if k not in TIMING] and all(same(a[k], b[k]) for k in keys)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if torch.is_tensor(a):
        return torch.equal(a, b)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


def files(s):
    path = run_dir(s.cfg, s.name)
    tables = {f.name: pd.read_csv(f).drop(columns=TIMING, errors="ignore") for f in sorted(path.glob("*.csv"))}
    checkpoint = path / "checkpoint.pt"
    return tables, torch.load(checkpoint, weights_only=True) if checkpoint.exists() else None


def assert_same_files(a, b):
    (tables_a, state_a), (tables_b, state_b) = files(a), files(b)
    assert tables_a.keys() == tables_b.keys() and tables_a
    for name in tables_a:
        pd.testing.assert_frame_equal(tables_a[name], tables_b[name], check_exact=True)
    assert same(state_a, state_b)


def test_a_rider_writes_what_its_own_training_writes(tmp_path):
    """Covariate-shift's run (2 epochs, Fig. 2's probes) rides along table1's of its trajectory (3 epochs)."""
    leader, rider = spec(tmp_path / "a", "table1", 3), spec(tmp_path / "a", "covariate-shift", 2)
    assert trajectory(leader, 1) == trajectory(rider, 1) is not None
    assert trajectory(leader, 1) != trajectory(spec(tmp_path / "a", "table1", 3, "normprop-s0"), 1)
    assert trajectory(leader, 1) != trajectory(leader, 2)  # another number of threads rounds otherwise
    data = load_data(leader.cfg, CPU)
    last = LastEpoch()
    riding = Rider(rider, probes(rider), last)
    manifests = [train_run(leader, data, CPU, LastEpoch(), [], [riding]), riding.manifest]
    assert [m["run"] for m in manifests] == ["batchnorm-s0", "batchnorm-s0"]
    assert [m["experiment"] for m in manifests] == ["table1", "covariate-shift"]
    assert manifests[1] == read_manifest(run_dir(rider.cfg, rider.name))
    assert manifests[1]["status"] == "complete" and manifests[1]["epochs_done"] == 2
    assert manifests[1]["trained_with"] == "table1/batchnorm-s0" and "trained_with" not in manifests[0]
    assert last.row["epoch"] == 2

    alone = [spec(tmp_path / "b", "table1", 3), spec(tmp_path / "b", "covariate-shift", 2)]
    train_run(alone[0], data, CPU, LastEpoch())
    train_run(alone[1], data, CPU, LastEpoch(), probes(alone[1]))
    assert_same_files(leader, alone[0])
    assert_same_files(rider, alone[1])
    assert trajectory(rider, 1) is None  # finished: it trains alone from now on (it is reused)


def test_a_diverged_trajectory_diverges_for_its_riders(tmp_path):
    lr = "train.lr=1e8"
    leader, rider = spec(tmp_path / "a", "table1", 3, "batchnorm-s0", lr), spec(tmp_path / "a", "covariate-shift", 2,
                                                                                "batchnorm-s0", lr)  # fmt: skip
    data = load_data(leader.cfg, CPU)
    riding = Rider(rider, probes(rider), LastEpoch())
    first, second = train_run(leader, data, CPU, LastEpoch(), [], [riding]), riding.manifest
    alone = spec(tmp_path / "b", "covariate-shift", 2, "batchnorm-s0", lr)
    own = train_run(alone, data, CPU, LastEpoch(), probes(alone))
    assert first["status"] == second["status"] == own["status"] == "diverged"
    assert second["diverged_at_epoch"] == own["diverged_at_epoch"] and second["epochs_done"] == own["epochs_done"]
    assert_same_files(rider, alone)


class Mutating:
    name = "mutating"

    def observe(self, model, batches, epoch):
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        return []


def test_an_observer_that_changes_the_model_cannot_ride_along(tmp_path):
    leader, rider = spec(tmp_path, "table1", 2), spec(tmp_path, "covariate-shift", 1)
    data = load_data(leader.cfg, CPU)
    with pytest.raises(RuntimeError, match="changed the model it observed"):
        train_run(leader, data, CPU, LastEpoch(), [], [Rider(rider, [Mutating()], LastEpoch())])


def test_a_rider_that_is_no_longer_fresh_trains_on_its_own(tmp_path):
    leader, rider = spec(tmp_path, "table1", 2), spec(tmp_path, "covariate-shift", 1)
    data = load_data(leader.cfg, CPU)
    own = train_run(rider, data, CPU, LastEpoch(), probes(rider))
    riding = Rider(rider, probes(rider), LastEpoch())
    first, second = train_run(leader, data, CPU, LastEpoch(), [], [riding]), riding.manifest
    assert second == own and "trained_with" not in second  # finished: returned as it is
    assert first["status"] == "complete" and first["epochs_done"] == 2
    with pytest.raises(ValueError, match="more epochs"):
        train_run(rider, data, CPU, LastEpoch(), [], [Rider(leader, [], LastEpoch())])
