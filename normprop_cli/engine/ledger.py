"""What happened to a results tree, written when it happens: `<tree>/LEDGER.jsonl`, one JSON object a line,
appended to and never rewritten, committed with the results.

    event "replaced"  a finished run trained again in place (more epochs, or retrained after its directory was
                      removed): its small files kept in `<run>/history/<n>/`, and the verdicts the tree's
                      verdicts.csv gave on its experiment just before
    event "rule"      a claim's rule (its conf/claims.yaml entry and the version of its test) used against the
                      tree's results where it is not the last one recorded, with the verdict it gave
                      (verdicts.ledger writes it)
    event "start"     where the record begins, and what git showed of the time before it

Which runs are reported: those written under a preset's own results directory (`results_dir` of
conf/preset/<preset>.yaml, else conf/config.yaml's), resolved from the working directory, the smoke preset's
aside. Such a run is refused from a checkout with uncommitted changes (results aside) unless the user allows
it; a run from such a tree records a hash of the diff (`diff_sha256`), whoever trains it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import subprocess
import time
from functools import lru_cache
from pathlib import Path

import pandas as pd

import normprop_cli
from normprop_cli import config, io
from normprop_cli.engine.runs import CHECKPOINT, FINISHED, PREVIOUS
from normprop_cli.errors import UserError

LEDGER = "LEDGER.jsonl"
HISTORY = "history"  # <run>/history/<n>/: the earlier runs' small files, oldest first
SMALL = ("manifest.json", "config.yaml")  # with every *.csv of the run: what a replaced run keeps, not checkpoints
UNREPORTED_PRESETS = ("smoke",)  # synthetic data, kept out of the real report
RESULTS_ASIDE = ":(exclude,top)results"  # results are not code: a tree dirty with results alone is clean
VERDICT_KEYS = ("claim", "dataset", "verdict", "effect", "ci_low", "ci_high", "verdict_half_a", "verdict_half_b")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def append(tree: Path, entry: dict) -> dict:
    """Add one entry (with the time it is written, `at`) to the tree's ledger, under a lock: workers of one
    sweep append side by side."""
    entry = {"at": now(), **entry}
    path = Path(tree) / LEDGER
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as out:
        fcntl.flock(out, fcntl.LOCK_EX)
        out.write(json.dumps(entry, ensure_ascii=False, sort_keys=True, default=str) + "\n")
    return entry


def read(tree: Path) -> list[dict]:
    """The tree's ledger entries, oldest first; [] where it has none. A line that is no JSON object is skipped."""
    path = Path(tree) / LEDGER
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


# ---- the checkout's state ---------------------------------------------------------------------------------


def _git(*args: str, where: Path | None = None) -> bytes | None:
    where = where or Path(normprop_cli.__file__).parent
    try:
        done = subprocess.run(["git", *args], cwd=where, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


@lru_cache(maxsize=4)
def uncommitted(where: Path | None = None) -> tuple[str, ...]:
    """The files (tracked and changed, or untracked and not ignored) that differ from the checkout's HEAD,
    results aside; () outside a checkout."""
    out = _git("status", "--porcelain", "--untracked-files=all", "--", ":/", RESULTS_ASIDE, where=where)
    return tuple(line[3:] for line in (out or b"").decode(errors="replace").splitlines() if line.strip())


@lru_cache(maxsize=4)
def diff_hash(where: Path | None = None) -> str | None:
    """sha256 of what the working tree changes from HEAD (results aside): `git diff HEAD` and each untracked
    file's path and contents; None where nothing differs or there is no checkout."""
    if not uncommitted(where):
        return None
    top = (_git("rev-parse", "--show-toplevel", where=where) or b"").decode().strip()
    diff = _git("diff", "HEAD", "--binary", "--", ":/", RESULTS_ASIDE, where=where)
    if not top or diff is None:
        return None
    digest = hashlib.sha256(diff)
    listed = _git("ls-files", "--others", "--exclude-standard", "--full-name", "--", ":/", RESULTS_ASIDE, where=where)
    for name in sorted((listed or b"").decode().splitlines()):
        digest.update(name.encode() + b"\0")
        file = Path(top) / name
        digest.update(file.read_bytes() if file.is_file() else b"")
    return digest.hexdigest()


def reported_trees() -> dict[Path, str]:
    """{resolved results directory: preset} of every preset whose runs the report reads."""
    default = (io.read_yaml(config.conf_dir() / "config.yaml") or {}).get("results_dir", "results")
    out = {}
    for preset in config.options("preset"):
        if preset in UNREPORTED_PRESETS:
            continue
        own = (io.read_yaml(config.conf_dir() / "preset" / f"{preset}.yaml") or {}).get("results_dir")
        out.setdefault(Path(str(own or default)).resolve(), preset)
    return out


def check_clean(results_dirs: list[Path], allow_dirty: bool) -> None:
    """Refuse, before anything is written, to train runs the report reads from a checkout whose code or
    configs differ from its commit, unless `allow_dirty` (each run then records `diff_sha256`)."""
    if allow_dirty:
        return
    trees = reported_trees()
    reported = [Path(d) for d in results_dirs if Path(d).resolve() in trees]
    changed = uncommitted() if reported else ()
    if changed:
        raise UserError(
            f"{reported[0]} holds reported results and the checkout has {len(changed)} uncommitted file(s) "
            f"({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''}): commit them, or pass --allow-dirty "
            "to train anyway and record a hash of the diff in each run's manifest"
        )


# ---- replaced runs ----------------------------------------------------------------------------------------


def small_files(path: Path) -> list[Path]:
    """A run directory's small files: its manifest, config and tables."""
    return sorted(p for p in Path(path).iterdir() if p.is_file() and (p.name in SMALL or p.suffix == ".csv"))


def committed_files(path: Path) -> dict[str, bytes]:
    """{name: contents at HEAD} of a run directory's small files where git holds its manifest at HEAD; {}
    where it does not (no checkout, a tree outside it, a run never committed)."""
    path = Path(path).resolve()
    top = (_git("rev-parse", "--show-toplevel") or b"").decode().strip()
    if not top or not path.is_relative_to(Path(top).resolve()):
        return {}
    where = path.relative_to(Path(top).resolve()).as_posix()
    names = (_git("ls-tree", "--name-only", "HEAD", f"{where}/", where=Path(top)) or b"").decode().splitlines()
    names = [Path(n).name for n in names]
    if SMALL[0] not in names:
        return {}
    wanted = [n for n in names if n in SMALL or n.endswith(".csv")]
    return {n: blob for n in wanted if (blob := _git("show", f"HEAD:{where}/{n}", where=Path(top))) is not None}


def history_dirs(path: Path) -> list[Path]:
    """The run's `history/<n>/` directories, oldest first."""
    found = [d for d in (Path(path) / HISTORY).glob("*") if d.is_dir() and d.name.isdigit()]
    return sorted(found, key=lambda d: int(d.name))


def retire(tree: Path, path: Path, why: str) -> dict | None:
    """Keep a finished run's small files in `<run>/history/<n>/` before it trains again in place, and append a
    "replaced" entry to the tree's ledger; None where there is nothing finished to keep. The files are the
    directory's own where its manifest says the run finished (copied: a run given more epochs continues from
    them), else those git holds at HEAD for a run directory that was removed to be trained again."""
    manifest = _manifest(Path(path) / SMALL[0])
    if manifest and manifest.get("status") in FINISHED:
        files = {p.name: p.read_bytes() for p in small_files(path)}
    elif manifest is None:
        files = committed_files(path)
        manifest = json.loads(files[SMALL[0]]) if files else None
        if files and any((d / SMALL[0]).read_bytes() == files[SMALL[0]] for d in history_dirs(path)):
            return None  # kept already, by a start that stopped before its manifest
    else:
        return None
    if not files or not manifest:
        return None
    kept = Path(path) / HISTORY / str(max((int(d.name) for d in history_dirs(path)), default=0) + 1)
    kept.mkdir(parents=True, exist_ok=True)
    for name, blob in files.items():
        (kept / name).write_bytes(blob)
    earlier = {k: manifest.get(k) for k in ("commit", "started", "finished", "status", "epochs_done")}
    return append(tree, {
        "event": "replaced", "run": manifest.get("run") or Path(path).name, "experiment": manifest.get("experiment"),
        "dataset": manifest.get("dataset"), "why": why, "kept": kept.relative_to(tree).as_posix(),
        "earlier": earlier, "verdicts": verdicts_then(tree, manifest.get("experiment")),
    })  # fmt: skip


def keep_earlier(tree: Path, path: Path, manifest: dict | None) -> None:
    """Before a finished run trains again in place (more epochs), or a run whose directory was removed is
    trained anew (no manifest, no checkpoint), retire its earlier files."""
    if manifest and manifest.get("status") in FINISHED:
        retire(tree, path, "more epochs")
    elif manifest is None and not any((Path(path) / name).exists() for name in (CHECKPOINT, PREVIOUS)):
        retire(tree, path, "trained again")


def _manifest(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def verdicts_then(tree: Path, experiment: str | None) -> list[dict]:
    """The rows of the tree's verdicts.csv on an experiment, as the last report wrote them."""
    try:
        frame = pd.read_csv(Path(tree) / "verdicts.csv", keep_default_na=False)
    except (OSError, ValueError):
        return []
    rows = frame[frame["experiment"] == experiment] if "experiment" in frame else frame.iloc[0:0]
    return [{k: row.get(k) for k in VERDICT_KEYS} for row in rows.to_dict("records")]
