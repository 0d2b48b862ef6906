"""train.probe_images: the observers (probes) see the first N test images, the evaluation all of them."""

from types import SimpleNamespace

import torch
from omegaconf import OmegaConf

from normprop_cli.engine.trainer import eval_batches, probe_batches


class Split(SimpleNamespace):
    def __init__(self, x, y):
        super().__init__(x=x, y=y)

    def __len__(self):
        return len(self.y)


def fake(n: int, probe_images):
    x = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1)
    data = SimpleNamespace(test=Split(x, torch.arange(n)))
    run = SimpleNamespace(model=torch.nn.Identity(), data_norm=torch.nn.Identity())
    cfg = OmegaConf.create({"train": {"eval_batch_size": 4, "probe_images": probe_images}})
    return run, data, cfg


def labels(batches) -> list[int]:
    return [int(v) for _, y in batches() for v in y]


def test_the_probes_see_the_first_probe_images_test_images_and_the_evaluation_all():
    run, data, cfg = fake(10, 6)
    assert labels(probe_batches(run, data, cfg)) == list(range(6))  # batches of 4 and 2: none past the limit
    assert labels(eval_batches(run, data, cfg)) == list(range(10))
    run, data, cfg = fake(10, None)
    assert labels(probe_batches(run, data, cfg)) == list(range(10))
    run, data, cfg = fake(10, 50)  # more than the split: all of it
    assert labels(probe_batches(run, data, cfg)) == list(range(10))


def test_the_figures_and_the_report_name_the_images_the_probes_saw():
    from normprop_cli.experiments.tables import probe_set

    assert probe_set(OmegaConf.create({"train": {"probe_images": 2000}})) == "the first 2,000 test images"
    assert probe_set(OmegaConf.create({"train": {"probe_images": None}})) == "the test set"
