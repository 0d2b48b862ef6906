"""Filter response normalisation with its TLU, and EvoNorm-S0, each one autograd Function with its
gradient written out: the same numbers as timm's `FilterResponseNormTlu2d` and `EvoNorm2dS0` (tests
hold them to 1e-6 in float32), in fewer passes over the activations. timm's eager forms chain a dozen
elementwise operators, each a pass over an [N, C, H, W] map forward and another backward, and
broadcast their statistics by materialising them at full size. Here the statistics are [N, C]
reductions, every full-size pass is one fused operator (addcmul), and a pass whose input is the
Function's own temporary writes over it in place, for the same numbers bit for bit as writing every
pass into a new tensor (docs/performance.md has the measured steps).

    FRN + TLU (Singh and Krishnan 2020), per image n and channel c:
        s = (mean_HW(x^2) + eps)^(-1/2),  z = w x s + b,  y = max(z, tau)
        dz/dx: g_x = w s (g_z - x s^2 mean_HW(g_z x))
        max's gradient as torch.maximum gives it: all to z where z > tau, all to tau where z < tau,
        half to each where they tie (a zero patch after a TLU gives z = 0 = tau at initialisation)

    EvoNorm-S0 (Liu et al. 2020), per image n, channel c and group G of GroupNorm's channels:
        sd = (var_{G,H,W}(x) + eps)^(1/2),  y = x sigmoid(v x) w / sd + b
        the group's variance combines its channels' means and variances exactly (Chan et al.);
        d sd / dx = (x - mean_G) / (M sd), M = |G| H W

Both compute in float32 or wider (bfloat16 autocast: the output in the input's dtype), and keep the
input's memory format (channels_last on the CPU). Each is declared in the method registry here, beside its
layer (`frn`, `evonorm`), its block built from normalizers.py's Glorot conv and group count.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .methods import register_method
from .normalizers import glorot_conv, groups_for, per_channel, wide

HW = (2, 3)


def _frn(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(z = w x s + b, s = (mean_HW(x^2) + eps)^(-1/2) [N, C])."""
    s = (x.square().mean(HW) + eps).rsqrt()
    return torch.addcmul(per_channel(bias), x, per_channel(weight * s)), s


class _FrnTluFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, tau: Tensor, eps: float) -> Tensor:
        z, s = _frn(x, weight, bias, eps)
        # z's share of max(z, tau)'s gradient: 1, 1/2 or 0
        share = torch.sub(z, per_channel(tau)).sign_().add_(1).mul_(0.5)
        ctx.save_for_backward(x, s, weight, share)
        return z.clamp_(min=per_channel(tau))  # max(z, tau), over z (nothing else holds it)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, s, weight, share = ctx.saved_tensors
        gz = grad * share
        gb = gz.sum((0, 2, 3))
        gtau = grad.sum((0, 2, 3)) - gb
        p = (gz * x).sum(HW)  # [N, C]: sum_HW(g_z x)
        gw = (p * s).sum(0)
        n = x.shape[2] * x.shape[3]
        # over g_z, this backward's own
        gx = gz.mul_(per_channel(weight * s)).addcmul_(x, per_channel(-weight * s.pow(3) * p / n))
        return gx, gw, gb, gtau, None


class FilterResponseNormTlu2d(nn.Module):
    """timm's `FilterResponseNormTlu2d` (same parameters: weight, bias, tau; eps 1e-5), fused."""

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.num_features, self.eps = int(num_features), float(eps)
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.tau = nn.Parameter(torch.zeros(num_features))

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):
            if torch.is_grad_enabled():
                y = _FrnTluFn.apply(wide(x), self.weight, self.bias, self.tau, self.eps)
            else:  # no backward (evaluation): max(z, tau) without the passes that save its gradient's split
                y = torch.maximum(_frn(wide(x), self.weight, self.bias, self.eps)[0], per_channel(self.tau))
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}"


def group_stats(x: Tensor, groups: int, eps: float) -> tuple[Tensor, Tensor]:
    """Per image and group: (mean, sd = sqrt(biased variance + eps)), each [N, groups]. Each channel's
    variance is the mean of its centred squares (two passes: var_mean's one-pass Welford reduction
    over H, W is the slower kernel on the CPU); the group's is the mean of its channels' variances plus
    the variance of their means (equal counts per channel)."""
    mean_c = x.mean(HW)  # [N, C]
    var_c = (x - per_channel(mean_c)).square_().mean(HW)
    n = x.shape[0]
    mean_c, var_c = mean_c.view(n, groups, -1), var_c.view(n, groups, -1)
    mean = mean_c.mean(2)
    var = var_c.mean(2) + (mean_c - mean[:, :, None]).square().mean(2)
    return mean, (var + eps).sqrt()


class _EvoNormS0Fn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, v: Tensor, groups: int, eps: float) -> Tensor:
        mean, sd = group_stats(x, groups, eps)
        per = x.shape[1] // groups
        sd_c = sd.repeat_interleave(per, 1)  # [N, C]
        sig = torch.mul(x, per_channel(v)).sigmoid_()
        u = x * sig
        ctx.save_for_backward(x, sig, u, weight, v, mean, sd)
        ctx.groups = groups
        return torch.addcmul(per_channel(bias), u, per_channel(weight / sd_c))

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, sig, u, weight, v, mean, sd = ctx.saved_tensors
        groups = ctx.groups
        n, c = x.shape[:2]
        per, m = c // groups, (c // groups) * x.shape[2] * x.shape[3]
        sd_c = sd.repeat_interleave(per, 1)
        gb = grad.sum((0, 2, 3))
        buf = grad * u
        p = buf.sum(HW)  # [N, C]
        gw = (p / sd_c).sum(0)
        gu_sig = torch.mul(grad, per_channel(weight / sd_c), out=buf).mul_(sig)  # g_u sig(v x), over g u
        xw1 = torch.rsub(sig, 1).mul_(gu_sig).mul_(x)  # d(x sigmoid(v x))/dv = x^2 sig (1 - sig)
        # through sd: g_sd [N, G] = -sum_{c in G} p w / sd^2; g_x += g_sd (x - mean_G) / (M sd)
        g_sd = -(p * weight).view(n, groups, per).sum(2) / sd.square()
        beta = (g_sd / (m * sd)).repeat_interleave(per, 1)
        shift = -(beta * mean.repeat_interleave(per, 1))
        gx = gu_sig.addcmul_(xw1, per_channel(v))  # d(x sig(v x))/dx = sig + v x sig (1 - sig), over g_u sig
        gx.addcmul_(x, per_channel(beta)).add_(per_channel(shift))
        gv = xw1.mul_(x).sum((0, 2, 3))  # over xw1, which gx no longer needs
        return gx, gw, gb, gv, None, None


class EvoNorm2dS0(nn.Module):
    """timm's `EvoNorm2dS0` with apply_act (same parameters: weight, bias, v; eps 1e-5), fused."""

    def __init__(self, num_features: int, groups: int = 32, eps: float = 1e-5) -> None:
        super().__init__()
        if num_features % groups:
            raise ValueError(f"EvoNorm-S0 needs groups dividing the channels; got {num_features} and {groups}")
        self.num_features, self.groups, self.eps = int(num_features), int(groups), float(eps)
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.v = nn.Parameter(torch.ones(num_features))

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):
            y = _EvoNormS0Fn.apply(wide(x), self.weight, self.bias, self.v, self.groups, self.eps)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_features}, groups={self.groups}, eps={self.eps}"


def frn_block(i, o, k, s, p, activation="relu", **_) -> nn.Module:
    if activation != "relu":
        raise ValueError(
            f"frn ends in its own activation (TLU, a learnt-threshold ReLU); got activation={activation!r}"
        )
    return nn.Sequential(glorot_conv(i, o, k, s, p, bias=False), FilterResponseNormTlu2d(o))


def evonorm_block(i, o, k, s, p, activation="relu", width=1.0, **_) -> nn.Module:
    """conv, then EvoNorm-S0: x * sigmoid(v x) / group_std(x) * gamma + beta, with GroupNorm's group
    count; no batch statistics, and its own nonlinearity (so it takes activation='relu' only, nominally)."""
    if activation != "relu":
        raise ValueError(f"evonorm carries its own nonlinearity (x sigmoid(v x)); got activation={activation!r}")
    return nn.Sequential(glorot_conv(i, o, k, s, p, bias=False), EvoNorm2dS0(o, groups=groups_for(o, width)))


register_method("frn", "FRN + TLU", block=frn_block, activations=("relu",))  # its TLU is the activation
register_method("evonorm", "EvoNorm-S0", block=evonorm_block, activations=("relu",))  # it carries its own
