"""NormProp's weight side in few kernels, the CUDA road: eq. 11 folded with torch's fused weight-norm
kernel, and the unit-norm constraint with the same kernel.

In a CUDA graph a small step's kernels cost a few microseconds each whatever their size, and the
batched road of folded.py, written for the CPU, launches one kernel per layer for each of its norms,
multiplies and rescales. Here, per layer i with g_i = gamma_i / (f c1) (c1 = 1, f = 1 for the classifier):

    forward    u_i, ||W_i|| = _weight_norm_interface(W_i, g_i): u_i = W_i g_i / ||W_i||, one kernel
               g_i for every layer in one foreach multiply, b_i = (beta_i - c2) / c1 in one foreach addcmul
    backward   dL/dW_i, dL/dg_i = _weight_norm_interface_backward(G_i, W_i, g_i, ||W_i||), one kernel
               dL/dgamma_i = dL/dg_i / (f c1), dL/dbeta_i = dL/db_i / c1: one foreach multiply each
    constraint W_i <- _weight_norm_interface(W_i, 1), then one foreach copy into every W_i

always on the weights: at batch size 1 the output road saves bytes, which a GPU step does not lack, and
costs kernels. The same operations run on the CPU, where they are tested against the batched road (`ROAD`).

The "triton" road (triton_fold.py) goes further: the layers' parameters in one flat buffer, and the fold's
forward, its backward and SGD's step with the constraint one Triton kernel each over the whole buffer. It is
taken where asked for (`set_road("triton")`), not by default: its kernels are tested in Triton's interpreter
on the CPU, and `normprop gpu-check` compares them with the batched road on a GPU before "auto" may take them.
Layers it cannot take (weights that are not contiguous float32) keep the fused road.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

ROADS = ("auto", "fused", "batched", "triton")
# Which road NormProp's folded layers and the unit-norm constraint take: "auto" the fused one on CUDA and the
# batched one (folded.py; the CPU's numbers) elsewhere; "fused", "batched" or "triton" on every device (on the
# CPU, Triton's kernels run in its interpreter).
ROAD = "auto"


def set_road(road: str) -> str:
    """Make every NormProp layer and `constrain_unit_norm_` take `road` (ROADS) from now on; the road before."""
    global ROAD
    if road not in ROADS:
        raise ValueError(f"the fold's road must be one of {', '.join(ROADS)}, got {road!r}")
    if road == "triton" and not triton_installed():
        raise ValueError("the fold's triton road needs Triton 3.3 or later (pip install triton); take fused or batched")
    before, ROAD = ROAD, road
    return before


@functools.cache
def triton_installed() -> bool:
    """Whether Triton 3.3 or later is installed (kernel arguments that are tuples, which the backward takes)."""
    if importlib.util.find_spec("triton") is None:
        return False
    try:
        version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:  # installed under another distribution's name (pytorch-triton)
        import triton

        version = triton.__version__
    return tuple(int(v) for v in version.split(".")[:2] if v.isdigit()) >= (3, 3)


def takes_triton(weights: Sequence[Tensor]) -> bool:
    """Whether weights of this device, dtype and layout take the triton road (triton_fold.py): `ROAD`, and
    contiguous float32 filters on one device."""
    if ROAD != "triton" or not weights:
        return False
    device = weights[0].device
    return all(w.dtype == torch.float32 and w.device == device and w.is_contiguous() for w in weights)


@contextlib.contextmanager
def using_road(road: str) -> Iterator[None]:
    """`set_road(road)` inside the block, the road before after it (comparing the fused road with the batched)."""
    before = set_road(road)
    try:
        yield
    finally:
        set_road(before)


def takes_fused(weights: Sequence[Tensor]) -> bool:
    """Whether weights of this device and layout take the fused road: `ROAD` (the triton road's layers that it
    cannot take too), and contiguous filters (the layout the weight-norm kernel and the foreach fast path take;
    channels_last weights keep the batched road)."""
    if ROAD == "batched" or not weights:
        return False
    if ROAD == "auto" and weights[0].device.type != "cuda":
        return False
    return all(w.is_contiguous() for w in weights)


def fused_fold(layers: Sequence) -> list[tuple[Tensor, None, Tensor, bool]]:
    """(u_i, None, b_i, False) for each layer: what its convolution takes on the weights road (module docstring)."""
    params = [m.weight for m in layers] + [m.gamma for m in layers] + [m.beta for m in layers]
    rows = [m.folded_constants(m.weight) for m in layers]  # 1/(f c1), 1/c1, -c2/c1 per filter
    out = _FusedFold.apply(tuple(rows), *params)
    n = len(layers)
    return [(u, None, b, False) for u, b in zip(out[:n], out[n:], strict=True)]


def _filters(v: Tensor, w: Tensor) -> Tensor:
    """A per-filter vector [O] as the weight-norm kernel takes it for a weight [O, ...]: [O, 1, ...]."""
    return v.view(-1, *(1,) * (w.ndim - 1))


class _FusedFold(torch.autograd.Function):
    """(W_i, gamma_i, beta_i) of every layer -> (u_i, b_i) of every layer (module docstring). Under autocast
    the fold runs in float32 from the float32 master weights; the convolution casts u_i."""

    @staticmethod
    def forward(ctx, rows, *params):
        ctx.set_materialize_grads(False)
        n = len(rows)
        weights, gammas, betas = params[:n], params[n : 2 * n], params[2 * n :]
        with torch.autocast(weights[0].device.type, enabled=False):
            gs = torch._foreach_mul(list(gammas), [r[0] for r in rows])
            gs = [_filters(g, w) for g, w in zip(gs, weights, strict=True)]
            folded = [torch._weight_norm_interface(w, g, 0) for w, g in zip(weights, gs, strict=True)]
            biases = torch._foreach_addcmul([r[2] for r in rows], list(betas), [r[1] for r in rows])
        ctx.save_for_backward(*weights, *gs, *(norm for _, norm in folded))
        ctx.rows = rows
        return (*(u for u, _ in folded), *biases)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        rows = ctx.rows
        n = len(rows)
        saved = ctx.saved_tensors
        weights, gs, norms = saved[:n], saved[n : 2 * n], saved[2 * n :]
        dws, dgs = [], []
        for i in range(n):
            gu = grads[i]
            if gu is None:
                gu = torch.zeros_like(weights[i])
            dw, dg = torch.ops.aten._weight_norm_interface_backward(gu.contiguous(), weights[i], gs[i], norms[i], 0)
            dws.append(dw)
            dgs.append(dg.view(-1))
        dgammas = torch._foreach_mul(dgs, [r[0] for r in rows])
        dbs = [g if g is not None else torch.zeros_like(r[1]) for g, r in zip(grads[n:], rows, strict=True)]
        dbetas = torch._foreach_mul(dbs, [r[1] for r in rows])
        return None, *dws, *dgammas, *dbetas


_ONES: dict = {}


@torch.no_grad()
def fused_unit_norm_(weights: list[Tensor]) -> None:
    """Every filter of every weight rescaled to unit l2 norm: one weight-norm kernel per weight (g = 1) and one
    foreach copy back."""
    units = []
    for w in weights:
        key = (w.shape[0], w.ndim, w.dtype, w.device)
        if key not in _ONES:
            _ONES[key] = torch.ones((w.shape[0],) + (1,) * (w.ndim - 1), dtype=w.dtype, device=w.device)
        units.append(torch._weight_norm_interface(w, _ONES[key], 0)[0])
    torch._foreach_copy_(weights, units)
