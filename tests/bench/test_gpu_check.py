"""`normprop gpu-check`: on a machine without CUDA one line, exit 2, nothing run or written; its
pipeline (tests, steps, epochs, summary) on the CPU, with the GPU check stood in for."""

import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch

from normprop_cli import bench, config
from normprop_cli.bench import gpu_check
from normprop_cli.bench import timing as bench_timing

no_gpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: run make gpu-check")
ROOT = Path(__file__).resolve().parents[2]


@no_gpu_only
def test_gpu_check_without_a_gpu_is_one_line_exit_2_and_writes_nothing(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda *a, **k: pytest.fail("ran the CUDA tests"))
    result = cli("gpu-check")
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "CUDA" in result.output
    result = cli("gpu-check", "--results-dir", cli.results)
    assert result.exit_code == 2
    assert list(tmp_path.iterdir()) == []  # neither results/ nor results/bench/gpu/


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_gpu_check_runs_the_command():
    dry = subprocess.run(
        ["make", "--no-print-directory", "-n", "-o", ".venv/.installed", "gpu-check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert dry.returncode == 0 and dry.stdout.strip() == ".venv/bin/normprop gpu-check"


@no_gpu_only
def test_the_pipeline_on_the_cpu_writes_every_file(tmp_path, monkeypatch):
    """Stand-ins: the CPU for the GPU, a tiny NIN and data set, pytest's answer. The CUDA graph
    options cannot run on a CPU: those rows are left out and named, and the exit status is 1."""
    load = config.load
    monkeypatch.setattr(config, "load", lambda *a, **k: load(*a, **k, overrides=["model.width=0.0625"]))
    monkeypatch.setattr(gpu_check, "cuda_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(gpu_check, "CIFAR_SIZES", (100, 20, 20))
    monkeypatch.setattr(bench, "choose_precisions", lambda dev, p=None: (("float32",), ""))
    done = subprocess.CompletedProcess([], 0, stdout="....\n9 passed in 3.10s\n", stderr="")
    real_run = subprocess.run  # the CUDA tests' pytest answers `done`; anything else (uname) runs

    def run(args, *a, **k):
        return done if "pytest" in " ".join(map(str, args)) else real_run(args, *a, **k)

    monkeypatch.setattr(gpu_check.subprocess, "run", run)
    methods = ("none", "normprop-icml")
    code = gpu_check.run_gpu_check(tmp_path, methods, budget_s=0.01, batch_sizes=(2,), widths=(0.0625,))
    out = tmp_path / "bench" / "gpu"
    assert code == 1
    assert sorted(p.name for p in out.iterdir()) == ["SUMMARY.md", "bench.csv", "cuda_tests.txt", "epochs.csv"]
    steps = pd.read_csv(out / "bench.csv")
    assert list(steps.columns) == bench_timing.COLUMNS and list(steps["method"]) == list(methods)
    assert set(steps["options"]) == {"plain"} and steps["finite"].all()
    epochs = pd.read_csv(out / "epochs.csv")
    assert list(epochs["method"]) == list(methods) and (epochs["batch_size"] == 50).all()
    assert (epochs["train_images_per_s"] > 0).all()
    summary = (out / "SUMMARY.md").read_text()
    assert "9 passed in 3.10s (exit status 0)" in summary
    assert "| width | batch | precision | options | none | normprop-icml |" in summary
    assert "- none (channels_last+cuda_graph, float32): " in summary
    assert "9 passed" in (out / "cuda_tests.txt").read_text()
