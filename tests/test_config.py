"""Composition (normprop_cli.config): a kept composition is what Hydra composes now."""

from __future__ import annotations

import shutil

from omegaconf import OmegaConf

from normprop_cli import config


def test_a_kept_composition_is_a_copy_and_follows_the_config_files(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    shutil.copytree(config.conf_dir(), conf)
    monkeypatch.setattr(config, "conf_dir", lambda: conf)
    first = config.load("table1", preset="quick")
    epochs = int(first.train.epochs)
    first.train.epochs = epochs + 100  # a caller's change stays its own
    assert int(config.load("table1", preset="quick").train.epochs) == epochs
    # the preset's file rewritten (same size, same second): the next composition reads it
    preset = conf / "preset" / "quick.yaml"
    text = preset.read_text()
    assert f"  epochs: {epochs}\n" in text and epochs < 9
    preset.write_text(text.replace(f"  epochs: {epochs}\n", f"  epochs: {epochs + 1}\n"))
    assert int(config.load("table1", preset="quick").train.epochs) == epochs + 1
    # and the same composition as Hydra's own, without any kept one
    config._COMPOSED.clear()
    assert OmegaConf.to_container(config.load("table1", preset="quick")) == OmegaConf.to_container(
        config.load("table1", preset="quick")
    )
    assert int(config.load("table1", preset="quick").train.epochs) == epochs + 1
