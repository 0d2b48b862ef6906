"""The normalisation methods that `normprop run normalizers`, `normprop bench` and `make gpu-check`
compare: a method's name and the model options that build it on the NIN.

NormProp enters twice, in its ICML form (eq. 11: divide by the Jacobian factor) and its arXiv form
(gamma initialised to 1 / factor); every other method is one member of the `norm` registry (nin.NORMS).
"""

from __future__ import annotations

METHODS: dict[str, dict[str, str | bool]] = {
    "none": {"norm": "none"},
    "batchnorm": {"norm": "batchnorm"},
    "batchrenorm": {"norm": "batchrenorm"},
    "weightnorm": {"norm": "weightnorm", "data_init": True},  # as Salimans and Kingma train it
    "layernorm": {"norm": "layernorm"},
    "groupnorm": {"norm": "groupnorm"},
    "ws-gn": {"norm": "ws-gn"},
    "scaledws": {"norm": "scaledws"},
    "frn": {"norm": "frn"},
    "normprop-icml": {"norm": "normprop", "jacobian": "divide"},
    "normprop-arxiv": {"norm": "normprop", "jacobian": "init"},
}

# Methods whose training-mode output depends on the other examples of the batch (or, at batch 1, on
# the image's own spatial statistics) and whose evaluation mode uses running estimates instead.
BATCH_STATISTICS = ("batchnorm", "batchrenorm")


def method_of(model_cfg) -> str:
    """The method name of a model config (norm, and NormProp's Jacobian form)."""
    norm = model_cfg["norm"] if isinstance(model_cfg, dict) else model_cfg.norm
    if norm != "normprop":
        return norm
    jacobian = model_cfg["jacobian"] if isinstance(model_cfg, dict) else model_cfg.jacobian
    return {"divide": "normprop-icml", "init": "normprop-arxiv"}.get(jacobian, f"normprop-{jacobian}")
