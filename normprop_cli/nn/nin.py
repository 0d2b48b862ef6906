"""The NIN backbone of section 5 (SPEC section 4), with the normalisation chosen by name.

C(192,5,1,2)-C(160,1,1,0)-P(3,2,1,max)-C(96,1,1,0)-C(192,5,1,2)-C(192,1,1,0)-P(3,2,1,avg)-
C(192,1,1,0)-C(192,5,1,0)-C(192,1,1,2)-C(K,1,1,0)-P(8,8,0,avg), on 32x32 inputs
(spatial 32 -> 16 -> 8 -> 4 -> 8 -> 1). Pooling is not re-normalised (section 3.2).
"""

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from . import normalizers as nz
from .layers import NormPropConv2d, NormPropLayer, fold
from .normalizers import activation_module, glorot_conv

# C(filters, size, stride, pad) and P(kernel, stride, pad, mode); "K" = number of classes.
ARCHITECTURE = (
    ("C", 192, 5, 1, 2),
    ("C", 160, 1, 1, 0),
    ("P", 3, 2, 1, "max"),
    ("C", 96, 1, 1, 0),
    ("C", 192, 5, 1, 2),
    ("C", 192, 1, 1, 0),
    ("P", 3, 2, 1, "avg"),
    ("C", 192, 1, 1, 0),
    ("C", 192, 5, 1, 0),
    ("C", 192, 1, 1, 2),
    ("C", "K", 1, 1, 0),
    ("P", 8, 8, 0, "avg"),
)

# (in_channels, out_channels, kernel, stride, padding, **options) -> module. The options are
# NIN's `activation`, `jacobian`, `width` and `renorm`; a factory takes the ones it uses.
ConvFactory = Callable[..., nn.Module]


@dataclass(frozen=True)
class Norm:
    block: ConvFactory  # a hidden conv layer, activation included
    classifier: ConvFactory  # the last conv, no activation
    activations: tuple[str, ...] | None = None  # the activations it takes; None: any


def _plain_conv(i, o, k, s, p, **_) -> nn.Module:
    return glorot_conv(i, o, k, s, p)


def _plain_block(i, o, k, s, p, activation="relu", **_) -> nn.Module:
    return nn.Sequential(glorot_conv(i, o, k, s, p), activation_module(activation))


def _batchnorm_block(i, o, k, s, p, activation="relu", **_) -> nn.Module:
    return nn.Sequential(glorot_conv(i, o, k, s, p, bias=False), nn.BatchNorm2d(o), activation_module(activation))


def _normprop_block(i, o, k, s, p, activation="relu", jacobian="divide", **_) -> nn.Module:
    return NormPropConv2d(i, o, k, s, p, activation=activation, jacobian=jacobian)


def _normprop_classifier(i, o, k, s, p, jacobian="divide", **_) -> nn.Module:
    return NormPropConv2d(i, o, k, s, p, activation=None, jacobian=jacobian)


NORMS: dict[str, Norm] = {
    "none": Norm(_plain_block, _plain_conv),
    "batchnorm": Norm(_batchnorm_block, _plain_conv),
    "normprop": Norm(_normprop_block, _normprop_classifier),
    # SPEC section 11: the batch-independent normalisers (normalizers.py), and Batch Renormalization
    "batchrenorm": Norm(nz.batchrenorm_block, _plain_conv),
    "weightnorm": Norm(nz.weightnorm_block, nz.weightnorm_conv),
    "layernorm": Norm(nz.layernorm_block, _plain_conv),
    "groupnorm": Norm(nz.groupnorm_block, _plain_conv),
    "ws-gn": Norm(nz.ws_gn_block, _plain_conv),
    "scaledws": Norm(nz.scaledws_block, _plain_conv),
    "frn": Norm(nz.frn_block, _plain_conv, activations=("relu",)),  # its TLU is the activation
}


def register_norm(
    name: str, block: ConvFactory, classifier: ConvFactory, activations: tuple[str, ...] | None = None
) -> None:
    """Make `NIN(norm=name)` build its hidden convs with `block` and its last with `classifier`."""
    NORMS[name] = Norm(block, classifier, activations)


def option_problem(norm: str, activation: str, data_init: bool = False) -> str | None:
    """Why a known norm cannot be built with these options (in the config's keys), or None."""
    takes = NORMS[norm].activations
    if takes is not None and activation not in takes:
        return f"model.norm={norm} takes model.activation={' or '.join(takes)}, not {activation}"
    if data_init and norm != "weightnorm":
        return "model.data_init=true is weight normalisation's; drop it or use model.norm=weightnorm"
    return None


class NIN(nn.Module):
    """Network in Network of the paper, logits [N, num_classes] from [N, in_channels, 32, 32]."""

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        norm: str = "normprop",
        width: float = 1.0,
        activation: str = "relu",
        jacobian: str = "divide",
        renorm: dict | None = None,
        data_init: bool = False,
    ) -> None:
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"unknown norm {norm!r}; known: {', '.join(sorted(NORMS))}")
        factories = NORMS[norm]
        problem = option_problem(norm, activation, data_init)
        if problem:
            raise ValueError(problem)
        options = {"activation": activation, "jacobian": jacobian, "width": width, "renorm": dict(renorm or {})}
        layers, channels, n_conv, n_pool = [], in_channels, 0, 0
        for kind, *spec in ARCHITECTURE:
            if kind == "P":
                n_pool += 1
                kernel, stride, pad, mode = spec
                pool = nn.MaxPool2d if mode == "max" else nn.AvgPool2d
                layers.append((f"pool{n_pool}", pool(kernel, stride, pad)))
                continue
            n_conv += 1
            filters, size, stride, pad = spec
            if filters == "K":
                conv = factories.classifier(channels, num_classes, size, stride, pad, **options)
                filters = num_classes
            else:
                filters = max(1, round(filters * width))
                conv = factories.block(channels, filters, size, stride, pad, **options)
            layers.append((f"conv{n_conv}", conv))
            channels = filters
        self.features = nn.Sequential(OrderedDict(layers))
        self.norm, self.num_classes, self.activation = norm, num_classes, activation
        self.data_init = bool(data_init)  # weightnorm: Salimans and Kingma's initialisation, `initialize`
        self._folded = [m for m in self.features if isinstance(m, NormPropLayer) and m.folded_path]

    def initialize(self, x: Tensor) -> None:
        """The data-dependent initialisation, where the model has one (`data_init`), on the batch x."""
        if self.data_init:
            nz.weightnorm_data_init_(self, x)

    def hidden_layers(self) -> list[nn.Module]:
        """The 9 conv layers in order (the 9th is the classifier); hook their inputs."""
        return [m for name, m in self.features.named_children() if name.startswith("conv")]

    def forward(self, x: Tensor) -> Tensor:
        if not (self._folded and self._folded[0]._folded_ok(x)):
            return self.features(x).flatten(1)
        shares = dict(zip(self._folded, fold(self._folded), strict=True))  # eq. 11, all at once
        for layer in self.features:
            x = layer(x, shares[layer]) if layer in shares else layer(x)
        return x.flatten(1)
