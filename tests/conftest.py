import functools
import re
import shutil
from pathlib import Path

import pytest
import torch

# The tests run small models, for which one thread is fastest and immune to a busy machine; under pytest-xdist
# (`make test`) this holds in each worker process, so two workers keep to one core each.
torch.set_num_threads(1)


@functools.cache
def shares_a_fixture(module: Path) -> bool:
    """Whether a test module defines a fixture its tests share (scope module or class: a smoke sweep trained once
    for the tests that read it)."""
    text = module.read_text() if module.suffix == ".py" and module.is_file() else ""
    return re.search(r"scope=[\"'](module|class|package)[\"']", text) is not None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` (`make test`): the tests of a module that shares a fixture go to one worker together, so
    that it is built once, not once per worker; every other test is handed out on its own. xdist sends the groups
    first (the larger first), then the single tests. xdist's own loadgroup reads the groups from `xdist_group`
    marks, through a change to node ids that pytest 9.2 no longer lets it make."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if shares_a_fixture(config.rootpath / module) else nodeid

    return SharedFixtureScheduling(config, log)


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """`trained(dest, *args)`: the results tree that `normprop run ARGS --results-dir dest` writes, put in `dest`
    (a copy, for the test to change). Each distinct command trains once per session (per worker under
    pytest-xdist): the tests that only need its finished runs to start from share it."""
    from typer.testing import CliRunner

    from normprop_cli.cli import app

    done = {}

    def put(dest, *args):
        command = tuple(str(a) for a in args)
        if command not in done:
            results = tmp_path_factory.mktemp("trained") / "results"
            result = CliRunner().invoke(app, ["run", *command, "--results-dir", str(results)], catch_exceptions=False)
            assert result.exit_code == 0, result.output
            done[command] = results
        shutil.copytree(done[command], dest, dirs_exist_ok=True)
        return dest

    return put


@pytest.fixture
def cli(tmp_path):
    """Invoke `normprop` in-process; results go to a temporary directory."""
    from typer.testing import CliRunner

    from normprop_cli.cli import app

    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    invoke.results = tmp_path / "results"
    return invoke


@pytest.fixture
def interrupt_at(monkeypatch):
    """`interrupt_at(n, call)`: run `call()` with Ctrl-C raised at the n-th training step of a
    --quiet sweep, as a user would press it; the progress is restored afterwards."""
    from normprop_cli.engine import progress

    def run(n, call):
        original, steps = progress.QuietProgress.step, {"n": 0}

        def step(self, k):
            steps["n"] += 1
            if steps["n"] == n:
                raise KeyboardInterrupt
            original(self, k)

        monkeypatch.setattr(progress.QuietProgress, "step", step)
        try:
            return call()
        finally:
            monkeypatch.setattr(progress.QuietProgress, "step", original)

    return run
