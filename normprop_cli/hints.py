"""What the command says besides its results.

The commands that messages suggest (`normprop run ...` produces it, `normprop report` next), with
the user's options: a hint repeats the preset, data set and results directory wherever they are not
what the suggested command would take without them, so that it reads and writes the same results.
The nearest names for a mistyped experiment, preset or data set. Usage errors of the command line
itself (an unknown option or command, `--jobs abc`) in one line on stderr with exit code 2, as
normprop's own errors are, instead of Typer's boxed usage text. "wrote PATH" for a file that is new or
whose bytes changed, "unchanged: PATH" for one written again byte for byte (tables and figures are
rewritten whole, by an atomic replace, every time an experiment runs, so their times say nothing).
"""

from __future__ import annotations

import hashlib
import shlex
import sys
from functools import cache
from pathlib import Path

import typer
from omegaconf import DictConfig
from typer.core import TyperGroup

from normprop_cli import config, schema

try:  # the copy of click that Typer raises its usage errors from, where it carries its own
    from typer._click import exceptions as usage
except ImportError:
    from click import exceptions as usage

DEFAULT_PRESET = "quick"  # conf/config.yaml's


@cache
def preset_defaults(preset: str) -> tuple[str, str]:
    """(results directory, data set) that `preset` uses where the command names neither."""
    cfg = config.load("table1", preset=preset)
    return str(cfg.results_dir), str(cfg.dataset.name)


def flags(preset: str | None = None, results_dir: str | Path | None = None, dataset: str | None = None) -> list[str]:
    """['--preset', 'smoke', '--results-dir', '/tmp/r'], each option only where it is not the default
    (an unknown or unnamed preset counts as the default one)."""
    preset = preset if preset in config.options("preset") else DEFAULT_PRESET
    default_dir, default_dataset = preset_defaults(preset)
    words = ["--preset", preset] if preset != DEFAULT_PRESET else []
    if dataset and dataset != default_dataset:
        words += ["--dataset", str(dataset)]
    if results_dir is not None and Path(results_dir).resolve() != Path(default_dir).resolve():
        words += ["--results-dir", str(results_dir)]
    return words


def command(*words: str, preset=None, results_dir=None, dataset=None, extra=()) -> str:
    """'normprop run data-norm --preset smoke --results-dir /tmp/r': the words, the flags, then `extra`
    (overrides), quoted for a shell."""
    return shlex.join(["normprop", *words, *flags(preset, results_dir, dataset), *extra])


def of(cfg: DictConfig, *words: str, dataset: bool = True, extra=()) -> str:
    """command() with the preset, results directory and (unless dataset=False) data set of `cfg`."""
    return command(
        *words,
        preset=cfg.preset.name,
        results_dir=cfg.results_dir,
        dataset=cfg.dataset.name if dataset else None,
        extra=extra,
    )


def check_choice(group: str, name: str) -> None:
    """A UserError for a name that `group` (experiment, preset, dataset) lacks: the nearest names that
    it has first (`tabel1`: did you mean table1?), then every one."""
    import difflib

    from normprop_cli.errors import UserError

    known = config.options(group)
    if name in known:
        return
    near = difflib.get_close_matches(name, known, n=2, cutoff=0.6)
    guess = f"did you mean {' or '.join(near)}? " if near else ""
    raise UserError(f"unknown {group} '{name}'; {guess}known: {', '.join(known)}")


class OneLineErrors(TyperGroup):
    """The command's own usage errors (`--jobs abc`, an unknown option or command) in one line on stderr
    with exit code 2, as normprop's own errors are, instead of Typer's boxed usage text."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except usage.NoArgsIsHelpError as exc:
            typer.echo(exc.ctx.get_help() if exc.ctx else exc.format_message())
            sys.exit(0)
        except usage.ClickException as exc:
            typer.echo(one_line(exc), err=True)
            sys.exit(exc.exit_code)
        except typer.Abort:
            typer.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def one_line(exc: usage.ClickException) -> str:
    """'error: MESSAGE (`normprop run --help` lists the options)', the message's lines joined."""
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    where = f" (`{ctx.command_path} --help` lists the options)" if ctx is not None else ""
    return f"error: {message}{where}"


def enclosing(results: Path) -> Path | None:
    """The results directory above `results` whose REPORT.md covers it too (results/ for results/cpu)."""
    return results.parent if (results.parent / "REPORT.md").exists() else None


def outputs_of(cfg) -> Path:
    """The folder an experiment's tables and figures go to: <results>/<experiment>."""
    return Path(cfg.results_dir) / cfg.experiment.name


def contents(where: Path) -> dict[Path, bytes]:
    """The SHA-256 of every file under `where` but its runs' own folders (checkpoints, run tables): what
    `wrote` compares after the experiment, since its tables and figures are rewritten whole every time."""
    if where.is_file():
        return {where: digest(where)}
    if not where.is_dir():
        return {}
    return {p: digest(p) for p in where.rglob("*") if p.is_file() and "runs" not in p.relative_to(where).parts[:-1]}


def digest(path: Path) -> bytes:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").digest()


def changed(path: Path, before: dict[Path, bytes]) -> bool:
    """Whether `path` is new or its bytes differ from those it had (`before`: contents())."""
    return before.get(path) != digest(path)


def wrote(out: Path, before: dict[Path, bytes]) -> str:
    """'wrote PATH' where a file there is new or not byte for byte what it was (`before`: contents()),
    else 'unchanged: PATH'."""
    files = [out] if out.is_file() else [p for p in out.rglob("*") if p.is_file()] if out.is_dir() else []
    files = [p for p in files if "runs" not in p.parts[len(out.parts) : -1]] if out.is_dir() else files
    return f"wrote {out}" if any(changed(p, before) for p in files) else f"unchanged: {out}"


def figures(out: Path, before: dict[Path, bytes]) -> list[Path]:
    """The figures (in any format of `figures`) beside a run's CSVs that are new or differ from `before`
    (contents())."""
    where = out if out.is_dir() else out.parent
    return sorted(p for ext in schema.Figure for p in where.glob(f"*.{ext.value}") if changed(p, before))
