"""Atomic result files: every write goes to a temporary file beside the target, then a rename. The
file gets the mode a plain open() would give it (0o666 less the umask: 0644 under a umask of 022),
not mkstemp's private 0600, so that a group can read the results.

A write that fails for want of space or permission leaves the previous file as it was and is a
one-line error that says so and what to do."""

from __future__ import annotations

import copy
import errno
import functools
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from normprop_cli.errors import UserError

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
NOT_ALLOWED = (errno.EACCES, errno.EPERM, errno.EROFS)


def atomic_write(path: Path, write: Callable[[Path], None], keep: Path | None = None) -> Path:
    """Call write(tmp) on a temporary path in the same directory, then rename it onto `path`;
    the file it replaces, if any, is renamed to `keep` (e.g. the last good checkpoint)."""
    path, tmp = Path(path), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.fchmod(fd, 0o666 & ~umask())
        os.close(fd)
        write(Path(tmp))
        if keep is not None and path.exists():
            os.replace(path, keep)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        error = write_error(path, exc) if isinstance(exc, OSError) else None
        if error is None:
            raise
        raise error from None
    return path


def umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc/self/status), else
    by setting it and putting it back at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_error(path: Path, exc: OSError) -> UserError | None:
    """The one-line error of a write to `path` that failed for want of space or permission; None for
    another failure, which is a bug to show in full."""
    if exc.errno not in NO_SPACE + NOT_ALLOWED:
        return None
    what = "its previous version is intact" if path.exists() else "nothing was written"
    todo = "free some space" if exc.errno in NO_SPACE else f"make {path.parent} writable"
    return UserError(
        f"could not write {path} ({os.strerror(exc.errno)}); {what}; {todo} and run the same command again"
    )


def check_writable(directory: Path) -> None:
    """Fail in one line, before any work, where results cannot be written under `directory`."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise UserError(
            f"cannot write results in {directory} ({exc.strerror or exc}); pass --results-dir to a writable directory"
        ) from None


def write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def write_json(path: Path, data: dict) -> Path:
    return write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def parse_yaml(text: str):
    """YAML text as plain dicts and lists, parsed by libyaml where PyYAML has it (its safe loader else): ~15
    times faster than OmegaConf. YAML 1.1 rules: a float written without a dot (1e-05) comes back as a
    string, so only keys whose values are booleans, integers, strings or floats read through float() are
    read this way. Raises yaml.YAMLError on text that is no YAML."""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def read_yaml(path: Path) -> dict:
    """A YAML file (a run's config.yaml) by `parse_yaml`, for a report that reads a few keys of hundreds of
    runs' configs; {} for an empty file. A report's sections read the same configs again: the same text is
    parsed once per process (kept by its contents, so a rewritten file is parsed anew), and the caller gets a
    copy of its own to change."""
    return copy.deepcopy(_parsed_yaml(Path(path).read_text(encoding="utf-8")))


@functools.lru_cache(maxsize=4096)
def _parsed_yaml(text: str) -> dict:
    return parse_yaml(text) or {}


def write_csv(path: Path, frame: pd.DataFrame) -> Path:
    return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def save_torch(path: Path, obj, keep: Path | None = None) -> Path:
    """torch.save through a Python file, whose failed writes are OSErrors with their errno (torch's
    own file writer turns a full disk into a bare RuntimeError)."""
    import torch

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            torch.save(obj, f)

    return atomic_write(path, write, keep)


def save_figure(fig, stem: Path, formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """Save a matplotlib figure as stem.png, stem.pdf, ... (the config's `figures`), each atomically. No
    date in a PDF or SVG and no random ids in an SVG: redrawing unchanged CSVs gives the same files."""
    import matplotlib

    metadata = {"png": None, "pdf": {"CreationDate": None}, "svg": {"Date": None}}
    out = []
    for ext in formats:

        def write(tmp: Path, ext: str = ext) -> None:
            with matplotlib.rc_context({"svg.hashsalt": "normprop"}):
                fig.savefig(tmp, format=ext, dpi=150, bbox_inches="tight", metadata=metadata[ext])

        out.append(atomic_write(Path(f"{stem}.{ext}"), write))
    return out
