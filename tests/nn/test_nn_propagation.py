"""Sections 3.2-3.4 at initialisation: a normalised output and Jacobian singular values ~1."""

import math

import pytest
import torch
from torch import nn

from normprop_cli.nn import NormPropLinear, relu_stats

RELU = relu_stats()


def normal_input(n=4096, d=256):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(0))


def test_one_layer_normalises_every_unit():
    torch.manual_seed(0)
    with torch.no_grad():
        out = NormPropLinear(256, 256, jacobian="off")(normal_input())
    assert out.mean(0).abs().max() < 0.1 and (out.std(0) - 1).abs().max() < 0.1


def test_jacobian_divide_scales_the_first_layer_by_1_over_1_21():
    # pre-activation ~ N(0, 1/f^2): relu(X/f) has mean c2/f and std c1/f
    torch.manual_seed(0)
    with torch.no_grad():
        out = NormPropLinear(256, 256, jacobian="divide")(normal_input())
    f = RELU.jacobian_factor
    assert out.mean().item() == pytest.approx(RELU.mean * (1 / f - 1) / RELU.std, abs=0.01)
    assert out.std().item() == pytest.approx(1 / f, abs=0.01)


def test_deep_normprop_stack_stays_normalised_while_a_plain_one_collapses():
    torch.manual_seed(0)
    x = y = normal_input()
    normprop, plain = [], []
    with torch.no_grad():
        for _ in range(20):
            x = NormPropLinear(256, 256, jacobian="off")(x)
            normprop.append((x.mean().item(), x.std().item()))
            lin = nn.Linear(256, 256)
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)
            y = torch.relu(lin(y))
            plain.append((y.mean().item(), y.std().item()))
    # exact up to the coherence of W (Prop. 1), which compounds slowly with depth
    assert all(abs(m) < 0.1 and abs(s - 1) < 0.1 for m, s in normprop[:10])
    assert all(abs(m) < 0.3 and 0.8 < s < 2.0 for m, s in normprop)
    assert plain[0][0] == pytest.approx(RELU.mean, abs=0.02)  # not centred
    assert plain[-1][1] < 0.01  # std halves in variance every layer


@pytest.mark.parametrize("jacobian, expected", [("off", 1 / RELU.std**2 / 2), ("divide", 1.0)])
def test_jacobian_singular_values_section_3_4(jacobian, expected):
    # E[J J^T] ~ E[1(u > 0)] / (f c1)^2 I: 1.47 (singular values 1.21) without f, 1 with it
    torch.manual_seed(0)
    layer = NormPropLinear(512, 64, jacobian=jacobian)
    nn.init.orthogonal_(layer.weight)  # incoherent rows, as section 3.4 assumes
    x = normal_input(256, 512)
    jac = torch.func.vmap(torch.func.jacrev(layer))(x)  # [256, 64, 512]
    jjt = torch.einsum("bij,bkj->ik", jac, jac) / len(x)
    eig = torch.linalg.eigvalsh(jjt)
    assert eig.mean().item() == pytest.approx(expected, rel=0.03)
    assert eig.min().item() > 0.8 * expected and eig.max().item() < 1.2 * expected
    if jacobian == "off":
        assert math.sqrt(eig.mean().item()) == pytest.approx(1.21, abs=0.02)
