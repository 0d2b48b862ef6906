"""`normprop status` (where a sweep stands): every run of the grid and its state."""

import json

GRID = (
    "grid=[{id: a, set: {model.norm: normprop}}, {id: b, set: {model.norm: batchnorm}}, "
    "{id: c, set: {model.norm: none}}, {id: d, set: {model.norm: normprop, train.lr: 1.0}}]"
)
ARGS = ["table1", "--preset", "smoke", "train.epochs=3", GRID]


def write_manifest(results, run, **manifest):
    path = results / "table1" / "synthetic" / "runs" / run
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps(manifest))


def hold_lock(path, pid, host):
    """The lock of a process that trains the run in `path` (engine.lock)."""
    (path / "train.lock").write_text(json.dumps({"pid": pid, "host": host, "started": "2024-05-01T10:00:00+0000"}))


def line_of(output, run):
    [line] = [line for line in output.splitlines() if run in line]
    return line


def test_status_shows_every_run_with_its_state_epochs_and_where_it_ran(cli):
    # a is missing; b was stopped in its second epoch on a cluster node; c is done; d diverged.
    write_manifest(
        cli.results,
        "b-s0",
        status="running",
        epochs_done=1,
        epochs=3,
        host="node7",
        device="cuda",
        updated="2024-05-01T10:00:00+0000",
    )
    hold_lock(cli.results / "table1" / "synthetic" / "runs" / "b-s0", pid=4242, host="node7")  # touched just now
    laptop = {"epochs": 3, "host": "laptop", "device": "cpu"}
    write_manifest(cli.results, "c-s0", status="complete", epochs_done=3, **laptop)
    write_manifest(cli.results, "d-s0", status="diverged", epochs_done=1, **laptop)
    submitit = cli.results / ".submitit"
    submitit.mkdir()
    (submitit / "table1-synthetic.json").write_text(json.dumps({"b-s0": "4242_1"}))

    result = cli("status", *ARGS, "--results-dir", cli.results)
    assert result.exit_code == 0, result.output
    assert "missing" in line_of(result.output, "a-s0") and "0/3" in line_of(result.output, "a-s0")
    b = line_of(result.output, "b-s0")
    for word in ("running", "1/3", "node7", "cuda", "4242_1"):
        assert word in b
    assert "complete" in line_of(result.output, "c-s0") and "3/3" in line_of(result.output, "c-s0")
    assert "diverged" in line_of(result.output, "d-s0")
    assert "4 run(s): 1 missing, 1 running, 1 complete, 1 diverged" in result.output
    assert not (cli.results / "table1" / "synthetic" / "runs" / "a-s0").exists()  # status writes nothing


def test_status_of_a_run_that_trained_names_its_host_and_device(cli):
    import socket

    assert (
        cli(
            "run",
            "table1",
            "--preset",
            "smoke",
            "--quiet",
            "train.epochs=1",
            "grid=[{id: a, set: {model.norm: normprop}}]",
            "--results-dir",
            cli.results,
        ).exit_code
        == 0
    )
    result = cli(
        "status",
        "table1",
        "--preset",
        "smoke",
        "train.epochs=1",
        "grid=[{id: a, set: {model.norm: normprop}}]",
        "--results-dir",
        cli.results,
    )
    line = line_of(result.output, "a-s0")
    assert result.exit_code == 0 and "complete" in line and "1/1" in line and "cpu" in line
    assert socket.gethostname()[:8] in result.output


def test_status_of_an_unknown_experiment_is_a_one_line_error(cli):
    result = cli("status", "no-such-experiment")
    assert result.exit_code == 2 and result.output.startswith("error: unknown experiment")


def test_a_run_stopped_by_ctrl_c_is_stopped_and_resumable_not_running(cli, interrupt_at):
    import os
    import socket

    grid = "grid=[{id: a, set: {model.norm: normprop}}, {id: b, set: {model.norm: batchnorm}}]"
    args = ["table1", "--preset", "smoke", "train.epochs=3", grid, "--results-dir", cli.results]
    assert interrupt_at(6, lambda: cli("run", *args, "--quiet")).exit_code == 130  # in a-s0's second epoch
    runs = cli.results / "table1" / "synthetic" / "runs"
    assert json.loads((runs / "a-s0" / "manifest.json").read_text())["status"] == "running"
    assert not (runs / "a-s0" / "train.lock").exists()  # released however the run ended

    result = cli("status", *args)
    assert result.exit_code == 0, result.output
    assert "stopped, resumable" in line_of(result.output, "a-s0") and "1/3" in line_of(result.output, "a-s0")
    assert "2 run(s): 1 missing, 1 stopped (resumable)" in result.output
    resume = f"`normprop run table1 --preset smoke --results-dir {cli.results} train.epochs=3 '{grid}'`"
    assert f"{resume} resumes the stopped run(s)" in " ".join(result.output.split())

    # a lock left by a process that is gone: stopped; one that a live process of this host holds: running
    hold_lock(runs / "a-s0", pid=2**22 + 12345, host=socket.gethostname())
    assert "stopped, resumable" in line_of(cli("status", *args).output, "a-s0")
    hold_lock(runs / "a-s0", pid=os.getppid(), host=socket.gethostname())
    assert "running" in line_of(cli("status", *args).output, "a-s0")


def test_status_without_the_runs_preset_names_the_presets_whose_runs_are_there(cli):
    # smoke runs in the results directory itself and in a tree of their own one level down
    write_manifest(cli.results, "a-s0", status="complete", epochs_done=3, epochs=3, preset="smoke", dataset="synthetic")
    write_manifest(cli.results / "smoke", "a-s0", status="running", epochs_done=1, epochs=3, preset="smoke",
                   dataset="synthetic")  # fmt: skip
    result = cli("status", "table1", "--results-dir", cli.results)  # the quick preset's grid, on digits
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "run(s): " in text and " missing" in text
    assert f"none of these runs is in {cli.results}; runs of table1 that are:" in text
    assert f"smoke preset on synthetic ({cli.results}): normprop status table1 --preset smoke --results-dir " \
           f"{cli.results}" in text  # fmt: skip
    assert f"normprop status table1 --preset smoke --results-dir {cli.results / 'smoke'}" in text
    # with the preset and the runs' overrides, its runs; without those overrides, what to give
    assert "complete" in line_of(cli("status", *ARGS, "--results-dir", cli.results).output, "a-s0")
    other = cli("status", "table1", "--preset", "smoke", "--results-dir", cli.results).output
    assert "holds other runs of table1: give status the overrides" in " ".join(other.split())
    # where there is nothing at all, the command that trains them
    empty = cli("status", "table1", "--results-dir", cli.results / "empty")
    assert f"no run of table1 in {cli.results / 'empty'}: `normprop run table1 --results-dir " in empty.output


def test_status_help_says_how_to_give_the_runs_seeds():
    import typer

    from normprop_cli.cli import app

    [overrides] = [p for p in typer.main.get_command(app).commands["status"].params if p.name == "overrides"]
    assert "`run --seeds 3`: seeds=3" in overrides.help
