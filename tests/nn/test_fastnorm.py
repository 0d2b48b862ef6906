"""The fast forms of FRN + TLU, EvoNorm-S0 and Batch Renormalization against the forms they replace:
timm's FilterResponseNormTlu2d and EvoNorm2dS0, and Batch Renorm's former eager forward (copied below),
within 1e-6 in float32, forward and backward, over consecutive steps, at batch 1 and 50: the largest
difference at most 1e-6 times the tensor's largest magnitude (float32 resolves 6e-8 of it; two orders of
the same arithmetic differ by a few of those)."""

import pytest
import torch
from timm.layers import EvoNorm2dS0 as TimmEvoNorm
from timm.layers import FilterResponseNormTlu2d as TimmFrn
from torch import Tensor

from normprop_cli.nn.fastnorm import EvoNorm2dS0, FilterResponseNormTlu2d, group_stats
from normprop_cli.nn.normalizers import BatchRenorm2d

FORMATS = [torch.contiguous_format, torch.channels_last]
TOL = 1e-6


def assert_near(actual: Tensor, expected: Tensor, tol: float = TOL, what: str = "") -> None:
    scale = expected.abs().max().clamp_min(1.0).item()
    diff = (actual - expected).abs().max().item()
    assert diff <= tol * scale, f"{what}: {diff:.3g} > {tol:g} x {scale:.3g}"


def images(n, c, dtype=torch.float32, fmt=torch.contiguous_format, seed=0) -> Tensor:
    """Conv-like maps with a zero corner (a patch of zeros after a ReLU): FRN's TLU then ties z = tau."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, 7, 6, generator=g, dtype=dtype) * 1.5 + 0.3
    x[:, :, :2, :2] = 0
    return x.contiguous(memory_format=fmt)


def compare(reference, fast, x, grad):
    """Forward, input gradient and every parameter's gradient of two modules with the same parameters."""
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = reference(xa), fast(xb)
    assert_near(yb, ya, what="output")
    ya.backward(grad), yb.backward(grad)
    assert_near(xb.grad, xa.grad, what="input gradient")
    for (name, pa), (_, pb) in zip(reference.named_parameters(), fast.named_parameters(), strict=True):
        assert_near(pb.grad, pa.grad, what=f"{name}'s gradient")
    assert yb.is_contiguous(memory_format=x_format(x))


def x_format(x):
    return torch.channels_last if not x.is_contiguous() else torch.contiguous_format


def same_parameters(reference, fast, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for (na, pa), (nb, pb) in zip(reference.named_parameters(), fast.named_parameters(), strict=True):
            assert na == nb and pa.shape == pb.shape
            pa.copy_(torch.rand(pa.shape, generator=g) + 0.5), pb.copy_(pa)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n", [1, 50])
def test_frn_tlu_equals_timms(n, fmt):
    ref, fast = TimmFrn(8), FilterResponseNormTlu2d(8)
    same_parameters(ref, fast, seed=n)
    with torch.no_grad():  # bias 0, tau 0: the zero corner ties z = tau, where max splits its gradient
        for m in (ref, fast):
            m.bias.zero_(), m.tau.zero_()
    x = images(n, 8, fmt=fmt, seed=n)
    assert (fast(x) == 0).any()
    compare(ref, fast, x, images(n, 8, fmt=fmt, seed=n + 1))


@pytest.mark.parametrize("fmt", FORMATS)
def test_frn_tlu_without_gradient_computes_the_same_numbers(fmt):
    """Evaluation (no_grad) skips the passes that save max's gradient split, and gives the same output."""
    fast = FilterResponseNormTlu2d(8)
    same_parameters(TimmFrn(8), fast, seed=3)
    x = images(50, 8, fmt=fmt, seed=3)
    trained = fast(x.clone().requires_grad_())
    with torch.no_grad():
        scored = fast(x)
    assert trained.grad_fn is not None and scored.grad_fn is None
    assert torch.equal(scored, trained.detach()) and scored.is_contiguous(memory_format=fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n", [1, 50])
@pytest.mark.parametrize("groups", [1, 4, 8])
def test_evonorm_s0_equals_timms(n, fmt, groups):
    ref, fast = TimmEvoNorm(8, groups=groups, apply_act=True), EvoNorm2dS0(8, groups=groups)
    same_parameters(ref, fast, seed=n + groups)
    compare(ref, fast, images(n, 8, fmt=fmt, seed=n), images(n, 8, fmt=fmt, seed=n + 1))


def test_group_statistics_in_float64():
    """The group's variance from its channels' means and variances is the variance over the group."""
    x = images(3, 8, dtype=torch.float64)
    mean, sd = group_stats(x, 4, 1e-5)
    flat = x.reshape(3, 4, -1)
    torch.testing.assert_close(mean, flat.mean(2), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sd, (flat.var(2, unbiased=False) + 1e-5).sqrt(), rtol=1e-12, atol=1e-12)


def test_the_fast_layers_train_under_bfloat16_autocast_with_float32_statistics():
    x = images(4, 8).to(torch.bfloat16).requires_grad_()
    for m in (FilterResponseNormTlu2d(8), EvoNorm2dS0(8, groups=4)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(x)
        assert y.dtype == torch.bfloat16
        y.float().sum().backward()
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in m.parameters())


def former_batchrenorm_forward(m: BatchRenorm2d, x: Tensor) -> Tensor:
    """Batch Renorm's eager training forward before it ran on torch's fused batch norm."""
    rmax, dmax = m.limits()
    dims = (0, 2, 3)
    mean, var = x.mean(dims), x.var(dims, unbiased=False)
    std = (var + m.eps).sqrt()
    with torch.no_grad():
        running_std = (m.running_var + m.eps).sqrt()
        r = torch.minimum(torch.maximum(std / running_std, 1.0 / rmax), rmax)
        d = torch.minimum(torch.maximum((mean - m.running_mean) / running_std, -dmax), dmax)
        m._update_running(mean, var, x.numel() // x.shape[1])
    scale = m.weight * r / std
    shift = m.bias + m.weight * (d - r * mean / std)
    return x * scale[None, :, None, None] + shift[None, :, None, None]


class FormerBatchRenorm(BatchRenorm2d):
    def forward(self, x):
        return former_batchrenorm_forward(self, x) if self.training else super().forward(x)


def run_steps(module: BatchRenorm2d, n: int, fmt, dtype) -> list[tuple[Tensor, ...]]:
    """4 training steps whose running estimates carry: (output, input gradient, weight's and bias's
    gradients, running mean and variance) after each, in float64."""
    out = []
    for step in range(4):
        x = (images(n, 8, fmt=fmt, seed=10 * step) * (1 + step) + step).to(dtype).requires_grad_()
        y = module(x)
        y.backward(images(n, 8, fmt=fmt, seed=10 * step + 1).to(dtype))
        got = (y, x.grad, module.weight.grad, module.bias.grad, module.running_mean, module.running_var)
        out.append(tuple(t.detach().double().clone() for t in got))
        module.zero_grad()
    return out


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n", [1, 50])
def test_batchrenorm_on_fused_batch_norm_equals_its_former_form(n, fmt):
    """Past the warm-up, r and d clipped, over 4 steps whose running estimates carry (at batch 1 the
    statistics are one image's): the two forms agree within 1e-6 in float32 and 1e-12 in float64, and
    the float32 forms lie within 1e-6 of the float64 result."""
    kw = {"rmax": 1.5, "dmax": 0.5, "warmup_steps": 1, "rmax_steps": 3, "dmax_steps": 2}
    made = {}
    for form, cls in (("former", FormerBatchRenorm), ("fused", BatchRenorm2d)):
        for dtype in (torch.float32, torch.float64):
            m = cls(8, **kw).to(dtype)
            with torch.no_grad():
                m.weight.copy_(torch.linspace(0.5, 1.5, 8)), m.bias.copy_(torch.linspace(-0.3, 0.4, 8))
            made[form, dtype] = run_steps(m, n, fmt, dtype)
            assert m.limits()[0] > 1
    names = ("output", "input gradient", "weight's gradient", "bias's gradient", "running mean", "running var")
    for step, truth in enumerate(made["former", torch.float64]):
        for name, a, b in zip(names, made["fused", torch.float64][step], truth, strict=True):
            assert_near(a, b, tol=1e-12, what=f"float64 step {step}: {name}")
        former = made["former", torch.float32][step]
        for name, a, b, c in zip(names, made["fused", torch.float32][step], former, truth, strict=True):
            assert_near(a, b, what=f"float32 step {step}: {name}")
            assert_near(a, c, what=f"float32 against float64, step {step}: {name}")
