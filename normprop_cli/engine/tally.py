"""What the sweeps of one process did: runs reused from disk, trained, diverged. `normprop
reproduce-all` ends with one line of it, so that a main job that reused committed runs says so."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

TALLY: Counter = Counter()


def record(n_specs: int, n_todo: int, manifests: Sequence[dict | None]) -> None:
    """One sweep: `n_specs` runs in the grid, `n_todo` of them unfinished before it started."""
    TALLY["reused"] += n_specs - n_todo
    TALLY["trained"] += n_todo
    TALLY["diverged"] += sum(1 for m in manifests if (m or {}).get("status") == "diverged")


def reset() -> None:
    TALLY.clear()


def line() -> str:
    """'470 runs reused, 12 trained, 3 diverged'."""
    return f"{TALLY['reused']} runs reused, {TALLY['trained']} trained, {TALLY['diverged']} diverged"
