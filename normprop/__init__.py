"""normprop: Normalization Propagation (Arpit et al., ICML 2016) as plain PyTorch layers.

The distribution is named `normprop`; this is its library name, and `normprop_cli` is the command
behind it. Everything public of `normprop_cli.nn` is here::

    from normprop import NormPropConv2d, NormPropLinear, constrain_unit_norm_, NIN, register_activation

See `help(normprop.NormPropConv2d)` for the layer's arguments and for pooling (not re-normalised).
"""

from normprop_cli import __version__
from normprop_cli import nn as _nn
from normprop_cli.nn import *  # noqa: F403

__all__ = ["__version__", *_nn.__all__]
