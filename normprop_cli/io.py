"""Atomic result files: every write goes to a temporary file beside the target, then a rename."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd


def atomic_write(path: Path, write: Callable[[Path], None]) -> Path:
    """Call write(tmp) on a temporary path in the same directory, then rename it onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def write_json(path: Path, data: dict) -> Path:
    return write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def write_csv(path: Path, frame: pd.DataFrame) -> Path:
    return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def save_torch(path: Path, obj) -> Path:
    import torch

    return atomic_write(path, lambda tmp: torch.save(obj, tmp))


def save_figure(fig, stem: Path) -> list[Path]:
    """Save a matplotlib figure as stem.png and stem.pdf, each atomically."""
    out = []
    for ext in ("png", "pdf"):
        target = Path(f"{stem}.{ext}")
        out.append(
            atomic_write(
                target,
                # No creation date in the PDF: redrawing unchanged CSVs gives the same file.
                lambda tmp, ext=ext: fig.savefig(
                    tmp,
                    format=ext,
                    dpi=150,
                    bbox_inches="tight",
                    metadata={"CreationDate": None} if ext == "pdf" else None,
                ),
            )
        )
    return out
