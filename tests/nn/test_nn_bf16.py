"""The folded NormProp path under bfloat16 autocast (eq. 11 folded, `folded.fold_layers`) computes what
autocast's plain autograd form of eq. 11 computes, forward and gradients, to bfloat16 accuracy:
it is no further from eq. 11 in float64 than the plain form is, and its float32 parameters get
float32 gradients."""

import math

import pytest
import torch
import torch.nn.functional as F
from test_library import fold_node  # tests/nn is on the path (pytest rootdir-relative imports)
from test_nn_fast import randomised

from normprop_cli.nn import NIN, NormPropConv2d, NormPropLayer, NormPropLinear
from normprop_cli.nn.folded import _fold_flat
from normprop_cli.nn.layers import JACOBIAN_MODES


def rel(a, b) -> float:
    """||a - b|| / ||b||, in float64."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def rms_rel(a, b) -> float:
    """The root mean square of the tensors' relative errors."""
    return math.sqrt(sum(rel(s, t) ** 2 for s, t in zip(a, b, strict=True)) / len(a))


def plain_form(model, monkeypatch):
    """Make every NormProp layer of `model` take the plain autograd form of eq. 11."""
    for m in model.modules():
        if isinstance(m, NormPropLayer):
            monkeypatch.setattr(m, "_folded_ok", lambda x: False)


def layer_run(layer, x, amp=True):
    """Output and d/d(x, weight, gamma, beta) of <layer(x), g> for a fixed random g."""
    x = x.detach().clone().requires_grad_()
    with torch.autocast(x.device.type, torch.bfloat16, enabled=amp):
        out = layer(x)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
    return [out, *torch.autograd.grad(out, [x, layer.weight, layer.gamma, layer.beta], g)]


def nin_run(model, x, y, amp=True):
    """Logits and the gradient of every parameter of the cross-entropy, as a training step takes them."""
    with torch.autocast(x.device.type, torch.bfloat16, enabled=amp):
        logits = model(x)
    loss = F.cross_entropy(logits.to(x.dtype), y)
    return [logits, *torch.autograd.grad(loss, list(model.parameters()))]


def assert_bf16_like_plain(folded, plain, exact, out_tol):
    """Folded and plain bf16 forms: outputs within `out_tol`; gradients as far from the plain form,
    and from eq. 11 in float64 (`exact`), as the plain form is from eq. 11 (RMS over the tensors)."""
    assert rel(folded[0], plain[0]) < out_tol
    assert rel(folded[0], exact[0]) < 1.5 * rel(plain[0], exact[0]) + out_tol
    bf16_error = rms_rel(plain[1:], exact[1:])
    assert rms_rel(folded[1:], plain[1:]) < 1.5 * bf16_error + 0.01
    assert rms_rel(folded[1:], exact[1:]) < 1.5 * bf16_error + 0.01


@pytest.mark.parametrize("activation", ["relu", None])
@pytest.mark.parametrize("jacobian", JACOBIAN_MODES)
@pytest.mark.parametrize("kind", ["conv", "linear"])
def test_layer_bf16_folded_path_matches_the_plain_form(kind, jacobian, activation, monkeypatch):
    """ReLU and the classifier, every Jacobian mode, convolution (eq. 11) and linear (eq. 9)."""
    if kind == "conv":
        layer = randomised(NormPropConv2d(16, 24, 3, 1, 1, activation=activation, jacobian=jacobian))
        x = torch.randn(4, 16, 8, 8, generator=torch.Generator().manual_seed(2))
    else:
        layer = randomised(NormPropLinear(64, 48, activation=activation, jacobian=jacobian))
        x = torch.randn(16, 64, generator=torch.Generator().manual_seed(2))
    with torch.autocast("cpu", torch.bfloat16):
        assert layer._folded_ok(x)
    folded = layer_run(layer, x)
    assert fold_node(folded[0]) is not None
    assert folded[0].dtype == torch.bfloat16
    assert [t.dtype for t in folded[1:]] == [torch.float32] * 4  # x and the master weights: float32
    plain_form(layer, monkeypatch)
    plain = layer_run(layer, x)
    assert fold_node(plain[0]) is None
    exact = layer_run(layer.double(), x.double(), amp=False)
    assert_bf16_like_plain(folded, plain, exact, out_tol=1e-2)


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("jacobian", JACOBIAN_MODES)
def test_nin_bf16_folded_path_matches_the_plain_form(jacobian, batch, device, monkeypatch):
    """All nine layers folded at once, as a training step runs them, at batch 1 and 8."""
    torch.manual_seed(0)
    model = NIN(10, norm="normprop", width=0.1, jacobian=jacobian).to(device)
    x = torch.randn(batch, 3, 32, 32).to(device)
    y = torch.randint(0, 10, (batch,)).to(device)
    folded = nin_run(model, x, y)
    assert folded[0].dtype == torch.bfloat16
    assert [p.dtype for p in folded[1:]] == [torch.float32] * len(folded[1:])
    plain_form(model, monkeypatch)
    plain = nin_run(model, x, y)
    exact = nin_run(model.double(), x.double(), y, amp=False)
    assert_bf16_like_plain(folded, plain, exact, out_tol=2e-2)


def test_under_autocast_the_scale_goes_on_the_weights(monkeypatch):
    """Where float32 scales the (smaller) output, bf16 still scales the weights: the weights are
    cast for the convolution anyway, and b then joins its float32 sum (no rounded W * x to cancel)."""
    layer = randomised(NormPropConv2d(16, 24, 3, 1, 1))
    x = torch.randn(1, 16, 4, 4)
    assert layer.scales_output(x)
    on_output = layer_run(layer, x)
    monkeypatch.setattr(layer, "scales_output", lambda x: False)
    on_weights = layer_run(layer, x)
    for a, b in zip(on_output, on_weights, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_fold_stays_float32_under_autocast():
    """s_i and the bias of eq. 11 come from the float32 master weights, as outside autocast."""
    layers = [randomised(NormPropConv2d(3, 5, 3)), randomised(NormPropConv2d(5, 4, 1, activation=None), 1)]
    with torch.autocast("cpu", torch.bfloat16):
        inside = _fold_flat(layers)
    for a, b in zip(inside, _fold_flat(layers), strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_float16_autocast_takes_the_plain_form():
    layer = NormPropConv2d(4, 6, 3, padding=1)
    x = torch.randn(2, 4, 6, 6)
    with torch.autocast("cpu", torch.float16):
        assert not layer._folded_ok(x)
    with torch.autocast("cpu", torch.bfloat16):
        assert layer._folded_ok(x)
