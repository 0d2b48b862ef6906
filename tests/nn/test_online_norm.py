"""Online Normalization (Chiley et al. 2019) against its equations, computed here one sample at a time,
and EvoNorm-S0: both batch-independent, both train at batch 1."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from normprop_cli.nn.online import OnlineNorm2d, evonorm_block, online_block

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
