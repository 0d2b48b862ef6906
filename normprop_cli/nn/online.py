"""Online Normalization (Chiley et al., NeurIPS 2019) for the NIN, written out (`OnlineNorm2d`) and declared in
the method registry (methods.py) as `online`: a batch-independent normaliser, as EvoNorm-S0 (fastnorm.py) is.

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
which are computed in closed form over the batch; e^y_t = (1 - (1 - a_b) E[y_t^2]) e^y_{t-1} + E[g_t y_t]
has a coefficient per sample, and runs as a doubling scan over the batch, in log2(N) steps on [N, C]).
Then the per-channel affine z = w y + b and, as the paper's conv nets do, layer scaling per sample,
out = s_t z with s_t = (E_{C,H,W}[z^2] + eps)^(-1/2), which bounds the activations (its error-compensation
mechanism). In training all of it is one Function with its gradient written out: for the incoming g,

    dL/dz = s_t (g - s_t^2 E_{C,H,W}[g z] z),   dL/dw = sum_{N,H,W} dL/dz y,   dL/db = sum_{N,H,W} dL/dz,

and dL/dy = w dL/dz enters the control processes as g_t above. The samples' moments come from the forward's
statistics (E[y_t] and E[y_t^2] from the mean and variance of x_t; E_{C,H,W}[z^2] from them and w, b), so
out = s_t (w (x - mu_{t-1}) / sigma_{t-1} + b) is written in one pass over x, and the backward writes g x and
reduces it and g for E[g_t x_t] and E[g_t] (E[g z] and all the rest follow per sample and channel), then writes
x' = A g + B x + C in two fused ops: a training step makes 9 passes over [N, C, H, W] tensors. Defaults are the
reference implementation's: a_f = 0.999, a_b = 0.99, eps = 1e-5. Evaluation uses the running mu, sigma and
changes nothing (the affine and the layer scaling by autograd ops there).
The statistics and both processes run in float32 or wider (bfloat16 autocast: the output in the
input's dtype).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .methods import register_method
from .normalizers import activation_module, glorot_conv, per_channel, wide


def _recurrence(a: float, start: Tensor, inputs: Tensor) -> tuple[Tensor, Tensor]:
    """s_t = a s_{t-1} + u_t over t = 0..N-1 from s_{-1} = `start` [C], u = `inputs` [N, C], in closed
    form: (s_{t-1} for every t [N, C], s_{N-1} [C]). With powers of a < 1 only, it stays exact in
    floating point where a loop over the batch costs an operator call per sample. One sample (batch 1):
    (start, a start + u_0) in three operators, the closed form's numbers (a^0 = 1, a^1 = a), s_{-1} a copy
    (callers overwrite `start`, a buffer, with s_{N-1})."""
    n = inputs.shape[0]
    if n == 1:
        return start[None].clone(), start * a + inputs[0]
    t = torch.arange(n + 1, device=inputs.device, dtype=inputs.dtype)
    lag = t[:, None] - 1 - t[None, :n]  # [N + 1, N]: t - 1 - k
    weights = torch.where(lag >= 0, a ** lag.clamp_min(0), torch.zeros((), dtype=inputs.dtype, device=inputs.device))
    out = (a**t)[:, None] * start[None, :] + weights @ inputs  # s_{t-1} for t = 0..N
    return out[:n], out[n]


def _linear_scan(coef: Tensor, inputs: Tensor, start: Tensor) -> tuple[Tensor, Tensor]:
    """s_t = c_t s_{t-1} + u_t over t = 0..N-1 from s_{-1} = `start` [C], c = `coef` and u = `inputs`
    [N, C]: (s_{t-1} for every t [N, C], s_{N-1} [C]), as `_recurrence` but with a coefficient per step.
    A doubling (Hillis-Steele) scan of the affine maps s -> c s + u: after the step of offset d, (c_t, u_t)
    is the map from s_{t-2d} to s_t, composed from those at t and t - d; the map at 0 takes in the start,
    (c_0, u_0) -> (0, c_0 s_{-1} + u_0), so a map that reaches back to it is (0, s_t), and after ceil(log2 N)
    steps all do. Products and sums only, no division: any c_t, 0 or negative. One sample: the map at 0 alone
    (s_{-1} a copy, as `_recurrence`'s)."""
    n = inputs.shape[0]
    if n == 1:
        return start[None].clone(), torch.addcmul(inputs[0], coef[0], start)
    c = torch.cat([torch.zeros_like(coef[:1]), coef[1:]])
    u = torch.cat([torch.addcmul(inputs[:1], coef[:1], start[None]), inputs[1:]])
    d = 1
    while d < n:
        u = torch.cat([u[:d], torch.addcmul(u[d:], c[d:], u[:-d])])
        if 2 * d < n:
            c = torch.cat([c[:d], c[d:] * c[:-d]])
        d *= 2
    return torch.cat([start[None], u[:-1]]), u[-1]


class _OnlineNormFn(torch.autograd.Function):
    """The training step: y = (x - mu_{t-1}) / sigma_{t-1} over the stream of the batch's samples, then
    z = w y + b and out = s_t z (module docstring), with the gradient written out and the control
    processes. `norm` is the module, whose buffers the forward's statistics and the backward's processes
    update (each once per training step); `weight` and `bias` None: no affine; `scaling` False: s_t = 1.
    out is an affine map of x per (sample, channel), written in one pass; the forward saves x and [N, C]
    tensors (the y-moments and the coefficients), and the backward writes x' = A g + B x + C, with A, B, C
    per (sample, channel) from E[g] and E[g x]. Each direction allocates one big tensor, its result, in the
    input's memory format. The reductions are sums / (H W): the CPU's mean over (2, 3) is the slower kernel."""

    @staticmethod
    def forward(ctx, x: Tensor, norm: OnlineNorm2d, weight=None, bias=None, scaling: bool = False) -> Tensor:
        a, hw = norm.alpha_fwd, x.shape[2] * x.shape[3]
        mean = x.sum((2, 3)) / hw  # [N, C]; the variance in two passes: the CPU's var_mean over (2, 3) is slower
        # (x - mean)^2 in one fused op (bitwise (x - mean).square_()), x's memory format; out is written over it
        buf = F.mse_loss(x, per_channel(mean).expand_as(x), reduction="none")
        var = buf.sum((2, 3)) / hw
        mu_prev, mu = _recurrence(a, norm.running_mean, (1 - a) * mean)
        centred = mean - mu_prev
        excess = (1 - a) * var + a * (1 - a) * centred**2
        var_prev, sigma2 = _recurrence(a, norm.running_var, excess)
        inv = (var_prev + norm.eps).rsqrt()
        norm.running_mean.copy_(mu)
        norm.running_var.copy_(sigma2)
        y_mean = centred * inv  # E[y_t]
        y_sq = (var + centred**2) / (var_prev + norm.eps)  # E[y_t^2]
        w, b = (1.0, 0.0) if weight is None else (weight, bias)
        scale = inv * w  # out = scale (x - mu_{t-1}) + b, times s_t
        shift = b - scale * mu_prev
        s = None
        if scaling:  # E_{C,H,W}[z^2] = mean_C(w^2 Var[y] + (w E[y] + b)^2), two terms >= 0
            z_sq = ((scale * scale) * var + (w * y_mean + b) ** 2).mean(1, keepdim=True)
            s = (z_sq + norm.eps).rsqrt()  # [N, 1]
            scale, shift = scale * s, shift * s
        out = torch.addcmul(per_channel(shift), x, per_channel(scale), out=buf)
        ctx.save_for_backward(x, mu_prev, inv, y_mean, y_sq, s, weight, bias)
        ctx.norm = norm
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, mu_prev, inv, y_mean, y_sq, s, weight, bias = ctx.saved_tensors
        norm, hw = ctx.norm, x.shape[2] * x.shape[3]
        k = 1 - norm.alpha_bkw
        out = torch.mul(grad, x, out=torch.empty_like(x))  # x's memory format; x' is written over it
        g_mean = grad.sum((2, 3)) / hw  # [N, C]
        gy_mean = (out.sum((2, 3)) / hw - mu_prev * g_mean) * inv  # E[g y], y = (x - mu_{t-1}) / sigma_{t-1}
        w, b = (1.0, 0.0) if weight is None else (weight, bias)
        # dL/dz = s (g - s^2 E_{C,H,W}[g z] z) = s g + t z, t = -s^3 E_{C,H,W}[g z], per sample
        if s is None:
            t, dz_mean, dzy_mean = 0.0, g_mean, gy_mean
        else:
            t = -(s**3) * (w * gy_mean + b * g_mean).mean(1, keepdim=True)  # [N, 1]
            dz_mean = s * g_mean + t * (w * y_mean + b)  # E[dL/dz]
            dzy_mean = s * gy_mean + t * (w * y_sq + b * y_mean)  # E[dL/dz y]
        dw = hw * dzy_mean.sum(0) if weight is not None and ctx.needs_input_grad[2] else None
        db = hw * dz_mean.sum(0) if bias is not None and ctx.needs_input_grad[3] else None
        if not ctx.needs_input_grad[0]:
            return None, None, dw, db, None
        # the control processes take dL/dy = w dL/dz as the layer without affine takes g:
        # e^y_t = e^y_{t-1} + E[(g_t - k e^y_{t-1} y_t) y_t] = (1 - k E[y_t^2]) e^y_{t-1} + E[g_t y_t]
        e_y_prev, e_y = _linear_scan(1 - k * y_sq, w * dzy_mean, norm.v_ctrl)
        coef_y = -k * e_y_prev * inv  # h_t = g_t / sigma_{t-1} + coef_y y_t
        h_mean = w * dz_mean * inv + coef_y * y_mean
        e_1_prev, e_1 = _recurrence(norm.alpha_bkw, norm.u_ctrl, h_mean)  # e^1_t = a_b e^1_{t-1} + E[h_t]
        norm.v_ctrl.copy_(e_y)
        norm.u_ctrl.copy_(e_1)
        # x' = h - k e^1_{t-1} with g_t = w (s g + t (w y + b)), y = inv (x - mu_{t-1}): A g + B x + C
        coef_g = inv * w if s is None else inv * w * s
        coef_x = (inv * w * w * t + coef_y) * inv
        const = inv * w * b * t - k * e_1_prev - coef_x * mu_prev
        torch.addcmul(per_channel(const), x, per_channel(coef_x), out=out)
        return out.addcmul_(grad, per_channel(coef_g)), None, dw, db, None


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
            xs = wide(x)  # bfloat16 autocast: the statistics in float32
            if self.training:  # the normaliser, the affine and the layer scaling in one Function
                y = _OnlineNormFn.apply(xs, self, self.weight, self.bias, self.layer_scaling)
            else:  # evaluation: the running mu and sigma, then the affine and the layer scaling by autograd
                std = (self.running_var + self.eps).sqrt()
                y = (xs - self.running_mean[None, :, None, None]) / std[None, :, None, None]
                if self.weight is not None:
                    y = y * self.weight[None, :, None, None] + self.bias[None, :, None, None]
                if self.layer_scaling:
                    # sum / n is mean's own arithmetic, but mean's backward writes a contiguous gradient
                    # (slow under channels_last) where sum's stays a broadcast
                    y = y * (y.square().sum((1, 2, 3), keepdim=True) / y.shape[1:].numel() + self.eps).rsqrt()
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, alpha_fwd={self.alpha_fwd}, alpha_bkw={self.alpha_bkw}, eps={self.eps}, "
            f"layer_scaling={self.layer_scaling}"
        )


def online_block(i, o, k, s, p, activation="relu", **_) -> nn.Module:
    return nn.Sequential(glorot_conv(i, o, k, s, p, bias=False), OnlineNorm2d(o), activation_module(activation))


register_method("online", "Online Norm", block=online_block)
