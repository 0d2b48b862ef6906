"""Each claim's measurement on CSVs written by hand: C2 in the N(0,1) units of the paper, C3 on the
logit of the error, C4 at equal epochs with equal updates beside it, the reference error behind a
relative margin, and diverged runs counted apart instead of averaged in."""

import math

import numpy as np
import pandas as pd
import pytest

from normprop_cli.verdicts import claims
from normprop_cli.verdicts.measures import MEASURES, logit_error

CLAIMS = {c.id: c for c in claims()}


def measure(claim: str, sweep, prov=None):
    return MEASURES[claim](CLAIMS[claim], sweep, prov or {})


def test_c2_compares_the_deviation_from_n01_not_a_drift_in_method_dependent_units(tmp_path):
    rows = []
    for seed in range(3):
        for method, deviation, drift in (("normprop", 0.2 + seed / 100, 40.0), ("batchnorm", 0.5, 1.0)):
            for layer in (2, 3):
                for epoch in (0, 1, 2):
                    rows.append({"run": f"{method}-s{seed}", "method": method, "seed": seed, "layer": layer,
                                 "epoch": epoch, "avg_deviation": deviation if epoch == 2 else 9.0,
                                 "avg_shift": 0.01, "avg_drift": drift})  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "population.csv", index=False)
    m = measure("C2", tmp_path)
    table = m.table.sort_values("seed")
    np.testing.assert_allclose(table["normprop"], [0.20, 0.21, 0.22])  # the final epoch, mean over layers
    np.testing.assert_allclose(table["baseline"], [0.5, 0.5, 0.5])
    assert m.estimate(m.table).effect == pytest.approx(0.5 - 0.21)  # BatchNorm minus NormProp: positive
    assert any("initial std" in n for n in m.notes)  # the old drift is a note, not the effect


def test_c3_measures_the_spread_of_the_logit_of_the_error(tmp_path):
    assert logit_error(pd.Series([90.0])).iloc[0] == pytest.approx(math.log(0.1 / 0.9))
    assert np.isfinite(logit_error(pd.Series([100.0, 0.0]))).all()  # clipped, never infinite
    rows = []
    for seed in range(4):
        for epoch in (1, 2, 3, 4):
            # NormProp: errors 20% x (1 + 0.1 s); BN: 10% x (1 + 0.1 s): the same relative spread
            rows.append({"method": "normprop", "seed": seed, "epoch": epoch, "test_acc": 100 - 20 * (1 + 0.1 * seed)})
            rows.append({"method": "batchnorm", "seed": seed, "epoch": epoch, "test_acc": 100 - 10 * (1 + 0.1 * seed)})
    pd.DataFrame(rows).to_csv(tmp_path / "epochs.csv", index=False)
    m = measure("C3", tmp_path)
    e = m.estimate(m.table)
    # on the accuracy scale NormProp's sd is twice BatchNorm's (effect 1 - 2 = -1); on the logit scale
    # they are close: the effect, 1 - NormProp's sd / BatchNorm's, is near 0
    assert abs(e.effect) < 0.25
    expected = logit_error(pd.Series([100 - 20 * (1 + 0.1 * s) for s in range(4)])).std(ddof=1)
    assert e.normprop == pytest.approx(expected)


def batch_rows():
    rows = []
    for seed in range(4):
        for setting, batch, updates, acc in (
            ("normprop-b1", 1, 80_000, 90.0 + seed / 10),
            ("normprop-b1-updates", 1, 1_600, 80.0 + seed / 10),
            ("normprop-b50", 50, 1_600, 89.0 + seed / 5),
        ):
            rows.append({"run": f"{setting}-s{seed}", "setting": setting, "method": "normprop", "seed": seed,
                         "batch_size": batch, "updates": updates, "final_test_acc": acc,
                         "status": "complete"})  # fmt: skip
    return rows


def test_c4_pairs_batch_1_at_equal_epochs_and_reports_equal_updates_beside_it(tmp_path):
    pd.DataFrame(batch_rows()).to_csv(tmp_path / "summary.csv", index=False)
    m = measure("C4", tmp_path)
    table = m.table.sort_values("seed")
    np.testing.assert_allclose(table["normprop"], [90.0, 90.1, 90.2, 90.3])  # normprop-b1, not the capped one
    assert m.reference == pytest.approx(100 - np.mean([89.0 + s / 5 for s in range(4)]))
    equal = [n for n in m.notes if n.startswith("at equal updates")]
    assert equal and "normprop-b1-updates" in equal[0] and "-9.30" in equal[0]  # 80.15 - 89.30 + ...


def test_diverged_runs_are_counted_apart_and_left_out_of_the_effect(tmp_path):
    rows = batch_rows()
    rows[0] |= {"status": "diverged", "final_test_acc": 10.0}  # normprop-b1, seed 0
    pd.DataFrame(rows).to_csv(tmp_path / "summary.csv", index=False)
    m = measure("C4", tmp_path)
    assert 0 not in set(m.table["seed"]) and len(m.table) == 3
    assert any("1 of 12 runs diverged" in n for n in m.notes)


def test_c5_reference_is_batchnorms_error(tmp_path):
    methods = (("normprop", 11.0), ("batchnorm", 10.0))
    rows = [{"run": f"{m}-s{s}", "setting": m, "method": m, "augment": "none", "seed": s, "status": "complete",
             "final_test_error": err + s / 10} for s in range(3) for m, err in methods]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "summary.csv", index=False)
    m = measure("C5", tmp_path)
    assert m.reference == pytest.approx(10.1)
    assert m.estimate(m.table).effect == pytest.approx(-1.0)  # BatchNorm minus NormProp


def test_c5_notes_the_gap_after_every_epoch_from_the_runs_metrics(tmp_path):
    rows = []
    for s in range(2):
        for m, errors in (("normprop", [30.0, 12.0, 11.0]), ("batchnorm", [20.0, 11.0, 10.5])):
            run = f"{m}-s{s}"
            rows.append({"run": run, "setting": m, "method": m, "augment": "none", "seed": s, "status": "complete",
                         "final_test_error": errors[-1]})  # fmt: skip
            (tmp_path / "runs" / run).mkdir(parents=True)
            metrics = pd.DataFrame({"epoch": [1, 2, 3], "test_acc": [100.0 - e for e in errors]})
            metrics.to_csv(tmp_path / "runs" / run / "metrics.csv", index=False)
    pd.DataFrame(rows).to_csv(tmp_path / "summary.csv", index=False)
    m = measure("C5", tmp_path)
    assert "the effect after each epoch (mean over seeds): 1: -10.00, 2: -1.00, 3: -0.50" in m.notes


def write_metrics(sweep, run, accuracies):
    (sweep / "runs" / run).mkdir(parents=True)
    pd.DataFrame({"epoch": range(1, len(accuracies) + 1), "test_acc": accuracies}).to_csv(
        sweep / "runs" / run / "metrics.csv", index=False
    )


def test_c4_notes_its_effect_after_every_epoch_at_equal_epochs(tmp_path):
    """Batch 1 minus batch 50 after each epoch, from the equal-epochs runs (the capped setting apart):
    a gap that closes as batch 50 converges shows in the note, not only in the final number."""
    for row in batch_rows():
        curve = {"normprop-b1": [85.0, 89.0, 90.0], "normprop-b50": [70.0, 85.0, 89.0]}.get(row["setting"])
        write_metrics(tmp_path, row["run"], curve or [50.0, 60.0, 70.0])
    pd.DataFrame(batch_rows()).to_csv(tmp_path / "summary.csv", index=False)
    m = measure("C4", tmp_path)
    assert "the effect after each epoch (mean over seeds): 1: +15.00, 2: +4.00, 3: +1.00" in m.notes


def test_c1_notes_its_effect_after_every_epoch_averaged_over_batch_sizes(tmp_path):
    rows = []
    for seed in range(3):
        for norm, size, curve in (("global", 50, [80.0, 90.0]), ("batch", 50, [78.0, 89.0]),
                                  ("global", 100, [70.0, 88.0]), ("batch", 100, [70.0, 88.0])):  # fmt: skip
            run = f"{norm}-b{size}-s{seed}"
            rows.append({"run": run, "setting": f"{norm}-b{size}", "seed": seed, "data_norm": norm,
                         "batch_size": size, "final_test_acc": curve[-1], "status": "complete"})  # fmt: skip
            write_metrics(tmp_path, run, curve)
    pd.DataFrame(rows).to_csv(tmp_path / "summary.csv", index=False)
    m = measure("C1", tmp_path)
    assert "the effect after each epoch (mean over seeds): 1: +1.00, 2: +0.50" in m.notes
