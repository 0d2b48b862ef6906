"""The training step (section 4.4) in each of its ways to run gives the plain step's numbers."""

import os

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from normprop_cli import config
from normprop_cli.data import make_data_norm, to_float
from normprop_cli.engine.step import (
    PHASES,
    GraphedStep,
    Step,
    StepClock,
    StepOptions,
    make_optimizer,
    make_step,
    set_lr,
)
from normprop_cli.nn import NIN, constrain_unit_norm_
from normprop_cli.nn.layers import has_normprop_layers
from normprop_cli.nn.methods import METHODS, model_options, settings

LR, MOMENTUM, DECAY = 0.05, 0.9, 5e-4


def batches(n=4, batch=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randint(0, 256, (batch, 3, 32, 32), generator=g, dtype=torch.uint8) for _ in range(n)]
    ys = [torch.randint(0, 10, (batch,), generator=g) for _ in range(n)]
    return xs, ys


def setup(norm="normprop", device="cpu", options=StepOptions()):
    torch.manual_seed(0)
    model = NIN(10, norm=norm, width=0.1).to(device)
    if options.channels_last:
        model = model.to(memory_format=torch.channels_last)
    data_norm = make_data_norm("batch", torch.zeros(2, 3, 32, 32, dtype=torch.uint8)).to(device)
    opt = make_optimizer(model, LR, MOMENTUM, DECAY, torch.device(device))
    return model, data_norm, opt


def plain_steps(norm, xs, ys):
    """Section 4.4 written out: the trainer's step before it was optimised (SGD as a loop)."""
    model, data_norm, _ = setup(norm)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=DECAY, foreach=False)
    losses = []
    for x, y in zip(xs, ys, strict=True):
        loss = F.cross_entropy(model(data_norm(to_float(x))), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if norm == "normprop":
            constrain_unit_norm_(model)
        losses.append(loss.item())
    return model, losses


@pytest.mark.parametrize("norm", ["normprop", "batchnorm", "none"])
def test_step_equals_the_plain_step(norm):
    xs, ys = batches()
    ref, ref_losses = plain_steps(norm, xs, ys)
    model, data_norm, opt = setup(norm)
    step = Step(model, data_norm, opt, constrain=norm == "normprop")
    for x, y, expected in zip(xs, ys, ref_losses, strict=True):
        loss, correct = step(x, y)
        assert loss.requires_grad is False and correct.dtype == torch.long
        assert loss.item() == pytest.approx(expected, rel=1e-5)
    for a, b in zip(model.state_dict().values(), ref.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_normprop_step_keeps_filters_at_unit_norm():
    xs, ys = batches(n=2)
    model, data_norm, opt = setup()
    step = Step(model, data_norm, opt, constrain=True)
    for x, y in zip(xs, ys, strict=True):
        step(x, y)
    for layer in model.hidden_layers():
        norms = layer.weight.flatten(1).norm(dim=1)
        torch.testing.assert_close(norms, torch.ones_like(norms))


def test_a_clock_times_each_step_and_phase_and_changes_nothing(monkeypatch):
    """What `normprop bench` times: each step, and on the CPU its phases, with the same numbers bit for bit;
    the device is synchronised as a step starts and ends, and only with a clock (the trainer has none)."""
    from normprop_cli.engine import step as step_module

    xs, ys = batches(n=3)
    out = {}
    for timed in (False, True):
        syncs = []
        monkeypatch.setattr(step_module, "synchronize", syncs.append)
        model, data_norm, opt = setup()
        step = make_step(model, data_norm, opt, True, StepOptions())
        clock = StepClock(torch.device("cpu"))
        if timed:
            step.clock = clock
        losses = [step(x, y)[0] for x, y in zip(xs, ys, strict=True)]
        out[timed] = losses, model.state_dict()
        assert len(clock.steps) == len(syncs) / 2 == (3 if timed else 0)  # at a step's start and end
    assert all(torch.equal(a, b) for a, b in zip(out[False][0], out[True][0], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(out[False][1].values(), out[True][1].values(), strict=True))
    assert tuple(clock.phases) == PHASES and all(len(t) == 3 for t in clock.phases.values())
    for i, ms in enumerate(clock.steps):
        assert 0 < sum(t[i] for t in clock.phases.values()) <= ms


def run_steps(options, norm="normprop"):
    xs, ys = batches()
    model, data_norm, opt = setup(norm, options=options)
    step = Step(model, data_norm, opt, constrain=norm == "normprop", options=options)
    losses = [step(x, y)[0].item() for x, y in zip(xs, ys, strict=True)]
    return model, losses


@pytest.mark.parametrize("norm", ["normprop", "batchnorm"])
def test_channels_last_gives_the_same_training(norm):
    ref, ref_losses = run_steps(StepOptions(), norm)
    model, losses = run_steps(StepOptions(channels_last=True), norm)
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    for a, b in zip(model.state_dict().values(), ref.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_bf16_autocast_trains_close_to_float32():
    _, ref_losses = run_steps(StepOptions())
    model, losses = run_steps(StepOptions(amp=True))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert losses == pytest.approx(ref_losses, rel=5e-2, abs=5e-2)


def test_an_amp_step_takes_the_folded_normprop_path(monkeypatch):
    """Issue 13: under bf16 autocast every NormProp layer takes the folded road, as in float32."""
    from normprop_cli.nn import layers

    calls = []
    forward = layers.NormPropLayer._folded_forward
    monkeypatch.setattr(
        layers.NormPropLayer, "_folded_forward", lambda m, x, *a: calls.append(x.dtype) or forward(m, x, *a)
    )
    model, losses = run_steps(StepOptions(amp=True))
    n = len(model.hidden_layers())
    assert calls == ([torch.float32] + [torch.bfloat16] * (n - 1)) * 4  # 4 steps; the first layer casts x
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())


def test_options_from_config():
    t = OmegaConf.create({"channels_last": True, "amp": False, "compile": False, "cuda_graph": True})
    assert StepOptions.from_cfg(t, torch.device("cpu")) == StepOptions(channels_last=True)
    assert StepOptions.from_cfg(OmegaConf.create({}), torch.device("cpu")) == StepOptions()
    auto = OmegaConf.create({"channels_last": "auto", "cuda_graph": "auto"})
    assert StepOptions.from_cfg(auto, torch.device("cpu")) == StepOptions(channels_last=True)
    assert StepOptions.from_cfg(auto, torch.device("cuda")) == StepOptions(cuda_graph=True)
    assert not StepOptions.from_cfg(OmegaConf.merge(auto, {"compile": True}), torch.device("cuda")).cuda_graph
    default = OmegaConf.load(config.conf_dir() / "config.yaml").train  # the graph by default on CUDA
    assert StepOptions.from_cfg(default, torch.device("cuda")).cuda_graph
    assert not StepOptions.from_cfg(default, torch.device("cpu")).cuda_graph


def test_a_failed_cuda_graph_capture_goes_on_eagerly_with_the_same_numbers_and_one_line(monkeypatch, capsys):
    """Capture that fails (here after two warm-up steps, as a refused operation would) puts the model,
    data normalisation and optimizer back, says so in one line naming the method and the reason, and
    every step runs eagerly: bit for bit the steps of the plain Step (CPU: capture is made to fail)."""

    def refused(self, x, y, saved):
        for _ in range(2):
            self.step(x, y)
        raise RuntimeError("operation not permitted when stream is capturing\nCUDA kernel errors ...")

    monkeypatch.setattr(GraphedStep, "_capture", refused)
    xs, ys = batches(n=4)
    out = {}
    for graphed in (False, True):
        model, data_norm, opt = setup("batchnorm")
        step = make_step(model, data_norm, opt, False, StepOptions(), name="batchnorm")
        step = GraphedStep(step, name="batchnorm") if graphed else step
        losses = []
        for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
            set_lr(opt, LR if i < 2 else LR / 2)
            losses.append(step(x, y)[0])
        out[graphed] = losses, model.state_dict(), opt.state_dict()
        assert not graphed or (step.eager and step.graph is None)
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == "cuda_graph: batchnorm: capture failed (operation not permitted when stream is capturing); " \
        "its steps run eagerly"  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(out[False][0], out[True][0], strict=True))
    for a, b in zip(out[False][1].values(), out[True][1].values(), strict=True):
        assert torch.equal(a, b)
    eager, fallen = out[False][2], out[True][2]
    assert eager["param_groups"] == fallen["param_groups"] and eager["state"].keys() == fallen["state"].keys()
    for k, s in eager["state"].items():
        assert torch.equal(s["momentum_buffer"], fallen["state"][k]["momentum_buffer"])


def test_a_run_whose_capture_fails_trains_as_an_eager_run(cli, monkeypatch):
    """Through the trainer: a run with the graph on (on the CPU by force) whose capture fails gives
    the eager run's metrics and weights, and one line naming the run's method."""
    from normprop_cli.engine import trainer

    grid = "grid=[{id: r, set: {model.norm: batchrenorm}}]"
    args = ["--preset", "smoke", "--quiet", "train.epochs=2", "train.channels_last=false", grid]
    eager = cli("run", "table1", *args, "--results-dir", cli.results / "eager")
    assert eager.exit_code == 0, eager.output
    graphed = StepOptions(cuda_graph=True)
    monkeypatch.setattr(trainer.StepOptions, "from_cfg", classmethod(lambda cls, t, device: graphed))
    monkeypatch.setattr(GraphedStep, "_capture", lambda self, x, y, saved: 1 / 0)
    fallen = cli("run", "table1", *args, "--results-dir", cli.results / "graph")
    assert fallen.exit_code == 0, fallen.output
    [line] = [line for line in fallen.output.splitlines() if "capture failed" in line]
    assert line.startswith("cuda_graph: batchrenorm: capture failed (division by zero)")
    runs = [cli.results / d / "table1" / "synthetic" / "runs" / "r-s0" for d in ("eager", "graph")]
    timing = ["train_seconds", "images_per_second", "epoch_seconds"]
    a, b = (pd.read_csv(r / "metrics.csv").drop(columns=timing) for r in runs)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    wa, wb = (torch.load(r / "checkpoint.pt", weights_only=True)["model"] for r in runs)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_set_lr_fills_a_tensor_in_place_and_sets_a_float():
    model, _, opt = setup()
    set_lr(opt, 0.01)
    assert opt.param_groups[0]["lr"] == 0.01
    lr = torch.tensor(0.05)
    opt.param_groups[0]["lr"] = lr
    set_lr(opt, 0.025)
    assert opt.param_groups[0]["lr"] is lr and lr.item() == pytest.approx(0.025)


@pytest.mark.skipif(
    not os.environ.get("NORMPROP_TEST_COMPILE"),
    reason="torch.compile on the CPU needs a C++ compiler and minutes; set NORMPROP_TEST_COMPILE=1",
)
def test_compiled_step_gives_the_eager_numbers():
    ref, ref_losses = run_steps(StepOptions())
    model, losses = run_steps(StepOptions(compile=True))
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    for a, b in zip(model.state_dict().values(), ref.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


REPLAY_LR = 0.01  # assert_replays' rate: at LR (0.05) and batch 6, SGD amplifies rounding within these steps


def assert_replays(train):
    """`train(other)` -> (losses, state dict): the other way of running the steps (a CUDA graph) gives the
    plain steps' numbers, to float32 rounding: losses within 1e-4 (relative), weights and buffers within
    rtol 1e-4, atol 1e-5, as the CPU's step equivalences here. The steps run at REPLAY_LR: at 0.05 and batch 6
    they amplify rounding (on the CPU, channels_last against plain: BatchNorm's losses 9e-4 apart after 6
    steps at 0.05, 2e-7 at 0.01), and a graph may run other kernels than the eager step."""
    (pl, ps), (ol, os_) = train(False), train(True)
    assert ol == pytest.approx(pl, rel=1e-4)
    for k, v in ps.items():
        torch.testing.assert_close(os_[k], v, rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")


@pytest.fixture
def cuda_float32():
    """Full float32 on CUDA (no TF32) and cuDNN's deterministic algorithms, so that the steps compared by
    assert_replays round as float32 does, the same way each time (without them, on an H100, GroupNorm's first
    convolution weights, graph against eager, came out just beyond assert_replays' tolerance)."""
    flags = ("allow_tf32", "deterministic", "benchmark")
    saved = [getattr(torch.backends.cudnn, f) for f in flags], torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    for f, v in zip(flags, saved[0], strict=True):
        setattr(torch.backends.cudnn, f, v)
    torch.backends.cuda.matmul.allow_tf32 = saved[1]


def halving_rate(norm, device, other_options, halve_in_other=True):
    """assert_replays' `train`: 6 steps at REPLAY_LR, halved after the third (set between steps); `other`
    runs under `other_options` (GraphedStep where they ask for a CUDA graph), and halves the rate only if told."""
    xs, ys = batches(n=6)

    def train(other):
        options = other_options if other else StepOptions()
        model, data_norm, opt = setup(norm, device, options)
        step = Step(model, data_norm, opt, constrain=norm == "normprop", options=options)
        step = GraphedStep(step) if options.cuda_graph else step
        losses = []
        for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
            set_lr(opt, REPLAY_LR if i < 3 or (other and not halve_in_other) else REPLAY_LR / 2)
            losses.append(step(x.to(device), y.to(device))[0].item())
        return losses, {k: v.clone() for k, v in model.state_dict().items()}

    return train


@pytest.mark.parametrize("norm", ["normprop", "batchnorm"])
def test_the_replay_yardstick_passes_rounding_and_fails_a_missed_rate_change(norm):
    """On the CPU: channels_last (other kernels, the same steps) passes assert_replays; a rate change that
    does not reach the steps (what a graph that baked its rate in would do) fails it."""
    assert_replays(halving_rate(norm, "cpu", StepOptions(channels_last=True)))
    with pytest.raises(AssertionError):
        assert_replays(halving_rate(norm, "cpu", StepOptions(channels_last=True), halve_in_other=False))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("norm", ["normprop", "batchnorm"])
def test_cuda_graph_replays_the_eager_steps(norm, cuda_float32):
    """Capture warms up and is undone; the lr set between replays reaches the graph."""
    assert_replays(halving_rate(norm, "cuda", StepOptions(cuda_graph=True)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_is_captured_as_one_cuda_graph_with_the_eager_numbers(method, cuda_float32):
    """cuda_graph is on by default on CUDA: every method's step (its clipping included) is captured, with
    no fall-back to the eager step, and replays the eager steps (assert_replays)."""
    xs, ys = batches(n=5)
    agc = settings(method).get("train.agc")

    def train(graph):
        torch.manual_seed(0)
        model = NIN(10, width=0.1, **model_options(method)).cuda()
        data_norm = make_data_norm("batch", torch.zeros(2, 3, 32, 32, dtype=torch.uint8)).cuda()
        opt = make_optimizer(model, REPLAY_LR, MOMENTUM, DECAY, torch.device("cuda"))
        step = make_step(model, data_norm, opt, has_normprop_layers(model), StepOptions(cuda_graph=graph), agc, method)
        losses = [step(x.cuda(), y.cuda())[0].item() for x, y in zip(xs, ys, strict=True)]
        assert not graph or (step.graph is not None and not step.eager), method
        return losses, {k: v.clone() for k, v in model.state_dict().items()}

    assert_replays(train)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_replays_the_eager_bf16_steps():
    """The folded bf16 path captured in one CUDA graph gives the eager bf16 steps."""
    xs, ys = batches(n=6)
    out = {}
    for graph in (False, True):
        model, data_norm, opt = setup("normprop", "cuda")
        step = Step(model, data_norm, opt, constrain=True, options=StepOptions(amp=True, cuda_graph=graph))
        step = GraphedStep(step) if graph else step
        losses = [step(x.cuda(), y.cuda())[0].item() for x, y in zip(xs, ys, strict=True)]
        out[graph] = (losses, {k: v.clone() for k, v in model.state_dict().items()})
    assert out[True][0] == pytest.approx(out[False][0], rel=1e-2)
    for k, v in out[False][1].items():
        torch.testing.assert_close(out[True][1][k], v, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("option", ["channels_last", "amp"])
def test_trainer_runs_with_each_option(cli, option):
    grid = "grid=[{id: r, set: {model.norm: normprop}}]"
    args = ["--preset", "smoke", "--quiet", "train.epochs=1", f"train.{option}=true", grid]
    result = cli("run", "table1", *args, "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    metrics = (cli.results / "table1" / "synthetic" / "runs" / "r-s0" / "metrics.csv").read_text()
    assert "nan" not in metrics.lower()
