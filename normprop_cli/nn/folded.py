"""NormProp's fast path: eq. 11 folded into one autograd function per layer (`_FoldedOp`), and
`fold`, which folds the constants of many layers in a few batched operations (NormPropLayer's
docstring in layers.py says when each road is taken). Layers are duck-typed here, so that this
module needs nothing of layers.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor


class Folded(NamedTuple):
    """One layer's eq. 11 folded (NormPropLayer docstring), per filter i."""

    scale: Tensor  # s_i = gamma_i / (f c1 ||W_i||), multiplies W_i * x
    bias: Tensor  # (beta_i - c2) / c1
    dscale: Tensor  # ds_i / dgamma_i = 1 / (f c1 ||W_i||)
    radial: Tensor  # s_i / ||W_i||^2: through ||W_i||, dL/dW_i gets -radial_i (dL/ds_i) W_i
    inv_c1: Tensor  # db_i / dbeta_i = 1 / c1


@torch.no_grad()
def fold(layers: Sequence) -> list[Folded]:
    """`Folded` of each layer (ReLU or classifier), in a few operations for all layers together."""
    norms = torch.cat([torch.linalg.vector_norm(m.weight, dim=_rows(m.weight)) for m in layers])
    consts = torch.cat([m.folded_constants(norms) for m in layers], dim=1)
    dscale = consts[0] / norms
    scale = torch.cat([m.gamma for m in layers]) * dscale
    bias = torch.addcmul(consts[2], torch.cat([m.beta for m in layers]), consts[1])
    radial = scale / (norms * norms)
    sizes = [m.gamma.numel() for m in layers]
    parts = (t.split(sizes) for t in (scale, bias, dscale, radial, consts[1]))
    return [Folded(*p) for p in zip(*parts, strict=True)]


def _rows(w: Tensor) -> tuple[int, ...]:
    return tuple(range(1, w.ndim))


class _FoldedOp(torch.autograd.Function):
    """out_i = max(s_i (W_i * x) + b_i, -c2/c1) (eq. 11 folded; no max for the classifier).

    The scale goes on the weights (W s) or, when the output is smaller than the weights (batch
    size 1, late layers), on the output. Backward, with G = dL/dW at fixed s, ds_i = dL/ds_i and
    db_i = dL/db_i: dL/dW_i = G_i - radial_i ds_i W_i, dL/dgamma_i = dscale_i ds_i,
    dL/dbeta_i = db_i / c1.

    Under bfloat16 autocast the scale always goes on the weights, which the convolution needs in
    bfloat16 anyway: W s is computed in float32 and stored in bfloat16, the one cast autocast
    would make of the weight, and b joins the convolution's float32 sum rather than a rounded
    W * x it may cancel. x is cast once (the first layer's), the convolution and the clamp run in
    bfloat16, G comes back to float32 once (autocast's cast of a weight's gradient), and the
    gradients of the float32 parameters are float32.
    """

    @staticmethod
    def forward(ctx, x, weight, gamma, beta, scale, bias, dscale, radial, inv_c1, layer):
        low = _autocast_dtype(x)  # None: float32, the ops as they always were
        if low is not None:
            x = x.to(low)
        on_output = low is None and layer.scales_output(x)
        if on_output:
            u = layer._op(x, weight, None)
            out = torch.addcmul(_channels(bias, u), u, _channels(scale, u))
        else:
            u = torch.mul(weight, _filters(scale, weight), out=_out(weight, low))
            out = layer._op(x, u, bias)  # autocast casts the bias
        if layer._floor is not None:
            out.clamp_min_(layer._floor)
        ctx.save_for_backward(x, weight, scale, dscale, radial, inv_c1, u, out)
        ctx.layer, ctx.on_output = layer, on_output
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        x, weight, scale, dscale, radial, inv_c1, u, out = ctx.saved_tensors
        layer = ctx.layer
        if layer._floor is not None:
            g = torch.ops.aten.threshold_backward(g, out, layer._floor)
        need_x = ctx.needs_input_grad[0]
        if ctx.on_output:  # u = W * x
            dims = (0, *range(2, g.ndim))
            db, ds = g.sum(dims), (g * u).sum(dims)
            gx, gw, _ = layer._op_backward(g * _channels(scale, g), x, weight, need_x, False)
        else:  # u = W s
            gx, gw, db = layer._op_backward(g, x, u, need_x, True)
            ds = (gw * weight).sum(_rows(weight))
            s = _filters(scale, weight)  # a bfloat16 G times s is float32 at once: no separate cast
            gw = gw.mul_(s) if gw.dtype == weight.dtype else torch.mul(gw, s)
        gw.addcmul_(weight, _filters(radial * ds, weight), value=-1.0)
        dbeta = db.to(inv_c1.dtype) if layer._floor is None else db * inv_c1  # the classifier: c1 = 1
        return gx, gw, dscale * ds, dbeta, None, None, None, None, None, None


def _autocast_dtype(x: Tensor) -> torch.dtype | None:
    """The dtype autocast runs a convolution in on x's device, or None outside autocast."""
    t = x.device.type
    return torch.get_autocast_dtype(t) if torch.is_autocast_enabled(t) else None


def _out(like: Tensor, dtype: torch.dtype | None) -> Tensor | None:
    """`out=` of `like`'s shape and layout in `dtype`; None (a new tensor, as usual) for None."""
    return None if dtype is None else torch.empty_like(like, dtype=dtype)


def _filters(v: Tensor, weight: Tensor) -> Tensor:
    """A per-filter vector [O] shaped to broadcast over a weight [O, ...]."""
    return v.view(-1, *(1,) * (weight.ndim - 1))


def _channels(v: Tensor, y: Tensor) -> Tensor:
    """A per-filter vector [O] shaped to broadcast over an output [N, O, ...]."""
    return v.view(-1, *(1,) * (y.ndim - 2))
