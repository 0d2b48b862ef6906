import pytest
import torch

# The tests run small models, for which one thread is fastest and immune to a busy machine.
torch.set_num_threads(1)


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
