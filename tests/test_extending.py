"""Extending normprop as the docstrings say: a normaliser is one `register_method` call (nn.methods),
an experiment one module with `@experiment` (experiments.base) plus its YAML, a data set one
`register_dataset` call (data.base) plus its YAML; nothing else changes."""

import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

from normprop_cli import config
from normprop_cli.data import available_datasets, load_dataset
from normprop_cli.data.base import DATASETS, FULL_SIZES, PRESENT, Split, SplitSizes, make_dataset, register_dataset
from normprop_cli.data.sizes import split_sizes
from normprop_cli.experiments import EXPERIMENTS, experiment
from normprop_cli.nn.methods import METHODS, NORMS, register_method
from normprop_cli.nn.normalizers import activation_module, glorot_conv


def toy_block(i, o, k, s, p, activation="relu", **_):
    """conv, then every channel scaled to unit RMS over its own map (an instance RMS norm)."""
    return nn.Sequential(glorot_conv(i, o, k, s, p, bias=False), nn.GroupNorm(o, o), activation_module(activation))


@pytest.fixture
def toy_norm():
    register_method("toy-norm", "toy norm", block=toy_block)
    yield "toy-norm"
    METHODS.pop("toy-norm", None)
    NORMS.pop("toy-norm", None)


def test_a_normaliser_registered_in_a_test_trains_in_normalizers_and_benches(cli, toy_norm):
    grid = (f"experiment.methods=[{toy_norm},normprop-icml]", "experiment.batch_sizes=[8]", "experiment.lr=[0.02]")
    result = cli("run", "normalizers", "--preset", "smoke", "--results-dir", cli.results, "--seeds", "1", *grid)
    assert result.exit_code == 0, result.output
    (sweep,) = (cli.results / "normalizers").iterdir()
    table = pd.read_csv(sweep / "normalizers.csv").set_index("normalizer")
    assert set(table.index) == {toy_norm, "normprop-icml"}
    assert 0 <= table.loc[toy_norm, "final_acc"] <= 100
    manifest = (sweep / "runs" / f"{toy_norm}-b8-s0" / "manifest.json").read_text()
    assert f'"method": "{toy_norm}"' in manifest  # the method's name is what the run records
    tiny = ("--widths", "0.0625", "--batch-sizes", "2", "--budget", "0.01", "--epochs", "0", "--precision", "float32")
    result = cli("bench", "--methods", f"none,{toy_norm}", *tiny, "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    bench = pd.read_csv(cli.results / "bench" / "bench.csv").set_index("method")
    assert list(bench.index) == ["none", toy_norm] and bench.loc[toy_norm, "step_ms_median"] > 0


def conf_with(tmp_path, monkeypatch, name: str, text: str) -> Path:
    """conf/ copied under tmp_path with one more YAML file, `name` (e.g. "dataset/x.yaml"), and the package
    composing from the copy: a contributor's new config, tried without touching the repository's."""
    conf = tmp_path / "conf"
    shutil.copytree(config.conf_dir(), conf)
    (conf / name).write_text(text)
    monkeypatch.setattr(config, "conf_dir", lambda: conf)
    return conf


@pytest.fixture
def toy_experiment(tmp_path, monkeypatch):
    """conf/ copied with one more YAML, `toy`, and a module's worth of parts registered here."""
    conf_with(
        tmp_path,
        monkeypatch,
        "experiment/toy.yaml",
        "# @package _global_\n# A toy experiment: the registry's recipe, tried.\nexperiment:\n  name: toy\n"
        "  paper: beyond the paper\n  answer: 42\n",
    )

    def out_dir(cfg):
        return Path(cfg.results_dir) / "toy"

    def plot(cfg):
        return []

    def headlines(cfg):
        value = pd.read_csv(out_dir(cfg) / "toy.csv")["answer"].iloc[0]
        return [{"quantity": "the answer", "reproduced": float(value), "paper": ""}]

    def paragraphs(cfg):
        return ["The toy experiment found its answer."]

    @experiment("toy", plot=plot, headlines=headlines, paragraphs=paragraphs, trains=False)
    def run(cfg):
        out_dir(cfg).mkdir(parents=True, exist_ok=True)
        path = out_dir(cfg) / "toy.csv"
        pd.DataFrame({"answer": [cfg.experiment.answer]}).to_csv(path, index=False)
        return path

    yield "toy"
    EXPERIMENTS.pop("toy", None)


def test_an_experiment_registered_in_a_test_runs_and_reaches_the_report(cli, toy_experiment):
    result = cli("run", toy_experiment, "--results-dir", cli.results, "experiment.answer=7")
    assert result.exit_code == 0, result.output
    assert pd.read_csv(cli.results / "toy" / "toy.csv")["answer"].tolist() == [7]
    assert cli("plot", toy_experiment, "--results-dir", cli.results).exit_code == 0
    result = cli("report", "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    text = (cli.results / "REPORT.md").read_text()
    assert "| the answer | 7 |" in text and "The toy experiment found its answer." in text
    assert list(EXPERIMENTS)[-1] == toy_experiment  # after the paper's and the package's own


def test_the_readmes_normaliser_recipe_builds_a_nin():
    import re

    import torch

    from normprop_cli.nn import NIN

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Adding a normaliser or an experiment", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    try:
        exec(compile(code, "README.md", "exec"), {})
        assert METHODS["instancenorm"].label == "InstanceNorm"
        assert NIN(10, 3, "instancenorm", 0.125)(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    finally:
        METHODS.pop("instancenorm", None)
        NORMS.pop("instancenorm", None)


@pytest.fixture
def toy_data(tmp_path, monkeypatch):
    """A data set made in memory, declared with its sizes, and its YAML in a copy of conf/."""

    def load_toy(data_dir=None, download=False, split_seed=0, sizes=(40, 10, 10)):
        g = torch.Generator().manual_seed(split_seed)

        def split(n):
            return Split(torch.randint(0, 256, (n, 1, 32, 32), dtype=torch.uint8, generator=g), torch.arange(n) % 2)

        return make_dataset("toy-data", *(split(n) for n in sizes), 2, split_seed)

    register_dataset("toy-data", load_toy, sizes=lambda: SplitSizes(40, 10, 10, (1, 32, 32)))
    conf_with(
        tmp_path,
        monkeypatch,
        "dataset/toy-data.yaml",
        "# A toy data set: the registry's recipe, tried.\nname: toy-data\nsplit_seed: 0\nlimit: null\n"
        "train_limit: null\nnum_classes: 2\naugment: flip\n",
    )
    yield "toy-data"
    for registry in (DATASETS, FULL_SIZES, PRESENT):
        registry.pop("toy-data", None)


def test_a_data_set_registered_in_a_test_loads_as_its_sizes_say_and_the_plan_reads_them(toy_data):
    from normprop_cli.engine import cost

    for limit, train_limit in ((None, None), (8, None), (None, 12)):
        ds = load_dataset(toy_data, limit=limit, train_limit=train_limit)
        loaded = (len(ds.train), len(ds.val), len(ds.test), tuple(ds.train.x.shape[1:]))
        assert split_sizes(toy_data, limit, train_limit) == loaded
    assert available_datasets()[toy_data]  # made in memory: nothing to fetch
    cfg = config.load("table1", preset="smoke", dataset=toy_data)  # its YAML composes with any experiment
    assert cost.sizes(cfg) == split_sizes(toy_data, cfg.dataset.limit, cfg.dataset.train_limit)
