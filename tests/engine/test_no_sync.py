"""No host synchronisation inside a training step, for every registered method: a GPU never waits for
the host within an epoch, and every step can be captured as one CUDA graph (a sync cannot be).

On the CPU nothing waits, so what would sync on a GPU is made to raise instead: reading a tensor back
(`item`, `tolist`, `cpu`, `numpy`, `bool`, `float`, `int`, `index`) and making one from Python numbers
(`torch.tensor(0.1, device=...)`, a host-to-device copy). The steps are the trainer's own
(`trainer.make_run`: the model, data normalisation, SGD and step options of a run of the method)."""

import contextlib

import pytest
import torch
from omegaconf import OmegaConf

from normprop_cli import config
from normprop_cli.engine.job import load_data
from normprop_cli.engine.trainer import make_run, train_epoch
from normprop_cli.nn.methods import METHODS, settings

CPU = torch.device("cpu")
READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")  # torch.Tensor's
MAKERS = ("tensor", "as_tensor")  # torch's, given Python numbers


class HostSync(AssertionError):
    """A tensor read back, or made from Python numbers, where no sync may be."""


def _python_numbers(data) -> bool:
    if isinstance(data, (bool, int, float, complex)):
        return True
    return isinstance(data, (list, tuple)) and all(_python_numbers(d) for d in data)


@contextlib.contextmanager
def host_syncs(record: list | None = None):
    """Inside, each of READS and MAKERS (on Python numbers) raises HostSync, or with `record` is
    appended to it by name and goes on."""
    patch = pytest.MonkeyPatch()

    def seen(name: str) -> None:
        if record is None:
            raise HostSync(f"{name} in a training step: a host sync on a GPU, and no CUDA graph can hold it")
        record.append(name)

    for name in READS:
        real = getattr(torch.Tensor, name)

        def read(t, *args, _name=name, _real=real, **kwargs):
            seen(f"Tensor.{_name}")
            return _real(t, *args, **kwargs)

        patch.setattr(torch.Tensor, name, read)
    for name in MAKERS:
        real = getattr(torch, name)

        def make(data, *args, _name=name, _real=real, **kwargs):
            if _python_numbers(data):
                seen(f"torch.{_name}")
            return _real(data, *args, **kwargs)

        patch.setattr(torch, name, make)
    try:
        yield
    finally:
        patch.undo()


@pytest.fixture(scope="module")
def smoke():
    cfg = config.load("table1", preset="smoke")
    return cfg, load_data(cfg, CPU)


def run_of(cfg, data, method: str, **keys):
    """A fresh run of `method` as the trainer builds it, with `keys` (dotted) set too."""
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    for key, value in (settings(method) | {"method": method} | keys).items():
        OmegaConf.update(cfg, key, value, merge=False)
    torch.manual_seed(0)
    run = make_run(cfg, data, CPU)
    run.model.train()
    run.data_norm.train()
    return run, cfg


def batch(data, n=16):
    return data.train.x[:n], data.train.y[:n]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_no_training_step_of_any_method_syncs_with_the_host(smoke, method):
    """Forward, backward, (clipping,) SGD and NormProp's constraint: two steps (the first makes SGD's
    momentum buffers and the layers' cached constants), none of which reads anything back."""
    cfg, data = smoke
    run, _ = run_of(cfg, data, method)
    x, y = batch(data)
    before = [p.detach().clone() for p in run.model.parameters()]
    with host_syncs():
        for _ in range(2):
            loss, right = run.step(x, y)
    assert torch.isfinite(loss) and right.dtype == torch.long and 0 <= right <= len(y)
    assert any(not torch.equal(a, p) for a, p in zip(before, run.model.parameters(), strict=True))  # it trained


@pytest.mark.parametrize("augment", ["flip", "translate"])
def test_a_training_epoch_syncs_once_at_its_end(smoke, augment):
    """train_epoch reads its loss and accuracy back once, after its last step; an augmented batch
    (the translations' padding included) reads nothing."""
    cfg, data = smoke
    keys = {"train.augment": True, "dataset.augment": augment, "dataset.translate_pixels": 2, "train.max_steps": 3}
    run, cfg = run_of(cfg, data, "normprop-icml", **keys)
    syncs = []

    class Progress:
        def step(self, n):
            pass

    with host_syncs(syncs):
        row = train_epoch(run, data, cfg, CPU, Progress())
    assert syncs == ["Tensor.tolist"] and row["train_loss"] > 0


@pytest.mark.parametrize(
    "sync",
    [
        lambda t: t.item(),
        lambda t: t.tolist(),
        lambda t: t.cpu(),
        lambda t: t.numpy(),
        bool,
        float,
        int,
        lambda t: [0, 1][t.long()],
        lambda t: torch.tensor(0.1, device=t.device),
        lambda t: torch.tensor([0.1, 0.2], dtype=t.dtype, device=t.device),
        lambda t: torch.as_tensor(3, device=t.device),
    ],
    ids=["item", "tolist", "cpu", "numpy", "bool", "float", "int", "index", "tensor", "tensor-list", "as_tensor"],
)
def test_a_deliberate_sync_inside_a_step_is_caught(smoke, sync):
    """The patch sees what it must: each kind of sync, put in a step (as its gradient clipping), raises."""
    cfg, data = smoke
    run, _ = run_of(cfg, data, "batchrenorm")
    weight = next(run.model.parameters())
    run.step.clip = lambda: sync(weight.grad.abs().sum() > 0)
    x, y = batch(data)
    with host_syncs(), pytest.raises(HostSync):
        run.step(x, y)
    run.step(x, y)  # outside the patch, the same step runs
