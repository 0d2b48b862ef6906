"""The gpu preset: Table 1's comparison with the fashion preset's protocol at width 1.0 and the timing
experiment, on Fashion-MNIST; planned within 5 minutes at the committed GPU step times; its experiments at
smoke size, through the report's column for it."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from normprop_cli import config
from normprop_cli.bench.step_times import StepTimes
from normprop_cli.data import fashion
from normprop_cli.experiments import plan

ROOT = Path(__file__).resolve().parents[2]
GPU_S = 300  # the plan's limit at the committed GPU step times
# NormProp and BatchNorm alone (no flips, no plain net): the comparison C5 and C6 read, in fewer runs
TWO = "grid=[{id: normprop, set: {model.norm: normprop}}, {id: batchnorm, set: {model.norm: batchnorm}}]"


def test_the_gpu_preset_is_the_fashion_protocol_at_the_papers_width():
    assert list(config.root("gpu").preset.experiments) == ["table1", "timing"]
    gpu, cpu = config.load("table1", preset="gpu"), config.load("table1", preset="fashion")
    assert gpu.dataset.name == cpu.dataset.name == "fashion-mnist" and float(gpu.model.width) == 1.0
    for key in ("seeds", "train.epochs", "train.lr_halve_every", "train.batch_size", "train.lr", "dataset.train_limit"):
        assert OmegaConf.select(gpu, key) == OmegaConf.select(cpu, key), key
    timing = config.load("timing", preset="gpu")
    assert (
        float(timing.model.width) == 1.0 and int(timing.train.batch_size) == 50 and timing.results_dir == "results/gpu"
    )


def test_its_plan_at_the_committed_gpu_step_times_fits_in_five_minutes(tmp_path):
    times = StepTimes(ROOT / "results" / "bench" / "gpu" / "step_times.csv")
    frame = plan.project("gpu", times, tmp_path)
    assert frame["experiment"].tolist() == ["table1", "timing", "total"]
    assert 60 < float(frame.iloc[-1]["est_seconds"]) <= GPU_S


@pytest.fixture
def tiny_fashion(tmp_path, monkeypatch):
    """Four IDX files of a tiny Fashion-MNIST in a data directory (no Debian package looked at)."""
    monkeypatch.setattr(fashion, "SYSTEM_DIR", tmp_path / "no-package")
    raw, rng = tmp_path / "data" / "FashionMNIST" / "raw", np.random.default_rng(0)
    raw.mkdir(parents=True)
    for part, n in (("train", 240), ("test", 40)):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = (labels[:, None, None] * 20 + rng.integers(0, 40, (n, 28, 28))).astype(np.uint8)
        stem = "t10k" if part == "test" else "train"
        fashion.write_idx(raw / f"{stem}-images-idx3-ubyte.gz", images)
        fashion.write_idx(raw / f"{stem}-labels-idx1-ubyte.gz", labels)
    return tmp_path / "data"


def test_its_experiments_at_smoke_size_give_c5_and_c6_a_gpu_column(cli, tiny_fashion, tmp_path):
    results = tmp_path / "results"
    tiny = ["--quiet", "--seeds", "1", "--data-dir", tiny_fashion, "model.width=0.0625", "dataset.train_limit=48",
            "train.batch_size=16", "train.eval_batch_size=64", "train.epochs=2", TWO]  # fmt: skip
    for experiment in ("table1", "timing"):  # timing: a warm-up epoch and a timed one
        done = cli("run", experiment, "--preset", "gpu", "--results-dir", results / "gpu", *tiny)
        assert done.exit_code == 0, done.output
    assert cli("report", "--results-dir", results).exit_code == 0
    verdicts = pd.read_csv(results / "gpu" / "verdicts.csv").set_index("claim")
    assert set(verdicts.loc[["C5", "C6"], "preset"]) == {"gpu"}
    assert set(verdicts.loc[["C5", "C6"], "dataset"]) == {"fashion-mnist"}
    header = next(line for line in (results / "REPORT.md").read_text().splitlines() if line.startswith("| claim"))
    assert "gpu (fashion-mnist)" in header
