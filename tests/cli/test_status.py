"""`normprop status` (issue: seeing where a sweep stands): every run of the grid and its state."""

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
