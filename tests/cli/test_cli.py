"""The command line and its behaviour on bad input."""

import pytest

from normprop_cli import config
from normprop_cli.experiments import EXPERIMENTS


def test_list_names_every_experiment_dataset_and_preset(cli):
    result = cli("list")
    assert result.exit_code == 0
    for group in ("experiment", "dataset", "preset"):
        for name in config.options(group):
            assert name in result.output


def test_info_reports_versions_device_and_datasets(cli, tmp_path):
    result = cli("info", "--data-dir", tmp_path)
    assert result.exit_code == 0
    for word in ("torch", "device", "digits", "cifar10", "svhn"):
        assert word in result.output


def test_every_experiment_yaml_has_a_runner():
    assert set(config.options("experiment")) == set(EXPERIMENTS)


def compositions() -> list[tuple[str, str | None, str | None]]:
    """Every pair of group choices (experiment and preset, experiment and data set, preset and data set), and
    every triple for an experiment with a file of its own for a data set (conf/experiment_dataset/): each file
    under conf/ composed with each it can meet, in fewer than half the whole product's compositions."""
    experiments, presets, datasets = (config.options(g) for g in ("experiment", "preset", "dataset"))
    own = {name.split("_")[0] for name in config.options("experiment_dataset")}
    every = [(e, p, None) for e in experiments for p in presets] + [(e, None, d) for e in experiments for d in datasets]
    every += [(e, p, d) for e in sorted(own) for p in presets for d in datasets]
    return list(dict.fromkeys(every))


@pytest.mark.parametrize("experiment,preset,dataset", compositions())
def test_every_yaml_composes(experiment, preset, dataset):
    cfg = config.load(experiment, preset=preset, dataset=dataset)
    assert cfg.experiment.name == experiment
    assert dataset is None or cfg.dataset.name == dataset
    assert preset is None or cfg.preset.name == preset


@pytest.mark.parametrize("preset", config.options("preset"))
def test_every_preset_trains_in_float32(preset):
    """bfloat16 (`train.amp`) is opt-in: every run of every experiment of every preset is float32."""
    from normprop_cli.engine.runs import expand_grid

    for experiment in config.options("experiment"):
        cfg = config.load(experiment, preset=preset)
        assert cfg.train.amp is False
        assert all(spec.cfg.train.amp is False for spec in expand_grid(cfg)), experiment


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "no-such-experiment"], "unknown experiment"),
        (["run", "table1", "--preset", "fast"], "unknown preset"),
        (["run", "table1", "--dataset", "mnist"], "unknown dataset"),
        (["run", "table1", "train.epochs=[1"], "bad override"),
        (["run", "table1", "no.such.key=1"], "unknown key 'no.such.key'; `normprop config table1` shows every key"),
        (["run", "table1", "epochs=3"], "unknown key 'epochs'; did you mean `train.epochs=3`?"),
        (["run", "table1", "lr=0.1"], "unknown key 'lr'; did you mean `train.lr=0.1`?"),
        (["run", "table1", "train.epoch=3"], "unknown key 'train.epoch'; did you mean `train.epochs=3`?"),
        (["status", "table1", "dataset=mnist"], "unknown dataset 'mnist'; known: "),
        (["run", "table1", "--preset", "smoke", "train.batch_size=0"], "batch_size"),
        (["run", "table1", "--preset", "smoke", "train.lr=-0.1"], "train.lr"),
        (["run", "table1", "--preset", "smoke", "--seeds", "0"], "--seeds"),
        (["run", "table1", "--preset", "smoke", "--device", "tpu"], "device"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(cli, args, needle):
    result = cli(*args, "--results-dir", cli.results)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0]
    assert not cli.results.exists()


def test_missing_data_dir_names_files_directory_and_download(cli, tmp_path):
    missing = tmp_path / "nowhere"
    result = cli(
        "run",
        "table1",
        "--preset",
        "smoke",
        "--dataset",
        "cifar10",
        "--data-dir",
        missing,
        "--results-dir",
        cli.results,
    )
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and "--download" in line and "nowhere" in line and "data_batch_1" in line
    assert not cli.results.exists()


def test_cuda_without_a_gpu_is_a_one_line_error(cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = cli("run", "table1", "--preset", "smoke", "--device", "cuda", "--results-dir", cli.results)
    assert result.exit_code == 2 and "no CUDA GPU" in result.output


@pytest.mark.parametrize("command", [["run", "table1"], ["reproduce-all"]])
def test_deterministic_reaches_the_config_and_the_device_setup(cli, monkeypatch, command):
    """`--deterministic` sets the config's `deterministic` (false by default), which the sweep hands to
    the one place device settings are made (device.prepare: stubbed here, tests/test_device.py checks it).
    reproduce-all is stopped after its first experiment's config."""
    from normprop_cli import cli as commands
    from normprop_cli import device
    from normprop_cli.errors import UserError

    assert config.load("table1", preset="smoke").deterministic is False
    composed, prepared, compose = [], [], commands.compose

    def recorded(*args, **kwargs):
        composed.append(compose(*args, **kwargs))
        if command[0] == "reproduce-all":
            raise UserError("stopped after the first config")
        return composed[-1]

    monkeypatch.setattr(commands, "compose", recorded)
    monkeypatch.setattr(device, "prepare", lambda dev, deterministic=False: prepared.append(deterministic))
    result = cli(*command, "--preset", "smoke", "--quiet", "--deterministic", "--results-dir", cli.results)
    assert [cfg.deterministic for cfg in composed] == [True], result.output
    assert prepared == ([True] if command[0] == "run" else []), result.output
