"""The fused road (nn/fused.py: NormProp's fold and unit-norm constraint in torch's weight-norm kernel, the
road CUDA takes) computes what the CPU's batched road computes, run here on the CPU by forcing it; and a layer
alone on each forced road, the triton road's included (tests/nn/test_triton_fold.py has the rest of it), is
eq. 11."""

import pytest
import torch
import torch.nn.functional as F

from normprop_cli.engine.step import Step, make_optimizer
from normprop_cli.nn import NIN, NormPropConv2d, NormPropLinear, constrain_unit_norm_, fused, reference_forward

STEPS = 20


@pytest.fixture
def road():
    """Set fused.ROAD for a test; put back after it."""
    with fused.using_road(fused.ROAD):
        yield fused.set_road


def trained(road_name, set_road, batch, lr):
    """`trained_on` the CPU, on the road `road_name`."""
    set_road(road_name)
    return trained_on("cpu", batch, lr)


@pytest.mark.parametrize(("batch", "lr"), [(1, 0.005), (8, 0.05)])
def test_the_fused_road_trains_as_the_batched_road_within_1e_5_and_keeps_every_filter_at_unit_norm(batch, lr, road):
    """20 steps of SGD with the constraint, float32: the same loss and every gradient within 1e-5 relative, every
    filter's norm within 1e-6 of 1. At batch 1 the batched road scales some layers' outputs; the fused road never.
    (A rate at which the run does not diverge: a diverging run amplifies float32's rounding past any bound.)"""
    batched, fused_ = trained("batched", road, batch, lr), trained("fused", road, batch, lr)
    for (loss_b, grads_b, norms_b), (loss_f, grads_f, norms_f) in zip(batched, fused_, strict=True):
        assert loss_f == pytest.approx(loss_b, rel=1e-5)
        for gb, gf in zip(grads_b, grads_f, strict=True):
            assert (gf - gb).norm() <= 1e-5 * gb.norm()
        assert (norms_f - 1).abs().max() <= 1e-6 and (norms_b - 1).abs().max() <= 1e-6


def test_auto_takes_the_batched_road_on_the_cpu_and_fused_where_forced(road):
    w = [torch.randn(4, 3, 3, 3)]
    assert fused.ROAD == "auto" and not fused.takes_fused(w)
    road("fused")
    assert fused.takes_fused(w) and not fused.takes_fused([w[0].to(memory_format=torch.channels_last)])
    road("batched")
    assert not fused.takes_fused(w)
    with pytest.raises(ValueError, match="auto, fused, batched"):
        road("nope")


LAYERS = {
    "conv": lambda activation, dtype: NormPropConv2d(3, 5, 3, padding=1, activation=activation, dtype=dtype),
    "linear": lambda activation, dtype: NormPropLinear(6, 5, activation=activation, dtype=dtype),
}

# Each road in the dtype it computes in, and the tolerance that dtype's rounding allows: the fused road takes
# float64 (torch's weight-norm kernel), the triton road float32 alone (its kernels and flat buffer are float32).
PRECISION = {"fused": (torch.float64, 1e-10), "triton": (torch.float32, 1e-5)}


@pytest.mark.parametrize("road_name", PRECISION)
@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("activation", ["relu", None])
def test_a_layer_alone_on_each_road_is_eq_11_to_its_dtypes_precision(road_name, kind, activation, road):
    """Value and every gradient against eq. 11 written out, for a conv and a linear layer, on the fused road
    and on the triton road (its kernels in Triton's interpreter on the CPU)."""
    if road_name == "triton":
        pytest.importorskip("triton", minversion="3.3")
    dtype, tol = PRECISION[road_name]
    road(road_name)
    torch.manual_seed(0)
    layer = LAYERS[kind](activation, dtype)
    with torch.no_grad():
        layer.gamma.uniform_(0.5, 1.5)
        layer.beta.uniform_(-0.5, 0.5)
    x = torch.randn(4, *((3, 6, 6) if kind == "conv" else (6,)), dtype=dtype)
    out = layer(x)
    if road_name == "triton":  # the layer's parameters went into the road's flat buffer: the road was taken
        assert layer._flat.holds([layer])
    params = [layer.weight, layer.gamma, layer.beta]
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, params, g)
    ref = reference_forward(layer, x)
    expected = torch.autograd.grad(ref, params, g)
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_the_fused_constraint_scales_each_filter_to_unit_norm_as_the_batched_one(road):
    torch.manual_seed(0)
    model = torch.nn.Sequential(NormPropConv2d(3, 6, 3), NormPropLinear(5, 4, activation=None))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    twin = [p.detach().clone() for p in model.parameters()]
    road("fused")
    constrain_unit_norm_(model)
    fused_weights = [m.weight.detach().clone() for m in model]
    with torch.no_grad():
        for p, t in zip(model.parameters(), twin, strict=True):
            p.copy_(t)
    road("batched")
    constrain_unit_norm_(model)
    for m, w in zip(model, fused_weights, strict=True):
        torch.testing.assert_close(w, m.weight, rtol=1e-6, atol=1e-7)
        assert (m.filter_norms() - 1).abs().max() <= 1e-6


def test_the_fused_road_under_bfloat16_autocast_folds_in_float32_and_gives_float32_gradients(road):
    """As the batched road under autocast: the fold from the float32 weights, the convolutions in bfloat16."""
    torch.manual_seed(0)
    model = NIN(10, norm="normprop", width=0.1)
    x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    losses = {}
    for name in ("batched", "fused"):
        road(name)
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", torch.bfloat16):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        losses[name] = loss.item()
        assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    assert losses["fused"] == pytest.approx(losses["batched"], rel=1e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("batch", "lr"), [(1, 0.005), (8, 0.05)])
def test_on_cuda_the_fused_road_trains_as_the_cpus_batched_road_within_1e_5(batch, lr):
    """The fused road on CUDA (CUDA's own where Triton does not run), full float32 (no TF32, cuDNN deterministic),
    against the CPU's batched road, step by step."""
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic = False, True
    try:
        cpu = trained_on("cpu", batch, lr)
        with fused.using_road("fused"):
            cuda = trained_on("cuda", batch, lr)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic = flags
    for (loss_b, grads_b, _), (loss_f, grads_f, norms_f) in zip(cpu, cuda, strict=True):
        assert loss_f == pytest.approx(loss_b, rel=1e-5)
        for gb, gf in zip(grads_b, grads_f, strict=True):
            assert (gf.cpu() - gb).norm() <= 1e-5 * gb.norm()
        assert (norms_f - 1).abs().max() <= 1e-6


def trained_on(device, batch, lr, steps=STEPS):
    """Per step: the loss, every parameter's gradient and every NormProp filter's norm after the constraint."""
    torch.manual_seed(0)
    model = NIN(10, norm="normprop", width=0.1).to(device)
    opt = make_optimizer(model, lr, 0.9, 5e-4, torch.device(device))
    step = Step(model, torch.nn.Identity(), opt, constrain=True)
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        x, y = torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)
        loss, _ = step(x.to(device), y.to(device))
        grads = [p.grad.clone() for p in model.parameters()]
        norms = torch.cat([m.filter_norms() for m in model.modules() if hasattr(m, "filter_norms")])
        out.append((loss.item(), grads, norms.cpu()))
    return out
