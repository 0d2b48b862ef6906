"""The batch-independent normalisers NormProp is compared with, each against its formula written out here,
and each training the NIN at batch size 1."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from normprop_cli.nn import NIN, NORMS
from normprop_cli.nn.methods import METHODS, model_options
from normprop_cli.nn.normalizers import (
    BatchRenorm2d,
    activation_gain,
    groups_for,
)


@pytest.fixture(autouse=True)
def _float64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def block(norm: str, i=4, o=6, k=3, activation="relu", width=0.25, **options):
    return NORMS[norm].block(i, o, k, 1, 1, activation=activation, jacobian="divide", width=width, **options)


# --- Batch Renormalization ----------------------------------------------------------------------


def test_batchrenorm_is_batchnorm_when_r_is_1_and_d_is_0():
    """rmax = 1, dmax = 0 (the warm-up): outputs, gradients and running estimates of nn.BatchNorm2d."""
    torch.manual_seed(0)
    brn, bn = BatchRenorm2d(5, rmax=1.0, dmax=0.0), nn.BatchNorm2d(5)
    for m in (brn, bn):
        nn.init.uniform_(m.weight, 0.5, 1.5)
        nn.init.uniform_(m.bias, -0.5, 0.5)
    bn.load_state_dict(brn.state_dict())
    for step in range(4):
        x = (torch.randn(3, 5, 4, 4) * 2 + step).requires_grad_()
        x2 = x.detach().clone().requires_grad_()
        g = torch.randn(3, 5, 4, 4)
        y, y2 = brn(x), bn(x2)
        torch.testing.assert_close(y, y2, rtol=1e-10, atol=1e-10)
        (y * g).sum().backward()
        (y2 * g).sum().backward()
        torch.testing.assert_close(x.grad, x2.grad, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(brn.weight.grad, bn.weight.grad, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(brn.bias.grad, bn.bias.grad, rtol=1e-9, atol=1e-10)
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(brn, name), getattr(bn, name))
    brn.eval(), bn.eval()
    x = torch.randn(2, 5, 4, 4)
    torch.testing.assert_close(brn(x), bn(x))


def test_batchrenorm_corrects_by_clipped_r_and_d_held_constant():
    """Past its limits: x_hat = (x - mu_B)/sigma_B * r + d with r = clip(sigma_B/sigma, 1/rmax, rmax),
    d = clip((mu_B - mu)/sigma, -dmax, dmax) from the running mu, sigma; r, d carry no gradient."""
    torch.manual_seed(1)
    brn = BatchRenorm2d(3, rmax=1.5, dmax=0.5, warmup_steps=0, rmax_steps=0, dmax_steps=0)
    brn.running_mean.copy_(torch.tensor([0.0, 3.0, -1.0]))
    brn.running_var.copy_(torch.tensor([1.0, 0.25, 9.0]))
    mu, sigma = brn.running_mean.clone(), (brn.running_var + brn.eps).sqrt()
    x = (torch.randn(4, 3, 5, 5) * torch.tensor([1.0, 2.0, 0.5]).view(1, 3, 1, 1)).requires_grad_()
    y = brn(x)

    xr = x.detach().clone().requires_grad_()
    mean_b = xr.mean((0, 2, 3))
    std_b = (xr.var((0, 2, 3), unbiased=False) + brn.eps).sqrt()
    r = (std_b / sigma).clamp(1 / 1.5, 1.5).detach()
    d = ((mean_b - mu) / sigma).clamp(-0.5, 0.5).detach()
    shape = (1, 3, 1, 1)
    expect = brn.weight.view(shape) * ((xr - mean_b.view(shape)) / std_b.view(shape) * r.view(shape) + d.view(shape))
    expect = expect + brn.bias.view(shape)
    torch.testing.assert_close(y, expect)
    assert (r != 1).any() and (d.abs() == 0.5).any()  # the clipping is exercised
    g = torch.randn_like(y)
    (y * g).sum().backward()
    (expect * g).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)


def test_batchrenorm_limits_warm_up_then_relax_linearly():
    brn = BatchRenorm2d(2, rmax=3.0, dmax=5.0, warmup_steps=10, rmax_steps=30, dmax_steps=20)
    at = {}
    for t in (0, 10, 20, 30, 100):
        brn.num_batches_tracked.fill_(t)
        at[t] = tuple(float(v) for v in brn.limits())
    assert at[0] == at[10] == (1.0, 0.0)
    assert at[20] == pytest.approx((2.0, 5.0))
    assert at[30] == at[100] == (3.0, 5.0)
    sudden = BatchRenorm2d(2, warmup_steps=5, rmax_steps=5, dmax_steps=5)  # no ramp: a step at warmup_steps
    for t, expect in ((4, (1.0, 0.0)), (5, (3.0, 5.0))):
        sudden.num_batches_tracked.fill_(t)
        assert tuple(float(v) for v in sudden.limits()) == expect
    with pytest.raises(ValueError, match="rmax >= 1"):
        BatchRenorm2d(2, rmax=0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batchrenorm_limits_are_the_arguments_own_values_in_the_estimates_dtype(dtype):
    """The ramps are kept in float64 whatever the module's dtype: before and after the ramps the limits are rmax
    and dmax as given, rounded once to the running estimates' dtype (3.3 is not a float32), the lower bounds
    1 / rmax and -dmax; and the table is no part of the state dict, so checkpoints keep BatchNorm's keys."""
    brn = BatchRenorm2d(2, rmax=3.3, dmax=0.7, warmup_steps=4, rmax_steps=14, dmax_steps=9).to(dtype)
    at = {0: (1.0, 0.0), 4: (1.0, 0.0), 9: (1.0 + 2.3 * 0.5, 0.7), 14: (3.3, 0.7), 99: (3.3, 0.7)}
    for t, (rmax, dmax) in at.items():
        brn.num_batches_tracked.fill_(t)
        bounds = brn._bounds()
        assert bounds.dtype == dtype
        expect = torch.tensor([[rmax, dmax], [1 / rmax, -dmax]], dtype=torch.float64).to(dtype)
        ulp = 0.0 if t in (0, 4, 14, 99) else torch.finfo(dtype).eps  # mid-ramp: one rounding apart at most
        torch.testing.assert_close(bounds, expect, rtol=ulp, atol=0)
        assert [float(v) for v in brn.limits()] == bounds[0].tolist()
    assert set(brn.state_dict()) == set(nn.BatchNorm2d(2).state_dict())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("momentum", [0.1, 0.01, 0.7])
def test_batchrenorm_momentum_is_a_python_float_with_the_former_numbers(monkeypatch, dtype, momentum):
    """The running estimates' momentum is used as a Python float: no tensor is made from it in a step (a
    host-to-device copy, which a CUDA graph cannot capture), and the estimates are bit for bit those of
    the former weight, torch.tensor(momentum) in the estimates' dtype."""
    torch.manual_seed(2)
    brn = BatchRenorm2d(4, momentum=momentum, warmup_steps=0, rmax_steps=3, dmax_steps=3).to(dtype)
    expect = {k: getattr(brn, k).clone() for k in ("running_mean", "running_var")}
    former, made = torch.tensor, []
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: made.append(a) or former(*a, **k))
    for step in range(5):
        x = torch.randn(3, 4, 5, 5, dtype=dtype) * 2 + step
        brn(x)
        weight, n = former(float(momentum), dtype=dtype), x.numel() // x.shape[1]
        expect["running_mean"].lerp_(x.mean((0, 2, 3)), weight)
        centred = (x - x.mean((0, 2, 3))[None, :, None, None]).square().mean((0, 2, 3))  # the module's two passes
        expect["running_var"].lerp_(centred * (n / (n - 1)), weight)
        assert all(torch.equal(getattr(brn, k), v) for k, v in expect.items()), step
    assert made == []


# --- weight normalisation -----------------------------------------------------------------------


def test_weightnorm_weight_is_g_times_v_over_its_norm():
    torch.manual_seed(2)
    conv = block("weightnorm")[0]
    v = conv.parametrizations.weight.original1
    g = conv.parametrizations.weight.original0
    with torch.no_grad():
        g.uniform_(0.5, 2.0)
    expect = g.view(-1, 1, 1, 1) * v / v.flatten(1).norm(dim=1).view(-1, 1, 1, 1)
    torch.testing.assert_close(conv.weight, expect)
    x = torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(conv(x), F.conv2d(x, expect, conv.bias, padding=1))


def test_weightnorm_data_dependent_init_standardises_every_pre_activation():
    """Salimans and Kingma: after it, each channel's pre-activation has mean 0, variance 1 on the batch."""
    torch.manual_seed(3)
    net = NIN(num_classes=10, width=0.25, norm="weightnorm", data_init=True)
    x = torch.randn(32, 3, 32, 32)
    net.initialize(x)
    seen = []
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    hooks = [c.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone())) for c in convs]
    net(x)
    for h in hooks:
        h.remove()
    assert len(seen) == 9
    for out in seen:
        torch.testing.assert_close(out.mean((0, 2, 3)), torch.zeros(out.shape[1]), atol=1e-8, rtol=0)
        torch.testing.assert_close(out.std((0, 2, 3), unbiased=False), torch.ones(out.shape[1]), atol=1e-6, rtol=0)
    plain = NIN(num_classes=10, width=0.25, norm="weightnorm")
    before = {k: v.clone() for k, v in plain.state_dict().items()}
    plain.initialize(x)  # data_init off: nothing changes
    assert all(torch.equal(before[k], v) for k, v in plain.state_dict().items())
    with pytest.raises(ValueError, match="data_init"):
        NIN(norm="groupnorm", data_init=True)


# --- layer and group normalisation, weight standardisation, FRN ----------------------------------


def _group_norm(u, groups, eps=1e-5):
    n, c, h, w = u.shape
    g = u.reshape(n, groups, -1)
    out = (g - g.mean(-1, keepdim=True)) / (g.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
    return out.reshape(n, c, h, w)


@pytest.mark.parametrize("norm, groups", [("layernorm", 1), ("groupnorm", 3)])
def test_layer_and_group_norm_normalise_over_their_groups(norm, groups):
    torch.manual_seed(4)
    b = block(norm, o=6, width=0.25 * 3 / 8)  # 32 x 0.09375 = 3 groups of 2 channels
    conv, gn, _ = b
    with torch.no_grad():
        gn.weight.uniform_(0.5, 1.5), gn.bias.uniform_(-1, 1)
    x = torch.randn(2, 4, 5, 5)
    u = F.conv2d(x, conv.weight, None, padding=1)
    expect = F.relu(_group_norm(u, groups) * gn.weight.view(1, -1, 1, 1) + gn.bias.view(1, -1, 1, 1))
    assert gn.num_groups == groups
    torch.testing.assert_close(b(x), expect)
    torch.testing.assert_close(b(x[:1]), expect[:1])  # nothing depends on the other images


def test_group_count_scales_with_width_and_divides_the_channels():
    assert [groups_for(c, 1.0) for c in (192, 160, 96)] == [32, 32, 32]
    assert [groups_for(c, 0.25) for c in (48, 40, 24)] == [8, 8, 8]
    assert groups_for(10, 1.0) == 10 and groups_for(7, 0.25) == 7 and groups_for(9, 0.25) == 3


def test_weight_standardisation_with_group_norm():
    """(W - mean W_i) / sqrt(var W_i + eps) per filter, then the conv, GroupNorm and ReLU."""
    torch.manual_seed(5)
    b = block("ws-gn", o=8, width=0.125)  # 4 groups
    conv, gn, _ = b
    w = conv.weight.flatten(1)
    w_hat = ((w - w.mean(1, keepdim=True)) / (w.var(1, unbiased=False, keepdim=True) + 1e-5).sqrt()).view_as(
        conv.weight
    )
    x = torch.randn(2, 4, 6, 6)
    expect = F.relu(_group_norm(F.conv2d(x, w_hat, None, padding=1), 4))
    torch.testing.assert_close(b(x), expect)


@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid"])
def test_scaled_weight_standardisation_with_the_activation_gain(activation):
    """gamma (W - mean W_i) / (std W_i sqrt(fan_in)), gamma = 1 / std(act(N(0, 1))), then the activation;
    the output of a unit-variance input then has unit variance (NFNets' premise)."""
    torch.manual_seed(6)
    b = block("scaledws", i=64, o=64, k=1, activation=activation)
    conv = b[0]
    gamma = activation_gain(activation)
    w = conv.weight.flatten(1)
    fan_in = w.shape[1]
    w_hat = (w - w.mean(1, keepdim=True)) / (
        (w.var(1, unbiased=False, keepdim=True) + conv.eps).sqrt() * math.sqrt(fan_in)
    )
    w_hat = w_hat.view_as(conv.weight)
    x = torch.randn(256, 64, 4, 4)
    act = {"relu": F.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}[activation]
    expect = (
        gamma * act(F.conv2d(x, w_hat, conv.bias, padding=1))
        if activation != "relu"
        else act(F.conv2d(x, gamma * w_hat, conv.bias, padding=1))
    )
    torch.testing.assert_close(b(x), expect)
    inner = b(x)[:, :, 1:-1, 1:-1]  # away from the zero padding
    assert inner.var(0).mean().item() == pytest.approx(1.0, abs=0.1)


def test_activation_gain_is_nfnets():
    """ReLU's in closed form (1 / sqrt((1 - 1/pi) / 2)); tanh's and sigmoid's as NFNets estimated them."""
    assert activation_gain("relu") == pytest.approx(1 / math.sqrt((1 - 1 / math.pi) / 2), rel=1e-9)
    assert activation_gain("tanh") == pytest.approx(1.5939017391204834, rel=2e-3)
    assert activation_gain("sigmoid") == pytest.approx(4.803835391998291, rel=2e-3)


def test_filter_response_normalisation_with_tlu():
    """y = max(w x / sqrt(mean_HW(x^2) + eps) + b, tau), per image and channel."""
    torch.manual_seed(7)
    b = block("frn", o=5)
    conv, frn = b
    with torch.no_grad():
        frn.weight.uniform_(0.5, 1.5), frn.bias.uniform_(-1, 1), frn.tau.uniform_(-0.5, 0.5)
    x = torch.randn(3, 4, 6, 6)
    u = F.conv2d(x, conv.weight, None, padding=1)
    v = (1, -1, 1, 1)
    nu2 = u.pow(2).mean((2, 3), keepdim=True)
    expect = torch.maximum(frn.weight.view(v) * u / (nu2 + frn.eps).sqrt() + frn.bias.view(v), frn.tau.view(v))
    torch.testing.assert_close(b(x), expect, rtol=1e-6, atol=1e-6)  # timm computes the rms in float32
    with pytest.raises(ValueError, match="TLU"):
        block("frn", activation="tanh")


# --- every method trains at batch size 1 --------------------------------------------------------


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_trains_the_nin_at_batch_size_1(method):
    """Forty SGD steps on one image at a time, four images in turn (train mode throughout): the loss
    on those images stays finite and falls by a tenth at least."""
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(8)
    net = NIN(num_classes=10, width=0.125, **({"classifier": "plain"} | model_options(method)))  # as normalizers
    assert net.norm == METHODS[method].norm
    opt = torch.optim.SGD(net.parameters(), lr=0.005, momentum=0.9)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([1, 2, 3, 4])

    def loss_of(i):
        return F.cross_entropy(net(x[i : i + 1]), y[i : i + 1])

    first = sum(loss_of(i).item() for i in range(4))
    for step in range(40):
        loss = loss_of(step % 4)
        opt.zero_grad()
        loss.backward()
        opt.step()
    last = sum(loss_of(i).item() for i in range(4))
    assert math.isfinite(last) and last < 0.9 * first, (first, last)
