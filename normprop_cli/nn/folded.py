"""NormProp's fast path: eq. 11 folded into the weights of each layer, the weight-side work of many
layers batched into one autograd node (`_FoldAll`), whose `_fold_flat` folds the constants of many
layers in a few batched operations (NormPropLayer's docstring in layers.py says when this road is
taken). Layers are duck-typed here, so that this module needs nothing of layers.py.

Per layer i, with s_i = gamma_i / (f c1 ||W_i||) and b_i = (beta_i - c2) / c1 (c1 = 1, c2 = 0 for
the classifier), `fold_layers(layers, roads)` gives what the layer's convolution takes:

    weights road  u_i = W_i s_i (one batched multiply for all such layers), then conv(x, u_i) + b_i
    output road   u_i = W_i itself and s_i, then conv(x, W_i) s_i + b_i (the scale on the smaller
                  output: batch size 1, wide late layers; float32 only)

The convolution, the clamp of the ReLU and the output's scale are PyTorch's own operations, so
that their backward is autograd's. `_FoldAll`'s backward gets every layer's G_i = dL/du_i,
dL/ds_i (output road) and dL/db_i at once and, in a few batched operations for all layers:

    ds_i = sum_rows(G_i W_i) (weights road)         dL/dgamma_i = ds_i / (f c1 ||W_i||)
    dL/dW_i = G_i s_i - (s_i / ||W_i||^2) ds_i W_i    dL/dbeta_i = dL/db_i / c1
    (output road: G_i is already dL/dW_i at fixed s_i, so no s_i factor)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from .fused import fused_fold, takes_fused, takes_triton


class Folded(NamedTuple):
    """Eq. 11 folded (NormPropLayer docstring), per filter i of the layers, end to end."""

    scale: Tensor  # s_i = gamma_i / (f c1 ||W_i||), multiplies W_i * x
    bias: Tensor  # (beta_i - c2) / c1
    dscale: Tensor  # ds_i / dgamma_i = 1 / (f c1 ||W_i||)
    radial: Tensor  # s_i / ||W_i||^2: through ||W_i||, dL/dW_i gets -radial_i (dL/ds_i) W_i
    inv_c1: Tensor  # db_i / dbeta_i = 1 / c1


@torch.no_grad()
def _fold_flat(layers: Sequence) -> Folded:
    """`Folded` of all `layers` together, each field the layers' vectors end to end."""
    norms = torch.cat([torch.linalg.vector_norm(m.weight, dim=_rows(m.weight)) for m in layers])
    consts = torch.cat([m.folded_constants(norms) for m in layers], dim=1)
    dscale = consts[0] / norms
    scale = torch.cat([m.gamma for m in layers]) * dscale
    bias = torch.addcmul(consts[2], torch.cat([m.beta for m in layers]), consts[1])
    radial = scale / (norms * norms)
    return Folded(scale, bias, dscale, radial, consts[1])


def fold_layers(layers: Sequence, roads: Sequence[bool]) -> list[tuple[Tensor, Tensor | None, Tensor, bool]]:
    """(u_i, s_i, b_i, output road) for each layer, what its convolution takes (module docstring);
    `roads[i]`: whether layer i scales its output rather than its weights. One autograd node for all. Where
    fused.takes_triton or fused.takes_fused says so (CUDA), that road instead: every layer on its weights, in fewer
    kernels (triton_fold.py, fused.py)."""
    if takes_triton([m.weight for m in layers] + [m.gamma for m in layers] + [m.beta for m in layers]):
        from .triton_fold import fold  # Triton, imported where its road is taken

        return fold(layers)
    if takes_fused([m.weight for m in layers]):
        return fused_fold(layers)
    n = len(layers)
    params = [m.weight for m in layers] + [m.gamma for m in layers] + [m.beta for m in layers]
    out = _FoldAll.apply(layers, tuple(roads), *params)
    return list(zip(out[:n], out[n : 2 * n], out[2 * n :], roads, strict=True))


class _FoldAll(torch.autograd.Function):
    """(W_i, gamma_i, beta_i) of every layer -> (u_i, s_i, b_i) of every layer (module docstring).

    Under bfloat16 autocast every layer takes the weights road: u_i = W_i s_i is computed in float32
    from the float32 master weights, and the convolution casts it (autocast's one cast of a weight);
    G_i comes back in float32 through that cast, and the gradients of the float32 parameters are float32.
    """

    @staticmethod
    def forward(ctx, layers, roads, *params):
        ctx.set_materialize_grads(False)
        n = len(layers)
        weights = params[:n]
        flat = _fold_flat(layers)
        sizes = [m.gamma.numel() for m in layers]
        scales, biases = flat.scale.split(sizes), flat.bias.split(sizes)
        on_w = [i for i in range(n) if not roads[i]]
        shaped = _per_filter(flat.scale, sizes, weights)
        products = iter(_foreach_mul([weights[i] for i in on_w], [shaped[i] for i in on_w]))
        us = [
            w.view_as(w) if road else next(products) for w, road in zip(weights, roads, strict=True)
        ]  # output road: W_i
        ctx.save_for_backward(*weights, flat.scale, flat.dscale, flat.radial, flat.inv_c1)
        ctx.roads, ctx.sizes = roads, sizes
        return (*us, *scales, *biases)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        n, roads, sizes = len(ctx.sizes), ctx.roads, ctx.sizes
        *weights, scale, dscale, radial, inv_c1 = ctx.saved_tensors
        gu = [_writable(g, w) for g, w in zip(grads[:n], weights, strict=True)]  # written in place below
        on_w = [i for i in range(n) if not roads[i]]
        ds = [grads[n + i] for i in range(n)]  # the output road's dL/ds_i; the weights road's below
        products = _foreach_mul([gu[i] for i in on_w], [weights[i] for i in on_w])
        for i, p in zip(on_w, products, strict=True):
            ds[i] = p.sum(_rows(p))
        ds = torch.cat([d if d is not None else scale.new_zeros(k) for d, k in zip(ds, sizes, strict=True)])
        db = torch.cat([g if g is not None else scale.new_zeros(k) for g, k in zip(grads[2 * n :], sizes, strict=True)])
        if on_w:
            scales = _per_filter(scale, sizes, weights)
            torch._foreach_mul_([gu[i] for i in on_w], [scales[i] for i in on_w])
        torch._foreach_addcmul_(gu, weights, _per_filter(radial * ds, sizes, weights), value=-1.0)
        return None, None, *gu, *(dscale * ds).split(sizes), *(db * inv_c1).split(sizes)


FLOOR_MIN_NUMEL = 1 << 16  # outputs from this size on take _Floor; smaller ones, torch's threshold_


def floor_(out: Tensor, floor: float, copy_free: bool = False) -> Tensor:
    """max(out, floor) in place: eq. 11's clamp of the ReLU, folded (-c2/c1). Where autograd records it for an
    output of FLOOR_MIN_NUMEL elements or more, its backward reads the result, not the input: result > floor
    exactly where input > floor, so the gradient is threshold's, bit for bit, and autograd keeps no copy of the
    input, which torch's in-place threshold_ saves (a copy of the layer's output per step). Below that size
    the copy costs less than a Python autograd node, and threshold_ is used: the same numbers either way.
    `copy_free`: _Floor at every size (fused.py's road: on CUDA the copy is a kernel, the Python node is not)."""
    if (copy_free or out.numel() >= FLOOR_MIN_NUMEL) and out.requires_grad and torch.is_grad_enabled():
        return _Floor.apply(out, floor)
    return torch.threshold_(out, floor, floor)


class _Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, floor):
        torch.threshold_(out, floor, floor)
        ctx.mark_dirty(out)
        ctx.save_for_backward(out)
        ctx.floor = floor
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (result,) = ctx.saved_tensors
        return torch.ops.aten.threshold_backward(grad, result, ctx.floor), None


def _writable(g: Tensor | None, w: Tensor) -> Tensor:
    """dL/du_i for the backward to write in place: g itself where it is contiguous (the NIN's: its
    convolutions' fresh weight gradients, which nothing else holds), else a copy in w's layout, since
    autograd may hand a backward gradients of any strides (an expanded one, where u_i was summed);
    zeros where u_i got no gradient."""
    if g is None:
        return torch.zeros_like(w)
    if g.is_contiguous() or (g.ndim == 4 and g.is_contiguous(memory_format=torch.channels_last)):
        return g
    return torch.empty_like(w).copy_(g)


def _per_filter(v: Tensor, sizes: list[int], weights: Sequence[Tensor]) -> list[Tensor]:
    """The layers' vectors end to end in v, each shaped to broadcast over its weight [O, ...]: one view
    and one split where the weights have one number of dimensions (the NIN's), else a view per layer."""
    ndim = {w.ndim for w in weights}
    if len(ndim) == 1:
        return list(v.view(-1, *(1,) * (ndim.pop() - 1)).split(sizes))
    return [_filters(part, w) for part, w in zip(v.split(sizes), weights, strict=True)]


def _foreach_mul(a: list[Tensor], b: list[Tensor]) -> list[Tensor]:
    """[a_i * b_i], one call for the list (torch's foreach refuses an empty one)."""
    return torch._foreach_mul(a, b) if a else []


def _autocast_dtype(x: Tensor) -> torch.dtype | None:
    """The dtype autocast runs a convolution in on x's device, or None outside autocast."""
    t = x.device.type
    return torch.get_autocast_dtype(t) if torch.is_autocast_enabled(t) else None


def _rows(w: Tensor) -> tuple[int, ...]:
    return tuple(range(1, w.ndim))


def _filters(v: Tensor, weight: Tensor) -> Tensor:
    """A per-filter vector [O] shaped to broadcast over a weight [O, ...]."""
    return v.view(-1, *(1,) * (weight.ndim - 1))


def _channels(v: Tensor, y: Tensor) -> Tensor:
    """A per-filter vector [O] shaped to broadcast over an output [N, O, ...]."""
    return v.view(-1, *(1,) * (y.ndim - 2))
