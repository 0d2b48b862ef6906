"""The README's findings: each claim from its strongest evidence (gpu, fashion, cpu, quick; a preset that
did not measure a claim gives way to the next), and one sentence per verdict from a template per kind of
test, which for an equivalence claim never reads a large effect as favouring the paper."""

from pathlib import Path

import pandas as pd

from normprop_cli import readme, verdicts

CLAIMS = {c.id: c for c in verdicts.claims()}


def row(claim, verdict, effect=0.5, low=0.2, high=0.8, preset="fashion", halves="agree", margin=1.0, budget=None):
    budget = budget or f"fashion-mnist, {preset}, 8 epochs, 6 seeds, width 0.25, cpu"
    return dict(dataset="fashion-mnist", preset=preset, claim=claim, verdict=verdict, effect=effect, ci_low=low,
                ci_high=high, halves=halves, margin=margin, budget=budget, n_seeds=6)  # fmt: skip


def tree(preset, *rows):
    return readme.Tree(Path(preset), pd.DataFrame(list(rows)))


def test_each_claim_takes_its_strongest_measured_evidence():
    quick = tree("quick", row("C5", "inconclusive", preset="quick"), row("C6", "reproduced", preset="quick"))
    fashion = tree("fashion", row("C5", "not reproduced"), row("C6", "not measured", effect=None))
    gpu = tree("gpu", row("C5", "not measured", preset="gpu", effect=None), row("C6", "reproduced", preset="gpu"))
    best = readme.strongest([quick, fashion, gpu])
    assert best["C5"][0] is fashion  # the gpu preset did not measure it: the next strongest
    assert best["C6"][0] is gpu
    assert readme.found(best) == "Reproduced: C6. Not reproduced: C5."


def test_an_equivalence_claim_not_reproduced_says_a_difference_either_way_counts_against_it():
    text = readme.meaning(row("C4", "not reproduced", effect=4.67, low=3.27, high=6.06, margin=1.85), CLAIMS["C4"])
    assert "differ by more than ±1.85 pp" in text and "above it" in text and "whichever is better" in text
    assert "favours" not in text
    ok = readme.meaning(row("C1", "reproduced", effect=0.01, low=-0.6, high=0.63, margin=1.35), CLAIMS["C1"])
    assert ok.startswith("Supported") and "within ±1.35 pp" in ok and "90%" in ok


def test_an_inconclusive_verdict_says_why():
    halves = row("C3", "inconclusive", effect=-2.2, low=-7.7, high=-0.2, halves="estimates on opposite sides of 0")
    assert "halves of the seeds point different ways" in readme.meaning(halves, CLAIMS["C3"])
    straddles = readme.meaning(row("C5", "inconclusive", effect=-0.5, low=-1.5, high=0.5, margin=1.1), CLAIMS["C5"])
    assert "includes -1.10 pp" in straddles
    assert "no interval" in readme.meaning(row("C8", "inconclusive", effect=None, low=None, high=None), CLAIMS["C8"])


def test_a_ratio_effect_gives_its_unit_and_the_ratio():
    r = row("C6", "reproduced", effect=0.078, low=0.071, high=0.086)
    assert readme.effect_text(r, CLAIMS["C6"]) == "0.078 [0.071, 0.086] (1 − ratio)"
    assert "NormProp over the baseline: 0.92 [0.91, 0.93]" in readme.meaning(r, CLAIMS["C6"])


def test_the_evidence_names_the_preset_data_width_and_device(tmp_path):
    t = readme.Tree(tmp_path, pd.DataFrame([row("C5", "not reproduced")]))
    t = readme.Tree(tmp_path, t.frame.assign(preset="fashion"))
    text = readme.evidence(t, t.rows()[0], CLAIMS["C5"])
    assert text == "fashion: Fashion-MNIST, width 0.25, 6 seeds, 8 epochs, CPU"


def test_a_fragile_verdict_says_so():
    r = row("C5", "not reproduced", effect=-1.46, low=-1.8, high=-1.11, margin=1.1) | {
        "loso_flips": 4,
        "settled": False,
    }
    text = readme.meaning(r, CLAIMS["C5"])
    assert "fragile: leaving one seed out changes the verdict in 4 of 6 cases" in text
    assert "changed over the last quarter" in text
    firm = row("C5", "not reproduced", effect=-1.46, low=-1.8, high=-1.11, margin=1.1) | {
        "loso_flips": 0,
        "settled": True,
    }
    assert "fragile" not in readme.meaning(firm, CLAIMS["C5"])
