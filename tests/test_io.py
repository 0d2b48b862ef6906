"""Result files get the mode a plain open() gives (0o666 less the umask), not mkstemp's private 0600."""

import os
import stat

import pandas as pd
import pytest

from normprop_cli import io


@pytest.fixture
def umask():
    """`umask(mask)`: set the process's umask for the test; the old one is put back after it."""
    before = os.umask(0o022)
    os.umask(before)
    yield os.umask
    os.umask(before)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask,expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_every_writer_gives_the_mode_a_plain_open_gives(tmp_path, umask, mask, expected):
    umask(mask)
    assert io.umask() == mask
    with open(tmp_path / "plain.txt", "w"):
        pass
    assert mode(tmp_path / "plain.txt") == expected
    written = [
        io.write_text(tmp_path / "a.txt", "a\n"),
        io.write_json(tmp_path / "a.json", {"a": 1}),
        io.write_csv(tmp_path / "a.csv", pd.DataFrame({"a": [1]})),
        io.save_torch(tmp_path / "checkpoint.pt", {"a": 1}),
        io.save_torch(tmp_path / "checkpoint.pt", {"a": 2}, keep=tmp_path / "checkpoint.prev.pt"),
    ]
    assert {path.name: mode(path) for path in [*written, tmp_path / "checkpoint.prev.pt"]} == dict.fromkeys(
        ["a.txt", "a.json", "a.csv", "checkpoint.pt", "checkpoint.prev.pt"], expected
    )
    assert os.umask(mask) == mask  # reading it left it as it was


def test_the_umask_is_read_where_proc_does_not_show_it(umask, monkeypatch, tmp_path):
    umask(0o027)
    monkeypatch.setattr(io, "Path", lambda _: tmp_path / "no-proc-status")
    assert io.umask() == 0o027 and os.umask(0o027) == 0o027


def test_read_yaml_gives_a_run_config_s_keys_as_omegaconf_does(tmp_path):
    """The report reads a few keys of every run's config.yaml as plain YAML; they equal OmegaConf's."""
    from omegaconf import OmegaConf

    from normprop_cli import config

    cfg = config.load("normalizers", preset="quick")
    path = io.write_text(tmp_path / "config.yaml", OmegaConf.to_yaml(cfg))
    plain, loaded = io.read_yaml(path), OmegaConf.load(path)
    for key in ("train.augment", "train.epochs", "train.lr_halve_every", "train.decay", "seeds", "dataset.train_limit"):
        value = plain
        for part in key.split("."):
            value = value[part]
        assert value == OmegaConf.select(loaded, key), key
    assert float(plain["train"]["weight_decay"]) == float(loaded.train.weight_decay)


def test_read_yaml_follows_a_rewritten_file_and_hands_out_copies(tmp_path):
    path = io.write_text(tmp_path / "config.yaml", "train:\n  epochs: 1\n")
    first = io.read_yaml(path)
    first["train"]["epochs"] = 99  # a caller's change stays its own
    assert io.read_yaml(path) == {"train": {"epochs": 1}}
    path.write_text("train:\n  epochs: 2\n")  # the same size, in place, within the same clock tick
    assert io.read_yaml(path) == {"train": {"epochs": 2}}
    path.write_text("")
    assert io.read_yaml(path) == {}


@pytest.mark.parametrize("formats", [("png",), ("png", "pdf", "svg")])
def test_a_figure_is_saved_in_each_format_asked_and_redrawn_to_the_same_bytes(tmp_path, formats):
    """The config's `figures` (smoke: PNG alone). A PDF or SVG carries no date, so an unchanged figure is
    rewritten byte for byte."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    paths = io.save_figure(fig, tmp_path / "a", formats)
    assert [p.name for p in paths] == [f"a.{f}" for f in formats] and sorted(tmp_path.iterdir()) == sorted(paths)
    before = {p: p.read_bytes() for p in paths}
    assert {p: p.read_bytes() for p in io.save_figure(fig, tmp_path / "a", formats)} == before
    plt.close(fig)
