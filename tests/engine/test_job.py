"""engine.job.validate: a run's impossible settings are refused before anything trains or is written."""

import pytest
import yaml
from omegaconf import OmegaConf

from normprop_cli import config
from normprop_cli.engine import expand_grid, job
from normprop_cli.errors import UserError


def spec_of(*overrides, setting="normprop"):
    """A run of convergence's smoke grid (normprop, batchnorm). A `+key=value` is added after composing:
    config refuses keys it lacks, so only a config built in Python brings one to job.validate."""
    cfg = config.load("convergence", preset="smoke", overrides=[o for o in overrides if not o.startswith("+")])
    for key, value in (o[1:].split("=", 1) for o in overrides if o.startswith("+")):
        OmegaConf.update(cfg, key, yaml.safe_load(value), force_add=True)
    return next(s for s in expand_grid(cfg) if s.setting == setting)


def test_batch_statistics_with_one_value_per_channel_are_refused_before_training(monkeypatch):
    """Decided from the architecture (nin.values_per_channel), not from BatchNorm's error at run time;
    the NIN's smallest hidden output is 4x4, so a 32x32 batch of 1 still has 16 values: allowed."""
    at_one = ("train.batch_size=1", "train.data_norm=global")
    job.validate(spec_of(*at_one, setting="batchnorm"))
    monkeypatch.setattr(job, "values_per_channel", lambda norm, batch_size: 1 if norm == "batchnorm" else None)
    with pytest.raises(UserError, match="model.norm=batchnorm at train.batch_size=1 normalises 1 value per channel"):
        job.validate(spec_of(*at_one, setting="batchnorm"))
    job.validate(spec_of(*at_one, setting="normprop"))


@pytest.mark.parametrize(
    "override,needle",
    [
        ("+model.depth=9", "model.depth is not a NIN option"),
        ("model.jacobian=half", "model.jacobian=half is not known"),
        ("model.activation=swish", "model.activation=swish is not known"),
        ("train.data_norm=layer", "train.data_norm=layer is not known; use one of global, batch"),
        ("model.width=0", "model.width must be positive"),
    ],
)
def test_the_registries_decide_what_is_known(override, needle):
    with pytest.raises(UserError, match=needle):
        job.validate(spec_of(override))
