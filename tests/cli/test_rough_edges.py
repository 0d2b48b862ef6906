"""The command line's edges: a dry run says what it will time before it times it and keeps a plan.csv
already in the preset's results directory; usage errors are one line with exit code 2; a mistyped
experiment gets the nearest names; "unchanged" is decided by the files' bytes; register_activation
refuses a function it cannot normalise; `info` is aligned and names every way to get a data set."""

import os

import pandas as pd
import pytest
import torch

from normprop_cli import hints
from normprop_cli.nn.methods import METHODS
from normprop_cli.nn.stats import ACTIVATIONS, register_activation

SMOKE = ["--preset", "smoke"]


@pytest.fixture
def fake_timing(monkeypatch):
    """Steps "timed" instantly, with a line printed when the timing starts (to see what came before it)."""
    from normprop_cli.bench import step_times

    def measure(needed, dev, steps=5, warmup=2, options=None):
        print("TIMING STARTS")
        return dict.fromkeys(needed, 10.0)

    monkeypatch.setattr(step_times, "measure", measure)
    monkeypatch.delenv("NORMPROP_STEP_TIMES", raising=False)


@pytest.fixture
def step_times_csv(tmp_path):
    rows = [(m, b, w, 5.0 * b) for m in METHODS for b in (1, 64) for w in (0.0625, 0.125)]
    path = tmp_path / "times.csv"
    pd.DataFrame(rows, columns=["method", "batch_size", "width", "step_ms"]).to_csv(path, index=False)
    return path


def test_a_dry_run_says_what_it_will_time_and_how_long_before_it_times(cli, fake_timing):
    result = cli("run", "batch-size", *SMOKE, "--dry-run", "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    notice = next(i for i, line in enumerate(lines) if line.startswith("timing "))
    assert notice < lines.index("TIMING STARTS")
    assert "timing 5 step configuration(s) (2 method(s), batch sizes 1, 16, 64, width 0.0625)" in lines[notice]
    assert "7 steps each" in lines[notice] and "--step-times FILE" in lines[notice]
    assert "about " in lines[notice] and "on idle cores of cpu" in lines[notice]  # priced by the committed bench
    assert (cli.results / "plan.csv").exists()


def test_a_dry_run_keeps_the_plan_in_the_presets_results_directory_unless_asked(
    cli, tmp_path, monkeypatch, step_times_csv
):
    monkeypatch.chdir(tmp_path)  # the smoke preset's results directory: results/smoke, here
    committed = tmp_path / "results" / "smoke" / "plan.csv"
    committed.parent.mkdir(parents=True)
    committed.write_text("experiment,runs\ntotal,257\n")
    args = ["run", "batch-size", *SMOKE, "--dry-run", "--step-times", step_times_csv]
    kept = cli(*args)
    assert kept.exit_code == 0, kept.output
    assert committed.read_text() == "experiment,runs\ntotal,257\n"
    assert "is there and is kept (--force writes over it" in kept.output and "wrote" not in kept.output
    assert "plan: 6 run(s) + 6 sweep run(s) to train" in kept.output  # the totals all the same
    assert cli(*args, "--results-dir", "results/smoke").exit_code == 0  # a directory named: written there
    assert "batch-size" in committed.read_text()
    committed.write_text("experiment,runs\ntotal,257\n")
    assert cli(*args, "--force").exit_code == 0
    assert "batch-size" in committed.read_text()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "table1", "--jobs", "abc"], "error: Invalid value for '--jobs'"),
        (["run", "table1", "--no-such-option"], "error: No such option: --no-such-option"),
        (["rnu", "table1"], "error: No such command 'rnu'. Did you mean 'run'?"),
        (["run", "tabel1"], "error: unknown experiment 'tabel1'; did you mean table1?"),
        (["status", "covariate_shift"], "did you mean covariate-shift?"),
        (["run", "table1", "--preset", "quik"], "error: unknown preset 'quik'; did you mean quick?"),
    ],
)
def test_usage_errors_are_one_line_with_exit_code_2(cli, args, needle):
    result = cli(*args)
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [result.output.strip()], result.output
    assert needle in result.output


def test_unchanged_is_decided_by_the_bytes_not_the_times(tmp_path):
    out = tmp_path / "table1" / "digits"
    (out / "runs" / "a").mkdir(parents=True)
    summary, figure, checkpoint = out / "summary.csv", out / "table1.png", out / "runs" / "a" / "checkpoint.pt"
    for path, data in ((summary, b"a,b\n1,2\n"), (figure, b"PNG"), (checkpoint, b"weights")):
        path.write_bytes(data)
    before = hints.contents(tmp_path / "table1")
    assert checkpoint not in before  # a run's own files are not read
    later = os.stat(summary).st_mtime + 10
    for path in (summary, figure):
        path.write_bytes(path.read_bytes())  # written again, byte for byte, later
        os.utime(path, (later, later))
    assert hints.wrote(summary, before) == f"unchanged: {summary}"
    assert hints.wrote(out, before) == f"unchanged: {out}" and hints.figures(summary, before) == []
    figure.write_bytes(b"PNG2")
    assert hints.wrote(out, before) == f"wrote {out}" and hints.figures(summary, before) == [figure]
    (out / "epochs.csv").write_text("new\n")
    assert hints.wrote(out / "epochs.csv", before) == f"wrote {out / 'epochs.csv'}"


@pytest.mark.parametrize(
    "fn,needle",
    [
        (lambda x: torch.log(x.abs()), "Jacobian factor does not converge"),  # E[1/X^2] is infinite
        (lambda x: x.abs().sqrt(), "Jacobian factor does not converge"),  # E[1/(4|X|)] too
        (lambda x: 1 / 0, "raised ZeroDivisionError"),
        (lambda x: x.numpy(), "raised RuntimeError"),  # not differentiable by autograd
        (lambda x: x * 0 + 1, "a constant function cannot be normalised"),
        (lambda x: x * float("inf"), "not finite"),
    ],
)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf x 0 in the quadrature
def test_register_activation_refuses_a_function_it_cannot_normalise(fn, needle):
    with pytest.raises(ValueError, match="register_activation") as info:
        register_activation("refused-here", fn)
    assert needle in str(info.value)
    assert "refused-here" not in ACTIVATIONS


def test_register_activation_takes_a_function_whose_statistics_converge():
    try:
        register_activation("abs-075", lambda x: x.abs() ** 0.75)  # f'^2 ~ |x|^-0.5: integrable, slowly
        register_activation("kinked-at-03", lambda x: (x > 0.3) * x)  # a jump its breakpoints miss
        assert {"abs-075", "kinked-at-03"} <= set(ACTIVATIONS)
    finally:
        ACTIVATIONS.pop("abs-075", None)
        ACTIVATIONS.pop("kinked-at-03", None)


def test_info_aligns_its_columns_and_names_both_ways_to_get_fashion_mnist(cli, tmp_path, monkeypatch):
    import normprop_cli.data as data

    present = {"cifar10": False, "digits": True, "fashion-mnist": False}
    monkeypatch.setattr(data, "available_datasets", lambda data_dir: present)
    result = cli("info", "--data-dir", tmp_path)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    split = lines.index("data sets:")
    head, sets = lines[:split], lines[split + 1 :]
    for block, first in ((head, "normprop"), (sets, "  cifar10")):
        column = len(block[0]) - len(block[0][len(first) :].lstrip())  # where the first line's value starts
        for line in block:
            assert line[column - 2 : column] == "  " and line[column] != " ", block  # every value starts there
    fashion = next(line for line in sets if line.split()[0] == "fashion-mnist")
    assert "apt-get install dataset-fashion-mnist" in fashion and "--dataset fashion-mnist --download" in fashion
    assert "--dataset cifar10 --download" in next(line for line in sets if line.split()[0] == "cifar10")
