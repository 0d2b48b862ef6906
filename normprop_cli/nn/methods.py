"""The normalisation methods that `normprop run normalizers`, `normprop bench` and `make gpu-check`
compare: a method's name and the model options that build it on the NIN.

NormProp enters twice, in its ICML form (eq. 11: divide by the Jacobian factor) and its arXiv form
(gamma initialised to 1 / factor); every other method is one member of the `norm` registry (nin.NORMS).
"""

from __future__ import annotations

METHODS: dict[str, dict[str, str | bool | float]] = {
    "none": {"norm": "none"},
    "batchnorm": {"norm": "batchnorm"},
    "batchrenorm": {"norm": "batchrenorm"},
    "weightnorm": {"norm": "weightnorm", "data_init": True},  # as Salimans and Kingma train it
    "layernorm": {"norm": "layernorm"},
    "groupnorm": {"norm": "groupnorm"},
    "ws-gn": {"norm": "ws-gn"},
    "scaledws": {"norm": "scaledws", "train.agc": 0.01},  # with NFNets' adaptive gradient clipping (their 0.01)
    "frn": {"norm": "frn"},
    "evonorm": {"norm": "evonorm"},
    "online": {"norm": "online"},
    "normprop-icml": {"norm": "normprop", "jacobian": "divide"},
    "normprop-arxiv": {"norm": "normprop", "jacobian": "init"},
    # An ablation where every method shares the plain classifier (model.classifier=plain): NormProp's own,
    # normalised classifier conv (eq. 11 without activation)
    "normprop-icml-own-classifier": {"norm": "normprop", "jacobian": "divide", "classifier": "own"},
}

# Methods whose training-mode output depends on the other examples of the batch (or, at batch 1, on
# the image's own spatial statistics) and whose evaluation mode uses running estimates instead.
BATCH_STATISTICS = ("batchnorm", "batchrenorm")


def model_options(method: str) -> dict[str, str | bool | float]:
    """The NIN options a method sets (NIN(**model_options(m)) builds its model)."""
    return {k: v for k, v in METHODS[method].items() if "." not in k}


def settings(method: str) -> dict[str, str | bool | float]:
    """The config keys a method sets, as dotted keys: `model.<key>` for a bare key, others as written
    (e.g. `train.agc`)."""
    return {k if "." in k else f"model.{k}": v for k, v in METHODS[method].items()}


def method_of(model_cfg, among=None) -> str:
    """The method name of a model config. With `among` (method names): the one of them whose model
    keys all match the config, the most specific where several do (normprop-icml-own-classifier over
    normprop-icml); without: the norm, and NormProp's Jacobian form."""
    get = (lambda k, d=None: model_cfg.get(k, d)) if isinstance(model_cfg, dict) else model_cfg.get
    if among is not None:
        defaults = {"classifier": "own", "jacobian": "divide", "data_init": False}
        fits = [m for m in among
                if all(get(k, defaults.get(k)) == v for k, v in METHODS[m].items() if "." not in k)]  # fmt: skip
        if fits:
            return max(fits, key=lambda m: sum("." not in k for k in METHODS[m]))
    norm = get("norm")
    if norm != "normprop":
        return norm
    jacobian = get("jacobian")
    return {"divide": "normprop-icml", "init": "normprop-arxiv"}.get(jacobian, f"normprop-{jacobian}")
