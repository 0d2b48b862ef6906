"""The triton road (nn/triton_fold.py: NormProp's parameters in one flat buffer, the fold's forward, its backward and
SGD's step with the unit-norm constraint one Triton kernel each, CUDA's road) computes what the CPU's batched road
computes. Here the same kernels run on the CPU in Triton's interpreter, the road forced. A layer alone on this road
against eq. 11 is tested with the fused road's, in tests/nn/test_fused.py."""

import copy
import io

import pytest
import torch

pytest.importorskip("triton", minversion="3.3")

from normprop_cli.engine.step import Step, make_optimizer  # noqa: E402
from normprop_cli.nn import (  # noqa: E402
    NIN,
    NormPropConv2d,
    constrain_unit_norm_,
    fused,
    layers,
)

STEPS = 20


@pytest.fixture
def road():
    """Set fused.ROAD for a test; put back after it."""
    with fused.using_road(fused.ROAD):
        yield fused.set_road


def trained(road_name, steps=STEPS, batch=2, lr=0.005, decay="all", tensor_lr=False, device="cpu", **options):
    """Per step on `road_name`: the loss, every parameter's gradient and every filter's norm after the step."""
    with fused.using_road(road_name):
        torch.manual_seed(0)
        model = NIN(10, norm="normprop", width=0.1, **options).to(device)
        opt = make_optimizer(model, lr, 0.9, 5e-4, torch.device(device), decay)
        if tensor_lr:  # as a CUDA graph's step holds it (engine.step.GraphedStep)
            for group in opt.param_groups:
                group["lr"] = torch.tensor(float(group["lr"]), device=device)
        step = Step(model, torch.nn.Identity(), opt, constrain=True)
        g = torch.Generator().manual_seed(1)
        out = []
        for _ in range(steps):
            x, y = torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)
            loss, _ = step(x.to(device), y.to(device))
            grads = [p.grad.to("cpu", copy=True) for p in model.parameters() if p.grad is not None]
            norms = torch.cat([m.filter_norms() for m in model.modules() if hasattr(m, "filter_norms")])
            out.append((loss.item(), grads, norms.detach().cpu()))
        return out, model, opt


def assert_same_training(triton_run, batched_run):
    for (loss_t, grads_t, norms_t), (loss_b, grads_b, norms_b) in zip(triton_run, batched_run, strict=True):
        assert loss_t == pytest.approx(loss_b, rel=1e-5)
        assert len(grads_t) == len(grads_b)
        for gt, gb in zip(grads_t, grads_b, strict=True):
            assert (gt - gb).norm() <= 1e-5 * gb.norm()
        assert (norms_t - 1).abs().max() <= 1e-6 and (norms_b - 1).abs().max() <= 1e-6


def test_the_triton_road_trains_as_the_batched_road_within_1e_5_and_keeps_every_filter_at_unit_norm():
    """20 steps of SGD (momentum, weight decay) with the constraint, float32, batch 2: the same loss and every
    gradient within 1e-5 relative, every filter's norm within 1e-6 of 1 after every step. (A rate at which float32's
    rounding, which training amplifies, stays well inside the bound on every gradient: at 0.01 one gap nears it.)"""
    (triton_run, model, opt), (batched_run, _, _) = trained("triton"), trained("batched")
    assert_same_training(triton_run, batched_run)
    pack = model.features.conv1._flat
    assert all(p.untyped_storage().data_ptr() == pack.flat.untyped_storage().data_ptr() for p in model.parameters())
    assert_stepped_by_the_kernel(model, opt, len(list(model.parameters())))


def assert_stepped_by_the_kernel(model, opt, learnt):
    """The optimizer's momentum buffers are views of the flat momentum buffer: the kernel, not torch, stepped."""
    momentum = model.features.conv1._flat.momentum
    assert len(opt.state) == learnt
    assert all(s["momentum_buffer"].untyped_storage().data_ptr() == momentum.data_ptr() for s in opt.state.values())


@pytest.mark.parametrize(
    "options",
    [{"decay": "weights", "tensor_lr": True}, {"freeze_affine": True}],
    ids=["decay-on-the-filters-only-and-the-rate-a-tensor", "gamma-and-beta-frozen"],
)
def test_the_triton_step_follows_sgd_with_each_groups_decay_a_tensor_rate_and_frozen_gains(options):
    """The kernel's SGD as torch.optim.SGD's in two groups (decay on the filters, none on gamma and beta) with
    each group's rate a tensor (a CUDA graph's), and with gamma and beta out of the optimizer."""
    triton_run, model, opt = trained("triton", 4, **options)
    assert_same_training(triton_run, trained("batched", 4, **options)[0])
    assert_stepped_by_the_kernel(model, opt, sum(p.requires_grad for p in model.parameters()))


def test_the_flat_buffer_keeps_the_state_dicts_and_a_run_resumes_from_a_checkpoint_as_it_goes_on(road):
    """The same keys, shapes and values in the model's and the optimizer's state_dict as the batched road's; a
    checkpoint loaded into a fresh model and optimizer goes on as the run it came from."""
    run, model, opt = trained("triton", 3)
    _, model_b, opt_b = trained("batched", 3)
    state, state_b = model.state_dict(), model_b.state_dict()
    assert list(state) == list(state_b) and all(state[k].shape == state_b[k].shape for k in state)
    for k in state:
        torch.testing.assert_close(state[k], state_b[k], rtol=1e-5, atol=1e-6)
    saved, saved_b = opt.state_dict(), opt_b.state_dict()
    assert saved["param_groups"] == saved_b["param_groups"]
    assert {k: v["momentum_buffer"].shape for k, v in saved["state"].items()} == {
        k: v["momentum_buffer"].shape for k, v in saved_b["state"].items()
    }
    buffer = io.BytesIO()
    torch.save({"model": state, "optimizer": saved}, buffer)
    road("triton")
    twin = copy.deepcopy(model)  # its parameters are copies, no longer views of the buffer: packed anew
    twin_opt = make_optimizer(twin, 0.005, 0.9, 5e-4, torch.device("cpu"))
    buffer.seek(0)
    checkpoint = torch.load(buffer)
    twin.load_state_dict(checkpoint["model"])
    twin_opt.load_state_dict(checkpoint["optimizer"])
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(2, 3, 32, 32, generator=g), torch.randint(0, 10, (2,), generator=g)) for _ in range(2)]
    going_on = [Step(model, torch.nn.Identity(), opt, True)(x, y)[0].item() for x, y in batches]
    resumed = [Step(twin, torch.nn.Identity(), twin_opt, True)(x, y)[0].item() for x, y in batches]
    assert resumed == pytest.approx(going_on, rel=1e-6)
    assert twin.features.conv1._flat is not model.features.conv1._flat


def test_the_triton_constraint_scales_each_filter_to_unit_norm_as_the_batched_one(road):
    """constrain_unit_norm_ alone (no SGD step) on a NIN whose forward packed it: one kernel, the batched road's
    filters."""
    road("triton")
    torch.manual_seed(0)
    model = NIN(10, norm="normprop", width=0.1)
    model(torch.randn(1, 3, 32, 32))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)  # in place: still the flat buffer's views
    twin = copy.deepcopy(model)
    constrain_unit_norm_(model)
    assert model.features.conv1._flat.holds(model._folded)
    road("batched")
    constrain_unit_norm_(twin)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert all((m.filter_norms() - 1).abs().max() <= 1e-6 for m in model._folded)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("batch", "lr"), [(1, 0.005), (8, 0.05)])
def test_on_cuda_the_triton_road_trains_as_the_cpus_batched_road_within_1e_5(batch, lr):
    """The triton road compiled for the GPU, full float32 (no TF32, cuDNN deterministic), against the CPU's
    batched road, step by step; the rate a tensor on CUDA, as its CUDA graph holds it."""
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic = False, True
    try:
        cpu = trained("batched", batch=batch, lr=lr)[0]
        cuda = trained("triton", batch=batch, lr=lr, device="cuda", tensor_lr=True)[0]
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic = flags
    assert_same_training(cuda, cpu)


def test_a_pack_made_by_an_evaluation_trains_after_it(road):
    """The first forward under inference mode (an evaluation before any step) packs the parameters into a
    buffer that training may then save for backward and step in place."""
    road("triton")
    layer = NormPropConv2d(3, 4, 3)
    with torch.inference_mode():
        before = layer(torch.randn(1, 3, 5, 5))
    assert not layer.weight.is_inference() and not layer._flat.flat.is_inference()
    layer(torch.randn(1, 3, 5, 5)).sum().backward()
    opt = torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9)
    assert layers.sgd_step_and_constrain_(layer, opt)
    assert (layer.filter_norms() - 1).abs().max() <= 1e-6 and before.shape == (1, 4, 3, 3)


def test_triton_is_taken_only_where_asked_for_and_only_contiguous_float32(road):
    w = [torch.randn(4, 3, 3, 3)]
    assert fused.ROAD == "auto" and not fused.takes_triton(w)
    if torch.cuda.is_available():
        assert not fused.takes_triton([w[0].cuda()])  # "auto" keeps CUDA on the fused road
    road("triton")
    assert fused.takes_triton(w) and not fused.takes_triton([w[0].double()])
    assert not fused.takes_triton([w[0].to(memory_format=torch.channels_last)])
    with pytest.raises(ValueError, match="auto, fused, batched, triton"):
        road("nope")
