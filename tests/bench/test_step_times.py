"""The step times that price a plan: read from a bench-like CSV (interpolated in the batch size where a
configuration is missing) or measured here by the bench's clock."""

from pathlib import Path

import pytest
import torch

from normprop_cli import config
from normprop_cli.bench import step_times
from normprop_cli.engine.cost import StepKey
from normprop_cli.errors import UserError
from normprop_cli.experiments import grid

ASSUMED = Path(__file__).resolve().parents[2] / "results" / "bench" / "gpu" / "assumed_step_times.csv"


def key(method="none", batch=50, width=1.0, shape="3x32x32"):
    return StepKey(method, batch, width, shape)


def test_a_bench_csv_reads_float32_medians_with_the_default_shape(tmp_path):
    path = tmp_path / "bench.csv"
    path.write_text("method,batch_size,width,precision,step_ms_median\nnone,50,1.0,float32,3.0\n"
                    "none,50,1.0,bfloat16,1.0\nnone,100,1.0,float32,5.0\n")  # fmt: skip
    assert step_times.read(path) == {key(): 3.0, key(batch=100): 5.0}


def test_missing_batch_sizes_are_interpolated_between_extrapolated_above_and_floored_below():
    known = {key(batch=10): 2.0, key(batch=50): 4.0, key(batch=100): 9.0}
    got = step_times.lookup(known, [key(batch=30), key(batch=200), key(batch=1), key(batch=50)])
    assert got == {key(batch=30): 3.0, key(batch=200): 19.0, key(batch=1): 2.0, key(batch=50): 4.0}


def test_a_configuration_that_cannot_be_interpolated_is_an_error_naming_it():
    with pytest.raises(UserError, match="no step time for 1 configuration.*batchnorm at batch 50, width 1, 3x32x32"):
        step_times.lookup({key(batch=10): 2.0, key(batch=50): 4.0}, [key("batchnorm")])
    with pytest.raises(UserError, match="none at batch 50"):  # one row of the method: nothing to interpolate
        step_times.lookup({key(batch=10): 2.0}, [key()])


def test_two_rows_for_one_configuration_are_refused(tmp_path):
    path = tmp_path / "twice.csv"
    path.write_text("method,batch_size,width,step_ms\nnone,50,1.0,3.0\nnone,50,1.0,4.0\n")
    with pytest.raises(UserError, match="two rows for none at batch 50"):
        step_times.read(path)


def test_written_times_read_back(tmp_path):
    times = {key(): 3.25, key("batchnorm", 1, 0.25, "1x32x32"): 0.5}
    path = step_times.write(tmp_path / "step_times.csv", times, torch.device("cpu"), "plain")
    assert step_times.read(path) == times


def test_the_committed_h100_assumptions_cover_the_paper_preset():
    known = step_times.read(ASSUMED)
    assert {k.method for k in known} >= {"none", "batchnorm", "normprop-icml"} and all(v > 0 for v in known.values())
    assert "ASSUMED" in ASSUMED.read_text().splitlines()[0]
    b1, b50 = known[key("normprop-icml", 1)], known[key("normprop-icml", 50)]
    assert 0.2 < b1 < 1.0 and b50 > b1  # a graph-replayed batch-1 step; batch 50 by its FLOPs


def test_steps_are_measured_here_per_configuration():
    cfg = config.load("table1", preset="smoke")
    normalizers = grid.load("normalizers", preset="smoke")  # Batch Renorm's schedule in epochs
    needed = {key("normprop-icml", 4, 0.0625): cfg, key("batchnorm", 4, 0.0625): cfg,
              key("none", 2, 0.0625, "1x32x32"): cfg, key("batchrenorm", 4, 0.0625): normalizers}  # fmt: skip
    got = step_times.measure(needed, torch.device("cpu"), steps=2, warmup=1)
    assert set(got) == set(needed) and all(v > 0 for v in got.values())


def test_each_method_is_timed_on_its_own_runs_config():
    """A plan's runs carry their method's settings (weight norm's data_init, scaled WS's clipping); timed side
    by side, no method gets another's: a NormProp net built with data_init would be refused."""
    from omegaconf import OmegaConf

    from normprop_cli.bench.timing import method_cfg

    base = grid.load("normalizers", preset="smoke")
    own = {m: method_cfg(base, m) for m in ("weightnorm", "normprop-icml", "scaledws")}
    assert OmegaConf.select(own["weightnorm"], "model.data_init") is True
    needed = {key(m, 2, 0.0625): c for m, c in own.items()}
    got = step_times.measure(needed, torch.device("cpu"), steps=1, warmup=1)
    assert set(got) == set(needed) and all(v > 0 for v in got.values())
