"""The registry of normalisation methods: what the NIN builds for `model.norm`, and the methods that
`normprop run normalizers`, `normprop bench` and `make gpu-check` compare.

A *norm* is a layer family, `model.norm=<name>`: the factory of a hidden conv block (conv,
normalisation, activation), the factory of the classifier conv, the activations it takes and
whether its training-mode output depends on the other examples of the batch. A *method* is a named,
labelled setting of a norm (NormProp enters as `normprop-icml`, eq. 11 dividing by the Jacobian
factor, and `normprop-arxiv`, gamma initialised to 1 / factor) with the config keys it sets.

Each is declared once, where its layer is defined, by one call::

    register_method("evonorm", "EvoNorm-S0", block=evonorm_block, activations=("relu",))

(`nn/normalizers.py`, `nn/online.py`, `nn/nin.py`). A method with a `block` registers its norm
(named `norm`, default the method's name) too; one without reuses a norm declared before. Adding a
normaliser is then one Python file that calls `register_method` (imported before the run is
configured) plus its name in an experiment's `experiment.methods` list; the trainer, bench, the
experiments and the report read everything else from here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from torch import nn

# (in_channels, out_channels, kernel, stride, padding, **options) -> module. The options are
# NIN's `activation`, `jacobian`, `width` and `renorm`; a factory takes the ones it uses.
ConvFactory = Callable[..., nn.Module]


@dataclass(frozen=True)
class Norm:
    """A layer family of the NIN, `model.norm=<name>`."""

    block: ConvFactory  # a hidden conv layer, activation included
    classifier: ConvFactory | None = None  # the last conv, no activation; None: the plain Glorot conv
    activations: tuple[str, ...] | None = None  # the activations it takes; None: any
    batch_statistics: bool = False  # training mode normalises by the batch's statistics (BN, BRN)
    # the names (last component) of its kernels: the conv and linear filters, the only parameters that
    # train.decay=weights decays; every other parameter is a gain, bias or other per-unit parameter
    kernels: tuple[str, ...] = ("weight",)


@dataclass(frozen=True)
class Method:
    """A named setting of a norm: the config keys it sets (dotted: `model.norm`, `model.jacobian`,
    `train.agc`, ...), and the label tables and figures show."""

    name: str
    label: str
    norm: str
    settings: Mapping[str, object] = field(default_factory=dict)

    @property
    def batch_statistics(self) -> bool:
        return NORMS[self.norm].batch_statistics

    def model_options(self) -> dict:
        """The NIN options this method sets (NIN(**method.model_options()) builds its model)."""
        return {k.removeprefix("model."): v for k, v in self.settings.items() if k.startswith("model.")}


NORMS: dict[str, Norm] = {}
METHODS: dict[str, Method] = {}


def register_norm(
    name: str,
    block: ConvFactory,
    classifier: ConvFactory | None = None,
    activations: tuple[str, ...] | None = None,
    batch_statistics: bool = False,
    kernels: tuple[str, ...] = ("weight",),
) -> Norm:
    """Make `NIN(norm=name)` build its hidden convs with `block` and its last with `classifier`
    (None: a plain Glorot conv, as every method's under `model.classifier=plain`). `kernels` names its
    filters (a parameter's last name component); all its other parameters are gains and biases."""
    activations = tuple(activations) if activations is not None else None
    norm = Norm(block, classifier, activations, batch_statistics, tuple(kernels))
    NORMS[name] = norm
    return norm


def register_method(
    name: str,
    label: str,
    *,
    norm: str | None = None,
    block: ConvFactory | None = None,
    classifier: ConvFactory | None = None,
    activations: tuple[str, ...] | None = None,
    batch_statistics: bool = False,
    kernels: tuple[str, ...] = ("weight",),
    model: Mapping[str, object] | None = None,
    train: Mapping[str, object] | None = None,
) -> Method:
    """Declare the method `name` (shown as `label`): the norm `norm` (default `name`), registered
    here with `block`, `classifier`, `activations`, `batch_statistics` and `kernels` when `block` is given,
    plus the NIN options (`model`, e.g. `{"jacobian": "init"}`) and training keys (`train`, e.g.
    `{"agc": 0.01}`) it sets. A ValueError where the norm is neither given a block nor known."""
    norm = norm or name
    if block is not None:
        register_norm(norm, block, classifier, activations, batch_statistics, kernels)
    elif norm not in NORMS:
        raise ValueError(f"method {name}: norm {norm!r} is not registered; give its block=")
    settings = {"model.norm": norm} | {f"model.{k}": v for k, v in (model or {}).items()}
    settings |= {f"train.{k}": v for k, v in (train or {}).items()}
    method = Method(name, label, norm, MappingProxyType(settings))
    METHODS[name] = method
    return method


def settings(method: str) -> dict[str, object]:
    """The config keys a method sets, as dotted keys (`model.norm`, `train.agc`, ...)."""
    return dict(METHODS[method].settings)


def model_options(method: str) -> dict[str, object]:
    """The NIN options a method sets (NIN(**model_options(m)) builds its model)."""
    return METHODS[method].model_options()


def label(method: str) -> str:
    """A method's label; a name that is no registered method as it is."""
    return METHODS[method].label if method in METHODS else method


def method_of(model_cfg) -> str:
    """The name under which a run with this model config is recorded where no grid chose a method
    (the paper's experiments): the norm, and NormProp's Jacobian form (normprop-icml, normprop-arxiv)."""
    get = (lambda k, d=None: model_cfg.get(k, d)) if isinstance(model_cfg, dict) else model_cfg.get
    norm = get("norm")
    if norm != "normprop":
        return norm
    jacobian = get("jacobian")
    return {"divide": "normprop-icml", "init": "normprop-arxiv"}.get(jacobian, f"normprop-{jacobian}")


def is_kernel(name: str, parameter, norm: str | None = None) -> bool:
    """Is this parameter (dotted `name` in its model) a kernel of `norm`: a filter of 2 or more dimensions
    whose last name component the norm declares in `kernels` (default `weight`)? Everything else, the
    gains, biases, thresholds and other per-unit parameters, is not (it takes no weight decay under
    train.decay=weights, whatever its shape: weight norm's g and scaled WS's gain are C x 1 x 1 x 1)."""
    kernels = NORMS[norm].kernels if norm in NORMS else ("weight",)
    return parameter.ndim >= 2 and name.rsplit(".", 1)[-1] in kernels
