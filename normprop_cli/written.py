"""What a command says it wrote: "wrote PATH" for a file that is new or whose bytes changed,
"unchanged: PATH" for one written again byte for byte (tables and figures are rewritten whole, by an
atomic replace, every time an experiment runs, so their times say nothing)."""

from __future__ import annotations

import hashlib
from pathlib import Path


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
    """The figures (PNG, PDF) beside a run's CSVs that are new or differ from `before` (contents())."""
    where = out if out.is_dir() else out.parent
    return sorted(p for ext in ("png", "pdf") for p in where.glob(f"*.{ext}") if changed(p, before))
