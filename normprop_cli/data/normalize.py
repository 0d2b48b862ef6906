"""Data normalisation, the first step of NormProp (paper section 4.1).

Global and batch normalisation normalise each input element (each of the C x H x W
values) on its own; ZCA whitens the image as a whole (an ablation beyond the paper). All are
`nn.Module`s, so their statistics travel in the state_dict of a
checkpoint. Validation and test use the statistics of training (section 4.5).

Images are uint8 on the device; `to_float` maps them to [0, 1]. The scale does
not matter: both normalisations remove it.
"""

from __future__ import annotations

import torch
from torch import nn


def to_float(x: torch.Tensor) -> torch.Tensor:
    """uint8 images -> float32 in [0, 1] (x / 255)."""
    return x.float() / 255.0


def _as_float(x: torch.Tensor) -> torch.Tensor:
    return to_float(x) if x.dtype == torch.uint8 else x.float()


class GlobalDataNorm(nn.Module):
    """Global Data Normalization: (x - mean) / std with the element-wise mean and
    (population) std of the whole training set, the same in training and evaluation.

    An element that is constant over the training set (the blank border of the
    digits) gets std 1: it is only centred, to 0, instead of divided by zero.
    """

    def __init__(self, shape: tuple[int, ...] = (3, 32, 32)):
        super().__init__()
        self.register_buffer("mean", torch.zeros(1, *shape))
        self.register_buffer("std", torch.ones(1, *shape))

    @classmethod
    def from_train(cls, train_x: torch.Tensor) -> GlobalDataNorm:
        return cls(tuple(train_x.shape[1:])).to(train_x.device).fit(train_x)

    @torch.no_grad()
    def fit(self, train_x: torch.Tensor, chunk_size: int = 2048) -> GlobalDataNorm:
        """Statistics of `train_x` (uint8 images, or float already on the model's scale),
        accumulated in float64 over chunks in two passes (mean, then squared deviations)."""
        if len(train_x) == 0:
            raise ValueError("GlobalDataNorm.fit needs at least one training image")
        chunks = train_x.split(chunk_size)
        total = sum(_as_float(c).double().sum(0) for c in chunks)
        mean = total / len(train_x)
        sq = torch.zeros_like(mean)
        lo = torch.full_like(mean, float("inf"))
        hi = torch.full_like(mean, float("-inf"))
        for c in chunks:
            c = _as_float(c).double()
            sq += (c - mean).square().sum(0)
            lo = torch.minimum(lo, c.amin(0))
            hi = torch.maximum(hi, c.amax(0))
        std = (sq / len(train_x)).sqrt()
        std = torch.where(hi == lo, torch.ones_like(std), std)
        self.mean = mean.float().unsqueeze(0)
        self.std = std.float().unsqueeze(0)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (_as_float(x) - self.mean) / self.std


class BatchDataNorm(nn.Module):
    """Batch Data Normalization: in training each element is normalised over the
    mini-batch, (x - mean_B) / sqrt(var_B + eps) with the biased batch variance, and
    running estimates are updated like BatchNorm's (running = (1 - momentum) running
    + momentum batch, with the unbiased variance); evaluation uses the running estimates.

    The first training batch sets the running estimates directly, so evaluation is
    sane early on; before any training batch they are mean 0, variance 1.
    """

    def __init__(self, momentum: float = 0.1, eps: float = 1e-5, shape: tuple[int, ...] = (3, 32, 32)):
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.register_buffer("running_mean", torch.zeros(1, *shape))
        self.register_buffer("running_var", torch.ones(1, *shape))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    @classmethod
    def from_train(cls, train_x: torch.Tensor, momentum: float = 0.1, eps: float = 1e-5) -> BatchDataNorm:
        """Only the image shape and device of `train_x` are used (streaming data, section 4.1)."""
        return cls(momentum, eps, tuple(train_x.shape[1:])).to(train_x.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _as_float(x)
        if not self.training:
            return (x - self.running_mean) / torch.sqrt(self.running_var + self.eps)
        n = x.shape[0]
        if n < 2:
            raise ValueError(
                f"data_norm=batch cannot normalise a training batch of {n} image; "
                "use data_norm=global for batch size 1 (as the paper does)"
            )
        mean = x.mean(0, keepdim=True)
        centred = x - mean
        var = centred.square().mean(0, keepdim=True)  # biased; faster than x.var(0) on CPU
        with torch.no_grad():
            # weight 1 on the first batch: running = batch statistics; no host sync
            w = torch.where(self.num_batches_tracked == 0, 1.0, self.momentum).to(x.dtype)
            self.running_mean.lerp_(mean.detach(), w)
            self.running_var.lerp_(var.detach() * (n / (n - 1)), w)
            self.num_batches_tracked += 1
        return centred / torch.sqrt(var + self.eps)

    def extra_repr(self) -> str:
        return f"momentum={self.momentum}, eps={self.eps}"


class ZCADataNorm(nn.Module):
    """ZCA whitening of the whole image (Krizhevsky 2009; Goodfellow et al. 2013 on CIFAR):
    x -> W (x - mean), W = U diag(1 / sqrt(lambda + eps)) U^T from the eigendecomposition of the
    training set's covariance over all C x H x W elements. White input, E[xx^T] = I over the elements
    whose variance exceeds eps, is Proposition 1's premise (section 3.2), which global data
    normalisation meets only on the diagonal. `eps` (in units of the mean element variance) keeps
    the near-constant directions (a zero-padded border) from being blown up."""

    def __init__(self, shape: tuple[int, ...] = (3, 32, 32), eps: float = 0.01):
        super().__init__()
        n = 1
        for d in shape:
            n *= int(d)
        self.shape, self.eps = tuple(shape), float(eps)
        self.register_buffer("mean", torch.zeros(1, n))
        self.register_buffer("matrix", torch.eye(n))

    @classmethod
    def from_train(cls, train_x: torch.Tensor, eps: float = 0.01) -> ZCADataNorm:
        return cls(tuple(train_x.shape[1:]), eps).to(train_x.device).fit(train_x)

    @torch.no_grad()
    def fit(self, train_x: torch.Tensor, chunk_size: int = 2048) -> ZCADataNorm:
        """Mean and covariance of `train_x` in float64 over chunks, then W."""
        if len(train_x) < 2:
            raise ValueError("ZCADataNorm.fit needs at least two training images")
        chunks = [_as_float(c).double().flatten(1) for c in train_x.split(chunk_size)]
        mean = sum(c.sum(0) for c in chunks) / len(train_x)
        cov = sum((c - mean).T @ (c - mean) for c in chunks) / len(train_x)
        values, vectors = torch.linalg.eigh(cov)
        floor = self.eps * float(values.clamp_min(0).mean())
        scale = (values.clamp_min(0) + floor).rsqrt()
        self.mean = mean.float().unsqueeze(0)
        self.matrix = (vectors * scale) @ vectors.T
        self.matrix = self.matrix.float()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = _as_float(x).flatten(1) - self.mean
        return (flat @ self.matrix).view(-1, *self.shape)

    def extra_repr(self) -> str:
        return f"shape={self.shape}, eps={self.eps}"


DATA_NORMS: dict[str, type[nn.Module]] = {"global": GlobalDataNorm, "batch": BatchDataNorm, "zca": ZCADataNorm}


def make_data_norm(kind: str, train_x: torch.Tensor, **kwargs) -> nn.Module:
    """The data normalisation `kind` ('global' | 'batch' | 'zca') for training images `train_x`
    [N, C, H, W], on their device; kwargs go to the class (momentum, eps for 'batch')."""
    if kind not in DATA_NORMS:
        raise ValueError(f"unknown data_norm {kind!r}; known: {', '.join(DATA_NORMS)}")
    return DATA_NORMS[kind].from_train(train_x, **kwargs)
