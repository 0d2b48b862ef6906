"""The ledger written when it happens: a run trained again in place keeps its predecessor in its history and
the report lists it; a run the report would read is refused from a checkout with uncommitted changes."""

import json

import pandas as pd

from normprop_cli.engine import ledger
from normprop_cli.verdicts.budget_text import budget_section

SMOKE = ["--preset", "smoke", "--quiet"]
ONE = "grid=[{id: normprop, set: {model.norm: normprop}}]"  # one run: the smoke table1's normprop-s0


def run_path(results, name="normprop-s0"):
    return results / "table1" / "synthetic" / "runs" / name


def test_a_run_given_more_epochs_keeps_its_predecessor_in_its_history_and_the_report_lists_it(cli, monkeypatch):
    monkeypatch.setattr(ledger, "diff_hash", lambda where=None: "f" * 64)  # as from a checkout with changes
    assert cli("run", "table1", *SMOKE, ONE, "train.epochs=1", "--results-dir", cli.results).exit_code == 0
    before = json.loads((run_path(cli.results) / "manifest.json").read_text())
    assert before["diff_sha256"] == "f" * 64 and before["commit"]
    assert cli("run", "table1", *SMOKE, ONE, "train.epochs=2", "--results-dir", cli.results).exit_code == 0

    kept = run_path(cli.results) / "history" / "1"
    earlier = json.loads((kept / "manifest.json").read_text())
    assert earlier == before and earlier["epochs_done"] == 1
    assert len(pd.read_csv(kept / "metrics.csv")) == 1 and (kept / "config.yaml").is_file()
    assert not list(kept.glob("*.pt"))  # small files only
    assert json.loads((run_path(cli.results) / "manifest.json").read_text())["epochs_done"] == 2

    (entry,) = [e for e in ledger.read(cli.results) if e["event"] == "replaced"]
    assert entry["run"] == "normprop-s0" and entry["why"] == "more epochs"
    assert entry["kept"] == "table1/synthetic/runs/normprop-s0/history/1"
    assert entry["earlier"]["started"] == before["started"]

    text = "\n".join(budget_section(cli.results, cli.results, "smoke", ["table1"]))
    assert "| table1 |" in text
    assert "1 (normprop-s0; more epochs) | recorded: `table1/synthetic/runs/normprop-s0/history/1/`" in text


def test_a_removed_run_trained_again_keeps_what_git_held_with_the_verdict_before(tmp_path, monkeypatch):
    tree, path = tmp_path / "results", run_path(tmp_path / "results")
    tree.mkdir()
    row = {"claim": "C5", "experiment": "table1", "dataset": "digits", "verdict": "inconclusive", "effect": 0.1}
    pd.DataFrame([row | {"ci_low": -0.2, "ci_high": 0.4}]).to_csv(tree / "verdicts.csv", index=False)
    held = {"manifest.json": json.dumps({"run": "normprop-s0", "experiment": "table1", "dataset": "digits",
                                         "status": "complete", "started": "then"}).encode(),
            "metrics.csv": b"epoch\n1\n"}  # fmt: skip
    monkeypatch.setattr(ledger, "committed_files", lambda p: held if p == path else {})
    ledger.keep_earlier(tree, path, None)

    assert (path / "history" / "1" / "metrics.csv").read_bytes() == b"epoch\n1\n"
    (entry,) = ledger.read(tree)
    assert entry["why"] == "trained again" and entry["earlier"]["started"] == "then"
    assert entry["verdicts"][0]["verdict"] == "inconclusive" and entry["verdicts"][0]["claim"] == "C5"
    assert "C5 inconclusive 0.1 [-0.2, 0.4]" in "\n".join(budget_section(tree, tree, "quick", ["table1"]))
    ledger.keep_earlier(tree, path, None)  # started again before its first manifest: kept once
    assert len(ledger.read(tree)) == 1 and not (path / "history" / "2").exists()


def test_a_fresh_run_with_nothing_committed_records_nothing(tmp_path):
    ledger.keep_earlier(tmp_path, run_path(tmp_path), None)
    assert ledger.read(tmp_path) == [] and not (tmp_path / ledger.LEDGER).exists()


def test_a_reported_run_from_a_dirty_checkout_is_refused_in_one_line_and_nothing_is_written(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # results/ here is the quick preset's tree
    monkeypatch.setattr(ledger, "uncommitted", lambda where=None: ("normprop_cli/engine/trainer.py",))
    for command in (["run", "table1", *SMOKE, "--results-dir", "results"], ["reproduce-all", "--quiet"]):
        result = cli(*command)
        assert result.exit_code == 2, result.output
        assert result.output.count("\n") == 1 and result.output.startswith("error: results holds reported results")
        assert "normprop_cli/engine/trainer.py" in result.output and "--allow-dirty" in result.output
        assert list(tmp_path.iterdir()) == []
    ledger.check_clean([tmp_path / "results"], allow_dirty=True)  # allowed: the runs record diff_sha256
    ledger.check_clean([tmp_path / "scratch"], allow_dirty=False)  # not a preset's tree: never reported
