"""NormProp (Arpit et al., ICML 2016) as plain PyTorch layers, with the NIN backbone.

Use in your own model (`normprop` re-exports all of this: `from normprop import ...`)::

    from normprop import NormPropConv2d, NormPropLinear, constrain_unit_norm_

    model = nn.Sequential(NormPropConv2d(3, 64, 3, padding=1), nn.MaxPool2d(2), nn.Flatten(),
                          NormPropLinear(64 * 16 * 16, 10, activation=None))  # classifier
    loss_fn(model(x), y).backward(); optimizer.step()
    constrain_unit_norm_(model)  # section 4.4, after every step

Inputs should be normalised per element (section 4.1). `activation=` takes "relu" (default),
"prelu" (learnable slope), "tanh", "sigmoid", "identity" or a name given to
`register_activation`; `jacobian=` takes "divide" (ICML), "init" (arXiv) or "off". Pooling goes
after a layer as usual, not re-normalised (section 3.2; `help(NormPropConv2d)`).
This package imports only torch and numpy; timm for two of the normalisers (`ws-gn`, `scaledws`: its
weight-standardised convolutions) when they are built, and Triton for NormProp's triton road
(`fused.set_road("triton")`) when it is taken.
"""

from .dependence import input_dependent
from .layers import (
    JACOBIAN_MODES,
    NormPropConv2d,
    NormPropLayer,
    NormPropLinear,
    constrain_unit_norm_,
    reference_forward,
)
from .methods import METHODS, NORMS, Method, Norm, register_method, register_norm
from .nin import ARCHITECTURE, NIN
from .normalizers import BatchRenorm2d, weightnorm_data_init_
from .stats import (
    ACTIVATIONS,
    ActivationStats,
    DropoutScale,
    Moments,
    activation_stats,
    avgpool_stats,
    dropout_scale,
    identity_stats,
    maxpool_stats,
    normal_quadrature,
    prelu_stats,
    quadrature_stats,
    register_activation,
    relu_stats,
)

__all__ = [
    "ACTIVATIONS",
    "ARCHITECTURE",
    "JACOBIAN_MODES",
    "METHODS",
    "NIN",
    "NORMS",
    "ActivationStats",
    "Method",
    "Norm",
    "BatchRenorm2d",
    "DropoutScale",
    "Moments",
    "NormPropConv2d",
    "NormPropLayer",
    "NormPropLinear",
    "activation_stats",
    "avgpool_stats",
    "constrain_unit_norm_",
    "dropout_scale",
    "identity_stats",
    "input_dependent",
    "maxpool_stats",
    "normal_quadrature",
    "prelu_stats",
    "quadrature_stats",
    "reference_forward",
    "register_activation",
    "register_method",
    "register_norm",
    "relu_stats",
    "weightnorm_data_init_",
]
