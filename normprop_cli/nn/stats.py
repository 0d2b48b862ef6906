"""Statistics of an activation f(X) for X ~ N(0, 1): the constants NormProp divides by.

c2 = E[f(X)] (the mean), c1 = std[f(X)] (eq. 12) and the Jacobian factor
sqrt(E[f'(X)^2]) / c1 (section 3.4: E[J J^T] ~ E[f'(X)^2] / c1^2 I, so the singular
values of a normalised layer's Jacobian are about that factor; 1.21 for ReLU).
Closed forms for ReLU (Remark 1) and PReLU (Remark 2); any other elementwise activation
by quadrature, never by sampling.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import NamedTuple

import numpy as np
import torch
from numpy.polynomial.hermite_e import hermegauss
from numpy.polynomial.legendre import leggauss
from torch import Tensor

SQRT_2PI = math.sqrt(2.0 * math.pi)

Scalar = float | Tensor


@dataclass(frozen=True)
class ActivationStats:
    """mean = c2, std = c1 of f(X), X ~ N(0, 1), and the Jacobian factor sqrt(E[f'(X)^2]) / c1.

    Fields are floats, or 0-d/1-element tensors when computed from a learnable slope.
    """

    mean: Scalar
    std: Scalar
    jacobian_factor: Scalar

    @property
    def mean_sq_derivative(self) -> Scalar:
        """E[f'(X)^2] (0.5 for ReLU)."""
        return (self.jacobian_factor * self.std) ** 2


class Moments(NamedTuple):
    mean: float
    std: float


class DropoutScale(NamedTuple):
    """Note section 5, for x ~ N(0, 1) kept with probability p."""

    masked_std: float  # x * Bernoulli(p): sqrt(p)
    scale: float  # divide by sqrt(p) instead (multiply by this) to keep std 1
    inverted_std: float  # std after the usual 1/p inverted dropout: sqrt(1/p)


# ---- closed forms ----------------------------------------------------------------


def relu_stats() -> ActivationStats:
    """Remark 1: E = 1/sqrt(2 pi) = 0.3989, std = sqrt((1 - 1/pi)/2) = 0.5838; factor 1.2113."""
    c2 = 1.0 / SQRT_2PI
    c1 = math.sqrt((1.0 - 1.0 / math.pi) / 2.0)
    return ActivationStats(c2, c1, math.sqrt(0.5) / c1)  # section 3.4: E[1(X > 0)] = 0.5


def prelu_stats(a: Scalar) -> ActivationStats:
    """Remark 2, for a float slope or a (learnable) tensor slope; differentiable in a."""
    c2 = (1 - a) / SQRT_2PI
    c1 = (((1 + a * a) - (1 - a) ** 2 / math.pi) / 2) ** 0.5  # > 0 for every real a
    return ActivationStats(c2, c1, ((1 + a * a) / 2) ** 0.5 / c1)  # E[f'^2] = (1 + a^2)/2


def identity_stats() -> ActivationStats:
    return ActivationStats(0.0, 1.0, 1.0)


# ---- quadrature ------------------------------------------------------------------

HALF_WIDTH = 12.0  # P(|X| > 12) ~ 4e-33


@lru_cache(maxsize=32)
def normal_quadrature(breakpoints: tuple[float, ...] = (0.0,), n: int = 100):
    """Nodes x and weights w with sum(w * g(x)) ~ E[g(X)], X ~ N(0, 1).

    With no breakpoints: Gauss-Hermite (probabilists', weights / sqrt(2 pi)), exponential
    convergence for smooth g. A kink (ReLU at 0) makes Gauss-Hermite converge slowly (error
    1.6e-3 for E[ReLU(X)] with 100 nodes), so with breakpoints the line is cut there and each
    piece of [-12, 12] gets n Gauss-Legendre nodes on phi(x) g(x): machine precision.
    """
    if not breakpoints:
        x, w = hermegauss(n)
        w = w / SQRT_2PI
    else:
        edges = [-HALF_WIDTH, *sorted(b for b in breakpoints if abs(b) < HALF_WIDTH), HALF_WIDTH]
        t, wt = leggauss(n)
        xs, ws = [], []
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            half = (hi - lo) / 2
            xs.append(lo + half * (t + 1))
            ws.append(half * wt)
        x = np.concatenate(xs)
        w = np.concatenate(ws) * np.exp(-(x**2) / 2) / SQRT_2PI
    x.setflags(write=False)
    w.setflags(write=False)
    return x, w


def quadrature_stats(
    fn: Callable[[Tensor], Tensor],
    derivative: Callable[[Tensor], Tensor] | None = None,
    n: int = 100,
    breakpoints: tuple[float, ...] = (0.0,),
) -> ActivationStats:
    """Mean, std and Jacobian factor of an elementwise torch function by quadrature.

    f' comes from autograd unless `derivative` is given. Cut at every kink of fn
    (`breakpoints`); () means fn is smooth and Gauss-Hermite is used.
    """
    x_np, w = normal_quadrature(tuple(breakpoints), n)
    with torch.enable_grad():  # autograd's f' also where the first call comes under no_grad (a probe's)
        x = torch.tensor(x_np, dtype=torch.float64, requires_grad=derivative is None)
        y = fn(x)
        dy = torch.autograd.grad(y.sum(), x)[0] if derivative is None else derivative(x.detach())
    y, dy = y.detach().numpy(), dy.detach().numpy()
    mean = float(w @ y)
    std = math.sqrt(float(w @ (y - mean) ** 2))
    return ActivationStats(mean, std, math.sqrt(float(w @ dy**2)) / std)  # section 3.4


def maxpool_stats(k: int) -> Moments:
    """Max of k independent N(0, 1): density k phi(x) Phi(x)^(k-1), by Gauss-Hermite."""
    x_np, w = normal_quadrature((), 100)
    x = torch.tensor(x_np, dtype=torch.float64)
    density_ratio = (k * torch.special.ndtr(x) ** (k - 1)).numpy()  # density / phi
    mean = float(w @ (x_np * density_ratio))
    return Moments(mean, math.sqrt(float(w @ ((x_np - mean) ** 2 * density_ratio))))


def avgpool_stats(k: int) -> Moments:
    """Average of k independent N(0, 1)."""
    return Moments(0.0, 1.0 / math.sqrt(k))


def dropout_scale(p: float) -> DropoutScale:
    """Dropout keeping with probability p, on N(0, 1) input (note section 5)."""
    if not 0.0 < p <= 1.0:
        raise ValueError(f"keep probability p must be in (0, 1], got {p}")
    return DropoutScale(math.sqrt(p), 1.0 / math.sqrt(p), math.sqrt(1.0 / p))


# ---- registry --------------------------------------------------------------------


@dataclass(frozen=True)
class Activation:
    """An elementwise activation: its torch function and how to get its statistics."""

    fn: Callable[[Tensor], Tensor]
    derivative: Callable[[Tensor], Tensor] | None = None
    breakpoints: tuple[float, ...] = (0.0,)  # kinks, for the quadrature; () if smooth
    closed_form: Callable[[], ActivationStats] | None = None


def _identity(x: Tensor) -> Tensor:
    return x


ACTIVATIONS: dict[str, Activation] = {
    "relu": Activation(torch.relu, closed_form=relu_stats),
    "tanh": Activation(torch.tanh, breakpoints=()),
    "sigmoid": Activation(torch.sigmoid, breakpoints=()),
    "identity": Activation(_identity, closed_form=identity_stats),
    # ablations (the activations experiment, claim C8): the function with ReLU's constants, not its own
    "tanh_reluconst": Activation(torch.tanh, breakpoints=(), closed_form=relu_stats),
    "sigmoid_reluconst": Activation(torch.sigmoid, breakpoints=(), closed_form=relu_stats),
}
PARAMETRIC = ("prelu",)  # statistics depend on a learnable slope: prelu_stats(slope)


def register_activation(
    name: str,
    fn: Callable[[Tensor], Tensor],
    derivative: Callable[[Tensor], Tensor] | None = None,
    breakpoints: tuple[float, ...] = (0.0,),
    closed_form: Callable[[], ActivationStats] | None = None,
    *,
    replace: bool = False,
) -> None:
    """Make `name` usable as `activation=` in the layers; stats by quadrature unless closed_form.

    A name already registered (relu, tanh, ... or one of yours) is refused unless `replace=True`:
    layers built with it would otherwise change their statistics behind your back. The function is
    checked here, not when a layer is built: one that raises, or whose mean, std or Jacobian factor is
    not finite or does not converge by quadrature (log|x|), is a ValueError.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_activation: name must be a non-empty string, got {name!r}")
    if name in PARAMETRIC:
        raise ValueError(f"{name!r} is built in and parametric")
    for arg, value in (("fn", fn), ("derivative", derivative), ("closed_form", closed_form)):
        if not callable(value) and (arg == "fn" or value is not None):
            raise TypeError(f"register_activation({name!r}, ...): {arg} must be callable, got {type(value).__name__}")
    if name in ACTIVATIONS and not replace:
        raise ValueError(
            f"activation {name!r} is already registered; pass replace=True to register_activation to replace it"
        )
    activation = Activation(fn, derivative, tuple(breakpoints), closed_form)
    _checked(name, activation)
    ACTIVATIONS[name] = activation
    _numerical_stats.cache_clear()


CONVERGED = 0.02  # a statistic that moves more than this (relative) from 100 to 200 nodes diverges


def _checked(name: str, act: Activation) -> ActivationStats:
    """The new activation's statistics, computed as the layers will (closed form, else quadrature), so that
    a function that cannot be normalised is refused at registration rather than when a layer is built:
    one that raises on a float64 tensor of N(0, 1) nodes, a mean, std or Jacobian factor that is not
    finite, a std of 0, or a statistic whose integral diverges (log|x|: E[f'(X)^2] = E[1/X^2] is
    infinite, yet 100 nodes give a factor of 33; with 200, 66). Divergence shows as a quadrature that
    does not settle: 100 and 200 nodes disagree by more than CONVERGED, where every convergent case
    tried agrees to 0.4% (a kink the breakpoints miss, |x|^0.75)."""
    where = f"register_activation({name!r}, ...)"
    try:
        if act.closed_form is not None:
            tried = [act.closed_form()]
        else:
            tried = [quadrature_stats(act.fn, act.derivative, n=n, breakpoints=act.breakpoints) for n in (100, 200)]
        values = [(float(s.mean), float(s.std), float(s.jacobian_factor)) for s in tried]
    except Exception as exc:  # any error of the user's function, reported with the name it was registered under
        raise ValueError(
            f"{where}: computing its mean, std and Jacobian factor on N(0, 1) raised {type(exc).__name__}: {exc} "
            "(the function must take a float64 tensor and return one of its shape, differentiable by autograd "
            "unless derivative= is given)"
        ) from exc
    labels = ("mean", "std", "Jacobian factor")
    first = values[0]
    bad = [f"{label} {v}" for label, v in zip(labels, first, strict=True) if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{where}: its {', '.join(bad)} is not finite; NormProp divides by its std and factor")
    if not first[1] > 1e-9 * max(1.0, abs(first[0])):  # rounding leaves a constant a std of ~1e-16
        raise ValueError(f"{where}: its std over N(0, 1) is {first[1]:.3g}: a constant function cannot be normalised")
    if len(values) > 1:
        scales = (first[1], first[1], first[2])  # the mean against the std: an odd function's mean is ~0
        for label, a, b, scale in zip(labels, first, values[1], scales, strict=True):
            if abs(b - a) > CONVERGED * scale:
                raise ValueError(
                    f"{where}: its {label} does not converge by quadrature ({a:.4g} with 100 nodes, {b:.4g} with "
                    "200): its integral is infinite (the Jacobian factor, where f'(x)^2 is not integrable against "
                    "N(0, 1), e.g. log|x| at 0) or the function has a kink or jump that `breakpoints` does not name"
                )
    return tried[0]


@cache
def _numerical_stats(name: str) -> ActivationStats:
    act = ACTIVATIONS[name]
    return quadrature_stats(act.fn, act.derivative, breakpoints=act.breakpoints)


def activation_stats(name: str, slope: Scalar = 0.25) -> ActivationStats:
    """Statistics of a registered activation by name; `slope` is used by "prelu" only."""
    if not isinstance(name, str):  # e.g. activation=torch.relu: a function is registered under a name first
        known = ", ".join(sorted([*ACTIVATIONS, *PARAMETRIC]))
        called = getattr(name, "__name__", None) if callable(name) else None
        given = f"the function {called!r}" if called else type(name).__name__
        if called in ACTIVATIONS:  # torch.relu, F.relu: the built-in has a name
            given += f' (built in as activation="{name.__name__}")'
        raise ValueError(
            f"activation must be a registered name ({known}), got {given}; to use another, register it first: "
            f'register_activation("name", fn), then activation="name" (normprop.register_activation)'
        )
    if name == "prelu":
        return prelu_stats(slope)
    if name not in ACTIVATIONS:
        known = ", ".join(sorted([*ACTIVATIONS, *PARAMETRIC]))
        raise ValueError(
            f"unknown activation {name!r}; known: {known}; "
            f"add your own with register_activation({name!r}, fn) (normprop.register_activation)"
        )
    closed_form = ACTIVATIONS[name].closed_form
    return closed_form() if closed_form is not None else _numerical_stats(name)
