"""Every normaliser trained as its authors train it: weight decay on weights only, frozen gains and
biases (an ablation), NFNets' adaptive gradient clipping, the same plain classifier, Batch
Renormalization's schedule in epochs, ZCA-whitened input, the test set left unscored."""

import math

import pytest
import torch
from torch import nn

from normprop_cli.data.normalize import ZCADataNorm, make_data_norm
from normprop_cli.engine.step import StepOptions, clipped_parameters, make_optimizer, make_step
from normprop_cli.experiments import grid
from normprop_cli.nn import NIN
from normprop_cli.nn.layers import NormPropConv2d
from normprop_cli.nn.methods import METHODS, is_kernel, method_of, settings
from normprop_cli.nn.nin import affine_parameters
from normprop_cli.nn.normalizers import BatchRenorm2d, renorm_in_steps

CPU = torch.device("cpu")


def test_decay_on_weights_leaves_gains_and_biases_undecayed():
    net = NIN(10, 1, "normprop", 0.125)
    opt = make_optimizer(net, 0.1, 0.9, 5e-4, CPU, decay="weights")
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    for p in net.parameters():
        assert (id(p) in decayed) == (p.ndim >= 2)


def filters_of(net: nn.Module) -> set[str]:
    """The names of the parameters that are filters by their shape and place, independently of the
    registry: a conv's or linear's weight with more than one input element per output unit, or weight
    norm's direction v; a gain or bias holds one value per output unit (or one in all)."""
    names = set()
    for name, p in net.named_parameters():
        per_unit = p.numel() <= p.shape[0] if p.ndim else True
        if not per_unit and name.rsplit(".", 1)[-1] in ("weight", "original1"):
            names.add(name)
    return names


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_zero_gradient_step_with_decay_moves_the_kernels_alone(method):
    """Decay by role, not by shape: with every gradient zero, an SGD step with weight decay under
    train.decay=weights moves exactly the filters; every gain and bias (weight norm's g and scaled WS's
    gain are C x 1 x 1 x 1) stays where it is. The paper's `all` moves everything that is nonzero."""
    torch.manual_seed(0)
    net = NIN(10, 1, width=0.125, **METHODS[method].model_options())
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.5)  # every parameter nonzero, so that decay would move it
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    opt = make_optimizer(net, 1.0, 0.0, 0.1, CPU, decay="weights")
    for p in net.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    moved = {n for n, p in net.named_parameters() if not torch.equal(p, before[n])}
    assert moved == filters_of(net) and moved, method
    assert moved == {n for n, p in net.named_parameters() if is_kernel(n, p, net.norm)}
    everything = make_optimizer(net, 0.1, 0.9, 5e-4, CPU)  # the paper's runs: one group, all decayed
    (group,) = everything.param_groups
    assert len(group["params"]) == len(list(net.parameters())) and group["weight_decay"] == 5e-4


def test_frozen_affine_stays_at_its_initial_values_and_leaves_the_optimizer():
    torch.manual_seed(0)
    for norm in ("normprop", "batchnorm"):
        net = NIN(10, 1, norm, 0.125, freeze_affine=True)
        frozen = affine_parameters(net)
        assert frozen and all(not p.requires_grad for p in frozen)
        before = [p.clone() for p in frozen]
        opt = make_optimizer(net, 0.1, 0.9, 5e-4, CPU, decay="weights")
        assert not {id(p) for p in frozen} & {id(p) for g in opt.param_groups for p in g["params"]}
        step = make_step(net, nn.Identity(), opt, norm == "normprop", StepOptions())
        x, y = torch.rand(4, 1, 32, 32), torch.tensor([0, 1, 2, 3])
        for _ in range(3):
            step(x, y)
        assert all(torch.equal(a, b) for a, b in zip(before, frozen, strict=True)), norm


def test_adaptive_clipping_bounds_each_units_gradient_but_the_classifiers():
    """NFNets' AGC: ||G_i|| <= factor * max(||W_i||, 1e-3) per output unit, the classifier unclipped."""
    torch.manual_seed(1)
    net = NIN(10, 1, "scaledws", 0.125)
    opt = make_optimizer(net, 0.0, 0.0, 0.0, CPU)  # lr 0: the step leaves the weights, we read the gradients
    step = make_step(net, nn.Identity(), opt, False, StepOptions(), agc=0.01)
    exempt = {id(p) for p in net.hidden_layers()[-1].parameters()}
    assert exempt and not exempt & {id(p) for p in clipped_parameters(net)}
    x, y = 50 * torch.randn(8, 1, 32, 32), torch.arange(8)
    step(x, y)
    classifier_ratio = 0.0
    for p in net.parameters():
        dims = tuple(range(1, p.ndim)) if p.ndim > 1 else None
        w = torch.linalg.vector_norm(p.detach(), dim=dims, keepdim=True).clamp_min(1e-3)
        g = torch.linalg.vector_norm(p.grad, dim=dims, keepdim=True)
        if id(p) in exempt:
            classifier_ratio = max(classifier_ratio, float((g / w).max()))
        else:
            assert bool((g <= 0.01 * w * (1 + 1e-4)).all())
    assert classifier_ratio > 0.01  # the classifier's gradient was left as it was


def test_every_method_can_share_the_plain_classifier_and_the_ablation_keeps_normprops_own():
    plain = NIN(10, 1, "normprop", 0.125, classifier="plain")
    own = NIN(10, 1, "normprop", 0.125)
    assert type(plain.hidden_layers()[-1]) is nn.Conv2d and isinstance(own.hidden_layers()[-1], NormPropConv2d)
    by_id = {e.id: e.set for e in grid.load("normalizers", preset="quick").grid}
    icml = by_id["normprop-icml-b1"]
    assert icml["method"] == "normprop-icml" and "model.classifier" not in icml
    assert by_id["normprop-icml-own-classifier-b1"]["model.classifier"] == "own"  # the rest share the YAML's plain
    assert method_of({"norm": "normprop", "jacobian": "init"}) == "normprop-arxiv"  # where no grid names it
    assert settings("scaledws")["train.agc"] == 0.01 and settings("scaledws")["model.norm"] == "scaledws"


def test_batch_renorm_schedule_follows_epochs_not_steps():
    """At the same epoch, runs at batch 1, 10 and 50 have relaxed their limits alike; in steps they would not."""
    schedule = {"rmax": 3.0, "dmax": 5.0, "warmup_epochs": 0.5, "rmax_epochs": 4.0, "dmax_epochs": 2.5}
    limits = {}
    for batch, steps_per_epoch in ((1, 10000), (10, 1000), (50, 200)):
        layer = BatchRenorm2d(2, **renorm_in_steps(schedule, steps_per_epoch))
        for epoch in (0.25, 1.0, 2.0, 3.0, 5.0):
            layer.num_batches_tracked.fill_(round(epoch * steps_per_epoch))
            limits[batch, epoch] = tuple(round(float(v), 6) for v in layer.limits())
    for epoch in (0.25, 1.0, 2.0, 3.0, 5.0):
        assert limits[1, epoch] == limits[10, epoch] == limits[50, epoch]
    assert limits[50, 0.25] == (1.0, 0.0) and limits[50, 5.0] == (3.0, 5.0)
    assert 1.0 < limits[50, 2.0][0] < 3.0  # started: Batch Renorm is no longer BatchNorm at batch 50
    nulled = {"warmup_steps": None, "rmax_steps": None, "dmax_steps": None} | schedule
    assert renorm_in_steps(nulled, 200)["warmup_steps"] == 100
    with pytest.raises(ValueError, match="epochs"):
        renorm_in_steps(schedule | {"warmup_steps": 5}, 200)
    with pytest.raises(ValueError, match="steps per epoch"):
        renorm_in_steps(schedule, None)


def test_zca_whitens_the_training_images():
    torch.manual_seed(2)
    q, _ = torch.linalg.qr(torch.randn(48, 48))
    mix = q * torch.logspace(-0.5, 0.5, 48)  # correlated elements, variances 0.1 to 10
    x = (torch.randn(4000, 48) @ mix.T + 3.0).view(-1, 3, 4, 4)
    zca = ZCADataNorm.from_train(x, eps=1e-6)
    z = zca(x).flatten(1).double()
    cov = (z - z.mean(0)).T @ (z - z.mean(0)) / len(z)
    assert torch.allclose(cov, torch.eye(48, dtype=torch.float64), atol=2e-2)
    again = ZCADataNorm((3, 4, 4))
    again.load_state_dict(zca.state_dict())
    assert torch.equal(again(x[:5]), zca(x[:5]))
    assert isinstance(make_data_norm("zca", x), ZCADataNorm)


def test_a_run_without_the_test_set_scores_validation_only(tmp_path):
    from normprop_cli import config
    from normprop_cli.engine.job import load_data
    from normprop_cli.engine.trainer import evaluate, make_run

    cfg = config.load("table1", preset="smoke", overrides=["train.eval_test=false"], results_dir=tmp_path)
    data = load_data(cfg, CPU)
    run = make_run(cfg, data, CPU)
    scores = evaluate(run, data, cfg)
    assert math.isnan(scores["test_acc"]) and math.isnan(scores["test_loss"]) and 0 <= scores["val_acc"] <= 100
