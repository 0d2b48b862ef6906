"""The NIN backbone of section 5, with the normalisation chosen by name.

C(192,5,1,2)-C(160,1,1,0)-P(3,2,1,max)-C(96,1,1,0)-C(192,5,1,2)-C(192,1,1,0)-P(3,2,1,avg)-
C(192,1,1,0)-C(192,5,1,0)-C(192,1,1,2)-C(K,1,1,0)-P(8,8,0,avg), on 32x32 inputs
(spatial 32 -> 16 -> 8 -> 4 -> 8 -> 1). Pooling is not re-normalised (section 3.2).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor, nn

from . import fastnorm, online  # noqa: F401  (each declares its methods)
from . import normalizers as nz
from .folded import fold_layers
from .layers import NormPropLayer, jacobian_problem
from .methods import NORMS, register_method
from .oracle import SigmaOracle, normprop_conv, oracle_every, variant_options, variant_problem
from .stats import ACTIVATIONS, PARAMETRIC

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


def _normprop_block(i, o, k, s, p, activation="relu", jacobian="divide", **variant) -> nn.Module:
    conv = normprop_conv(**{v: variant.get(v, False) for v in VARIANTS})  # the oracles, centring (nn.oracle)
    return conv(i, o, k, s, p, activation=activation, jacobian=jacobian)


def _normprop_classifier(i, o, k, s, p, jacobian="divide", **variant) -> nn.Module:
    conv = normprop_conv(**{v: variant.get(v, False) for v in VARIANTS})
    return conv(i, o, k, s, p, activation=None, jacobian=jacobian)


# NormProp, twice: the ICML form (eq. 11: divide by the Jacobian factor) and the arXiv form (gamma
# initialised to 1 / factor); and, as an ablation of the normalizers experiment, where every method
# shares the plain classifier (model.classifier=plain), NormProp with its own normalised classifier
# conv (eq. 11 without activation).
register_method("normprop-icml", "NormProp (ICML)", norm="normprop", block=_normprop_block,
                classifier=_normprop_classifier, model={"jacobian": "divide"})  # fmt: skip
register_method("normprop-arxiv", "NormProp (arXiv)", norm="normprop", model={"jacobian": "init"})
register_method("normprop-icml-own-classifier", "NormProp (ICML), own classifier", norm="normprop",
                model={"jacobian": "divide", "classifier": "own"})  # fmt: skip


@dataclass(frozen=True)
class NINConfig:
    """The NIN's options, conf/model/nin.yaml typed (as nanoGPT's GPTConfig): what `NIN` builds."""

    norm: str = "normprop"  # a member of methods.NORMS
    width: float = 1.0  # scales the hidden widths; 1.0 is the paper's
    activation: str = "relu"  # stats.ACTIVATIONS, or prelu (section 4.6)
    jacobian: str = "divide"  # layers.JACOBIAN_MODES: divide (ICML eq. 11) | init (arXiv) | off
    renorm: dict = field(default_factory=dict)  # Batch Renormalization's limits (norm=batchrenorm)
    data_init: bool = False  # weightnorm: Salimans and Kingma's data-dependent initialisation
    classifier: str = "own"  # own: the norm's classifier conv | plain: the same plain conv for every norm
    freeze_affine: bool = False  # gamma and beta (NormProp's, a norm layer's weight and bias) stay at their init
    sigma_oracle_every: int = 0  # > 0: NormProp divides by sqrt(W_i^T Sigma W_i) / sigma (nn.oracle), Sigma
    # refreshed on a held-out batch every this many training steps; 0: off (NormProp's ||W_i||)
    mean_oracle_every: int = 0  # > 0: NormProp subtracts W_i^T m, m the held-out input patches' mean (nn.oracle)
    center: bool = False  # each filter centred on its own mean before its norm is taken (nn.centred)

    @classmethod
    def from_dict(cls, options: dict) -> NINConfig:
        """From the model's YAML (without `arch`); an unknown option is a ValueError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"model.{unknown[0]} is not a NIN option; known: {', '.join(sorted(known))}")
        return cls(**options)

    def problem(self) -> str | None:
        """Why this config cannot be built (in the config's keys), or None; the registries decide."""
        for key, value, known in (
            ("norm", self.norm, tuple(NORMS)),
            ("activation", self.activation, (*ACTIVATIONS, *PARAMETRIC)),
        ):
            if value not in known:
                return f"model.{key}={value} is not known; use one of {', '.join(known)}"
        if problem := jacobian_problem(self.jacobian, key="model.jacobian"):
            return problem
        if not self.width > 0:
            return f"model.width must be positive, got {self.width}"
        takes = NORMS[self.norm].activations
        if takes is not None and self.activation not in takes:
            return f"model.norm={self.norm} takes model.activation={' or '.join(takes)}, not {self.activation}"
        if self.classifier not in CLASSIFIERS:
            return f"model.classifier={self.classifier} is not known; use one of {', '.join(CLASSIFIERS)}"
        if self.data_init and self.norm != "weightnorm":
            return "model.data_init=true is weight normalisation's; drop it or use model.norm=weightnorm"
        return variant_problem(self)


CLASSIFIERS = ("own", "plain")
VARIANTS = ("sigma_oracle", "mean_oracle", "center")  # NormProp's block options (oracle.variant_options)


def feature_sizes(image_size: int = 32) -> list[tuple[str, int]]:
    """(layer kind, spatial size of its output) through ARCHITECTURE for square inputs."""
    out, size = [], image_size
    for kind, *spec in ARCHITECTURE:
        _, kernel, stride, pad = spec if kind == "C" else (None, *spec[:3])
        size = (size + 2 * pad - kernel) // stride + 1
        out.append((kind, size))
    return out


def _min_image_size() -> int:
    """The smallest side every layer of ARCHITECTURE has an output for (29: 29 -> 15 -> 8 -> 4 -> 8 -> 1);
    a smaller input fails in pooling ("Output size is too small")."""
    return next(n for n in range(1, 1024) if all(size >= 1 for _, size in feature_sizes(n)))


MIN_IMAGE_SIZE = _min_image_size()  # NIN.forward refuses a smaller height or width at once


def values_per_channel(norm: str, batch_size: int, image_size: int = 32) -> int | None:
    """The fewest values a batch-statistics layer (BN, BRN) normalises per channel in a training
    step: the batch times the smallest spatial size of a hidden conv's output; None for the norms
    that use no batch statistics. Under 2 there is no variance to normalise by."""
    if norm not in NORMS or not NORMS[norm].batch_statistics:
        return None
    hidden = [size for kind, size in feature_sizes(image_size) if kind == "C"][:-1]  # the classifier has no BN
    return batch_size * min(size * size for size in hidden)


def affine_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The learnt per-unit gains and biases of the normalisation: NormProp's gamma and beta (eq. 11),
    and the weight and bias of the norm layers that follow a conv (BN, BRN, GN, ...)."""
    out = []
    for m in model.modules():
        if isinstance(m, NormPropLayer):
            out += [m.gamma, m.beta]
        elif isinstance(m, (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)) and m.weight is not None:
            out += [m.weight, m.bias]
    return out


class NIN(nn.Module):
    """Network in Network of the paper, logits [N, num_classes] from [N, in_channels, 32, 32]; an input
    under MIN_IMAGE_SIZE (29) a side is a ValueError.

    NIN(10, 3, "normprop", 0.25) or NIN(norm="batchnorm", activation="tanh"): `norm`, `width`,
    `activation` and any other NINConfig field given replace those of `config` (default NINConfig()).
    Pooling is plain nn.MaxPool2d / nn.AvgPool2d, not re-normalised (section 3.2: neighbouring units
    are highly correlated, so pooling barely moves their mean and std)."""

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        norm: str | NINConfig | None = None,
        width: float | None = None,
        activation: str | None = None,
        *,
        config: NINConfig | None = None,
        **options,
    ) -> None:
        super().__init__()
        if isinstance(norm, NINConfig):  # NIN(10, 3, config): a NINConfig given by position is the config
            config, norm = norm, None
        given = {"norm": norm, "width": width, "activation": activation}
        config = replace(config or NINConfig(), **{k: v for k, v in given.items() if v is not None}, **options)
        problem = config.problem()
        if problem:
            raise ValueError(problem)
        factories, width, norm = NORMS[config.norm], config.width, config.norm
        options = {"activation": config.activation, "jacobian": config.jacobian, "width": width,
                   "renorm": dict(config.renorm)}  # fmt: skip
        options |= variant_options(config)  # only those set: the other norms' factories never see them
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
                own = factories.classifier if config.classifier == "own" else None
                make = own or nz.plain_conv
                conv = make(channels, num_classes, size, stride, pad, **options)
                filters = num_classes
            else:
                filters = max(1, round(filters * width))
                conv = factories.block(channels, filters, size, stride, pad, **options)
            layers.append((f"conv{n_conv}", conv))
            channels = filters
        self.features = nn.Sequential(OrderedDict(layers))
        if config.freeze_affine:
            for p in affine_parameters(self):
                p.requires_grad_(False)
        self.config, self.norm, self.num_classes, self.activation = config, norm, num_classes, config.activation
        self.data_init = config.data_init  # weightnorm: Salimans and Kingma's initialisation, `initialize`
        self._folded = [m for m in self.features if isinstance(m, NormPropLayer) and m.folded_path]
        if oracle_every(config):  # the held-out batch and the refresh before every n-th training step
            self.sigma_oracle = SigmaOracle(oracle_every(config))
            self.register_forward_pre_hook(self.sigma_oracle.before_forward)

    def initialize(self, x: Tensor) -> None:
        """The data-dependent initialisation, where the model has one (`data_init`), on the batch x."""
        if self.data_init:
            nz.weightnorm_data_init_(self, x)

    def hidden_layers(self) -> list[nn.Module]:
        """The 9 conv layers in order (the 9th is the classifier); hook their inputs."""
        return [m for name, m in self.features.named_children() if name.startswith("conv")]

    def _roads(self, x: Tensor) -> tuple[bool, ...]:
        """Each folded layer's road (`NormPropLayer._road`) for an input like x, from ARCHITECTURE's
        geometry alone (no module is called, so no hook sees a stand-in), once per input shape."""
        key = (tuple(x.shape), x.device.type, torch.is_autocast_enabled(x.device.type))
        cache = self.__dict__.setdefault("_road_cache", {})
        if key not in cache:
            (h, w), roads = x.shape[-2:], []
            sizes = zip([h, *(s for _, s in feature_sizes(h))], [w, *(s for _, s in feature_sizes(w))], strict=True)
            for m, (hi, wi) in zip(self.features, sizes, strict=False):  # each module's input size
                if m in self._folded:
                    shape = (x.shape[0], m.weight.shape[1] * getattr(m, "groups", 1), hi, wi)
                    roads.append(not key[2] and m.scales_output(torch.empty(shape, device="meta")))  # autocast: weights
            cache[key] = tuple(roads)
        return cache[key]

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim >= 2 and min(x.shape[-2], x.shape[-1]) < MIN_IMAGE_SIZE:  # shapes are ints: no sync
            raise ValueError(
                f"NIN takes images of at least {MIN_IMAGE_SIZE}x{MIN_IMAGE_SIZE} (its pooling leaves nothing of "
                f"a smaller one), got {x.shape[-2]}x{x.shape[-1]}; resize or pad the input (e.g. to 32x32)"
            )
        if not (self._folded and self._folded[0]._folded_ok(x)):
            return self.features(x).flatten(1)
        folds = dict(zip(self._folded, fold_layers(self._folded, self._roads(x)), strict=True))  # eq. 11, all at once
        for m in self.features:
            x = m(x, fold=folds[m]) if m in folds else m(x)  # through __call__: every hook sees the layer's input
        return x.flatten(1)
