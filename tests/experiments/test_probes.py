"""The observers of the hidden layers' inputs: Fig. 2's unit probe and the population metric."""

import copy
import io

import pytest
import torch

from normprop_cli.experiments.probes import (
    CONSTANT_STD,
    DRIFT_FLOOR,
    POPULATION_COLUMNS,
    UNIT_COLUMNS,
    PopulationProbe,
    Standard,
    UnitMoments,
    UnitProbe,
    batch_statistics_at_init,
    standard_units,
)
from normprop_cli.nn import NIN, activation_stats, input_dependent, relu_stats


def tiny(norm: str, seed: int = 0, **kwargs) -> NIN:
    torch.manual_seed(seed)
    return NIN(norm=norm, width=0.0625, **kwargs)


def images(n: int = 24, seed: int = 1) -> tuple[torch.Tensor, callable]:
    x = torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    return x, lambda: iter([(x[: n // 2], None), (x[n // 2 :], None)])


def standard_inputs(model: NIN, batches) -> dict[int, torch.Tensor]:
    """The input of each conv layer k >= 2 by walking model.features by hand over the same batches,
    in float64 and in standard units: (x - c2) / c1 with ReLU's constants (Remark 1) unless NormProp
    normalised it."""
    convs = {id(m): k for k, m in enumerate(model.hidden_layers(), start=1)}
    c2, c1 = (relu_stats().mean, relu_stats().std) if model.norm != "normprop" else (0.0, 1.0)
    inputs = {}
    model.eval()
    with torch.no_grad():
        for x, _ in batches():
            for module in model.features:
                if id(module) in convs and convs[id(module)] >= 2:
                    inputs.setdefault(convs[id(module)], []).append((x.double() - c2) / c1)
                x = module(x)
    return {k: torch.cat(v) for k, v in inputs.items()}


def by_hand(model: NIN, batches) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per layer: each input-dependent unit's mean and std over the images, [C, positions]."""
    masks = input_dependent(model)
    return {
        k: (v.mean(0)[:, masks[k]], v.std(0, unbiased=False)[:, masks[k]])
        for k, v in standard_inputs(model, batches).items()
    }


def perturb_(model: NIN) -> None:
    """A stand-in for an epoch of training: every parameter moves a little."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * p.abs().mean() * torch.randn(p.shape, generator=gen))


@pytest.mark.parametrize("norm", ["normprop", "none"])
def test_population_metric_matches_a_hand_computation(norm):
    model = tiny(norm)
    _, batches = images()
    probe = PopulationProbe()
    first = probe.observe(model, batches, epoch=0)
    initial = by_hand(model, batches)
    perturb_(model)
    later = probe.observe(model, batches, epoch=1)
    assert [r["layer"] for r in first] == [r["layer"] for r in later] == list(range(2, 10))
    for rows, epoch in ((first, 0), (later, 1)):
        hand = by_hand(model, batches) if epoch else initial
        for r in rows:
            assert list(r) == POPULATION_COLUMNS and r["epoch"] == epoch
            mean, std = hand[r["layer"]]
            mean0, std0 = initial[r["layer"]]
            varies = std0 >= max(CONSTANT_STD, DRIFT_FLOOR * std0.median().item())
            assert r["units"] == mean.numel()
            assert r["avg_abs_mean"] == pytest.approx(mean.abs().mean().item(), rel=1e-6)
            assert r["avg_std"] == pytest.approx(std.mean().item(), rel=1e-6)
            # in the N(0, 1) units the paper aims at, the same for every method
            deviation = torch.maximum(mean.abs(), (std - 1).abs()).mean().item()
            assert r["avg_deviation"] == pytest.approx(deviation, rel=1e-6)
            if epoch:
                shift = torch.maximum((mean - mean0).abs(), (std - std0).abs()).mean().item()
                assert r["avg_shift"] == pytest.approx(shift, rel=1e-6)
            else:
                assert r["avg_shift"] != r["avg_shift"]  # no previous epoch: NaN
            assert r["units_constant_at_init"] == int((~varies).sum())
            drift = (mean - mean0).abs()[varies] / std0[varies]
            assert r["avg_drift"] == pytest.approx(drift.mean().item(), rel=1e-6, abs=1e-12)
            assert r["median_drift"] == pytest.approx(drift.median().item(), rel=1e-6, abs=1e-12)
    assert all(r["avg_drift"] == 0.0 for r in first)
    assert all(r["avg_drift"] > 0.0 for r in later)


def test_a_sparser_population_schedule_observes_epoch_0_every_kth_and_the_last_with_the_same_drift():
    model = tiny("normprop")
    _, batches = images()
    every, sparse = PopulationProbe(), PopulationProbe(every=3, last=4)
    seen = []
    for epoch in range(5):
        if epoch:
            perturb_(model)
        full = every.observe(model, batches, epoch)
        rows = sparse.observe(model, batches, epoch)
        if rows:
            seen.append(epoch)
            for a, b in zip(full, rows, strict=True):  # the same numbers, drift from epoch 0 included
                assert {**a, "avg_shift": None} == {**b, "avg_shift": None}
                assert b["avg_shift"] != b["avg_shift"]  # its previous observation is not the previous epoch: NaN
    assert seen == [0, 3, 4]


def test_population_counts_only_the_input_dependent_units():
    model = tiny("normprop")
    rows = {r["layer"]: r for r in PopulationProbe().observe(model, images()[1], epoch=1)}
    channels = {k: m.weight.shape[1] for k, m in enumerate(model.hidden_layers(), start=1)}
    assert rows[2]["units"] == channels[2] * 32 * 32
    assert rows[9]["units"] == channels[9] * 4 * 4  # conv 9's 8x8 input has a bias-only 2-pixel border


def test_the_initial_state_survives_a_checkpoint_round_trip():
    model = tiny("normprop")
    _, batches = images()
    uninterrupted = PopulationProbe()
    uninterrupted.observe(model, batches, epoch=0)
    before = PopulationProbe()
    before.observe(model, batches, epoch=0)
    buffer = io.BytesIO()
    torch.save(before.state_dict(), buffer)
    buffer.seek(0)
    resumed = PopulationProbe()
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    trained = copy.deepcopy(model)
    perturb_(trained)
    assert resumed.observe(trained, batches, epoch=1) == uninterrupted.observe(trained, batches, epoch=1)
    forgetful = PopulationProbe().observe(trained, batches, epoch=1)  # no epoch-0 state: no drift
    assert all(r["avg_drift"] != r["avg_drift"] for r in forgetful)


def test_unit_probe_never_draws_a_position_that_ignores_the_image():
    mask = input_dependent(tiny("normprop"))[9]
    drawn = {UnitProbe(seed).unit(9, draw, 12, mask) for seed in range(200) for draw in range(8)}
    positions = {(h, w) for _, h, w in drawn}
    assert positions == {tuple(p) for p in mask.nonzero().tolist()}  # all 16 central positions, no border
    assert {c for c, _, _ in drawn} == set(range(12))


def test_units_come_from_seed_layer_and_draw_alone():
    mask = torch.ones(16, 16, dtype=torch.bool)
    assert UnitProbe(5).unit(3, 2, 12, mask) == UnitProbe(5, draws=3).unit(3, 2, 12, mask)
    assert len({UnitProbe(5).unit(3, d, 12, mask) for d in range(8)}) > 1
    assert len({UnitProbe(s).unit(3, 0, 12, mask) for s in range(10)}) > 1


@pytest.mark.parametrize("norm", ["normprop", "batchnorm"])
def test_unit_probe_measures_the_standardised_input_and_leaves_the_model_alone(norm):
    model = tiny(norm)
    _, batches = images()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rows = UnitProbe(seed=3, draws=4).observe(model, batches, epoch=1)
    assert model.training  # restored after the probe's evaluation pass
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert [(r["layer"], r["draw"]) for r in rows] == [(k, d) for k in range(2, 10) for d in range(4)]
    inputs = standard_inputs(model, batches)
    for r in rows:
        assert list(r) == UNIT_COLUMNS and r["n"] == 24 and r["epoch"] == 1
        v = inputs[r["layer"]][:, r["channel"], r["row"], r["col"]]
        assert r["mean"] == pytest.approx(v.mean().item(), abs=1e-6)
        assert r["std"] == pytest.approx(v.std(unbiased=False).item(), abs=1e-6)


def test_baselines_are_read_in_their_activations_standard_units():
    assert set(standard_units(tiny("normprop")).values()) == {None}
    relu = relu_stats()
    assert standard_units(tiny("batchnorm"))[2] == pytest.approx((relu.mean, relu.std))
    tanh = activation_stats("tanh")
    assert standard_units(tiny("none", activation="tanh"))[9] == pytest.approx((tanh.mean, tanh.std))
    assert standard_units(tiny("none"))[1] is None  # conv 1 reads the normalised data


def batchnorm_outputs(model: NIN, batches) -> list[torch.Tensor]:
    """Every BatchNorm's output over all batches, [N, C, H, W] each, in evaluation mode."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    seen = {id(m): [] for m in norms}
    hooks = [m.register_forward_hook(lambda m, i, out: seen[id(m)].append(out.clone())) for m in norms]  # in-place ReLU
    model.eval()
    with torch.no_grad():
        for x, _ in batches():
            model(x)
    for h in hooks:
        h.remove()
    return [torch.cat(seen[id(m)]) for m in norms]


def test_batch_statistics_at_init_normalise_bn_and_leave_its_state_alone():
    model = tiny("batchnorm").train()
    _, batches = images(48)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    raw = batchnorm_outputs(model, batches)
    assert any(abs(out.std().item() - 1.0) > 0.1 for out in raw)  # eval-mode BN at init: unnormalised
    model.train()
    with batch_statistics_at_init(model, batches):
        assert not model.training
        for out in batchnorm_outputs(model, batches):
            per_channel = out.transpose(0, 1).flatten(1)
            # the estimates are exact for one batch; across batches the deeper layers' inputs differ a little
            assert per_channel.mean(1).abs().max() < 1e-2
            assert (per_channel.std(1) - 1.0).abs().max() < 0.03
    assert model.training
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(m.momentum == 0.1 for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))


def test_probes_calibrate_batchnorm_at_epoch_0_only():
    model = tiny("batchnorm")
    _, batches = images(48)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    at_init = {r["layer"]: r for r in PopulationProbe().observe(model, batches, epoch=0)}
    with batch_statistics_at_init(model, batches):
        calibrated = {r["layer"]: r for r in PopulationProbe().observe(model, batches, epoch=1)}
    uncalibrated = {r["layer"]: r for r in PopulationProbe().observe(model, batches, epoch=1)}
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    for k in range(2, 10):
        assert at_init[k]["avg_std"] == pytest.approx(calibrated[k]["avg_std"], rel=1e-9)
    assert any(abs(at_init[k]["avg_std"] - uncalibrated[k]["avg_std"]) > 0.05 for k in range(2, 10))


@pytest.mark.parametrize("c", [None, (0.4, 0.58)])
def test_unit_moments_read_a_layer_input_as_its_float64_standard_units_bit_for_bit(c):
    """The moments of a float32 input, widened as they are read, are those of standard(x.double()): the
    same float64 sums about the same shift, and the input is left as it was."""
    x = torch.randn(50, 4, 6, 6).to(memory_format=torch.channels_last) * 3 + 1
    kept, fused, plain = x.clone(), UnitMoments(), UnitMoments()
    standard = Standard(c)
    for part in x.split(16):
        fused.add(part, standard)
        plain.add(standard(part.double()))  # already float64: read as it is
    assert torch.equal(x, kept)
    assert fused.n == plain.n == 50
    for a, b in zip(fused.mean_std(), plain.mean_std(), strict=True):
        assert a.dtype == torch.float64 and torch.equal(a, b)
