import pytest
from typer.testing import CliRunner

from normprop_cli.cli import app
from normprop_cli.experiments import plots


@pytest.fixture(scope="session")
def run_experiment(tmp_path_factory):
    """`normprop run EXPERIMENT ARGS...` into a fresh results directory, which it returns."""

    def run(experiment, *args):
        results = tmp_path_factory.mktemp(experiment) / "results"
        args = ["run", experiment, *args, "--results-dir", str(results)]
        result = CliRunner().invoke(app, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return results

    return run


@pytest.fixture
def assert_redraws(cli):
    """`normprop plot` redraws an experiment's figure from its CSVs alone: no figure, no checkpoint."""

    def check(experiment, results, dataset="synthetic"):
        sweep = results / experiment / dataset
        stem = experiment.replace("-", "_")
        for path in [sweep / f"{stem}.png", *sweep.glob("runs/*/checkpoint.pt")]:
            path.unlink()
        result = cli("plot", experiment, "--preset", "smoke", "--results-dir", results)
        assert result.exit_code == 0, result.output
        assert (sweep / f"{stem}.png").exists()

    return check


@pytest.fixture
def drawn(monkeypatch):
    """The figures an experiment's plot draws, by name (e.g. "table1"): plots.save records each figure
    before saving it, so that a test reads its axes, labels and legends."""
    figures, save = {}, plots.save

    def record(fig, cfg, name):
        figures[name] = fig
        return save(fig, cfg, name)

    monkeypatch.setattr(plots, "save", record)
    return figures


@pytest.fixture
def legend_texts():
    """Every legend entry of a figure, its axes' legends and its own, as a function of the figure."""

    def texts(fig) -> list[str]:
        legends = [ax.get_legend() for ax in fig.axes] + list(fig.legends)
        return [t.get_text() for legend in legends if legend is not None for t in legend.get_texts()]

    return texts
