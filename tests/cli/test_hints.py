"""The commands that messages suggest repeat the user's preset and results directory, and `run` ends
with the figures it wrote and the report as the next step."""

import shlex
from pathlib import Path

import pytest

from normprop_cli import hints

GRID = "grid=[{id: a, set: {model.norm: normprop}}]"


@pytest.mark.parametrize(
    "preset,results_dir,expected",
    [
        (None, None, "normprop run data-norm"),
        ("quick", "results", "normprop run data-norm"),
        ("cpu", "results/cpu", "normprop run data-norm --preset cpu"),
        ("smoke", "results/smoke", "normprop run data-norm --preset smoke"),
        ("smoke", "results", "normprop run data-norm --preset smoke --results-dir results"),
        ("quick", "/tmp/my results", "normprop run data-norm --results-dir '/tmp/my results'"),
        ("?", "results", "normprop run data-norm"),  # a preset that no config has: the default
    ],
)
def test_a_hint_names_the_options_that_are_not_the_defaults(preset, results_dir, expected):
    assert hints.command("run", "data-norm", preset=preset, results_dir=results_dir) == expected


def test_plot_without_its_csvs_names_the_run_command_with_the_results_dir(cli):
    for experiment in ("table1", "theory"):
        result = cli("plot", experiment, "--preset", "smoke", "--results-dir", cli.results)
        assert result.exit_code == 2
        assert f"`normprop run {experiment} --preset smoke --results-dir {cli.results}` produces it" in result.output


def test_run_ends_with_its_figures_and_the_report_command_that_reads_them(cli):
    result = cli("run", "table1", "--preset", "smoke", "--quiet", "train.epochs=1", GRID, "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    sweep = cli.results / "table1" / "synthetic"
    lines = result.output.strip().splitlines()
    assert lines[-3:-1] == [f"wrote {sweep / 'summary.csv'}", f"wrote {sweep / 'table1.png'}"]  # smoke: PNG alone
    report = f"normprop report --preset smoke --results-dir {cli.results}"
    assert lines[-1] == f"next: `{report}` puts them in {cli.results / 'REPORT.md'}"
    # the suggested command reports these results
    assert cli(*shlex.split(report)[1:]).exit_code == 0
    assert "![table1 table1](table1/synthetic/table1.png)" in (cli.results / "REPORT.md").read_text()
    # a tree under one that has a report (results/cpu under results/): that report covers it
    nested = cli.results / "mine"
    result = cli("run", "table1", "--preset", "smoke", "--quiet", "train.epochs=1", GRID, "--results-dir", nested)
    report = f"normprop report --results-dir {cli.results}"
    assert result.output.strip().splitlines()[-1] == f"next: `{report}` puts them in {cli.results / 'REPORT.md'}"


def test_a_verdict_not_measured_names_the_run_command_of_its_own_tree(tmp_path, monkeypatch):
    from normprop_cli.verdicts import claims
    from normprop_cli.verdicts.tabulate import rows_of

    c1 = next(c for c in claims() if c.id == "C1")
    [row] = rows_of(c1, tmp_path / "mine", "cpu")
    assert row["note"] == f"`normprop run data-norm --preset cpu --results-dir {tmp_path / 'mine'}` produces it"
    monkeypatch.chdir(tmp_path)  # an empty results/cpu: the preset's own directory
    [row] = rows_of(c1, Path("results/cpu"), "cpu")
    assert row["note"] == "`normprop run data-norm --preset cpu` produces it"
