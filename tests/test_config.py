"""Composition (normprop_cli.config): a kept composition is what Hydra composes now; the schema
(normprop_cli.schema) refuses through OmegaConf and changes no value of the YAML files."""

from __future__ import annotations

import shutil

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from normprop_cli import config, schema


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


@pytest.mark.parametrize(
    "overrides",
    [
        ["experiment=table1", "preset=smoke", "train.epochs=3", "grid=[{id: r, set: {model.norm: normprop}}]"],
        ["experiment=normalizers", "preset=quick", "dataset=digits", "seeds=3", "+experiment.answer=42"],
        ["experiment=normalizers", "experiment.lr_scale={none: 0.5}", "++train.lr=0.5", "~experiment.paper"],
        ["experiment=table1", "preset=fashion", "device=cpu", "train.lr=1e9", "preset=smoke"],
        ["experiment=drift", "train.epoch=3"],  # refusals: an unknown key, a wrong type, a mapping's unknown key
        ["experiment=drift", "train.epochs=x"],
        ["experiment=normalizers", "experiment.lr_scale={nonee: 0.5}"],
        ["experiment=table1", "train.lr=1,2"],  # a sweep and Hydra's own keys go through Hydra whole
        ["experiment=table1", "hydra.job.name=x"],
    ],
)
def test_a_composition_from_kept_group_choices_is_hydras_whole_composition(overrides):
    """config keeps the merge of the groups' files and applies the keys' overrides to a copy: the config, or
    the error and its causes, are those of Hydra composing everything at once."""

    def outcome(compose):
        try:
            return OmegaConf.to_yaml(compose())
        except Exception as exc:  # the chain of causes, which config.refusal reads
            chain = []
            while exc is not None:
                chain, exc = [*chain, f"{type(exc).__name__}: {exc}"], exc.__cause__
            return chain

    whole = outcome(lambda: schema.checked(config._hydra(config.conf_dir(), overrides)))
    config._COMPOSED.clear()
    assert outcome(lambda: config._compose(overrides)) == whole
    assert outcome(lambda: config._compose(overrides)) == whole  # and kept


def _fitted(tree: dict) -> str:
    """`tree` as the schema has it, in a form that tells 1 from 1.0 and true from 1."""
    return repr(OmegaConf.to_container(schema.checked(OmegaConf.create(tree))))


GROUP_FILES = [p for p in sorted(config.conf_dir().rglob("*.yaml")) if p.parent != config.conf_dir()]


@pytest.mark.parametrize("path", [config.conf_dir() / "config.yaml", *GROUP_FILES], ids=lambda p: p.stem)
def test_every_config_file_fits_the_schema_which_changes_none_of_its_values(path):
    """Each key a YAML file gives is in normprop_cli/schema.py, its value of the type there as written: a
    composition has the YAML's values (every committed run's config stays the same), and the schema only
    refuses."""
    tree = OmegaConf.to_container(OmegaConf.load(path))
    tree.pop("defaults", None)
    if "@package _global_" not in path.read_text() and path.name != "config.yaml":
        tree = {path.parent.name: tree}  # a group file without a package header is the group's node
    assert _fitted(tree) == repr(tree)


@pytest.mark.parametrize(
    "change,error",
    [
        ({"train": {"epoch": 3}}, ConfigKeyError),  # a key the group lacks
        ({"model": {"renorm": {"rmaxx": 3.0}}}, ConfigKeyError),
        ({"experiment": {"lr_sweep": {"stepp": 2.0}}}, ConfigKeyError),
        ({"epochs": 3}, ConfigKeyError),
        ({"train": {"lr": "fast"}}, ValidationError),  # a value its type refuses
        ({"train": {"epochs": 2.5}}, ValidationError),
        ({"model": {"center": "maybe"}}, ValidationError),
        ({"dataset": {"limit": "all"}}, ValidationError),
        ({"experiment": {"band": [0.1]}}, ValidationError),
    ],
)
def test_omegaconf_refuses_an_unknown_key_and_a_wrong_type(change, error):
    """The schema's check is OmegaConf's own: config words its error (tests/cli), it decides."""
    cfg = config.load("covariate-shift", preset="smoke")
    with pytest.raises(error):
        schema.checked(OmegaConf.merge(cfg, change))  # the plain config takes anything
    # an experiment's own keys need no field: a new experiment's YAML carries them (docs/extending.md)
    assert schema.checked(OmegaConf.merge(cfg, {"experiment": {"answer": 42}})).experiment.answer == 42


def test_a_value_is_what_its_type_makes_it():
    """An override is converted as its key's type says: a boolean from yes, a number from a whole one."""
    cfg = config.load("table1", preset="smoke", overrides=["train.augment=yes", "train.lr=1", "model.center=off"])
    assert (cfg.train.augment, cfg.train.lr, cfg.model.center) == (True, 1.0, False)
    assert type(cfg.train.lr) is float


def test_figures_take_the_formats_matplotlib_writes_and_every_preset_but_smoke_saves_png_and_pdf(cli):
    for preset in config.options("preset"):
        expected = ["png"] if preset == "smoke" else ["png", "pdf"]
        assert list(config.load("table1", preset=preset).figures) == expected, preset
    assert list(config.load("table1", overrides=["figures=[svg]"]).figures) == ["svg"]
    result = cli("run", "table1", "--preset", "smoke", "figures=[gif]")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "figures" in result.output and "png" in result.output
