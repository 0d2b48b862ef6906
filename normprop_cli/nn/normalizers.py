"""The normalisers NormProp is compared with, each declared in the method registry (methods.py) on
the same backbone: each builds a hidden conv block (conv, normalisation, activation) and, where it
has its own, the classifier conv.

    none         no normalisation: the Glorot conv and the activation
    batchnorm    BatchNorm (Ioffe and Szegedy 2015), torch's
    batchrenorm  Batch Renormalization (Ioffe 2017): BN with r, d clipped, rmax/dmax warmed up
    weightnorm   weight normalisation (Salimans and Kingma 2016), torch's parametrization;
                 the data-dependent initialisation is `weightnorm_data_init_`
    layernorm    GroupNorm with one group (Ba et al. 2016 for conv maps: over C, H, W)
    groupnorm    GroupNorm (Wu and He 2018), 32 groups at width 1.0, scaled with the width
    ws-gn        timm's StdConv2d (weight standardisation, Qiao et al. 2019) with GroupNorm
    scaledws     timm's ScaledStdConv2d (Brock et al. 2021, NFNets) with the gain of the
                 activation, 1 / std(act(N(0, 1))); no activation normalisation

Only torch and timm are used; the one layer neither ships, Batch Renormalization, is written here, its
gradient written out (`_BatchRenormFn`). The normalisers whose layers are written out for speed are declared
beside those layers, with the blocks and helpers here: FRN and EvoNorm-S0 in fastnorm.py, Online Norm in
online.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

from .methods import register_method
from .stats import ACTIVATIONS, activation_stats

GROUPS_AT_FULL_WIDTH = 32  # Wu and He's default; the count scales with the NIN's width
# Ioffe (2017) keeps rmax = 1, dmax = 0 for 5,000 steps, then relaxes them linearly to rmax = 3 at
# 40,000 steps and dmax = 5 at 25,000: BatchRenorm2d's defaults. The NIN's runs are a few thousand
# steps at most and set their own clock (conf/model/nin.yaml `renorm`).
IOFFE = {"rmax": 3.0, "dmax": 5.0, "warmup_steps": 5000, "rmax_steps": 40000, "dmax_steps": 25000}
SCHEDULE = ("warmup", "rmax", "dmax")  # the limits' clock: <name>_steps, or <name>_epochs (renorm_in_steps)


def per_channel(t: Tensor) -> Tensor:
    """[N, C] -> [N, C, 1, 1]; [C] -> [1, C, 1, 1]."""
    return t.view(*t.shape, 1, 1) if t.ndim == 2 else t.view(1, -1, 1, 1)  # one view, not four index operators


def wide(x: Tensor) -> Tensor:
    """x in float32 or wider: under bfloat16 autocast the statistics are computed in float32."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def renorm_in_steps(renorm: dict, steps_per_epoch: int | None) -> dict:
    """Batch Renormalization's limits with a schedule given in epochs (`warmup_epochs`, `rmax_epochs`,
    `dmax_epochs`) as BatchRenorm2d takes it, in SGD steps: epochs x steps per epoch, rounded. A run
    at batch 50 and one at batch 1 then relax their limits at the same point of training, where a
    schedule in steps relaxes them 50 times sooner at batch 1 (and never starts at batch 50 when a
    run has fewer steps than the warm-up). Null values count as not given; a schedule in steps is
    returned as it is."""
    out = {k: v for k, v in renorm.items() if v is not None}  # a null key is not given
    given = [k for k in SCHEDULE if f"{k}_epochs" in out]
    if not given:
        return out
    clash = [k for k in SCHEDULE if f"{k}_steps" in out]
    if clash or len(given) != len(SCHEDULE):
        raise ValueError(
            "model.renorm gives its schedule in epochs (warmup_epochs, rmax_epochs, dmax_epochs, all three) or in "
            f"steps, not both; got {', '.join(sorted(out))}"
        )
    if not steps_per_epoch or steps_per_epoch < 1:
        raise ValueError("model.renorm's schedule in epochs needs the run's SGD steps per epoch")
    for k in SCHEDULE:
        out[f"{k}_steps"] = round(float(out.pop(f"{k}_epochs")) * steps_per_epoch)
    return out


class BatchRenorm2d(nn.BatchNorm2d):
    """Batch Renormalization (Ioffe 2017, "Batch Renormalization: Towards Reducing Minibatch Dependence in
    Batch-Normalized Models", Algorithm 1) for conv maps.

    Training:  x_hat = (x - mu_B) / sigma_B * r + d,  y = weight * x_hat + bias, with
        r = stop_grad(clip(sigma_B / sigma, 1/rmax, rmax)),  d = stop_grad(clip((mu_B - mu) / sigma, -dmax, dmax))
    where mu, sigma^2 are the running estimates (BatchNorm's buffers, updated as BatchNorm updates
    them) and sigma_B^2 the biased batch variance plus eps. With r = 1, d = 0 (rmax = 1, dmax = 0,
    the warm-up) it is BatchNorm exactly. Evaluation: BatchNorm's, the running estimates.
    The limits grow with the training steps taken (`num_batches_tracked`): rmax from 1 and dmax
    from 0 after `warmup_steps`, linearly, reaching their final values at `rmax_steps`, `dmax_steps`.
    """

    def __init__(
        self,
        num_features: int,
        rmax: float = IOFFE["rmax"],
        dmax: float = IOFFE["dmax"],
        warmup_steps: int = IOFFE["warmup_steps"],
        rmax_steps: int = IOFFE["rmax_steps"],
        dmax_steps: int = IOFFE["dmax_steps"],
        eps: float = 1e-5,
        momentum: float | None = 0.1,
    ) -> None:
        super().__init__(num_features, eps=eps, momentum=momentum)
        if rmax < 1 or dmax < 0 or warmup_steps < 0 or rmax_steps < warmup_steps or dmax_steps < warmup_steps:
            raise ValueError(
                "batch renormalisation needs rmax >= 1, dmax >= 0 and warmup_steps <= rmax_steps, dmax_steps; got "
                f"rmax={rmax}, dmax={dmax}, warmup_steps={warmup_steps}, rmax_steps={rmax_steps}, "
                f"dmax_steps={dmax_steps}"
            )
        self.rmax, self.dmax = float(rmax), float(dmax)
        self.warmup_steps, self.rmax_steps, self.dmax_steps = int(warmup_steps), int(rmax_steps), int(dmax_steps)
        # The limits' ramps as a [6, 2] table, columns (rmax, dmax), rows: the step the ramp starts from, its
        # length in steps, the limit's start and its rise; then the exponent and the sign that make the lower
        # bounds 1 / rmax and -dmax. A float64 buffer (not saved: the constructor's arguments make it), so that
        # the limits take a few operators on the module's device, no host copy, and the arguments' own values.
        # A ramp of no length is a step at warmup_steps: from warmup_steps - 1 over one step, 0 before it, 1 on.
        rows = []
        for start, final, until, power, sign in (
            (1.0, self.rmax, self.rmax_steps, -1.0, 1.0),  # r in [1 / rmax, rmax]
            (0.0, self.dmax, self.dmax_steps, 1.0, -1.0),  # d in [-dmax, dmax]
        ):
            span = until - self.warmup_steps
            first, length = (self.warmup_steps, span) if span > 0 else (self.warmup_steps - 1, 1)
            rows.append((first, length, start, final - start, power, sign))
        self.register_buffer("_ramps", torch.tensor(rows, dtype=torch.float64).T.contiguous(), persistent=False)

    def limits(self) -> tuple[Tensor, Tensor]:
        """(rmax, dmax) at the current step, as tensors on the module's device (no host read-back,
        so the step can be captured in a CUDA graph)."""
        upper = self._bounds()[0]
        return upper[0], upper[1]

    def _bounds(self) -> Tensor:
        """[[rmax, dmax], [1 / rmax, -dmax]] at the current step, [2, 2], in the running estimates' dtype,
        from `_ramps` in float64: the share of each ramp done, clamp((t - from) / length, 0, 1), gives
        start + rise x share; the lower bounds are the upper ones to the power (-1, 1) times (1, -1)."""
        ramps = self._ramps
        upper = ramps[2] + ramps[3] * ((self.num_batches_tracked - ramps[0]) / ramps[1]).clamp_(0.0, 1.0)
        return torch.stack((upper, upper.pow(ramps[4]) * ramps[5])).to(self.running_var.dtype)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return super().forward(x)
        bounds = self._bounds()
        if torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                xs = x.to(torch.promote_types(x.dtype, self.running_mean.dtype))  # bf16 autocast: statistics in float32
                return _BatchRenormFn.apply(xs, self.weight, self.bias, self, bounds).to(x.dtype)
        return _BatchRenormFn.apply(x, self.weight, self.bias, self, bounds)

    def _update_running(self, mean: Tensor, var: Tensor, n: int) -> None:
        """As nn.BatchNorm2d: exponential average (cumulative where momentum is None) of the batch
        mean and the unbiased batch variance."""
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            factor = 1.0 / self.num_batches_tracked.to(mean.dtype)
        else:  # a Python float: no tensor made from it per step (a host-to-device copy, not capturable)
            factor = float(self.momentum)
        unbiased = var * (n / max(n - 1, 1))
        self.running_mean.lerp_(mean, factor)
        self.running_var.lerp_(unbiased, factor)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, rmax={self.rmax}, dmax={self.dmax}, warmup_steps={self.warmup_steps}, "
            f"rmax_steps={self.rmax_steps}, dmax_steps={self.dmax_steps}"
        )


class _BatchRenormFn(torch.autograd.Function):
    """Batch Renorm's training step in three passes over x forward and three back, the statistics in
    two passes (var's one-pass Welford reduction is 20 times slower on the CPU), the gradient written
    out: with x_hat = (x - mu_B) / sigma_B and r, d constants, y = w (r x_hat + d) + b gives
        g_x = (w r / sigma_B) (g - mean(g) - x_hat mean(g x_hat)),  g_w = sum(g (r x_hat + d)),  g_b = sum(g)
    (means and sums over N, H, W), from the centred x, as exact as the autograd graph it replaces. The
    per-channel arithmetic around the passes is kept to few operators (r and d clipped together, views
    rather than indexing): at batch 1 a step's time is mostly operator calls."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, m: BatchRenorm2d, bounds: Tensor):
        dims = (0, 2, 3)
        mean = x.mean(dims)
        centred = x - per_channel(mean)
        var = centred.square().mean(dims)
        std = torch.add(var, m.eps).sqrt_()
        # r = clip(sigma_B / sigma, 1 / rmax, rmax) and d = clip((mu_B - mu) / sigma, -dmax, dmax) as rows of one [2, C]
        rd = torch.stack((std, mean - m.running_mean)).div_(torch.add(m.running_var, m.eps).sqrt_())
        r, d = rd.clamp_(bounds[1, :, None], bounds[0, :, None])
        m._update_running(mean, var, x.numel() // x.shape[1])
        scale = torch.mul(weight, r).div_(std)
        ctx.save_for_backward(centred, std, r, d, scale)
        return torch.addcmul(per_channel(torch.addcmul(bias, weight, d)), centred, per_channel(scale))

    @staticmethod
    def backward(ctx, grad: Tensor):
        centred, std, r, d, scale = ctx.saved_tensors
        dims = (0, 2, 3)
        g_sum = grad.sum(dims)
        g_xhat = (grad * centred).sum(dims).div_(std)  # sum(g x_hat)
        k = scale / -(grad.numel() // grad.shape[1])  # -scale / count
        gx = torch.addcmul(per_channel(k * g_sum), grad, per_channel(scale))
        gx.addcmul_(centred, per_channel((k * g_xhat).div_(std)))
        return gx, torch.addcmul(r * g_xhat, d, g_sum), g_sum, None, None


def groups_for(channels: int, width: float) -> int:
    """GroupNorm's group count: 32 at width 1.0 scaled with the width, lowered to the nearest count
    that divides `channels` (the NIN's 192, 160 and 96 filters take 32 groups at width 1.0, and
    their 48, 40 and 24 at width 0.25 take 8)."""
    target = max(1, min(channels, round(GROUPS_AT_FULL_WIDTH * float(width))))
    return next(g for g in range(target, 0, -1) if channels % g == 0)


def activation_gain(activation: str) -> float:
    """NFNets' gain gamma = 1 / std(act(X)), X ~ N(0, 1): a unit-variance pre-activation gives a
    unit-variance output (Brock et al. 2021a, section 4); c1 of Remark 1 / eq. 12."""
    return 1.0 / float(activation_stats(activation).std)


class _Elementwise(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x)


def activation_module(name: str) -> nn.Module:
    """The plain (un-normalised) activation of the baselines' blocks."""
    if name == "relu":
        return nn.ReLU(inplace=True)
    if name == "prelu":
        return nn.PReLU(num_parameters=1, init=0.25)
    return _Elementwise(ACTIVATIONS[name].fn)


class Gain(nn.Module):
    """Multiplication by a fixed gain (NFNets' scaled activation, for activations that are not
    positively homogeneous)."""

    def __init__(self, gain: float) -> None:
        super().__init__()
        self.gain = float(gain)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gain

    def extra_repr(self) -> str:
        return f"gain={self.gain:.6g}"


HOMOGENEOUS = ("relu", "prelu", "identity")  # act(g z) = g act(z) for g > 0: the gain can go on the weights


@torch.no_grad()
def weightnorm_data_init_(model: nn.Module, x: Tensor) -> None:
    """Salimans and Kingma's (2016, section 3) data-dependent initialisation, layer by layer in
    order: with t = (v * x) / ||v|| on the batch `x`, set g = 1 / std(t) and b = -mean(t) / std(t)
    per output channel, so every pre-activation starts with mean 0 and variance 1 on the batch."""
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d) and _is_weight_normed(m)]
    if not convs:
        return
    pending = list(convs)

    def hook(module, inputs, output):
        if not pending or module is not pending[0]:
            return output
        pending.pop(0)
        v = module.parametrizations.weight.original1
        w = v / v.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, 1, 1, 1)
        t = F.conv2d(inputs[0], w, None, module.stride, module.padding, module.dilation, module.groups)
        mean, std = t.mean((0, 2, 3)), t.std((0, 2, 3), unbiased=False).clamp_min(1e-6)
        module.parametrizations.weight.original0.copy_((1.0 / std).view_as(module.parametrizations.weight.original0))
        module.bias.copy_(-mean / std)
        return module._conv_forward(inputs[0], module.weight, module.bias)

    handles = [m.register_forward_hook(hook) for m in convs]
    training = model.training
    try:
        model.eval()
        model(x)
    finally:
        for h in handles:
            h.remove()
        model.train(training)


def _is_weight_normed(conv: nn.Module) -> bool:
    return hasattr(conv, "parametrizations") and "weight" in conv.parametrizations


def glorot_conv(i, o, k, s, p, bias: bool = True) -> nn.Conv2d:
    """A conv with section 4.2's initialisation (Glorot weights, zero bias), as NormProp's: every
    baseline starts from it, so that only the normalisation differs."""
    conv = nn.Conv2d(i, o, k, s, p, bias=bias)
    nn.init.xavier_uniform_(conv.weight)
    if bias:
        nn.init.zeros_(conv.bias)
    return conv


def plain_conv(i, o, k, s, p, **_) -> nn.Module:
    """The classifier of every norm without its own (and of all under `model.classifier=plain`)."""
    return glorot_conv(i, o, k, s, p)


def plain_block(i, o, k, s, p, activation="relu", **_) -> nn.Module:
    return nn.Sequential(glorot_conv(i, o, k, s, p), activation_module(activation))


def batchnorm_block(i, o, k, s, p, activation="relu", **_) -> nn.Module:
    return nn.Sequential(glorot_conv(i, o, k, s, p, bias=False), nn.BatchNorm2d(o), activation_module(activation))


def batchrenorm_block(i, o, k, s, p, activation="relu", renorm=None, **_) -> nn.Module:
    return nn.Sequential(
        glorot_conv(i, o, k, s, p, bias=False), BatchRenorm2d(o, **(renorm or {})), activation_module(activation)
    )


def weightnorm_conv(i, o, k, s, p, **_) -> nn.Module:
    """w = g v / ||v||, with v drawn as the baselines' weights (section 4.2) and g = ||v||: the net starts
    as the unnormalised one, unless `weightnorm_data_init_` (the model's data_init) then rescales it."""
    return weight_norm(glorot_conv(i, o, k, s, p, bias=True), dim=0)


def weightnorm_block(i, o, k, s, p, activation="relu", **_) -> nn.Module:
    return nn.Sequential(weightnorm_conv(i, o, k, s, p), activation_module(activation))


def layernorm_block(i, o, k, s, p, activation="relu", **_) -> nn.Module:
    return nn.Sequential(glorot_conv(i, o, k, s, p, bias=False), nn.GroupNorm(1, o), activation_module(activation))


def groupnorm_block(i, o, k, s, p, activation="relu", width=1.0, **_) -> nn.Module:
    return nn.Sequential(
        glorot_conv(i, o, k, s, p, bias=False), nn.GroupNorm(groups_for(o, width), o), activation_module(activation)
    )


def ws_gn_block(i, o, k, s, p, activation="relu", width=1.0, **_) -> nn.Module:
    from timm.layers import StdConv2d

    conv = StdConv2d(i, o, k, stride=s, padding=p, bias=False, eps=1e-5)
    return nn.Sequential(conv, nn.GroupNorm(groups_for(o, width), o), activation_module(activation))


def scaledws_block(i, o, k, s, p, activation="relu", **_) -> nn.Module:
    """ScaledStdConv2d, W_hat = gain * gamma * (W - mean(W)) / (std(W) sqrt(fan_in)), then the
    activation. For ReLU and PReLU gamma goes on the weights (timm's usage, act(gamma z) = gamma act(z));
    for the others after the activation (NFNets' act_with_gamma), where it must be."""
    from timm.layers import ScaledStdConv2d

    gamma = activation_gain(activation)
    if activation in HOMOGENEOUS:
        return nn.Sequential(ScaledStdConv2d(i, o, k, stride=s, padding=p, gamma=gamma), activation_module(activation))
    return nn.Sequential(
        ScaledStdConv2d(i, o, k, stride=s, padding=p, gamma=1.0), activation_module(activation), Gain(gamma)
    )


register_method("none", "no normalisation", block=plain_block)
register_method("batchnorm", "BatchNorm", block=batchnorm_block, batch_statistics=True)
register_method("batchrenorm", "Batch Renorm", block=batchrenorm_block, batch_statistics=True)
# as Salimans and Kingma train it: with the data-dependent initialisation
# its kernel is the direction v (`original1`); the length g (`original0`, C x 1 x 1 x 1) is a gain
register_method("weightnorm", "weight norm", block=weightnorm_block, classifier=weightnorm_conv,
                kernels=("weight", "original1"), model={"data_init": True})  # fmt: skip
register_method("layernorm", "LayerNorm", block=layernorm_block)
register_method("groupnorm", "GroupNorm", block=groupnorm_block)
register_method("ws-gn", "WS + GroupNorm", block=ws_gn_block)
# with NFNets' adaptive gradient clipping (their factor 0.01); its `gain` (C x 1 x 1 x 1) is no kernel
register_method("scaledws", "scaled WS (NF)", block=scaledws_block, train={"agc": 0.01})
