"""Observers (engine.trainer.Observer) of the hidden layers' inputs: Fig. 2 (section 5.2) and the
population metric (every input-dependent unit of each layer's input), before training (epoch 0) and
after every epoch, over the evaluation set.

Where: the input of conv k, k = 2..9, the point where NormProp's previous layer has normalised,
(f(u) - c2) / c1 (eq. 11). A method whose hidden block ends in a bare activation f (none, BatchNorm,
any block that is not a NormProp layer) is read in the same standard units, (x - c2) / c1 with f's
constants (eq. 12; Remark 1 for ReLU). That is a fixed affine map, the same at every epoch: a unit
whose pre-activation is N(0, 1) reads mean 0 and std 1 under every method, and the drift
|mean_e - mean_0| / std_0 is the same in either units.

When: in evaluation mode. Before training, BatchNorm's running estimates are still (0, 1), so an
evaluation-mode BN net is an unnormalised one; `batch_statistics_at_init` estimates them from the
evaluation set for the measurement only, so that epoch 0 sees BN as it trains (batch statistics).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
from torch import Tensor, nn

from normprop_cli.nn import ACTIVATIONS, NormPropLayer, activation_stats, input_dependent

FIRST_LAYER = 2  # Fig. 2 shows the inputs of the last 8 of the 9 conv layers
UNIT_COLUMNS = ["layer", "draw", "channel", "row", "col", "epoch", "n", "mean", "std"]
POPULATION_COLUMNS = ["layer", "epoch", "units", "avg_abs_mean", "avg_std", "avg_deviation", "avg_shift",
                      "avg_drift", "units_constant_at_init", "median_drift"]  # fmt: skip
CONSTANT_STD = 1e-6  # a unit with a smaller std at epoch 0 has no scale to measure its drift in
# ... nor has one whose std at epoch 0 is under this fraction of its layer's median: on digits the
# near-blank margins give units that are all but constant at initialisation, and dividing by their
# std would let a handful of them (drifts of 10^4) make the layer's average.
DRIFT_FLOOR = 0.1
CHUNK = 64  # images per float64 accumulation: bounds the float64 copy of a full-width layer input
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)

Batches = Callable[[], Iterator]
Visit = Callable[[int, Tensor, Tensor, "Standard"], None]


@contextmanager
def batch_statistics_at_init(model: nn.Module, batches: Batches):
    """Inside: every BatchNorm's running mean and variance are the cumulative average over the
    evaluation batches (momentum None), and the model is in evaluation mode. On exit every buffer,
    momentum and mode is restored, so the model's state_dict is bit-for-bit what it was.

    Why: at initialisation the running estimates are (0, 1) and an evaluation-mode BN net is an
    unnormalised one; the epoch-0 measurement should see BN normalise as it does in training."""
    norms = [m for m in model.modules() if isinstance(m, BATCH_NORMS) and m.track_running_stats]
    saved = [(m, {k: v.clone() for k, v in m.named_buffers(recurse=False)}, m.momentum) for m in norms]
    training = model.training
    try:
        if norms:
            for m in norms:
                m.reset_running_stats()
                m.momentum = None
            with torch.no_grad():
                for x, _ in batches():
                    model.eval()  # the batches may switch modes; only the BN modules train
                    for m in norms:
                        m.train()
                    model(x)
        model.eval()
        yield model
    finally:
        with torch.no_grad():
            for m, buffers, momentum in saved:
                for k, v in m.named_buffers(recurse=False):
                    v.copy_(buffers[k])
                m.momentum = momentum
        model.train(training)


def activation_name(model: nn.Module, block: nn.Module) -> str:
    """The bare activation ending a baseline's hidden block: the model's `activation` where it keeps
    one; else read from the block's last module (NIN keeps the name only there); relu by default."""
    name = getattr(model, "activation", None)
    if isinstance(name, str):
        return name
    last = block[-1] if isinstance(block, nn.Sequential) else block
    if isinstance(last, nn.PReLU):
        return "prelu"
    fn = getattr(last, "fn", None)
    return next((n for n, act in ACTIVATIONS.items() if fn is not None and act.fn is fn), "relu")


def standard_units(model: nn.Module) -> dict[int, tuple[float, float] | None]:
    """{k: (c2, c1)} to read conv k's input as (x - c2) / c1 (eq. 12's constants of the activation
    before it; PReLU at its initial slope, so the map stays fixed), or None where the input is already
    in those units: the data (section 4.1) and a NormProp layer's output (eq. 11)."""
    layers = model.hidden_layers()
    units: dict[int, tuple[float, float] | None] = {1: None}
    for k, block in enumerate(layers[:-1], start=2):
        if isinstance(block, NormPropLayer):
            units[k] = None
        else:
            s = activation_stats(activation_name(model, block))
            units[k] = (float(s.mean), float(s.std))
    return units


@torch.no_grad()
def each_layer_input(model: nn.Module, batches: Batches, first_layer: int, visit: Visit) -> None:
    """Run the evaluation batches through `model` in evaluation mode and call, for every batch and
    every conv k >= first_layer, visit(k, x, mask, to_standard): x the input of conv k, mask its
    input-dependent positions [H, W] (nn.dependence) and to_standard the map to standard units."""
    layers = model.hidden_layers()
    units = standard_units(model)
    masks: dict[int, Tensor] = {}

    def hook(k: int):
        to_standard = Standard(units[k])

        def pre(module, inputs):
            visit(k, inputs[0], masks[k], to_standard)

        return pre

    handles = [layers[k - 1].register_forward_pre_hook(hook(k)) for k in range(first_layer, len(layers) + 1)]
    training = model.training
    try:
        model.eval()
        for x, _ in batches():
            if not masks:
                masks.update({k: m.to(x.device) for k, m in input_dependent(model, tuple(x.shape[1:])).items()})
            model(x)
    finally:
        for h in handles:
            h.remove()
        model.train(training)


def _measurement_context(model: nn.Module, batches: Batches, epoch: int):
    """Epoch 0 sees BatchNorm with its batch statistics (batch_statistics_at_init), later epochs as is."""
    return batch_statistics_at_init(model, batches) if epoch == 0 else nullcontext()


class Standard:
    """The map of a layer's input to standard units, (v - c2) / c1, or none (`c` None: the input is in them)."""

    def __init__(self, c: tuple[float, float] | None) -> None:
        self.c = c

    def __call__(self, v: Tensor) -> Tensor:
        return v if self.c is None else (v - self.c[0]) / self.c[1]

    def wide(self, x: Tensor) -> Tensor:
        """self(x.double()) as a float64 tensor of its own, made in place."""
        v = x.to(torch.float64, copy=True)
        return v if self.c is None else v.sub_(self.c[0]).div_(self.c[1])


class UnitMoments:
    """Per-unit count, sum and sum of squares in float64, taken about a shift (the first image's
    value) so that a near-constant unit's variance does not vanish in cancellation."""

    def __init__(self) -> None:
        self.n, self.shift, self.s, self.ss = 0, None, 0.0, 0.0

    def add(self, x: Tensor, standard: Standard = Standard(None)) -> None:
        """x: [images, *units], in any dtype, read in standard units in float64. The sums are those of
        standard(x.double()) - shift, in fewer passes over the images: without a map, one subtraction
        that widens x as it reads it; the square in place (a probe's passes over float64 copies of every
        layer's input cost more than the forward pass that makes them)."""
        if self.shift is None:
            self.shift = standard.wide(x[:1])[0]
        d = torch.sub(x, self.shift) if standard.c is None else standard.wide(x).sub_(self.shift)
        self.n += len(d)
        self.s = self.s + d.sum(0)
        self.ss = self.ss + d.square_().sum(0)

    def mean_std(self) -> tuple[Tensor, Tensor]:
        """Each unit's mean and (population) std over the images added."""
        m = self.s / self.n
        return self.shift + m, (self.ss / self.n - m * m).clamp_min(0.0).sqrt()


class UnitProbe:
    """Fig. 2: the input of `draws` units (channel, row, col) per layer 2..9. Each is drawn from
    (seed, layer, draw) alone, so every method of a seed probes the same units, and a resumed run
    the same as before: the channel uniformly, the position uniformly among the input-dependent
    positions of that layer (never conv 9's bias-only border). Rows: UNIT_COLUMNS."""

    name = "unit_stats"

    def __init__(self, seed: int, draws: int = 8, first_layer: int = FIRST_LAYER):
        self.seed, self.draws, self.first_layer = seed, draws, first_layer

    def unit(self, layer: int, draw: int, channels: int, mask: Tensor) -> tuple[int, int, int]:
        rng = np.random.default_rng([self.seed, layer, draw])
        channel = int(rng.integers(channels))
        rows, cols = np.nonzero(mask.cpu().numpy())
        i = int(rng.integers(len(rows)))
        return channel, int(rows[i]), int(cols[i])

    def observe(self, model: nn.Module, batches: Batches, epoch: int) -> list[dict]:
        units: dict[int, list[tuple[int, int, int]]] = {}
        acc: dict[int, UnitMoments] = {}

        def visit(layer, x, mask, to_standard):
            if layer not in units:
                units[layer] = [self.unit(layer, d, x.shape[1], mask) for d in range(self.draws)]
                acc[layer] = UnitMoments()
            c, h, w = (list(i) for i in zip(*units[layer], strict=True))
            acc[layer].add(x[:, c, h, w], to_standard)  # [N, draws]

        with _measurement_context(model, batches, epoch):
            each_layer_input(model, batches, self.first_layer, visit)
        rows = []
        for layer in sorted(acc):
            means, stds = (t.tolist() for t in acc[layer].mean_std())
            for draw, unit in enumerate(units[layer]):
                values = (layer, draw, *unit, epoch, acc[layer].n, means[draw], stds[draw])
                rows.append(dict(zip(UNIT_COLUMNS, values, strict=True)))
        return rows


def due(epoch: int, every: int, last: int | None) -> bool:
    """Is `epoch` one that an observer taken every `every` epochs and at the last (`last`) observes?
    Epoch 0 (before training) is."""
    return epoch % every == 0 or epoch == last


class PopulationProbe:
    """The population metric: every input-dependent unit (c, h, w) of the input of conv k >= first_layer, its mean
    and std over the evaluation set, summarised per layer and epoch (POPULATION_COLUMNS): the
    average |mean|, the average std, and the average drift |mean_e - mean_0| / std_0 from the unit's
    value at initialisation, leaving out (and counting) the units (near-)constant at initialisation:
    std_0 under DRIFT_FLOOR times the layer's median std_0; and the median drift.

    Two measures in the absolute units of the N(0, 1) the paper aims at, the same for every method:
    avg_deviation, per unit max(|mean|, |std - 1|), averaged over units; and avg_shift, per unit
    max(|mean_e - mean_(e-1)|, |std_e - std_(e-1)|) from the previous epoch, averaged over units (NaN at
    epoch 0). The epoch-0 and the previous epoch's means and stds are the observer's state, kept in the
    run's checkpoint.

    `every` > 1 observes at epoch 0, every `every`-th epoch and the last (`last`) only, where a run
    needs no more (normalizers: the drift at the last epoch); avg_shift is then NaN, there being no
    previous epoch to compare with."""

    name = "population"

    def __init__(self, first_layer: int = FIRST_LAYER, every: int = 1, last: int | None = None):
        self.first_layer = first_layer
        self.every, self.last = max(1, int(every)), last
        self.initial: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> epoch-0 (mean, std), [C, H, W]
        self.previous: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> the last observed (mean, std)

    def state_dict(self) -> dict:
        pack = lambda d: {k: {"mean": m, "std": s} for k, (m, s) in d.items()}  # noqa: E731
        return {"initial": pack(self.initial), "previous": pack(self.previous)}

    def load_state_dict(self, state: dict) -> None:
        unpack = lambda d: {int(k): (v["mean"].cpu(), v["std"].cpu()) for k, v in d.items()}  # noqa: E731
        self.initial = unpack(state["initial"])
        self.previous = unpack(state.get("previous", {}))

    def observe(self, model: nn.Module, batches: Batches, epoch: int) -> list[dict]:
        if not due(epoch, self.every, self.last):
            return []
        acc: dict[int, UnitMoments] = {}
        masks: dict[int, Tensor] = {}

        def visit(layer, x, mask, to_standard):
            masks[layer] = mask
            moments = acc.setdefault(layer, UnitMoments())
            for part in x.split(CHUNK):
                moments.add(part, to_standard)

        with _measurement_context(model, batches, epoch):
            each_layer_input(model, batches, self.first_layer, visit)
        rows = []
        for layer in sorted(acc):
            mean, std = (t.cpu() for t in acc[layer].mean_std())
            if epoch == 0:
                self.initial[layer] = (mean, std)
            row = {"layer": layer, "epoch": epoch} | self._summary(layer, mean, std, masks[layer].cpu())
            self.previous[layer] = (mean, std)
            rows.append(row)
        return rows

    def _summary(self, layer: int, mean: Tensor, std: Tensor, mask: Tensor) -> dict:
        shift = float("nan")
        if layer in self.previous and self.every == 1:
            mean1, std1 = (t[:, mask] for t in self.previous[layer])
            shift = torch.maximum((mean[:, mask] - mean1).abs(), (std[:, mask] - std1).abs()).mean().item()
        mean, std = mean[:, mask], std[:, mask]  # [C, input-dependent positions]
        deviation = torch.maximum(mean.abs(), (std - 1.0).abs()).mean().item()
        row = {"units": mean.numel(), "avg_abs_mean": mean.abs().mean().item(), "avg_std": std.mean().item(),
               "avg_deviation": deviation, "avg_shift": shift}  # fmt: skip
        if layer not in self.initial:  # a run resumed from a checkpoint without the epoch-0 state
            return row | {
                "avg_drift": float("nan"),
                "units_constant_at_init": float("nan"),
                "median_drift": float("nan"),
            }
        mean0, std0 = (t[:, mask] for t in self.initial[layer])
        varies = std0 >= max(CONSTANT_STD, DRIFT_FLOOR * std0.median().item())
        drift = (mean - mean0).abs()[varies] / std0[varies]
        if not varies.any():
            return row | {
                "avg_drift": float("nan"),
                "units_constant_at_init": int(std0.numel()),
                "median_drift": float("nan"),
            }
        return row | {"avg_drift": drift.mean().item(), "units_constant_at_init": int((~varies).sum()),
                      "median_drift": drift.median().item()}  # fmt: skip
