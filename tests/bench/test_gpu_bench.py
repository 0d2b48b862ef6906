"""gpu-check's bench read without a device: a method whose loss is not finite is left out of every ratio,
the batch-1 reference is the cheapest of weight norm, GroupNorm and LayerNorm, the targets come from the CSV's
rows, and the fold comparison says "not available" where the package has one fold."""

import math

import pandas as pd
import torch

from normprop_cli.bench import gpu_bench, gpu_fold
from normprop_cli.engine.step import StepOptions

ROUNDS = 9


def rows(times: dict, finite: dict, bs: int = 1) -> dict:
    phases, counts = {m: {} for m in times}, {m: (math.nan, math.nan) for m in times}
    made = gpu_bench.finite_rows(times, phases, finite, counts, 1.0, bs, "float32", torch.device("cpu"),
                                 StepOptions(), "3x32x32")  # fmt: skip
    return {r["method"]: r for r in made}


def test_a_method_whose_loss_is_not_finite_is_left_out_of_every_ratio():
    times = {"none": [1.0] * ROUNDS, "batchnorm": [2.0] * ROUNDS, "normprop-icml": [0.5] * ROUNDS,
             "weightnorm": [3.0] * ROUNDS, "groupnorm": [1.5] * ROUNDS}  # fmt: skip
    got = rows(times, {m: m != "normprop-icml" for m in times})
    assert math.isnan(got["normprop-icml"]["ratio_vs_none"]) and not got["normprop-icml"]["finite"]
    assert got["normprop-icml"]["step_ms_median"] == 0.5  # timed, marked, not compared
    assert got["groupnorm"]["fastest_independent"] == "groupnorm"  # not NormProp's 0.5 ms
    assert got["batchnorm"]["ratio_vs_none"] == 2.0 and got["batchnorm"]["images_per_s"] == 500.0
    assert got["weightnorm"]["independent_reference"] == "groupnorm"
    assert got["weightnorm"]["ratio_vs_independent_reference"] == 2.0


def test_the_targets_are_read_from_the_rows_of_the_default_configuration():
    times = {"none": [1.0] * ROUNDS, "batchnorm": [1.0] * ROUNDS, "normprop-icml": [1.02] * ROUNDS,
             "layernorm": [1.1] * ROUNDS}  # fmt: skip
    finite = dict.fromkeys(times, True)
    frame = pd.DataFrame([*rows(times, finite, 50).values(), *rows(times, finite, 1).values()])
    found = {what: (value, met) for what, value, _, met in gpu_bench.targets(frame)}
    assert found["NormProp / BatchNorm at batch 50"] == (1.02, False)
    assert found["NormProp / none at batch 50"] == (1.02, True)  # within 1.05
    assert found["NormProp / BatchNorm at batch 100"][1] is None  # not measured
    assert found["NormProp / the cheapest of weight norm, GroupNorm and LayerNorm at batch 1"][1] is True
    lines = "\n".join(gpu_bench.target_lines(frame))
    assert "| NormProp / BatchNorm at batch 50 | <= 1.00 | 1.020 | not met |" in lines
    assert "| NormProp / BatchNorm at batch 100 | <= 1.00 | not measured | not measured |" in lines


def test_the_fold_comparison_is_not_available_without_two_folds(monkeypatch):
    monkeypatch.setattr(gpu_fold, "road_switch", lambda: None)
    assert gpu_fold.compare(None, torch.device("cpu")) is None
    passed, line, details = gpu_fold.item_lines(None)
    assert passed and line.startswith("not available") and details == []


def test_the_fold_passes_on_its_first_step_and_on_the_steps_against_a_rounding_floor():
    row = {"finite": True, "first_gap": 1e-6, "loss_gap": 0.3, "floor_gap": 0.2}  # chaos amplifies both alike
    assert gpu_fold.passes(row)
    assert not gpu_fold.passes(row | {"first_gap": 1e-2})  # a first step apart: another function, not rounding
    assert not gpu_fold.passes(row | {"floor_gap": 1e-3})  # far past what one rounding grows to
    assert gpu_fold.passes(row | {"loss_gap": 1e-4, "floor_gap": 0.0})
    assert not gpu_fold.passes(row | {"finite": False})


def test_the_noise_floor_moves_each_weight_by_about_one_float32_rounding():
    model = torch.nn.Linear(64, 64).double()
    before = [p.clone() for p in model.parameters()]
    gpu_fold.perturb_(model)
    moved = torch.cat([((p - b) / b).flatten() for p, b in zip(model.parameters(), before, strict=True)])
    assert 0.5 * gpu_fold.ROUNDING < float(moved.std()) < 2 * gpu_fold.ROUNDING
