"""The commands that messages suggest (`normprop run ...` produces it, `normprop report` next), with
the user's options: a hint repeats the preset, data set and results directory wherever they are not
what the suggested command would take without them, so that it reads and writes the same results."""

from __future__ import annotations

import shlex
from functools import cache
from pathlib import Path

from omegaconf import DictConfig

from normprop_cli import config

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
