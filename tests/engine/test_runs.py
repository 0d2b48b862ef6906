"""Runs that never lose work: skip, resume exactly, record divergence."""

import json

import pandas as pd
import pytest
import torch

SMOKE = ["--preset", "smoke", "--quiet"]
TIMING = ["train_seconds", "images_per_second", "epoch_seconds"]


def load_run(results, experiment, name, dataset="synthetic"):
    path = results / experiment / dataset / "runs" / name
    manifest = json.loads((path / "manifest.json").read_text())
    metrics = pd.read_csv(path / "metrics.csv")
    checkpoint = path / "checkpoint.pt"
    weights = torch.load(checkpoint, weights_only=True)["model"] if checkpoint.exists() else None
    return manifest, metrics, weights


def test_table1_smoke_writes_runs_and_summary(cli, trained):
    trained(cli.results, "table1", *SMOKE, "train.epochs=2")  # the preset's own number of epochs
    summary = pd.read_csv(cli.results / "table1" / "synthetic" / "summary.csv")
    for column in (
        "method",
        "augment",
        "seed",
        "status",
        "final_test_error",
        "best_val_test_error",
        "paper_test_error",
    ):
        assert column in summary.columns
    assert sorted(summary["method"].unique()) == ["batchnorm", "normprop"]
    assert (summary["status"] == "complete").all()
    assert summary["final_test_error"].between(0, 100).all()
    manifest, metrics, _ = load_run(cli.results, "table1", "normprop-s0")
    assert manifest["status"] == "complete" and manifest["epochs_done"] == 2 == len(metrics)
    for key in ("seed", "versions", "device", "commit", "started", "finished"):
        assert key in manifest
    assert (cli.results / "table1" / "synthetic" / "table1.png").exists()
    # Running it again skips every complete run and leaves the files as they were.
    before = (cli.results / "table1" / "synthetic" / "runs" / "normprop-s0" / "checkpoint.pt").stat().st_mtime_ns
    again = cli("run", "table1", *SMOKE, "--results-dir", cli.results)
    assert again.exit_code == 0 and again.output.count("skipped") == 4
    after = (cli.results / "table1" / "synthetic" / "runs" / "normprop-s0" / "checkpoint.pt").stat().st_mtime_ns
    assert before == after


def test_paper_values_appear_beside_the_reproduction(cli):
    from normprop_cli import config

    cfg = config.load("table1", preset="paper", dataset="cifar10")
    assert cfg.experiment.paper_test_error.cifar10.normprop.none == 9.11
    assert cfg.experiment.paper_test_error.svhn.batchnorm.none == 2.25


@pytest.mark.parametrize("norm,augment", [("normprop", "true"), ("batchnorm", "false")])
def test_resumed_run_equals_uninterrupted_run_bit_for_bit(cli, trained, tmp_path, interrupt_at, norm, augment):
    args = [
        "run",
        "table1",
        *SMOKE,
        "train.epochs=3",
        f"grid=[{{id: r, set: {{model.norm: {norm}, train.augment: {augment}}}}}]",
    ]
    trained(tmp_path / "a", *args[1:])  # the uninterrupted run

    # Interrupt the second run in the middle of its second epoch, as Ctrl-C would.
    assert interrupt_at(6, lambda: cli(*args, "--results-dir", tmp_path / "b")).exit_code == 130
    manifest, metrics, _ = load_run(tmp_path / "b", "table1", "r-s0")
    assert manifest["status"] == "running" and manifest["epochs_done"] == 1 == len(metrics)
    assert cli(*args, "--results-dir", tmp_path / "b").exit_code == 0

    ma, a, wa = load_run(tmp_path / "a", "table1", "r-s0")
    mb, b, wb = load_run(tmp_path / "b", "table1", "r-s0")
    assert ma["status"] == mb["status"] == "complete" and mb["resumed_from_epoch"] == 1
    pd.testing.assert_frame_equal(a.drop(columns=TIMING), b.drop(columns=TIMING), check_exact=True)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


def test_diverging_run_is_recorded_and_the_sweep_goes_on(cli):
    grid = "grid=[{id: wild, set: {model.norm: none, train.lr: 1.0e+12}}, {id: calm, set: {model.norm: normprop}}]"
    result = cli("run", "table1", *SMOKE, "train.epochs=3", grid, "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    summary = pd.read_csv(cli.results / "table1" / "synthetic" / "summary.csv").set_index("setting")
    assert summary.loc["wild", "status"] == "diverged"
    assert summary.loc["calm", "status"] == "complete"
    manifest, metrics, _ = load_run(cli.results, "table1", "wild-s0")
    assert manifest["epochs_done"] == len(metrics) < 3
    assert metrics.drop(columns=TIMING).map(lambda v: pd.notna(v) and abs(v) < float("inf")).all().all()


def test_another_config_in_the_same_run_directory_is_refused(cli, trained):
    trained(cli.results, "table1", *SMOKE, "train.epochs=1")  # its four runs, finished
    # An unfinished run must match (a finished one too: see the next test).
    run = cli.results / "table1" / "synthetic" / "runs" / "normprop-s0" / "manifest.json"
    manifest = json.loads(run.read_text())
    run.write_text(json.dumps(manifest | {"status": "running"}))
    result = cli("run", "table1", *SMOKE, "train.epochs=2", "model.width=0.125", "--results-dir", cli.results)
    assert result.exit_code == 2 and "another config" in result.output


def test_a_changed_setting_on_a_finished_run_is_refused_and_more_epochs_extend_it(cli, trained):
    """Never "complete, skipped" with the old numbers: another width is refused before anything trains
    (summary.csv untouched), fewer epochs too; more epochs continue the runs to the new count."""
    trained(cli.results, "table1", *SMOKE, "train.epochs=2")
    sweep = cli.results / "table1" / "synthetic"
    summary = (sweep / "summary.csv").read_bytes()
    for changed in (["model.width=0.125"], ["train.epochs=1"], ["train.epochs=3", "train.lr=0.01"]):
        result = cli("run", "table1", *SMOKE, *changed, "--results-dir", cli.results)
        assert result.exit_code == 2 and "holds finished run" in result.output, changed
        assert all(c.split("=")[0] in result.output for c in changed)
        assert (sweep / "summary.csv").read_bytes() == summary
    assert cli("run", "table1", *SMOKE, "train.epochs=3", "--results-dir", cli.results).exit_code == 0
    manifest = json.loads((sweep / "runs" / "normprop-s0" / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["epochs_done"] == 3


def test_a_reworded_description_of_the_experiment_does_not_refuse_its_runs(cli, trained):
    """experiment.paper is the report's text: an unfinished run goes on under a rewording, and a change
    to anything that trains (the width) is still refused."""
    trained(cli.results, "table1", *SMOKE, "train.epochs=1")  # its four runs, finished
    run = cli.results / "table1" / "synthetic" / "runs" / "normprop-s0" / "manifest.json"
    run.write_text(json.dumps(json.loads(run.read_text()) | {"status": "running"}))
    reworded = "experiment.paper=reworded"
    assert cli("run", "table1", *SMOKE, "train.epochs=1", reworded, "--results-dir", cli.results).exit_code == 0
    assert json.loads(run.read_text())["status"] == "complete"
    run.write_text(json.dumps(json.loads(run.read_text()) | {"status": "running"}))
    result = cli("run", "table1", *SMOKE, "train.epochs=1", reworded, "model.width=0.125", "--results-dir", cli.results)
    assert result.exit_code == 2 and "model.width" in result.output


def test_how_a_step_runs_may_change_when_a_run_goes_on(cli, trained):
    """channels_last, compile and cuda_graph say how a step runs, not what it computes: like the device,
    they may differ from a run's config.yaml (runs trained when cuda_graph's default was false go on
    under auto); anything that trains is still refused."""
    trained(cli.results, "table1", *SMOKE, "train.epochs=1")  # its four runs, finished
    path = cli.results / "table1" / "synthetic" / "runs" / "normprop-s0"
    stored = (path / "config.yaml").read_text()
    assert "cuda_graph: auto" in stored
    (path / "config.yaml").write_text(stored.replace("cuda_graph: auto", "cuda_graph: false"))
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps(manifest | {"status": "running"}))
    result = cli("run", "table1", *SMOKE, "train.epochs=1", "train.channels_last=false", "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    assert json.loads((path / "manifest.json").read_text())["status"] == "complete"
    result = cli("run", "table1", *SMOKE, "train.epochs=1", "train.amp=true", "--results-dir", cli.results)
    assert result.exit_code == 2 and "train.amp" in result.output


def test_the_batch_size_of_evaluation_is_not_part_of_a_run(cli, trained):
    """train.eval_batch_size only groups the images scored (no batch statistics in evaluation mode): a
    finished run is reused under another one, and scoring at either gives the same accuracies and the same
    losses up to float32 rounding."""
    import torch

    from normprop_cli import config
    from normprop_cli.engine.job import load_data
    from normprop_cli.engine.trainer import evaluate, make_run

    trained(cli.results, "table1", *SMOKE, "train.epochs=1")  # its four runs, finished
    result = cli("run", "table1", *SMOKE, "train.epochs=1", "train.eval_batch_size=7", "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    assert "already finished" in result.output and "complete after" not in result.output  # reused, not retrained
    cfg = config.load("table1", preset="smoke")
    data = load_data(cfg, torch.device("cpu"))
    for norm in ("normprop", "batchnorm"):
        cfg.model.norm = norm
        torch.manual_seed(0)
        run = make_run(cfg, data, torch.device("cpu"))
        scores = []
        for size in (64, 7):
            cfg.train.eval_batch_size = size
            scores.append(evaluate(run, data, cfg))
        assert scores[0]["val_acc"] == scores[1]["val_acc"] and scores[0]["test_acc"] == scores[1]["test_acc"]
        for key in ("val_loss", "test_loss"):
            assert abs(scores[0][key] - scores[1][key]) <= 1e-5 * abs(scores[0][key])


def test_how_a_rate_was_chosen_is_not_part_of_a_run_but_the_rate_is(tmp_path):
    """A run trained at lr 0.001 is the same run whether a one-epoch sweep on one seed or a six-epoch
    sweep on two seeds chose that rate (experiment.lr_sweep), and however many seeds its setting has
    (experiment.extra_seeds); another rate is another run."""
    from omegaconf import OmegaConf

    from normprop_cli.engine.runs import CONFIG, RunSpec, config_differences

    stored = {"seed": 0, "train": {"lr": 0.001, "epochs": 12},
              "experiment": {"name": "batch-size", "lr_sweep": {"factors": [0.5, 1.0, 2.0], "epochs": 1}}}  # fmt: skip
    (tmp_path / CONFIG).write_text(OmegaConf.to_yaml(OmegaConf.create(stored)))
    now = OmegaConf.create(stored)
    now.experiment.lr_sweep = {"factors": None, "step": 2.0, "points": 3, "extend": 4, "seeds": [100, 101], "epochs": 6}
    now.experiment.extra_seeds = {"normprop-b1": 2}
    assert config_differences(RunSpec("normprop-b1-s0", "normprop-b1", 0, now), tmp_path) == []
    now.train.lr = 0.0005
    assert config_differences(RunSpec("normprop-b1-s0", "normprop-b1", 0, now), tmp_path) == ["train.lr"]


def test_augmentation_follows_the_data_set_and_svhn_has_none(cli):
    """Augmentation: flips for CIFAR, translations for digits, none for SVHN (asking for it is refused)."""
    from normprop_cli import config

    kinds = {name: config.load("table1", dataset=name).dataset.augment for name in ("cifar10", "digits", "svhn")}
    assert kinds == {"cifar10": "flip", "digits": "translate", "svhn": "none"}
    grid = "grid=[{id: r, set: {train.augment: true}}]"
    result = cli("run", "table1", *SMOKE, "--dataset", "svhn", grid, "--results-dir", cli.results)
    assert result.exit_code == 2 and "svhn has no augmentation" in result.output
    assert not cli.results.exists()


@pytest.mark.parametrize("interrupt", [False, True])
def test_more_epochs_extend_a_run_to_exactly_the_longer_run(cli, trained, tmp_path, interrupt_at, interrupt):
    """train.epochs raised for a complete (or an interrupted) run continues it from its checkpoint and
    ends bit for bit where a run trained to that many epochs at once ends; its config.yaml says so."""
    grid = "grid=[{id: r, set: {model.norm: normprop, train.augment: true}}]"
    args = ["run", "table1", *SMOKE, grid]
    trained(tmp_path / "a", "table1", *SMOKE, "train.epochs=3", grid)  # at once: the resumed runs' reference too
    if interrupt:  # stopped in its second epoch under the shorter config
        assert interrupt_at(6, lambda: cli(*args, "train.epochs=2", "--results-dir", tmp_path / "b")).exit_code == 130
    else:
        assert cli(*args, "train.epochs=2", "--results-dir", tmp_path / "b").exit_code == 0
    assert cli(*args, "train.epochs=3", "--results-dir", tmp_path / "b").exit_code == 0
    ma, a, wa = load_run(tmp_path / "a", "table1", "r-s0")
    mb, b, wb = load_run(tmp_path / "b", "table1", "r-s0")
    assert mb["status"] == "complete" and mb["epochs_done"] == 3 == len(b)
    pd.testing.assert_frame_equal(a.drop(columns=TIMING), b.drop(columns=TIMING), check_exact=True)
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key
    stored = (tmp_path / "b" / "table1" / "synthetic" / "runs" / "r-s0" / "config.yaml").read_text()
    assert "epochs: 3" in stored
    # fewer epochs than a run has done are no extension: the run keeps its three
    cli(*args, "train.epochs=1", "--results-dir", tmp_path / "b")
    assert load_run(tmp_path / "b", "table1", "r-s0")[0]["epochs_done"] == 3


def test_a_manifests_commit_says_dirty_where_the_code_differs_from_it_and_not_for_results(tmp_path):
    import subprocess

    from normprop_cli.engine.runs import commit

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    assert commit(tmp_path) == "unknown"  # not a checkout
    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "summary.csv").write_text("a\n1\n")
    git("add", ".")
    git("commit", "-q", "-m", "c")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True, text=True)
    clean = head.stdout.strip()
    (tmp_path / "results" / "summary.csv").write_text("a\n2\n")  # new results: the code is still the commit's
    assert commit.__wrapped__(tmp_path) == clean
    (tmp_path / "code.py").write_text("x = 2\n")
    assert commit.__wrapped__(tmp_path) == f"{clean}+dirty"
