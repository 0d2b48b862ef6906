"""The drift ablation's Sigma-oracle, learning-rate and in-epoch paragraphs (drift/oracle_report.py and
templates/drift_oracle*.md.j2): each sentence states the numbers of its table of facts, and the readings
in the facts choose the sentence, not the words around them."""

import pandas as pd

from normprop_cli import config, prose
from normprop_cli.experiments.drift.oracle_report import note_facts


def oracle_setting(**changed) -> dict:
    """One Sigma-oracle setting's facts, as oracle_report.oracle_facts lists them."""
    facts = {
        "setting": "normprop-sigma-oracle", "label": "NormProp with the Sigma-oracle divisor", "lr": 0.05,
        "frozen": False, "every": 50, "held_out": 500, "reference": "NormProp",
        "divisor": {"ratio": 1.91, "reference_ratio": 1.87, "ci": "0.04 [-0.08, 0.16]", "divisor_ratio": 1.82,
                    "input_var": [0.96, 2.74, 47.24], "first_layer": 1, "last_layer": 9},
        "drift": 7.71, "reference_drift": 6.32, "ci": "1.39 [-2.88, 5.65]",
        "batchnorm": {"drift": 0.51, "ci": "7.20 [5.02, 9.37]"}, "verdict": "none",
        "gains": {"moved": "grows_against", "start": 0.85, "end": 1.09, "reference_start": 0.86, "reference_end": 0.83},
        "moments": {"own": {"mean": 1.76, "std": 2.92}, "reference": {"mean": 0.89, "std": 1.96},
                    "batchnorm": {"mean": 0.21, "std": 0.93}, "share": 40.0},
    }  # fmt: skip
    return facts | changed


def oracle(**changed) -> list[str]:
    return prose.render("drift_oracle", {"settings": [oracle_setting(**changed)]})


def test_the_oracle_paragraphs_state_their_facts_numbers():
    first, second = oracle()
    assert first.startswith("**Sigma-oracle.** NormProp with the Sigma-oracle divisor (`normprop-sigma-oracle`, rate")
    stated = ["rate 0.05", "500 held-out", "every 50 SGD", "1.91 against NormProp's 1.87", "averages 1.82",
              "from 0.96 at layer 1 to 47.24 at layer 9 (0.96, 2.74, 47.24)", "7.71 against NormProp's 6.32",
              "1.39 [-2.88, 5.65]", "BatchNorm's 0.51, 7.20 [5.02, 9.37]", "from 0.85 to 1.09",
              "0.86 to 0.83"]  # fmt: skip
    for number in stated:
        assert number in first, number
    assert "1.76" in second and "2.92" in second and "0.89 and 1.96" in second
    assert oracle(drift=9.99)[0] == first.replace("7.71 against", "9.99 against")
    assert oracle(held_out=200)[0] == first.replace("500 held-out", "200 held-out")


def test_the_verdict_chooses_the_sentence_and_what_the_moments_may_say():
    assert "does not reduce the drift beyond what these seeds resolve" in oracle()[0]
    assert "removes the drift" in oracle(verdict="removes")[0]
    assert "it increases it" in oracle(verdict="increases")[0]
    assert oracle()[1].startswith("With the drift not reduced by the oracle")
    reduced = oracle(verdict="reduces")[1]
    assert reduced.startswith("What the oracle leaves") and "That is 40% of NormProp's excess" in reduced
    assert "the learnt beta" in reduced and "the learnt beta" not in oracle(verdict="reduces", frozen=True)[1]
    no_excess = oracle(verdict="reduces", moments=oracle_setting()["moments"] | {"share": None})[1]
    assert "BatchNorm's 0.21 and 0.93" in no_excess and "That is" not in no_excess
    assert oracle(verdict="reduces", moments=oracle_setting()["moments"] | {"batchnorm": None})[1].endswith("1.96).")


def test_a_frozen_oracle_has_no_gain_and_names_what_enters_after_its_division():
    frozen = oracle(frozen=True, gains=None)[0]
    assert frozen.startswith("**Sigma-oracle, gamma and beta frozen.**")
    assert "after the division: 1 / f, the activation's" in frozen and "Its gamma" not in frozen
    assert "after the division: gamma / f, beta, the activation's" in oracle()[0]
    more = oracle_setting()["gains"] | {"moved": "grows_more"}
    assert "Its gamma grows more than NormProp's" in oracle(gains=more)[0]


def rate(**changed) -> str:
    rows = [
        {"scale": 0.5, "lr": 0.025, "drift": 4.12, "reading": "lower", "ci": "-2.20 [-3.10, -1.30]",
         "ratio": {"value": 1.7, "ci": "-0.17 [-0.21, -0.13]"}, "accuracy": None},
        {"scale": 2.0, "lr": 0.1, "drift": 8.54, "reading": "higher", "ci": "2.22 [1.01, 3.43]", "ratio": None,
         "accuracy": {"value": 85.01, "ci": "-1.54 [-6.52, 3.44]"}},
    ]  # fmt: skip
    facts = {"shown": True, "reference": "NormProp", "reference_lr": 0.05, "reference_drift": 6.32,
             "scales": rows, "finding": "follows", "ratio_follows": False, "resolved": [], "unresolved": [],
             "confounds": []}  # fmt: skip
    (text,) = prose.render("drift_oracle_rate", facts | changed)
    return text


def test_the_rate_sentence_states_each_rate_and_its_reading():
    text = rate()
    assert text.startswith("**The learning rate.** Against NormProp at its swept rate 0.05 (final average drift 6.32;")
    assert "at 0.5 times the rate (0.025) the final average drift is 4.12, a difference of -2.20 [-3.10, -1.30]" in text
    assert "(lower), the spread ratio 1.70 (-0.17 [-0.21, -0.13]); at 2 times" in text
    assert "(higher), the final test accuracy 85.01% (-1.54 [-6.52, 3.44] pp). The drift follows the rate" in text
    partly = rate(finding="partly", resolved=[{"scale": 0.5, "reading": "lower"}], unresolved=[2.0])
    assert "the drift is lower at 0.5 times the rate; at 2 times it cannot be told apart from" in partly
    assert rate(finding="unresolved").endswith("the rate is not shown to drive it.")
    assert "The spread ratio does follow it" in rate(finding="unresolved", ratio_follows=True)
    drift = {"name": "average drift", "ci": "-5.73 [-12.43, 0.96]", "reading": "cannot be told apart"}
    confound = {"lr": 0.025, "label": "NormProp without the Jacobian factor", "other": "NormProp at half its rate",
                "quantities": [drift], "ratio": {"ci": "-0.081 [-0.115, -0.047]", "reading": "lower"}}  # fmt: skip
    assert rate(confounds=[confound]).endswith(
        "At the same rate 0.025, NormProp without the Jacobian factor minus NormProp at half its rate: average drift "
        "-5.73 [-12.43, 0.96] (cannot be told apart); spread ratio -0.081 [-0.115, -0.047] (lower): what that "
        "ablation changes apart from its rate."
    )
    assert prose.render("drift_oracle_rate", {"shown": False}) == []


def test_the_in_epoch_paragraph_states_each_curve_in_order():
    curves = [{"label": "NormProp", "ratio": [1.0, 1.5, 1.75], "drift": [0.0, 2.5, 4.25]},
              {"label": "BatchNorm", "ratio": [1.0, 1.25, 1.5], "drift": []}]  # fmt: skip
    facts = {"shown": True, "every": 40, "epochs": ["0", "0.5", "1"], "curves": curves, "first": None, "again": []}
    (text,) = prose.render("drift_oracle_steps", facts)
    assert text.startswith("**Inside epoch 1.** The probes every 40 SGD steps of the first epoch")
    assert text.endswith(
        "at epochs 0, 0.5, 1, means over layers and seeds: NormProp: ratio 1.00, 1.50, 1.75; average drift "
        "0.00, 2.50, 4.25; BatchNorm: ratio 1.00, 1.25, 1.50."
    )
    cell = {"value": 0.93, "ci": "-5.67 [-11.91, 0.57]", "reading": "cannot be told apart"}
    setting = {"label": "BatchNorm", "quantities": [{"name": "average drift"} | cell], "ratio": cell}
    first = {"step": 40, "reference": "NormProp", "reference_moments": [6.6, 1.06, 2.0], "reference_ratio": 1.71,
             "settings": [setting]}  # fmt: skip
    (text,) = prose.render("drift_oracle_steps", facts | {"first": first})
    assert "After the first 40 steps, each setting's value and its difference from NormProp's (average drift, " in text
    assert "std 6.60, 1.06, 2.00, ratio 1.71; Welch 95% over seeds): BatchNorm: average drift 0.93, -5.67" in text
    assert text.endswith("ratio 0.93, -5.67 [-11.91, 0.57] (cannot be told apart).")


def test_the_note_names_each_oracle_that_reduces_the_drift_or_where_its_mean_ends():
    facts = {"shown": True, "reduced": [{"label": "A", "ci": "-1.00 [-2.00, -0.10]"}, {"label": "B", "ci": "-0.5"}],
             "further": False, "means": [], "reference_mean": None, "mean_no_better": False}  # fmt: skip
    assert prose.render("drift_oracle_note", facts) == [
        "A division that sees the input covariance reduces it: A (-1.00 [-2.00, -0.10]); B (-0.5) (the Sigma-oracle "
        "paragraph below)."
    ]
    (none,) = prose.render("drift_oracle_note", facts | {"reduced": []})
    assert none.endswith("does not reduce the final drift (the Sigma-oracle paragraphs below).")
    further = facts | {"reduced": [], "further": True, "reference_mean": 0.89,
                       "means": [{"label": "A", "value": 1.76, "ci": "0.86 [0.09, 1.64]"}]}  # fmt: skip
    (text,) = prose.render("drift_oracle_note", further)
    assert "(average |mean| A 1.76, 0.86 [0.09, 1.64], against 0.89)" in text and text.endswith("(Remark 1).")
    (tested,) = prose.render("drift_oracle_note", further | {"mean_no_better": True})
    assert tested.endswith("do not reduce the drift either (the decomposition and the rule below).")
    assert prose.render("drift_oracle_note", {"shown": False}) == []


def test_the_note_says_taking_the_mean_away_reduces_no_drift_only_where_no_such_setting_reduces_it():
    cfg = config.load("drift", preset="fashion")
    settings = ["normprop", "normprop-sigma-oracle", "normprop-centred", "normprop-mean-oracle"]
    by = pd.DataFrame({"label": settings, "method": "normprop", "width": 0.25}, index=settings)

    def comparisons(centred_drift: str) -> pd.DataFrame:
        readings = {"normprop-sigma-oracle": ("increases", "increases"),
                    "normprop-centred": (centred_drift, "increases"),
                    "normprop-mean-oracle": ("increases", "increases")}  # fmt: skip
        return pd.DataFrame([
            {"setting": k, "quantity": q, "value": 1.0, "reference_value": 0.5, "diff": 0.5, "low": 0.1, "high": 0.9,
             "reading": r}
            for k, (drift, mean) in readings.items() for q, r in (("avg_drift", drift), ("avg_abs_mean", mean))
        ])  # fmt: skip

    assert note_facts(cfg, by, comparisons("increases"))["mean_no_better"]
    assert note_facts(cfg, by, comparisons("cannot be told apart"))["mean_no_better"]
    assert not note_facts(cfg, by, comparisons("reduces"))["mean_no_better"]
    assert not note_facts(cfg, by.drop(index=["normprop-centred", "normprop-mean-oracle"]), comparisons("increases"))[
        "mean_no_better"
    ]  # no setting takes the mean away
