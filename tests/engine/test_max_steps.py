"""train.max_steps: at most that many SGD updates an epoch (batch 1 with as many updates as batch 50:
C4 at equal updates), and a grid entry that borrows another setting's swept rate (rate_of)."""

import pandas as pd
from omegaconf import OmegaConf

from normprop_cli.engine.trainer import epoch_steps
from normprop_cli.experiments.lr_sweep import sweep_grid, with_rates


def test_epoch_steps_caps_the_updates_of_an_epoch():
    train = OmegaConf.create({"batch_size": 1, "max_steps": None})
    assert epoch_steps(train, 10_000) == 10_000
    train.max_steps = 200
    assert epoch_steps(train, 10_000) == 200 == epoch_steps(OmegaConf.create({"batch_size": 50}), 10_000)
    train.batch_size = 50
    assert epoch_steps(train, 5_000) == 100  # the cap only ever lowers the count


def test_a_rate_of_entry_is_not_swept_and_takes_its_owners_rate():
    cfg = OmegaConf.create({
        "experiment": {"lr_sweep": {"factors": [0.5, 1.0, 2.0], "epochs": 1}},
        "grid": [
            {"id": "b1", "set": {"train.batch_size": 1, "train.lr": 0.002}},
            {"id": "b1-updates", "rate_of": "b1", "set": {"train.batch_size": 1, "train.lr": 0.002,
                                                          "train.max_steps": 200}},
        ],
    })  # fmt: skip
    sweep, owner = sweep_grid(cfg)
    assert set(owner.values()) == {"b1"} and len(sweep.grid) == 3
    chosen = pd.DataFrame({"setting": ["b1", "b1"], "lr": [0.001, 0.004], "chosen": [False, True]})
    rates = {e.id: e.set["train.lr"] for e in with_rates(cfg, chosen).grid}
    assert rates == {"b1": 0.004, "b1-updates": 0.004}
