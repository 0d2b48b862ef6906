"""NormProp's weight side in three Triton kernels over one flat buffer: fused.py's "triton" road, CUDA's.

Every parameter of the folded layers lives in one float32 buffer, `Pack.flat`: the filters of every layer end
to end (each layer's weight a view starting at a multiple of ALIGN elements), then every gamma_i, then every
beta_i (views too). Per filter i, with k_i = 1/(f c1) and s_i = gamma_i k_i / ||W_i||, each kernel computes, over
every filter of every layer at once:

    fold forward   ||W_i||, u_i = s_i W_i, b_i = beta_i / c1 - c2 / c1
    fold backward  ds_i = <G_i, W_i>, dL/dW_i = s_i G_i - (s_i ds_i / ||W_i||^2) W_i, dL/dgamma_i = k_i ds_i / ||W_i||,
                   dL/dbeta_i = dL/db_i / c1 (G_i = dL/du_i, read where each convolution's backward left it)
    SGD and norm   torch.optim.SGD's update (weight decay, momentum, dampening, Nesterov, maximize as the parameter
                   group says) of W_i, then W_i / ||W_i||; and of every gamma_i and beta_i, which keep their value

The backward writes its gradients into one buffer laid out as `flat` and hands autograd views of it, which
autograd keeps as the parameters' .grad; the momentum buffers are views of one more such buffer, kept in the
optimizer's state where torch's SGD keeps them (its state_dict has the same keys and shapes), so the update reads
all three buffers whole. Each kernel is one operator (torch.library.triton_op), one kernel in nn/kernels.py's
count. On CUDA the kernels are compiled, a few filters a program; on CPU tensors they run in Triton's interpreter,
all filters in one program (its cost is per operation), which is how the tests run them. Triton reads
TRITON_INTERPRET when a function is decorated, and decorates its own library (tl.sum, tl.zeros...) as it is first
imported; the kernels here call none of it (sums are tl.reduce with Triton's own combine, which the interpreter
computes with numpy) and are wrapped for the interpreter by hand, so they run on CPU tensors whatever the variable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op, wrap_triton
from triton.runtime.interpreter import InterpretedFunction

ALIGN = 16  # elements: each layer's weight (and its u_i, dL/dW_i) starts 64-byte aligned, as vector loads like
_SUM = tl.standard._sum_combine  # tl.sum's and tl.max's combines, which the interpreter computes with numpy
_MAX = tl.standard._elementwise_max


def _fold_forward_kernel(P, U, B, NORM, META, CONSTS, S, F, GAMMA, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # this program's filters
    live = i < F
    start, n = tl.load(META + i, mask=live, other=0)[:, None], tl.load(META + S + i, mask=live, other=0)
    longest, n = tl.reduce(n, 0, _MAX), n[:, None]
    acc = tl.full([ROWS, BLOCK], 0.0, tl.float32)
    for j in range(0, longest, BLOCK):
        at = j + tl.arange(0, BLOCK)[None, :]
        w = tl.load(P + start + at, mask=at < n, other=0.0)
        acc += w * w
    norm = tl.where(live, tl.sqrt_rn(tl.reduce(acc, 1, _SUM)), 1.0)
    s = tl.load(P + GAMMA + i, mask=live, other=0.0) * tl.div_rn(tl.load(CONSTS + i, mask=live, other=0.0), norm)
    for j in range(0, longest, BLOCK):
        at = j + tl.arange(0, BLOCK)[None, :]
        w = tl.load(P + start + at, mask=at < n, other=0.0)
        tl.store(U + start + at, w * s[:, None], mask=at < n)
    tl.store(NORM + i, norm, mask=live)
    shift, inv_c1 = tl.load(CONSTS + 2 * F + i, mask=live, other=0.0), tl.load(CONSTS + F + i, mask=live, other=0.0)
    tl.store(B + i, shift + tl.load(P + GAMMA + F + i, mask=live, other=0.0) * inv_c1, mask=live)


def _fold_backward_kernel(
    GU, GB, P, DP, NORM, META, CONSTS, S, F, GAMMA, LAYERS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr
):
    i = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = i < F
    start, n = tl.load(META + i, mask=live, other=0)[:, None], tl.load(META + S + i, mask=live, other=0)
    layer, row = tl.load(META + 2 * S + i, mask=live, other=0), tl.load(META + 3 * S + i, mask=live, other=0)
    gu, gb = GU[0] + row * n, GB[0] + row  # each filter's row of its layer's dL/du_i, and its dL/db_i
    for k in tl.static_range(1, LAYERS):
        gu, gb = tl.where(layer == k, GU[k] + row * n, gu), tl.where(layer == k, GB[k] + row, gb)
    longest, n, gu = tl.reduce(n, 0, _MAX), n[:, None], gu[:, None]
    acc = tl.full([ROWS, BLOCK], 0.0, tl.float32)
    for j in range(0, longest, BLOCK):
        at = j + tl.arange(0, BLOCK)[None, :]
        acc += tl.load(gu + at, mask=at < n, other=0.0) * tl.load(P + start + at, mask=at < n, other=0.0)
    ds = tl.reduce(acc, 1, _SUM)
    norm = tl.load(NORM + i, mask=live, other=1.0)
    dscale = tl.div_rn(tl.load(CONSTS + i, mask=live, other=0.0), norm)
    s = tl.load(P + GAMMA + i, mask=live, other=0.0) * dscale
    radial = (tl.div_rn(s, norm * norm) * ds)[:, None]
    for j in range(0, longest, BLOCK):
        at = j + tl.arange(0, BLOCK)[None, :]
        g, w = tl.load(gu + at, mask=at < n, other=0.0), tl.load(P + start + at, mask=at < n, other=0.0)
        tl.store(DP + start + at, g * s[:, None] - w * radial, mask=at < n)
    tl.store(DP + GAMMA + i, dscale * ds, mask=live)
    inv_c1 = tl.load(CONSTS + F + i, mask=live, other=0.0)
    tl.store(DP + GAMMA + F + i, tl.load(gb, mask=live, other=0.0) * inv_c1, mask=live)


def _sgd_unit_norm_kernel(
    P, DP, M, LR_W, LR_A, META, S, F, R, lr_w, lr_a, momentum, damp1, wd_w, wd_a, SGD: tl.constexpr,
    LR_T: tl.constexpr, FIRST: tl.constexpr, MOMENTUM: tl.constexpr, NESTEROV: tl.constexpr,
    MAXIMIZE: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # filters, and (i == F) every gamma and beta end to end
    live, filters = i < R, (i < F)[:, None]
    start, n = tl.load(META + i, mask=live, other=0)[:, None], tl.load(META + S + i, mask=live, other=0)
    longest, n = tl.reduce(n, 0, _MAX), n[:, None]
    acc = tl.full([ROWS, BLOCK], 0.0, tl.float32)
    if SGD:
        if LR_T:
            lr_w, lr_a = tl.load(LR_W), tl.load(LR_A)
        lr, wd = tl.where(filters, lr_w, lr_a), tl.where(filters, wd_w, wd_a)
        for j in range(0, longest, BLOCK):
            at = j + tl.arange(0, BLOCK)[None, :]
            mask = at < n
            p, g = tl.load(P + start + at, mask=mask, other=0.0), tl.load(DP + start + at, mask=mask, other=0.0)
            if MAXIMIZE:
                g = -g
            g = g + wd * p
            if MOMENTUM:
                if FIRST:
                    buf = g
                else:
                    buf = momentum * tl.load(M + start + at, mask=mask, other=0.0) + damp1 * g
                tl.store(M + start + at, buf, mask=mask)
                if NESTEROV:
                    g = g + momentum * buf
                else:
                    g = buf
            p = p - lr * g
            tl.store(P + start + at, p, mask=mask)
            acc += p * p
        tl.debug_barrier()  # every thread's new values written before any is read back
    else:
        for j in range(0, longest, BLOCK):
            at = j + tl.arange(0, BLOCK)[None, :]
            p = tl.load(P + start + at, mask=at < n, other=0.0)
            acc += p * p
    norm = tl.where(filters, tl.sqrt_rn(tl.reduce(acc, 1, _SUM))[:, None], 1.0)
    for j in range(0, longest, BLOCK):
        at = j + tl.arange(0, BLOCK)[None, :]
        mask = (at < n) & filters
        tl.store(P + start + at, tl.div_rn(tl.load(P + start + at, mask=mask, other=0.0), norm), mask=mask)


_KERNELS: dict = {}


def _launch(fn, like: Tensor, rows: int, longest: int, *args, **constants) -> None:
    """`fn` over `rows` rows of at most `longest` elements: compiled by Triton for CUDA tensors, a few filters a
    program; run by Triton's interpreter for CPU tensors, whose cost is per operation, all in one program."""
    cpu = like.device.type == "cpu"
    if (fn, cpu) not in _KERNELS:
        _KERNELS[fn, cpu] = InterpretedFunction(fn) if cpu else triton.jit(fn)
    if cpu:
        block = min(triton.next_power_of_2(longest), 1024)
        per = min(triton.next_power_of_2(rows), max(1, (1 << 18) // block))
    else:
        block = min(max(triton.next_power_of_2(longest), 16), 4096)
        per = max(1, 2048 // block)
    grid = (triton.cdiv(rows, per),)
    wrap_triton(_KERNELS[fn, cpu])[grid](*args, **constants, ROWS=per, BLOCK=block, num_warps=8 if block >= 2048 else 4)


@triton_op("normprop::fold_forward", mutates_args=())
def fold_forward(flat: Tensor, meta: Tensor, consts: Tensor, wend: int, longest: int) -> tuple[Tensor, Tensor, Tensor]:
    """(u, b, norms): every u_i end to end laid out as the weights in `flat`, every b_i and every ||W_i||."""
    f = consts.shape[1]
    u, b, norm = flat.new_empty(wend), flat.new_empty(f), flat.new_empty(f)
    _launch(_fold_forward_kernel, flat, f, longest, flat, u, b, norm, meta, consts, f + 1, f, wend)
    return u, b, norm


@triton_op("normprop::fold_backward", mutates_args=())
def fold_backward(
    gu: list[Tensor], gb: list[Tensor], flat: Tensor, norm: Tensor, meta: Tensor, consts: Tensor, wend: int,
    longest: int,
) -> Tensor:  # fmt: skip
    """dL/dW_i, dL/dgamma_i, dL/dbeta_i of every layer, laid out as `flat`."""
    f = consts.shape[1]
    dp = torch.empty_like(flat)
    args = tuple(gu), tuple(gb), flat, dp, norm, meta, consts, f + 1, f, wend
    _launch(_fold_backward_kernel, flat, f, longest, *args, LAYERS=len(gu))
    return dp


@triton_op("normprop::sgd_unit_norm_", mutates_args=("flat", "momentum"))
def sgd_unit_norm_(
    flat: Tensor, grad: Tensor, momentum: Tensor, lr_w: Tensor, lr_a: Tensor, meta: Tensor, rows: int, longest: int,
    hyper: list[float], flags: list[bool],
) -> None:  # fmt: skip
    """In place: SGD on `flat` (hyper: lr_w, lr_a, momentum, 1 - dampening, wd_w, wd_a; flags: sgd, lr read from
    lr_w and lr_a, first step, momentum, nesterov, maximize), then every filter to unit norm; `rows`: the
    filters, and one more where gamma and beta take the step."""
    f = meta.shape[1] - 1
    sgd, lr_t, first, mom, nesterov, maximize = flags
    args = flat, grad, momentum, lr_w, lr_a, meta, f + 1, f, rows, *hyper
    _launch(_sgd_unit_norm_kernel, flat, rows, longest, *args, SGD=sgd, LR_T=lr_t, FIRST=first, MOMENTUM=mom,
            NESTEROV=nesterov, MAXIMIZE=maximize)  # fmt: skip


class Pack:
    """The folded layers' parameters in one buffer (module docstring); made by `packed`, kept on every layer
    as `_flat`. Nothing of it is in a state_dict: the parameters keep their names and shapes."""

    @torch.inference_mode(False)  # made by an evaluation's first forward too: its tensors must train after
    @torch.no_grad()
    def __init__(self, layers) -> None:
        weights, n = [m.weight for m in layers], len(layers)
        self.layers = tuple(layers)
        self.sizes = [w.shape[0] for w in weights]
        f, starts, at = sum(self.sizes), [], 0
        for w in weights:
            starts.append(at)
            at += -(-w.numel() // ALIGN) * ALIGN
        self.wend = at
        ends = [at + sum(self.sizes[:i]) for i in range(n)]
        self.offsets = starts + ends + [e + f for e in ends]  # of W_i, gamma_i, beta_i
        self.params = [*weights, *(m.gamma for m in layers), *(m.beta for m in layers)]
        self.flat = torch.empty(at + 2 * f, dtype=torch.float32, device=weights[0].device)
        for p, v in zip(self.params, self.views(self.flat), strict=True):
            p.data = v.copy_(p)
        meta = [[], [], [], []]  # per filter: start, length, layer, row; then the gammas and betas: start, length
        for layer, (w, start) in enumerate(zip(weights, starts, strict=True)):
            row = w[0].numel()
            for r in range(w.shape[0]):
                for k, v in enumerate((start + r * row, row, layer, r)):
                    meta[k].append(v)
        for k, v in enumerate((at, 2 * f, 0, 0)):
            meta[k].append(v)
        self.meta = torch.tensor(meta, dtype=torch.int32, device=self.flat.device)
        self.consts = torch.cat([m.folded_constants(self.flat) for m in layers], dim=1).contiguous()
        self.longest = max(meta[1][:-1])  # elements in the longest filter
        self.momentum: Tensor | None = None
        for m in layers:
            m._flat = self

    def views(self, buf: Tensor, count: int | None = None) -> list[Tensor]:
        """The first `count` (default all) of W_i, gamma_i, beta_i's places in `buf`, a buffer laid out as `flat`."""
        pairs = list(zip(self.params, self.offsets, strict=True))[:count]
        return [buf[o : o + p.numel()].view(p.shape) for p, o in pairs]

    def holds(self, layers, tensors=None, buf: Tensor | None = None) -> bool:
        """Whether `tensors` (default the parameters) are still views of `buf` (default `flat`) in their places."""
        if self.layers != tuple(layers):
            return False
        buf, tensors = self.flat if buf is None else buf, self.params if tensors is None else tensors
        base = buf.untyped_storage().data_ptr()
        return all(
            t is not None and t.untyped_storage().data_ptr() == base and t.storage_offset() == o and t.is_contiguous()
            for t, o in zip(tensors, self.offsets, strict=False)
        )


def packed(layers) -> Pack:
    """The layers' Pack, made (their parameters moved into one buffer, values unchanged) where they have none or
    their parameters are no longer its views (after .to(), a copy or a load with assign=True)."""
    pack = getattr(layers[0], "_flat", None)
    return pack if pack is not None and pack.holds(layers) else Pack(layers)


def fold(layers) -> list[tuple[Tensor, None, Tensor, bool]]:
    """(u_i, None, b_i, False) for each layer, as fused.fused_fold gives: what its convolution takes."""
    pack = packed(layers)
    out = _Fold.apply(pack, *pack.params)
    n = len(layers)
    return [(u, None, b, False) for u, b in zip(out[:n], out[n:], strict=True)]


class _Fold(torch.autograd.Function):
    """(W_i, gamma_i, beta_i) of every layer, read from the pack's buffer -> (u_i, b_i) of every layer."""

    @staticmethod
    def forward(ctx, pack, *params):
        ctx.set_materialize_grads(False)
        u, b, norm = fold_forward(pack.flat, pack.meta, pack.consts, pack.wend, pack.longest)
        ctx.save_for_backward(pack.flat, norm)
        ctx.pack = pack
        n = len(pack.sizes)
        return (*pack.views(u, n), *b.split(pack.sizes))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        pack, (flat, norm) = ctx.pack, ctx.saved_tensors
        n = len(pack.sizes)
        like = [*pack.params[:n], *(m.beta for m in pack.layers)]  # zeros where an output got no gradient
        gs = [g.contiguous() if g is not None else torch.zeros_like(t) for g, t in zip(grads, like, strict=True)]
        dp = fold_backward(gs[:n], gs[n:], flat, norm, pack.meta, pack.consts, pack.wend, pack.longest)
        return None, *(v if need else None for v, need in zip(pack.views(dp), ctx.needs_input_grad[1:], strict=True))


@torch.no_grad()
def unit_norm_(layers) -> bool:
    """Every filter of `layers` to unit l2 norm in one kernel, where they are one Pack's; else False, nothing done."""
    pack = getattr(layers[0], "_flat", None) if layers else None
    if pack is None or not pack.holds(layers):
        return False
    flat = pack.flat
    sgd_unit_norm_(flat, flat, flat, flat, flat, pack.meta, sum(pack.sizes), pack.longest, [0.0] * 6, [False] * 6)
    return True


def _groups(pack: Pack, optimizer: torch.optim.Optimizer) -> tuple[list, dict, dict] | None:
    """(the parameters the optimizer steps, the filters' group, the gains' and biases' group), where one kernel can
    take their step: every filter in one group, every gain and bias in one (or none: model.freeze_affine), the
    two alike but for lr and weight decay; else None."""
    n = len(pack.sizes)
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    groups = [group_of.get(id(p)) for p in pack.params]
    learnt = pack.params if groups[n] is not None else pack.params[:n]
    wg, ag = groups[0], groups[len(learnt) - 1]
    if wg is None or any(g is not (wg if i < n else ag) for i, g in enumerate(groups[: len(learnt)])):
        return None
    if any(g is not None for g in groups[len(learnt) :]) or wg.get("differentiable"):
        return None
    same = ("momentum", "dampening", "nesterov", "maximize", "differentiable")
    if any(wg.get(k) != ag.get(k) for k in same) or isinstance(wg["lr"], Tensor) != isinstance(ag["lr"], Tensor):
        return None
    return learnt, wg, ag


@torch.no_grad()
def sgd_and_unit_norm_(layers, optimizer: torch.optim.Optimizer) -> bool:
    """`optimizer.step()` with the step of `layers`' parameters and the unit-norm constraint in one kernel (module
    docstring), where `layers` are one Pack's and torch.optim.SGD steps them as `_groups` says it can; torch's step
    for every other parameter. Else False, nothing done."""
    pack = getattr(layers[0], "_flat", None) if layers else None
    if pack is None or not pack.holds(layers) or not isinstance(optimizer, torch.optim.SGD):
        return False
    plan = _groups(pack, optimizer)
    if plan is None or any(p.grad is None or p.grad.dtype != torch.float32 for p in plan[0]):
        return False
    (learnt, wg, ag), flat = plan, pack.flat
    grads = [p.grad for p in learnt]
    dp = grads[0]
    if pack.holds(layers, grads, dp) and dp.untyped_storage().nbytes() >= flat.nbytes:  # the backward's buffer
        dp = dp.new_empty(0).set_(dp.untyped_storage(), 0, flat.shape, (1,))
    else:
        dp = torch.empty_like(flat)
        torch._foreach_copy_(pack.views(dp, len(learnt)), grads)
    momentum, first, install = wg["momentum"], False, False
    if momentum:
        if pack.momentum is None:
            pack.momentum = torch.zeros_like(flat)
        bufs = [optimizer.state[p].get("momentum_buffer") if p in optimizer.state else None for p in learnt]
        first = all(b is None for b in bufs)
        install = first or not pack.holds(layers, bufs, pack.momentum)
        if install and not first:
            if any(b is None for b in bufs):
                return False
            torch._foreach_copy_(pack.views(pack.momentum, len(learnt)), bufs)  # a loaded state: into the buffer
    lr_t = isinstance(wg["lr"], Tensor)  # a CUDA graph's: read when the kernel runs
    lrs = [wg["lr"], ag["lr"]] if lr_t else [flat, flat]
    hyper = [0.0, 0.0] if lr_t else [float(wg["lr"]), float(ag["lr"])]
    hyper += [float(momentum), 1.0 - float(wg["dampening"]), float(wg["weight_decay"]), float(ag["weight_decay"])]
    flags = [True, lr_t, first, bool(momentum), bool(wg["nesterov"]), bool(wg["maximize"])]
    affine = len(learnt) > len(pack.sizes)
    rows = sum(pack.sizes) + affine  # the filters, and the gains and biases end to end where they learn
    longest = max(pack.longest, 2 * sum(pack.sizes) if affine else 0)
    sgd_unit_norm_(flat, dp, pack.momentum if momentum else flat, *lrs, pack.meta, rows, longest, hyper, flags)
    if install:
        for p, v in zip(learnt, pack.views(pack.momentum), strict=False):
            optimizer.state[p]["momentum_buffer"] = v
    for p in learnt:  # hidden from torch's step, which steps every other parameter
        p.grad = None
    try:
        optimizer.step()
    finally:
        for p, g in zip(learnt, grads, strict=True):
            p.grad = g
    return True
