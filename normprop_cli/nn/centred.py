"""NormProp with centred filters (`model.center`), an ablation of the drift experiment.

Each filter W_i (flattened over its patch, in_channels x kh x kw) is centred on its own mean before its
norm is taken, and eq. 11 is otherwise NormProp's:

    o_i = ( relu( gamma_i V_i^T x / (f ||V_i||) + beta_i ) - c2 ) / c1,   V_i = W_i - mean(W_i) 1

Why: the pre-activation's mean is W_i^T E[x]. After a ReLU, E[x] > 0, and while every input unit has
about the same mean m, W_i^T E[x] = m sum(W_i): it moves with the filter, and c2, c1 centre the
activation only for a zero-mean pre-activation. V_i sums to 0, so V_i^T (m 1) = 0 whatever the filter
learns: only the spread of the input means across units reaches the pre-activation.

Constants: V_i / ||V_i|| is a unit vector, so on white N(0, 1) input V_i^T x / ||V_i|| ~ N(0, 1) exactly
as with NormProp (Proposition 1 holds for any unit-norm row), and c2, c1 and the Jacobian factor f are
NormProp's own (ReLU: c2 = 1/sqrt(2 pi), c1 = sqrt(1/2 - 1/(2 pi)), f = 1.21). Like NormProp it uses no
batch statistic (one image at a time gives the same output) and folds for inference into one conv with
weight gamma_i V_i / (f c1 ||V_i||) and bias (beta_i - c2) / c1 followed by the clamp.

Relation to scaled weight standardisation (NFNets, `scaledws` in nn/normalizers.py, timm's ScaledStdConv2d):
its kernel is gain_i (W_i - mean(W_i)) / (std(W_i) sqrt(n)) times the activation's gain 1/c1, and
std(W_i) sqrt(n) = ||V_i||: the same unit-norm centred filter. With gain_i = gamma_i / f and its bias
beta_i / c1, a scaled-WS ReLU unit is relu(a_i) / c1, a_i = gamma_i V_i^T x / (f ||V_i||) + beta_i, while the
centred NormProp unit is (relu(a_i) - c2) / c1: the same function plus the constant c2 / c1 on every unit.
That constant passes through pooling and the next centred filter removes it (V_i^T 1 = 0), except where zero
padding cuts a patch short. So the two differ in their constants (c2 / c1, f scaling gamma's step, timm's
eps 1e-6 under the square root), in NormProp's unit-norm projection of W_i after every step, and, as the
zoo trains them, in scaled WS's adaptive gradient clipping; not in the function class.

Road: the plain autograd form of layers.py, centring inside `_op` (the weight `_op` receives is W_i
times a per-filter scale, whose row mean is the scale times W_i's) and in `filter_norms`;
`reference_forward` reads the same two, so it stays the term-by-term form. The folded fast path, which
reads the raw weights, is not taken. The unit-norm projection (section 4.4) stays on W_i: its
gradient is already orthogonal to 1 (the function sees only V_i), so only weight decay and the
projection move the mean of W_i, never the function.
"""

from __future__ import annotations

from torch import Tensor

from .layers import NormPropConv2d, NormPropLayer, NormPropLinear


def centre_rows(weight: Tensor) -> Tensor:
    """Each filter (first dimension) minus its own mean over the rest."""
    flat = weight.flatten(1)
    return (flat - flat.mean(1, keepdim=True)).view_as(weight)


class _Centred(NormPropLayer):
    """What the centred conv and linear layers share: V_i in place of W_i (module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)  # the conv or linear layer's own arguments, next in the MRO
        self._centre_init()

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, centred"

    def _centre_init(self) -> None:
        self.folded_path = False  # the fold reads the raw weights; centring takes the plain road

    def filter_norms(self) -> Tensor:
        """||V_i||, V_i = W_i - mean(W_i): the norm of the centred filter."""
        return centre_rows(self.weight).flatten(1).norm(dim=1).clamp_min(1e-12)

    def _op(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return super()._op(x, centre_rows(weight), bias)


class CentredNormPropConv2d(_Centred, NormPropConv2d):
    """NormPropConv2d on centred filters V_i = W_i - mean(W_i) (module docstring)."""


class CentredNormPropLinear(_Centred, NormPropLinear):
    """NormPropLinear (eq. 9) on centred rows V_i = W_i - mean(W_i)."""
