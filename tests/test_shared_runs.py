"""The report's statement on runs that experiments share is true of the runs on disk."""

import json
from pathlib import Path

from normprop_cli import verdicts
from normprop_cli.experiments import EXPERIMENTS
from normprop_cli.verdicts.shared import by_claim, shared_runs, statement

ROOT = Path(__file__).resolve().parents[1]


def fake_run(results, experiment, name, seed, losses):
    run = results / experiment / "synthetic" / "runs" / name
    run.mkdir(parents=True)
    (run.parents[1] / "summary.csv").write_text("x\n1\n")
    (run / "manifest.json").write_text(json.dumps({"seed": seed}))
    rows = [f"{e},{loss},50.0,40.0,41.0" for e, loss in enumerate(losses, 1)]
    (run / "metrics.csv").write_text("epoch,train_loss,train_acc,val_acc,test_acc\n" + "\n".join(rows) + "\n")


def test_runs_with_the_same_seed_and_metrics_are_shared_and_counted_through_their_common_epochs(tmp_path):
    fake_run(tmp_path, "table1", "normprop-s0", 0, [0.9, 0.5, 0.4])
    fake_run(tmp_path, "convergence", "normprop-s0", 0, [0.9, 0.5, 0.3, 0.2])  # parts at epoch 3
    fake_run(tmp_path, "convergence", "normprop-s1", 1, [0.8, 0.5])  # another seed: no twin
    fake_run(tmp_path, "data-norm", "global-b50-s0", 1, [0.9, 0.5])  # same metrics, other seed: not shared
    fake_run(tmp_path, "table1", "sweep-lr0.1-s0", 0, [0.9, 0.5])  # sweeps are left out
    found = shared_runs(tmp_path, EXPERIMENTS)
    assert [(s.a, s.b, s.pairs) for s in found] == [("convergence", "table1", (("normprop-s0", "normprop-s0", 2),))]
    links = by_claim(found, verdicts.claims())
    c3, c5 = (next(c for c in verdicts.claims() if c.experiment == e).id for e in ("convergence", "table1"))
    assert links[c3] == [c5] and links[c5] == [c3]
    text = "\n".join(statement([("quick", tmp_path)], EXPERIMENTS, verdicts.claims()))
    assert f"{c3} with {c5}" in text and "1 run identical through epoch 2" in text


def test_no_shared_run_is_said_when_there_is_none(tmp_path):
    fake_run(tmp_path, "table1", "normprop-s0", 0, [0.9])
    fake_run(tmp_path, "convergence", "normprop-s0", 0, [0.8])
    assert shared_runs(tmp_path, EXPERIMENTS) == []
    assert "no run of one experiment repeats a run of another" in "\n".join(
        statement([("quick", tmp_path)], EXPERIMENTS, verdicts.claims())
    )


def test_the_committed_fashion_runs_share_what_their_configs_share():
    """convergence's NormProp and BatchNorm runs are table1's without augmentation, and covariate-shift's
    NormProp runs are data-norm's global-b50 runs: the same config and seed, so the same trajectory."""
    found = {(s.a, s.b): s for s in shared_runs(ROOT / "results" / "fashion", EXPERIMENTS)}
    pairs = {(a, b) for a, b, _ in found[("convergence", "table1")].pairs}
    assert {(f"{m}-s{k}", f"{m}-s{k}") for m in ("normprop", "batchnorm") for k in range(6)} <= pairs
    assert ("normprop-s0", "global-b50-s0") in {(a, b) for a, b, _ in found[("covariate-shift", "data-norm")].pairs}


def test_the_committed_reports_say_which_verdicts_share_runs_and_never_that_they_are_independent():
    for report in (ROOT / "results").rglob("REPORT.md"):
        text = report.read_text()
        assert "rest on independent runs" not in text
        assert "**Runs shared between experiments.**" in text


def test_runs_trained_once_are_said_so_from_their_manifests(tmp_path):
    """A run that rode along another's training (engine.riders) names it in its manifest; so do two riders
    of one training, which were trained once too."""
    fake_run(tmp_path, "covariate-shift", "normprop-s0", 0, [0.9, 0.5, 0.4])
    fake_run(tmp_path, "activations", "normprop-relu-s0", 0, [0.9, 0.5])
    fake_run(tmp_path, "drift", "normprop-s0", 0, [0.9, 0.5])
    fake_run(tmp_path, "table1", "normprop-s1", 1, [0.7])
    fake_run(tmp_path, "convergence", "normprop-s1", 1, [0.7])  # the same trajectory, trained twice
    for experiment, run in (("activations", "normprop-relu-s0"), ("drift", "normprop-s0")):
        manifest = tmp_path / experiment / "synthetic" / "runs" / run / "manifest.json"
        manifest.write_text(json.dumps({"seed": 0, "trained_with": "covariate-shift/normprop-s0"}))
    found = {(s.a, s.b): s.once for s in shared_runs(tmp_path, EXPERIMENTS)}
    assert found == {("activations", "covariate-shift"): 1, ("activations", "drift"): 1,
                     ("covariate-shift", "drift"): 1, ("convergence", "table1"): 0}  # fmt: skip
    text = "\n".join(statement([("quick", tmp_path)], EXPERIMENTS, verdicts.claims()))
    assert "activations and drift: 1 run identical through epoch 2, 1 of them from one training (e.g." in text
    assert "convergence and table1: 1 run identical through epoch 1 (e.g." in text
