"""The Sigma-oracle (`model.sigma_oracle_every`): NormProp that divides each filter by the std its
pre-activation has on a held-out batch, instead of by ||W_i||; a diagnostic of the drift experiment,
not a method of the paper.

Proposition 1 (section 3.2): with E[x x^T] = sigma^2 I, var(W_i^T x) = sigma^2 ||W_i||^2, so dividing by
||W_i|| keeps the input's variance. For any input covariance Sigma, var(W_i^T x) = W_i^T Sigma W_i, so

    SigmaOracleConv2d divides by  sqrt(W_i^T Sigma W_i) / sigma = sqrt(W_i^T A W_i),  A = Sigma / sigma^2,

with W_i the filter flattened over its patch (in_channels x kh x kw), Sigma the covariance of the layer's
input patches and sigma^2 = tr(Sigma) / n their average variance: W_i^T x keeps the input's average
variance whatever Sigma, and under white input A = I gives ||W_i|| back. All else is NormProp's eq. 11
(gamma, beta, the Jacobian factor, the activation's constants, the unit-norm projection); the division
takes the plain autograd road (layers.py), the gradient flowing through W_i in sqrt(W_i^T A W_i) with A
held fixed. A starts at I (plain NormProp).

The mean oracle (`model.mean_oracle_every`, alone or with the Sigma-oracle: `OracleConv2d(mean=True)`)
subtracts W_i^T m from W_i * x, m the mean of the same held-out patches: the pre-activation's mean, which
eq. 11's fixed c2 assumes to be 0 (it is W_i^T E[x], and E[x] > 0 after a ReLU). m is held fixed between
refreshes and the gradient flows through W_i in W_i^T m. Zero padding aside (a cut patch is not centred),
the pre-activation then has mean 0 on the held-out images.

`SigmaOracle` (the NIN's child `sigma_oracle`, which refreshes both oracles) holds the held-out batch,
already data-normalised, that `give` hands it (the drift experiment's observer: fixed validation images),
and refreshes every layer's A (and m) from it without gradient: at `give`, then before every `every`-th
training step (a forward pre-hook on the model: training-mode forwards are the SGD steps). One pass of the
batch through the network refreshes the layers in order, each from its input under the layers before it
already refreshed. The patches are those whose whole patch lies on input-dependent positions (nn.dependence:
no padding, no constant border), at most `positions` per image at positions drawn from a generator seeded by
the layer alone (the same at every refresh). The batch and the step count are the module's extra state, A
(and m) each layer's buffers: a checkpoint resumes the oracle exactly.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .centred import CentredNormPropConv2d
from .dependence import input_dependent
from .layers import NormPropConv2d

POSITIONS = 32  # patches per image behind a layer's covariance (all where a map has fewer full patches)
CHUNK = 100  # images unfolded at once: bounds the unfolded copy of a 5x5 layer's input
NO_BATCH = (
    "model.sigma_oracle_every needs a held-out batch: call model.sigma_oracle.give(model, x) before training "
    "(the drift experiment's observer gives fixed validation images)"
)


class OracleConv2d(NormPropConv2d):
    """NormPropConv2d with either oracle or both (module docstring): `sigma` divides by sqrt(W_i^T A W_i),
    `mean` subtracts W_i^T m from W_i * x. `metric` is A, `patch_mean` m, `input_var` sigma^2 at the last
    refresh (NaN before any)."""

    def __init__(self, *args, sigma: bool = True, mean: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not (sigma or mean):
            raise ValueError("an oracle layer needs sigma=True, mean=True or both; plain NormProp is NormPropConv2d")
        self.sigma, self.mean = bool(sigma), bool(mean)
        self.folded_path = False  # the plain autograd form, which divides by filter_norms() and calls _op
        n = self.weight[0].numel()
        self.register_buffer("metric", torch.eye(n, dtype=self.weight.dtype, device=self.weight.device))
        if self.mean:  # only then: a Sigma-oracle's state_dict stays as it was
            self.register_buffer("patch_mean", torch.zeros(n, dtype=self.weight.dtype, device=self.weight.device))
        self.register_buffer("input_var", torch.full((), float("nan"), device=self.weight.device))

    def filter_norms(self) -> Tensor:
        """sqrt(W_i^T A W_i) per filter: the Sigma-oracle's divisor in place of ||W_i|| (A = I without it)."""
        if not self.sigma:
            return self.plain_norms()
        w = self.weight.flatten(1)
        return ((w @ self.metric.to(w.dtype)) * w).sum(1).clamp_min(1e-12).sqrt()

    def plain_norms(self) -> Tensor:
        """||W_i||, what NormProp divides by."""
        return torch.linalg.vector_norm(self.weight.flatten(1), dim=1)

    def _op(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """W * x, minus W_i^T m per filter with the mean oracle: `weight` is W_i times a per-filter scale
        s_i, so its rows give s_i W_i^T m, the scaled pre-activation's mean on the held-out patches."""
        out = super()._op(x, weight, bias)
        if not self.mean:
            return out
        shift = weight.flatten(1) @ self.patch_mean.to(weight.dtype)
        return out - shift.view(1, -1, *(1,) * (out.ndim - 2))

    @torch.no_grad()
    def set_moments(self, mean: Tensor, cov: Tensor | None) -> None:
        """m = mean; A = cov / (tr(cov) / n) (a covariance with no trace, a dead input, leaves A as it is)."""
        if self.mean and torch.isfinite(mean).all():
            self.patch_mean.copy_(mean.to(self.patch_mean.dtype))
        if cov is None:
            return
        var = torch.diagonal(cov).mean()
        self.input_var.fill_(float(var))
        if self.sigma and var > 0 and torch.isfinite(cov).all():
            self.metric.copy_((cov / var).to(self.metric.dtype))

    def set_covariance(self, cov: Tensor) -> None:
        """A from the input-patch covariance alone."""
        self.set_moments(torch.full(cov.shape[:1], float("nan")), cov)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, oracle={'+'.join(k for k in ('mean', 'sigma') if getattr(self, k))}"


class SigmaOracleConv2d(OracleConv2d):
    """The Sigma-oracle alone: NormPropConv2d dividing by sqrt(W_i^T A W_i) (module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, sigma=True, mean=False, **kwargs)


def full_positions(mask: Tensor, conv: nn.Module) -> Tensor:
    """The flat output positions of `conv` whose whole patch lies on True positions of its input mask [H, W]."""
    ones = torch.ones(1, 1, *conv.kernel_size, dtype=torch.float64)
    seen = F.conv2d(mask[None, None].double().cpu(), ones, None, conv.stride, conv.padding, conv.dilation)
    return torch.nonzero(seen.flatten() == conv.kernel_size[0] * conv.kernel_size[1]).flatten()


@torch.no_grad()
def patch_moments(x: Tensor, conv: nn.Module, mask: Tensor, positions: int, seed: int, covariance: bool = True):
    """The mean [n] and covariance [n, n] (float64; the covariance None where not asked for) of the full
    patches of x [N, C, H, W] for `conv`: `positions` per image drawn from a generator seeded by `seed`
    (every full patch where there are no more)."""
    where = full_positions(mask, conv)
    gen = torch.Generator().manual_seed(seed)
    take = len(where) <= positions
    picked = []
    for part in x.split(CHUNK):
        cols = F.unfold(part.float(), conv.kernel_size, conv.dilation, conv.padding, conv.stride)  # [b, n, L]
        if take:
            pos = where.expand(len(part), -1)
        else:
            pos = where[torch.rand(len(part), len(where), generator=gen).argsort(1)[:, :positions]]  # no repeats
        rows = torch.arange(len(part), device=cols.device)[:, None]
        picked.append(cols.transpose(1, 2)[rows, pos.to(cols.device)].flatten(0, 1))
    patches = torch.cat(picked)
    mean = patches.double().mean(0)
    if not covariance:
        return mean, None
    d = patches - mean.to(patches.dtype)  # centred in float64, multiplied in float32
    return mean, (d.T @ d).double() / len(d)


def patch_covariance(x: Tensor, conv: nn.Module, mask: Tensor, positions: int, seed: int) -> Tensor:
    """The covariance [n, n] (float64) of the full patches of x for `conv` (patch_moments)."""
    return patch_moments(x, conv, mask, positions, seed)[1]


class SigmaOracle(nn.Module):
    """The held-out batch and the refresh of every SigmaOracleConv2d of a NIN (module docstring)."""

    def __init__(self, every: int, positions: int = POSITIONS) -> None:
        super().__init__()
        self.every, self.positions = int(every), int(positions)
        self.held_out: Tensor | None = None
        self.steps = 0  # training-mode forwards seen: the SGD steps

    def get_extra_state(self) -> dict:
        return {"steps": self.steps, "held_out": self.held_out}

    def set_extra_state(self, state: dict) -> None:
        self.steps, self.held_out = int(state["steps"]), state["held_out"]

    def give(self, model: nn.Module, x: Tensor) -> None:
        """Keep x (data-normalised images [N, C, H, W]) as the held-out batch and refresh at once."""
        self.held_out = x.detach().clone()
        self.refresh(model)

    def before_forward(self, model: nn.Module, args) -> None:
        """The model's forward pre-hook: before every `every`-th training step, refresh."""
        if not model.training:
            return
        if self.held_out is None:
            raise RuntimeError(NO_BATCH)
        if self.steps and self.steps % self.every == 0:
            self.refresh(model)
        self.steps += 1

    @torch.no_grad()
    def refresh(self, model: nn.Module) -> None:
        """Every oracle layer's A from the held-out batch, in one pass, layer after layer."""
        if self.held_out is None:
            raise RuntimeError(NO_BATCH)
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the Sigma-oracle refreshes from Python between steps, which a CUDA graph cannot hold")
        layers = model.hidden_layers()
        device = layers[0].weight.device
        x = self.held_out.to(device)
        masks = input_dependent(model, tuple(x.shape[1:]))

        def hook(k: int):
            def pre(module, inputs):
                moments = patch_moments(inputs[0], module, masks[k], self.positions, seed=k, covariance=module.sigma)
                module.set_moments(*moments)

            return pre

        handles = [m.register_forward_pre_hook(hook(k)) for k, m in enumerate(layers, 1)
                   if isinstance(m, OracleConv2d)]  # fmt: skip
        try:
            model.features(x)
        finally:
            for h in handles:
                h.remove()

    def extra_repr(self) -> str:
        return f"every={self.every}, positions={self.positions}"


def oracle_layers(model: nn.Module) -> list[tuple[int, OracleConv2d]]:
    """(k, layer) for the conv layers k = 1, 2, ... of `model.hidden_layers()` that are oracle layers."""
    return [(k, m) for k, m in enumerate(model.hidden_layers(), 1) if isinstance(m, OracleConv2d)]


def normprop_conv(sigma_oracle: bool = False, mean_oracle: bool = False, center: bool = False):
    """The NormProp conv class (or factory) of a NIN variant: the oracles' (model.sigma_oracle_every,
    model.mean_oracle_every), centred filters' (model.center, nn.centred) or plain NormProp's."""
    if center and (sigma_oracle or mean_oracle):
        raise ValueError("model.center and the oracles are separate ablations; set one of them")
    if center:
        return CentredNormPropConv2d
    if sigma_oracle and not mean_oracle:
        return SigmaOracleConv2d
    if sigma_oracle or mean_oracle:
        return partial(OracleConv2d, sigma=bool(sigma_oracle), mean=bool(mean_oracle))
    return NormPropConv2d


def variant_options(config) -> dict:
    """The NIN block options of a NINConfig's NormProp variant: only those set, so that other norms'
    factories never see them."""
    keys = {"sigma_oracle": config.sigma_oracle_every, "mean_oracle": config.mean_oracle_every,
            "center": config.center}  # fmt: skip
    return {k: True for k, v in keys.items() if v}


def variant_problem(config) -> str | None:
    """Why a NINConfig's oracle or centring options cannot be built, or None."""
    for key in ("sigma_oracle_every", "mean_oracle_every"):
        value = getattr(config, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"model.{key} must be a whole number, 0 or more, got {value}"
    sigma, mean = config.sigma_oracle_every, config.mean_oracle_every
    for key, value in (("sigma_oracle_every", sigma), ("mean_oracle_every", mean), ("center", config.center)):
        if value and config.norm != "normprop":
            return f"model.{key} is NormProp's; use model.norm=normprop or leave it off"
    if sigma and mean and sigma != mean:
        return "model.sigma_oracle_every and model.mean_oracle_every share one refresh: give them the same value"
    if config.center and (sigma or mean):
        return "model.center and the oracles are separate ablations; set one of them"
    return None


def oracle_every(config) -> int:
    """The oracles' refresh period in SGD steps (0: no oracle)."""
    return int(config.sigma_oracle_every or config.mean_oracle_every)
