"""Online Normalization (Chiley et al. 2019) against its equations, computed here one sample at a time,
and EvoNorm-S0: both batch-independent, both train at batch 1."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from normprop_cli.nn.fastnorm import evonorm_block
from normprop_cli.nn.online import (
    OnlineNorm2d,
    _linear_scan,
    _OnlineNormFn,
    _recurrence,
    online_block,
)

A_F, A_B, EPS = 0.999, 0.99, 1e-5


def stream_forward(x, mu, var):
    """The paper's forward, sample by sample: y_t from the statistics before it, then the update."""
    ys, scales = [], []
    for t in range(x.shape[0]):
        m, v = x[t].mean((1, 2)), x[t].var((1, 2), unbiased=False)
        scale = (var + EPS).sqrt()
        ys.append((x[t] - mu[:, None, None]) / scale[:, None, None])
        scales.append(scale)
        var = A_F * var + (1 - A_F) * v + A_F * (1 - A_F) * (m - mu) ** 2
        mu = A_F * mu + (1 - A_F) * m
    return torch.stack(ys), torch.stack(scales), mu, var


def stream_backward(grad, y, scales, u, v):
    """The control processes, sample by sample: remove the running component along y, scale, remove
    the running component along 1."""
    out = []
    for t in range(grad.shape[0]):
        g = grad[t] - (1 - A_B) * v[:, None, None] * y[t]
        v = v + (g * y[t]).mean((1, 2))
        g = g / scales[t][:, None, None]
        g = g - (1 - A_B) * u[:, None, None]
        u = u + g.mean((1, 2))
        out.append(g)
    return torch.stack(out), u, v


def test_forward_statistics_and_backward_control_follow_the_paper_over_a_stream_of_batches():
    torch.manual_seed(0)
    norm = OnlineNorm2d(3, layer_scaling=False, affine=False).double()
    mu, var, u, v = torch.zeros(3).double(), torch.ones(3).double(), torch.zeros(3).double(), torch.zeros(3).double()
    for batch in (1, 4, 7, 1, 3):
        x = (2.0 * torch.randn(batch, 3, 5, 5) + torch.tensor([1.0, -2.0, 0.5])[:, None, None]).double()
        x.requires_grad_(True)
        grad = torch.randn(batch, 3, 5, 5).double()
        y = norm(x)
        y.backward(grad)
        want_y, scales, mu, var = stream_forward(x.detach(), mu, var)
        want_grad, u, v = stream_backward(grad, want_y, scales, u, v)
        assert torch.allclose(y, want_y, atol=1e-12)
        assert torch.allclose(x.grad, want_grad, atol=1e-12)
        for buffer, want in ((norm.running_mean, mu), (norm.running_var, var), (norm.u_ctrl, u), (norm.v_ctrl, v)):
            assert torch.allclose(buffer, want, atol=1e-12)
    assert (norm.u_ctrl.abs() > 0).all() and (norm.v_ctrl.abs() > 0).all()  # the processes did move


def test_the_control_removes_the_gradients_mean_in_the_long_run():
    """A constant incoming gradient: the integral control drives the mean of the outgoing one to 0."""
    torch.manual_seed(4)
    norm = OnlineNorm2d(2, layer_scaling=False, affine=False).double()
    means = []
    for _ in range(1500):
        x = torch.randn(1, 2, 4, 4).double().requires_grad_(True)
        norm(x).backward(torch.ones(1, 2, 4, 4).double())
        means.append(float(x.grad.mean()))
    assert abs(means[0]) > 0.9 and abs(means[-1]) < 0.01


def test_evaluation_uses_the_running_estimates_and_changes_nothing():
    torch.manual_seed(1)
    norm = OnlineNorm2d(4)
    norm(torch.randn(6, 4, 3, 3) + 3.0)
    norm.eval()
    before = {k: b.clone() for k, b in norm.named_buffers()}
    x = torch.randn(5, 4, 3, 3)
    alone = torch.cat([norm(x[i : i + 1]) for i in range(5)])
    assert torch.allclose(norm(x), alone, atol=1e-6)  # no sample depends on another
    assert all(torch.equal(before[k], b) for k, b in norm.named_buffers())
    again = OnlineNorm2d(4).eval()
    again.load_state_dict(norm.state_dict())
    assert torch.equal(again(x), norm(x))


def test_evonorm_s0_output_of_a_sample_does_not_depend_on_the_batch():
    torch.manual_seed(2)
    block = evonorm_block(3, 16, 3, 1, 1, width=0.5)
    x = torch.randn(4, 3, 8, 8)
    for mode in (block.train, block.eval):
        mode()
        assert torch.allclose(block(x), torch.cat([block(x[i : i + 1]) for i in range(4)]), atol=1e-6)
    with pytest.raises(ValueError, match="own nonlinearity"):
        evonorm_block(3, 16, 3, 1, 1, activation="tanh")


@pytest.mark.parametrize("make", [online_block, evonorm_block])
def test_both_blocks_train_at_batch_1_in_float32_and_bfloat16(make):
    torch.manual_seed(3)
    net = nn.Sequential(make(1, 8, 3, 1, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(16, 1, 8, 8)
    y = (x[:, 0, :4].mean((1, 2)) > x[:, 0, 4:].mean((1, 2))).long()  # top half brighter than bottom
    x = x + 0.5 * (2 * y - 1)[:, None, None, None] * torch.cat([torch.ones(4, 8), -torch.ones(4, 8)])

    def loss():
        with torch.no_grad():
            return float(sum(F.cross_entropy(net(x[i : i + 1]), y[i : i + 1]) for i in range(16)))

    first = loss()
    for step in range(96):
        i = step % 16
        out = F.cross_entropy(net(x[i : i + 1]), y[i : i + 1])
        opt.zero_grad()
        out.backward()
        opt.step()
    assert loss() < 0.8 * first
    with torch.autocast("cpu", torch.bfloat16):
        out = net(x[:2])
    out.float().sum().backward()
    assert out.dtype == torch.bfloat16 and all(torch.isfinite(p.grad).all() for p in net.parameters())


class LoopOnlineNormFn(torch.autograd.Function):
    """The previous `_OnlineNormFn`, kept as the reference: e^y's control process by a loop over the samples."""

    @staticmethod
    def forward(ctx, x, norm):
        a = norm.alpha_fwd
        mean = x.mean((2, 3))  # [N, C]
        var = x.var((2, 3), unbiased=False)
        mu_prev, mu = _recurrence(a, norm.running_mean, (1 - a) * mean)
        excess = (1 - a) * var + a * (1 - a) * (mean - mu_prev) ** 2
        var_prev, sigma2 = _recurrence(a, norm.running_var, excess)
        std_prev = (var_prev + norm.eps).sqrt()
        norm.running_mean.copy_(mu)
        norm.running_var.copy_(sigma2)
        y = (x - mu_prev[:, :, None, None]) / std_prev[:, :, None, None]
        ctx.save_for_backward(y, std_prev)
        ctx.norm = norm
        return y

    @staticmethod
    def backward(ctx, grad):
        y, std_prev = ctx.saved_tensors
        norm = ctx.norm
        k = 1 - norm.alpha_bkw
        q, r = (y * y).mean((2, 3)), (grad * y).mean((2, 3))  # [N, C]
        e_y, before = norm.v_ctrl.clone(), []
        for t in range(y.shape[0]):  # e^y_t = e^y_{t-1} + E[(g_t - k e^y_{t-1} y_t) y_t]: a coefficient per sample
            before.append(e_y)
            e_y = e_y + r[t] - k * e_y * q[t]
        e_y_prev = torch.stack(before)
        h = (grad - k * e_y_prev[:, :, None, None] * y) / std_prev[:, :, None, None]
        e_1_prev, e_1 = _recurrence(norm.alpha_bkw, norm.u_ctrl, h.mean((2, 3)))  # e^1_t = a_b e^1_{t-1} + E[h_t]
        norm.v_ctrl.copy_(e_y)
        norm.u_ctrl.copy_(e_1)
        return h - k * e_1_prev[:, :, None, None], None


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("batch", [1, 50])
def test_the_scanned_function_equals_the_loop_over_the_samples(dtype, tol, memory_format, batch):
    """Output, input gradient and the four buffers, over consecutive steps (the buffers carry), against
    the previous implementation; the output and the gradient keep the input's memory format, whatever
    the incoming gradient's."""
    torch.manual_seed(5)
    new, old = OnlineNorm2d(6).to(dtype), OnlineNorm2d(6).to(dtype)
    shift = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0, -0.5], dtype=dtype)[:, None, None]
    for step in range(4):
        x = (1.5 * torch.randn(batch, 6, 7, 5, dtype=dtype) + shift).contiguous(memory_format=memory_format)
        grad_format = memory_format if step % 2 == 0 else torch.contiguous_format  # and channels_last's x alone
        grad = torch.randn(batch, 6, 7, 5, dtype=dtype).contiguous(memory_format=grad_format)
        x.requires_grad_(True)
        y = _OnlineNormFn.apply(x, new)
        (dx,) = torch.autograd.grad(y, x, grad)
        want_y = LoopOnlineNormFn.apply(x, old)
        (want_dx,) = torch.autograd.grad(want_y, x, grad)
        torch.testing.assert_close(y, want_y, rtol=tol, atol=tol)
        torch.testing.assert_close(dx, want_dx, rtol=tol, atol=tol)
        for name, buffer in new.named_buffers():
            torch.testing.assert_close(buffer, dict(old.named_buffers())[name], rtol=tol, atol=tol)
        assert y.is_contiguous(memory_format=memory_format) and dx.is_contiguous(memory_format=memory_format)
    assert (new.u_ctrl.abs() > 0).all() and (new.v_ctrl.abs() > 0).all()


class LoopOnlineNorm2d(OnlineNorm2d):
    """The previous layer: the loop's Function, then the affine and the layer scaling by autograd ops."""

    def forward(self, x):
        y = LoopOnlineNormFn.apply(x, self)
        if self.weight is not None:
            y = y * self.weight[None, :, None, None] + self.bias[None, :, None, None]
        if self.layer_scaling:
            y = y * (y.square().mean((1, 2, 3), keepdim=True) + self.eps).rsqrt()
        return y


@pytest.mark.parametrize("layer_scaling, affine", [(True, True), (False, True), (True, False), (False, False)])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("batch", [1, 50])
def test_the_layer_with_affine_and_layer_scaling_equals_the_previous_one(
    dtype, tol, memory_format, batch, layer_scaling, affine
):
    """Output, gradients of input, weight and bias, and buffers, over consecutive steps (the weight with
    a zero, negative and large entries, the incoming gradient in either memory format), against the
    affine and the layer scaling by autograd ops after the previous Function."""
    torch.manual_seed(7)
    new, old = (
        cls(6, layer_scaling=layer_scaling, affine=affine).to(dtype) for cls in (OnlineNorm2d, LoopOnlineNorm2d)
    )
    if affine:
        with torch.no_grad():
            for norm in (new, old):
                norm.weight.copy_(torch.tensor([-1.5, -0.4, 0.0, 0.6, 1.3, 2.5]))
                norm.bias.copy_(torch.linspace(0.5, -1.0, 6))
    params = (new.weight, new.bias) if affine else ()
    for step in range(4):
        x = (2.0 * torch.randn(batch, 6, 6, 6, dtype=dtype) - 1.0).contiguous(memory_format=memory_format)
        grad_format = memory_format if step % 2 == 0 else torch.contiguous_format
        grad = torch.randn(batch, 6, 6, 6, dtype=dtype).contiguous(memory_format=grad_format)
        results = []
        for norm in (new, old):
            xi = x.clone().requires_grad_(True)
            y = norm(xi)
            wanted = (xi, norm.weight, norm.bias) if affine else (xi,)
            results.append((y, *torch.autograd.grad(y, wanted, grad), *norm.buffers()))
        (y, dx, *rest), (want_y, want_dx, *want_rest) = results
        n = len(params)
        for got, want in zip((y, dx, *rest[n:]), (want_y, want_dx, *want_rest[n:]), strict=True):
            torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        # the parameters' gradients sum N H W terms, each with its own rounding: errors grow as its root
        for got, want in zip(rest[:n], want_rest[:n], strict=True):
            torch.testing.assert_close(got, want, rtol=tol, atol=tol * (batch * 36) ** 0.5)
        assert y.is_contiguous(memory_format=memory_format) and dx.is_contiguous(memory_format=memory_format)
    live = new.weight != 0 if affine else slice(None)  # w = 0: no gradient reaches the processes
    assert (new.u_ctrl[live].abs() > 0).all() and (new.v_ctrl[live].abs() > 0).all()


def test_the_layer_under_bfloat16_autocast_computes_in_float32_and_keeps_the_input_format():
    """bfloat16 input: the float32 layer's output and gradients, each rounded once to bfloat16."""
    torch.manual_seed(8)
    new, ref = OnlineNorm2d(5), OnlineNorm2d(5)
    with torch.no_grad():
        for norm in (new, ref):
            norm.weight.copy_(torch.linspace(-1.0, 2.0, 5))
            norm.bias.copy_(torch.linspace(0.5, -0.5, 5))
    x = (torch.randn(4, 5, 6, 6) + 1.0).bfloat16().contiguous(memory_format=torch.channels_last)
    grad = torch.randn(4, 5, 6, 6).bfloat16()
    x.requires_grad_(True)
    with torch.autocast("cpu", torch.bfloat16):
        y = new(x)
    (dx, dw) = torch.autograd.grad(y, (x, new.weight), grad)
    xf = x.detach().float().requires_grad_(True)
    want_y = ref(xf)
    (want_dx, want_dw) = torch.autograd.grad(want_y, (xf, ref.weight), grad.float())
    assert y.dtype == dx.dtype == torch.bfloat16 and dw.dtype == torch.float32
    assert y.is_contiguous(memory_format=torch.channels_last) and dx.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, want_y.bfloat16(), rtol=0, atol=0)
    torch.testing.assert_close(dx, want_dx.bfloat16(), rtol=0, atol=0)
    torch.testing.assert_close(dw, want_dw, rtol=0, atol=0)
    for name, buffer in new.named_buffers():
        torch.testing.assert_close(buffer, dict(ref.named_buffers())[name], rtol=0, atol=0)


def test_without_the_input_gradient_the_parameters_get_theirs_and_the_control_does_not_move():
    """As when the control processes ran in a Function of x alone: a constant input updates only the
    forward statistics."""
    torch.manual_seed(9)
    new, old = OnlineNorm2d(4).double(), LoopOnlineNorm2d(4).double()
    x, grad = torch.randn(3, 4, 5, 5).double(), torch.randn(3, 4, 5, 5).double()
    got, want = (torch.autograd.grad(norm(x), (norm.weight, norm.bias), grad) for norm in (new, old))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert not new.u_ctrl.any() and not new.v_ctrl.any()
    torch.testing.assert_close(new.running_var, old.running_var, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 50])
def test_the_linear_scan_follows_the_recurrence_with_any_coefficient(n):
    torch.manual_seed(6)
    coef = 1.5 * torch.randn(n, 5, dtype=torch.float64)
    coef[::3, 0] = 0.0  # zero coefficients (the chain restarts there)
    coef[:, 1] = -0.9  # negative
    coef[1::2, 2] = -1.1
    inputs, start = torch.randn(n, 5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    prev, last = _linear_scan(coef, inputs, start)
    want, s = [], start
    for t in range(n):
        want.append(s)
        s = coef[t] * s + inputs[t]
    torch.testing.assert_close(prev, torch.stack(want), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(last, s, rtol=1e-12, atol=1e-12)
