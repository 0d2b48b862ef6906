"""The normalizers section's sentences state its table of facts (facts.py): a number changed in the facts
changes the sentence that states it, and each reading the prose branches on comes from the facts."""

import math

import pandas as pd
import pytest
from omegaconf import open_dict

from normprop_cli import config, outcomes, prose, statistics
from normprop_cli.experiments.normalizers import facts, findings, table
from normprop_cli.experiments.tables import write
from normprop_cli.statistics import format_ci


def comparisons(diffs: dict, mdd: dict | None = None) -> pd.DataFrame:
    """One batch size's rows of normalizers.csv: {method: (diff, low, high)} beside the reference."""
    rows = [{"normalizer": "normprop-icml", "final_acc": 80.0, "diff_vs_reference": math.nan, "diff_low": math.nan,
             "diff_high": math.nan, "reading": "reference", "mdd": math.nan}]  # fmt: skip
    for method, (d, low, high) in diffs.items():
        reading = "better" if low > 0 else "worse" if high < 0 else "indistinguishable"
        rows.append({"normalizer": method, "final_acc": 80.0 + d, "diff_vs_reference": d, "diff_low": low,
                     "diff_high": high, "reading": reading, "mdd": (mdd or {}).get(method, math.nan)})  # fmt: skip
    return pd.DataFrame(rows)


def test_the_finding_states_each_difference_and_the_range_of_the_mdds():
    g = comparisons({"groupnorm": (4.0, 1.5, 6.5), "layernorm": (-9.0, -12.0, -6.0), "batchnorm": (0.5, -2.0, 3.0)},
                    mdd={"groupnorm": 3.25, "layernorm": 7.5, "batchnorm": 4.0})  # fmt: skip
    text = findings._finding(g, 10, "NormProp", "normprop-icml")
    assert text.startswith(f"At batch 10, GroupNorm ({format_ci(4.0, 1.5, 6.5)} pp) beat NormProp")
    assert "ranges from 3.25 pp (GroupNorm) to 7.50 pp (LayerNorm)" in text
    assert f"LayerNorm ({format_ci(-9.0, -12.0, -6.0)} pp) is worse" in text
    assert "BatchNorm cannot be told apart from it" in text and text.endswith(".")
    g.loc[g["normalizer"] == "groupnorm", ["diff_vs_reference", "diff_low", "diff_high", "mdd"]] = [5.0, 2.0, 8.0, 9.0]
    moved = findings._finding(g, 10, "NormProp", "normprop-icml")
    assert f"GroupNorm ({format_ci(5.0, 2.0, 8.0)} pp)" in moved and "to 9.00 pp (GroupNorm)" in moved
    one = comparisons({"groupnorm": (0.5, -2.0, 3.0)}, mdd={"groupnorm": 4.0})
    assert "(MDD) is 4.00 pp (GroupNorm)" in findings._finding(one, 1, "NormProp", "normprop-icml")


def test_the_correction_states_the_family_its_level_and_the_power_from_the_facts():
    found = {"ref": "NormProp", "k": 7, "level": 99.2857, "uniform": False, "confidence": 90.0, "alpha": 0.1,
             "power": 0.9, "power_pct": 90.0, "bounds": (-100.0, 100.0),
             "per_batch": [{"batch": 1, "n": 4}, {"batch": 10, "n": 3}]}  # fmt: skip
    (text,) = prose.render("normalizers_correction", found)
    assert "over the 7 comparisons with NormProp in the table (4 at batch 1, 3 at batch 10)" in text
    assert "1 - 0.1/7 = 99.29%" in text and "at least 90% confidence" in text
    assert "with 90% power" in text and "(t(1 - 0.1/(2 x 7)) + t(0.9))" in text
    even = [{"batch": 1, "n": 4}, {"batch": 10, "n": 4}]
    (uniform,) = prose.render("normalizers_correction", found | {"k": 8, "uniform": True, "per_batch": even})
    assert "over the 8 comparisons with NormProp in the table (4 methods x 2 batch sizes)" in uniform
    (none,) = prose.render("normalizers_correction", found | {"k": 0})
    assert none.startswith("No method has 2 runs or more beside 2 or more of NormProp's")


@pytest.mark.parametrize(
    "train, evaluation, said",
    [
        (True, True, "learns in both modes (mean final accuracy above"),
        (True, False, "learns in training mode and fails in evaluation"),
        (False, True, "fails in training mode and learns in evaluation"),
    ],
)
def test_the_modes_reading_follows_each_modes_accuracy_against_chance_and_the_margin(train, evaluation, said):
    cfg = config.load("normalizers", preset="smoke")
    bar = 100.0 / int(cfg.dataset.num_classes) + outcomes.LEARNED_MARGIN
    row = pd.Series({"train_mode_acc": bar + (1 if train else 0), "eval_mode_acc": bar + (1 if evaluation else 0)})
    text = facts.modes(row, cfg)
    assert text.startswith(said)
    assert f"chance + {outcomes.LEARNED_MARGIN:g} points; chance is {100 / int(cfg.dataset.num_classes):g}%" in text


def test_the_headlines_state_the_best_methods_interval_and_the_references_rank(tmp_path):
    cfg = config.load("normalizers", preset="smoke", results_dir=tmp_path)
    rows = [{"run": f"{m}-b1-s{s}", "setting": f"{m}-b1", "normalizer": m, "batch_size": 1, "initial_lr": 0.01,
             "status": "complete", "learned": True, "final_test_acc": acc + s, "best_val_test_acc": acc + s,
             "step_ms": 1.0, "drift": 0.5}
            for m, acc in (("normprop-icml", 70.0), ("groupnorm", 80.0), ("layernorm", 60.0))
            for s in range(3)]  # fmt: skip
    summary = pd.DataFrame(rows)
    write(cfg, "summary", summary)
    t = table(cfg, summary)
    write(cfg, "normalizers", t)
    top = t.iloc[0]
    (best,) = [r for r in findings.headlines(cfg) if "best final test accuracy" in r["quantity"]]
    assert best["quantity"] == f"batch 1: best final test accuracy (%) [{100 * statistics.LEVEL:g}% CI, n = 3]"
    assert best["reproduced"] == (f"GroupNorm {format_ci(*facts.ci(top, 'final'))}; NormProp (ICML) ranks 2 of 3")


def test_the_training_paragraph_states_the_configs_renorm_schedule_and_decay():
    cfg = config.load("normalizers", preset="smoke")
    with open_dict(cfg):
        cfg.experiment.methods = ["batchrenorm", "normprop-icml"]
        cfg.model.classifier, cfg.train.decay, cfg.train.weight_decay = "plain", "weights", 0.0125
        cfg.model.renorm.update(warmup_epochs=1.5, rmax=3, rmax_epochs=6, dmax=5, dmax_epochs=4)
    text = findings.training_details(cfg)
    assert text.startswith("*Training.* Every method ends in the same classifier") and text.endswith("].")
    assert "weight decay 0.0125 applies" in text and "for the first 1.5 epoch(s)" in text
    assert "to rmax = 3 at epoch 6 and dmax = 5 at epoch 4" in text
    with open_dict(cfg):
        cfg.model.classifier, cfg.train.decay, cfg.experiment.methods = "own", "all", ["normprop-icml"]
    assert findings.training_details(cfg) == ""
