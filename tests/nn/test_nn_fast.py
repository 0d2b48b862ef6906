"""The fast path of NormProp layers (eq. 11 folded, the weight-side work of many layers in one autograd node)
computes the reference eq. 11 (`reference_forward`), forward and gradients, to float tolerance."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from normprop_cli.nn import NIN, NormPropConv2d, NormPropLayer, NormPropLinear, reference_forward
from normprop_cli.nn.folded import _fold_flat, fold_layers


def randomised(layer, seed=0):
    """Filters of unequal norms, gamma away from 1, beta away from 0: every term of eq. 11 shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        layer.weight.mul_(
            torch.rand(layer.weight.shape[0], generator=g).add(0.5).view(-1, *[1] * (layer.weight.ndim - 1)) * 3
        )
        layer.gamma.copy_(torch.rand(layer.gamma.shape, generator=g) + 0.5)
        layer.beta.copy_(torch.randn(layer.beta.shape, generator=g) * 0.5)
    return layer


def grads(fn, x, layer):
    x = x.detach().clone().requires_grad_()
    out = fn(x)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    params = [layer.weight, layer.gamma, layer.beta]
    return out, torch.autograd.grad(out, [x, *params], g)


def assert_matches_reference(layer, x, rtol, atol):
    fast_out, fast_grads = grads(layer, x, layer)
    ref_out, ref_grads = grads(lambda t: reference_forward(layer, t), x, layer)
    torch.testing.assert_close(fast_out, ref_out, rtol=rtol, atol=atol)
    for name, a, b in zip(("x", "weight", "gamma", "beta"), fast_grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.parametrize("on_output", [False, True])
@pytest.mark.parametrize("activation", ["relu", None])
@pytest.mark.parametrize("jacobian", ["divide", "init", "off"])
@pytest.mark.parametrize("conv", [(3, 1, 1), (5, 2, 2), (1, 1, 0)])
def test_conv_fast_path_equals_eq_11_in_float64(on_output, activation, jacobian, conv, monkeypatch):
    k, stride, pad = conv
    layer = randomised(NormPropConv2d(4, 6, k, stride, pad, activation=activation, jacobian=jacobian)).double()
    monkeypatch.setattr(layer, "scales_output", lambda x: on_output)
    x = torch.randn(3, 4, 7, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    assert layer._folded_ok(x)
    assert_matches_reference(layer, x, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("on_output", [False, True])
@pytest.mark.parametrize("activation", ["relu", None])
def test_linear_fast_path_equals_eq_9(on_output, activation, monkeypatch):
    layer = randomised(NormPropLinear(7, 5, activation=activation)).double()
    monkeypatch.setattr(layer, "scales_output", lambda x: on_output)
    x = torch.randn(4, 7, dtype=torch.float64)
    assert_matches_reference(layer, x, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("batch", [1, 2, 9])
def test_float32_fast_path_is_eq_11_to_float_tolerance(batch):
    """Sides chosen by size: batch 1 scales the output of this layer, batch 9 the weights."""
    layer = randomised(NormPropConv2d(16, 32, 5, 1, 0))
    x = torch.randn(batch, 16, 8, 8)
    assert layer.scales_output(x) == (batch * 32 * 16 < layer.weight.numel())
    assert_matches_reference(layer, x, rtol=1e-4, atol=1e-5)


def test_channels_last_input_gives_the_same_numbers():
    layer = randomised(NormPropConv2d(8, 12, 3, 1, 1))
    x = torch.randn(4, 8, 9, 9)
    plain_out, plain_grads = grads(layer, x, layer)
    layer = layer.to(memory_format=torch.channels_last)
    cl_out, cl_grads = grads(layer, x.contiguous(memory_format=torch.channels_last), layer)
    torch.testing.assert_close(cl_out, plain_out, rtol=1e-5, atol=1e-5)
    for a, b in zip(cl_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def reference_nin(model, x):
    """The NIN with every NormProp layer computed by `reference_forward`, one layer at a time."""
    for layer in model.features:
        x = reference_forward(layer, x) if isinstance(layer, NormPropLayer) else layer(x)
    return x.flatten(1)


@pytest.mark.parametrize("batch", [1, 3])
def test_nin_folds_all_layers_at_once_and_equals_eq_11(batch):
    torch.manual_seed(0)
    model = NIN(10, norm="normprop", width=0.1).double()
    for layer in model.hidden_layers():
        randomised(layer)
    x = torch.randn(batch, 3, 32, 32, dtype=torch.float64)
    params = list(model.parameters())
    fast = model(x)
    fast_grads = torch.autograd.grad(fast.square().sum(), params)
    ref = reference_nin(model, x)
    ref_grads = torch.autograd.grad(ref.square().sum(), params)
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-10)
    for a, b in zip(fast_grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_fold_of_many_layers_equals_fold_of_each():
    layers = [
        randomised(NormPropConv2d(3, 5, 3)),
        randomised(NormPropConv2d(5, 4, 1, activation=None), 1),
    ]
    together = _fold_flat(layers)  # each field: the layers' vectors end to end
    alone = [_fold_flat([layer]) for layer in layers]
    for field, parts in zip(together, zip(*alone, strict=True), strict=True):
        torch.testing.assert_close(field, torch.cat(parts), rtol=0, atol=0)


def test_inference_mode_and_eval_give_the_training_forward():
    model = NIN(10, norm="normprop", width=0.1)
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():  # first: the constants cached here must serve training too
        infer = model.eval()(x)
    train = model.train()(x)
    train.sum().backward()
    torch.testing.assert_close(infer, train.detach(), rtol=0, atol=0)


def test_bf16_autocast_folds_and_other_activations_take_the_autograd_path():
    """Issue 13: bfloat16 autocast takes the folded path too (tests/nn/test_nn_bf16.py)."""
    layer = randomised(NormPropConv2d(4, 6, 3, padding=1))
    x = torch.randn(2, 4, 6, 6)
    with torch.autocast("cpu", torch.bfloat16):
        assert layer._folded_ok(x)
        out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference_forward(layer, x), rtol=5e-2, atol=5e-2)
    assert not NormPropConv2d(4, 6, 3, activation="tanh")._folded_ok(x)


def test_the_first_layer_gets_no_input_gradient_work():
    """The input of the first layer needs no gradient; the backward then returns none for it."""
    layer = NormPropConv2d(3, 4, 3)
    x = torch.randn(2, 3, 5, 5)
    layer(x).sum().backward()
    assert x.grad is None and layer.weight.grad is not None


def test_gradients_accumulate_like_any_module():
    layer = randomised(NormPropConv2d(3, 4, 3))
    x = torch.randn(2, 3, 5, 5)
    layer(x).sum().backward()
    once = layer.weight.grad.clone()
    layer(x).sum().backward()
    torch.testing.assert_close(layer.weight.grad, 2 * once)
    assert isinstance(layer, nn.Module)


@pytest.mark.parametrize("on_output", [False, True])
@pytest.mark.parametrize("activation", ["relu", None, "tanh"])
def test_dilated_grouped_conv_equals_eq_11_in_float64(on_output, activation, monkeypatch):
    """nn.Conv2d's dilation and groups, through the written-out backward (relu, classifier) and autograd."""
    layer = NormPropConv2d(4, 6, 3, (2, 1), (2, 1), dilation=(2, 1), groups=2, activation=activation)
    layer = randomised(layer).double()
    assert layer.weight.shape == (6, 2, 3, 3)
    monkeypatch.setattr(layer, "scales_output", lambda x: on_output)
    x = torch.randn(3, 4, 9, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    expected = F.conv2d(x, layer.weight, None, (2, 1), (2, 1), (2, 1), 2)
    assert layer._op(x, layer.weight, None).shape == expected.shape
    assert layer._out_numel(x) == expected.numel()
    assert_matches_reference(layer, x, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("batch", [1, 4])
def test_batched_fold_equals_each_layer_folded_alone_in_float64(batch):
    """NIN folds its nine layers in one autograd node (`fold_layers`); each layer called on its own folds
    alone. Forward and every gradient agree, on both roads (batch 1 scales some outputs)."""
    torch.manual_seed(0)
    model = NIN(10, norm="normprop", width=0.25).double()
    for i, layer in enumerate(model.hidden_layers()):
        randomised(layer, i)
    x = torch.randn(batch, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    params = list(model.parameters())
    together = model(x)
    together_grads = torch.autograd.grad(together.square().sum(), params)
    alone, roads = x, []
    for m in model.features:  # no NIN.forward: each NormProp layer folds alone
        if isinstance(m, NormPropLayer):
            roads.append(m._road(alone))
        alone = m(alone)
    alone = alone.flatten(1)
    alone_grads = torch.autograd.grad(alone.square().sum(), params)
    assert model._roads(x) == tuple(roads) and any(roads) and not all(roads)
    torch.testing.assert_close(together, alone, rtol=1e-12, atol=1e-12)
    for a, b in zip(together_grads, alone_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_choosing_the_roads_calls_no_module_so_hooks_see_only_real_inputs():
    """The roads come from the geometry, not from a pass on stand-in tensors: a probe's hooks on every
    module (here the plain classifier of the normalizers experiment too) see the real batch alone."""
    model = NIN(10, norm="normprop", width=0.1, classifier="plain")
    seen = []
    for m in model.features:
        m.register_forward_pre_hook(lambda mod, inputs: seen.append(inputs[0].device.type))
    model(torch.randn(1, 3, 32, 32))
    assert seen == ["cpu"] * len(model.features)


@pytest.mark.parametrize("on_output", [False, True])
def test_fold_backward_takes_gradients_of_any_strides(on_output):
    """Autograd may hand a backward its gradients with any strides: the fold's backward, which writes a
    contiguous dL/du_i in place, gives for an expanded gradient and a transposed one what it gives for the
    same numbers stored contiguously, and writes into neither."""
    layers = [randomised(NormPropConv2d(3, 5, 3)).double(), randomised(NormPropConv2d(5, 4, 1), 1).double()]
    params = [p for m in layers for p in (m.weight, m.gamma, m.beta)]
    gen = torch.Generator().manual_seed(5)
    dense = torch.randn(4, 5, 1, 1, dtype=torch.float64, generator=gen)
    strided = dense.view(4, 5).t().contiguous().t().view(4, 5, 1, 1)  # the same numbers, column-major
    expanded = torch.full((), 0.7, dtype=torch.float64).expand(5, 3, 3, 3)
    assert not strided.is_contiguous() and not expanded.is_contiguous()
    rest = [torch.randn(k, dtype=torch.float64, generator=gen) for k in (5, 4, 5, 4)]

    def gradients(*upstream):
        (u1, s1, b1, _), (u2, s2, b2, _) = fold_layers(layers, [on_output, on_output])
        return torch.autograd.grad([u1, u2, s1, s2, b1, b2], params, [*upstream, *rest])

    expected = gradients(expanded.contiguous(), dense.clone())
    kept = [strided.clone(), expanded.clone()]
    got = gradients(expanded, strided)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for a, b in zip((strided, expanded), kept, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("large", [True, False])
def test_the_folded_clamp_gives_thresholds_gradient_bit_for_bit_and_keeps_no_copy_of_large_inputs(large, monkeypatch):
    """floor_ (eq. 11's max(., -c2/c1) in place) against torch's threshold, values exactly at the floor
    included: the same output and gradient, bit for bit; for an output of FLOOR_MIN_NUMEL elements or more
    (here: the threshold lowered to 0), no clone of its input for the backward."""
    from torch.profiler import profile

    from normprop_cli.nn import folded
    from normprop_cli.nn.folded import floor_

    if large:
        monkeypatch.setattr(folded, "FLOOR_MIN_NUMEL", 0)
    torch.manual_seed(0)
    w = torch.randn(8, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    x = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    x[1] = 0.0  # a conv output of exactly 0: at the floor below, where threshold's gradient is 0
    floor = 0.0
    g = torch.randn(4, 8, 6, 6, dtype=torch.float64)
    ref_out = F.threshold(F.conv2d(x, w), floor, floor)
    (ref,) = torch.autograd.grad(ref_out, w, g)
    out = F.conv2d(x, w)
    with profile() as prof:
        out = floor_(out, floor)
    (new,) = torch.autograd.grad(out, w, g)
    assert torch.equal(out, ref_out) and torch.equal(new, ref)
    copies = [e for e in prof.key_averages() if e.key in ("aten::clone", "aten::copy_")]
    assert bool(copies) is not large
    with torch.no_grad():
        plain = floor_(F.conv2d(x, w), floor)
    assert torch.equal(plain, ref_out) and plain.grad_fn is None
