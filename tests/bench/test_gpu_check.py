"""`normprop gpu-check`: on a machine without CUDA one line, exit 2, nothing run or written; its items
on the CPU, with the GPU check stood in for (the CUDA-only readings answer "not measured"), its time cap,
its summary, and the kill-and-resume of a real run in subprocesses."""

import math
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch

from normprop_cli import config
from normprop_cli.bench import gpu_bench, gpu_check, gpu_fold, gpu_items
from normprop_cli.experiments import grid, plan

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


@pytest.fixture
def on_the_cpu(monkeypatch):
    """Stand-ins: the CPU for the GPU, a tiny NIN, pytest's answer for the CUDA tests."""
    load = config.load
    monkeypatch.setattr(config, "load", lambda *a, **k: load(*a, **k, overrides=["model.width=0.0625"]))
    monkeypatch.setattr(gpu_check, "cuda_device", lambda: torch.device("cpu"))
    done = subprocess.CompletedProcess([], 0, stdout="....\n9 passed in 3.10s\n", stderr="")
    real_run = subprocess.run  # the CUDA tests' pytest answers `done`; anything else runs

    def run(args, *a, **k):
        return done if "pytest" in " ".join(map(str, args)) else real_run(args, *a, **k)

    monkeypatch.setattr(gpu_check.subprocess, "run", run)


def one_run_plan(times, results_dir):
    """A stand-in for reproduce-all --preset paper: one smoke run, priced by `times`."""
    cfg = grid.load("table1", preset="smoke", overrides=["grid=[{id: a, set: {}}]"], results_dir=str(results_dir))
    return plan.table([plan.plan_experiment(cfg)], times, total=True)


@pytest.fixture
def small(monkeypatch):
    """The bench's, the profile's, the repetition's and the fold's sizes cut to a few steps."""
    monkeypatch.setattr(gpu_bench, "BENCH_STEPS", 3)
    monkeypatch.setattr(gpu_bench, "PROFILE_BATCHES", (2,))
    monkeypatch.setattr(gpu_bench, "REPEAT_STEPS", 3)
    monkeypatch.setattr(gpu_bench, "REPEAT_BATCH", 2)
    monkeypatch.setattr(gpu_fold, "ROUNDS", 3)
    monkeypatch.setattr(gpu_fold, "STEPS", 3)
    monkeypatch.setattr(gpu_fold, "BATCH_SIZES", (2,))


@no_gpu_only
def test_every_item_runs_on_the_cpu_and_the_summary_says_each_passed(tmp_path, on_the_cpu, small, monkeypatch):
    resumed = gpu_items.Item("resume", True, "stood in for (its own test runs it)")
    monkeypatch.setattr(gpu_items, "resumed_run", lambda experiment, *a, **k: resumed)
    code = gpu_check.run_gpu_check(tmp_path, ("none", "normprop-icml"), budget_s=0.01, batch_sizes=(2,),
                                   widths=(0.0625,), project=one_run_plan, fashion_plan=None,
                                   precisions=("float32",))  # fmt: skip
    out = tmp_path / "bench" / "gpu"
    summary = (out / "SUMMARY.md").read_text()
    assert code == 0, summary
    assert sorted(p.name for p in out.iterdir()) == ["SUMMARY.md", "bench.csv", "cuda_tests.txt", "kernels.csv",
                                                    "plan.csv", "step_times.csv"]  # fmt: skip
    for item in ("cuda-tests", "methods", "memory", "syncs", "cpu-agreement", "bench", "kernels", "deterministic",
                 "fold", "projection"):  # fmt: skip
        assert f"| {item} | pass |" in summary, item
    assert "9 passed in 3.10s (exit status 0)" in summary
    assert "- none: eager (the options ask for no CUDA graph)" in summary
    assert "largest relative loss gap 0.00e+00" in summary  # the CPU against itself
    bench = pd.read_csv(out / "bench.csv")
    assert list(bench["method"].unique()) == ["none", "normprop-icml"]
    assert sorted(bench["shape"].unique()) == ["1x32x32", "3x32x32"] and set(bench["options"]) == {"channels_last"}
    assert "| NormProp / BatchNorm at batch 50 | <= 1.00 | not measured | not measured |" in summary  # width 1 only
    assert pd.read_csv(out / "plan.csv")["experiment"].tolist() == ["table1", "total"]
    times = pd.read_csv(out / "step_times.csv")  # the plan's configurations, then the bench's it lacks
    assert {(m, s) for m, s in zip(times["method"], times["shape"], strict=True)} >= {
        ("normprop-icml", "3x32x32"),
        ("none", "1x32x32"),
        ("normprop-icml", "1x32x32"),
    }
    assert "two runs of each of 2 methods, 3 steps: the same losses bit for bit" in summary
    assert "kernels per step at batch 2 (torch.profiler, top-level ATen ops): none " in summary


@no_gpu_only
def test_the_time_cap_fails_the_items_it_leaves_out(tmp_path, on_the_cpu):
    code = gpu_check.run_gpu_check(tmp_path, ("none",), project=one_run_plan, cap_s=0.0)
    summary = (tmp_path / "bench" / "gpu" / "SUMMARY.md").read_text()
    assert code == 1
    assert summary.count("| FAIL |") == 11 and "not run: the 0 s cap left 0 s" in summary
    assert "**0 of 11 items passed** (exit status 1)" in summary


def test_the_summary_gives_pass_or_fail_per_item_and_their_details():
    found = [gpu_items.Item("methods", True, "14 of 14 methods step", ["- none: graph"], 2.0),
             gpu_items.Item("syncs", False, "some per step", ["- online: 2 per step"], 1.0)]  # fmt: skip
    text = gpu_check.summarise(torch.device("cpu"), found, 480.0, 3.0)
    assert "**1 of 2 items passed** (exit status 1) in 3 s of the 480 s cap." in text
    assert "| methods | pass | 2 | 14 of 14 methods step |" in text and "| syncs | FAIL | 1 | some per step |" in text
    assert "## syncs\n\n- online: 2 per step" in text


def test_an_item_that_raises_fails_alone_and_a_timed_out_test_run_says_so(tmp_path, monkeypatch):
    [item] = gpu_items.attempt("x", lambda: 1 / 0)
    assert not item.passed and item.line.startswith("ZeroDivisionError")

    def slow(command, **kwargs):
        raise subprocess.TimeoutExpired(command, kwargs["timeout"], output="..\n", stderr="")

    monkeypatch.setattr(gpu_check.subprocess, "run", slow)
    item = gpu_check.cuda_tests_item(tmp_path, 5.0)
    assert not item.passed and "timed out after 5 s" in item.line and "(exit status 124)" in item.line


def test_syncs_are_counted_only_on_cuda():
    calls = []
    assert gpu_items.count_syncs(lambda: calls.append(1), torch.device("cpu")) == 0 and calls == [1]


def test_only_the_warnings_of_synchronising_calls_count_as_syncs():
    """The first use of torch's sync debug mode warns that it is a prototype, naming synchronisation: on the
    first GPU run that warning was counted as a sync of the first method measured (0.2 per step)."""
    messages = [
        "Synchronization debug mode is a prototype feature and does not yet detect all synchronizing operations",
        "called a synchronizing CUDA operation",
        "called a synchronizing CUDA operation",
        "Converting a tensor with requires_grad=True to a scalar may lead to unexpected behavior.",
    ]
    assert gpu_items.count_sync_warnings(messages) == 2


class Replayed:
    """A run whose step writes every loss into one output tensor, as a CUDA graph's replay does; the
    loss of step k is k, or NaN at the step `nan_at`."""

    def __init__(self, nan_at=None):
        self.out, self.k, self.nan_at = torch.zeros(()), 0, nan_at

    def step(self, x, y):
        self.k += 1
        self.out.fill_(math.nan if self.k == self.nan_at else float(self.k))
        return self.out, self.out


def test_cpu_agreement_copies_each_loss_as_a_graph_overwrites_its_output(monkeypatch):
    """A CUDA graph's step returns the same output tensor at every replay: the item keeps each step's loss."""
    monkeypatch.setattr(gpu_items, "trainer_run", lambda cfg, data, dev, method: Replayed())
    cfg = config.load("table1", preset="smoke")
    item = gpu_items.agreement(cfg, torch.device("cpu"), torch.device("cpu"), ("none",), steps=3)
    assert item.passed and item.details == [
        "- none: losses 1.0000, 2.0000, 3.0000 on cpu, 1.0000, 2.0000, 3.0000 on cpu; largest relative gap 0.00e+00"
    ]


def test_a_run_killed_after_its_first_epoch_resumes_to_completion(tmp_path):
    """The real path in subprocesses, on the CPU: table1 (flips on two of its four runs) on CIFAR-10 pickles
    written on the spot, killed once a first epoch's manifest is there, run again."""
    data = gpu_items.write_cifar10(tmp_path / "data", per_file=60, n_test=50)
    results = tmp_path / "results"
    # a budget no loaded machine reaches: what is tested is the kill and the resume, not how fast they go
    item = gpu_items.resumed_run("table1", data, results, "cpu", 3600.0, ["model.width=0.0625"])
    assert item.passed, item.line
    manifests = gpu_items.manifests(results, "table1")
    assert len(manifests) == 4 and all(m["status"] == "complete" and m["epochs_done"] == 2 for m in manifests)
    assert "run(s) unfinished" in item.line and "completed all 4" in item.line


def test_the_methods_item_reads_every_steps_loss_though_a_graph_overwrites_its_output(monkeypatch):
    """A loss that is not finite at the second of three steps fails the method, though the last is finite."""
    monkeypatch.setattr(gpu_items, "trainer_run", lambda cfg, data, dev, method: Replayed(nan_at=2))
    cfg = config.load("table1", preset="smoke")
    steps, _ = gpu_items.method_steps(cfg, torch.device("cpu"), ("none",), batch_size=2)
    assert not steps.passed and "failing: none" in steps.line
