"""The `normprop` command: Typer options -> Hydra config -> experiment runner."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Annotated

import typer

from normprop_cli import config, hints, tools
from normprop_cli.errors import UserError
from normprop_cli.hints import OneLineErrors, contents, enclosing, figures, outputs_of, wrote

app = typer.Typer(
    cls=OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Normalization Propagation (Arpit et al., ICML 2016): run, plot and report every experiment of the paper.",
)

Dataset = Annotated[str | None, typer.Option(help="Data set (default: the preset's).")]
Preset = Annotated[str | None, typer.Option(help="paper | gpu | cpu | fashion | quick | smoke (default: quick).")]
ResultsDir = Annotated[Path | None, typer.Option(help="Where results go (default: the preset's, e.g. results/).")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Train nothing: write plan.csv (runs, steps, time, disk).")]
Force = Annotated[
    bool,
    typer.Option("--force", help="With --dry-run: write over a plan.csv already in the preset's results directory."),
]
StepTimesCsv = Annotated[Path | None, typer.Option(envvar="NORMPROP_STEP_TIMES", help="Step times (CSV) for the plan.")]
Deterministic = Annotated[bool, typer.Option("--deterministic", help="Deterministic algorithms, no TF32 (slower).")]
AllowDirty = Annotated[
    bool,
    typer.Option(
        "--allow-dirty",
        help="Train reported runs from a checkout with uncommitted changes, recording a hash of the diff.",
    ),
]


def user_errors(command):
    """Bad input is one line on stderr and exit code 2, never a traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except UserError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(UserError.exit_code) from None

    return wrapper


def _version(value: bool) -> None:
    if value:
        import normprop_cli

        typer.echo(f"normprop {normprop_cli.__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print normprop's version and exit.")
    ] = False,
) -> None:
    """Normalization Propagation (Arpit et al., ICML 2016): run, plot and report every experiment of the paper."""


def _rows(pairs: list[tuple[str, str]]) -> list[str]:
    """`  name  description` lines whose descriptions start at one column: the longest name plus two spaces."""
    width = max((len(name) for name, _ in pairs), default=0) + 2
    return [f"  {name:<{width}}{text}" for name, text in pairs]


@app.command("list")
@user_errors
def list_() -> None:
    """Experiments, data sets, presets and normalisation methods, one line each."""
    from normprop_cli.nn.methods import METHODS

    for group in ("experiment", "dataset", "preset"):
        typer.echo(f"{group}s:")
        for line in _rows([(name, config.describe(group, name)) for name in config.options(group)]):
            typer.echo(line)
    typer.echo("methods (experiment.methods, normprop bench --methods):")
    sets = {name: ", ".join(f"{k}={v}" for k, v in m.settings.items()) for name, m in METHODS.items()}
    for line in _rows([(name, f"{m.label}: {sets[name]}") for name, m in METHODS.items()]):
        typer.echo(line)


@app.command()
@user_errors
def info(data_dir: Annotated[Path, typer.Option(help="Where data sets are looked for.")] = Path("data")) -> None:
    """Versions, the device that `auto` picks, and which data sets are present."""
    from normprop_cli.status import info_lines

    for line in info_lines(data_dir):
        typer.echo(line)


def compose(experiment, preset, dataset, overrides, **settings):
    from normprop_cli.experiments import EXPERIMENTS, grid

    for group, name in (("experiment", experiment), ("preset", preset), ("dataset", dataset)):
        if name is not None:
            hints.check_choice(group, name)
    cfg = grid.load(experiment, preset=preset, dataset=dataset, overrides=overrides or [], **settings)
    if experiment not in EXPERIMENTS:
        raise UserError(f"experiment '{experiment}' has a config but no runner yet; runnable: {', '.join(EXPERIMENTS)}")
    return cfg


@app.command(context_settings={"allow_interspersed_args": True})
@user_errors
def run(
    experiment: Annotated[str, typer.Argument(help="An experiment from `normprop list`.")],
    overrides: Annotated[list[str] | None, typer.Argument(help="Hydra overrides, e.g. train.epochs=5.")] = None,
    dataset: Dataset = None,
    preset: Preset = None,
    seeds: Annotated[int | None, typer.Option(help="Seeds per setting.")] = None,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda | cuda:N.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Where data sets are (default: data/).")] = None,
    results_dir: ResultsDir = None,
    download: Annotated[bool, typer.Option("--download", help="Fetch a missing data set.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="One line per finished run.")] = False,
    jobs: Annotated[
        int | None,
        typer.Option(help="Worker processes: one GPU each when several are visible, else a share of the CPU threads."),
    ] = None,
    launcher: Annotated[
        str | None,
        typer.Option(help="none | local | slurm: where the runs go (submitit; settings: launcher.KEY=VALUE)."),
    ] = None,
    deterministic: Deterministic = False,
    allow_dirty: AllowDirty = False,
    dry_run: DryRun = False,
    step_times: StepTimesCsv = None,
    force: Force = False,
) -> None:
    """Run an experiment: train its runs (resuming unfinished ones), write CSVs and figures."""
    from normprop_cli.engine import ledger
    from normprop_cli.experiments import EXPERIMENTS

    if seeds is not None and seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {seeds}")
    if jobs is not None and jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}")
    if launcher is not None:
        config.check_choice("launcher", launcher)
    cfg = compose(
        experiment,
        preset,
        dataset,
        overrides,
        seeds=seeds,
        device=device,
        data_dir=data_dir,
        results_dir=results_dir,
        download=download or None,
        quiet=quiet or None,
        jobs=jobs,
        launcher=launcher,
        deterministic=deterministic or None,
    )
    if not dry_run:  # before anything is said or written: reported runs come from committed code
        ledger.check_clean([Path(cfg.results_dir)], allow_dirty)
    if dry_run or not quiet:  # the plan (experiments.plan): its estimate line, or plan.csv instead of training
        keep = results_dir is None and not force
        plan_lines([(cfg, EXPERIMENTS[experiment].trains)], step_times, cfg.device, write=dry_run, keep=keep)
        if dry_run:
            return first_round_line([cfg])
    before = contents(outputs_of(cfg))
    out = EXPERIMENTS[experiment].run(cfg)
    typer.echo(wrote(out, before))
    for figure in figures(out, before):
        typer.echo(f"wrote {figure}")
    above = enclosing(Path(cfg.results_dir))
    command = hints.command("report", results_dir=above) if above else hints.of(cfg, "report", dataset=False)
    typer.echo(f"next: `{command}` puts them in {(above or Path(cfg.results_dir)) / 'REPORT.md'}")


def first_round_line(cfgs: list, workers: int | None = None) -> None:
    """The engine's plan of the first round (experiments.base.first_round): what trains, what rides along what,
    what is reused; the same plan that training makes."""
    from normprop_cli.experiments import EXPERIMENTS, first_round

    staged = [c for c in cfgs if EXPERIMENTS[str(c.experiment.name)].stages is not None]
    if staged:
        typer.echo(first_round(staged, workers).line("the first round"))


def plan_lines(cfgs: list, step_times: Path | None, device: str, write: bool, keep: bool = False) -> None:
    """Print the plan of `cfgs` (experiments.plan.announce), priced by --step-times or steps timed on `device`,
    each line as soon as it is known; `keep`: a plan.csv already in the results directory is not written over."""
    from normprop_cli.bench.step_times import StepTimes
    from normprop_cli.experiments import plan

    for line in plan.announce(cfgs, functools.partial(StepTimes, step_times, device), write_plan=write, keep=keep):
        typer.echo(line)


@app.command(context_settings={"allow_interspersed_args": True})
@user_errors
def status(
    experiment: Annotated[str, typer.Argument(help="An experiment from `normprop list`.")],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="The overrides the runs were given, e.g. train.epochs=3; for `run --seeds 3`: seeds=3."),
    ] = None,
    dataset: Dataset = None,
    preset: Preset = None,
    results_dir: ResultsDir = None,
) -> None:
    """Where a sweep stands: every run of the grid, its state, epochs and where it ran."""
    from normprop_cli.status import show

    show(compose(experiment, preset, dataset, overrides, results_dir=results_dir), overrides=overrides or [])


@app.command("config", context_settings={"allow_interspersed_args": True})
@user_errors
def config_(
    experiment: Annotated[str, typer.Argument(help="An experiment from `normprop list`.")],
    overrides: Annotated[list[str] | None, typer.Argument(help="Hydra overrides, e.g. train.epochs=5.")] = None,
    dataset: Dataset = None,
    preset: Preset = None,
    seeds: Annotated[int | None, typer.Option(help="Seeds per setting.")] = None,
    results_dir: ResultsDir = None,
) -> None:
    """Print the composed config of every run of the grid, as `normprop run` would train it; train nothing."""
    from omegaconf import OmegaConf

    from normprop_cli.engine import expand_grid

    if seeds is not None and seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {seeds}")
    cfg = compose(experiment, preset, dataset, overrides, seeds=seeds, results_dir=results_dir)
    specs = expand_grid(cfg)
    sweep = cfg.experiment.get("lr_sweep")
    for spec in specs:
        typer.echo(f"# run {spec.name}")
        if sweep is not None:
            typer.echo("# train.lr: the centre of the validation sweep; the sweep chooses the rate (lr_sweep.csv)")
        typer.echo(OmegaConf.to_yaml(spec.cfg))
    typer.echo(f"# {len(specs)} run(s) of {experiment} on {cfg.dataset.name}, {cfg.preset.name} preset")


@app.command()
@user_errors
def plot(
    experiment: Annotated[str, typer.Argument(help="An experiment from `normprop list`.")],
    dataset: Dataset = None,
    preset: Preset = None,
    results_dir: ResultsDir = None,
) -> None:
    """Redraw an experiment's figures from its CSVs alone: no model, no training."""
    from normprop_cli.experiments import EXPERIMENTS

    cfg = compose(experiment, preset, dataset, [], results_dir=results_dir)
    for path in EXPERIMENTS[experiment].plot(cfg):
        typer.echo(f"wrote {path}")


@app.command()
@user_errors
def report(preset: Preset = None, results_dir: ResultsDir = None) -> None:
    """Write REPORT.md in the results directory (the preset's: results/ for quick) from the CSVs and figures there."""
    from normprop_cli import readme
    from normprop_cli.report import write_report

    results = results_dir or Path(config.root(preset).results_dir)
    typer.echo(f"wrote {write_report(results)}")
    if (path := readme.update(results)) is not None:
        typer.echo(f"updated the verdicts in {path}")


@app.command("reproduce-all")
@user_errors
def reproduce_all(
    preset: Preset = None,
    dataset: Dataset = None,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda | cuda:N.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Where data sets are (default: data/).")] = None,
    results_dir: ResultsDir = None,
    download: Annotated[bool, typer.Option("--download", help="Fetch a missing data set.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="One line per finished run.")] = False,
    deterministic: Deterministic = False,
    allow_dirty: AllowDirty = False,
    dry_run: DryRun = False,
    step_times: StepTimesCsv = None,
    force: Force = False,
) -> None:
    """Every experiment (in the paper's order, or those the preset lists: preset.experiments), then the
    figures and the report: the one that times its runs first and alone, then the others' runs round by round
    on one executor (each trajectory trained once), then each experiment's tables and figures."""
    if dry_run:  # plan.csv: a row per experiment and their total; nothing trained
        from normprop_cli.experiments.plan import configs

        cfgs = configs(preset, dataset, device=device, data_dir=data_dir, results_dir=results_dir)
        plan_lines(cfgs, step_times, cfgs[-1][0].device, write=True, keep=results_dir is None and not force)
        return first_round_line([cfg for cfg, _ in cfgs], int(config.root(preset).jobs))
    from normprop_cli import readme
    from normprop_cli.engine import ledger, tally
    from normprop_cli.experiments import EXPERIMENTS, reproduce
    from normprop_cli.report import write_report

    root = config.root(preset)
    ledger.check_clean([Path(results_dir or root.results_dir)], allow_dirty)  # before anything is written
    start = time.perf_counter()
    tally.reset()
    listed = root.preset.get("experiments")  # a preset may name its own
    cfgs = [
        compose(
            experiment,
            preset,
            dataset if EXPERIMENTS[experiment].trains else None,
            [],
            device=device,
            data_dir=data_dir,
            results_dir=results_dir,
            download=download or None,
            quiet=quiet or None,
            deterministic=deterministic or None,
        )
        for experiment in listed or EXPERIMENTS
    ]

    def step(cfg, part) -> None:
        experiment = cfg.experiment.name
        typer.echo(f"== {experiment}", err=True)
        began, before = time.perf_counter(), contents(outputs_of(cfg))
        typer.echo(wrote(part(cfg), before))
        typer.echo(f"{experiment} took {time.perf_counter() - began:.0f} s")

    reproduce(cfgs, int(root.jobs), step)
    cfg = cfgs[-1]
    results = Path(cfg.results_dir)
    report_began = time.perf_counter()
    typer.echo(f"wrote {write_report(results)}")
    if above := enclosing(results):
        typer.echo(f"wrote {write_report(above)}")
    if (path := readme.update(above or results)) is not None:
        typer.echo(f"updated the verdicts in {path}")
    typer.echo(f"the report took {time.perf_counter() - report_began:.0f} s")
    report_path = (above or results) / "REPORT.md"
    fresh = hints.command("reproduce-all", preset=cfg.preset.name, results_dir=Path(f"{results}-fresh"))
    typer.echo(
        f"reproduce-all: {tally.line()} in {time.perf_counter() - start:.0f} s; report: {report_path}; "
        f"to retrain from empty: `{fresh}`"
    )


app.command()(user_errors(tools.bench))
app.command("gpu-check")(user_errors(tools.gpu_check))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
