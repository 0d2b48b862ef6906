"""An unwritable or full results directory: one line that says what to do, and no file lost."""

import errno
import json
import os

import pytest
import torch

from normprop_cli import io
from normprop_cli.errors import UserError

ARGS = ["run", "table1", "--preset", "smoke", "--quiet", "train.epochs=3", "grid=[{id: r, set: {}}]"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in any directory")
def test_a_read_only_results_directory_is_a_one_line_error(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(UserError, match="pass --results-dir to a writable directory") as error:
            io.check_writable(tmp_path / "results")
    finally:
        tmp_path.chmod(0o700)
    assert str(tmp_path / "results") in str(error.value)


def test_a_results_directory_that_cannot_be_made_is_a_one_line_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(UserError, match="pass --results-dir") as error:
        io.check_writable(tmp_path / "file" / "results")
    assert str(tmp_path / "file" / "results") in str(error.value)
    io.check_writable(tmp_path / "fine" / "results")
    assert list((tmp_path / "fine" / "results").iterdir()) == []


@pytest.mark.parametrize(
    "code,todo", [(errno.ENOSPC, "free some space"), (errno.EDQUOT, "free some space"), (errno.EACCES, "writable")]
)
def test_a_failed_write_keeps_the_previous_file_and_says_so(tmp_path, code, todo):
    target = tmp_path / "metrics.csv"
    target.write_text("old\n")

    def write(tmp):
        tmp.write_text("half")
        raise (PermissionError if code == errno.EACCES else OSError)(code, os.strerror(code))

    with pytest.raises(UserError) as error:
        io.atomic_write(target, write)
    message = str(error.value)
    assert str(target) in message and "previous version is intact" in message and todo in message
    assert "run the same command again" in message
    assert target.read_text() == "old\n" and os.listdir(tmp_path) == ["metrics.csv"]


def test_a_full_disk_during_a_checkpoint_stops_the_run_with_its_files_intact(cli, interrupt_at, monkeypatch):
    assert interrupt_at(6, lambda: cli(*ARGS, "--results-dir", cli.results)).exit_code == 130
    path = cli.results / "table1" / "synthetic" / "runs" / "r-s0"
    files = {f.name: f.read_bytes() for f in path.iterdir()}

    def full(obj, f, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full)
    result = cli(*ARGS, "--results-dir", cli.results)
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()
    assert str(path / "checkpoint.pt") in line and "intact" in line and "free some space" in line
    assert torch.load(path / "checkpoint.pt", weights_only=True)["epoch"] == 1
    assert json.loads((path / "manifest.json").read_text())["epochs_done"] == 1
    assert {f.name: f.read_bytes() for f in path.iterdir() if f.name != "manifest.json"} == {
        k: v for k, v in files.items() if k != "manifest.json"
    }
