"""The kernels one warm training step launches on CUDA, counted on the CPU from its ATen operations
(nn/kernels.py): NormProp's weight side on the roads CUDA takes stays within a fixed number of a plain step's."""

import pytest
import torch

from normprop_cli.engine.step import Step, make_optimizer
from normprop_cli.nn import NIN, fused
from normprop_cli.nn.kernels import KernelCount, step_kernels
from normprop_cli.nn.layers import has_normprop_layers
from normprop_cli.nn.methods import METHODS

NORMPROP_OVER_NONE = 40  # kernels NormProp's step may add to a plain one's on the fused road
NORMPROP_TRITON_OVER_NONE = 12  # and on the triton road (nn/triton_fold.py), CUDA's where Triton runs


def kernels(method: str, batch: int) -> KernelCount:
    torch.manual_seed(0)
    model = NIN(10, **METHODS[method].model_options(), width=0.1)
    opt = make_optimizer(model, 0.01, 0.9, 5e-4, torch.device("cpu"))
    step = Step(model, torch.nn.Identity(), opt, has_normprop_layers(model))
    return step_kernels(step, torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,)))


@pytest.fixture
def fused_road():
    before = fused.set_road("fused")
    yield
    fused.set_road(before)


@pytest.mark.parametrize("batch", [1, 50])
def test_normprops_step_on_the_fused_road_launches_at_most_40_kernels_more_than_a_plain_step(batch, fused_road):
    none, normprop = kernels("none", batch), kernels("normprop-icml", batch)
    assert normprop.total <= none.total + NORMPROP_OVER_NONE, normprop.by_op.most_common()
    assert "clone" not in normprop.by_op  # the clamp keeps no copy of its input at any size
    assert normprop.by_op["_weight_norm_interface"] == 2 * 9  # the fold and the constraint, one per layer each


@pytest.mark.parametrize("batch", [1, 50])
def test_normprops_step_on_the_triton_road_launches_at_most_12_kernels_more_than_a_plain_step(batch):
    """The fold's forward, its backward and SGD's step with the constraint, one Triton kernel each (run here in
    Triton's interpreter), and torch's SGD with nothing left to step."""
    pytest.importorskip("triton", minversion="3.3")
    none = kernels("none", batch)
    with fused.using_road("triton"):
        normprop = kernels("normprop-icml", batch)
    assert normprop.total <= none.total + NORMPROP_TRITON_OVER_NONE, normprop.by_op.most_common()
    assert {op: normprop.by_op[op] for op in ("fold_forward", "fold_backward", "sgd_unit_norm_")} == {
        "fold_forward": 1, "fold_backward": 1, "sgd_unit_norm_": 1}  # fmt: skip
    assert "_weight_norm_interface" not in normprop.by_op and "_fused_sgd_" not in normprop.by_op


def test_views_and_allocations_are_free_and_a_broadcasting_foreach_is_a_kernel_per_tensor():
    a = [torch.randn(4, 3), torch.randn(5, 2)]
    columns, same = [torch.ones(4, 1), torch.ones(5, 1)], [torch.ones(4, 3), torch.ones(5, 2)]
    with KernelCount() as count:
        a[0].view(12).t()
        torch.empty(3)
        torch._foreach_mul(a, columns)  # broadcast: CUDA's slow path
    assert count.total == 2 and count.by_op == {"_foreach_mul": 2}
    with KernelCount() as count:
        torch._foreach_mul(a, same)  # same shapes: one multi-tensor launch
        torch._foreach_add_(a, 1.0)
        torch.add(a[0], 1)
    assert count.by_op == {"_foreach_mul": 1, "_foreach_add_": 1, "add": 1}


def test_a_fast_foreach_over_many_tensors_or_chunks_takes_more_than_one_launch():
    many = [torch.zeros(2) for _ in range(111)]  # 110 tensors a launch for one list
    big = [torch.zeros(321 * 65536)]  # 320 chunks a launch
    with KernelCount() as count:
        torch._foreach_add_(many, 1.0)
    assert count.total == 2
    with KernelCount() as count:
        torch._foreach_add_(big, 1.0)
    assert count.total == 2
