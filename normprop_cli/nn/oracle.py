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

`SigmaOracle` (the NIN's child `sigma_oracle`) holds the held-out batch, already data-normalised, that
`give` hands it (the drift experiment's observer: fixed validation images), and refreshes every layer's A
from it without gradient: at `give`, then before every `every`-th training step (a forward pre-hook on
the model: training-mode forwards are the SGD steps). One pass of the batch through the network refreshes
the layers in order, each from its input under the layers before it already refreshed. The patches are
those whose whole patch lies on input-dependent positions (nn.dependence: no padding, no constant
border), at most `positions` per image at positions drawn from a generator seeded by the layer alone (the
same at every refresh). The batch and the step count are the module's extra state, A each layer's buffer:
a checkpoint resumes the oracle exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .dependence import input_dependent
from .layers import NormPropConv2d

POSITIONS = 32  # patches per image behind a layer's covariance (all where a map has fewer full patches)
CHUNK = 100  # images unfolded at once: bounds the unfolded copy of a 5x5 layer's input
NO_BATCH = (
    "model.sigma_oracle_every needs a held-out batch: call model.sigma_oracle.give(model, x) before training "
    "(the drift experiment's observer gives fixed validation images)"
)


class SigmaOracleConv2d(NormPropConv2d):
    """NormPropConv2d dividing by sqrt(W_i^T A W_i) (module docstring); `metric` is A, `input_var` sigma^2
    at the last refresh (NaN before any)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.folded_path = False  # the plain autograd form, which divides by filter_norms()
        n = self.weight[0].numel()
        self.register_buffer("metric", torch.eye(n, dtype=self.weight.dtype, device=self.weight.device))
        self.register_buffer("input_var", torch.full((), float("nan"), device=self.weight.device))

    def filter_norms(self) -> Tensor:
        """sqrt(W_i^T A W_i) per filter: the oracle's divisor in place of ||W_i||."""
        w = self.weight.flatten(1)
        return ((w @ self.metric.to(w.dtype)) * w).sum(1).clamp_min(1e-12).sqrt()

    def plain_norms(self) -> Tensor:
        """||W_i||, what NormProp divides by."""
        return torch.linalg.vector_norm(self.weight.flatten(1), dim=1)

    @torch.no_grad()
    def set_covariance(self, cov: Tensor) -> None:
        """A = cov / (tr(cov) / n); a covariance with no trace (a dead input) leaves A as it is."""
        var = torch.diagonal(cov).mean()
        self.input_var.fill_(float(var))
        if var > 0 and torch.isfinite(cov).all():
            self.metric.copy_((cov / var).to(self.metric.dtype))


def full_positions(mask: Tensor, conv: nn.Module) -> Tensor:
    """The flat output positions of `conv` whose whole patch lies on True positions of its input mask [H, W]."""
    ones = torch.ones(1, 1, *conv.kernel_size, dtype=torch.float64)
    seen = F.conv2d(mask[None, None].double().cpu(), ones, None, conv.stride, conv.padding, conv.dilation)
    return torch.nonzero(seen.flatten() == conv.kernel_size[0] * conv.kernel_size[1]).flatten()


@torch.no_grad()
def patch_covariance(x: Tensor, conv: nn.Module, mask: Tensor, positions: int, seed: int) -> Tensor:
    """The covariance [n, n] (float64) of the full patches of x [N, C, H, W] for `conv`: `positions` per
    image drawn from a generator seeded by `seed` (every full patch where there are no more)."""
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
    d = patches - patches.double().mean(0).to(patches.dtype)  # centred in float64, multiplied in float32
    return (d.T @ d).double() / len(d)


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
                module.set_covariance(patch_covariance(inputs[0], module, masks[k], self.positions, seed=k))

            return pre

        handles = [m.register_forward_pre_hook(hook(k)) for k, m in enumerate(layers, 1)
                   if isinstance(m, SigmaOracleConv2d)]  # fmt: skip
        try:
            model.features(x)
        finally:
            for h in handles:
                h.remove()

    def extra_repr(self) -> str:
        return f"every={self.every}, positions={self.positions}"


def oracle_layers(model: nn.Module) -> list[tuple[int, SigmaOracleConv2d]]:
    """(k, layer) for the conv layers k = 1, 2, ... of `model.hidden_layers()` that are Sigma-oracle layers."""
    return [(k, m) for k, m in enumerate(model.hidden_layers(), 1) if isinstance(m, SigmaOracleConv2d)]
