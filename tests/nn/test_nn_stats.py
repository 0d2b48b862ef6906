"""Activation statistics under X ~ N(0, 1): Remarks 1-2, section 3.4, the note's constants."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import integrate

from normprop_cli.nn import (
    ACTIVATIONS,
    activation_stats,
    avgpool_stats,
    dropout_scale,
    maxpool_stats,
    prelu_stats,
    quadrature_stats,
    register_activation,
    relu_stats,
)

SLOPES = [-1.5, -0.5, 0.0, 0.25, 0.5, 1.0, 2.5]


def expect_normal(g) -> float:
    """E[g(X)], X ~ N(0, 1), by adaptive quadrature on each half line (an independent check)."""

    def density(x):
        return g(x) * math.exp(-x * x / 2) / math.sqrt(2 * math.pi)

    return sum(integrate.quad(density, a, b, epsabs=1e-13, epsrel=1e-13)[0] for a, b in [(-np.inf, 0.0), (0.0, np.inf)])


def prelu_fn(a):
    return lambda x: F.prelu(x, torch.tensor([a], dtype=x.dtype))


def test_relu_constants_remark_1():
    st = relu_stats()
    assert st.mean == pytest.approx(1 / math.sqrt(2 * math.pi), abs=1e-15)
    assert st.std == pytest.approx(math.sqrt((1 - 1 / math.pi) / 2), abs=1e-15)
    assert round(st.mean, 4) == 0.3989 and round(st.std, 4) == 0.5838


def test_relu_jacobian_factor_section_3_4():
    st = relu_stats()
    assert st.mean_sq_derivative == pytest.approx(0.5)  # E[1(X > 0)]
    assert st.jacobian_factor**2 == pytest.approx(0.5 / st.std**2)  # E[J J^T] = 1.47 I
    assert round(st.jacobian_factor**2, 2) == 1.47
    assert st.jacobian_factor == pytest.approx(1.21117, abs=1e-5)
    assert round(st.jacobian_factor, 2) == 1.21


def test_prelu_slope_0_is_relu_and_slope_1_is_identity():
    relu, zero, one = relu_stats(), prelu_stats(0.0), prelu_stats(1.0)
    for field in ("mean", "std", "jacobian_factor"):
        assert getattr(zero, field) == pytest.approx(getattr(relu, field), abs=1e-15)
    assert (one.mean, one.std, one.jacobian_factor) == pytest.approx((0.0, 1.0, 1.0), abs=1e-15)


@pytest.mark.parametrize("a", SLOPES)
def test_prelu_remark_2_against_independent_integration(a):
    st = prelu_stats(a)
    mean = expect_normal(lambda x: x if x > 0 else a * x)
    var = expect_normal(lambda x: (x if x > 0 else a * x) ** 2) - mean**2
    slope_sq = expect_normal(lambda x: 1.0 if x > 0 else a * a)
    assert st.mean == pytest.approx(mean, abs=1e-9)
    assert st.std == pytest.approx(math.sqrt(var), abs=1e-9)
    assert st.jacobian_factor == pytest.approx(math.sqrt(slope_sq) / math.sqrt(var), abs=1e-9)


@pytest.mark.parametrize("a", SLOPES)
def test_quadrature_matches_prelu_closed_form(a):
    quad, closed = quadrature_stats(prelu_fn(a)), prelu_stats(a)
    assert quad.mean == pytest.approx(closed.mean, abs=1e-10)
    assert quad.std == pytest.approx(closed.std, abs=1e-10)
    assert quad.jacobian_factor == pytest.approx(closed.jacobian_factor, abs=1e-10)


def test_quadrature_matches_relu_and_identity_closed_forms():
    for fn, closed in [(torch.relu, relu_stats()), (lambda x: x, activation_stats("identity"))]:
        quad = quadrature_stats(fn)
        assert quad.mean == pytest.approx(closed.mean, abs=1e-10)
        assert quad.std == pytest.approx(closed.std, abs=1e-10)
        assert quad.jacobian_factor == pytest.approx(closed.jacobian_factor, abs=1e-10)


def test_quadrature_with_given_derivative_equals_autograd():
    given = quadrature_stats(torch.tanh, derivative=lambda x: 1 - torch.tanh(x) ** 2)
    auto = quadrature_stats(torch.tanh)
    assert given.jacobian_factor == pytest.approx(auto.jacobian_factor, abs=1e-12)


def test_autograd_quadrature_works_under_no_grad():
    """A probe (under torch.no_grad) may be the first in its process to ask for tanh's constants."""
    with torch.no_grad():
        inside = quadrature_stats(torch.tanh)
    assert inside == quadrature_stats(torch.tanh)


def test_tanh_and_sigmoid_statistics():
    tanh = activation_stats("tanh")
    var = expect_normal(lambda x: math.tanh(x) ** 2)
    slope_sq = expect_normal(lambda x: (1 - math.tanh(x) ** 2) ** 2)
    assert tanh.mean == pytest.approx(0.0, abs=1e-12)  # odd function
    assert tanh.std == pytest.approx(math.sqrt(var), abs=1e-9)
    assert tanh.jacobian_factor == pytest.approx(math.sqrt(slope_sq / var), abs=1e-9)
    sigmoid = activation_stats("sigmoid")
    assert sigmoid.mean == pytest.approx(0.5, abs=1e-12)  # note section 3.2
    assert sigmoid.std == pytest.approx(0.2083, abs=1e-3)


def test_activation_stats_prelu_takes_a_slope_and_unknown_names_fail():
    assert activation_stats("prelu", 0.0) == relu_stats()
    with pytest.raises(ValueError, match="unknown activation"):
        activation_stats("swish")


def test_register_activation_gets_numerical_stats():
    try:
        register_activation("softplus", F.softplus, breakpoints=())
        st = activation_stats("softplus")
        mean = expect_normal(lambda x: max(x, 0.0) + math.log1p(math.exp(-abs(x))))
        assert st.mean == pytest.approx(mean, abs=1e-9)
        assert activation_stats("softplus") is st  # cached
    finally:
        ACTIVATIONS.pop("softplus", None)


def test_register_activation_refuses_to_replace_a_name_unless_told():
    before = ACTIVATIONS["tanh"]
    with pytest.raises(ValueError, match="'tanh' is already registered; pass replace=True") as exc:
        register_activation("tanh", F.softplus, breakpoints=())
    assert "\n" not in str(exc.value) and ACTIVATIONS["tanh"] is before
    try:
        register_activation("softplus-twice", F.softplus, breakpoints=())
        with pytest.raises(ValueError, match="replace=True"):
            register_activation("softplus-twice", torch.tanh, breakpoints=())
        first = activation_stats("softplus-twice")
        register_activation("softplus-twice", torch.tanh, breakpoints=(), replace=True)
        assert ACTIVATIONS["softplus-twice"].fn is torch.tanh
        assert activation_stats("softplus-twice") == activation_stats("tanh") != first  # the cache is cleared
    finally:
        ACTIVATIONS.pop("softplus-twice", None)


@pytest.mark.parametrize(
    "kwargs,arg",
    [({"fn": "relu"}, "fn"), ({"fn": None}, "fn"), ({"fn": 1.5}, "fn"),
     ({"fn": torch.tanh, "derivative": 0.0}, "derivative"), ({"fn": torch.tanh, "closed_form": "x"}, "closed_form")],
)  # fmt: skip
def test_register_activation_refuses_what_is_not_callable_at_once(kwargs, arg):
    with pytest.raises(TypeError, match=rf"{arg} must be callable"):
        register_activation("not-callable", **kwargs)
    assert "not-callable" not in ACTIVATIONS


@pytest.mark.parametrize("activation", [torch.relu, F.relu, torch.nn.ReLU(), 3])
def test_an_activation_that_is_not_a_name_says_how_to_register_one(activation):
    """Not `register_activation(<built-in method relu ...>, fn)`: a placeholder name, in a valid call."""
    from normprop_cli.nn import NormPropConv2d, NormPropLinear

    for make in (
        lambda: NormPropConv2d(3, 4, 3, activation=activation),
        lambda: NormPropLinear(3, 4, activation=activation),
    ):
        with pytest.raises(ValueError, match="activation must be a registered name") as exc:
            make()
        message = str(exc.value)
        assert 'register_activation("name", fn)' in message
        assert all(f"{name}," in message or f"{name})" in message for name in ("relu", "sigmoid", "tanh"))
        assert "\n" not in message and "<" not in message and "0x" not in message


def test_prelu_stats_is_differentiable_in_the_slope():
    def stats(a):
        st = prelu_stats(a)
        return torch.stack([st.mean, st.std, st.jacobian_factor])

    for a in (-0.7, 0.25, 1.8):
        slope = torch.tensor(a, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(stats, (slope,))


def test_maxpool_of_k_normals():
    assert maxpool_stats(1) == pytest.approx((0.0, 1.0), abs=1e-12)
    assert maxpool_stats(2).mean == pytest.approx(1 / math.sqrt(math.pi), abs=1e-10)
    assert maxpool_stats(2).std == pytest.approx(math.sqrt(1 - 1 / math.pi), abs=1e-10)
    assert maxpool_stats(4) == pytest.approx((1.0294, 0.7010), abs=2e-3)  # 2x2, the note
    assert maxpool_stats(9) == pytest.approx((1.4850, 0.5978), abs=2e-3)  # 3x3, the note


def test_avgpool_of_k_normals():
    assert avgpool_stats(4) == (0.0, 0.5)
    assert avgpool_stats(9).std == pytest.approx(1 / 3)


def test_dropout_scale_note_section_5():
    p = 0.8
    d = dropout_scale(p)
    assert d.masked_std == pytest.approx(math.sqrt(p))
    assert d.masked_std * d.scale == pytest.approx(1.0)  # dividing by sqrt(p) keeps std 1
    assert d.inverted_std == pytest.approx(math.sqrt(1 / p))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200_000, generator=gen, dtype=torch.float64)
    keep = torch.rand(200_000, generator=gen, dtype=torch.float64) < p
    assert (x * keep / p).std().item() == pytest.approx(d.inverted_std, abs=0.01)
    with pytest.raises(ValueError):
        dropout_scale(0.0)
