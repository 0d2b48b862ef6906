"""The commands that time steps rather than train experiments: `normprop bench` and `normprop gpu-check`
(registered on the app by cli.py)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import typer

from normprop_cli.errors import UserError


def bench(
    batch_sizes: Annotated[str, typer.Option(help="Comma-separated batch sizes.")] = "1,50,100",
    widths: Annotated[str, typer.Option(help="Comma-separated NIN widths.")] = "1.0,0.25",
    budget: Annotated[float, typer.Option(help="Seconds of timed steps per configuration, all methods.")] = 30.0,
    epochs: Annotated[int, typer.Option(help="Whole epochs timed per method (0: none).")] = 2,
    threads: Annotated[int | None, typer.Option(help="CPU threads (default: torch's).")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N.")] = "auto",
    results_dir: Annotated[Path, typer.Option(help="Where results go.")] = Path("results"),
    precision: Annotated[
        str, typer.Option(help="auto (bfloat16 too where native) or comma-separated float32, bfloat16.")
    ] = "auto",
    methods: Annotated[
        str, typer.Option(help="all, or comma-separated methods (none, batchnorm, normprop-icml, ...).")
    ] = "all",
) -> None:
    """Time the NIN training step of every normalisation method side by side; write bench.csv."""
    from normprop_cli.bench import PRECISIONS, run_bench

    try:
        sizes = [int(b) for b in batch_sizes.split(",")]
        ws = [float(w) for w in widths.split(",")]
    except ValueError:
        raise UserError("--batch-sizes and --widths take comma-separated numbers, e.g. 1,50,100") from None
    if min(sizes) < 1 or min(ws) <= 0 or budget <= 0 or epochs < 0:
        raise UserError("batch sizes must be >= 1, widths and --budget > 0, --epochs >= 0")
    precisions = None if precision.strip() == "auto" else [p.strip() for p in precision.split(",")]
    if precisions is not None and not set(precisions) <= set(PRECISIONS):
        raise UserError(f"--precision takes auto or some of {', '.join(PRECISIONS)}, comma-separated")
    names = parse_methods(methods)
    run_bench(
        batch_sizes=sizes,
        widths=ws,
        budget_s=budget,
        epochs=epochs,
        threads=threads,
        device=device,
        results_dir=results_dir,
        precisions=precisions,
        methods=names,
    )
    typer.echo(f"wrote {results_dir / 'bench' / 'bench.csv'}")


def gpu_check(
    methods: Annotated[
        str, typer.Option(help="all, or comma-separated methods (none, batchnorm, normprop-icml, ...).")
    ] = "all",
    budget: Annotated[float, typer.Option(help="Seconds of timed steps per configuration, all methods.")] = 5.0,
    tests: Annotated[bool, typer.Option("--tests/--no-tests", help="Run the CUDA tests first.")] = True,
    results_dir: Annotated[Path, typer.Option(help="Where results go (bench/gpu/ in it).")] = Path("results"),
    cap: Annotated[float, typer.Option(help="Its own time cap, seconds: an item starts only if it fits.")] = 300.0,
) -> None:
    """On a CUDA GPU: the CUDA tests, every method's step, syncs, memory, CPU agreement, the paired bench of what
    runs use, kernels per step, --deterministic repeated, NormProp's two folds, the paper and gpu presets' projected
    times, a killed and resumed run; results/bench/gpu/SUMMARY.md. Exit 0 when every item passes."""
    from normprop_cli.bench.gpu_check import run_gpu_check
    from normprop_cli.experiments.plan import project

    names = parse_methods(methods)
    if budget <= 0 or cap <= 0:
        raise UserError(f"--budget and --cap must be > 0, got {budget} and {cap}")
    paper = functools.partial(project, "paper")  # reproduce-all --preset paper at this GPU's step times
    fashion = functools.partial(project, "gpu")  # and --preset gpu (Fashion-MNIST's 1x32x32 steps)
    code = run_gpu_check(results_dir=results_dir, methods=names, budget_s=budget, tests=tests, project=paper,
                         fashion_plan=fashion, cap_s=cap)  # fmt: skip
    raise typer.Exit(code)


def parse_methods(methods: str) -> tuple[str, ...] | None:
    """--methods: None for all, else the names, each one of nn.methods.METHODS (a UserError if not)."""
    from normprop_cli.bench import choose_methods

    if methods.strip() == "all":
        return None
    try:
        return choose_methods([m for m in methods.split(",") if m.strip()])
    except ValueError as exc:
        raise UserError(f"--methods: {exc}") from None
