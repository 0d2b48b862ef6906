"""The training step of section 4.4, and the ways it can run: eager, compiled, or one CUDA graph.

A step takes a batch as the data set stores it (uint8 images, int64 labels) and leaves the
weights updated:

    data normalisation (section 4.1) -> model -> cross-entropy -> backward
    -> SGD (momentum, weight decay) -> NormProp's unit-norm constraint (section 4.4)

and returns the loss and the number of correct predictions as device tensors: no `.item()`,
so a GPU never waits for the host inside an epoch. A step is timed only with a `StepClock` set
as its `clock` (`normprop bench`): the trainer's steps have none.

Options (`train:` in conf/config.yaml), off by default but for channels_last on the CPU and
cuda_graph on CUDA (`auto`, their default; true, false or auto, SWITCHES):
    channels_last  NHWC activations and weights; `auto`: on the CPU, where oneDNN's convolutions
                   and max pooling are faster in NHWC (docs/performance.md), off on CUDA
    amp            bfloat16 autocast (tensor cores; AMX or AVX512-BF16 CPUs, `device.bf16_supported`);
                   the loss and the master weights stay float32; NormProp keeps its folded path
    compile        torch.compile the model (needs a C++ compiler on the CPU)
    cuda_graph     capture the whole step as one CUDA graph and replay it (CUDA only, not with
                   compile; `auto`: on CUDA); launching the kernels of a small NIN step costs more than
                   running them. Where capture fails, the run goes on with the eager step (one line says so)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from normprop_cli.device import synchronize
from normprop_cli.errors import first_line
from normprop_cli.nn import constrain_unit_norm_
from normprop_cli.nn.layers import sgd_step_and_constrain_
from normprop_cli.nn.methods import is_kernel


@dataclass(frozen=True)
class StepOptions:
    channels_last: bool = False
    amp: bool = False
    compile: bool = False
    cuda_graph: bool = False

    @classmethod
    def from_cfg(cls, train_cfg, device: torch.device) -> StepOptions:
        """The `train:` options that apply on `device` (a CUDA graph: CUDA only, not compiled)."""
        get = lambda key: bool(train_cfg.get(key, False))  # noqa: E731
        compile_ = get("compile")
        graph = train_cfg.get("cuda_graph", False)
        graph = (device.type == "cuda" if graph == "auto" else bool(graph)) and device.type == "cuda" and not compile_
        nhwc = train_cfg.get("channels_last", False)
        nhwc = device.type == "cpu" if nhwc == "auto" else bool(nhwc)
        return cls(nhwc, get("amp"), compile_, graph)


SWITCHES = (True, False, "auto")  # the values of train.channels_last and train.cuda_graph


DECAY = ("all", "weights")


def clipped_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters adaptive gradient clipping applies to: all that learn but the classifier's,
    which NFNets leave unclipped (Brock et al. 2021b, section 4.1); the classifier is the model's last
    hidden layer (`hidden_layers()[-1]`) where it has them, else nothing is exempt."""
    exempt = set()
    if hasattr(model, "hidden_layers"):
        exempt = {id(p) for p in model.hidden_layers()[-1].parameters()}
    return [p for p in model.parameters() if p.requires_grad and id(p) not in exempt]


def make_optimizer(
    model: nn.Module, lr: float, momentum: float, weight_decay: float, device: torch.device, decay: str = "all"
) -> torch.optim.SGD:
    """Section 4.4's SGD, one fused kernel per step where torch has one (CPU and CUDA), over the
    parameters that learn (a frozen gain or bias is left out). `decay` says which take the weight
    decay: `all`, or `weights`: the kernels, by their role as the model's norm declares it in the
    registry (nn.methods.is_kernel: the conv and linear filters), not the gains, biases and other
    per-unit parameters whatever their shape, as the normalisers' authors train them (for a
    scale-invariant conv, decay on the gain of the normalisation changes the effective rate)."""
    if decay not in DECAY:
        raise ValueError(f"train.decay={decay} is not known; use one of {', '.join(DECAY)}")
    learnt = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for _, p in learnt]}]
    if decay == "weights":
        norm = getattr(model, "norm", None)
        kernels = [p for n, p in learnt if is_kernel(n, p, norm)]
        others = [p for n, p in learnt if not is_kernel(n, p, norm)]
        groups = [{"params": kernels}, {"params": others, "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
    return torch.optim.SGD(
        groups,
        lr=float(lr),
        momentum=float(momentum),
        weight_decay=float(weight_decay),
        fused=device.type in ("cpu", "cuda"),
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        if isinstance(group["lr"], Tensor):
            group["lr"].fill_(lr)  # in place: a CUDA graph reads this tensor
        else:
            group["lr"] = lr


PHASES = ("forward", "backward", "optimizer", "constraint")


class StepClock:
    """A step's clock (`normprop bench`): set as `step.clock`, it keeps each step's ms and, on the CPU,
    each phase's (PHASES). The device is synchronised as a step starts and as it ends, here alone, so
    a step's time is its work's; a CUDA step's phases are not kept: there their ends are launches."""

    def __init__(self, device: torch.device):
        self.device, self.t0, self.last = device, 0.0, 0.0
        self.steps: list[float] = []
        self.phases: dict[str, list[float]] = {p: [] for p in PHASES} if device.type == "cpu" else {}

    def start(self) -> None:
        synchronize(self.device)
        self.t0 = self.last = time.perf_counter()

    def mark(self, phase: str) -> None:
        """`phase` has ended: its ms are the time since the previous mark (or the start)."""
        if self.phases:
            now = time.perf_counter()
            self.phases[phase].append(1e3 * (now - self.last))
            self.last = now

    def stop(self) -> None:
        synchronize(self.device)
        self.steps.append(1e3 * (time.perf_counter() - self.t0))


class Step:
    """One SGD step on a batch; `logits` is the same forward for evaluation. Without a `clock`
    (the trainer's steps) nothing is timed and nothing synchronised."""

    clock: StepClock | None = None
    clip: Callable[[], None] | None = None  # adaptive gradient clipping of the gradients, before the update

    def __init__(
        self,
        model: nn.Module,
        data_norm: nn.Module,
        optimizer: torch.optim.Optimizer,
        constrain: bool,
        options: StepOptions = StepOptions(),
    ):
        self.model, self.data_norm, self.optimizer = model, data_norm, optimizer
        self.constrain, self.options = constrain, options
        self.net = torch.compile(model) if options.compile else model
        self.device_type = next(model.parameters()).device.type

    def logits(self, x: Tensor) -> Tensor:
        x = self.data_norm(x)
        if self.options.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(
            self.device_type,
            torch.bfloat16,
            enabled=self.options.amp,
            cache_enabled=not self.options.cuda_graph,
        ):
            return self.net(x).float()

    def __call__(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        clock = self.clock
        if clock is not None:
            clock.start()
        logits = self.logits(x)
        loss = F.cross_entropy(logits, y)
        if clock is not None:
            clock.mark("forward")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.clip is not None:
            self.clip()
        if clock is not None:
            clock.mark("backward")
        stepped = self.constrain and sgd_step_and_constrain_(self.model, self.optimizer)  # CUDA's triton road
        if not stepped:
            self.optimizer.step()
        if clock is not None:
            clock.mark("optimizer")
        if self.constrain and not stepped:
            constrain_unit_norm_(self.model)  # section 4.4
        if clock is not None:
            clock.mark("constraint")
            clock.stop()
        return loss.detach(), (logits.detach().argmax(1) == y).sum()


class GraphedStep:
    """A `Step` captured as one CUDA graph on its first batch, then replayed on every batch.

    Every batch of an epoch has the same shape (the trainer drops the last partial batch), so
    static input buffers suffice. The warm-up steps that capturing needs run on a side stream
    and are then undone: the model, data normalisation and optimizer go back to the state they
    had, so a run with the graph takes exactly the steps of a run without it. Momentum buffers
    that did not exist yet are zeroed, and SGD from a zero buffer is SGD's first step. Its `clock`
    times whole replays (the first with its capture); the captured Step's stays unset.

    A replay returns the graph's own output tensors, the same ones every time, overwritten by the next
    replay: the trainer adds each loss to its sums before the next step; a caller that keeps the losses of
    several steps copies each (bench.timing, bench.gpu_items).

    Where capture fails (an operation that a graph cannot hold, such as a host sync), the state is
    put back as it was before, one line names the method (`name`) and the reason, and every step,
    this one included, runs the eager Step: the numbers of a run without the graph.
    """

    clock: StepClock | None = None

    def __init__(self, step: Step, warmup: int = 3, name: str = ""):
        self.step, self.warmup, self.graph, self.eager = step, warmup, None, False
        self.name = name or str(getattr(step.model, "norm", type(step.model).__name__))
        self.logits = step.logits

    def __call__(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        clock = self.clock
        if clock is not None:
            clock.start()
        if self.graph is None and not self.eager:
            self._capture_or_fall_back(x, y)
        if self.eager:
            out = self.step(x, y)
        else:
            self.x.copy_(x)
            self.y.copy_(y)
            self.graph.replay()
            out = self.out
        if clock is not None:
            clock.stop()
        return out

    def _capture_or_fall_back(self, x: Tensor, y: Tensor) -> None:
        step = self.step
        lrs = [group["lr"] for group in step.optimizer.param_groups]
        stateful = {id(p) for p, s in step.optimizer.state.items() if s}
        saved = _snapshot(step)
        try:
            self._capture(x, y, saved)
        except Exception as exc:  # capture refused: put everything back and go on eagerly
            synchronize(x.device)  # the side stream's warm-up steps are done before the state is put back
            _restore(step, saved)
            for p in [p for p in step.optimizer.state if id(p) not in stateful]:
                del step.optimizer.state[p]  # SGD's first step makes its momentum buffer, as eagerly
            for group, lr in zip(step.optimizer.param_groups, lrs, strict=True):
                group["lr"] = lr
            self.graph, self.eager = None, True
            from normprop_cli.engine.runs import say

            say(f"cuda_graph: {self.name}: capture failed ({first_line(exc, 160)}); its steps run eagerly")

    def _capture(self, x: Tensor, y: Tensor, saved: dict) -> None:
        step = self.step
        for group in step.optimizer.param_groups:  # a device tensor, which `set_lr` fills
            if not isinstance(group["lr"], Tensor):
                group["lr"] = torch.tensor(float(group["lr"]), device=x.device)
        self.x, self.y = x.clone(), y.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                step(self.x, self.y)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        step.optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            self.out = step(self.x, self.y)
        _restore(step, saved)


def _snapshot(step: Step) -> dict:
    tensors = {
        **{f"m.{k}": v for k, v in step.model.state_dict().items()},
        **{f"d.{k}": v for k, v in step.data_norm.state_dict().items()},
    }
    momenta = {
        id(p): s["momentum_buffer"] for p, s in step.optimizer.state.items() if s.get("momentum_buffer") is not None
    }
    return {
        "tensors": {k: v.clone() for k, v in tensors.items()},
        "momenta": {k: v.clone() for k, v in momenta.items()},
    }


@torch.no_grad()
def _restore(step: Step, saved: dict) -> None:
    current = {
        **{f"m.{k}": v for k, v in step.model.state_dict().items()},
        **{f"d.{k}": v for k, v in step.data_norm.state_dict().items()},
    }
    for k, v in current.items():
        v.copy_(saved["tensors"][k])
    for p, s in step.optimizer.state.items():
        buf = s.get("momentum_buffer")
        if buf is not None and id(p) in saved["momenta"]:
            buf.copy_(saved["momenta"][id(p)])
        elif buf is not None:
            buf.zero_()


def make_step(
    model: nn.Module,
    data_norm: nn.Module,
    optimizer: torch.optim.Optimizer,
    constrain: bool,
    options: StepOptions,
    agc: float | None = None,
    name: str = "",
) -> Step | GraphedStep:
    """The step the options ask for; `name` (the run's method) is what a failed CUDA graph capture's line names."""
    step = Step(model, data_norm, optimizer, constrain, options)
    if agc is not None:
        from timm.utils import adaptive_clip_grad  # NFNets' unit-wise clipping, as timm's NFNet training uses it

        params, factor = clipped_parameters(model), float(agc)
        step.clip = lambda: adaptive_clip_grad(params, clip_factor=factor)
    return GraphedStep(step, name=name) if options.cuda_graph else step
