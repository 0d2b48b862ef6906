"""NormProp layers (eq. 9 fully connected, eq. 11 convolution) and the unit-norm constraint.

    o_i = ( act( gamma_i (W_i * x) / (f ||W_i||) + beta_i ) - c2 ) / c1

c2, c1: mean and std of act(X), X ~ N(0, 1) (Remark 1, Remark 2, eq. 12); f: the Jacobian
factor (section 3.4). `jacobian` chooses where f goes: "divide" (ICML text, the default),
"init" (arXiv text: gamma_i starts at 1/f, no division) or "off" (f = 1).
`activation=None` is the classifier layer: gamma_i (W_i x) / ||W_i|| + beta_i, nothing after.
Every activation uses this form; eq. 12 as printed also divides beta_i by ||W_i|| and drops f.
"""

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .stats import ACTIVATIONS, ActivationStats, activation_stats, prelu_stats

JACOBIAN_MODES = ("divide", "init", "off")


class Folded(NamedTuple):
    """One layer's eq. 11 folded (NormPropLayer docstring), per filter i."""

    scale: Tensor  # s_i = gamma_i / (f c1 ||W_i||), multiplies W_i * x
    bias: Tensor  # (beta_i - c2) / c1
    dscale: Tensor  # ds_i / dgamma_i = 1 / (f c1 ||W_i||)
    radial: Tensor  # s_i / ||W_i||^2: through ||W_i||, dL/dW_i gets -radial_i (dL/ds_i) W_i
    inv_c1: Tensor  # db_i / dbeta_i = 1 / c1


class NormPropLayer(nn.Module):
    """What NormPropConv2d and NormPropLinear share; subclasses give `_op(x, weight, bias)`.

    Performance: the normalisation is applied to the weights, never to the activations.
    With s_i = gamma_i / (f c1 ||W_i||) (weight-sized work), for ReLU, as c1 > 0:
        (relu(z) - c2) / c1 = relu(z / c1) - c2 / c1 = max(z / c1 - c2 / c1, -c2 / c1)
        z / c1 - c2 / c1    = (W s) * x + (beta - c2) / c1
    so one conv with weight W s and bias (beta - c2) / c1 is followed by one clamp_min,
    the cost of conv + ReLU. PReLU is positively homogeneous too: prelu(z) / c1 =
    prelu((W s) * x + beta / c1), then one subtraction of c2 / c1. Any other activation:
    act((W gamma / (f ||W||)) * x + beta), then the affine (two elementwise passes).

    ReLU and the classifier (the NIN case) take a faster road: `fold` computes s and the bias of
    many layers in a few batched operations (NIN folds its nine at once: at batch size 1 a step
    costs per operation, not per byte), and `_FoldedOp` is conv + clamp in one autograd function
    whose backward is written out (the clamp is in place, as nn.ReLU(inplace=True) is). It puts
    s on the output instead of the weights where the output is the smaller (batch size 1, wide
    late layers). Under bfloat16 autocast the same road runs the convolution and the clamp in
    bfloat16, with s and the bias folded in float32 from the float32 weights and s always on the
    weights (`_FoldedOp`). Other activations,
    float16 autocast and torch.compile take the plain autograd form below, which autocast and the
    compiler handle.
    """

    def __init__(
        self, out_features: int, activation: str | None, jacobian: str, prelu_init: float, device=None, dtype=None
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        if jacobian not in JACOBIAN_MODES:
            raise ValueError(f"jacobian must be one of {JACOBIAN_MODES}, got {jacobian!r}")
        self.activation = "identity" if activation is None else activation
        self.jacobian = jacobian
        self.prelu_init = prelu_init
        if self.activation == "prelu":
            self.slope = nn.Parameter(torch.full((1,), float(prelu_init), **factory))
            self._init_factor = float(prelu_stats(float(prelu_init)).jacobian_factor)
        else:
            self.slope = None
            self._fixed_stats = activation_stats(self.activation)  # raises on unknown names
            self._init_factor = float(self._fixed_stats.jacobian_factor)
        self.gamma = nn.Parameter(torch.empty(out_features, **factory))
        self.beta = nn.Parameter(torch.empty(out_features, **factory))
        self.folded_path = self.activation in ("relu", "identity")
        self._consts: dict = {}
        if self.activation == "relu":  # the clamp of eq. 11 folded: max(., -c2/c1)
            self._floor = -self._fixed_stats.mean / self._fixed_stats.std
        else:
            self._floor = None

    def reset_parameters(self) -> None:
        """Section 4.2: Glorot (normalized) weights, beta = 0; gamma = 1, or 1/f for "init"."""
        nn.init.xavier_uniform_(self.weight)
        nn.init.zeros_(self.beta)
        nn.init.constant_(self.gamma, 1.0 / self._init_factor if self.jacobian == "init" else 1.0)
        if self.slope is not None:
            nn.init.constant_(self.slope, self.prelu_init)

    def _op(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        raise NotImplementedError

    def stats(self) -> ActivationStats:
        """c2, c1 and the Jacobian factor now (for PReLU: tensors of the current slope)."""
        return prelu_stats(self.slope) if self.slope is not None else self._fixed_stats

    def divisor(self) -> float | Tensor:
        """f of eq. 11: the Jacobian factor in "divide" mode, else 1."""
        return self.stats().jacobian_factor if self.jacobian == "divide" else 1.0

    def _per_filter(self, v: Tensor) -> Tensor:
        return v.reshape(-1, *(1,) * (self.weight.ndim - 1))

    def filter_norms(self) -> Tensor:
        """||W_i||_2 (linear) or ||W_i||_F (conv), one per output unit."""
        return torch.linalg.vector_norm(self.weight.flatten(1), dim=1)

    def folded_constants(self, like: Tensor) -> Tensor:
        """Rows 1/(f c1), 1/c1, -c2/c1 per filter (eq. 11 folded), in the dtype of `like`."""
        key = (like.dtype, like.device)
        if key not in self._consts:
            st, f, n = self._fixed_stats, self.divisor(), self.gamma.numel()
            c = [1.0 / (f * st.std), 1.0 / st.std, -st.mean / st.std]
            c = torch.tensor(c, dtype=like.dtype, device=like.device)
            self._consts[key] = c[:, None].repeat(1, n)
        return self._consts[key]

    def _op_backward(self, g: Tensor, x: Tensor, weight: Tensor, need_x: bool, need_bias: bool):
        """dL/dx (or None), dL/dweight, dL/dbias (or None) of `_op` given g = dL/d output."""
        raise NotImplementedError

    def _out_numel(self, x: Tensor) -> int:
        raise NotImplementedError

    def scales_output(self, x: Tensor) -> bool:
        """Whether `_FoldedOp` scales the output (if smaller than the weights), not the weights."""
        return self._out_numel(x) < self.weight.numel()

    def _folded_ok(self, x: Tensor) -> bool:
        return (
            self.folded_path
            and x.ndim == self.weight.ndim
            and not torch.compiler.is_compiling()
            and _autocast_dtype(x) in (None, torch.bfloat16)
        )

    def forward(self, x: Tensor, folded: Folded | None = None) -> Tensor:
        """Eq. 11; `folded` is this layer's share of `fold(layers)`, computed here when None."""
        if folded is not None:
            return _FoldedOp.apply(x, self.weight, self.gamma, self.beta, *folded, self)
        if self._folded_ok(x):
            return _FoldedOp.apply(x, self.weight, self.gamma, self.beta, *fold([self])[0], self)
        st = self.stats()
        c2, c1, f = st.mean, st.std, self.divisor()
        norm = self.filter_norms()
        if self.activation == "identity":  # classifier: c2 = 0, c1 = f = 1
            return self._op(x, self.weight * self._per_filter(self.gamma / norm), self.beta)
        if self.activation == "relu":  # eq. 11, folded (class docstring)
            scale = self.gamma / (f * c1 * norm)
            u = self._op(x, self.weight * self._per_filter(scale), (self.beta - c2) / c1)
            return torch.clamp_min(u, -c2 / c1)
        if self.activation == "prelu":  # eq. 11 with PReLU (eq. 13, Remark 2), 1/c1 folded
            scale = self.gamma / (f * c1 * norm)
            u = self._op(x, self.weight * self._per_filter(scale), self.beta / c1)
            return F.prelu(u, self.slope) - c2 / c1
        scale = self.gamma / (f * norm)  # eq. 11 with any activation (section 4.6)
        a = ACTIVATIONS[self.activation].fn(self._op(x, self.weight * self._per_filter(scale), self.beta))
        return (a - c2) * (1.0 / c1)

    def extra_repr(self) -> str:
        return f"activation={self.activation}, jacobian={self.jacobian}"


class NormPropConv2d(NormPropLayer):
    """Convolution with NormProp, eq. 11; ||W_i||_F over each filter (in / groups x kh x kw).

    It takes nn.Conv2d's arguments (as timm's StdConv2d does), then NormProp's own by keyword.
    `bias` is beta_i of eq. 11, which NormProp always learns; padding is zero padding."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device=None,
        dtype=None,
        *,
        activation: str | None = "relu",
        jacobian: str = "divide",
        prelu_init: float = 0.25,
    ) -> None:
        if not bias:
            raise ValueError("NormPropConv2d learns beta_i, its bias (eq. 11): bias=False is not NormProp")
        if padding_mode != "zeros":
            raise ValueError(f"NormPropConv2d pads with zeros; padding_mode={padding_mode!r} is not supported")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels and out_channels must be divisible by groups={groups}")
        factory = {"device": device, "dtype": dtype}
        super().__init__(out_channels, activation, jacobian, prelu_init, **factory)
        kh, kw = _pair(kernel_size)
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.dilation = (kh, kw), _pair(stride), _pair(dilation)
        if padding == "valid":
            padding = 0
        elif padding == "same":
            if self.stride != (1, 1):
                raise ValueError("padding='same' needs stride 1, as in nn.Conv2d")
            total = [d * (k - 1) for d, k in zip(self.dilation, self.kernel_size, strict=True)]
            if any(t % 2 for t in total):
                raise ValueError("padding='same' needs an odd dilated kernel here; give the padding in numbers")
            padding = tuple(t // 2 for t in total)
        self.padding = _pair(padding)
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, kh, kw, **factory))
        self.reset_parameters()

    def _op(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return F.conv2d(x, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def _op_backward(self, g: Tensor, x: Tensor, weight: Tensor, need_x: bool, need_bias: bool):
        bias = [self.out_channels] if need_bias else None
        return torch.ops.aten.convolution_backward(
            g, x, weight, bias, self.stride, self.padding, self.dilation, False, (0, 0), self.groups,
            (need_x, True, need_bias),
        )  # fmt: skip

    def _out_numel(self, x: Tensor) -> int:
        geometry = zip(x.shape[-2:], self.kernel_size, self.stride, self.padding, self.dilation, strict=True)
        h, w = ((size + 2 * p - d * (k - 1) - 1) // s + 1 for size, k, s, p, d in geometry)
        return x.shape[0] * self.out_channels * h * w

    def extra_repr(self) -> str:
        options = "".join(
            f", {name}={value}"
            for name, value, default in (("dilation", self.dilation, (1, 1)), ("groups", self.groups, 1))
            if value != default
        )
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}{options}, {super().extra_repr()}"
        )


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


class NormPropLinear(NormPropLayer):
    """Fully connected layer with NormProp, eq. 9; ||W_i||_2 over each row."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        activation: str | None = "relu",
        jacobian: str = "divide",
        prelu_init: float = 0.25,
    ) -> None:
        super().__init__(out_features, activation, jacobian, prelu_init)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.reset_parameters()

    def _op(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return F.linear(x, weight, bias)

    def _op_backward(self, g: Tensor, x: Tensor, weight: Tensor, need_x: bool, need_bias: bool):
        return (g @ weight if need_x else None), g.t() @ x, (g.sum(0) if need_bias else None)

    def _out_numel(self, x: Tensor) -> int:
        return x.shape[0] * self.out_features

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, {super().extra_repr()}"


@torch.no_grad()
def fold(layers: Sequence[NormPropLayer]) -> list[Folded]:
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


def reference_forward(layer: NormPropLayer, x: Tensor) -> Tensor:
    """Eq. 9 / eq. 11 term by term, unfolded: the slow, literal form of layer(x)."""
    st = layer.stats()
    wx = layer._op(x, layer.weight, None)  # W_i * x
    shape = (1, -1) + (1,) * (wx.ndim - 2)
    z = layer.gamma.view(shape) * wx / (layer.divisor() * layer.filter_norms().view(shape)) + layer.beta.view(shape)
    if layer.activation == "prelu":
        a = F.prelu(z, layer.slope)  # eq. 13
    else:
        a = ACTIVATIONS[layer.activation].fn(z)
    return (a - st.mean) / st.std


@torch.no_grad()
def constrain_unit_norm_(model: nn.Module) -> None:
    """Section 4.4: rescale every filter W_i of every NormProp layer in `model` to unit l2 norm.

    Call after each optimiser step. The forward pass divides by ||W_i||, so this never
    changes the function the model computes, only the optimisation: the gradient with
    respect to W_i scales with 1/||W_i||, so fixing ||W_i|| = 1 fixes the effective step.
    """
    weights = [m.weight for m in model.modules() if isinstance(m, NormPropLayer)]
    if weights:
        norms = [torch.linalg.vector_norm(w, dim=tuple(range(1, w.ndim)), keepdim=True) for w in weights]
        torch._foreach_div_(weights, norms)
