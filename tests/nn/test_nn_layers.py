"""NormProp layers compute eq. 9 / eq. 11, differentiably, and the constraint of section 4.4."""

import math

import pytest
import torch
import torch.nn.functional as F
from scipy import integrate
from torch import nn

from normprop_cli.nn import (
    JACOBIAN_MODES,
    NormPropConv2d,
    NormPropLinear,
    constrain_unit_norm_,
    reference_forward,
)

C2 = 1 / math.sqrt(2 * math.pi)  # Remark 1
C1 = math.sqrt((1 - 1 / math.pi) / 2)
F_RELU = math.sqrt(0.5) / C1  # section 3.4, 1.2112


def tanh_constants():
    """c2, c1 and Jacobian factor of tanh, by scipy's adaptive quadrature."""

    def phi(x):
        return math.exp(-x * x / 2) / math.sqrt(2 * math.pi)

    var = integrate.quad(lambda x: math.tanh(x) ** 2 * phi(x), -40, 40, epsabs=1e-13)[0]
    slope_sq = integrate.quad(lambda x: (1 - math.tanh(x) ** 2) ** 2 * phi(x), -40, 40)[0]
    return 0.0, math.sqrt(var), math.sqrt(slope_sq / var)


def by_hand(x, weight, gamma, beta, act, c2, c1, f, conv=None):
    """Eq. 11 (conv) / eq. 9 (linear) written out, with unit-norm filters W_i / ||W_i||."""
    unit = weight / weight.flatten(1).norm(dim=1).view(-1, *(1,) * (weight.ndim - 1))
    if conv is None:
        wx, shape = F.linear(x, unit), (1, -1)
    else:
        wx, shape = F.conv2d(x, unit, **conv), (1, -1, 1, 1)
    return (act(gamma.view(shape) * wx / f + beta.view(shape)) - c2) / c1


def small_conv(activation="relu", jacobian="divide", **kw):
    layer = NormPropConv2d(2, 3, 3, stride=2, padding=1, activation=activation, jacobian=jacobian, **kw).double()
    with torch.no_grad():
        layer.weight.copy_(torch.linspace(-1.0, 1.3, 54, dtype=torch.float64).view(3, 2, 3, 3))
        layer.weight[1].mul_(-0.3)
        layer.gamma.copy_(torch.tensor([0.7, 1.0, 1.6]))
        layer.beta.copy_(torch.tensor([0.1, -0.2, 0.05]))
    return layer


def small_linear(activation="relu", jacobian="divide", **kw):
    layer = NormPropLinear(4, 3, activation=activation, jacobian=jacobian, **kw).double()
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.2, 0.1, -0.4, 0.0], [-1.0, -1.0, 2.0, 0.5]]))
        layer.gamma.copy_(torch.tensor([1.3, 0.6, 1.0]))
        layer.beta.copy_(torch.tensor([-0.1, 0.3, 0.0]))
    return layer


CONV = {"stride": 2, "padding": 1}


def x_conv(seed=0):
    return torch.randn(2, 2, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def x_linear(seed=0):
    return torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("jacobian", JACOBIAN_MODES)
def test_relu_layers_equal_eq_11_and_eq_9_by_hand(jacobian):
    f = F_RELU if jacobian == "divide" else 1.0
    conv, lin = small_conv(jacobian=jacobian), small_linear(jacobian=jacobian)
    expected = by_hand(x_conv(), conv.weight, conv.gamma, conv.beta, torch.relu, C2, C1, f, CONV)
    torch.testing.assert_close(conv(x_conv()), expected, rtol=0, atol=1e-12)
    expected = by_hand(x_linear(), lin.weight, lin.gamma, lin.beta, torch.relu, C2, C1, f)
    torch.testing.assert_close(lin(x_linear()), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("jacobian", JACOBIAN_MODES)
def test_prelu_layer_equals_remark_2_by_hand(jacobian):
    a = 0.3
    c2 = (1 - a) / math.sqrt(2 * math.pi)
    c1 = math.sqrt(((1 + a * a) - (1 - a) ** 2 / math.pi) / 2)
    f = math.sqrt((1 + a * a) / 2) / c1 if jacobian == "divide" else 1.0
    layer = small_conv("prelu", jacobian, prelu_init=a)
    layer.slope.data.fill_(a)  # exactly a in float64
    act = lambda z: torch.where(z > 0, z, a * z)  # noqa: E731  eq. 13
    expected = by_hand(x_conv(), layer.weight, layer.gamma, layer.beta, act, c2, c1, f, CONV)
    torch.testing.assert_close(layer(x_conv()), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("jacobian", JACOBIAN_MODES)
def test_tanh_layer_equals_eq_12_with_numerical_constants(jacobian):
    c2, c1, factor = tanh_constants()
    f = factor if jacobian == "divide" else 1.0
    for layer, x, conv in [
        (small_conv("tanh", jacobian), x_conv(), CONV),
        (small_linear("tanh", jacobian), x_linear(), None),
    ]:
        expected = by_hand(x, layer.weight, layer.gamma, layer.beta, torch.tanh, c2, c1, f, conv)
        torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-9)


@pytest.mark.parametrize("activation", ["relu", "prelu", "tanh", "sigmoid", None])
def test_folded_forward_equals_reference_forward(activation):
    for layer, x in [(small_conv(activation), x_conv()), (small_linear(activation), x_linear())]:
        torch.testing.assert_close(layer(x), reference_forward(layer, x), rtol=0, atol=1e-12)


def test_classifier_has_no_activation_and_no_post_normalisation():
    layer = small_linear(activation=None)
    unit = layer.weight / layer.weight.norm(dim=1, keepdim=True)
    expected = layer.gamma * F.linear(x_linear(), unit) + layer.beta
    torch.testing.assert_close(layer(x_linear()), expected, rtol=0, atol=1e-12)
    assert NormPropConv2d(3, 4, 1, activation="identity").activation == "identity"


def test_initialisation_per_jacobian_mode():
    torch.manual_seed(0)
    divide, init, off = (NormPropConv2d(8, 16, 3, jacobian=j) for j in ("divide", "init", "off"))
    assert torch.all(divide.gamma == 1) and torch.all(off.gamma == 1)
    torch.testing.assert_close(init.gamma, torch.full((16,), 1 / F_RELU))  # arXiv: 1/1.21
    assert torch.all(divide.beta == 0)
    bound = math.sqrt(6 / (8 * 9 + 16 * 9))  # Glorot uniform, fan_in + fan_out
    assert divide.weight.abs().max() <= bound and divide.weight.abs().max() > 0.9 * bound
    init.weight.data.copy_(divide.weight)  # same function at initialisation
    x = torch.randn(2, 8, 6, 6)
    torch.testing.assert_close(init(x), divide(x))
    assert NormPropLinear(3, 2, activation="prelu", prelu_init=0.1).slope.item() == pytest.approx(0.1)


def test_bad_arguments_fail():
    with pytest.raises(ValueError, match="jacobian"):
        NormPropLinear(3, 2, jacobian="yes")
    with pytest.raises(ValueError, match="unknown activation"):
        NormPropLinear(3, 2, activation="swish")


def relu_inputs_away_from_kink(make_layer, make_x):
    """Inputs whose pre-activations are all further than 1e-3 from the ReLU kink."""
    layer = make_layer()
    for seed in range(100):
        x = make_x(seed)
        with torch.no_grad():
            shape = (1, -1) + (1,) * (x.ndim - 2)
            pre = layer.gamma.view(shape) * layer._op(x, layer.weight, None) / (
                F_RELU * layer.filter_norms().view(shape)
            ) + layer.beta.view(shape)
        if pre.abs().min() > 1e-3:
            return layer, x
    raise AssertionError("no seed found")


def gradcheck_layer(layer, x):
    names = [n for n, _ in layer.named_parameters()]

    def fn(x, *params):
        return torch.func.functional_call(layer, dict(zip(names, params, strict=True)), (x,))

    params = [p.detach().clone().requires_grad_() for p in layer.parameters()]
    return torch.autograd.gradcheck(fn, (x.requires_grad_(), *params))


@pytest.mark.parametrize("activation", ["relu", "prelu", "tanh", None])
def test_gradcheck_conv(activation):
    layer, x = small_conv(activation), x_conv()
    if activation == "relu":
        layer, x = relu_inputs_away_from_kink(small_conv, x_conv)
    assert gradcheck_layer(layer, x)


@pytest.mark.parametrize("activation", ["relu", "prelu", "sigmoid"])
def test_gradcheck_linear(activation):
    layer, x = small_linear(activation), x_linear()
    if activation == "relu":
        layer, x = relu_inputs_away_from_kink(small_linear, x_linear)
    assert gradcheck_layer(layer, x)


def test_prelu_slope_is_learned_through_the_statistics():
    layer = small_linear("prelu")
    layer(x_linear()).sum().backward()
    assert layer.slope.grad is not None and layer.slope.grad.abs().item() > 0


def test_constrain_unit_norm_keeps_the_function():
    torch.manual_seed(0)
    model = nn.Sequential(
        NormPropConv2d(3, 6, 3, padding=1),
        NormPropConv2d(6, 5, 1),
        nn.Flatten(),
        NormPropLinear(5 * 4 * 4, 7, activation="tanh"),
        NormPropLinear(7, 3, activation=None),
        nn.Linear(3, 2),
    )
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    plain = model[-1].weight.detach().clone()
    x = torch.randn(4, 3, 4, 4)
    before = model(x)
    constrain_unit_norm_(model)
    for layer in model[:2]:
        torch.testing.assert_close(
            layer.weight.flatten(1).norm(dim=1), torch.ones(layer.out_channels), rtol=0, atol=1e-6
        )
    for layer in model[3:5]:
        torch.testing.assert_close(layer.weight.norm(dim=1), torch.ones(layer.out_features), rtol=0, atol=1e-6)
    assert torch.equal(model[-1].weight, plain)  # not a NormProp layer: untouched
    torch.testing.assert_close(model(x), before, rtol=1e-5, atol=1e-5)
    assert model[0].weight.grad is None  # done under no_grad


def test_dtype_follows_the_module():
    layer = NormPropConv2d(2, 3, 3, activation="prelu").to(torch.float64)
    assert layer(torch.randn(1, 2, 5, 5, dtype=torch.float64)).dtype == torch.float64


def test_conv_takes_nn_conv2d_arguments_then_normprops_by_keyword():
    """As timm's StdConv2d: nn.Conv2d's parameters, in order, then NormProp's own, keyword-only."""
    import inspect

    ours = list(inspect.signature(NormPropConv2d).parameters.values())
    theirs = list(inspect.signature(nn.Conv2d).parameters.values())
    assert [(p.name, p.default) for p in ours[: len(theirs)]] == [(p.name, p.default) for p in theirs]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in ours[len(theirs) :])
    layer = NormPropConv2d(3, 4, 5, 1, "same", device="cpu", dtype=torch.float64)
    assert layer.padding == (2, 2) and layer.weight.dtype == layer.gamma.dtype == torch.float64
    assert layer(torch.randn(2, 3, 6, 6, dtype=torch.float64)).shape == (2, 4, 6, 6)
    for bad in ({"bias": False}, {"padding_mode": "reflect"}, {"groups": 2}):
        with pytest.raises(ValueError):
            NormPropConv2d(3, 4, 3, **bad)
