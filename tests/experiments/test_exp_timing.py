"""Section 5.6: seconds per training epoch after a warm-up epoch, the methods' epochs interleaved in
shuffled rounds, and the ratios between methods paired by round. No assertion on the times
themselves: only on how they are taken, read and related."""

import dataclasses
import time

import numpy as np
import pandas as pd
import pytest

from normprop_cli import config, prose
from normprop_cli.experiments import interleave, timing
from normprop_cli.verdicts import rounds as pairing
from normprop_cli.verdicts import rule

ARGS = ("--preset", "smoke", "--quiet", "--seeds", "2", "train.epochs=3")
SETTINGS = ["normprop", "batchnorm", "none"]  # the grid's order
TIMING = ["train_seconds", "images_per_second", "epoch_seconds"]


@pytest.fixture(scope="module")
def results(run_experiment):
    return run_experiment("timing", *ARGS)


def test_timing_is_the_median_after_the_warm_up_with_ratios_paired_by_round(results):
    sweep = results / "timing" / "synthetic"
    table = pd.read_csv(sweep / "timing.csv").set_index("method")
    assert list(table.columns) == timing.COLUMNS[1:]
    assert list(table.index) == ["normprop", "batchnorm", "none"]
    assert table["device"].str.startswith("cpu (").all() and (table["epochs_timed"] == 4).all()
    epochs = pd.read_csv(sweep / "epochs.csv")
    for method, row in table.iterrows():
        later = epochs[(epochs["method"] == method) & (epochs["epoch"] >= 2)]
        assert row["median_epoch_seconds"] == pytest.approx(later["train_seconds"].median())
    assert table.loc["batchnorm", "ratio_vs_batchnorm"] == pytest.approx(1.0)
    assert table.loc["none", "ratio_vs_none"] == pytest.approx(1.0)
    # the verdict's ratio: per seed the median over rounds 2-3 of NormProp's / BatchNorm's seconds
    wide = epochs[epochs["epoch"] >= 2].pivot_table(index=["seed", "epoch"], columns="method", values="train_seconds")
    per_seed = np.log((wide["normprop"] / wide["batchnorm"]).groupby("seed").median())
    assert table.loc["normprop", "ratio_vs_batchnorm"] == pytest.approx(np.exp(per_seed.mean()))
    assert table.loc["normprop", "seeds_vs_batchnorm"] == 2 and table.loc["normprop", "rounds_vs_batchnorm"] == 4
    assert table.loc["normprop", "pooled_ratio_vs_batchnorm"] == pytest.approx(
        table.loc["normprop", "median_epoch_seconds"] / table.loc["batchnorm", "median_epoch_seconds"]
    )
    assert table.loc["normprop", "paper_seconds"] == 84 and table.loc["batchnorm", "paper_seconds"] == 96
    assert (sweep / "timing.png").exists()


def test_the_rounds_interleave_the_methods_in_a_seeded_order_shuffled_per_round(results):
    rounds = pd.read_csv(results / "timing" / "synthetic" / "rounds.csv")
    assert list(rounds.columns) == pairing.ROUND_COLUMNS and len(rounds) == 2 * 3 * 3
    assert list(rounds["timed"]) == list(rounds["round"] > 1)
    for (seed, r), g in rounds.groupby(["seed", "round"]):
        order = interleave.round_order(seed, r, SETTINGS)
        assert list(g.sort_values("position")["method"]) == order and list(g["position"]) == [1, 2, 3]
        assert set(g["order"]) == {" ".join(order)}
    # one seed after the other, round after round, each round in its order: the epochs finished so
    assert list(rounds.sort_values("finished").index) == list(rounds.index)
    assert rounds["process"].nunique() == 1
    # the order is the seeded generator's, the same in every call, and it changes between rounds
    orders = [tuple(interleave.round_order(0, r, SETTINGS)) for r in range(1, 9)]
    assert orders == [tuple(interleave.round_order(0, r, SETTINGS)) for r in range(1, 9)]
    assert len(set(orders)) > 2 and orders[0] != orders[1]
    seeds = rounds.drop_duplicates(["seed", "round"]).groupby("seed")["order"].nunique()
    assert (seeds > 1).any()


def test_a_killed_sweep_resumes_its_runs_exactly_and_a_rerun_reuses_them(cli, tmp_path, results, monkeypatch):
    turns, turn = {"n": 0}, interleave.Lane.turn

    def interrupted(self, mark):
        turns["n"] += 1
        if turns["n"] == 5:  # seed 0's round 2, its second run: Ctrl-C while it trains
            self.conn.send(("turn", mark))
            time.sleep(0.05)
            raise KeyboardInterrupt
        turn(self, mark)

    monkeypatch.setattr(interleave.Lane, "turn", interrupted)
    one_seed = (*ARGS, "--seeds", "1")
    assert cli("run", "timing", *one_seed, "--results-dir", tmp_path).exit_code == 130
    monkeypatch.setattr(interleave.Lane, "turn", turn)
    assert cli("run", "timing", *one_seed, "--results-dir", tmp_path).exit_code == 0
    sweep, fresh = tmp_path / "timing" / "synthetic", results / "timing" / "synthetic"
    for run in pd.read_csv(sweep / "summary.csv")["run"]:  # seed 0's, as in the sweep not interrupted
        a, b = (pd.read_csv(s / "runs" / run / "metrics.csv").drop(columns=TIMING) for s in (fresh, sweep))
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    rounds = pd.read_csv(sweep / "rounds.csv")
    assert len(rounds) == 9 and rounds["process"].nunique() == 2  # the interrupted round, finished by the rerun
    assert rounds.loc[rounds["round"] == 2, "process"].nunique() == 2
    again = cli("run", "timing", *one_seed, "--results-dir", tmp_path)
    assert again.exit_code == 0 and "3 of 3 runs already finished" in again.output
    pd.testing.assert_frame_equal(pd.read_csv(sweep / "rounds.csv"), rounds)


def test_one_epoch_is_timed_when_there_is_no_other():
    epochs = pd.DataFrame({"epoch": [1], "train_seconds": [2.0]})
    assert len(timing.timed(epochs, warmup=1)) == 1


def test_plot_redraws_from_the_csvs_alone(assert_redraws, results):
    assert_redraws("timing", results)


def test_headlines_put_the_ratio_beside_the_papers(results):
    cfg = config.load("timing", preset="smoke", results_dir=str(results))
    rows = timing.headlines(cfg)
    ratio = [r for r in rows if r["quantity"].startswith("epoch time ratio NormProp / BatchNorm, paired by round")]
    # a CPU's seconds on synthetic data are not the paper's GPU seconds on CIFAR-10
    seconds, where = cfg.experiment.paper_seconds, f"{cfg.experiment.paper_device}, CIFAR-10"
    assert cfg.experiment.paper_device == "GTX Titan X"
    assert len(ratio) == 1 and ratio[0]["paper"].startswith(f"{seconds.normprop / seconds.batchnorm:.3f} ({where}; not")
    assert "over 2 seeds" in ratio[0]["quantity"] and "(4 in all)" in ratio[0]["quantity"]
    assert any(r["paper"].startswith(f"{seconds.normprop} ({where}") for r in rows)
    assert sum(r["quantity"].startswith("ratio of the pooled medians") for r in rows) == 1
    assert "shuffled per round" in timing.paragraphs(cfg)[0]


def test_the_paragraph_states_the_paired_ratio_its_effect_and_the_claims_id(results, monkeypatch):
    """The paragraph's ratio is timing.csv's paired ratio, the effect 1 - that ratio, and the claim it names
    is the one conf/claims.yaml gives the timing experiment: renumbered there, the prose follows."""
    cfg = config.load("timing", preset="smoke", results_dir=str(results))
    facts = timing.timing_facts(cfg)
    r = pd.read_csv(results / "timing" / "synthetic" / "timing.csv").set_index("method").loc["normprop"]
    assert facts["ratio"] == pytest.approx(r["ratio_vs_batchnorm"]) and facts["seeds"] == r["seeds_vs_batchnorm"]
    (text,) = timing.paragraphs(cfg)
    assert f"the geometric mean of those ratios, {r['ratio_vs_batchnorm']:.3f}." in text
    assert f"1 - ratio = {1.0 - r['ratio_vs_batchnorm']:.3f}," in text
    assert f"their ratio, {r['pooled_ratio_vs_batchnorm']:.3f}, is not paired" in text
    assert prose.render("timing", facts | {"seeds": 17}) != [text]
    claim = next(c for c in rule.claims() if c.experiment == "timing")
    assert f"The verdict on {claim.id} reads" in text
    monkeypatch.setattr(rule, "claims", lambda: (dataclasses.replace(claim, id="C42"),))
    assert "The verdict on C42 reads" in timing.paragraphs(cfg)[0]
    assert any("(the C42 verdict's ratio" in row["quantity"] for row in timing.headlines(cfg))


def test_a_launcher_is_refused(cli):
    result = cli("run", "timing", *ARGS, "--launcher", "local", "--results-dir", cli.results)
    assert result.exit_code != 0 and "without --launcher" in result.output
