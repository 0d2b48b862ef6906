"""`normprop report`: the verdicts first, then every experiment listed, figures and headline numbers
beside the paper's, for the results tree and any nested one (results/cpu/)."""

import dataclasses
import shutil
from pathlib import Path

import pandas as pd

from normprop_cli import report, smoke, verdicts
from normprop_cli.experiments import EXPERIMENTS
from normprop_cli.verdicts import INCONCLUSIVE, NOT_MEASURED, NOT_REPRODUCED, REPRODUCED

TABLE_HEAD = (
    "| claim | verdict | effect [interval] | n seeds | kind, level: threshold | halves a / b | robustness | test "
    "| budget |"
)


def test_report_renders_with_experiments_missing_and_names_them(cli, trained):
    trained(cli.results, "table1", "--preset", "smoke", "--quiet", "train.epochs=1")
    result = cli("report", "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    report_md = (cli.results / "REPORT.md").read_text()
    missing = [e for e in EXPERIMENTS if e != "table1"]
    assert f"Missing experiments: {', '.join(missing)}." in report_md
    for experiment in missing:  # the command that fills the gap, with the tree's preset and results directory
        assert f"`normprop run {experiment} --preset smoke --results-dir {cli.results}` produces it" in report_md
    assert "![table1 table1](table1/synthetic/table1.png)" in report_md
    assert "test error %" in report_md and "(normprop, augmentation none" in report_md
    assert "preset **smoke**" in report_md and "device cpu" in report_md
    # The departures from the paper's protocol are said in plain sentences.
    assert "Data set: synthetic, not the paper's cifar10 / cifar100 / svhn" in report_md
    assert "Epochs: 1 per run, the paper's protocol has 200." in report_md
    assert "Only 64 examples per split were used." in report_md


def test_report_opens_with_the_verdicts_and_covers_a_nested_cpu_tree(cli, trained, monkeypatch):
    trained(cli.results, "table1", "--preset", "smoke", "--quiet", "train.epochs=1")
    shutil.copytree(cli.results / "table1", cli.results / "cpu" / "table1")  # a second tree, one level down
    found = dataclasses.replace(EXPERIMENTS["table1"], paragraphs=lambda cfg: ["A finding in words."])
    monkeypatch.setitem(EXPERIMENTS, "table1", found)
    assert cli("report", "--results-dir", cli.results).exit_code == 0
    text = (cli.results / "REPORT.md").read_text()
    lines = text.splitlines()
    # "## Verdicts" is the first section: one table with a column per tree, the sentence on the data
    # sets, then each tree's table in full, then the rule, then the experiments
    assert [line for line in lines if line.startswith("## ")][0] == "## Verdicts"
    start = lines.index("## Verdicts")
    assert lines[start + 2] == "| claim | smoke (synthetic, `./`) | smoke (synthetic, `cpu/`) |"
    c5_cells = next(line for line in lines[start:] if line.startswith("| C5: ")).strip("| ").split(" | ")[1:]
    assert len(c5_cells) == 2 and all(
        c.startswith("**inconclusive** ") and c.endswith(", n=1 (no halves)") for c in c5_cells
    )
    sentence = lines.index("No conclusive verdicts disagree between the data sets (synthetic).")
    assert start < sentence < lines.index("### smoke preset (`verdicts.csv`)")
    assert lines.index("### smoke preset (`verdicts.csv`)") < lines.index("### smoke preset (`cpu/verdicts.csv`)")
    assert text.count(TABLE_HEAD) == 2
    assert text.index("### How a verdict is reached") < text.index("## table1")
    from normprop_cli.verdicts.budget_text import methods_text

    assert methods_text(verdicts.rule_text()) in text
    assert "fixed before the results they judge" not in text  # the ledger says, per claim, which came first
    c5 = next(c for c in verdicts.claims() if c.id == "C5")
    assert f"| C5: {c5.claim} ({c5.source}) | **inconclusive** |" in text  # one seed: no interval
    assert (
        f"| C2: {next(c.claim for c in verdicts.claims() if c.id == 'C2')} (Fig. 2, 5.2) | **not measured** |" in text
    )
    assert f"| C8: {next(c.claim for c in verdicts.claims() if c.id == 'C8')} (4.6) | **not measured** |" in text
    # verdicts.csv in each tree, one row per claim
    for tree in (cli.results, cli.results / "cpu"):
        frame = pd.read_csv(tree / "verdicts.csv")
        assert list(frame.columns) == verdicts.COLUMNS
        assert list(frame["claim"]) == [f"C{i}" for i in range(1, 9)]
        assert frame.set_index("claim").loc["C5", "n_seeds"] == 1
        assert frame.set_index("claim").loc["C5", "halves"] == verdicts.NO_HALVES
        assert frame.set_index("claim").loc["C5", "margin"] > 0  # 0.1 of BatchNorm's test error
    # the nested tree's sections come after the top-level ones, its figures linked from results/
    assert "# smoke preset (`cpu/`)" in lines
    assert lines.index("# smoke preset (`cpu/`)") > lines.index("## table1 — Table 1, section 5.5")
    assert "![table1 table1](cpu/table1/synthetic/table1.png)" in text
    assert text.count("A finding in words.") == 2  # a runner's paragraphs(cfg), after its headline table


def test_report_names_digits_translations_as_a_departure():
    assert report.augmentation("digits", "translate") == [
        "Augmentation: small random translations, not the paper's horizontal flips (digits are not mirror-symmetric)."
    ]
    assert report.augmentation("cifar10", "flip") == [] and report.augmentation("digits", None) == []


def test_report_of_an_empty_results_directory_lists_everything_missing(cli):
    result = cli("report", "--results-dir", cli.results)
    assert result.exit_code == 0
    text = (cli.results / "REPORT.md").read_text()
    assert f"Missing experiments: {', '.join(EXPERIMENTS)}." in text
    assert "## Verdicts" in text and text.count("| **not measured** |") == 8


def made_up(preset: str, dataset: str, verdict_of: dict[str, str]) -> pd.DataFrame:
    """A verdict table: the claims in verdict_of measured on `dataset` (0.50 [0.20, 0.80], 6 seeds,
    halves reproduced / inconclusive), the others not measured."""
    rows = []
    for c in verdicts.claims():
        v = verdict_of.get(c.id, NOT_MEASURED)
        row = {"dataset": "", "preset": preset, "claim": c.id, "experiment": c.experiment, "verdict": v}
        if v != NOT_MEASURED:
            row |= {"dataset": dataset, "effect": 0.5, "ci_low": 0.2, "ci_high": 0.8, "n_seeds": 6, "margin": 1.0,
                    "verdict_half_a": REPRODUCED, "verdict_half_b": INCONCLUSIVE, "halves": verdicts.AGREE}  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows).reindex(columns=verdicts.COLUMNS).astype({"n_seeds": "Int64"})


def test_the_verdicts_table_has_a_column_per_preset_and_says_where_the_data_sets_disagree():
    root = Path("results")
    quick = report.Tree(
        root, made_up("quick", "digits", {"C1": REPRODUCED, "C4": NOT_REPRODUCED, "C5": NOT_REPRODUCED})
    )
    cpu = report.Tree(root / "cpu", made_up("cpu", "digits", {"C4": INCONCLUSIVE}))
    fashion = report.Tree(
        root / "fashion", made_up("fashion", "fashion-mnist", {"C4": REPRODUCED, "C5": NOT_REPRODUCED})
    )
    other = report.Tree(root / "a-paper-run", made_up("paper", "cifar10", {}))
    trees = report.ordered([fashion, other, cpu, quick], root)
    assert [t.path.name for t in trees] == ["results", "cpu", "fashion", "a-paper-run"]  # then the others by name
    lines = report.summary_table(trees, root)
    assert lines[0] == "| claim | quick (digits) | cpu (digits) | fashion (fashion-mnist) | paper |"
    c1 = next(line for line in lines if line.startswith("| C1: "))
    assert c1.endswith(
        "| **reproduced** 0.50 [0.20, 0.80] pp, n=6 (halves: reproduced / inconclusive) | not measured "
        "| not measured | not measured |"
    )
    assert len(lines) == 2 + 8 + 1 and lines[-1] == ""
    # C4: conclusive and different on digits and on fashion-mnist; C5: the same on both
    assert report.disagreements(trees) == (
        "The data sets disagree on C4 (digits: not reproduced; fashion-mnist: reproduced)."
    )
    cpu = report.Tree(root / "cpu", made_up("cpu", "digits", {"C4": NOT_REPRODUCED, "C1": NOT_REPRODUCED}))
    assert report.disagreements([quick, cpu, fashion]) == (
        "The data sets disagree on C4 (digits (quick): not reproduced; digits (cpu): not reproduced; "
        "fashion-mnist: reproduced)."
    )  # C1 differs between two presets on the same data set: not a data set's disagreement
    fashion = report.Tree(root / "fashion", made_up("fashion", "fashion-mnist", {"C4": INCONCLUSIVE}))
    assert report.disagreements([quick, fashion]) == (
        "No conclusive verdicts disagree between the data sets (digits, fashion-mnist)."
    )


def test_where_the_data_sets_disagree_the_effect_after_each_epoch_of_each_preset_follows():
    root = Path("results")
    quick = made_up("quick", "digits", {"C4": NOT_REPRODUCED, "C5": NOT_REPRODUCED}).astype({"note": object})
    quick.loc[quick["claim"] == "C4", "note"] = (
        "margin 1 pp; the effect after each epoch (mean over seeds): 1: +9.00, 2: +4.00; x"
    )
    quick.loc[quick["claim"] == "C5", "note"] = "the effect after each epoch (mean over seeds): 1: -2.00"
    fashion = made_up("fashion", "fashion-mnist", {"C4": REPRODUCED, "C5": NOT_REPRODUCED}).astype({"note": object})
    fashion.loc[fashion["claim"] == "C4", "note"] = "the effect after each epoch (mean over seeds): 1: +3.00, 2: +1.00"
    trees = [report.Tree(root, quick), report.Tree(root / "fashion", fashion)]
    assert report.disagreement_epochs(trees, root) == [  # C4 only: C5 is not reproduced on both
        "- C4, the effect after each epoch (pp): quick (digits): 1: +9.00, 2: +4.00; "
        "fashion (fashion-mnist): 1: +3.00, 2: +1.00.",
        "",
    ]
    assert report.disagreement_epochs(trees[1:], root) == []


def test_each_presets_full_table_shows_the_kind_level_margin_and_halves():
    frame = made_up("quick", "digits", {"C1": REPRODUCED, "C5": NOT_REPRODUCED, "C6": REPRODUCED})
    frame.loc[frame["claim"] == "C5", "halves"] = "estimates on opposite sides of -1 pp"
    lines = report.verdict_table(frame)
    assert lines[0] == TABLE_HEAD
    row = {line.split(":")[0].strip("| "): line for line in lines if line.startswith("| C")}
    assert "| equivalence, 90%: ±1 pp | reproduced / inconclusive |" in row["C1"]
    assert (
        "| non-inferiority, 95%: -1 pp | reproduced / inconclusive, estimates on opposite sides of -1 pp |" in row["C5"]
    )
    assert "| superiority, 95%: 0 |" in row["C6"]
    assert "| **not measured** | — | — | — | — |" in row["C2"]


def test_smoke_results_have_a_tree_of_their_own_that_the_report_of_results_leaves_out(cli, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the presets' own results directories are relative: results/smoke here
    grid = "grid=[{id: a, set: {model.norm: normprop}}, {id: b, set: {model.norm: batchnorm}}]"
    assert cli("run", "table1", "--preset", "smoke", "--quiet", "train.epochs=1", grid).exit_code == 0
    assert (tmp_path / "results" / "smoke" / "table1" / "synthetic" / "summary.csv").exists()
    assert not (tmp_path / "results" / "table1").exists()
    assert cli("report").exit_code == 0
    text = (tmp_path / "results" / "REPORT.md").read_text()
    assert "Left out: `smoke/`, smoke-preset results (synthetic images, for tests); `normprop report --preset smoke` " \
           "reports them alone." in text  # fmt: skip
    assert "synthetic" not in text.replace("synthetic images", "") and "smoke (" not in text
    assert "| C5: " in text and text.count("| not measured |") == 8  # no verdict from the smoke run
    assert not (tmp_path / "results" / "smoke" / "verdicts.csv").exists()
    # the smoke results' own report has them
    assert cli("report", "--preset", "smoke").exit_code == 0
    own = (tmp_path / "results" / "smoke" / "REPORT.md").read_text()
    assert "Left out" not in own and "| claim | smoke (synthetic) |" in own and "**inconclusive**" in own


def test_a_smoke_sweep_inside_a_real_tree_gives_none_of_its_verdicts():
    root = Path("results")
    quick = made_up("quick", "digits", {"C1": REPRODUCED})
    synthetic = made_up("smoke", "synthetic", {"C1": NOT_REPRODUCED, "C5": INCONCLUSIVE})
    frame = pd.concat([quick[quick["claim"] != "C5"], synthetic[synthetic["claim"].isin(["C1", "C5"])]])
    frame = frame.sort_values("claim", kind="stable").reset_index(drop=True)
    [tree], notes = smoke.leave_out([report.Tree(root, frame)], root)
    assert tree.preset == "quick" and list(tree.frame["claim"]) == [f"C{i}" for i in range(1, 9)]
    rows = tree.frame.set_index("claim")
    assert rows.loc["C1", "dataset"] == "digits" and rows.loc["C1", "verdict"] == REPRODUCED
    assert rows.loc["C5", "verdict"] == NOT_MEASURED and rows.loc["C5", "preset"] == "quick"
    assert "only smoke-preset results" in rows.loc["C5", "note"]
    assert notes == [
        "Left out of the verdicts: the smoke-preset results (synthetic images, for tests) of data-norm on synthetic, "
        "table1 on synthetic in this directory."
    ]
    # a report of smoke results alone keeps them
    smoke_tree = report.Tree(root, synthetic)
    assert smoke.leave_out([smoke_tree], root) == ([smoke_tree], [])


def test_a_grid_with_epochs_per_batch_size_is_described_setting_by_setting_and_its_sweep_left_out(tmp_path):
    from normprop_cli import io
    from normprop_cli.verdicts.departures import departures
    from normprop_cli.verdicts.sources import budget, provenance

    runs = {"a-b1-s0": (0, 2, 1), "a-b1-s1": (1, 2, 1), "a-b10-s0": (0, 4, 2), "sweep-a-b1-lr0.1-s100": (100, 1, 1)}
    for name, (seed, epochs, halve) in runs.items():
        run = tmp_path / "runs" / name
        io.write_json(run / "manifest.json", {"preset": "quick", "device": "cpu", "dataset": "digits", "seed": seed})
        io.write_text(run / "config.yaml", f"dataset: {{name: digits}}\nmodel: {{width: 0.25}}\n"
                      f"train: {{epochs: {epochs}, lr_halve_every: {halve}}}\n")  # fmt: skip
    prov = provenance(tmp_path)
    assert prov["runs"] == 4 and prov["seeds"] == 2 and prov["schedules"] == [(2, 1), (4, 2)]  # the sweep's seed aside
    text = departures("normalizers", prov)
    assert "Epochs per setting: 2 (the rate halved every 1) or 4 (the rate halved every 2); the paper preset has " \
           "2, 6, 20 and 20 (halved every 1, 2, 5 and 5) at batch 1, 10, 50 and 100." in text  # fmt: skip
    assert "Epochs per setting: 2 (the rate halved every 1) or 4 (the rate halved every 2); the paper's protocol " \
           "has 50 (halved every 10)." in departures("batch-size", prov)  # fmt: skip
    assert not any(t.startswith("Epochs: ") or t.startswith("The learning rate is halved") for t in text)
    assert budget(prov).startswith("digits, quick, 2 and 4 epochs, 2 seeds, width 0.25")
