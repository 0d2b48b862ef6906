"""`normprop report`: every experiment listed, figures and headline numbers beside the paper's."""

from normprop_cli.experiments import RUNNERS


def test_report_renders_with_experiments_missing_and_names_them(cli):
    assert (
        cli("run", "table1", "--preset", "smoke", "--quiet", "train.epochs=1", "--results-dir", cli.results).exit_code
        == 0
    )
    result = cli("report", "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    report = (cli.results / "REPORT.md").read_text()
    missing = [e for e in RUNNERS if e != "table1"]
    assert f"Missing experiments: {', '.join(missing)}." in report
    for experiment in missing:
        assert f"`normprop run {experiment}` produces it" in report
    assert "![table1 table1](table1/synthetic/table1.png)" in report
    assert "| test error % (normprop, augmentation none, 1 seed(s)) |" in report
    assert "preset **smoke**" in report and "device cpu" in report
    # The departures from the paper's protocol are said in plain sentences.
    assert "Data set: synthetic, not the paper's cifar10 / cifar100 / svhn" in report
    assert "Epochs: 1 per run, the paper's protocol has 200." in report
    assert "Only 64 examples per split were used." in report


def test_report_of_an_empty_results_directory_lists_everything_missing(cli):
    result = cli("report", "--results-dir", cli.results)
    assert result.exit_code == 0
    assert f"Missing experiments: {', '.join(RUNNERS)}." in (cli.results / "REPORT.md").read_text()
