"""How many kernels a piece of eager PyTorch would launch on CUDA, counted on any device from the ATen
operations it dispatches. In a CUDA graph each kernel of a small step costs a few microseconds whatever
its size, so for a step this count is what the weight side costs; counting on the CPU lets a test hold it.

    with KernelCount() as count:
        step(x, y)
    count.total, count.by_op.most_common(10)

or `step_kernels(step, x, y)`, one warm step of a training step (any callable), counted.

What counts as a kernel, as CUDA's eager PyTorch launches them:
  - an operation that returns a view of its input (view, split, expand, detach...) or only allocates
    (empty, empty_like...): none;
  - `_foreach_*` and `_fused_*` over lists: where every list's i-th tensor has the same shape and strides and all
    share one dtype (CUDA's fast path), the launches of `multi_tensor_apply` (one per 110, 64, 48, 36 or 30
    tensors as 1 to 5 lists take part, or per 320 chunks of 65,536 elements), plus one for `_foreach_norm`'s
    final pass; otherwise one kernel per tensor of the list (CUDA's slow path: a broadcast, mixed dtypes);
  - a convolution: one, and one more to add its bias (cuDNN's); its backward: one per gradient asked for;
  - an operator of our own (nn/triton_fold.py's, each a torch.library.triton_op launching one Triton kernel): one;
  - anything else: one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

# allocations and the profiler's markers (an optimizer's step records one), which launch nothing
FREE = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "resize_",
        "set_",
        "_record_function_enter_new",
        "_record_function_exit",
    }
)
MAX_TENSORS = (110, 64, 48, 36, 30)  # multi_tensor_apply's tensors per launch for 1 to 5 lists
MAX_BLOCKS, CHUNK = 320, 65536  # and its chunks per launch, of this many elements each


def _is_view(func) -> bool:
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _lists(args) -> list[list[Tensor]]:
    return [a for a in args if isinstance(a, (list, tuple)) and a and all(isinstance(t, Tensor) for t in a)]


def _multi_tensor_launches(lists: list[list[Tensor]]) -> int:
    """multi_tensor_apply's kernel launches over `lists` (each list's i-th tensors taken together)."""
    limit, launches, tensors, blocks = MAX_TENSORS[min(len(lists), len(MAX_TENSORS)) - 1], 0, 0, 0
    for t in lists[0]:
        tensors += 1
        chunks = max(1, math.ceil(t.numel() / CHUNK))
        for c in range(chunks):
            blocks += 1
            last = c == chunks - 1
            if blocks == MAX_BLOCKS or (last and tensors == limit):
                launches, blocks = launches + 1, 0
                tensors = 0 if last else 1  # a tensor cut mid-way goes on in the next launch
    return launches + (blocks > 0)


def _fast_path(lists: list[list[Tensor]]) -> bool:
    """Whether CUDA's foreach kernels take one multi-tensor launch: same shapes and strides position by
    position, one dtype, every tensor dense."""
    dtype = lists[0][0].dtype
    for group in zip(*lists, strict=False):
        first = group[0]
        if not first.is_contiguous() and not first.is_contiguous(memory_format=torch.channels_last):
            return False
        if any(t.shape != first.shape or t.stride() != first.stride() or t.dtype != dtype for t in group):
            return False
    return len({len(x) for x in lists}) == 1


def kernels_of(func, args, kwargs, out) -> int:
    """The CUDA kernels one dispatched ATen operation stands for (module docstring)."""
    name = func._schema.name.split("::")[-1]
    if name in FREE or _is_view(func):
        return 0
    if name.startswith(("_foreach_", "_fused_")):
        lists = _lists(list(args) + list(kwargs.values()))
        if not lists:
            return 0
        outputs = _lists([out]) if not name.endswith("_") and name != "_foreach_norm" else []
        if not _fast_path(lists + outputs):
            return len(lists[0])
        return _multi_tensor_launches(lists + outputs) + (name == "_foreach_norm")
    if name == "convolution":
        return 1 + (args[2] is not None)
    if name == "convolution_backward":
        return sum(bool(m) for m in args[-1])
    return 1


class KernelCount(TorchDispatchMode):
    """A dispatch mode that counts the kernels of the operations run under it: `total`, and `by_op`
    (operation name -> kernels)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        n = kernels_of(func, args, kwargs, out)
        if n:
            self.by_op[func._schema.name.split("::")[-1]] += n
        return out


def step_kernels(step: Callable, *args, warmup: int = 2) -> KernelCount:
    """The kernels of one warm call of `step(*args)` (a training step: its optimizer's buffers made and every
    cache filled by `warmup` calls first), counted as CUDA's eager PyTorch would launch them. A step that
    replays a CUDA graph (engine.step.GraphedStep: one with an eager `.step` and a `.graph`) is counted through its
    eager step, whose kernels are the graph's: a replay dispatches no operation."""
    if hasattr(step, "graph") and callable(getattr(step, "step", None)):
        step = step.step
    for _ in range(warmup):
        step(*args)
    with KernelCount() as count:
        step(*args)
    return count
