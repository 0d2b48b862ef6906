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
