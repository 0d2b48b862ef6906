"""NormProp layers (eq. 9 fully connected, eq. 11 convolution) and the unit-norm constraint.

    o_i = ( act( gamma_i (W_i * x) / (f ||W_i||) + beta_i ) - c2 ) / c1

c2, c1: mean and std of act(X), X ~ N(0, 1) (Remark 1, Remark 2, eq. 12); f: the Jacobian
factor (section 3.4). `jacobian` chooses where f goes: "divide" (ICML text, the default),
"init" (arXiv text: gamma_i starts at 1/f, no division) or "off" (f = 1).
`activation=None` is the classifier layer: gamma_i (W_i x) / ||W_i|| + beta_i, nothing after.
Every activation uses this form; eq. 12 as printed also divides beta_i by ||W_i|| and drops f.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .folded import _autocast_dtype, _channels, floor_, fold_layers
from .fused import fused_unit_norm_, takes_fused, takes_triton
from .stats import ACTIVATIONS, ActivationStats, activation_stats, prelu_stats

JACOBIAN_MODES = ("divide", "init", "off")


def jacobian_problem(jacobian: str, key: str = "jacobian") -> str | None:
    """Why `jacobian` is not a mode of JACOBIAN_MODES, or None: the one check that the layers and NINConfig
    (which names the key model.jacobian) both make, so a bad value reads the same from either."""
    if jacobian in JACOBIAN_MODES:
        return None
    return f"{key}={jacobian} is not known; use one of {', '.join(JACOBIAN_MODES)}"


_ARGUMENTS = """
    NormProp's own arguments, by keyword:

    activation: the nonlinearity, which fixes c2 and c1 (mean and std of act(X), X ~ N(0, 1)) and the
        Jacobian factor f. "relu" (default: c2 = 0.399, c1 = 0.584, f = 1.21, Remark 1), "prelu" (a
        learnable slope a; c2, c1 and f follow a, Remark 2), "tanh", "sigmoid", "identity", or a name given
        to `register_activation(name, fn)` (c2, c1, f by quadrature, section 4.6). None: the classifier
        layer, gamma_i (W_i x) / ||W_i|| + beta_i with nothing after; make it the last layer.
    jacobian: where f goes (section 3.4). "divide" (default, ICML text): the pre-activation is divided by
        f; "init" (arXiv text): gamma_i starts at 1/f and nothing is divided, the same function at
        initialisation; "off": f = 1. The factor narrows the output at initialisation: with "divide" or
        "init" the pre-activation has std 1/f (0.83 for ReLU), so one ReLU layer on N(0, 1) input gives
        mean -0.12 and std 0.83, and stacked layers about 0.5 after five or ten (NormPropLinear(512, 512)
        layers at initialisation); with "off", mean 0.00 and std 1.00 after one, 1.02 after ten. The gammas
        learn the scale back; the factor is for the backward pass (Jacobian singular values near 1).
    prelu_init: the PReLU slope a at initialisation (default 0.25); used by activation="prelu" only.

    Pooling: put nn.MaxPool2d / nn.AvgPool2d after the layer as usual, with no re-normalisation. The
    paper does not recompute mean and std after pooling (end of section 3.2): the max or average of k
    independent N(0, 1) units would move them (max of 9: mean 1.49, std 0.60; `maxpool_stats`), but
    neighbouring units are computed from overlapping patches and are highly correlated, so the
    statistics barely change. The NIN here does the same (plain pooling between NormProp convs), and the
    next layer's learnt gamma_i, beta_i can absorb what shift remains. Standardise by `maxpool_stats(k)`
    yourself only if your pooled units are close to independent.
"""


def _documented(cls: type) -> type:
    """Append NormProp's own arguments to the class docstring, for help()."""
    cls.__doc__ = (cls.__doc__ or "") + "\n" + _ARGUMENTS
    return cls


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

    ReLU and the classifier (the NIN case) take a faster road (folded.py): one autograd node folds
    s and the bias of many layers and does their weight-side backward in a few batched operations
    (NIN folds its nine at once: at batch size 1 a step costs per operation, not per byte), and the
    convolution and the clamp are PyTorch's own, the clamp in place (`F.threshold_`, whose backward,
    like nn.ReLU(inplace=True)'s, reads the output). It puts s on the output instead of the weights
    where the output is the smaller (batch size 1, wide late layers). Under bfloat16 autocast the
    same road runs the convolution and the clamp in bfloat16, with s and the bias folded in float32
    from the float32 weights and s always on the weights. On CUDA the same fold takes fused.py's road: torch's
    fused weight-norm kernel, s always on the weights, fewer kernels (a CUDA graph pays per kernel).
    Other activations, float16 autocast and torch.compile take the plain autograd form below, which autocast and
    the compiler handle.
    """

    def __init__(
        self, out_features: int, activation: str | None, jacobian: str, prelu_init: float, bias=True, device=None,
        dtype=None,
    ) -> None:  # fmt: skip
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        name = type(self).__name__
        if isinstance(bias, str):  # NormPropLinear(3, 2, "tanh"): bias holds nn.Linear's third place, not activation
            raise TypeError(f"{name} takes activation, jacobian and prelu_init by keyword; got bias={bias!r}")
        if not bias:
            raise ValueError(f"{name} learns beta_i, its bias (eq. 11): bias=False is not NormProp")
        if problem := jacobian_problem(jacobian):
            raise ValueError(problem)
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
        """Rows 1/(f c1), 1/c1, -c2/c1 per filter (eq. 11 folded), in the dtype of `like`, filled on its
        device from the Python numbers: no tensor made from host data (a host-to-device copy) in a step."""
        key = (like.dtype, like.device)
        if key not in self._consts:
            st, f, n = self._fixed_stats, self.divisor(), self.gamma.numel()
            rows = torch.empty((3, n), dtype=like.dtype, device=like.device)
            for i, c in enumerate((1.0 / (f * st.std), 1.0 / st.std, -st.mean / st.std)):
                rows[i].fill_(c)
            self._consts[key] = rows
        return self._consts[key]

    def _out_numel(self, x: Tensor) -> int:
        raise NotImplementedError

    def scales_output(self, x: Tensor) -> bool:
        """Whether the folded road scales the output (if smaller than the weights), not the weights."""
        return self._out_numel(x) < self.weight.numel()

    def _road(self, x: Tensor) -> bool:
        """The folded road's side for input x: True scales the output (float32 only), False the weights."""
        return _autocast_dtype(x) is None and self.scales_output(x)

    def _folded_ok(self, x: Tensor) -> bool:
        return (
            self.folded_path
            and x.ndim == self.weight.ndim
            and not torch.compiler.is_compiling()
            and _autocast_dtype(x) in (None, torch.bfloat16)
        )

    def _folded_forward(self, x: Tensor, u: Tensor, scale: Tensor | None, bias: Tensor, on_output: bool) -> Tensor:
        """Eq. 11 folded: max(conv(x, W s) + b, -c2/c1), or with s on the output, conv(x, W) s + b."""
        if on_output:
            v = self._op(x, u, None)
            out = torch.addcmul(_channels(bias, v), v, _channels(scale, v))
        else:
            out = self._op(x, u, bias)  # under autocast: u and the bias cast to bfloat16 here
        if self._floor is not None:
            out = floor_(out, self._floor, copy_free=scale is None)  # max(out, floor) in place; fused road: no copy
        return out

    def forward(self, x: Tensor, *, fold: tuple | None = None) -> Tensor:
        """Eq. 11 (eq. 9 for NormPropLinear) on x; the class docstring says which road it takes. `fold`: this
        layer's part of `fold_layers(layers, roads)` over many layers (NIN folds its nine at once, then calls
        each layer with its part), in place of folding alone."""
        if fold is not None:
            return self._folded_forward(x, *fold)
        if self._folded_ok(x):
            return self._folded_forward(x, *fold_layers([self], [self._road(x)])[0])
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


@_documented
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
        if padding_mode != "zeros":
            raise ValueError(f"NormPropConv2d pads with zeros; padding_mode={padding_mode!r} is not supported")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels and out_channels must be divisible by groups={groups}")
        factory = {"device": device, "dtype": dtype}
        super().__init__(out_channels, activation, jacobian, prelu_init, bias, **factory)
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


@_documented
class NormPropLinear(NormPropLayer):
    """Fully connected layer with NormProp, eq. 9; ||W_i||_2 over each row.

    It takes nn.Linear's arguments, then NormProp's own by keyword, as NormPropConv2d does.
    `bias` is beta_i of eq. 9, which NormProp always learns."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        activation: str | None = "relu",
        jacobian: str = "divide",
        prelu_init: float = 0.25,
    ) -> None:
        factory = {"device": device, "dtype": dtype}
        super().__init__(out_features, activation, jacobian, prelu_init, bias, **factory)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.reset_parameters()

    def _op(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return F.linear(x, weight, bias)

    def _out_numel(self, x: Tensor) -> int:
        return x.shape[0] * self.out_features

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, {super().extra_repr()}"


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


def has_normprop_layers(model: nn.Module) -> bool:
    """Whether `model` has a NormProp layer, and so takes `constrain_unit_norm_` after every step."""
    return any(isinstance(m, NormPropLayer) for m in model.modules())


@torch.no_grad()
def constrain_unit_norm_(model: nn.Module) -> None:
    """Section 4.4: rescale every filter W_i of every NormProp layer in `model` to unit l2 norm.

    Call after each optimiser step. The forward pass divides by ||W_i||, so this never
    changes the function the model computes, only the optimisation: the gradient with
    respect to W_i scales with 1/||W_i||, so fixing ||W_i|| = 1 fixes the effective step.
    """
    layers = [m for m in model.modules() if isinstance(m, NormPropLayer)]
    weights = [m.weight for m in layers]
    if takes_triton(weights):  # CUDA: one Triton kernel over the flat buffer, where the layers have one
        from .triton_fold import unit_norm_

        if unit_norm_(layers):
            return
    if takes_fused(weights):  # CUDA: the fused weight-norm kernel, every filter in one kernel per layer
        fused_unit_norm_(weights)
    elif weights:
        norms = [torch.linalg.vector_norm(w, dim=tuple(range(1, w.ndim)), keepdim=True) for w in weights]
        torch._foreach_div_(weights, norms)


def sgd_step_and_constrain_(model: nn.Module, optimizer: torch.optim.Optimizer) -> bool:
    """`optimizer.step()` then `constrain_unit_norm_(model)`, where NormProp's layers take the triton road
    (fused.takes_triton: CUDA) and have one flat buffer: their SGD step and the constraint in one Triton kernel,
    torch's step for every other parameter; True then. Elsewhere nothing is done and False returned."""
    layers = [m for m in model.modules() if isinstance(m, NormPropLayer)]
    if not takes_triton([m.weight for m in layers]):
        return False
    from .triton_fold import sgd_and_unit_norm_

    return sgd_and_unit_norm_(layers, optimizer)
