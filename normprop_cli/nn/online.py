"""Two batch-independent normalisers for the NIN, declared in the method registry (methods.py):

    online   Online Normalization (Chiley et al., NeurIPS 2019), written out: `OnlineNorm2d`
    evonorm  EvoNorm-S0 (Liu et al. 2020), timm's `EvoNorm2dS0`

Online Normalization treats the samples of a batch as a stream, in order, and normalises each with
running statistics estimated from the samples before it, per channel (the paper's section 3; for conv
maps a sample's statistics are its spatial mean and variance, section 3.3):

    forward   y_t = (x_t - mu_{t-1}) / sigma_{t-1}
              mu_t      = a_f mu_{t-1} + (1 - a_f) E[x_t]
              sigma^2_t = a_f sigma^2_{t-1} + (1 - a_f) Var[x_t] + a_f (1 - a_f) (E[x_t] - mu_{t-1})^2

Its gradient is not the gradient of that forward: two control processes remove from the incoming
gradient its running component along y and along 1, the directions a normaliser's Jacobian projects
out (section 3.2, Algorithm 1):

    backward  g~_t  = g_t - (1 - a_b) e^y_{t-1} y_t,        e^y_t = e^y_{t-1} + E[g~_t * y_t]
              h_t   = g~_t / sigma_{t-1}
              x'_t  = h_t - (1 - a_b) e^1_{t-1},            e^1_t = e^1_{t-1} + E[x'_t]

(E: the mean over a sample's spatial positions, per channel; e^1_t = e^1_{t-1} + E[x'_t] is
e^1_t = a_b e^1_{t-1} + E[h_t], a recurrence with a constant coefficient like mu's and sigma^2's,
which are computed in closed form over the batch; e^y's coefficient changes per sample and steps).
Then the per-channel affine and, as the paper's conv nets do, layer scaling, y / sqrt(E_{C,H,W}[y^2] + eps)
per sample, which bounds the activations (its error-compensation mechanism). Defaults are the reference
implementation's: a_f = 0.999, a_b = 0.99, eps = 1e-5. Evaluation uses the running mu, sigma and changes nothing.
The statistics and both processes run in float32 or wider (bfloat16 autocast: the output in the
input's dtype).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .methods import register_method
from .normalizers import activation_module, glorot_conv, groups_for


def _recurrence(a: float, start: Tensor, inputs: Tensor) -> tuple[Tensor, Tensor]:
    """s_t = a s_{t-1} + u_t over t = 0..N-1 from s_{-1} = `start` [C], u = `inputs` [N, C], in closed
    form: (s_{t-1} for every t [N, C], s_{N-1} [C]). With powers of a < 1 only, it stays exact in
    floating point where a loop over the batch costs an operator call per sample."""
    n = inputs.shape[0]
    t = torch.arange(n + 1, device=inputs.device, dtype=inputs.dtype)
    lag = t[:, None] - 1 - t[None, :n]  # [N + 1, N]: t - 1 - k
    weights = torch.where(lag >= 0, a ** lag.clamp_min(0), torch.zeros((), dtype=inputs.dtype, device=inputs.device))
    out = (a**t)[:, None] * start[None, :] + weights @ inputs  # s_{t-1} for t = 0..N
    return out[:n], out[n]


class _OnlineNormFn(torch.autograd.Function):
    """y = (x - mu_{t-1}) / sigma_{t-1} over the stream of the batch's samples; backward by the control
    processes. `norm` is the module, whose buffers the forward's statistics and the backward's
    processes update (each once per training step)."""

    @staticmethod
    def forward(ctx, x: Tensor, norm: OnlineNorm2d) -> Tensor:
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
    def backward(ctx, grad: Tensor):
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


class OnlineNorm2d(nn.Module):
    """Online Normalization for conv maps [N, C, H, W] (module docstring): the stream's forward
    statistics (`running_mean`, `running_var`) and backward control processes (`v_ctrl` along y,
    `u_ctrl` along 1) are buffers, saved with the model; then the affine (`weight`, `bias`) and layer
    scaling (`layer_scaling`)."""

    def __init__(
        self,
        num_features: int,
        alpha_fwd: float = 0.999,
        alpha_bkw: float = 0.99,
        eps: float = 1e-5,
        layer_scaling: bool = True,
        affine: bool = True,
    ) -> None:
        super().__init__()
        if not (0 < alpha_fwd < 1 and 0 < alpha_bkw < 1):
            raise ValueError(f"online normalisation needs 0 < alpha < 1; got {alpha_fwd=}, {alpha_bkw=}")
        self.num_features, self.eps, self.layer_scaling = int(num_features), float(eps), bool(layer_scaling)
        self.alpha_fwd, self.alpha_bkw = float(alpha_fwd), float(alpha_bkw)
        for name, value in (("running_mean", 0.0), ("running_var", 1.0), ("u_ctrl", 0.0), ("v_ctrl", 0.0)):
            self.register_buffer(name, torch.full((num_features,), value))
        self.weight = nn.Parameter(torch.ones(num_features)) if affine else None
        self.bias = nn.Parameter(torch.zeros(num_features)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):
            xs = x.to(torch.promote_types(x.dtype, torch.float32))  # bfloat16 autocast: the statistics in float32
            if self.training:
                y = _OnlineNormFn.apply(xs, self)
            else:
                std = (self.running_var + self.eps).sqrt()
                y = (xs - self.running_mean[None, :, None, None]) / std[None, :, None, None]
            if self.weight is not None:
                y = y * self.weight[None, :, None, None] + self.bias[None, :, None, None]
            if self.layer_scaling:
                y = y * (y.square().mean((1, 2, 3), keepdim=True) + self.eps).rsqrt()
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, alpha_fwd={self.alpha_fwd}, alpha_bkw={self.alpha_bkw}, eps={self.eps}, "
            f"layer_scaling={self.layer_scaling}"
        )


def online_block(i, o, k, s, p, activation="relu", **_) -> nn.Module:
    return nn.Sequential(glorot_conv(i, o, k, s, p, bias=False), OnlineNorm2d(o), activation_module(activation))


def evonorm_block(i, o, k, s, p, activation="relu", width=1.0, **_) -> nn.Module:
    """conv, then EvoNorm-S0: x * sigmoid(v x) / group_std(x) * gamma + beta, with GroupNorm's group
    count; no batch statistics, and its own nonlinearity (so it takes activation='relu' only, nominally)."""
    from timm.layers import EvoNorm2dS0

    if activation != "relu":
        raise ValueError(f"evonorm carries its own nonlinearity (x sigmoid(v x)); got activation={activation!r}")
    return nn.Sequential(
        glorot_conv(i, o, k, s, p, bias=False), EvoNorm2dS0(o, groups=groups_for(o, width), apply_act=True)
    )


register_method("evonorm", "EvoNorm-S0", block=evonorm_block, activations=("relu",))  # it carries its own
register_method("online", "Online Norm", block=online_block)
