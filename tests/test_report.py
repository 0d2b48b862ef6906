"""`normprop report`: the verdicts first, then every experiment listed, figures and headline numbers
beside the paper's, for the results tree and any nested one (results/cpu/)."""

import shutil

import pandas as pd

from normprop_cli import report, verdicts
from normprop_cli.experiments import RUNNERS, table1

TABLE_HEAD = "| claim | verdict | effect [95% CI] | n seeds | halves a / b | test | budget |"


def test_report_renders_with_experiments_missing_and_names_them(cli):
    assert (
        cli("run", "table1", "--preset", "smoke", "--quiet", "train.epochs=1", "--results-dir", cli.results).exit_code
        == 0
    )
    result = cli("report", "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    report_md = (cli.results / "REPORT.md").read_text()
    missing = [e for e in RUNNERS if e != "table1"]
    assert f"Missing experiments: {', '.join(missing)}." in report_md
    for experiment in missing:
        assert f"`normprop run {experiment}` produces it" in report_md
    assert "![table1 table1](table1/synthetic/table1.png)" in report_md
    assert "test error %" in report_md and "(normprop, augmentation none" in report_md
    assert "preset **smoke**" in report_md and "device cpu" in report_md
    # The departures from the paper's protocol are said in plain sentences.
    assert "Data set: synthetic, not the paper's cifar10 / cifar100 / svhn" in report_md
    assert "Epochs: 1 per run, the paper's protocol has 200." in report_md
    assert "Only 64 examples per split were used." in report_md


def test_report_opens_with_the_verdicts_and_covers_a_nested_cpu_tree(cli, monkeypatch):
    assert (
        cli("run", "table1", "--preset", "smoke", "--quiet", "train.epochs=1", "--results-dir", cli.results).exit_code
        == 0
    )
    shutil.copytree(cli.results / "table1", cli.results / "cpu" / "table1")  # a second tree, one level down
    monkeypatch.setattr(table1, "paragraphs", lambda cfg: ["A finding in words."], raising=False)
    assert cli("report", "--results-dir", cli.results).exit_code == 0
    text = (cli.results / "REPORT.md").read_text()
    lines = text.splitlines()
    # "## Verdicts" is the first section, with one table per tree, then the rule, then the experiments
    assert [line for line in lines if line.startswith("## ")][0] == "## Verdicts"
    assert lines.index("### smoke preset (`verdicts.csv`)") < lines.index("### smoke preset (`cpu/verdicts.csv`)")
    assert text.count(TABLE_HEAD) == 2
    assert text.index("### How a verdict is reached") < text.index("## table1")
    assert verdicts.rule_text() in text
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
    assert f"Missing experiments: {', '.join(RUNNERS)}." in text
    assert "## Verdicts" in text and text.count("| **not measured** |") == 8
