"""Prop. 1's premise at the input x of every conv layer, measured during training (SPREAD_COLUMNS): the
spread of W_i * x / ||W_i|| against the spread of x, the coherence of the rows of W, and how far x's
patch covariance is from sigma^2 I. `SpreadProbe` is the trainer's observer; the rest are its parts."""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

from normprop_cli.experiments.probes import Batches, batch_statistics_at_init, each_layer_input
from normprop_cli.nn.dependence import conv_of

SPREAD_COLUMNS = [
    "layer",
    "epoch",
    "input_std",  # RMS over input units (c, h, w) of each unit's std over the evaluation set
    "proj_std",  # RMS over output units (i, h, w) of the std of (W_i * x) / ||W_i||
    "ratio",  # proj_std / input_std: 1 under Prop. 1 with white input
    "coherence_max",  # mutual coherence of the rows of W: max_{i != j} |cos(W_i, W_j)|
    "coherence_mean",  # mean |cos(W_i, W_j)| over the pairs i < j
    "coherence_random",  # E|cos| of two independent isotropic rows of the same length (closed form)
    "input_top_eig_fraction",  # top eigenvalue / trace of the input's patch covariance (white: 1/n)
    "input_effective_rank",  # trace^2 / ||covariance||_F^2 (white: n)
    "patch_dim",  # n = in_channels x kernel height x kernel width
    "patch_samples",  # patches behind the covariance
]


def unit_rows(weight: Tensor) -> Tensor:
    """The flattened filters W_i / ||W_i||, [out, in x kh x kw], float64."""
    return F.normalize(weight.detach().flatten(1).double(), dim=1)


def coherence(weight: Tensor) -> tuple[float, float]:
    """(max, mean) over pairs i != j of |cos(W_i, W_j)|, the mu of Prop. 1 and its average."""
    rows = unit_rows(weight)
    if len(rows) < 2:
        return math.nan, math.nan
    cos = (rows @ rows.T).abs()
    pairs = cos[torch.triu(torch.ones_like(cos, dtype=torch.bool), diagonal=1)]
    return pairs.max().item(), pairs.mean().item()


def random_coherence(n: int) -> float:
    """E|cos| of two independent isotropic (e.g. Gaussian) vectors in R^n, exactly:
    Gamma(n/2) / (sqrt(pi) Gamma((n+1)/2)), about sqrt(2 / (pi n)) for large n."""
    return math.exp(math.lgamma(n / 2) - math.lgamma((n + 1) / 2)) / math.sqrt(math.pi)


def full_patches(mask: Tensor, kernel, stride, padding) -> Tensor:
    """bool [H', W']: the output positions whose whole patch lies on input-dependent positions (no
    padding, no constant border): there the spread of W_i * x can be compared with the input's."""
    ones = torch.ones(1, 1, *kernel, dtype=torch.float64)
    seen = F.conv2d(mask[None, None].double().cpu(), ones, None, stride, padding)[0, 0]
    return seen == kernel[0] * kernel[1]


def spectrum(patches: Tensor) -> tuple[float, float]:
    """(top eigenvalue / trace, trace^2 / sum of squared eigenvalues) of the covariance of the rows
    of `patches` [samples, n]; from the smaller of X^T X and X X^T (same non-zero eigenvalues)."""
    x = patches.double()
    x = x - x.mean(0)
    gram = x @ x.T if len(x) < x.shape[1] else x.T @ x
    if not torch.isfinite(gram).all():  # a run on its way to diverging: no spectrum, no crash
        return math.nan, math.nan
    try:
        eig = torch.linalg.eigvalsh(gram).clamp_min(0.0)
    except torch.linalg.LinAlgError:  # ill-conditioned (e.g. huge activations of a near-diverged run)
        return math.nan, math.nan
    trace = eig.sum()
    if trace <= 0:
        return math.nan, math.nan
    return (eig[-1] / trace).item(), (trace * trace / eig.square().sum()).item()


class MapMoments:
    """Per-unit count, sum and sum of squares over images of a map [C, H, W], in float64 about a
    shift (the first image); on a CPU one image at a time: no map-sized temporaries (a probe's cost)."""

    def __init__(self) -> None:
        self.n, self.shift, self.s, self.ss = 0, None, None, None
        self.channels_last = False

    def add(self, v: Tensor) -> None:
        if self.shift is None:  # accumulate in memory order: [H, W, C] for channels-last maps
            self.channels_last = _memory_format(v) == torch.channels_last
        v = v.permute(0, 2, 3, 1) if self.channels_last else v
        if self.shift is None:
            self.shift = v[0].double()
            self.s, self.ss = torch.zeros_like(self.shift), torch.zeros_like(self.shift)
        step = 1 if v.device.type == "cpu" else 64  # a CUDA device wants fewer, larger kernels
        for part in v.split(step):
            d = part.double() - self.shift
            self.s += d.sum(0)
            self.ss += d.square().sum(0)
        self.n += len(v)

    def rms_std(self, mask: Tensor) -> float:
        """sqrt of the mean over the units at `mask` [H, W] of each unit's (population) variance."""
        m = self.s / self.n
        var = self.ss / self.n - m * m
        var = var.permute(2, 0, 1) if self.channels_last else var  # [C, H, W]
        return var[:, mask.to(var.device)].clamp_min(0.0).mean().sqrt().item()


class LayerSpread:
    """One conv layer's accumulators over the evaluation batches of one epoch."""

    def __init__(self, conv: nn.Module, mask: Tensor, positions: int, images: int, seed: int):
        self.weight = conv.weight.detach()
        self.kernel, self.stride, self.padding = _pair(conv.kernel_size), _pair(conv.stride), _pair(conv.padding)
        self.unit = self.weight / torch.linalg.vector_norm(self.weight.flatten(1), dim=1).view(-1, 1, 1, 1)
        self.inputs = mask
        self.outputs = full_patches(mask, self.kernel, self.stride, self.padding)
        self.where = torch.nonzero(self.outputs.flatten()).flatten()  # full-patch output positions
        self.positions, self.images_left = positions, images
        self.generator = torch.Generator().manual_seed(seed)
        self.x, self.u = MapMoments(), MapMoments()
        self.patches: list[Tensor] = []

    def add(self, x: Tensor) -> None:
        """x: [images, C, H, W], the layer's input in standard units."""
        self.x.add(x)
        unit = self.unit.to(x.dtype).to(memory_format=_memory_format(x))
        self.u.add(F.conv2d(x, unit, None, self.stride, self.padding))  # (W_i * x) / ||W_i||
        if self.images_left > 0 and self.positions > 0 and len(self.where):
            take = x[: self.images_left]
            self.images_left -= len(take)
            self.patches.append(self.sample(take))

    def sample(self, x: Tensor) -> Tensor:
        """`positions` patches per image at full-patch positions drawn from the fixed generator,
        flattened to [images x positions, C x kh x kw]."""
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.padding
        drawn = torch.randint(len(self.where), (len(x), self.positions), generator=self.generator)
        pos = self.where[drawn].to(x.device)
        cols = self.outputs.shape[1]
        rows = (pos // cols)[..., None] * sh + torch.arange(kh, device=x.device)  # [b, p, kh]
        cols = (pos % cols)[..., None] * sw + torch.arange(kw, device=x.device)  # [b, p, kw]
        image = torch.arange(len(x), device=x.device)[:, None, None, None]
        # A full patch never reaches the padding: index the unpadded map, shifted by the padding.
        patch = x.permute(0, 2, 3, 1)[image, rows[..., :, None] - ph, cols[..., None, :] - pw]  # [b, p, kh, kw, C]
        return patch.permute(0, 1, 4, 2, 3).reshape(len(x) * self.positions, -1).double()

    def row(self) -> dict:
        input_std, proj_std = self.x.rms_std(self.inputs), self.u.rms_std(self.outputs)
        top, rank = spectrum(torch.cat(self.patches)) if self.patches else (math.nan, math.nan)
        cmax, cmean = coherence(self.weight)
        n = self.weight[0].numel()
        return {
            "input_std": input_std,
            "proj_std": proj_std,
            "ratio": proj_std / input_std if input_std > 0 else math.nan,
            "coherence_max": cmax,
            "coherence_mean": cmean,
            "coherence_random": random_coherence(n),
            "input_top_eig_fraction": top,
            "input_effective_rank": rank,
            "patch_dim": n,
            "patch_samples": sum(len(p) for p in self.patches),
        }


def _memory_format(x: Tensor) -> torch.memory_format:
    channels_last = not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
    return torch.channels_last if channels_last else torch.contiguous_format


class SpreadProbe:
    """Prop. 1's premise at the input x of every conv layer k = 1..9 (SPREAD_COLUMNS). The patches
    of the covariance come from the first `images` evaluation images, `positions` per image at
    positions drawn from a generator seeded by the layer alone: the same patches for every method,
    epoch and resume. Nothing is carried across epochs, so there is no state to checkpoint."""

    name = "spread"

    def __init__(self, positions: int = 4, images: int = 512, first_layer: int = 1):
        self.positions, self.images, self.first_layer = positions, images, first_layer

    def observe(self, model: nn.Module, batches: Batches, epoch: int) -> list[dict]:
        convs = [conv_of(m) for m in model.hidden_layers()]
        layers: dict[int, LayerSpread] = {}

        def visit(k, x, mask, to_standard):
            if k not in layers:
                layers[k] = LayerSpread(convs[k - 1], mask.cpu(), self.positions, self.images, seed=k)
            layers[k].add(to_standard(x))

        # Epoch 0 sees BatchNorm with its batch statistics, as the other probes do.
        with batch_statistics_at_init(model, batches) if epoch == 0 else nullcontext():
            each_layer_input(model, batches, self.first_layer, visit)
        return [{"layer": k, "epoch": epoch} | layers[k].row() for k in sorted(layers)]
